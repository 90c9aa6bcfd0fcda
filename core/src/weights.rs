//! Format-independent access to model weights: the forward asks for canonical weights, each
//! file format maps them to its own tensor names and dequantizes to f32 on load.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::config::{ModelConfig, QkNorm};
use crate::error::{InferError, Result};
use crate::gguf::GgmlType;
use crate::model::names::{Format, TensorLoc, TensorNames};

/// A dense row-major f32 tensor in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor { shape, data }
    }
}

/// A block-quantized matrix kept as stored (any GGUF quant type): row-major `[rows, cols]`,
/// each row a whole number of blocks. Backends that compute on such blocks directly read 2-8x
/// fewer bytes per token than from f32.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedTensor {
    pub shape: Vec<usize>,
    pub dtype: GgmlType,
    pub data: PackedBytes,
}

/// A packed tensor's bytes, cheap to clone: a view into the memory-mapped model file where
/// there is one, as llama.cpp does, so a backend that computes on them in host memory (the CPU)
/// holds no copy: resident memory stays about the file's size and the page cache is shared
/// between processes. Otherwise (files streamed in the browser, tests) the bytes are owned.
#[derive(Clone)]
pub struct PackedBytes(Bytes);

#[derive(Clone)]
enum Bytes {
    /// A `Vec` behind the `Arc`, not `Arc<[u8]>`: taking a vector in moves it, where
    /// `Arc<[u8]>::from` copies it (a repacked 1B model's gigabyte, twice resident meanwhile).
    Owned(Arc<Vec<u8>>),
    #[cfg(feature = "native")]
    Mapped {
        map: Arc<memmap2::Mmap>,
        range: std::ops::Range<usize>,
    },
}

impl PackedBytes {
    /// `range` of a mapped file (checked by the caller against the map's length).
    #[cfg(feature = "native")]
    pub(crate) fn mapped(map: Arc<memmap2::Mmap>, range: std::ops::Range<usize>) -> Self {
        debug_assert!(range.end <= map.len());
        PackedBytes(Bytes::Mapped { map, range })
    }

    /// A sub-range, still a view of the mapped file where this is one (a rank's rows).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        match &self.0 {
            Bytes::Owned(b) => PackedBytes(Bytes::Owned(Arc::new(b[range].to_vec()))),
            #[cfg(feature = "native")]
            Bytes::Mapped { map, range: outer } => PackedBytes(Bytes::Mapped {
                map: map.clone(),
                range: outer.start + range.start..outer.start + range.end,
            }),
        }
    }

    /// For a backend that keeps its own copy (the CPU's repacked matrices): drops this view's
    /// pages from the process's resident memory where the bytes are a view of a mapped file.
    /// The page cache keeps the file, and a later read faults the same bytes back in. Owned
    /// bytes: nothing to do.
    pub fn release_pages(&self) {
        #[cfg(all(feature = "native", unix))]
        if let Bytes::Mapped { map, range } = &self.0 {
            // SAFETY: `map` is a read-only shared mapping of a file (`Mmap::map`): MADV_DONTNEED
            // only drops the pages from this process; a later read of them, through this or any
            // other view, sees the file's bytes again, as every read of the map does. Pages
            // shared with a neighbouring tensor at the range's ends are re-read the same way.
            // A failure leaves the pages resident, which changes nothing but memory.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
    }

    /// Whether the bytes are a view of a mapped file (no copy).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.0, Bytes::Owned(_))
    }
}

impl Deref for PackedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Bytes::Owned(b) => b.as_slice(),
            #[cfg(feature = "native")]
            Bytes::Mapped { map, range } => &map[range.clone()],
        }
    }
}

impl From<Vec<u8>> for PackedBytes {
    fn from(v: Vec<u8>) -> Self {
        PackedBytes(Bytes::Owned(Arc::new(v)))
    }
}

impl PartialEq for PackedBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for PackedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "PackedBytes({} bytes, {kind})", self.len())
    }
}

impl PackedTensor {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.dtype
            .row_bytes(self.shape.last().copied().unwrap_or(0))
    }

    pub fn dequantize(&self) -> HostTensor {
        let mut data = vec![0f32; self.shape.iter().product()];
        self.dtype.dequantize(&self.data, &mut data);
        HostTensor::new(self.shape.clone(), data)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerWeight {
    /// The norm before attention.
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    /// RMSNorm weights of the queries and keys (`QkNorm`).
    QNorm,
    KNorm,
    O,
    /// The norm of attention's output (Gemma's sandwich, OLMo 2).
    PostAttnNorm,
    /// The norm before the MLP.
    FfnNorm,
    Gate,
    Up,
    Down,
    /// The norm of the MLP's output.
    PostFfnNorm,
    /// The router of a mixture of experts, `[experts, hidden]`.
    Router,
    /// Every expert's gate, up and down projections stacked: `[experts, ff, hidden]` and
    /// `[experts, hidden, ff]` (GGUF's 3-D `ffn_*_exps`).
    ExpGate,
    ExpUp,
    ExpDown,
    /// gpt-oss: the router's bias `[experts]`, the experts' biases `[experts, ff]` (gate, up)
    /// and `[experts, hidden]` (down), o_proj's bias `[hidden]` and the attention sinks
    /// `[heads]`.
    RouterBias,
    ExpGateBias,
    ExpUpBias,
    ExpDownBias,
    OBias,
    Sinks,
}

impl LayerWeight {
    /// One of the stacked expert tensors.
    pub fn is_experts(self) -> bool {
        matches!(
            self,
            LayerWeight::ExpGate | LayerWeight::ExpUp | LayerWeight::ExpDown
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightName {
    Embed,
    FinalNorm,
    LmHead,
    Layer(usize, LayerWeight),
}

impl WeightName {
    /// The shape the forward expects, row-major, linear weights as `[out, in]`.
    pub fn expected_shape(self, c: &ModelConfig) -> Vec<usize> {
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let qk_norm = |whole: usize| match c.features.qk_norm {
            Some(QkNorm::Whole) => vec![whole],
            _ => vec![c.head_dim],
        };
        match self {
            WeightName::Embed | WeightName::LmHead => vec![c.vocab_size, h],
            WeightName::FinalNorm => vec![h],
            WeightName::Layer(_, w) => match w {
                LayerWeight::AttnNorm
                | LayerWeight::FfnNorm
                | LayerWeight::PostAttnNorm
                | LayerWeight::PostFfnNorm => vec![h],
                LayerWeight::Q => vec![q, h],
                LayerWeight::K | LayerWeight::V => vec![kv, h],
                LayerWeight::QBias => vec![q],
                LayerWeight::KBias | LayerWeight::VBias => vec![kv],
                LayerWeight::QNorm => qk_norm(q),
                LayerWeight::KNorm => qk_norm(kv),
                LayerWeight::O => vec![h, q],
                LayerWeight::Gate | LayerWeight::Up => vec![ff, h],
                LayerWeight::Down => vec![h, ff],
                LayerWeight::OBias => vec![h],
                LayerWeight::Sinks => vec![c.num_heads],
                LayerWeight::Router
                | LayerWeight::ExpGate
                | LayerWeight::ExpUp
                | LayerWeight::ExpDown
                | LayerWeight::RouterBias
                | LayerWeight::ExpGateBias
                | LayerWeight::ExpUpBias
                | LayerWeight::ExpDownBias => {
                    let Some(moe) = &c.features.moe else {
                        return vec![0];
                    };
                    let (e, eff) = (moe.routing.num_experts, moe.expert_intermediate_size);
                    match w {
                        LayerWeight::Router => vec![e, h],
                        LayerWeight::ExpDown => vec![e, h, eff],
                        LayerWeight::RouterBias => vec![e],
                        LayerWeight::ExpGateBias | LayerWeight::ExpUpBias => vec![e, eff],
                        LayerWeight::ExpDownBias => vec![e, h],
                        _ => vec![e, eff, h],
                    }
                }
            },
        }
    }

    /// An RMSNorm weight (a vector the forward takes as f32, never a matrix).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            WeightName::FinalNorm
                | WeightName::Layer(
                    _,
                    LayerWeight::AttnNorm
                        | LayerWeight::FfnNorm
                        | LayerWeight::PostAttnNorm
                        | LayerWeight::PostFfnNorm
                        | LayerWeight::QNorm
                        | LayerWeight::KNorm
                )
        )
    }

    /// A vector (norm or bias), uploaded as f32; everything else is a matrix.
    pub fn is_vector(self) -> bool {
        self.is_norm()
            || matches!(
                self,
                WeightName::Layer(
                    _,
                    LayerWeight::QBias
                        | LayerWeight::KBias
                        | LayerWeight::VBias
                        | LayerWeight::OBias
                        | LayerWeight::Sinks
                        | LayerWeight::RouterBias
                        | LayerWeight::ExpGateBias
                        | LayerWeight::ExpUpBias
                        | LayerWeight::ExpDownBias
                )
            )
    }
}

/// Where weights come from (a model file through its family's names, random values).
pub trait WeightSource: Send + Sync {
    /// Names the source in error messages (usually a path).
    fn source_name(&self) -> String;
    /// The name this source uses for a canonical weight.
    fn tensor_name(&self, w: WeightName) -> String;
    fn contains(&self, w: WeightName) -> bool;
    /// Loads and dequantizes one weight to f32, shape as stored (row-major).
    fn load_raw(&self, w: WeightName) -> Result<HostTensor>;

    /// The weight's blocks as stored, when it is block-quantized; `None` otherwise.
    fn load_packed_raw(&self, _w: WeightName) -> Result<Option<PackedTensor>> {
        Ok(None)
    }

    /// Loads a weight and checks its shape against the config.
    fn load(&self, w: WeightName, config: &ModelConfig) -> Result<HostTensor> {
        self.check_present(w)?;
        let t = self.load_raw(w)?;
        self.check_shape(w, config, &t.shape)?;
        Ok(t)
    }

    /// Like `load`, but keeps block-quantized weights packed (`None` for other types).
    fn load_packed(&self, w: WeightName, config: &ModelConfig) -> Result<Option<PackedTensor>> {
        self.check_present(w)?;
        let packed = self.load_packed_raw(w)?;
        if let Some(p) = &packed {
            self.check_shape(w, config, &p.shape)?;
        }
        Ok(packed)
    }

    fn check_present(&self, w: WeightName) -> Result<()> {
        if self.contains(w) {
            return Ok(());
        }
        Err(InferError::MissingTensor {
            name: self.tensor_name(w),
            source_name: self.source_name(),
        })
    }

    fn check_shape(&self, w: WeightName, config: &ModelConfig, shape: &[usize]) -> Result<()> {
        let expected = w.expected_shape(config);
        if shape != expected {
            return Err(InferError::ShapeMismatch {
                name: self.tensor_name(w),
                expected,
                actual: shape.to_vec(),
            });
        }
        Ok(())
    }
}

/// A model file's tensors under the file's own names (a GGUF file, safetensors shards).
pub trait TensorStore: Send + Sync {
    fn source_name(&self) -> String;
    fn format(&self) -> Format;
    fn has(&self, name: &str) -> bool;
    /// The tensor dequantized to f32, shape as stored (row-major).
    fn read(&self, name: &str) -> Result<HostTensor>;
    /// The tensor's blocks as stored, when it is a block-quantized matrix.
    fn read_packed(&self, _name: &str) -> Result<Option<PackedTensor>> {
        Ok(None)
    }
}

/// A model file read through its family's tensor names: fused projections are cut into
/// their rows, and stored norm weights get the family's offset.
pub struct ModelWeights<S> {
    pub store: S,
    names: &'static TensorNames,
    config: ModelConfig,
}

impl<S: TensorStore> ModelWeights<S> {
    pub fn new(store: S, config: &ModelConfig) -> Self {
        ModelWeights {
            store,
            names: &config.family.spec().names,
            config: config.clone(),
        }
    }

    /// Where `w` lives in the file (its tensor name, and rows of a fused one).
    pub fn locate(&self, w: WeightName) -> TensorLoc {
        self.names.locate(self.store.format(), &self.config, w)
    }

    /// Experts `0..n`, each its own tensor of one shape, stacked along a new first dimension.
    fn load_stacked(&self, loc: &TensorLoc, n: usize) -> Result<HostTensor> {
        let mut shape = Vec::new();
        let mut data = Vec::new();
        for e in 0..n {
            let t = self.store.read(&loc.expert_name(e))?;
            if e == 0 {
                shape = t.shape.clone();
                data.reserve(n * t.data.len());
            } else if t.shape != shape {
                return Err(InferError::ShapeMismatch {
                    name: loc.expert_name(e),
                    expected: shape,
                    actual: t.shape,
                });
            }
            data.extend_from_slice(&t.data);
        }
        shape.insert(0, n);
        Ok(HostTensor::new(shape, data))
    }

    fn rows_error(&self, loc: &TensorLoc, shape: &[usize]) -> InferError {
        InferError::ShapeMismatch {
            name: loc.name.clone(),
            expected: vec![
                loc.rows.as_ref().map_or(0, |r| r.end),
                shape.get(1).copied().unwrap_or(0),
            ],
            actual: shape.to_vec(),
        }
    }
}

impl<S: TensorStore> WeightSource for ModelWeights<S> {
    fn source_name(&self) -> String {
        self.store.source_name()
    }

    fn tensor_name(&self, w: WeightName) -> String {
        let loc = self.locate(w);
        if let Some(n) = loc.stacked {
            return format!("{} (e in 0..{n})", loc.name);
        }
        match loc.rows {
            Some(r) => format!("{} (rows {}..{})", loc.name, r.start, r.end),
            None => loc.name,
        }
    }

    fn contains(&self, w: WeightName) -> bool {
        let loc = self.locate(w);
        match loc.stacked {
            Some(n) => (0..n).all(|e| self.store.has(&loc.expert_name(e))),
            None => self.store.has(&loc.name),
        }
    }

    fn load_raw(&self, w: WeightName) -> Result<HostTensor> {
        let loc = self.locate(w);
        if let Some(n) = loc.stacked {
            return self.load_stacked(&loc, n);
        }
        let mut t = self.store.read(&loc.name)?;
        if let Some(layout) = loc.layout {
            let shape = t.shape.clone();
            t = layout.apply(t).ok_or_else(|| InferError::ShapeMismatch {
                name: loc.name.clone(),
                expected: w.expected_shape(&self.config),
                actual: shape,
            })?;
        }
        if let Some(rows) = &loc.rows {
            let cols = match t.shape.as_slice() {
                [n, cols] if *n >= rows.end => *cols,
                _ => return Err(self.rows_error(&loc, &t.shape)),
            };
            t = HostTensor::new(
                vec![rows.len(), cols],
                t.data[rows.start * cols..rows.end * cols].to_vec(),
            );
        }
        let offset = self.config.features.norm_weight_offset;
        if offset != 0.0 && w.is_norm() {
            t.data.iter_mut().for_each(|x| *x += offset);
        }
        Ok(t)
    }

    fn load_packed_raw(&self, w: WeightName) -> Result<Option<PackedTensor>> {
        let loc = self.locate(w);
        if loc.stacked.is_some() || loc.layout.is_some() {
            // Per-expert and re-laid-out tensors come from safetensors, never block-quantized.
            return Ok(None);
        }
        let Some(p) = self.store.read_packed(&loc.name)? else {
            return Ok(None);
        };
        let Some(rows) = &loc.rows else {
            return Ok(Some(p));
        };
        if p.shape.len() != 2 || p.shape[0] < rows.end {
            return Err(self.rows_error(&loc, &p.shape));
        }
        // Whole rows of a packed matrix are whole blocks: a view of the same bytes.
        let row_bytes = p.row_bytes();
        Ok(Some(PackedTensor {
            shape: vec![rows.len(), p.shape[1]],
            dtype: p.dtype,
            data: p.data.slice(rows.start * row_bytes..rows.end * row_bytes),
        }))
    }
}

/// Converts between the two RoPE row layouts of Q/K weights, per head, as llama.cpp's
/// convert script does: HF "rotate half" rows → adjacent-pair rows (`to_adjacent = true`)
/// or back. `rows` is `[n_heads * head_dim, cols]`, or a bias when `cols == 1`.
pub fn permute_qk_rows(data: &[f32], n_heads: usize, cols: usize, to_adjacent: bool) -> Vec<f32> {
    let head_dim = data.len() / cols / n_heads;
    let half = head_dim / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for (r, adjacent) in [(0, 2 * i), (1, 2 * i + 1)] {
                // HF row `r * half + i` sits at adjacent-pair row `2i + r`.
                let hf = h * head_dim + r * half + i;
                let adj = h * head_dim + adjacent;
                let (src, dst) = if to_adjacent { (hf, adj) } else { (adj, hf) };
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_round_trips_and_interleaves_halves() {
        let data: Vec<f32> = (0..16).map(|x| x as f32).collect(); // 2 heads × 4 rows × 2 cols
        let adj = permute_qk_rows(&data, 2, 2, true);
        // head 0 HF rows [0,1,2,3] (halves [0,1] and [2,3]) become [0,2,1,3]
        assert_eq!(&adj[..8], &[0., 1., 4., 5., 2., 3., 6., 7.]);
        assert_eq!(permute_qk_rows(&adj, 2, 2, false), data);
    }
}
