//! A small, bounds-checked GGUF reader: header, metadata and tensor infos, over a memory map
//! (native) or over a prefix of the file when its tensors arrive one at a time (the browser).
//! Every read is checked against the file size, so a truncated or corrupt file is an error,
//! never a panic or a huge allocation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::dtype::GgmlType;
use crate::error::{InferError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Items one metadata array may hold: the largest vocabularies (256k tokens) and merge lists
/// (~1M) fit with room to spare. Each parsed item takes ~32 bytes in memory whatever its size in
/// the file, so a one-byte-per-item array spanning a big file would cost 32x the file.
const MAX_ARRAY_ITEMS: u64 = 1 << 22;
/// Array items over all the metadata together (a vocabulary, its scores, types and merges).
const MAX_METADATA_ITEMS: u64 = 1 << 24;
/// Metadata keys, and tensors, a header may declare.
const MAX_KEYS: u64 = 1 << 16;
const MAX_TENSORS: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, negative ones included.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value for an error message: scalars as they are, strings and arrays by size only
    /// (a hostile file's value may be megabytes long).
    pub fn describe(&self) -> String {
        match self {
            GgufValue::String(s) => format!("a string of {} bytes", s.len()),
            GgufValue::Array(a) => format!("an array of {} items", a.len()),
            scalar => format!("{scalar:?}"),
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Row-major shape (GGUF lists dimensions fastest-first; this is reversed).
    pub shape: Vec<usize>,
    pub dtype: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: usize,
    pub num_bytes: usize,
}

/// Where tensor bytes are read from.
enum TensorData {
    #[cfg(feature = "native")]
    Mapped(std::sync::Arc<memmap2::Mmap>),
    /// The file was parsed from its header: only tensors handed over with
    /// `GgufFile::keep_tensor` are readable (the browser streams the rest to the GPU).
    Streamed(BTreeMap<String, Vec<u8>>),
}

pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: BTreeMap<String, GgufTensorInfo>,
    /// Bytes of the whole file.
    pub file_len: u64,
    data: TensorData,
    /// What reading the model made of the metadata (`get` records every key it is asked for),
    /// so a key nothing read is refused by name (`model::gguf_keys`).
    reading: Mutex<Reading>,
}

/// The keys the loaders asked for, and the assumptions they made where the file is silent.
#[derive(Debug, Default)]
struct Reading {
    keys: BTreeSet<String>,
    assumed: Vec<String>,
}

impl GgufFile {
    #[cfg(feature = "native")]
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| InferError::io(path, e))?;
        // SAFETY: the map is read-only and lives as long as `GgufFile`; like every mmap-based
        // loader (llama.cpp, safetensors) we assume the file is not truncated while we run.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| InferError::io(path, e))?;
        let len = mmap.len() as u64;
        match Self::parse(path, &mmap, len)? {
            Some(mut g) => {
                g.data = TensorData::Mapped(mmap.into());
                Ok(g)
            }
            None => Err(InferError::Gguf {
                path: path.to_path_buf(),
                reason: "the header runs past the end of the file: the file is truncated".into(),
            }),
        }
    }

    /// Parses the header from the first bytes of a file of `file_len` bytes. `Ok(None)`: the
    /// header goes on past `prefix`; call again with more. Tensor data is not read: hand
    /// tensors over with `keep_tensor`, or stream them (see `tensor_range`).
    pub fn from_header(name: &str, prefix: &[u8], file_len: u64) -> Result<Option<Self>> {
        Self::parse(Path::new(name), prefix, file_len)
    }

    /// Keeps a tensor's bytes (read by the caller from `tensor_range`) in a file parsed from its
    /// header, e.g. `rope_freqs.weight`, which the config needs.
    pub fn keep_tensor(&mut self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let Some(expected) = self.tensors.get(name).map(|i| i.num_bytes) else {
            return Err(self.streamed_err(format!("no tensor `{name}` in the file")));
        };
        if bytes.len() != expected {
            return Err(self.streamed_err(format!(
                "tensor `{name}`: got {} bytes, expected {expected} (truncated read?)",
                bytes.len()
            )));
        }
        match &mut self.data {
            TensorData::Streamed(kept) => {
                kept.insert(name.to_string(), bytes);
                Ok(())
            }
            #[cfg(feature = "native")]
            TensorData::Mapped(_) => Ok(()),
        }
    }

    /// Drops the bytes `keep_tensor` kept (once they are on the device).
    pub fn release_tensor(&mut self, name: &str) {
        match &mut self.data {
            TensorData::Streamed(kept) => {
                kept.remove(name);
            }
            #[cfg(feature = "native")]
            TensorData::Mapped(_) => {}
        }
    }

    /// Byte range `[start, end)` of a tensor in the file.
    pub fn tensor_range(info: &GgufTensorInfo) -> (u64, u64) {
        (info.offset as u64, (info.offset + info.num_bytes) as u64)
    }

    fn streamed_err(&self, reason: String) -> InferError {
        InferError::Gguf {
            path: self.path.clone(),
            reason,
        }
    }

    fn parse(path: &Path, buf: &[u8], file_len: u64) -> Result<Option<Self>> {
        let err = |reason: String| InferError::Gguf {
            path: path.to_path_buf(),
            reason,
        };
        let mut cur = Cursor {
            buf,
            pos: 0,
            file_len,
            short: false,
            items: 0,
        };
        match Self::parse_header(&mut cur, path) {
            Ok(g) => Ok(Some(g)),
            Err(_) if cur.short => Ok(None),
            Err(e) => Err(match e {
                HeaderError::At(reason) => err(reason),
                HeaderError::Infer(e) => e,
            }),
        }
    }

    fn parse_header(cur: &mut Cursor, path: &Path) -> std::result::Result<Self, HeaderError> {
        let err = |reason: String| HeaderError::At(reason);
        let file_len = cur.file_len;
        let magic = cur.bytes(4).map_err(err)?;
        if magic != MAGIC {
            return Err(err(format!(
                "bad magic {magic:02x?}, expected \"GGUF\" (is this a GGUF file?)"
            )));
        }
        let version = cur.u32().map_err(err)?;
        if !(2..=3).contains(&version) {
            return Err(err(format!(
                "unsupported GGUF version {version} (supported: 2, 3)"
            )));
        }
        let n_tensors = cur.u64().map_err(err)?;
        let n_kv = cur.u64().map_err(err)?;
        if n_tensors > MAX_TENSORS || n_kv > MAX_KEYS {
            return Err(err(format!(
                "the header declares {n_tensors} tensors and {n_kv} metadata keys (at most {MAX_TENSORS} and {MAX_KEYS}): corrupt"
            )));
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = cur
                .string()
                .map_err(|e| err(format!("metadata #{i}: {e}")))?;
            let ty = cur.u32().map_err(err)?;
            let value = cur
                .value(ty, 0)
                .map_err(|e| err(format!("metadata `{key}`: {e}")))?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::new();
        for i in 0..n_tensors {
            let name = cur.string().map_err(|e| err(format!("tensor #{i}: {e}")))?;
            let info = cur
                .tensor_info()
                .map_err(|e| err(format!("tensor `{name}`: {e}")))?;
            infos.push((name, info));
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => v
                .as_u64()
                .filter(|a| *a > 0 && a.is_power_of_two())
                .ok_or_else(|| {
                    err(format!(
                        "general.alignment {} is not a power of two",
                        v.describe()
                    ))
                })?,
            None => DEFAULT_ALIGNMENT,
        };
        let data_start = (cur.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for (name, (dims, type_id, rel_offset)) in infos {
            let dtype = GgmlType::from_id(type_id).ok_or_else(|| {
                HeaderError::Infer(InferError::UnsupportedDtype {
                    name: name.clone(),
                    dtype: format!("ggml type {type_id}"),
                })
            })?;
            let shape = dims
                .iter()
                .rev()
                .map(|&d| usize::try_from(d))
                .collect::<std::result::Result<Vec<usize>, _>>()
                .map_err(|_| err(format!("tensor `{name}`: dimensions {dims:?} overflow")))?;
            let n_elems = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| err(format!("tensor `{name}`: shape {shape:?} overflows")))?;
            let num_bytes = dtype
                .num_bytes(n_elems, shape.last().copied().unwrap_or(1))
                .ok_or_else(|| {
                    err(format!(
                        "tensor `{name}`: row length {} is not a multiple of the {dtype:?} block size",
                        dims.first().copied().unwrap_or(0)
                    ))
                })?;
            let offset = data_start
                .checked_add(rel_offset)
                .ok_or_else(|| err(format!("tensor `{name}`: bad offset {rel_offset}")))?;
            let end = offset.checked_add(num_bytes as u64);
            if end.is_none_or(|e| e > file_len) {
                return Err(err(format!(
                    "tensor `{name}` ({num_bytes} bytes at offset {offset}) runs past the end of the file ({file_len} bytes): the file is truncated"
                )));
            }
            let offset = usize::try_from(offset)
                .map_err(|_| err(format!("tensor `{name}`: offset {offset} overflows")))?;
            let info = GgufTensorInfo {
                name: name.clone(),
                shape,
                dtype,
                offset,
                num_bytes,
            };
            if tensors.insert(name.clone(), info).is_some() {
                return Err(err(format!("tensor `{name}` appears twice")));
            }
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            file_len,
            data: TensorData::Streamed(BTreeMap::new()),
            reading: Mutex::default(),
        })
    }

    /// A tensor's bytes to keep: a view of the mapped file (no copy), or a copy of the bytes
    /// kept from a stream.
    pub fn packed_bytes(&self, info: &GgufTensorInfo) -> Result<crate::weights::PackedBytes> {
        match &self.data {
            #[cfg(feature = "native")]
            TensorData::Mapped(m) => {
                self.tensor_bytes(info)?; // the same bounds and errors
                Ok(crate::weights::PackedBytes::mapped(
                    m.clone(),
                    info.offset..info.offset + info.num_bytes,
                ))
            }
            TensorData::Streamed(_) => Ok(self.tensor_bytes(info)?.to_vec().into()),
        }
    }

    /// The raw bytes of a tensor (bounds were checked at open). A file parsed from its header
    /// has only the tensors it was handed.
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> Result<&[u8]> {
        match &self.data {
            #[cfg(feature = "native")]
            TensorData::Mapped(m) => Ok(&m[info.offset..info.offset + info.num_bytes]),
            TensorData::Streamed(kept) => {
                kept.get(&info.name).map(Vec::as_slice).ok_or_else(|| {
                    self.streamed_err(format!(
                        "tensor `{}` was not loaded (the file was opened from its header)",
                        info.name
                    ))
                })
            }
        }
    }

    /// A metadata value, recorded as read: a key that no loader asks for is refused by name
    /// unless it cannot change the result (`model::gguf_keys`).
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.reading().keys.insert(key.to_string());
        self.metadata.get(key)
    }

    /// The keys asked for so far (present in the file or not).
    pub fn keys_read(&self) -> BTreeSet<String> {
        self.reading().keys.clone()
    }

    /// Notes an assumption made where the file is silent (a layer pattern llama.cpp's converter
    /// drops, say): logged once, here, and kept for `assumptions`.
    pub fn assume(&self, note: String) {
        tracing::warn!("{}: {note}", self.path.display());
        self.reading().assumed.push(note);
    }

    /// The assumptions the loaders made, in order.
    pub fn assumptions(&self) -> Vec<String> {
        self.reading().assumed.clone()
    }

    fn reading(&self) -> MutexGuard<'_, Reading> {
        // Only sets of strings are held under the lock: a panic elsewhere leaves them whole.
        self.reading.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

enum HeaderError {
    At(String),
    Infer(InferError),
}

impl From<String> for HeaderError {
    fn from(s: String) -> Self {
        HeaderError::At(s)
    }
}

/// Checked little-endian reads over the first `buf.len()` bytes of a `file_len`-byte file;
/// errors are plain strings that the caller wraps with the path. A read past `buf` but inside
/// the file sets `short` (the caller needs more of the file), past the file it is truncated.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file_len: u64,
    short: bool,
    /// Metadata array items read so far (bounded by `MAX_METADATA_ITEMS`).
    items: u64,
}

type CurResult<T> = std::result::Result<T, String>;

/// The fewest bytes an item of metadata type `ty` takes in the file (a string or an array: its
/// 8-byte length), so an array's length is checked against the rest of the file at that rate.
fn encoded_size(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

impl<'a> Cursor<'a> {
    fn bytes(&mut self, n: usize) -> CurResult<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e as u64 <= self.file_len);
        let Some(end) = end else {
            return Err(format!(
                "unexpected end of file at byte {} (wanted {n} more bytes): the file is truncated",
                self.pos
            ));
        };
        if end > self.buf.len() {
            self.short = true;
            return Err(format!("the header goes on past byte {}", self.buf.len()));
        }
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> CurResult<[u8; N]> {
        let b = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    fn u32(&mut self) -> CurResult<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> CurResult<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length that must fit in what is left of the file at `min_item` bytes per item.
    fn len(&mut self, min_item: usize) -> CurResult<usize> {
        let n = self.u64()?;
        let left = self.file_len.saturating_sub(self.pos as u64);
        if n.saturating_mul(min_item as u64) > left {
            return Err(format!(
                "length {n} at byte {} exceeds the rest of the file: corrupt or truncated",
                self.pos - 8
            ));
        }
        usize::try_from(n).map_err(|_| format!("length {n} does not fit this machine's memory"))
    }

    fn string(&mut self) -> CurResult<String> {
        let n = self.len(1)?;
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| format!("string at byte {} is not UTF-8", self.pos - n))
    }

    fn value(&mut self, ty: u32, depth: usize) -> CurResult<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(self.array::<1>()?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => GgufValue::Bool(self.array::<1>()?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth > 2 {
                    return Err("arrays nested too deeply".into());
                }
                let elem = self.u32()?;
                let n = self.len(encoded_size(elem))?;
                self.items += n as u64;
                if n as u64 > MAX_ARRAY_ITEMS || self.items > MAX_METADATA_ITEMS {
                    return Err(format!(
                        "an array of {n} items ({} in the metadata so far; at most {MAX_ARRAY_ITEMS} per array, {MAX_METADATA_ITEMS} in all): corrupt or hostile",
                        self.items
                    ));
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }

    fn tensor_info(&mut self) -> CurResult<(Vec<u64>, u32, u64)> {
        let n_dims = self.u32()?;
        if n_dims == 0 || n_dims > 4 {
            return Err(format!("{n_dims} dimensions (GGUF allows 1 to 4)"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = self.u64()?;
            if d == 0 || d > (1 << 40) {
                return Err(format!("implausible dimension {d}"));
            }
            dims.push(d);
        }
        let ty = self.u32()?;
        let offset = self.u64()?;
        Ok((dims, ty, offset))
    }
}
