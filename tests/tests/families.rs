//! Every supported family against transformers on the CPU backend, from its HF directory and
//! its llama.cpp-converted GGUF (`scripts/family_models.py`): log-probabilities over the whole
//! vocabulary within 1e-4 and greedy tokens equal, alone and batched under preemption.

use infer_cpu::CpuBackend;
use infer_tests::conformance::families::{check_family, family_cases, FamilyFormat};

const TOLERANCE: f64 = 1e-4;

#[test]
fn every_family_matches_transformers_on_the_cpu() {
    let mut report = Vec::new();
    for case in family_cases() {
        for format in [FamilyFormat::Hf, FamilyFormat::Gguf] {
            let diff = check_family(CpuBackend::new, &case, format, TOLERANCE);
            report.push(format!("{} {format:?}: {diff:.2e}", case.name));
        }
    }
    eprintln!("max |logprob diff| vs transformers: {}", report.join(", "));
}
