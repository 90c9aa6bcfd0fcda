//! The server's side of the asynchronous engine (`infer_core::serving`): what its engine thread
//! reports goes to the Prometheus metrics, vLLM's periodic engine line and, with
//! `--enable-log-requests`, a line per admitted request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infer_core::engine::{EngineConfig, EngineStats, RequestOutput};
pub use infer_core::serving::{
    AsyncEngine, EngineObserver, Event, Events, NewRequest, SubmitError,
};
use infer_core::{Engine, Executor};

use crate::metrics::Metrics;
use crate::stats_log::StatsLog;

/// How the engine thread runs and what it logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopOptions {
    /// Waiting requests beyond which new ones are refused (0: no limit).
    pub max_waiting: usize,
    /// vLLM's periodic engine line (`stats_log`), every this long; `None`:
    /// `--disable-log-stats`.
    pub log_stats: Option<Duration>,
    /// vLLM's `--enable-log-requests`: each admitted request's id, prompt length, parameters
    /// and its prompt ids cut to this many (`--max-log-len`); `None`: not logged.
    pub log_requests: Option<usize>,
}

impl LoopOptions {
    /// No logs; `max_waiting` as given.
    pub fn quiet(max_waiting: usize) -> Self {
        LoopOptions {
            max_waiting,
            log_stats: None,
            log_requests: None,
        }
    }
}

/// Starts the engine `build` makes on its own thread, reporting to `metrics` and the logs
/// `options` ask for; `build` also returns what the caller needs back (the tokenizer).
pub fn start_engine<E, T>(
    build: impl FnOnce() -> Result<(Engine<E>, T), String> + Send + 'static,
    options: LoopOptions,
    metrics: Arc<Metrics>,
) -> Result<(AsyncEngine, T), String>
where
    E: Executor + 'static,
    T: Send + 'static,
{
    let observer = ServerObserver {
        metrics,
        log_stats: options.log_stats,
        stats_log: None,
        log_requests: options.log_requests,
        last_stats: EngineStats::default(),
        last_output: HashMap::new(),
    };
    AsyncEngine::start(build, options.max_waiting, Box::new(observer))
}

struct ServerObserver {
    metrics: Arc<Metrics>,
    log_stats: Option<Duration>,
    stats_log: Option<StatsLog>,
    log_requests: Option<usize>,
    /// The stats behind the metrics' last update (counters grow by the difference).
    last_stats: EngineStats,
    /// When each running request last produced tokens (for the inter-token latency).
    last_output: HashMap<String, Instant>,
}

impl EngineObserver for ServerObserver {
    fn started(&mut self, config: &EngineConfig, stats: &EngineStats) {
        self.metrics.record_cache_config(config);
        self.last_stats = *stats;
        self.stats_log = self.log_stats.map(|every| StatsLog::new(every, stats));
    }

    fn admitted(&mut self, r: &NewRequest) {
        if let Some(max) = self.log_requests {
            let shown = &r.prompt[..r.prompt.len().min(max)];
            tracing::info!(
                target: "infer::requests",
                request_id = %r.id,
                prompt_tokens = r.prompt.len(),
                params = ?r.params,
                prompt_token_ids = ?shown,
                "received request"
            );
        }
    }

    fn output(&mut self, out: &RequestOutput, at: Instant) {
        if let Some(outputs) = &out.outputs {
            let longest = outputs.iter().map(|o| o.token_ids.len()).max().unwrap_or(0);
            // The best output's reason stands for the request, as in its response.
            if let Some(first) = outputs.first() {
                self.metrics
                    .record_finished(&out.metrics, first.finish_reason, longest);
            }
        }
        let id = &out.request_id;
        if let Some(prev) = self.last_output.insert(id.clone(), at) {
            self.metrics.record_inter_token((at - prev).as_secs_f64());
        }
        if out.finished() {
            self.last_output.remove(id);
        }
    }

    fn aborted(&mut self, id: &str) {
        self.last_output.remove(id);
        self.metrics.record_aborted();
    }

    fn embedded(&mut self, latency: Duration, prompt_tokens: usize) {
        self.metrics.record_embedded(latency, prompt_tokens);
    }

    fn stats(&mut self, now: &EngineStats, idle: bool) {
        if let Some(log) = &mut self.stats_log {
            log.tick(now, idle);
        }
        self.metrics.record_engine(now, &self.last_stats);
        self.last_stats = *now;
    }

    fn wake_in(&self) -> Option<Duration> {
        self.stats_log
            .as_ref()
            .and_then(|l| l.due_in(&self.last_stats))
    }
}
