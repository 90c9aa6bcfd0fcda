//! The device for the GPU tests, or `None` (with a SKIPPED line) where there is none: these
//! tests run on the GPU machine (`scripts/gpu-check.sh`) and say so when skipped elsewhere.
#![allow(dead_code)]

use infer_cuda::{check_libraries, CudaBackend, CudaWeights};

pub fn gpu(weights: CudaWeights) -> Option<CudaBackend> {
    if let Err(e) = check_libraries() {
        eprintln!("SKIPPED (no GPU): {e}");
        return None;
    }
    match CudaBackend::new(0, weights) {
        Ok(b) => Some(b),
        Err(e) if e.to_string().contains("no CUDA device") => {
            eprintln!("SKIPPED (no GPU): {e}");
            None
        }
        // The libraries and a device are there: failing to open it is a failure.
        Err(e) => panic!("opening the CUDA device: {e}"),
    }
}
