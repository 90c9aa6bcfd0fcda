//! The CUDA backend's errors.

use infer_core::error::InferError;

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
    #[error("{op}: {detail}")]
    Op { op: &'static str, detail: String },
}

impl From<CudaError> for InferError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Unavailable(reason) => InferError::BackendUnavailable {
                backend: "CUDA",
                reason,
            },
            other => InferError::Backend {
                backend: "CUDA",
                message: other.to_string(),
            },
        }
    }
}

pub(crate) fn op_err(op: &'static str, detail: impl std::fmt::Display) -> CudaError {
    CudaError::Op {
        op,
        detail: detail.to_string(),
    }
}

pub(crate) fn u32_arg(op: &'static str, n: usize) -> std::result::Result<u32, CudaError> {
    u32::try_from(n).map_err(|_| op_err(op, format!("{n} does not fit 32 bits")))
}
