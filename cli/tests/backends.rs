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

fn greedy(backend: &str, wgpu_weights: &str) -> Value {
    let model = smollm2_path();
    let out = infer(
        &[
            "generate",
            "--model",
            &model,
            "--backend",
            backend,
            "--wgpu-weights",
            wgpu_weights,
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
    let cpu = greedy("cpu", "f32");
    // f32 weights hold the dequantized values exactly; f16 rounds them (relative 2^-11),
    // which this prompt's clear winners survive.
    for weights in ["f32", "f16"] {
        let gpu = greedy("wgpu", weights);
        assert_eq!(gpu["token_ids"], cpu["token_ids"], "{weights} weights");
        assert_eq!(gpu["text"], cpu["text"]);
    }
}

#[test]
fn bench_kernels_reports_every_kernel_on_the_adapter() {
    let out = infer(
        &[
            "bench",
            "kernels",
            "--reps",
            "1",
            "--samples",
            "1",
            "--json",
        ],
        &[("WGPU_BACKEND", "vulkan")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["adapter"].as_str().is_some_and(|a| !a.is_empty()));
    let kernels = v["kernels"].as_array().unwrap();
    for name in [
        "matmul_small",
        "matmul_tiled",
        "rms_norm",
        "silu_mul",
        "add_assign",
        "rope",
        "write_kv",
        "paged_attention",
        "embedding",
        "argmax",
    ] {
        let k = kernels.iter().find(|k| k["kernel"] == name);
        let k = k.unwrap_or_else(|| panic!("no {name} in {v}"));
        assert!(k["median_us"].as_f64().is_some_and(|t| t > 0.0), "{k}");
    }
    // CPU-only flags are refused on the wgpu benchmark, by name.
    let out = infer(&["bench", "kernels", "--rows", "4"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rows"));
}

#[test]
fn bench_kernels_times_the_cpu_matmuls_and_refuses_bad_cases() {
    let args = [
        "bench",
        "kernels",
        "--backend",
        "cpu",
        "--dtypes",
        "q4_k,Q8_0",
        "--shapes",
        "16x256",
        "--rows",
        "1,5",
        "--footprint-mb",
        "1",
        "--reps",
        "1",
        "--samples",
        "1",
        "--threads",
        "2",
        "--json",
    ];
    let out = infer(&args, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["threads"], 2);
    let kernels = v["kernels"].as_array().unwrap();
    let cases: Vec<(String, u64)> = kernels
        .iter()
        .map(|k| {
            (
                k["dtype"].as_str().unwrap().to_string(),
                k["m"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [("Q4_K", 1), ("Q4_K", 5), ("Q8_0", 1), ("Q8_0", 5)].map(|(d, m)| (d.into(), m));
    assert_eq!(cases, want);
    for k in kernels {
        assert!(k["median_us"].as_f64().is_some_and(|t| t > 0.0), "{k}");
        assert!(k["gbytes_per_s"].as_f64().is_some_and(|t| t > 0.0), "{k}");
        // 1 MB of copies of a 2-4 KB matrix.
        assert!(k["copies"].as_u64().is_some_and(|c| c > 100), "{k}");
    }
    for (flag, value, named) in [
        ("--dtypes", "Q9_9", "Q9_9"),
        ("--shapes", "16x100", "16x100"),
        ("--shapes", "16by256", "16by256"),
        ("--rows", "0", "--rows"),
        ("--backend", "cuda", "wgpu and cpu"),
    ] {
        let mut a = args.to_vec();
        let at = a.iter().position(|&x| x == flag).unwrap();
        a[at + 1] = value;
        let out = infer(&a, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(named),
            "{flag} {value}: {stderr}"
        );
    }
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
    if infer_cuda::check_libraries().is_ok() {
        eprintln!("SKIPPED the no-CUDA case: the CUDA libraries are present");
        return;
    }
    let e = run("cuda", &[]);
    assert!(
        e.contains("CUDA backend unavailable: libcuda.so not found"),
        "{e}"
    );
    // `serve` fails the same way, before binding anything.
    let out = infer(
        &[
            "serve",
            "--model",
            &model,
            "--backend",
            "cuda",
            "--port",
            "0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("CUDA backend unavailable") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
