//! Speculative decoding end to end on SmolLM2: greedy output is the plain output with either
//! proposer (alone, batched, under preemption, cut by stop strings and max_tokens), the
//! figures reach the user, and bad configurations are refused before anything loads.

use std::process::Output;

use infer_tests::gguf_writer::tiny_llama;
use infer_tests::{ok, smollm2_path};
use serde_json::Value;

fn infer(args: &[&str]) -> Output {
    infer_tests::run_infer(env!("CARGO_BIN_EXE_infer"), args)
}

const NGRAM: &str = r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}"#;

fn draft_config() -> String {
    // SmolLM2 drafting for itself: a draft with the target's tokenizer.
    format!(
        r#"{{"model": "{}", "num_speculative_tokens": 3}}"#,
        smollm2_path()
    )
}

/// Greedy `generate --json` over a prompts file; each line's token ids, and stderr.
fn generate(prompts: &str, extra: &[&str]) -> (Vec<Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.jsonl");
    std::fs::write(&file, prompts).unwrap();
    let model = smollm2_path();
    let mut args = vec![
        "generate",
        "--model",
        &model,
        "--chat",
        "--temperature",
        "0",
        "--json",
        "--max-model-len",
        "96",
        "--stop",
        "lazy",
        "--prompts-file",
        file.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = infer(&args);
    let stdout = ok(&out);
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect();
    (lines, String::from_utf8_lossy(&out.stderr).into_owned())
}

const PROMPTS: &str = concat!(
    r#"{"prompt": "Repeat exactly: the cat sat on the mat, the dog sat on the log.", "max_tokens": 40}"#,
    "\n",
    r#"{"prompt": "Write a short poem about autumn.", "max_tokens": 24}"#,
    "\n",
    r#"{"prompt": "Fix the typo and repeat the sentence: The quick brwn fox jumps over the lazy dog.", "max_tokens": 30}"#,
    "\n",
    r#"{"prompt": "List the numbers from 1 to 30 separated by commas.", "max_tokens": 17}"#,
    "\n",
);

#[test]
fn greedy_output_is_unchanged_by_either_proposer_alone_batched_and_preempted() {
    let (plain, _) = generate(PROMPTS, &["--num-kv-blocks", "256"]);
    assert_eq!(plain.len(), 5, "four outputs and the summary: {plain:?}");
    let draft = draft_config();
    for config in [NGRAM, draft.as_str()] {
        for extra in [
            // One at a time.
            &["--max-num-seqs", "1", "--num-kv-blocks", "256"][..],
            // All four in one batch, in a pool too small for them: preemption by recompute,
            // then by swap.
            &["--num-kv-blocks", "6", "--block-size", "16"][..],
            &[
                "--num-kv-blocks",
                "6",
                "--block-size",
                "16",
                "--preemption-mode",
                "swap",
            ][..],
        ] {
            let mut args = vec!["--speculative-config", config];
            args.extend(extra);
            let (got, stderr) = generate(PROMPTS, &args);
            assert_eq!(got.len(), plain.len(), "{config} {extra:?}: {stderr}");
            let preemptions = got[4]["summary"]["preemptions"].as_u64().unwrap();
            assert_eq!(preemptions > 0, extra.contains(&"6"), "{config} {extra:?}");
            for (g, p) in got.iter().zip(&plain).take(4) {
                assert_eq!(
                    g["outputs"][0]["token_ids"], p["outputs"][0]["token_ids"],
                    "{config} {extra:?}"
                );
                assert_eq!(g["outputs"][0]["text"], p["outputs"][0]["text"]);
                assert_eq!(
                    g["outputs"][0]["finish_reason"],
                    p["outputs"][0]["finish_reason"]
                );
            }
        }
    }
    // The stop string cut the third output short of its max_tokens.
    let third = &plain[2]["outputs"][0];
    assert_eq!(third["finish_reason"], "stop", "{third}");
    assert!(!third["text"].as_str().unwrap().contains("lazy"), "{third}");
}

#[test]
fn generate_and_bench_report_acceptance() {
    let model = smollm2_path();
    let out = infer(&[
        "generate",
        "--model",
        &model,
        "--chat",
        "--temperature",
        "0",
        "--max-tokens",
        "30",
        "--prompt",
        "Repeat exactly: one two three four five six seven eight nine ten.",
        "--speculative-config",
        NGRAM,
    ]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("speculative decoding:") && stderr.contains("proposed tokens accepted"),
        "{stderr}"
    );
    let out = infer(&[
        "bench",
        "latency",
        "--model",
        &model,
        "--input-len",
        "16",
        "--output-len",
        "16",
        "--batch-size",
        "2",
        "--num-iters",
        "1",
        "--num-iters-warmup",
        "0",
        "--json",
        "--speculative-config",
        &draft_config(),
    ]);
    let report: Value = serde_json::from_str(&ok(&out)).unwrap();
    let spec = &report["spec_decode"];
    assert_eq!(spec["num_speculative_tokens"], 3, "{report}");
    assert!(spec["num_drafts"].as_u64().unwrap() > 0, "{report}");
    let rate = spec["acceptance_rate"].as_f64().unwrap();
    assert!(rate > 0.5, "a model drafting for itself agrees: {report}");
    assert_eq!(spec["accepted_per_position"].as_array().unwrap().len(), 3);

    // Sampled requests: the draft samples at the request's temperature and reports q, so a
    // model drafting for itself has p = q and min(1, p/q) keeps nearly every proposal (a
    // one-hot q would keep each with probability p(x) only).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.jsonl");
    std::fs::write(&file, PROMPTS).unwrap();
    let out = infer(&[
        "generate",
        "--model",
        &model,
        "--chat",
        "--temperature",
        "0.8",
        "--seed",
        "3",
        "--json",
        "--prompts-file",
        file.to_str().unwrap(),
        "--speculative-config",
        &draft_config(),
    ]);
    let stdout = ok(&out);
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let spec = &summary["summary"]["spec_decode"];
    let rate = spec["acceptance_rate"].as_f64().unwrap();
    assert!(rate > 0.9, "{summary}");
}

#[test]
fn bad_speculative_configs_are_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.gguf");
    std::fs::write(&tiny, tiny_llama(1).to_bytes()).unwrap();
    let model = smollm2_path();
    let other_vocab = format!(
        r#"{{"model": "{}", "num_speculative_tokens": 2}}"#,
        tiny.display()
    );
    for (config, needle) in [
        (
            r#"{"method": "eagle", "num_speculative_tokens": 2}"#,
            "eagle",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
            "num_speculative_tokens",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}"#,
            "lookahead",
        ),
        (r#"{"method": "ngram""#, "speculative_config"),
        (other_vocab.as_str(), "share the target's tokenizer"),
    ] {
        let out = infer(&[
            "generate",
            "--model",
            &model,
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
            "--speculative-config",
            config,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{config}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains(needle),
            "{config}: expected {needle:?} in {stderr}"
        );
    }
}

/// `infer serve --speculative-config`: a streamed completion equals the plain greedy text,
/// and `/metrics` carries vLLM's `spec_decode` counters.
#[test]
fn serve_speculates_and_exports_spec_decode_metrics() {
    let (mut child, url) = infer_tests::spawn_serve(
        env!("CARGO_BIN_EXE_infer"),
        &[
            "--model",
            &smollm2_path(),
            "--num-kv-blocks",
            "64",
            "--speculative-config",
            NGRAM,
        ],
    );
    let prompt = "Repeat exactly: red green blue, red green blue, red green blue.";
    let v: Value = ureq::post(&format!("{url}/v1/chat/completions"))
        .send_json(serde_json::json!({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 24,
            "temperature": 0,
        }))
        .unwrap()
        .into_json()
        .unwrap();
    let served = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // The metrics follow the engine loop, which may still be finishing the last step.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let metrics = loop {
        let m = ureq::get(&format!("{url}/metrics"))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        if m.contains("spec_decode_num_accepted_tokens_per_pos_total{")
            || std::time::Instant::now() > deadline
        {
            break m;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    assert!(
        value("infer:spec_decode_num_drafts_total") > 0.0,
        "{metrics}"
    );
    let proposed = value("infer:spec_decode_num_draft_tokens_total");
    let accepted = value("infer:spec_decode_num_accepted_tokens_total");
    assert!(accepted > 0.0 && accepted <= proposed, "{metrics}");
    let rate = value("infer:spec_decode_draft_acceptance_rate");
    assert!((rate - accepted / proposed).abs() < 1e-9, "{metrics}");
    assert!(metrics.contains("infer:spec_decode_num_accepted_tokens_per_pos_total{"));

    let out = infer(&[
        "generate",
        "--model",
        &smollm2_path(),
        "--chat",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--prompt",
        prompt,
    ]);
    assert_eq!(
        ok(&out).trim(),
        served.trim(),
        "served with speculation vs plain"
    );
}

/// Penalties and structured-output masks apply per verified position: greedy output under a
/// repetition penalty, a frequency penalty and a regex is the plain output.
#[test]
fn penalties_and_grammars_apply_per_position() {
    let model = smollm2_path();
    let run = |extra: &[&str], spec: bool| {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--chat",
            "--temperature",
            "0",
            "--max-tokens",
            "40",
            "--prompt",
            "Repeat exactly: cat dog cat dog cat dog cat dog cat dog.",
        ];
        args.extend(extra);
        // Down to 1-grams: a penalized output repeats little, yet proposals must come.
        let config = r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}"#;
        if spec {
            args.extend(["--speculative-config", config]);
        }
        let out = infer(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (ok(&out), stderr)
    };
    for extra in [
        &["--repetition-penalty", "1.2", "--frequency-penalty", "0.3"][..],
        &[
            "--structured-outputs",
            r#"{"regex": "(cat |dog )+(cat|dog)\\."}"#,
        ][..],
    ] {
        let (plain, _) = run(extra, false);
        let (speculated, stderr) = run(extra, true);
        assert_eq!(speculated, plain, "{extra:?}");
        assert!(
            stderr.contains("proposed tokens accepted"),
            "{extra:?}: {stderr}"
        );
    }
}
