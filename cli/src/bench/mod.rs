//! `infer bench`: throughput (many requests through the engine), latency (a batch at a time),
//! the engine's own per-step overhead without a model, GPU kernels one by one, and a running
//! server under load. Figures are medians and
//! percentiles, since these machines are shared and noisy.

mod kernels;
mod latency;
mod overhead;
mod serve;
mod serve_client;
mod throughput;

use anyhow::Result;
use clap::Subcommand;
use infer_core::narrow::u32_index;
use rand::rngs::StdRng;
use rand::Rng;

pub use crate::model::ModelArgs;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Many requests at once: requests/s and tokens/s (like vLLM's benchmark_throughput).
    Throughput(throughput::ThroughputArgs),
    /// A batch of requests at a time, repeated: latency mean and percentiles.
    Latency(latency::LatencyArgs),
    /// Scheduler + block manager + sampler + detokenizer per step, with no model.
    Overhead(overhead::OverheadArgs),
    /// Each GPU kernel at the default model's shapes: time, GFLOP/s, GB/s.
    Kernels(kernels::KernelsArgs),
    /// Load on a running server (`infer serve` or any OpenAI-compatible one): TTFT, TPOT,
    /// ITL, end-to-end latency and throughput (like vLLM's benchmark_serving).
    Serve(serve::ServeBenchArgs),
}

impl BenchCommand {
    /// The model flags of the benchmarks that run a model.
    pub fn model_args(&self) -> Option<&ModelArgs> {
        match self {
            BenchCommand::Throughput(a) => Some(&a.model),
            BenchCommand::Latency(a) => Some(&a.model),
            _ => None,
        }
    }
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Throughput(a) => throughput::run(a),
        BenchCommand::Latency(a) => latency::run(a),
        BenchCommand::Overhead(a) => overhead::run(a),
        BenchCommand::Kernels(a) => kernels::run(a),
        BenchCommand::Serve(a) => serve::run(a),
    }
}

/// Random token ids away from the special tokens at the start of most vocabularies (as
/// vLLM's random dataset draws them).
pub fn random_prompt(rng: &mut StdRng, len: usize, vocab: usize) -> Vec<u32> {
    // A model's vocabulary is within MAX_VOCAB.
    let (lo, vocab) = (u32_index(1000.min(vocab / 2)), u32_index(vocab));
    (0..len).map(|_| rng.random_range(lo..vocab)).collect()
}

/// `q`-quantile (0..=1) by linear interpolation.
#[expect(
    clippy::cast_possible_truncation,
    reason = "floor and ceil of an index"
)]
pub fn percentile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

pub fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// Speculative decoding over a run (the counters' difference), or null without it.
pub fn spec_report(
    before: &infer_core::spec_decode::SpecDecodeStats,
    after: &infer_core::spec_decode::SpecDecodeStats,
    k: Option<usize>,
) -> serde_json::Value {
    let Some(k) = k else {
        return serde_json::Value::Null;
    };
    let mut d = *after;
    d.num_drafts -= before.num_drafts;
    d.num_draft_tokens -= before.num_draft_tokens;
    d.num_accepted_tokens -= before.num_accepted_tokens;
    d.disabled_steps -= before.disabled_steps;
    d.propose_micros -= before.propose_micros;
    for (a, b) in d
        .accepted_per_position
        .iter_mut()
        .zip(before.accepted_per_position)
    {
        *a -= b;
    }
    serde_json::json!({
        "num_speculative_tokens": k,
        "num_drafts": d.num_drafts,
        "num_draft_tokens": d.num_draft_tokens,
        "num_accepted_tokens": d.num_accepted_tokens,
        "acceptance_rate": d.acceptance_rate(),
        "mean_acceptance_length": d.mean_acceptance_length(),
        "accepted_per_position": &d.accepted_per_position[..k],
        "disabled_steps": d.disabled_steps,
        "propose_s": d.propose_micros as f64 / 1e6,
    })
}

/// One line for the text report.
pub fn print_spec(report: &serde_json::Value) {
    if report.is_null() {
        return;
    }
    let pct = |v: &serde_json::Value| {
        v.as_f64()
            .map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
    };
    println!(
        "speculative decoding: acceptance {} | mean acceptance length {} | accepted per position {} | {} drafts, {} steps off (batch size) | proposing {:.2} s",
        pct(&report["acceptance_rate"]),
        report["mean_acceptance_length"]
            .as_f64()
            .map_or("-".into(), |x| format!("{x:.2}")),
        report["accepted_per_position"],
        report["num_drafts"],
        report["disabled_steps"],
        report["propose_s"].as_f64().unwrap_or(0.0),
    );
}
