//! A client that disconnects mid-stream: its request is aborted and its blocks freed, and the
//! server keeps serving (its own server, so no other test's requests are in the counts).

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_request() {
    let body = json!({"prompt": "Count to a thousand:", "max_tokens": 900, "temperature": 0, "ignore_eos": true, "stream": true});
    let r = ureq::post(&url("/v1/completions"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(body)
        .unwrap();
    let mut lines = BufReader::new(r.into_reader()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: "), "{first}");
    drop(lines);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = rt.block_on(server().engine.stats()).unwrap();
        if stats.num_running + stats.num_waiting == 0 {
            assert_eq!(
                stats.kv_blocks_physical, 0,
                "blocks still referenced: {stats:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the request kept running: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And the server keeps serving.
    let (status, _) = post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(status, 200);
}
