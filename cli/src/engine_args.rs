//! Engine flags shared by `generate`, `bench` (and later `serve`), and building an engine
//! from them: scheduler limits, block size, and the KV pool sized at start-up.

use std::sync::Arc;

use anyhow::Result;
use clap::{Args, ValueEnum};
use infer_core::engine::sizing::{plan_kv_pool, profile_step, KvBudget, PoolRequest};
use infer_core::spec_decode::{
    DraftProposer, NgramProposer, Proposer, SpecMethod, SpeculativeConfig, Speculator,
};
use infer_core::{
    Backend, Engine, EngineConfig, Executor, Model, ModelExecutor, PreemptionMode, ProcessGroup,
    SchedulerConfig, Tokenizer, TpExecutor,
};

const GIB: f64 = (1u64 << 30) as f64;

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
    /// KV pool size in blocks (overrides the memory-based sizing).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// KV pool budget in GiB on the CPU backend.
    #[arg(long, default_value_t = 4.0)]
    pub kv_cache_memory: f64,
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
    /// Most tokens in one step (decode tokens plus prefill chunks).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    #[arg(long, value_enum, default_value = "recompute")]
    pub preemption_mode: Preemption,
    /// Do not reuse the KV blocks of shared prompt prefixes.
    #[arg(long)]
    pub no_prefix_caching: bool,
}

fn gib_to_bytes(name: &str, gib: f64) -> Result<u64> {
    if !gib.is_finite() || gib < 0.0 {
        anyhow::bail!("--{name} must be a non-negative number of GiB, got {gib}");
    }
    Ok((gib * GIB) as u64)
}

impl EngineArgs {
    pub fn scheduler(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            preemption_mode: match self.preemption_mode {
                Preemption::Recompute => PreemptionMode::Recompute,
                Preemption::Swap => PreemptionMode::Swap,
            },
        }
    }

    /// Sizes the KV pool for `model` on `backend` and builds the engine; with a
    /// tensor-parallel group, rank 0's executor sends every step to the other ranks.
    /// A draft model (speculative decoding) gets a KV pool of the same number of blocks
    /// beside the target's: the pool is sized for both.
    pub fn build<B: Backend + Clone + 'static>(
        &self,
        backend: B,
        model: Arc<Model<B>>,
        tokenizer: Option<Arc<Tokenizer>>,
        max_model_len_is_explicit: bool,
        group: Option<Arc<dyn ProcessGroup>>,
        speculation: Option<Speculation<B>>,
    ) -> Result<Engine<Box<dyn Executor>>> {
        let draft_bytes = match &speculation {
            Some(Speculation { draft: Some(d), .. }) => d
                .kv_cache_spec(1, self.block_size)
                .bytes_per_block(backend.kv_element_bytes()),
            _ => 0,
        };
        let (executor, config) = self.executor(
            backend.clone(),
            model,
            max_model_len_is_explicit,
            group.as_deref(),
            draft_bytes,
        )?;
        let executor: Box<dyn Executor> = match group {
            Some(group) => Box::new(TpExecutor::new(executor, group)),
            None => Box::new(executor),
        };
        let mut engine = Engine::new(executor, tokenizer, config)?;
        if let Some(s) = speculation {
            let speculator = s.speculator(backend, &config)?;
            tracing::info!(
                proposer = speculator.proposer.name(),
                k = speculator.num_speculative_tokens,
                disable_by_batch_size = speculator.disable_by_batch_size,
                "speculative decoding"
            );
            engine.set_speculator(Some(speculator));
        }
        Ok(engine)
    }

    /// The KV pool sized for `model` on `backend` (the smallest any rank of `group` can
    /// hold: every rank keeps the same blocks) and the executor over it.
    pub fn executor<B: Backend + 'static>(
        &self,
        backend: B,
        model: Arc<Model<B>>,
        max_model_len_is_explicit: bool,
        group: Option<&dyn ProcessGroup>,
        draft_bytes_per_block: usize,
    ) -> Result<(ModelExecutor<B>, EngineConfig)> {
        if self.block_size == 0 {
            anyhow::bail!("--block-size must be at least 1");
        }
        let scheduler = self.scheduler();
        scheduler.validate()?;
        let budget = match (self.num_kv_blocks, backend.device_memory()) {
            (Some(n), _) => KvBudget::Blocks(n),
            (None, Some(_)) => KvBudget::DeviceFraction(self.gpu_memory_utilization),
            (None, None) => KvBudget::Bytes(gib_to_bytes("kv-cache-memory", self.kv_cache_memory)?),
        };
        let profiled = match budget {
            KvBudget::DeviceFraction(_) => {
                profile_step(&backend, &model, &scheduler, self.block_size)?
            }
            _ => None,
        };
        let bytes_per_block = model
            .kv_cache_spec(1, self.block_size)
            .bytes_per_block(backend.kv_element_bytes())
            + draft_bytes_per_block;
        let mut request = PoolRequest {
            budget,
            swap_bytes: gib_to_bytes("swap-space", self.swap_space)?,
            bytes_per_block,
            block_size: self.block_size,
            max_model_len: model.max_model_len(),
            max_model_len_is_explicit,
        };
        let mut plan = plan_kv_pool(&request, profiled);
        if let Some(group) = group {
            // Every rank takes part even when its own plan failed, so none waits for it.
            let mine = plan.as_ref().map_or(0, |p| p.num_device_blocks) as u64;
            let blocks = group.all_reduce_min(mine)? as usize;
            if blocks == 0 {
                plan?;
                anyhow::bail!("another rank could not size its KV pool (see its error)");
            }
            if blocks as u64 != mine {
                request.budget = KvBudget::Blocks(blocks);
                plan = plan_kv_pool(&request, None);
            }
        }
        let plan = plan?;
        let config = EngineConfig {
            block_size: self.block_size,
            num_device_blocks: plan.num_device_blocks,
            num_host_blocks: plan.num_host_blocks,
            max_model_len: plan.max_model_len,
            enable_prefix_caching: !self.no_prefix_caching,
            scheduler,
        };
        let executor = ModelExecutor::new(
            backend,
            model,
            self.block_size,
            plan.num_device_blocks,
            plan.num_host_blocks,
        )?;
        Ok((executor, config))
    }
}

/// `--speculative-config` with its draft model, when it names one (loaded before the target's
/// KV pool is sized).
pub struct Speculation<B: Backend> {
    pub config: SpeculativeConfig,
    pub draft: Option<Arc<Model<B>>>,
}

impl<B: Backend + 'static> Speculation<B> {
    /// The proposer: the n-gram lookup, or the draft model over its own KV pool of the
    /// target's block count.
    fn speculator(self, backend: B, config: &EngineConfig) -> Result<Speculator> {
        let proposer: Box<dyn Proposer> = match (self.config.method()?, self.draft) {
            (SpecMethod::Ngram { min, max }, _) => Box::new(NgramProposer::new(min, max)),
            (SpecMethod::Draft { .. }, Some(draft)) => {
                let executor = ModelExecutor::new(
                    backend,
                    draft,
                    config.block_size,
                    config.num_device_blocks,
                    0,
                )?;
                Box::new(DraftProposer::new(
                    executor,
                    config.block_size,
                    config.num_device_blocks,
                ))
            }
            (SpecMethod::Draft { model }, None) => {
                anyhow::bail!("draft model {model} was not loaded")
            }
        };
        Ok(Speculator::new(proposer, &self.config)?)
    }
}
