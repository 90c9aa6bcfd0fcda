//! The CUDA backend's errors.

use infer_core::error::{BackendError, InferError};

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver, NVRTC or cuBLAS library, or no device.
    #[error("CUDA backend unavailable: {0}")]
    Unavailable(String),
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("cuBLAS: {0}")]
    Blas(#[from] cudarc::cublas::result::CublasError),
    #[error("NVRTC could not compile {file}:\n{log}")]
    Compile { file: String, log: String },
    /// An op refused its operands, or hit a limit of the device or a kernel argument.
    #[error(transparent)]
    Op(#[from] BackendError),
}

impl From<CudaError> for InferError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Unavailable(reason) => InferError::BackendUnavailable {
                backend: "CUDA",
                reason,
            },
            CudaError::Op(e) => cuda_err(e),
            CudaError::Driver(e) => cuda_err(BackendError::device("driver", e)),
            CudaError::Blas(e) => cuda_err(BackendError::device("cuBLAS", e)),
            e @ CudaError::Compile { .. } => cuda_err(BackendError::device("NVRTC", e)),
        }
    }
}

/// A backend op's error as the engine reports it.
pub(crate) fn cuda_err(e: BackendError) -> InferError {
    e.on("CUDA")
}

/// `n` as a kernel's 32-bit argument; a size past it is an error, never a truncated value.
pub(crate) fn u32_arg(op: &'static str, n: usize) -> std::result::Result<u32, CudaError> {
    u32::try_from(n).map_err(|_| {
        BackendError::too_large(op, "a kernel argument", n as u64, u32::MAX.into()).into()
    })
}
