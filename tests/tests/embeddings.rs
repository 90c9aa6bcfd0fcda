//! Pooling engines against transformers (`scripts/embedding_reference.py`): each input's
//! final-normed hidden states pooled MEAN / LAST / CLS, for Llama 3, Qwen3 and Mistral from
//! their HF directories and GGUFs, prefilled in chunks with several prompts per step; the
//! request-side settings (normalize, dimensions) and the engine's errors.

use std::sync::Arc;

use infer_core::scheduler::PreemptionMode;
use infer_core::{EmbedParams, Engine, Executor, InferError, PoolingType};
use infer_cpu::CpuBackend;
use infer_tests::conformance::families::{
    families_dir, load_family, tiny_engine_options, FamilyFormat,
};
use serde::Deserialize;

/// f32 against float64 over two layers.
const TOLERANCE: f64 = 1e-5;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    hf_dir: String,
    gguf: String,
    inputs: Vec<Input>,
}

#[derive(Deserialize)]
struct Input {
    ids: Vec<u32>,
    mean: Vec<f64>,
    last: Vec<f64>,
    cls: Vec<f64>,
}

impl Input {
    fn pooled(&self, pooling: PoolingType) -> &[f64] {
        match pooling {
            PoolingType::Mean => &self.mean,
            PoolingType::Last => &self.last,
            PoolingType::Cls => &self.cls,
        }
    }
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(families_dir().join("embeddings.json"))
        .expect("fixtures/families/embeddings.json (scripts/embedding_reference.py)");
    serde_json::from_str::<Fixture>(&text).unwrap().cases
}

/// An engine of 4-token blocks taking `budget` tokens and `seqs` sequences a step.
fn engine(
    case: &Case,
    format: FamilyFormat,
    blocks: usize,
    budget: usize,
    seqs: usize,
) -> Engine<Box<dyn Executor>> {
    let dir = match format {
        FamilyFormat::Hf => &case.hf_dir,
        FamilyFormat::Gguf => &case.gguf,
    };
    let files = infer_core::open_model(families_dir().join(dir).to_str().unwrap()).unwrap();
    let backend = CpuBackend::new();
    let model = Arc::new(load_family(&backend, &files, &case.name));
    tiny_engine_options(blocks, budget, seqs, PreemptionMode::Recompute)
        .build(backend, model, None, false, None, None)
        .unwrap()
}

fn max_diff(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0.0, f64::max)
}

fn raw(pooling: PoolingType) -> EmbedParams {
    EmbedParams {
        pooling,
        normalize: false,
        dimensions: None,
    }
}

#[test]
fn pooled_hidden_states_match_transformers() {
    let mut report = Vec::new();
    for case in cases() {
        for format in [FamilyFormat::Hf, FamilyFormat::Gguf] {
            // 16 tokens a step over 2 sequences: every input is prefilled in several chunks,
            // some steps carry two prompts, and the 98-token input crosses the window.
            let mut e = engine(&case, format, 64, 16, 2);
            let free = e.scheduler().block_manager().num_available_device();
            let prompts: Vec<Vec<u32>> = case.inputs.iter().map(|i| i.ids.clone()).collect();
            let mut worst = 0.0f64;
            for pooling in [PoolingType::Mean, PoolingType::Last, PoolingType::Cls] {
                let got = e.embed(&prompts, &raw(pooling)).unwrap();
                for (g, input) in got.iter().zip(&case.inputs) {
                    let d = max_diff(g, input.pooled(pooling));
                    assert!(
                        d <= TOLERANCE,
                        "{} {format:?} {pooling}: {d:.2e}",
                        case.name
                    );
                    worst = worst.max(d);
                }
            }
            // Every borrowed block is back.
            assert_eq!(e.scheduler().block_manager().num_available_device(), free);
            e.scheduler().check_invariants().unwrap();
            report.push(format!("{} {format:?}: {worst:.1e}", case.name));
        }
    }
    eprintln!("max |pooled diff| vs transformers: {}", report.join(", "));
}

#[test]
fn batched_embeddings_equal_single_ones_and_a_small_pool_still_serves_them() {
    let case = &cases()[1];
    let prompts: Vec<Vec<u32>> = case.inputs.iter().map(|i| i.ids.clone()).collect();
    let params = EmbedParams {
        pooling: PoolingType::Mean,
        ..EmbedParams::default()
    };
    let mut big = engine(case, FamilyFormat::Hf, 128, 256, 8);
    let batched = big.embed(&prompts, &params).unwrap();
    for (p, b) in prompts.iter().zip(&batched) {
        let alone = big.embed(std::slice::from_ref(p), &params).unwrap();
        let d = alone[0]
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(d < 1e-5, "batched vs alone: {d}");
    }
    // 26 blocks hold the 98-token input (25 blocks) but never two inputs at once: they wait
    // for each other's blocks.
    let mut small = engine(case, FamilyFormat::Hf, 26, 256, 8);
    let waited = small.embed(&prompts, &params).unwrap();
    for (w, b) in waited.iter().zip(&batched) {
        let d = w
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(d < 1e-5, "small pool vs big: {d}");
    }
    // Unit length, and `dimensions` cuts before normalizing.
    for v in &batched {
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    let cut = EmbedParams {
        dimensions: Some(8),
        ..params
    };
    let got = big.embed(&prompts[..1], &cut).unwrap();
    let want = &case.inputs[0].mean[..8];
    let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
    let want: Vec<f64> = want.iter().map(|x| x / norm).collect();
    assert_eq!(got[0].len(), 8);
    assert!(max_diff(&got[0], &want) < TOLERANCE);
}

#[test]
fn bad_inputs_are_refused_and_return_their_blocks() {
    let case = &cases()[0];
    let mut e = engine(case, FamilyFormat::Hf, 20, 16, 2);
    let free = e.scheduler().block_manager().num_available_device();
    let ok = case.inputs[1].ids.clone();
    let params = EmbedParams::default();
    let err = |e: &mut Engine<Box<dyn Executor>>, prompts: &[Vec<u32>], p: &EmbedParams| {
        e.embed(prompts, p).unwrap_err()
    };
    assert!(matches!(
        err(&mut e, &[ok.clone(), vec![]], &params),
        InferError::EmptyPrompt
    ));
    assert!(matches!(
        err(&mut e, &[vec![5; 200]], &params),
        InferError::PromptTooLong { .. }
    ));
    // 98 tokens need 25 blocks of the 20: the pool bounds the context.
    assert!(matches!(
        err(&mut e, &[case.inputs[2].ids.clone()], &params),
        InferError::PromptTooLong {
            max_model_len: 80,
            ..
        }
    ));
    // A token outside the vocabulary fails the step after the first prompt started.
    let e3 = err(&mut e, &[ok.clone(), vec![3, 9999]], &params).to_string();
    assert!(e3.contains("vocabulary"), "{e3}");
    let wide = EmbedParams {
        dimensions: Some(33),
        ..params
    };
    let e4 = err(&mut e, std::slice::from_ref(&ok), &wide).to_string();
    assert!(e4.contains("dimensions") && e4.contains("32"), "{e4}");
    assert_eq!(e.scheduler().block_manager().num_available_device(), free);
    e.scheduler().check_invariants().unwrap();
    // And the engine still works.
    assert_eq!(e.embed(&[ok], &params).unwrap()[0].len(), 32);
}
