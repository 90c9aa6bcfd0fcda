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
    let lo = 1000.min(vocab / 2) as u32;
    (0..len)
        .map(|_| rng.random_range(lo..vocab as u32))
        .collect()
}

/// `q`-quantile (0..=1) by linear interpolation.
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
