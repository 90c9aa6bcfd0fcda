//! Prometheus metrics, named as vLLM names them under the prefix `infer:` (or `vllm:` with
//! `infer serve --metrics-prefix vllm`, so vLLM's Grafana dashboard and the Kubernetes
//! inference gateway read them unchanged). The engine thread updates them after every loop
//! iteration; `/metrics` only encodes the registry, so a scrape never waits for a step.

use infer_core::{EngineConfig, EngineStats, FinishReason, RequestMetrics};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// vLLM's buckets for TTFT (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for time per output token (seconds).
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's buckets for request latencies (seconds).
const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// `cache_config_info`'s labels, as vLLM names them.
const CACHE_CONFIG_LABELS: [&str; 4] = [
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "enable_prefix_caching",
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

pub struct Metrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    swapped: IntGauge,
    kv_usage: Gauge,
    kv_blocks_used: IntGauge,
    cache_config: GaugeVec,
    prefix_cache_hits: IntCounter,
    prefix_cache_queries: IntCounter,
    preemptions: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    requests_finished: IntCounterVec,
    ttft: Histogram,
    tpot: Histogram,
    inter_token: Histogram,
    prefill_time: Histogram,
    decode_time: Histogram,
    inference_time: Histogram,
    max_generation_tokens: Histogram,
    e2e: Histogram,
    queue_time: Histogram,
    prompt_lens: Histogram,
    output_lens: Histogram,
    spec: SpecMetrics,
}

/// Speculative decoding (vLLM's `spec_decode` series): counters, per-position acceptance,
/// and the rates over the whole run as gauges.
struct SpecMetrics {
    drafts: IntCounter,
    draft_tokens: IntCounter,
    accepted_tokens: IntCounter,
    accepted_per_pos: IntCounterVec,
    acceptance_rate: Gauge,
    mean_acceptance_length: Gauge,
}

/// Metric registration failed: only a programming error (a duplicate or invalid name).
#[derive(Debug, thiserror::Error)]
#[error("registering metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    /// Every metric carries `model_name`, as vLLM's do; names start with `prefix:`.
    pub fn new(model_name: &str, prefix: &str) -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let opts = |name: &str, help: &str| {
            Opts::new(format!("{prefix}:{name}"), help).const_label("model_name", model_name)
        };
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            let o = opts(name, help);
            let h = Histogram::with_opts(HistogramOpts::from(o).buckets(buckets.to_vec()))?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::with_opts(opts(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::with_opts(opts(name, help))?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let kv_usage = Gauge::with_opts(opts(
            "kv_cache_usage_perc",
            "Fraction of device KV-cache blocks in use (1 = full).",
        ))?;
        registry.register(Box::new(kv_usage.clone()))?;
        let requests_finished = IntCounterVec::new(
            opts(
                "request_success_total",
                "Finished requests by reason: stop, length, or abort (client gone / shutdown).",
            ),
            &["finished_reason"],
        )?;
        registry.register(Box::new(requests_finished.clone()))?;
        let cache_config = GaugeVec::new(
            opts(
                "cache_config_info",
                "The KV cache's configuration as labels (value 1).",
            ),
            &CACHE_CONFIG_LABELS,
        )?;
        registry.register(Box::new(cache_config.clone()))?;
        let accepted_per_pos = IntCounterVec::new(
            opts(
                "spec_decode_num_accepted_tokens_per_pos_total",
                "Accepted proposals by their position in the draft.",
            ),
            &["position"],
        )?;
        registry.register(Box::new(accepted_per_pos.clone()))?;
        let float_gauge = |name: &str, help: &str| {
            let g = Gauge::with_opts(opts(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let spec = SpecMetrics {
            drafts: counter(
                "spec_decode_num_drafts_total",
                "Sequence steps that verified proposals.",
            )?,
            draft_tokens: counter("spec_decode_num_draft_tokens_total", "Proposed tokens.")?,
            accepted_tokens: counter(
                "spec_decode_num_accepted_tokens_total",
                "Proposed tokens the target accepted.",
            )?,
            accepted_per_pos,
            acceptance_rate: float_gauge(
                "spec_decode_draft_acceptance_rate",
                "Accepted over proposed tokens since start-up.",
            )?,
            mean_acceptance_length: float_gauge(
                "spec_decode_mean_acceptance_length",
                "Tokens per verified draft since start-up: 1 + accepted / drafts.",
            )?,
        };
        Ok(Metrics {
            spec,
            running: gauge(
                "num_requests_running",
                "Requests with sequences in the running queue.",
            )?,
            waiting: gauge("num_requests_waiting", "Requests waiting to be scheduled.")?,
            swapped: gauge(
                "num_requests_swapped",
                "Requests swapped out to host memory.",
            )?,
            kv_usage,
            cache_config,
            kv_blocks_used: gauge(
                "kv_cache_blocks_used",
                "Distinct device KV blocks referenced by live sequences.",
            )?,
            prefix_cache_hits: counter(
                "prefix_cache_hits_total",
                "Prompt tokens whose KV came from the prefix cache.",
            )?,
            prefix_cache_queries: counter(
                "prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache (hit rate = hits / queries).",
            )?,
            preemptions: counter("num_preemptions_total", "Sequence groups preempted.")?,
            prompt_tokens: counter(
                "prompt_tokens_total",
                "Prompt tokens computed (recomputation after preemption included).",
            )?,
            generation_tokens: counter("generation_tokens_total", "Tokens generated.")?,
            requests_finished,
            ttft: hist(
                "time_to_first_token_seconds",
                "Arrival to first generated token.",
                TTFT_BUCKETS,
            )?,
            tpot: hist(
                "time_per_output_token_seconds",
                "Mean time between output tokens of a request after its first.",
                TPOT_BUCKETS,
            )?,
            inter_token: hist(
                "inter_token_latency_seconds",
                "Time between a request's consecutive outputs (one per engine step it ran in).",
                TPOT_BUCKETS,
            )?,
            prefill_time: hist(
                "request_prefill_time_seconds",
                "First scheduled to first generated token.",
                LATENCY_BUCKETS,
            )?,
            decode_time: hist(
                "request_decode_time_seconds",
                "First generated token to last.",
                LATENCY_BUCKETS,
            )?,
            inference_time: hist(
                "request_inference_time_seconds",
                "First scheduled to last token.",
                LATENCY_BUCKETS,
            )?,
            max_generation_tokens: hist(
                "request_max_num_generation_tokens",
                "Tokens of the longest sequence of a finished request.",
                TOKEN_BUCKETS,
            )?,
            e2e: hist(
                "e2e_request_latency_seconds",
                "Arrival to last token.",
                LATENCY_BUCKETS,
            )?,
            queue_time: hist(
                "request_queue_time_seconds",
                "Arrival to first scheduled.",
                LATENCY_BUCKETS,
            )?,
            prompt_lens: hist(
                "request_prompt_tokens",
                "Prompt length of finished requests.",
                TOKEN_BUCKETS,
            )?,
            output_lens: hist(
                "request_generation_tokens",
                "Generated tokens of finished requests (all sequences).",
                TOKEN_BUCKETS,
            )?,
            registry,
        })
    }

    /// The engine's KV cache configuration, once it is built (vLLM's `cache_config_info`;
    /// the Kubernetes inference gateway reads `block_size` from it to route by prefix).
    pub fn record_cache_config(&self, c: &EngineConfig) {
        let values = [
            c.block_size.to_string(),
            c.num_device_blocks.to_string(),
            c.num_host_blocks.to_string(),
            c.enable_prefix_caching.to_string(),
        ];
        let labels: Vec<&str> = values.iter().map(String::as_str).collect();
        self.cache_config.with_label_values(&labels).set(1.0);
    }

    /// Gauges from the engine's live state; counters by the growth since `last`.
    pub fn record_engine(&self, now: &EngineStats, last: &EngineStats) {
        self.running.set(now.num_running as i64);
        self.waiting.set(now.num_waiting as i64);
        self.swapped.set(now.num_swapped as i64);
        self.kv_usage.set(now.kv_usage);
        self.kv_blocks_used.set(now.kv_blocks_physical as i64);
        let grow = |c: &IntCounter, now: u64, last: u64| c.inc_by(now.saturating_sub(last));
        grow(
            &self.prefix_cache_hits,
            now.prefix_cache_hit_tokens,
            last.prefix_cache_hit_tokens,
        );
        grow(
            &self.prefix_cache_queries,
            now.prefix_cache_query_tokens,
            last.prefix_cache_query_tokens,
        );
        grow(&self.preemptions, now.preemptions, last.preemptions);
        grow(
            &self.prompt_tokens,
            now.prompt_tokens_computed,
            last.prompt_tokens_computed,
        );
        grow(
            &self.generation_tokens,
            now.output_tokens,
            last.output_tokens,
        );
        let (sn, sl, m) = (&now.spec, &last.spec, &self.spec);
        grow(&m.drafts, sn.num_drafts, sl.num_drafts);
        grow(&m.draft_tokens, sn.num_draft_tokens, sl.num_draft_tokens);
        grow(
            &m.accepted_tokens,
            sn.num_accepted_tokens,
            sl.num_accepted_tokens,
        );
        let positions = sn
            .accepted_per_position
            .iter()
            .zip(sl.accepted_per_position);
        for (pos, (&n, l)) in positions.enumerate().filter(|(_, (&n, l))| n > *l) {
            grow(
                &m.accepted_per_pos.with_label_values(&[&pos.to_string()]),
                n,
                l,
            );
        }
        if let (Some(rate), Some(len)) = (sn.acceptance_rate(), sn.mean_acceptance_length()) {
            m.acceptance_rate.set(rate);
            m.mean_acceptance_length.set(len);
        }
    }

    /// The time since a request's previous output (its tokens of one step).
    pub fn record_inter_token(&self, seconds: f64) {
        self.inter_token.observe(seconds);
    }

    /// A request aborted before it finished (client gone, shutdown, engine error).
    pub fn record_aborted(&self) {
        self.requests_finished.with_label_values(&["abort"]).inc();
    }

    /// A finished request's latencies. `longest` is its longest sequence's token count: the
    /// number of decode steps behind TPOT (n > 1 sequences share steps).
    pub fn record_finished(&self, m: &RequestMetrics, reason: FinishReason, longest: usize) {
        let label = match reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        self.requests_finished.with_label_values(&[label]).inc();
        if let Some(t) = m.ttft() {
            self.ttft.observe(t.as_secs_f64());
        }
        if let (Some(first), Some(end)) = (m.first_token, m.finished) {
            if longest > 1 {
                let per = (end - first).as_secs_f64() / (longest - 1) as f64;
                self.tpot.observe(per);
            }
        }
        if let Some(l) = m.latency() {
            self.e2e.observe(l.as_secs_f64());
        }
        if let Some(s) = m.first_scheduled {
            self.queue_time.observe((s - m.arrival).as_secs_f64());
            if let Some(first) = m.first_token {
                self.prefill_time.observe((first - s).as_secs_f64());
            }
            if let Some(end) = m.finished {
                self.inference_time.observe((end - s).as_secs_f64());
            }
        }
        if let (Some(first), Some(end)) = (m.first_token, m.finished) {
            self.decode_time.observe((end - first).as_secs_f64());
        }
        self.max_generation_tokens.observe(longest as f64);
        self.prompt_lens.observe(m.num_prompt_tokens as f64);
        self.output_lens.observe(m.num_output_tokens as f64);
    }

    /// An answered embedding request: finished (`stop`, as vLLM counts pooling requests),
    /// its end-to-end latency and prompt length (it generates nothing, so the token and
    /// per-token histograms are left alone).
    pub fn record_embedded(&self, latency: std::time::Duration, prompt_tokens: usize) {
        self.requests_finished.with_label_values(&["stop"]).inc();
        self.e2e.observe(latency.as_secs_f64());
        self.prompt_lens.observe(prompt_tokens as f64);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec fails only on metric families the registry cannot produce.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}
