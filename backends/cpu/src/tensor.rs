//! The CPU backend's tensor (f32 values or packed quantized blocks) and per-step batch.

use infer_core::gguf::GgmlType;
use infer_core::{BackendError, BatchInput, DeviceTensor, PackedBytes, Result};

use crate::qdot::Layout;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Storage {
    F32(Vec<f32>),
    /// Block-quantized rows as stored in GGUF (a view of the mapped file where there is one),
    /// or repacked at load into interleaved groups of rows (`qdot::interleave`).
    Packed {
        dtype: GgmlType,
        data: PackedBytes,
        layout: Layout,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub(crate) shape: Vec<usize>,
    pub(crate) storage: Storage,
}

impl CpuTensor {
    pub(crate) fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        CpuTensor {
            shape,
            storage: Storage::F32(data),
        }
    }

    /// Rows and row length of a tensor seen as a matrix (last dim = columns).
    pub(crate) fn rows_cols(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1);
        (self.shape.iter().product::<usize>() / cols.max(1), cols)
    }

    /// The values of an f32 tensor (`None` for packed weights).
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::F32(d) => Some(d),
            Storage::Packed { .. } => None,
        }
    }

    pub(crate) fn f32(&self, op: &'static str) -> Result<&[f32]> {
        self.as_f32().ok_or_else(|| {
            BackendError::unsupported(
                op,
                format!(
                    "packed tensor {:?} (only matmul and embedding take packed weights)",
                    self.shape
                ),
            )
            .on("cpu")
        })
    }

    pub(crate) fn f32_mut(&mut self, op: &'static str) -> Result<&mut Vec<f32>> {
        match &mut self.storage {
            Storage::F32(d) => Ok(d),
            Storage::Packed { .. } => {
                Err(BackendError::unsupported(op, "writing into a packed tensor").on("cpu"))
            }
        }
    }
}

impl DeviceTensor for CpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

/// A step's metadata plus what the kernels derive from it once per step (not once per layer).
pub struct CpuBatch {
    pub(crate) input: BatchInput,
    /// For each token, the index of its sequence.
    pub(crate) seq_of_token: Vec<usize>,
}
