//! `infer serve` as a process: it binds (port 0 = a free one), says where on stderr, answers a
//! completion and `infer bench serve`'s load, and exits cleanly on SIGTERM.

use std::process::Command;
use std::time::{Duration, Instant};

use infer_tests::smollm2_path;
use serde_json::{json, Value};

#[test]
fn serve_answers_then_shuts_down_on_sigterm() {
    let (mut child, url) = infer_tests::spawn_serve(
        env!("CARGO_BIN_EXE_infer"),
        &["--model", &smollm2_path(), "--num-kv-blocks", "64"],
    );
    let v: Value = ureq::post(&format!("{url}/v1/completions"))
        .send_json(json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}))
        .unwrap()
        .into_json()
        .unwrap();
    assert!(
        v["choices"][0]["text"].as_str().unwrap().contains("Paris"),
        "{v}"
    );

    // `infer bench serve` against it: every request completes with exactly the asked
    // lengths, and the figures are vLLM's keys.
    let bench = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args([
            "bench",
            "serve",
            "--url",
            &url,
            "--num-prompts",
            "6",
            "--input-len",
            "12",
        ])
        .args([
            "--output-len",
            "5",
            "--max-concurrency",
            "3",
            "--request-rate",
            "50",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["completed"], 6, "{report}");
    assert_eq!(report["failed"], 0);
    assert_eq!(report["total_input_tokens"], 6 * 12);
    assert_eq!(report["total_output_tokens"], 6 * 5);
    for key in [
        "median_ttft_ms",
        "median_tpot_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
    ] {
        assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
    }
    assert!(report["request_throughput"].as_f64().unwrap() > 0.0);

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

/// Issue 34: SIGTERM while a long prompt is being prefilled (and a big body tokenized) exits
/// within the grace period plus about one paced step, not after the whole prefill.
#[test]
fn sigterm_during_a_long_prefill_exits_within_the_grace_period() {
    let grace = Duration::from_secs(1);
    let (mut child, url) = infer_tests::spawn_serve(
        env!("CARGO_BIN_EXE_infer"),
        &[
            "--model",
            &smollm2_path(),
            "--num-kv-blocks",
            "600",
            "--shutdown-grace",
            "1",
        ],
    );
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(700);
    let client = {
        let url = url.clone();
        std::thread::spawn(move || {
            let r = ureq::post(&format!("{url}/v1/completions"))
                .send_json(json!({"prompt": long, "max_tokens": 4}));
            match r {
                Ok(r) => r.status(),
                Err(ureq::Error::Status(s, _)) => s,
                Err(_) => 0,
            }
        })
    };
    // Well into the prefill (it takes tens of seconds here).
    std::thread::sleep(Duration::from_secs(3));
    let sent = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = sent + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "still running 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = sent.elapsed();
    eprintln!("SIGTERM during a ~7,000-token prefill: exited in {took:?} (grace {grace:?})");
    assert!(status.success(), "{status:?}");
    // Grace, then one paced step (250 ms target; four times it on a loaded machine).
    assert!(took < grace + Duration::from_secs(2), "{took:?}");
    // The request cut off by the shutdown got a 503 (or its connection closed).
    let code = client.join().unwrap();
    assert!(code == 503 || code == 0, "{code}");
}
