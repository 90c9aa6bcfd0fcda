//! The server over real HTTP on 127.0.0.1 (a free port) with SmolLM2 on the CPU backend:
//! completions as JSON and as OpenAI's SSE, models / tokenize / detokenize / health, error
//! bodies and statuses, the API key, and a client that disconnects mid-stream.

mod common;

use common::*;
use serde_json::{json, Value};

#[test]
fn completions_json_and_stream_agree_with_usage() {
    let body = json!({"model": "smol", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let (status, v) = post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let events = stream(&sbody);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 6);
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + 6
    );

    // Several prompts (text and ids) with n = 2: choices indexed prompt * n + sample.
    let ids = post("/tokenize", &json!({"prompt": "Hello"})).1["tokens"].clone();
    for prompt in [json!([[1, 2, 3], ids]), json!(["a", "b"])] {
        let body =
            json!({"prompt": prompt, "n": 2, "max_tokens": 3, "temperature": 0.8, "seed": 1});
        let (status, v) = post("/v1/completions", &body);
        assert_eq!(status, 200, "{v}");
        let idx: Vec<u64> = v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["index"].as_u64().unwrap())
            .collect();
        assert_eq!(idx, [0, 1, 2, 3]);
    }
}

#[test]
fn models_tokenize_detokenize_health() {
    let models: Value = ureq::get(&url("/v1/models"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "smol");
    assert_eq!(ureq::get(&url("/health")).call().unwrap().status(), 200);
    let (_, t) = post("/tokenize", &json!({"prompt": "Hello world"}));
    let (_, d) = post("/detokenize", &json!({"tokens": t["tokens"]}));
    assert_eq!(d["prompt"], "Hello world");
    // Chat messages are tokenized through the template; a prompt and messages together, or
    // a field /tokenize does not take, are refused.
    let (status, m) = post(
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(status, 200, "{m}");
    assert!(
        m["count"].as_u64().unwrap() > t["count"].as_u64().unwrap(),
        "{m}"
    );
    let (status, e) = post(
        "/tokenize",
        &json!({"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(status, 400, "{e}");
    let (status, e) = post("/tokenize", &json!({"prompt": "Hi", "return_tokens": true}));
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("return_tokens"),
        "{e}"
    );
    let (status, e) = post("/detokenize", &json!({"tokens": [99_999_999]}));
    assert_eq!(status, 400, "{e}");
}

/// `/openapi.json` (as vLLM's FastAPI serves it, without the key): every API route, the
/// request bodies' schemas from the types the server parses, every `$ref` resolving.
#[test]
fn the_openapi_document_describes_the_routes_and_bodies() {
    let doc: Value = ureq::get(&url("/openapi.json"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(doc["openapi"], "3.0.3");
    let schemas = &doc["components"]["schemas"];
    let body = |path: &str| {
        let r = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            ["$ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: no body schema in {doc}"))
            .to_string();
        let name = r.trim_start_matches("#/components/schemas/").to_string();
        schemas[&name].clone()
    };
    let chat = body("/v1/chat/completions");
    for field in [
        "messages",
        "tools",
        "chat_template_kwargs",
        "guided_json",
        "priority",
    ] {
        // (Free-form fields, such as a JSON schema, are the `true` schema.)
        assert!(
            !chat["properties"][field].is_null(),
            "chat: no {field}: {chat}"
        );
    }
    assert_eq!(chat["required"], json!(["messages"]), "{chat}");
    assert!(body("/v1/completions")["properties"]["prompt"].is_object());
    assert!(body("/v1/responses")["properties"]["input"].is_object());
    assert!(body("/tokenize")["properties"]["messages"].is_object());
    assert!(body("/detokenize")["properties"]["tokens"].is_object());
    for path in ["/v1/models", "/health", "/metrics", "/tokenizer_info"] {
        assert!(doc["paths"][path]["get"].is_object(), "{path}");
    }
    // Every reference points at a schema the document holds.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 10, "{all:?}");
    for r in all {
        let name = r.trim_start_matches("#/components/schemas/");
        assert!(schemas[name].is_object(), "{r} does not resolve");
    }
}

#[test]
fn chat_page_and_metrics_are_served() {
    let get = |path: &str| {
        let r = ureq::get(&url(path)).call().unwrap();
        let kind = r.header("content-type").unwrap().to_string();
        (kind, r.into_string().unwrap())
    };
    let (kind, html) = get("/");
    assert!(kind.starts_with("text/html"), "{kind}");
    assert!(html.contains("/static/chat.js") && html.contains("id=\"temperature\""));
    let (kind, js) = get("/static/chat.js");
    assert!(kind.starts_with("text/javascript"), "{kind}");
    assert!(js.contains("/v1/chat/completions") && js.contains("tok/s"));
    assert!(get("/static/style.css").0.starts_with("text/css"));
    // The markdown libraries: embedded when npm had installed them at build time (as
    // scripts/test.sh does first), else a 404 saying how to get them.
    let installed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("chat-page/node_modules/marked/lib/marked.umd.js")
        .is_file();
    for lib in ["marked.js", "purify.js"] {
        assert!(html.contains(&format!("/static/vendor/{lib}")));
        match ureq::get(&url(&format!("/static/vendor/{lib}"))).call() {
            Ok(r) => {
                assert!(installed, "{lib} served without npm's files");
                assert!(r
                    .header("content-type")
                    .unwrap()
                    .starts_with("text/javascript"));
                assert!(r.into_string().unwrap().len() > 10_000, "{lib}");
            }
            Err(ureq::Error::Status(404, r)) => {
                assert!(!installed, "{lib} not embedded though installed");
                assert!(r.into_string().unwrap().contains("npm ci"));
            }
            Err(e) => panic!("{lib}: {e}"),
        }
    }
    assert!(matches!(
        ureq::get(&url("/static/vendor/other.js")).call(),
        Err(ureq::Error::Status(404, _))
    ));

    // The browser demo: `/browser` goes to `/browser/`, which is the page itself (or, in a
    // server built before `scripts/build-browser.sh`, a 404 page saying how to build it).
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let r = agent.get(&url("/browser")).call().unwrap();
    assert_eq!((r.status(), r.header("location")), (303, Some("/browser/")));
    let page = match agent.get(&url("/browser/")).call() {
        Ok(r) => {
            assert!(r.header("content-type").unwrap().starts_with("text/html"));
            r.into_string().unwrap()
        }
        Err(ureq::Error::Status(404, r)) => r.into_string().unwrap(),
        Err(e) => panic!("/browser/: {e}"),
    };
    assert!(
        page.contains("demo.js") || page.contains("scripts/build-browser.sh"),
        "{page}"
    );

    // One request moves the counters; every vLLM-named family is there.
    let before = metric("infer:generation_tokens_total");
    let (status, _) = post(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(status, 200);
    let (kind, text) = get("/metrics");
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    assert!(
        metric_in(&text, "infer:generation_tokens_total") >= before + 3.0,
        "{text}"
    );
    for family in [
        "num_requests_running",
        "num_requests_waiting",
        "num_requests_swapped",
        "kv_cache_usage_perc",
        "prefix_cache_hits_total",
        "num_preemptions_total",
        "prompt_tokens_total",
        "time_to_first_token_seconds",
        "time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "inter_token_latency_seconds",
        "request_success_total",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_inference_time_seconds",
        "request_max_num_generation_tokens",
        "request_queue_time_seconds",
        "prefix_cache_queries_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE infer:{family} ")),
            "{family} missing:\n{text}"
        );
    }
    assert!(metric_in(&text, "infer:e2e_request_latency_seconds_count") >= 1.0);
    // Three tokens: two intervals between the request's outputs.
    assert!(metric_in(&text, "infer:inter_token_latency_seconds_count") >= 2.0);
    assert!(metric_in(&text, "infer:prefix_cache_queries_total") >= 1.0);
    // The KV cache's configuration as labels, as the Kubernetes inference gateway reads it.
    let config = r#"infer:cache_config_info{block_size="16",enable_prefix_caching="true",model_name="smol",num_cpu_blocks="0",num_gpu_blocks="256"} 1"#;
    assert!(text.contains(config), "{text}");
}

#[test]
fn a_repeated_prompt_reports_its_cached_tokens() {
    // Long enough for several full 16-token blocks.
    let prompt = "The history of the printing press begins with movable type in China, then \
                  Gutenberg's press in Mainz, which spread across Europe within decades and \
                  changed how knowledge travelled, how languages settled and how people read.";
    let body = json!({"prompt": prompt, "max_tokens": 2});
    let (status, first) = post("/v1/completions", &body);
    assert_eq!(status, 200, "{first}");
    let hits_before = metric("infer:prefix_cache_hits_total");
    let (_, second) = post("/v1/completions", &body);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt_tokens = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached >= 16 && cached < prompt_tokens, "{second}");
    assert_eq!(cached % 16, 0, "whole blocks: {second}");
    // The metrics follow the engine loop, which may still be finishing that step.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while metric("infer:prefix_cache_hits_total") < hits_before + cached as f64 {
        assert!(
            std::time::Instant::now() < deadline,
            "prefix hits not counted"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn bad_requests_get_openai_error_bodies() {
    let cases = [
        (
            json!({"prompt": "x", "temperature": -1}),
            400,
            Some("temperature"),
        ),
        (json!({"prompt": "x", "n": 0}), 400, Some("n")),
        (
            json!({"prompt": "x", "max_tokens": 5000}),
            400,
            Some("max_tokens"),
        ),
        (json!({"prompt": "x", "model": "gpt-4"}), 404, Some("model")),
        (json!({"prompt": "x", "top_k": -5}), 400, Some("top_k")),
        (
            json!({"prompt": "x", "logit_bias": {"abc": 1}}),
            400,
            Some("logit_bias"),
        ),
        (json!({"nothing": 1}), 400, None),
    ];
    for (body, code, param) in cases {
        let (status, v) = post("/v1/completions", &body);
        assert_eq!(status, code, "{body} -> {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(v["error"]["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{body} -> {v}");
        }
    }
    // Unknown fields are refused by name (a silently ignored field is the worst outcome);
    // the documented bookkeeping fields are accepted.
    let (status, e) = post(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 1, "vendor_extra": {"a": 1}}),
    );
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["param"], "vendor_extra", "{e}");
    let (status, _) = post(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 1, "user": "u", "metadata": {"a": "b"}}),
    );
    assert_eq!(status, 200);
    // Invalid JSON, a missing / wrong key, a body over the limit.
    let r = ureq::post(&url("/v1/completions"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .set("content-type", "application/json")
        .send_string("{not json");
    assert!(matches!(r, Err(ureq::Error::Status(400, _))));
    let r = ureq::post(&url("/v1/completions")).send_json(json!({"prompt": "x"}));
    assert!(matches!(r, Err(ureq::Error::Status(401, _))));
    let r = ureq::post(&url("/v1/completions"))
        .set("Authorization", "Bearer wrong")
        .send_json(json!({"prompt": "x"}));
    assert!(matches!(r, Err(ureq::Error::Status(401, _))));
    // Over the body limit: answered from the headers, before the body is read.
    let mut conn = std::net::TcpStream::connect(server().addr).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        infer_web::MAX_BODY_BYTES + 10
    );
    std::io::Write::write_all(&mut conn, head.as_bytes()).unwrap();
    let mut status = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(conn), &mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
}

#[test]
fn chat_completions_json_and_stream() {
    let messages = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let body = json!({"model": "smol", "messages": messages, "max_completion_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let (status, v) = post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("Paris"), "{text}");
    let lps = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        lps.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(lps[0]["top_logprobs"].as_array().unwrap().len(), 2);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let r = ureq::post(&url("/v1/chat/completions"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(sbody)
        .unwrap();
    let text_body = r.into_string().unwrap();
    let events: Vec<&str> = text_body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "length"
            || c["choices"][0]["finish_reason"] == "stop"));
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        v["usage"]["completion_tokens"]
    );

    let (status, e) = post("/v1/chat/completions", &json!({"messages": []}));
    assert_eq!(status, 400, "{e}");
}
