//! Device tensors: f32 activations and weights, f16 weight matrices (half the memory and
//! bandwidth; cuBLAS multiplies them on tensor cores with f32 accumulation), or weight
//! matrices kept in their GGUF blocks (`quant.rs` computes on them directly).

use cudarc::driver::CudaSlice;
use infer_core::backend::DeviceTensor;
use infer_core::gguf::GgmlType;
use infer_core::BackendError;

pub enum Storage {
    F32(CudaSlice<f32>),
    /// IEEE half floats as raw bits.
    F16(CudaSlice<u16>),
    /// Row-major blocks of a quantized type as the file stores them (`quant::kernels_for`
    /// names the types taken).
    Packed {
        dtype: GgmlType,
        data: CudaSlice<u8>,
    },
}

pub struct CudaTensor {
    pub(crate) storage: Storage,
    pub(crate) shape: Vec<usize>,
}

impl DeviceTensor for CudaTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.storage {
            Storage::F32(_) => "f32",
            Storage::F16(_) => "f16",
            Storage::Packed { dtype, .. } => dtype.name(),
        };
        write!(f, "CudaTensor({kind} {:?})", self.shape)
    }
}

impl CudaTensor {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (rows, cols) of a matrix view: the last dimension is the columns.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1).max(1);
        (self.len() / cols, cols)
    }

    pub(crate) fn f32(&self, op: &'static str) -> Result<&CudaSlice<f32>, crate::CudaError> {
        match &self.storage {
            Storage::F32(s) => Ok(s),
            _ => Err(BackendError::unsupported(op, "a tensor that is not f32").into()),
        }
    }

    pub(crate) fn f32_mut(
        &mut self,
        op: &'static str,
    ) -> Result<&mut CudaSlice<f32>, crate::CudaError> {
        match &mut self.storage {
            Storage::F32(s) => Ok(s),
            _ => Err(BackendError::unsupported(op, "a tensor that is not f32").into()),
        }
    }
}
