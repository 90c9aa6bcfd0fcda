//! `infer serve` started with a vLLM tutorial's command line: the model first, vLLM's flags,
//! a generation config's defaults, the root path, request-id headers, and what operators
//! read in the log (an access line per request, the periodic engine line, no colour codes,
//! never the key or the prompt). A refused vLLM flag exits at once with the reason.

use std::process::Command;
use std::time::{Duration, Instant};

use infer_tests::{smollm2_path, spawn_serve_logged};
use serde_json::{json, Value};

#[test]
fn a_vllm_command_line_serves_and_operators_see_it_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"temperature": 0.0, "max_new_tokens": 3, "do_sample": false}"#,
    )
    .unwrap();
    let model = smollm2_path();
    let (mut child, url, log) = spawn_serve_logged(
        env!("CARGO_BIN_EXE_infer"),
        &[
            &model,
            "--dtype",
            "auto",
            "--api-key",
            "token-abc123",
            "--seed",
            "0",
            "--enable-prefix-caching",
            "--disable-log-requests",
            "--trust-remote-code",
            "--max-model-len",
            "1k",
            "--num-kv-blocks",
            "64",
            "--root-path",
            "/api",
            "--enable-request-id-headers",
            "--log-stats-interval",
            "0.2",
            "--disable-access-log-for-endpoints",
            "/health",
            "--generation-config",
            dir.path().to_str().unwrap(),
            "--served-model-name",
            "smol",
            "smol-alias",
            "--disable-fastapi-docs",
            "--return-tokens-as-token-ids",
        ],
    );
    let prompt = "A secret prompt about the capital of France";
    let call = |path: &str| {
        ureq::post(&format!("{url}{path}"))
            .set("Authorization", "Bearer token-abc123")
            .set("X-Request-Id", "req-42")
            .send_json(json!({"prompt": prompt}))
            .unwrap()
    };
    // Under the root path and without it.
    for path in ["/api/v1/completions", "/v1/completions"] {
        let r = call(path);
        assert_eq!(r.header("x-request-id"), Some("req-42"));
        let v: Value = r.into_json().unwrap();
        // The generation config's max_new_tokens caps the default 16; temperature 0 makes
        // the two replies equal.
        assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    }
    let models: Value = ureq::get(&format!("{url}/api/v1/models"))
        .set("Authorization", "Bearer token-abc123")
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 1000, "{models}");
    // Every served name is listed and answers; replies name the first.
    assert_eq!(models["data"][0]["id"], "smol", "{models}");
    assert_eq!(models["data"][1]["id"], "smol-alias", "{models}");
    let v: Value = ureq::post(&format!("{url}/v1/completions"))
        .set("Authorization", "Bearer token-abc123")
        .send_json(json!({"model": "smol-alias", "prompt": "Hi", "max_tokens": 1}))
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(v["model"], "smol", "{v}");
    // --disable-fastapi-docs: no OpenAPI document.
    let r = ureq::get(&format!("{url}/openapi.json")).call();
    assert!(matches!(r, Err(ureq::Error::Status(404, _))), "{r:?}");
    ureq::get(&format!("{url}/health")).call().unwrap();
    // --return-tokens-as-token-ids names logprob tokens by id unless a request says otherwise.
    for (asked, by_id) in [(None, true), (Some(false), false)] {
        let mut body = json!({"prompt": "Hi", "max_tokens": 2, "logprobs": 1});
        if let Some(a) = asked {
            body["return_tokens_as_token_ids"] = json!(a);
        }
        let v: Value = ureq::post(&format!("{url}/v1/completions"))
            .set("Authorization", "Bearer token-abc123")
            .send_json(body)
            .unwrap()
            .into_json()
            .unwrap();
        let token = v["choices"][0]["logprobs"]["tokens"][0].as_str().unwrap();
        assert_eq!(token.starts_with("token_id:"), by_id, "{v}");
    }
    // The engine line comes within its interval of the work.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log.lock().unwrap().contains("Avg prompt throughput") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = log.lock().unwrap().clone();
    assert!(log.contains("Avg prompt throughput"), "{log}");
    assert!(log.contains("KV cache usage"), "{log}");
    let access: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("infer::access"))
        .collect();
    assert_eq!(access.len(), 7, "{log}");
    assert!(access[0].contains("POST /v1/completions 200"), "{log}");
    assert!(access[0].contains(r#"request_id="req-42""#), "{log}");
    assert!(access[2].contains("GET /v1/models 200"), "{log}");
    assert!(access[4].contains("GET /openapi.json 404"), "{log}");
    assert!(log.contains("nothing remote ever runs"), "{log}");
    assert!(log.contains("default sampling parameters"), "{log}");
    for secret in ["token-abc123", prompt, "\u{1b}["] {
        assert!(!log.contains(secret), "{secret:?} in the log:\n{log}");
    }
}

#[test]
fn a_refused_vllm_flag_exits_with_the_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["serve", "m.gguf", "--enable-lora", "--dtype", "auto"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--enable-lora is a vLLM flag infer does not support"),
        "{err}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let (mut child, url, log) = spawn_serve_logged(
        env!("CARGO_BIN_EXE_infer"),
        &[
            "--model",
            &smollm2_path(),
            "--num-kv-blocks",
            "64",
            "--log-format",
            "json",
        ],
    );
    ureq::get(&format!("{url}/v1/models")).call().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let _ = child.kill();
    let _ = child.wait();
    let log = log.lock().unwrap().clone();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["target"] == "infer::access" && l["fields"]["status"] == 200),
        "{log}"
    );
}

#[test]
fn a_reasoning_parser_splits_the_thinking_from_the_answer() {
    let (mut child, url) = infer_tests::spawn_serve(
        env!("CARGO_BIN_EXE_infer"),
        &[
            "--model",
            &smollm2_path(),
            "--num-kv-blocks",
            "64",
            "--reasoning-parser",
            "deepseek_r1",
        ],
    );
    // The output is forced (a regex constraint) to a DeepSeek-R1-shaped reply.
    let body = |stream: bool| {
        json!({"messages": [{"role": "user", "content": "Is Paris in France?"}],
            "structured_outputs": {"regex": "I think so\\.</think> Yes"},
            "max_tokens": 30, "temperature": 0, "stream": stream})
    };
    let v: Value = ureq::post(&format!("{url}/v1/chat/completions"))
        .send_json(body(false))
        .unwrap()
        .into_json()
        .unwrap();
    let message = &v["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "I think so.", "{v}");
    assert_eq!(message["content"], " Yes", "{v}");
    let text = ureq::post(&format!("{url}/v1/chat/completions"))
        .send_json(body(true))
        .unwrap()
        .into_string()
        .unwrap();
    let (mut reasoning, mut content) = (String::new(), String::new());
    for event in text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(event).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(delta["content"].as_str().unwrap_or_default());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("I think so.", " Yes")
    );
}

/// A GGUF's `general.sampling.*` (llama.cpp's converter copies them from generation_config.json)
/// are the server's defaults under `--generation-config auto`, as generation_config.json is for
/// a directory; one infer's sampler cannot follow stops the server at start, named.
#[test]
fn a_ggufs_sampling_recommendations_are_the_servers_defaults() {
    use infer_tests::gguf_writer::{tiny_llama, Meta};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let mut file = tiny_llama(3);
    file.meta("general.sampling.temp", Meta::F32(0.25))
        .meta("general.sampling.top_k", Meta::U32(7));
    std::fs::write(&path, file.to_bytes()).unwrap();
    let (mut child, _url, log) =
        spawn_serve_logged(env!("CARGO_BIN_EXE_infer"), &[path.to_str().unwrap()]);
    let _ = child.kill();
    let log = log.lock().unwrap().clone();
    assert!(log.contains("temperature=0.25, top_k=7"), "{log}");

    file.meta("general.sampling.mirostat", Meta::U32(2));
    std::fs::write(&path, file.to_bytes()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["serve", path.to_str().unwrap(), "--port", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("general.sampling.mirostat"),
        "{err}"
    );
    assert!(err.contains("--generation-config vllm"), "{err}");
}
