//! `infer generate` sampling flags: several outputs per prompt (`--n`, `--beam-width`), stop
//! strings and logprobs in the JSON, and clear errors for bad values before the model loads.

use std::process::Output;

use infer_tests::smollm2_path;
use serde_json::Value;

fn infer(args: &[&str]) -> Output {
    infer_tests::run_infer(env!("CARGO_BIN_EXE_infer"), args)
}

fn generate_json(extra: &[&str]) -> Value {
    let model = smollm2_path();
    let mut args = vec![
        "generate",
        "--model",
        &model,
        "--prompt",
        "The three primary colors are",
        "--max-tokens",
        "8",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = infer(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn parallel_samples_and_beams_each_get_an_output() {
    let v = generate_json(&["--n", "3", "--seed", "5", "--logprobs", "2"]);
    let outs = v["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 3);
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o["index"], i);
        assert_eq!(o["token_ids"].as_array().unwrap().len(), 8);
        assert_eq!(o["logprobs"].as_array().unwrap().len(), 8);
        assert_eq!(
            o["logprobs"][0]["top_logprobs"].as_array().unwrap().len(),
            2
        );
        assert!(o["cumulative_logprob"].as_f64().unwrap() < 0.0);
    }
    // The single-output fields mirror the first output.
    assert_eq!(v["text"], outs[0]["text"]);

    let v = generate_json(&["--beam-width", "3", "--n", "2"]);
    let outs = v["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 2);
    assert_ne!(outs[0]["token_ids"], outs[1]["token_ids"]);
}

#[test]
fn stop_strings_end_the_text_and_are_reported() {
    let greedy = generate_json(&["--temperature", "0"]);
    let text = greedy["text"].as_str().unwrap().to_string();
    // Stop at the second word of the greedy continuation.
    let word = text
        .split_whitespace()
        .nth(1)
        .expect("two words")
        .to_string();
    let v = generate_json(&["--temperature", "0", "--stop", &word]);
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(v["stop_reason"], word.as_str());
    assert_eq!(
        v["text"].as_str().unwrap(),
        &text[..text.find(&word).unwrap()]
    );
}

#[test]
fn bad_sampling_values_fail_before_loading() {
    for (flags, needle) in [
        (&["--top-p", "0"][..], "top_p"),
        (&["--n", "2", "--temperature", "0"][..], "greedy"),
        (&["--logit-bias", "5"][..], "TOKEN_ID=BIAS"),
        (
            &["--min-tokens", "9", "--max-tokens", "2"][..],
            "min_tokens",
        ),
        (&["--presence-penalty", "-3"][..], "presence_penalty"),
    ] {
        let mut args = vec!["generate", "--model", "/nonexistent.gguf", "--prompt", "x"];
        args.extend_from_slice(flags);
        let out = infer(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(stderr.contains(needle), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
