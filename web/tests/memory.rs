//! Issue 34: a request's memory is bounded before it is spent. 32 of the largest chat bodies
//! at once (8 MiB each, built to cost the most once parsed, rendered and tokenized) must keep
//! the server's peak resident memory within a budget, and give the memory back afterwards.
//! Its own binary: resident memory is the process's, shared with nothing else.

mod common;

use std::time::Duration;

use common::{start, KEY};
use infer_web::ServeOptions;
use serde_json::{json, Value};

/// `VmRSS` or `VmHWM` (peak) of this process, in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024.0
}

/// Resets `VmHWM` to the current resident size (Linux: `5` to `clear_refs`).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// Bodies just under the 8 MiB limit, each built to be expensive past parsing.
fn bodies() -> Vec<Vec<u8>> {
    let limit = usize::try_from(infer_web::MAX_BODY_BYTES).unwrap() - 4096;
    // 1. Very many short messages.
    let n = limit / 37;
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "hi"}))
        .collect();
    let many = json!({"messages": messages, "max_tokens": 1});
    // 2. One tool with a huge description.
    let tool = json!({"type": "function", "function": {
        "name": "f", "description": "lorem ipsum ".repeat(limit / 12 - 100),
        "parameters": {"type": "object", "properties": {}}}});
    let huge_tool =
        json!({"messages": [{"role": "user", "content": "Hi"}], "tools": [tool], "max_tokens": 1});
    // 3. One huge message.
    let huge_message = json!({"messages": [{"role": "user", "content": "dolor sit ".repeat(limit / 10 - 100)}], "max_tokens": 1});
    [many, huge_tool, huge_message]
        .iter()
        .map(|b| {
            let bytes = serde_json::to_vec(b).unwrap();
            assert!(
                bytes.len() as u64 <= infer_web::MAX_BODY_BYTES,
                "{}",
                bytes.len()
            );
            bytes
        })
        .collect()
}

#[test]
fn thirty_two_maximal_chat_bodies_stay_within_a_memory_budget() {
    let server = start(16, 256, ServeOptions::default(), std::future::pending());
    let addr = server.addr;
    let chat = move |body: &[u8]| {
        let r = ureq::post(&format!("http://{addr}/v1/chat/completions"))
            .set("Authorization", &format!("Bearer {KEY}"))
            .set("Content-Type", "application/json")
            .send_bytes(body);
        match r {
            Ok(r) => (r.status(), r.into_json::<Value>().unwrap()),
            Err(ureq::Error::Status(s, r)) => (s, r.into_json::<Value>().unwrap()),
            Err(e) => panic!("{e}"),
        }
    };
    // Warm: the model's pages and the allocator's steady state.
    assert_eq!(
        chat(br#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}"#).0,
        200
    );
    let bodies: Vec<std::sync::Arc<Vec<u8>>> =
        bodies().into_iter().map(std::sync::Arc::new).collect();
    let baseline = status_mib("VmRSS");
    reset_peak();
    let clients: Vec<_> = (0..32)
        .map(|i| {
            let body = bodies[i % bodies.len()].clone();
            std::thread::spawn(move || chat(&body))
        })
        .collect();
    let replies: Vec<(u16, Value)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let peak = status_mib("VmHWM");
    std::thread::sleep(Duration::from_millis(500));
    let after = status_mib("VmRSS");
    let refused_by_limit = replies.iter().filter(|r| r.0 == 400).count();
    let busy = replies.iter().filter(|r| r.0 == 503).count();
    eprintln!(
        "32 maximal chat bodies: resident {baseline:.0} MiB before, peak {peak:.0} MiB (+{:.0}), {after:.0} MiB after; {refused_by_limit} refused by a limit (400), {busy} busy (503)",
        peak - baseline
    );
    for (status, body) in &replies {
        // Each is refused by a named limit, or turned away while the server is busy.
        assert!(*status == 400 || *status == 503, "{status}: {body}");
        if *status == 400 {
            let param = body["error"]["param"].as_str().unwrap_or_default();
            assert!(["messages", "tools"].contains(&param), "{body}");
        } else {
            assert_eq!(body["error"]["type"], "server_busy", "{body}");
        }
    }
    assert!(refused_by_limit >= 3, "{replies:?}");
    // The bodies alone, held by the clients in this process, are ~24 MiB; the server's share
    // is bounded by the body budget (256 MiB) and one preparation per core.
    assert!(
        peak - baseline < 1024.0,
        "peak grew by {:.0} MiB",
        peak - baseline
    );
    assert!(
        after - baseline < 256.0,
        "{:.0} MiB stayed resident",
        after - baseline
    );
    // And the server still answers.
    assert_eq!(
        chat(br#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}"#).0,
        200
    );
}
