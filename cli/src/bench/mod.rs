//! `infer bench`: throughput (many requests through the engine), latency (a batch at a time),
//! and the engine's own per-step overhead without a model. Figures are medians and
//! percentiles, since these machines are shared and noisy.

mod latency;
mod overhead;
mod throughput;

use std::sync::Arc;

use anyhow::Result;
use clap::{Args, Subcommand};
use infer_core::{Backend, Engine, LlamaExecutor, Tokenizer};
use rand::rngs::StdRng;
use rand::Rng;

use crate::engine_args::EngineArgs;
use crate::model::{init_threads, load_model, BackendKind, CpuWeights};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Many requests at once: requests/s and tokens/s (like vLLM's benchmark_throughput).
    Throughput(throughput::ThroughputArgs),
    /// A batch of requests at a time, repeated: latency mean and percentiles.
    Latency(latency::LatencyArgs),
    /// Scheduler + block manager + sampler + detokenizer per step, with no model.
    Overhead(overhead::OverheadArgs),
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Throughput(a) => throughput::run(a),
        BenchCommand::Latency(a) => latency::run(a),
        BenchCommand::Overhead(a) => overhead::run(a),
    }
}

/// The model and engine flags every model benchmark takes.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// GGUF file, HF model directory, or Hugging Face hub id (org/name).
    #[arg(long)]
    pub model: String,
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendKind,
    #[arg(long, value_enum, default_value = "packed")]
    pub cpu_weights: CpuWeights,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub max_model_len: Option<usize>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub type CpuEngine = Engine<LlamaExecutor<infer_cpu::CpuBackend>>;

impl ModelArgs {
    /// Loads the model and builds the engine on the chosen backend.
    pub fn engine(&self) -> Result<(CpuEngine, Arc<Tokenizer>, String)> {
        init_threads(self.threads)?;
        let backend = self.backend.cpu(self.cpu_weights)?;
        let name = backend.name();
        let (model, tokenizer) = load_model(&backend, &self.model, self.max_model_len)?;
        let tokenizer = Arc::new(tokenizer);
        let engine = self.engine.build(
            backend,
            Arc::new(model),
            Some(tokenizer.clone()),
            self.max_model_len.is_some(),
        )?;
        Ok((engine, tokenizer, name))
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
