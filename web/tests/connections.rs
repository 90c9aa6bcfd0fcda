//! Connections (issue 17): slow and stalled clients are dropped after the header timeout and
//! do not slow normal requests; shutdown is bounded by its grace period even with a stalled
//! connection, and a stream cut by it ends with an error event and `[DONE]`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{start, KEY};
use infer_web::ServeOptions;
use serde_json::json;

fn health(addr: SocketAddr) -> Duration {
    let t = Instant::now();
    let r = ureq::get(&format!("http://{addr}/health")).call().unwrap();
    assert_eq!(r.status(), 200);
    t.elapsed()
}

/// The kernel's cap on a listen backlog (Linux), or a conservative guess elsewhere.
fn somaxconn() -> usize {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

/// Half a request line: the classic stalled client.
fn stalled(addr: SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /hea").unwrap();
    c
}

#[test]
fn slow_clients_and_shutdown() {
    let limit = infer_web::raise_open_file_limit().unwrap_or(1024);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let options = ServeOptions {
        header_read_timeout: Duration::from_secs(2),
        shutdown_grace: Duration::from_secs(1),
        ..Default::default()
    };
    let server = start(16, 256, options, async move {
        let _ = rx.await;
    });
    let addr = server.addr;

    // Two file descriptors per slow connection here (both ends live in this process). The
    // burst must also fit the kernel's listen backlog (`somaxconn` caps the server's): beyond
    // it SYNs are dropped and retried after a second, which is TCP, not the server, at work.
    let n = 2000
        .min((limit.saturating_sub(512) / 2) as usize)
        .min(somaxconn().saturating_sub(64));
    let slow: Vec<TcpStream> = (0..n).map(|_| stalled(addr)).collect();
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        slowest = slowest.max(health(addr));
    }
    eprintln!("{n} stalled connections: slowest /health {slowest:?}");
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    // A keep-alive connection left idle after a request.
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 64];
    let got = idle.read(&mut first).unwrap();
    assert!(first[..got].starts_with(b"HTTP/1.1 200"));
    // The header timeout closes them.
    std::thread::sleep(Duration::from_millis(2500));
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    assert!(
        idle.read_to_end(&mut rest).is_ok(),
        "an idle keep-alive connection stayed open"
    );
    let mut closed = 0;
    for mut c in slow.into_iter().take(50) {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        if c.read_to_end(&mut buf).is_ok() {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 50,
        "stalled connections still open after the header timeout"
    );

    // A long stream, and a stalled connection, when the shutdown comes.
    let streaming = std::thread::spawn(move || {
        let r = ureq::post(&format!("http://{addr}/v1/completions"))
            .set("Authorization", &format!("Bearer {KEY}"))
            .send_json(json!({"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": true, "stream": true}))
            .unwrap();
        r.into_string().unwrap_or_default()
    });
    // And a non-streaming one: cut off by the shutdown, it gets a 503 (retryable elsewhere).
    let waiting = std::thread::spawn(move || {
        let r = ureq::post(&format!("http://{addr}/v1/completions"))
            .set("Authorization", &format!("Bearer {KEY}"))
            .send_json(
                json!({"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": true}),
            );
        match r {
            Err(ureq::Error::Status(code, r)) => {
                (code, r.into_json::<serde_json::Value>().unwrap())
            }
            other => panic!("{other:?}"),
        }
    });
    let _stalled = stalled(addr);
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    tx.send(()).unwrap();
    server
        .done
        .recv_timeout(Duration::from_secs(10))
        .expect("the server did not stop");
    let took = t.elapsed();
    eprintln!("shutdown with a live stream and a stalled connection: {took:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    let (status, e) = waiting.join().unwrap();
    assert_eq!(status, 503, "{e}");
    assert_eq!(e["error"]["code"], "server_shutting_down", "{e}");
    let body = streaming.join().unwrap();
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{body}");
    assert!(
        events
            .iter()
            .any(|e| e.contains("\"finish_reason\":\"error\"")),
        "no error event: {}",
        &body[body.len().saturating_sub(400)..]
    );
}

#[test]
fn a_burst_the_batch_can_take_is_not_refused() {
    // 16 sequences run at once; 8 may wait beyond them.
    let server = start(16, 8, ServeOptions::default(), std::future::pending());
    let addr = server.addr;
    let burst = |n: usize| {
        let clients: Vec<_> = (0..n)
            .map(|i| {
                std::thread::spawn(move || {
                    let r = ureq::post(&format!("http://{addr}/v1/completions"))
                        .set("Authorization", &format!("Bearer {KEY}"))
                        .send_json(json!({"prompt": format!("Request {i}"), "max_tokens": 4}));
                    match r {
                        Ok(r) => (r.status(), None),
                        Err(ureq::Error::Status(code, r)) => {
                            (code, r.header("retry-after").map(str::to_string))
                        }
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().unwrap())
            .collect::<Vec<_>>()
    };
    // Batch (16) + waiting bound (8): every one is admitted.
    let replies = burst(24);
    assert!(replies.iter().all(|r| r.0 == 200), "{replies:?}");
    // Well beyond: some are refused, each with Retry-After, none with anything else.
    let replies = burst(80);
    let refused: Vec<_> = replies.iter().filter(|r| r.0 == 503).collect();
    assert!(!refused.is_empty(), "{replies:?}");
    assert!(
        refused.iter().all(|r| r.1.as_deref() == Some("1")),
        "{refused:?}"
    );
    assert!(
        replies.iter().all(|r| r.0 == 200 || r.0 == 503),
        "{replies:?}"
    );
    eprintln!(
        "burst of 80 against 16 running + 8 waiting: {} refused",
        refused.len()
    );
}
