//! `infer generate` end to end: the answer on SmolLM2, the JSON output, and a clear error with a
//! non-zero exit (never a panic) for every kind of bad input.

use std::path::Path;
use std::process::{Command, Output};

use infer_tests::gguf_writer::{tiny_llama, Data, Meta};
use infer_tests::smollm2_path;

fn infer(args: &[&str]) -> Output {
    infer_tests::run_infer(env!("CARGO_BIN_EXE_infer"), args)
}

/// Runs `infer generate` and expects failure with `needle` in the message.
fn expect_error(model: &str, extra: &[&str], needle: &str) {
    let mut args = vec!["generate", "--model", model];
    for (flag, default) in [("--prompt", "hello"), ("--max-tokens", "2")] {
        if !extra.iter().any(|a| a.starts_with(flag)) {
            args.extend([flag, default]);
        }
    }
    args.extend_from_slice(extra);
    let out = infer(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure for {extra:?}, got success"
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn chat_answers_paris_and_stops() {
    let model = smollm2_path();
    let args = [
        "generate",
        "--model",
        &model,
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--temperature",
        "0",
    ];
    let out = infer(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "The capital of France is Paris."
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prompt tokens: 37") && stderr.contains("decode:"),
        "{stderr}"
    );
}

#[test]
fn json_output_has_ids_text_and_finish_reason() {
    let model = smollm2_path();
    let out = infer(&[
        "generate",
        "--model",
        &model,
        "--prompt",
        "One, two, three,",
        "--temperature",
        "0",
        "--max-tokens",
        "5",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 5);
    assert!(v["prompt_token_ids"].as_array().unwrap().len() >= 5);
    assert!(!v["text"].as_str().unwrap().is_empty());

    // Seeded sampling is reproducible.
    let sampled = |seed: &str| {
        let o = infer(&[
            "generate",
            "--model",
            &model,
            "--prompt",
            "Once upon a time",
            "--max-tokens",
            "8",
            "--seed",
            seed,
            "--json",
        ]);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["token_ids"].clone()
    };
    assert_eq!(sampled("11"), sampled("11"));
}

#[test]
fn missing_model_file() {
    expect_error("/no/such/model.gguf", &[], "model not found");
}

#[test]
fn truncated_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_llama(1).to_bytes();
    for cut in [10, 100, bytes.len() / 2, bytes.len() - 1] {
        let p = write(dir.path(), "cut.gguf", &bytes[..cut]);
        expect_error(&p, &[], "truncated");
    }
}

#[test]
fn corrupt_gguf_magic_and_garbage_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = tiny_llama(1).to_bytes();
    let p = write(dir.path(), "bad.gguf", b"NOPE not a model at all");
    expect_error(&p, &[], "bad magic");
    // A metadata count of 2^60 must not allocate or loop forever.
    bytes[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let p = write(dir.path(), "huge.gguf", &bytes);
    expect_error(&p, &[], "invalid GGUF file");
}

#[test]
fn unsupported_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama(1);
    w.meta("general.architecture", Meta::Str("gpt2".into()));
    let p = write(dir.path(), "gpt2.gguf", &w.to_bytes());
    expect_error(&p, &[], "unsupported architecture `gpt2`");
    expect_error(
        &p,
        &[],
        "supported: llama, mistral, qwen2, qwen3, gemma2, gemma3",
    );
    // llama.cpp writes Mixtral as arch `llama` with experts: read as Mixtral, so a file
    // without the experts' keys names the key, not a missing tensor.
    let mut w = tiny_llama(1);
    w.meta("llama.expert_count", Meta::U32(8));
    let p = write(dir.path(), "mixtral.gguf", &w.to_bytes());
    expect_error(&p, &[], "metadata `llama.expert_used_count` is missing");
    // A dense family's file that declares experts is refused as what it is.
    let mut w = tiny_llama(1);
    w.meta("general.architecture", Meta::Str("qwen2".into()));
    w.meta("qwen2.expert_count", Meta::U32(8));
    let p = write(dir.path(), "qwen2moe.gguf", &w.to_bytes());
    expect_error(
        &p,
        &[],
        "a mixture-of-experts variant (its metadata sets `expert_count`)",
    );
}

#[test]
fn unsupported_quant_type() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama(1);
    // ggml type 16 is IQ2_XXS (66 bytes per 256 values), which we do not read.
    w.tensor(
        "blk.0.ffn_up.weight",
        &[96, 256],
        Data::Raw(16, vec![0; 96 * 66]),
    );
    let p = write(dir.path(), "iq2.gguf", &w.to_bytes());
    expect_error(&p, &[], "unsupported data type ggml type 16");
}

#[test]
fn tensor_with_wrong_shape_and_missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama(1);
    w.tensor(
        "blk.1.attn_q.weight",
        &[64, 32],
        Data::F32(vec![0.5; 64 * 32]),
    );
    let p = write(dir.path(), "shape.gguf", &w.to_bytes());
    expect_error(
        &p,
        &[],
        "tensor `blk.1.attn_q.weight` has shape [64, 32], expected [64, 64]",
    );

    let mut w = tiny_llama(1);
    w.remove_tensor("blk.1.ffn_down.weight");
    let p = write(dir.path(), "missing.gguf", &w.to_bytes());
    expect_error(&p, &[], "tensor `blk.1.ffn_down.weight` is missing");
}

#[test]
fn unsupported_pre_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama(1);
    w.meta("tokenizer.ggml.pre", Meta::Str("mystery".into()));
    let p = write(dir.path(), "pre.gguf", &w.to_bytes());
    expect_error(&p, &[], "pre-tokenizer `mystery` is not supported");
}

#[test]
fn empty_prompt_and_prompt_longer_than_context() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "tiny.gguf", &tiny_llama(1).to_bytes());
    let out = infer(&["generate", "--model", &p, "--prompt", ""]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the prompt is empty"));
    assert_eq!(out.status.code(), Some(1));
    // tiny_llama's context is 256 tokens; every 'x' is one token.
    let long = "x".repeat(300);
    expect_error(
        &p,
        &["--prompt", &long],
        "the prompt has 300 tokens but the model's context holds 256",
    );
    expect_error(
        &p,
        &["--max-model-len", "4", "--prompt", "xxxxx"],
        "the prompt has 5 tokens but the model's context holds 4",
    );
    expect_error(
        &p,
        &["--max-model-len", "100000"],
        "exceeds the model's context of 256",
    );
}

#[test]
fn invalid_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "tiny.gguf", &tiny_llama(1).to_bytes());
    expect_error(&p, &["--temperature=-1"], "invalid parameter `temperature`");
    expect_error(&p, &["--max-tokens", "0"], "invalid parameter `max_tokens`");
    // Negative numbers parse as values (not as unknown flags) and get the range error.
    expect_error(&p, &["--max-tokens", "-1"], "-1 must be at least 1");
    expect_error(
        &p,
        &["--min-tokens", "-2"],
        "invalid parameter `min_tokens`",
    );
    expect_error(&p, &["--threads", "0"], "--threads must be at least 1");
}

#[test]
fn corrupt_safetensors_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    expect_error(
        dir.path().to_str().unwrap(),
        &[],
        "`hidden_size` is missing",
    );
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "#).unwrap();
    expect_error(dir.path().to_str().unwrap(), &[], "invalid JSON");

    let cfg = r#"{"model_type":"llama","vocab_size":300,"hidden_size":64,"intermediate_size":96,
        "num_hidden_layers":1,"num_attention_heads":4,"max_position_embeddings":64}"#;
    std::fs::write(dir.path().join("config.json"), cfg).unwrap();
    expect_error(
        dir.path().to_str().unwrap(),
        &[],
        "tokenizer.json is missing",
    );

    let tiny = dir.path().join("t.gguf");
    std::fs::write(&tiny, tiny_llama(1).to_bytes()).unwrap();
    let files = infer_core::open_model(tiny.to_str().unwrap()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        files.tokenizer.to_json().unwrap(),
    )
    .unwrap();
    std::fs::remove_file(&tiny).unwrap();
    expect_error(dir.path().to_str().unwrap(), &[], "no model.safetensors");
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":",
    )
    .unwrap();
    expect_error(
        dir.path().to_str().unwrap(),
        &[],
        "invalid safetensors file",
    );

    std::fs::write(
        dir.path().join("config.json"),
        cfg.replace("llama", "gpt_neox"),
    )
    .unwrap();
    expect_error(
        dir.path().to_str().unwrap(),
        &[],
        "unsupported architecture `gpt_neox`",
    );
    std::fs::write(
        dir.path().join("config.json"),
        cfg.replace("\"llama\"", "\"deepseek_v3\""),
    )
    .unwrap();
    expect_error(
        dir.path().to_str().unwrap(),
        &[],
        "`deepseek_v3`: a mixture-of-experts model",
    );
    // A supported mixture of experts whose config lacks its expert keys names the key.
    std::fs::write(
        dir.path().join("config.json"),
        cfg.replace("\"llama\"", "\"qwen3_moe\""),
    )
    .unwrap();
    expect_error(
        dir.path().to_str().unwrap(),
        &[],
        "`moe_intermediate_size` is missing",
    );
    // A key that changes the math and the family does not have: refused by name.
    std::fs::write(
        dir.path().join("config.json"),
        cfg.replace("{", "{\"attn_logit_softcapping\": 30.0, "),
    )
    .unwrap();
    expect_error(
        dir.path().to_str().unwrap(),
        &[],
        "`attn_logit_softcapping` = 30.0 is not read by infer's llama loader",
    );
}

#[test]
fn hub_id_offline_is_a_clear_error() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args([
            "generate",
            "--model",
            "some-org/some-model",
            "--prompt",
            "hi",
        ])
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", home.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not in the HF cache"), "{stderr}");
}
