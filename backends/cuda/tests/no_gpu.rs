//! Without CUDA the backend is an error, never a panic: cudarc would panic on first use of a
//! missing library, so `CudaBackend::new` checks for them first.

use infer_cuda::{check_libraries, CudaBackend, CudaWeights};

#[test]
fn without_libcuda_opening_the_backend_is_a_clear_error() {
    match check_libraries() {
        Ok(()) => eprintln!("SKIPPED: the CUDA libraries are present on this machine"),
        Err(e) => {
            let err = CudaBackend::new(0, CudaWeights::F16)
                .err()
                .expect("no CUDA, yet opened");
            let msg = err.to_string();
            assert!(msg.starts_with("CUDA backend unavailable: "), "{msg}");
            assert!(msg.contains(".so not found"), "{msg}");
            assert!(e.to_string().contains("unavailable"), "{e}");
        }
    }
}
