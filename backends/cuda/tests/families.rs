//! Every supported family against transformers on CUDA (f32 weights; the KV cache is f16, so
//! log-probabilities agree to 2e-3 rather than the CPU's 1e-4), from its HF directory and its
//! GGUF, alone and batched under preemption. Skipped (and saying so) without a GPU.

mod common;

use common::gpu;
use infer_cuda::CudaWeights;
use infer_tests::conformance::families::{check_family, family_cases, FamilyFormat};

const TOLERANCE: f64 = 2e-3;

#[test]
fn every_family_matches_transformers_on_cuda() {
    if gpu(CudaWeights::F32).is_none() {
        return;
    }
    let make = || gpu(CudaWeights::F32).expect("the GPU opened a moment ago");
    let mut report = Vec::new();
    for case in family_cases() {
        for format in [FamilyFormat::Hf, FamilyFormat::Gguf] {
            let diff = check_family(make, &case, format, TOLERANCE);
            report.push(format!("{} {format:?}: {diff:.2e}", case.name));
        }
    }
    eprintln!("max |logprob diff| vs transformers: {}", report.join(", "));
}
