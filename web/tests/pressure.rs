//! Under pressure, on a server of its own (one running sequence, one waiting request at
//! most): a client that disconnects mid-stream has its request aborted and its blocks freed
//! (as the metrics show); a request beyond the waiting bound gets 503 at once. The tests
//! take turns so neither sees the other's requests.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

static TURN: Mutex<()> = Mutex::new(());

fn open_stream(max_tokens: usize) -> Lines<BufReader<Box<dyn std::io::Read + Send + Sync>>> {
    let body = json!({"prompt": "Count to a thousand:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "stream": true});
    let r = ureq::post(&url("/v1/completions"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(body)
        .unwrap();
    BufReader::new(r.into_reader()).lines()
}

#[test]
fn a_request_beyond_the_waiting_bound_gets_503_at_once() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    server_with(1, 1);
    let mut running = open_stream(900);
    running.next().unwrap().unwrap();
    // Accepted (the stream's headers come once the engine queued it), waiting behind it.
    let waiting = open_stream(4);
    let start = Instant::now();
    let (status, body) = post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(status, 503, "{body}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "503 took {:?}",
        start.elapsed()
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("--max-waiting 1"), "{message}");
    drop(running);
    // The waiting request is served once the running one is gone.
    let text: Vec<String> = waiting.map(|l| l.unwrap()).collect();
    assert!(text.iter().any(|l| l == "data: [DONE]"), "{text:?}");
    wait_idle();
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_request() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    server_with(1, 1);
    let before =
        metric("infer:request_success_total{finished_reason=\"abort\",model_name=\"smol\"}");
    let mut lines = open_stream(900);
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: "), "{first}");
    // The metrics follow the engine loop, which may still be finishing that step.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric("infer:num_requests_running") != 1.0 {
        assert!(Instant::now() < deadline, "never seen running");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(metric("infer:kv_cache_blocks_used") > 0.0);
    drop(lines);

    let text = wait_idle_and_empty();
    let aborted = "infer:request_success_total{finished_reason=\"abort\",model_name=\"smol\"}";
    assert_eq!(metric_in(&text, aborted) - before, 1.0, "{text}");
    // The engine agrees with its metrics.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let stats = rt.block_on(server().engine.stats()).unwrap();
    assert_eq!(stats.kv_blocks_physical, 0, "{stats:?}");

    // And the server keeps serving.
    let (status, _) = post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(status, 200);
}
