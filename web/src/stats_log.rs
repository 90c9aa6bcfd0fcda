//! vLLM's periodic engine line: prompt and generation throughput over the last interval, the
//! queues, KV cache usage and the prefix cache's hit rate, logged at `info` every interval
//! while the engine works (and once at the end of the interval it went idle in), for
//! operators reading the log.

use std::time::{Duration, Instant};

use infer_core::EngineStats;

pub struct StatsLog {
    interval: Duration,
    since: Instant,
    /// The counters at the start of the interval.
    base: EngineStats,
}

impl StatsLog {
    pub fn new(interval: Duration, now: &EngineStats) -> Self {
        StatsLog {
            interval,
            since: Instant::now(),
            base: *now,
        }
    }

    /// Logs the line when the interval is over and the engine has worked since the last one
    /// (or is working).
    pub fn tick(&mut self, now: &EngineStats, idle: bool) {
        let elapsed = self.since.elapsed();
        let worked = now.steps != self.base.steps;
        if elapsed < self.interval || (idle && !worked) {
            return;
        }
        let secs = elapsed.as_secs_f64().max(1e-3);
        let prompt = now.prompt_tokens_computed - self.base.prompt_tokens_computed;
        let generated = now.output_tokens - self.base.output_tokens;
        let queries = now.prefix_cache_query_tokens - self.base.prefix_cache_query_tokens;
        let hits = now.prefix_cache_hit_tokens - self.base.prefix_cache_hit_tokens;
        let hit_rate = if queries == 0 {
            0.0
        } else {
            100.0 * hits as f64 / queries as f64
        };
        tracing::info!(
            target: "infer::stats",
            "Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {} reqs, Swapped: {} reqs, Waiting: {} reqs, KV cache usage: {:.1}%, Prefix cache hit rate: {:.1}%",
            prompt as f64 / secs,
            generated as f64 / secs,
            now.num_running,
            now.num_swapped,
            now.num_waiting,
            100.0 * now.kv_usage,
            hit_rate,
        );
        self.since = Instant::now();
        self.base = *now;
    }

    /// While idle: how long until a line is due for work not yet logged (`None`: nothing to
    /// log, wait for requests).
    pub fn due_in(&self, now: &EngineStats) -> Option<Duration> {
        (now.steps != self.base.steps).then(|| self.interval.saturating_sub(self.since.elapsed()))
    }
}
