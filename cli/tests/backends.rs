//! `--backend wgpu` end to end (Vulkan: Mesa lavapipe in CI): the same greedy tokens as the CPU
//! backend, and a clear error for a backend this build lacks.

use std::process::Output;

use infer_tests::smollm2_path;
use serde_json::Value;

fn infer(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_infer"));
    cmd.args(args).env("HF_HUB_OFFLINE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running infer")
}

fn greedy(backend: &str) -> Value {
    let model = smollm2_path();
    let out = infer(
        &[
            "generate",
            "--model",
            &model,
            "--backend",
            backend,
            "--num-kv-blocks",
            "64",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "4",
            "--temperature",
            "0",
            "--json",
        ],
        // Pinned to Vulkan: without a driver wgpu would fall back to slow GL.
        &[("WGPU_BACKEND", "vulkan")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{backend}: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn wgpu_generates_the_cpu_backends_greedy_tokens() {
    let cpu = greedy("cpu");
    let gpu = greedy("wgpu");
    assert_eq!(gpu["token_ids"], cpu["token_ids"]);
    assert_eq!(gpu["text"], cpu["text"]);
}

#[test]
fn unknown_adapter_and_missing_backend_are_clear_errors() {
    let model = smollm2_path();
    let args = ["generate", "--model", &model, "--prompt", "x", "--backend"];
    let run = |backend: &str, env: &[(&str, &str)]| {
        let mut a = args.to_vec();
        a.push(backend);
        let out = infer(&a, env);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let e = run("wgpu", &[("WGPU_ADAPTER_NAME", "no-such-gpu-anywhere")]);
    assert!(
        e.contains("no-such-gpu-anywhere") && e.contains("adapters seen"),
        "{e}"
    );
    assert!(run("cuda", &[]).contains("CUDA backend is not available"));
}
