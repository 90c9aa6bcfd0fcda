//! Engine flags shared by `generate`, `bench` and `serve`: scheduler limits, block size and
//! the KV pool's budget, turned into the core builder's `EngineOptions`.

use anyhow::Result;
use clap::{Args, ValueEnum};
use infer_core::{EngineOptions, PreemptionMode, SchedulerConfig};

const GIB: f64 = (1u64 << 30) as f64;
/// vLLM's default chunked-prefill budget.
const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preemption {
    /// Free the victim's blocks and recompute its tokens later.
    Recompute,
    /// Copy the victim's blocks to host memory (`--swap-space`) and back.
    Swap,
}

#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV pool size in blocks (overrides the memory-based sizing; vLLM's
    /// --num-gpu-blocks-override).
    #[arg(long, alias = "num-gpu-blocks-override")]
    pub num_kv_blocks: Option<usize>,
    /// KV pool budget in GiB on the CPU backend.
    #[arg(long, default_value_t = 4.0)]
    pub kv_cache_memory: f64,
    /// KV pool budget in bytes, as vLLM writes it (`4G`, `4000m`); overrides
    /// --kv-cache-memory and, on GPUs, --gpu-memory-utilization.
    #[arg(long, value_parser = crate::vllm::human_int)]
    pub kv_cache_memory_bytes: Option<usize>,
    /// Share of the device memory left free after the weights and a profiled worst-case step
    /// that the KV pool takes (GPU backends).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Host memory in GiB for swapped-out KV blocks.
    #[arg(long, default_value_t = 4.0)]
    pub swap_space: f64,
    /// Most sequences in one step.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens in one step (decode tokens plus prefill chunks); default 2048 (`2k` and
    /// `2K` as vLLM writes them). `serve` without it paces steps instead: the budget follows
    /// the measured cost of a token so a step stays near --step-target-ms, at most 2048.
    #[arg(long, value_parser = crate::vllm::human_int)]
    pub max_num_batched_tokens: Option<usize>,
    #[arg(long, value_enum, default_value = "recompute")]
    pub preemption_mode: Preemption,
    /// Reuse the KV blocks of shared prompt prefixes (the default, as in vLLM).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Do not reuse the KV blocks of shared prompt prefixes.
    #[arg(
        long,
        alias = "no-prefix-caching",
        overrides_with = "enable_prefix_caching"
    )]
    pub no_enable_prefix_caching: bool,
    /// `fcfs`: first come, first served; `priority`: requests' `priority` field orders the
    /// queue (lower first, ties by arrival) and the lowest is preempted first (vLLM's).
    #[arg(long, default_value = "fcfs", value_parser = ["fcfs", "priority"])]
    pub scheduling_policy: String,
}

fn gib_to_bytes(name: &str, gib: f64) -> Result<u64> {
    if !gib.is_finite() || gib < 0.0 {
        anyhow::bail!("--{name} must be a non-negative number of GiB, got {gib}");
    }
    let bytes = gib * GIB;
    if bytes >= u64::MAX as f64 {
        anyhow::bail!("--{name} of {gib} GiB is past any machine's memory");
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "finite, non-negative, in range"
    )]
    Ok(bytes as u64)
}

impl EngineArgs {
    pub fn scheduler(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self
                .max_num_batched_tokens
                .unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS),
            preemption_mode: match self.preemption_mode {
                Preemption::Recompute => PreemptionMode::Recompute,
                Preemption::Swap => PreemptionMode::Swap,
            },
        }
    }

    /// The flags as the engine builder's options (`EngineOptions::build` sizes the pool and
    /// builds the engine).
    pub fn options(&self) -> Result<EngineOptions> {
        if self.block_size == 0 {
            anyhow::bail!("--block-size must be at least 1");
        }
        let kv_cache_bytes = match self.kv_cache_memory_bytes {
            Some(b) => b as u64,
            None => gib_to_bytes("kv-cache-memory", self.kv_cache_memory)?,
        };
        Ok(EngineOptions {
            block_size: self.block_size,
            num_kv_blocks: self.num_kv_blocks,
            kv_cache_bytes,
            kv_cache_bytes_exact: self.kv_cache_memory_bytes.is_some(),
            gpu_memory_utilization: self.gpu_memory_utilization,
            swap_bytes: gib_to_bytes("swap-space", self.swap_space)?,
            scheduler: self.scheduler(),
            prefix_caching: !self.no_enable_prefix_caching,
        })
    }
}
