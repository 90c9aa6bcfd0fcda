//! Tiny random models written by scripts/tiny_models.py (quantized by the `gguf` package) against
//! its float64 forward: Qwen2 biases and rotate-half RoPE, Llama 3.1 RoPE scaling, an untied
//! lm_head, GQA 4:1, and F16 / BF16 / Q8_0 / Q4_0 / Q4_1 tensors. Generation runs with 4-token
//! blocks and 5-token prefill chunks, so attention crosses blocks and chunks.

use infer_core::RopeStyle;
use infer_cpu::CpuBackend;
use infer_tests::hf_writer::{write_hf_dir, SaveDtype};
use infer_tests::{cpu_backends, fixtures_dir, load_cpu, load_cpu_with, max_abs_diff};
use serde::Deserialize;

const LOGIT_TOLERANCE: f32 = 1e-3;

/// The K-quant case's packed weights meet activations quantized to an 8-bit plane and its
/// residual in groups of 256 (one scale per weight block, as llama.cpp's Q8_K, so the kernels
/// sum whole blocks in integers): 1.5e-3 from float64 on logits up to 9.7, where groups of 16
/// gave 4e-4 and one 8-bit plane 0.097. Its smallest greedy margin is 0.08.
const K_QUANT_LOGIT_TOLERANCE: f32 = 2e-3;

/// Matrices repacked into interleaved groups (the default backend on x86) meet the same two
/// planes in steps of 32 values, whatever their type: 0.98e-3 (Q8_0) and 0.99e-3 (Q4_0) from
/// float64, then 1.35e-3 for Q8_0 once attention summed in other orders (which codes the
/// planes round to moves with anything upstream). The f32 kernels on the stored rows stay
/// within 5e-6.
const INTERLEAVED_LOGIT_TOLERANCE: f32 = 2e-3;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Clone, Deserialize)]
struct Case {
    name: String,
    file: String,
    prompt_ids: Vec<u32>,
    last_logits: Vec<f32>,
    greedy_ids: Vec<u32>,
    greedy_margins: Vec<f32>,
    llama3_rope_scaling: Option<serde_json::Value>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures_dir().join("tiny/reference.json")).unwrap();
    serde_json::from_str::<Fixture>(&text).unwrap().cases
}

fn path(case: &Case) -> String {
    fixtures_dir()
        .join("tiny")
        .join(&case.file)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn logits_and_greedy_tokens_match_float64_reference() {
    for (case, (nth, backend)) in cases().into_iter().flat_map(|c| {
        let backends = cpu_backends().into_iter().enumerate();
        backends.map(move |b| (c.clone(), b))
    }) {
        // `cpu_backends()[0]` repacks into interleaved groups.
        let interleaved = nth == 0;
        let m = load_cpu_with(&path(&case), backend);
        let c = &m.config;
        let expected_style = if case.name.starts_with("qwen2") {
            RopeStyle::HalfSplit
        } else {
            RopeStyle::AdjacentPairs
        };
        assert_eq!(c.rope_style, expected_style, "{}", case.name);
        assert_eq!(c.attention_bias, case.name.starts_with("qwen2"));

        let diff = max_abs_diff(&m.last_logits(&case.prompt_ids), &case.last_logits);
        let tolerance = if case.name.contains("_q4_k") {
            K_QUANT_LOGIT_TOLERANCE
        } else if interleaved {
            INTERLEAVED_LOGIT_TOLERANCE
        } else {
            LOGIT_TOLERANCE
        };
        assert!(diff <= tolerance, "{}: max |logit diff| {diff}", case.name);

        let params = infer_core::SamplingParams {
            ignore_eos: true,
            ..infer_core::SamplingParams::greedy(case.greedy_ids.len())
        };
        let out = m.generate_in(&case.prompt_ids, &params, 4, 5, &mut |_| {});
        if let Some(i) = out
            .token_ids
            .iter()
            .zip(&case.greedy_ids)
            .position(|(a, b)| a != b)
        {
            assert!(
                case.greedy_margins[i] < 2.0 * LOGIT_TOLERANCE,
                "{}: token {i} is {} but the reference picked {} (margin {})",
                case.name,
                out.token_ids[i],
                case.greedy_ids[i],
                case.greedy_margins[i]
            );
        }
    }
}

#[test]
fn hf_directories_match_their_gguf() {
    for case in cases() {
        // f32 weights on both sides: this compares the formats' weight mapping, and the packed
        // K-quant path runs on 8-bit activations (checked against references in infer-cpu).
        let gguf = load_cpu_with(&path(&case), CpuBackend::f32_weights());
        let dir = tempfile::tempdir().unwrap();
        write_hf_dir(&gguf, dir.path(), SaveDtype::F32);
        if let Some(scaling) = &case.llama3_rope_scaling {
            // GGUF carries Llama 3.1 scaling as `rope_freqs`; HF as a config entry.
            let cfg_path = dir.path().join("config.json");
            let mut cfg: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
            let mut s = scaling.clone();
            s["rope_type"] = "llama3".into();
            cfg["rope_scaling"] = s;
            std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        }
        let hf = load_cpu(dir.path().to_str().unwrap());
        assert_eq!(hf.config.rope_style, RopeStyle::HalfSplit);
        let diff = max_abs_diff(
            &gguf.last_logits(&case.prompt_ids),
            &hf.last_logits(&case.prompt_ids),
        );
        assert!(diff < 1e-4, "{}: max |logit diff| {diff}", case.name);
    }
}

/// The harness the GPU backends run their decode-step machinery through (CUDA graphs), on the
/// CPU: packed weights against f32 ones, batches of 1, 3 and 9 sequences, one crossing a
/// 512-key attention partition; and a model of Q4_1 blocks.
#[test]
fn decode_steps_agree_across_weight_layouts() {
    let [packed, _, f32_weights] = cpu_backends();
    use infer_core::gguf::GgmlType;
    use infer_tests::conformance::check_decode_steps;
    check_decode_steps(&packed, &f32_weights, None, &[1, 3, 9], 14, 1e-4);
    // Layers of Q4_1 blocks (as the CUDA test runs its integer matvecs on).
    check_decode_steps(&packed, &f32_weights, Some(GgmlType::Q4_1), &[2], 4, 1e-4);
}
