//! Building an engine for a loaded model: the KV pool sized for it (an exact block count, a
//! byte budget, or a share of the device memory after a profiled worst-case step), the same
//! pool on every tensor-parallel rank, the executor over it, and speculative decoding. The
//! CLI, the server and the tests all build their engines here; only the flags that fill
//! `EngineOptions` differ.

use std::sync::Arc;

use super::sizing::{plan_kv_pool, profile_step, KvBudget, PoolRequest};
use super::{Engine, EngineConfig, Executor, ModelExecutor};
use crate::backend::Backend;
use crate::error::{InferError, Result};
use crate::model::Model;
use crate::parallel::{ProcessGroup, TpExecutor};
use crate::scheduler::SchedulerConfig;
use crate::spec_decode::{
    DraftProposer, NgramProposer, Proposer, SpecMethod, SpeculativeConfig, Speculator,
};
use crate::tokenizer::Tokenizer;

/// The engine's settings, whatever front end set them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// An exact KV pool size in blocks (overrides the memory-based sizing).
    pub num_kv_blocks: Option<usize>,
    /// The KV pool's byte budget where the backend cannot report its memory (CPU).
    pub kv_cache_bytes: u64,
    /// Whether `kv_cache_bytes` holds on every backend (vLLM's `--kv-cache-memory-bytes`),
    /// instead of the share of device memory where the backend reports it.
    pub kv_cache_bytes_exact: bool,
    /// Where it can: the share of the device memory left after the weights and a profiled
    /// worst-case step that the pool takes.
    pub gpu_memory_utilization: f64,
    /// Host memory for swapped-out blocks.
    pub swap_bytes: u64,
    pub scheduler: SchedulerConfig,
    pub prefix_caching: bool,
}

/// Speculative decoding as asked for, with its draft model when it names one (loaded before
/// the target's pool is sized, which makes room for the draft's).
pub struct Speculation<B: Backend> {
    pub config: SpeculativeConfig,
    pub draft: Option<Arc<Model<B>>>,
}

impl EngineOptions {
    /// Sizes the KV pool for `model` on `backend` and builds the engine; with a
    /// tensor-parallel group, rank 0's executor sends every step to the other ranks.
    /// `max_model_len_is_explicit`: a context the user asked for is refused rather than
    /// lowered when the pool cannot hold it.
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
    /// hold: every rank keeps the same blocks) and the executor over it. A draft model's
    /// blocks (`draft_bytes_per_block`) are counted in.
    pub fn executor<B: Backend + 'static>(
        &self,
        backend: B,
        model: Arc<Model<B>>,
        max_model_len_is_explicit: bool,
        group: Option<&dyn ProcessGroup>,
        draft_bytes_per_block: usize,
    ) -> Result<(ModelExecutor<B>, EngineConfig)> {
        if self.block_size == 0 {
            return Err(InferError::invalid("block_size", "must be at least 1"));
        }
        self.scheduler.validate()?;
        let budget = match (self.num_kv_blocks, backend.device_memory()) {
            (Some(n), _) => KvBudget::Blocks(n),
            (None, _) if self.kv_cache_bytes_exact => KvBudget::Bytes(self.kv_cache_bytes),
            (None, Some(_)) => KvBudget::DeviceFraction(self.gpu_memory_utilization),
            (None, None) => KvBudget::Bytes(self.kv_cache_bytes),
        };
        let profiled = match budget {
            KvBudget::DeviceFraction(_) => {
                profile_step(&backend, &model, &self.scheduler, self.block_size)?
            }
            _ => None,
        };
        let bytes_per_block = model
            .kv_cache_spec(1, self.block_size)
            .bytes_per_block(backend.kv_element_bytes())
            + draft_bytes_per_block;
        let mut request = PoolRequest {
            budget,
            swap_bytes: self.swap_bytes,
            bytes_per_block,
            block_size: self.block_size,
            max_model_len: model.max_model_len(),
            max_model_len_is_explicit,
        };
        let mut plan = plan_kv_pool(&request, profiled);
        if let Some(group) = group {
            // Every rank takes part even when its own plan failed, so none waits for it.
            let mine = plan.as_ref().map_or(0, |p| p.num_device_blocks) as u64;
            let blocks = usize::try_from(group.all_reduce_min(mine)?).unwrap_or(usize::MAX);
            if blocks == 0 {
                plan?;
                return Err(InferError::Distributed(
                    "another rank could not size its KV pool (see its error)".into(),
                ));
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
            enable_prefix_caching: self.prefix_caching,
            scheduler: self.scheduler,
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

impl<B: Backend + 'static> Speculation<B> {
    /// The proposer: the n-gram lookup, or the draft model over its own KV pool of the
    /// target's block count (`config`'s).
    pub fn speculator(self, backend: B, config: &EngineConfig) -> Result<Speculator> {
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
                return Err(InferError::invalid(
                    "speculative_config",
                    format!("draft model {model} was not loaded"),
                ))
            }
        };
        Speculator::new(proposer, &self.config)
    }
}
