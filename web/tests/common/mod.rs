//! The test server: SmolLM2 on the CPU backend behind the API key, one per test binary, on
//! 127.0.0.1 at a free port; HTTP helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use infer_core::{Engine, EngineConfig, ModelExecutor, PreemptionMode, SchedulerConfig};
use infer_cpu::CpuBackend;
use infer_tests::smollm2_shared;
use infer_web::{AsyncEngine, Metrics, ServeOptions, ServerState};
use serde_json::Value;

pub const KEY: &str = "sekrit";
/// The one origin the test server's CORS allows.
pub const ALLOWED_ORIGIN: &str = "http://allowed.example";

pub struct Server {
    pub addr: SocketAddr,
    pub engine: AsyncEngine,
}

/// One server per test binary (with an API key), on its own runtime thread.
pub fn server() -> &'static Server {
    server_with(16, 256)
}

/// The test binary's server; the first call decides its batch size and waiting-queue bound.
pub fn server_with(max_num_seqs: usize, max_waiting: usize) -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let started = start(
            max_num_seqs,
            max_waiting,
            ServeOptions::default(),
            std::future::pending(),
        );
        Server {
            addr: started.addr,
            engine: started.engine,
        }
    })
}

/// A server of its own, serving until `shutdown` resolves; `done` ends when it has stopped.
pub struct Started {
    pub addr: SocketAddr,
    pub engine: AsyncEngine,
    pub done: std::sync::mpsc::Receiver<()>,
}

pub fn start(
    max_num_seqs: usize,
    max_waiting: usize,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Started {
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: 256,
        num_host_blocks: 0,
        max_model_len: 1024,
        enable_prefix_caching: true,
        scheduler: SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 512,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    start_engine(config, None, max_waiting, options, shutdown)
}

/// A server of its own on an engine of `config`, its steps paced to `step_target` if given.
pub fn start_engine(
    config: EngineConfig,
    step_target: Option<std::time::Duration>,
    max_waiting: usize,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Started {
    let (model, tokenizer) = smollm2_shared();
    let tok = tokenizer.clone();
    let metrics = Arc::new(Metrics::new("smol", "infer").unwrap());
    let max_model_len = config.max_model_len;
    let (engine, ()) = infer_web::start_engine(
        move || {
            let exec = ModelExecutor::new(
                CpuBackend::new(),
                model,
                config.block_size,
                config.num_device_blocks,
                0,
            )
            .map_err(|e| e.to_string())?;
            let mut engine = Engine::new(exec, Some(tok), config).map_err(|e| e.to_string())?;
            engine.set_step_target(step_target);
            Ok((engine, ()))
        },
        infer_web::LoopOptions::quiet(max_waiting),
        metrics.clone(),
    )
    .unwrap();
    // CORS for one origin (requests without an Origin header are unaffected).
    let cors = infer_web::CorsConfig {
        origins: vec![ALLOWED_ORIGIN.into()],
        ..Default::default()
    };
    let state = Arc::new(
        ServerState::new(
            engine.clone(),
            tokenizer,
            "smol".into(),
            max_model_len,
            "cpu".into(),
            metrics,
        )
        .with_cors(Some(cors)),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let (local, serve) =
                infer_web::bind_with(state, addr, Some(KEY.into()), options, shutdown)
                    .await
                    .unwrap();
            tx.send(local).unwrap();
            serve.await;
        });
        let _ = done_tx.send(());
    });
    Started {
        addr: rx.recv().unwrap(),
        engine,
        done,
    }
}

pub fn url(path: &str) -> String {
    format!("http://{}{path}", server().addr)
}

/// POSTs JSON with the key; returns (status, body).
pub fn post(path: &str, body: &Value) -> (u16, Value) {
    let r = ureq::post(&url(path))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(body.clone());
    match r {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// The `data: ` payloads of an SSE response.
pub fn stream(body: &Value) -> Vec<String> {
    let r = ureq::post(&url("/v1/completions"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(body.clone())
        .unwrap();
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let text = r.into_string().unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    events
        .iter()
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not `data: `: {e:?}"))
                .to_string()
        })
        .collect()
}

/// The sum of a Prometheus metric over its label sets, from `/metrics`.
pub fn metric(name: &str) -> f64 {
    let text = ureq::get(&url("/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    metric_in(&text, name)
}

pub fn metric_in(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .map(|l| {
            let value = l.rsplit(' ').next().unwrap();
            value.parse::<f64>().unwrap()
        })
        .sum()
}

/// Waits until no request is running or waiting (by the metrics), then returns the metrics.
pub fn wait_idle() -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = ureq::get(&url("/metrics"))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let busy = metric_in(&text, "infer:num_requests_running")
            + metric_in(&text, "infer:num_requests_waiting");
        if busy == 0.0 {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "requests still in flight:\n{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `wait_idle`, then checks that no KV block is held (none leaked); returns the metrics.
pub fn wait_idle_and_empty() -> String {
    let text = wait_idle();
    assert_eq!(
        metric_in(&text, "infer:kv_cache_blocks_used"),
        0.0,
        "{text}"
    );
    assert_eq!(metric_in(&text, "infer:kv_cache_usage_perc"), 0.0, "{text}");
    assert_eq!(
        metric_in(&text, "infer:num_requests_swapped"),
        0.0,
        "{text}"
    );
    text
}
