//! Tensors in host memory as weights arrive from a file: dense f32, or block-quantized bytes
//! kept as stored. Below both the file formats that produce them and the weight sources that
//! hand them to the model.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::gguf::dtype::GgmlType;

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
