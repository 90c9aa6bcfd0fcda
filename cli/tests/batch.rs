//! `infer generate --prompts-file`, the engine flags, and the benchmarks, end to end.

use std::process::Output;

use infer_tests::gguf_writer::tiny_llama;
use infer_tests::{ok, smollm2_path};

fn infer(args: &[&str]) -> Output {
    infer_tests::run_infer(env!("CARGO_BIN_EXE_infer"), args)
}

fn fails_with(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
}

#[test]
fn prompts_file_runs_together_and_reports_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"What is the capital of France?\"}\n\n\
         {\"prompt\": \"Count from one to twenty.\", \"max_tokens\": 6}\n\
         {\"prompt\": \"What is 2+2?\"}\n",
    )
    .unwrap();
    let model = smollm2_path();
    let out = infer(&[
        "generate",
        "--model",
        &model,
        "--chat",
        "--temperature",
        "0",
        "--json",
        "--prompts-file",
        file.to_str().unwrap(),
        "--num-kv-blocks",
        "64",
        "--max-model-len",
        "1024",
    ]);
    let stdout = ok(&out);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (i, l) in lines[..3].iter().enumerate() {
        assert_eq!(l["index"], i);
    }
    assert_eq!(lines[0]["text"], "The capital of France is Paris.");
    assert_eq!(lines[1]["finish_reason"], "length");
    assert_eq!(lines[1]["token_ids"].as_array().unwrap().len(), 6);
    let s = &lines[3]["summary"];
    assert_eq!(s["requests"], 3);
    // The chat template's system prompt is shared: later prompts reuse its full blocks.
    assert!(s["prefix_cache_hit_tokens"].as_u64().unwrap() >= 16, "{s}");
    assert!(s["output_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(s["preemptions"], 0);
}

#[test]
fn bad_prompts_files_and_engine_flags_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.gguf");
    std::fs::write(&tiny, tiny_llama(1).to_bytes()).unwrap();
    let tiny = tiny.to_str().unwrap();
    let file = dir.path().join("bad.jsonl");
    std::fs::write(&file, "{\"prompt\": \"x\"}\n{\"text\": \"y\"}\n").unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", tiny, "--max-tokens", "2"];
        args.extend_from_slice(extra);
        infer(&args)
    };
    fails_with(
        &run(&["--prompts-file", file.to_str().unwrap()]),
        "bad.jsonl:2",
    );
    fails_with(
        &run(&["--prompts-file", "/no/such.jsonl"]),
        "reading prompts file",
    );
    // tiny_llama's context is 256: 4 blocks of 16 hold 64 tokens.
    fails_with(
        &run(&[
            "--prompt",
            "x",
            "--num-kv-blocks",
            "4",
            "--max-model-len",
            "200",
        ]),
        "the largest max_model_len that fits is 64",
    );
    // Without an explicit length the context is lowered to fit, with a warning.
    ok(&run(&["--prompt", "x", "--num-kv-blocks", "4"]));
    fails_with(
        &run(&[
            "--prompt",
            "x",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "4",
        ]),
        "invalid parameter `max_num_batched_tokens`",
    );
    fails_with(
        &run(&["--prompt", "x", "--block-size", "0"]),
        "--block-size",
    );
    fails_with(&run(&["--prompt", "x", "--swap-space=-1"]), "--swap-space");
    let out = run(&["--prompt", "x", "--preemption-mode", "sometimes"]);
    assert_eq!(out.status.code(), Some(2), "clap rejects unknown values");
}

#[test]
fn throughput_and_overhead_benchmarks_report_json() {
    let model = smollm2_path();
    let out = infer(&[
        "bench",
        "throughput",
        "--model",
        &model,
        "--num-prompts",
        "4",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--ignore-eos",
        "--json",
        "--num-kv-blocks",
        "64",
        "--max-model-len",
        "512",
    ]);
    let v: serde_json::Value = serde_json::from_str(ok(&out).trim()).unwrap();
    assert_eq!(v["num_prompts"], 4);
    assert_eq!(v["output_tokens"], 16);
    assert_eq!(v["input_tokens"], 64);
    assert!(v["output_tokens_per_s"].as_f64().unwrap() > 0.0);

    let out = infer(&[
        "bench",
        "overhead",
        "--model",
        &model,
        "--num-seqs",
        "8",
        "--steps",
        "5",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(ok(&out).trim()).unwrap();
    assert_eq!(v["num_seqs"], 8);
    assert!(v["us_per_step_p50"].as_f64().unwrap() > 0.0);

    let out = infer(&[
        "bench",
        "latency",
        "--model",
        &model,
        "--batch-size",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "3",
        "--num-iters",
        "2",
        "--json",
        "--num-kv-blocks",
        "64",
        "--max-model-len",
        "512",
    ]);
    let v: serde_json::Value = serde_json::from_str(ok(&out).trim()).unwrap();
    assert_eq!(v["batch_size"], 2);
    assert!(v["latency_p50_s"].as_f64().unwrap() > 0.0);
}

/// `INFER_CPU_ISA` forces each kernel level this CPU has (scalar, AVX2, AVX-512, NEON...): a
/// single prompt (integer decode kernels) and three together (batched decode: the blocked
/// kernels where the level has them) give the scalar level's greedy tokens. A level this CPU
/// lacks, or one no CPU has, is refused by name.
#[test]
fn every_cpu_kernel_level_gives_the_scalar_levels_greedy_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"The capital of France is\"}\n\
         {\"prompt\": \"One, two, three,\"}\n\
         {\"prompt\": \"def fibonacci(n):\"}\n",
    )
    .unwrap();
    let model = smollm2_path();
    let run = |isa: &str, batch: bool| {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--temperature",
            "0",
            "--json",
        ];
        args.extend(["--max-tokens", "6", "--num-kv-blocks", "64"]);
        if batch {
            args.extend(["--prompts-file", file.to_str().unwrap()]);
        } else {
            args.extend(["--prompt", "The capital of France is"]);
        }
        std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(&args)
            .env("HF_HUB_OFFLINE", "1")
            .env(infer_cpu::ISA_ENV, isa)
            .output()
            .expect("running infer")
    };
    let tokens = |isa: &str, batch: bool| -> Vec<serde_json::Value> {
        ok(&run(isa, batch))
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|l| l.get("token_ids").cloned())
            .collect()
    };
    for batch in [false, true] {
        let reference = tokens("scalar", batch);
        assert_eq!(reference.len(), if batch { 3 } else { 1 });
        for isa in infer_cpu::Isa::available() {
            assert_eq!(tokens(isa.name(), batch), reference, "{isa}, batch {batch}");
        }
    }
    fails_with(&run("sse9", false), "INFER_CPU_ISA=sse9: unknown level");
    if let Some(lacking) = infer_cpu::Isa::all().iter().find(|i| !i.supported()) {
        fails_with(&run(lacking.name(), false), "this CPU lacks it");
    }
}
