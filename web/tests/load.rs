//! Load: 64 concurrent streaming clients x 4 requests each against one server (its own, batch
//! up to 64). Every greedy output equals the same request served alone, and afterwards the
//! metrics show no request in flight and no KV block held.

mod common;

use std::io::{BufRead, BufReader};

use common::*;
use serde_json::{json, Value};

const CLIENTS: usize = 64;
const REQUESTS_PER_CLIENT: usize = 4;
const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
];

fn body(prompt: usize, stream: bool) -> Value {
    json!({
        "prompt": PROMPTS[prompt],
        "max_tokens": 6 + 2 * prompt,
        "temperature": 0,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    })
}

/// (text, finish_reason, completion_tokens) of one streamed request.
fn streamed(prompt: usize) -> (String, String, u64) {
    let r = ureq::post(&url("/v1/completions"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(body(prompt, true))
        .unwrap();
    let (mut text, mut finish, mut tokens) = (String::new(), String::new(), 0);
    let mut done = false;
    for line in BufReader::new(r.into_reader()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(choice) = chunk["choices"].get(0) {
            text.push_str(choice["text"].as_str().unwrap());
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = n;
        }
    }
    assert!(done, "the stream ended without [DONE]");
    (text, finish, tokens)
}

#[test]
fn sixty_four_streaming_clients_get_the_single_request_outputs_and_leave_no_blocks() {
    server_with(CLIENTS, 256);
    let alone: Vec<(String, String, u64)> = (0..PROMPTS.len())
        .map(|p| {
            let (status, v) = post("/v1/completions", &body(p, false));
            assert_eq!(status, 200, "{v}");
            let c = &v["choices"][0];
            (
                c["text"].as_str().unwrap().to_string(),
                c["finish_reason"].as_str().unwrap().to_string(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    let before = metric("infer:request_success_total");

    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            std::thread::spawn(move || {
                (0..REQUESTS_PER_CLIENT)
                    .map(|i| {
                        let p = (c + i) % PROMPTS.len();
                        (p, streamed(p))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut served = 0;
    for client in clients {
        for (p, got) in client.join().unwrap() {
            assert_eq!(got, alone[p], "prompt {p} under load vs alone");
            served += 1;
        }
    }
    assert_eq!(served, CLIENTS * REQUESTS_PER_CLIENT);

    let text = wait_idle_and_empty();
    assert_eq!(
        metric_in(&text, "infer:request_success_total") - before,
        served as f64,
        "{text}"
    );
    // Every request's latencies were observed.
    assert!(metric_in(&text, "infer:time_to_first_token_seconds_count") >= served as f64);
    assert!(metric_in(&text, "infer:generation_tokens_total") > 0.0);
}
