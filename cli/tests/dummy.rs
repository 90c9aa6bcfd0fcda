//! `--load-format dummy`: a config.json alone (no weights) runs with random weights in its
//! shapes, with the tokenizer from `--tokenizer`; without one, a clear error.

use std::process::Command;

use infer_tests::smollm2_path;
use serde_json::{json, Value};

fn write_config(dir: &std::path::Path) -> String {
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "vocab_size": 49152,
    });
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn a_config_without_weights_runs_with_random_weights() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let infer = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(args)
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap()
    };
    let tok = smollm2_path();
    let out = infer(&[
        "bench",
        "throughput",
        "--model",
        &config,
        "--load-format",
        "dummy",
        "--tokenizer",
        &tok,
        "--num-prompts",
        "3",
        "--input-len",
        "10",
        "--output-len",
        "5",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["output_tokens"], 15, "{report}");

    // Random weights are deterministic: the same greedy tokens twice.
    let gen = || {
        let out = infer(&[
            "generate",
            "--model",
            &config,
            "--load-format",
            "dummy",
            "--tokenizer",
            &tok,
            "--prompt",
            "Hello",
            "--max-tokens",
            "6",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["token_ids"].clone()
    };
    let first = gen();
    assert_eq!(first.as_array().unwrap().len(), 6);
    assert_eq!(first, gen());

    let out = infer(&[
        "generate",
        "--model",
        &config,
        "--load-format",
        "dummy",
        "--prompt",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pass --tokenizer") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// The committed real-size configs of each family (configs/) load with random Q4_0 matrices
/// and step: every shape at scale (Qwen3's free head_dim, Gemma 3's 256-wide heads and 262K
/// vocabulary, Phi-4-mini's fused projections and partial LongRoPE, Granite's multipliers,
/// OLMo 2's whole-projection norms, 128 experts of which 8 per token as 3-D packed tensors)
/// goes through the forward once.
#[test]
fn real_size_configs_of_every_family_step_with_q4_0_dummy_weights() {
    let tok = smollm2_path();
    for name in [
        "qwen3-8b",
        "gemma-3-4b",
        "phi-4-mini",
        "granite-3-8b",
        "olmo-2-7b",
        "moe-bench-128x8",
    ] {
        let config = infer_tests::workspace_root().join(format!("configs/{name}/config.json"));
        let out = Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["generate", "--model", config.to_str().unwrap()])
            .args(["--load-format", "dummy", "--dummy-dtype", "q4_0"])
            .args(["--tokenizer", &tok, "--prompt", "Hello there"])
            .args(["--max-tokens", "2", "--ignore-eos", "--temperature", "0"])
            .args(["--max-model-len", "256", "--json"])
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["token_ids"].as_array().unwrap().len(), 2, "{name}: {v}");
    }
}

#[test]
fn dummy_dtype_without_dummy_weights_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["generate", "--model", &smollm2_path(), "--prompt", "x"])
        .args(["--dummy-dtype", "q4_0"])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--dummy-dtype applies only with --load-format dummy"),
        "{stderr}"
    );
}
