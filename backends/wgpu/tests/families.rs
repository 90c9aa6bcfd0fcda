//! Every supported family against transformers on wgpu (lavapipe in CI), from its HF directory
//! and its GGUF: log-probabilities over the vocabulary within 1e-4 (f32 weights) and greedy
//! tokens equal, alone and batched under preemption; with both kernel sets (cooperative and
//! barrier-free), since each has its own attention and norm paths.

mod common;

use common::{gpu_on, kernel_set_contexts};
use infer_tests::conformance::families::{check_family, family_cases, FamilyFormat};
use infer_wgpu::WeightStorage;

const TOLERANCE: f64 = 1e-4;

#[test]
fn every_family_matches_transformers_on_wgpu() {
    let mut report = Vec::new();
    for (set, ctx) in kernel_set_contexts().iter().enumerate() {
        for case in family_cases() {
            for format in [FamilyFormat::Hf, FamilyFormat::Gguf] {
                let make = || gpu_on(ctx, WeightStorage::F32);
                let diff = check_family(make, &case, format, TOLERANCE);
                report.push(format!("set {set} {} {format:?}: {diff:.2e}", case.name));
            }
        }
    }
    eprintln!("max |logprob diff| vs transformers: {}", report.join(", "));
}
