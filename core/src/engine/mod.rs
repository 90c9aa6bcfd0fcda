//! The engine: `add_request` / `abort_request` / `step()` over the scheduler and an executor,
//! plus the offline `generate` that runs the loop to completion.

mod admission;
mod builder;
mod embed;
mod executor;
mod finish;
#[cfg(test)]
mod group_tests;
mod job;
mod pacing;
mod process;
mod request;
mod sequences;
pub mod sizing;
#[cfg(test)]
mod spec_tests;
mod speculate;
mod step_outputs;
pub mod testing;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use crate::backend::{PendingLogits, StepLogits};
pub use builder::{EngineOptions, Speculation};
pub use executor::{Executor, ModelExecutor};
pub use finish::FinishReason;
use request::Request;
pub use request::{
    CompletedRequest, CompletionOutput, Prompt, RequestMetrics, RequestOutput, SequenceDelta,
    StopReason, TokenLogprobs, TopLogprob,
};
use serde::Serialize;

use crate::batch::{BatchInput, SequenceChunk};
use crate::block_manager::{BlockManager, SeqId};
use crate::error::{InferError, Result};
use crate::sampling::{GrammarCompiler, SamplingParams};
use crate::scheduler::{ScheduledChunk, Scheduler, SchedulerConfig};
use crate::spec_decode::{SpecDecodeStats, Speculator};
use crate::tokenizer::Tokenizer;
use web_time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    pub block_size: usize,
    pub num_device_blocks: usize,
    pub num_host_blocks: usize,
    pub max_model_len: usize,
    pub enable_prefix_caching: bool,
    pub scheduler: SchedulerConfig,
}

/// Counters since start-up plus the queue sizes after the last step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EngineStats {
    pub steps: u64,
    /// Steps whose sampled ids came from an argmax computed by the executor.
    pub argmax_steps: u64,
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_swapped: usize,
    /// Fraction of device KV blocks in use.
    pub kv_usage: f64,
    pub prefix_cache_hit_tokens: u64,
    /// Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`).
    pub prefix_cache_query_tokens: u64,
    pub preemptions: u64,
    /// KV blocks freed because every layer's sliding window had left them.
    pub window_released_blocks: u64,
    /// Prompt tokens computed (recomputation included).
    pub prompt_tokens_computed: u64,
    pub output_tokens: u64,
    pub last_step_tokens: usize,
    /// Wall time of the last `step()`, and the executor's part of it (block moves and the
    /// forward); the rest is the engine's own overhead.
    pub last_step_time: Duration,
    pub last_execute_time: Duration,
    /// Time the last step spent sampling (penalties, draws, logprobs).
    pub last_sample_time: Duration,
    /// Time the last step spent computing structured-output masks (all constrained
    /// sequences in parallel, before the draws).
    pub last_mask_time: Duration,
    /// Block-table entries of the live sequences and the distinct device blocks behind them
    /// after the last step: the difference is what sharing (parallel samples, beams, prefixes)
    /// saves.
    pub kv_blocks_logical: usize,
    pub kv_blocks_physical: usize,
    /// The same two, summed over steps (averages over a run).
    pub sum_blocks_logical: u64,
    pub sum_blocks_physical: u64,
    /// Speculative decoding's counters (zero without a speculator).
    pub spec: SpecDecodeStats,
}

pub struct Engine<E: Executor> {
    executor: E,
    tokenizer: Option<Arc<Tokenizer>>,
    config: EngineConfig,
    scheduler: Scheduler,
    /// Each request's state beside its sequences', keyed by the request's arrival (its first
    /// sequence id), which the scheduler's record of every sequence carries
    /// (`SeqState::arrival`, shared by forks): a live sequence's request is
    /// `requests[scheduler.seq(seq).arrival]` (`request_of`), with no map of its own to keep.
    requests: HashMap<u64, Request>,
    ids: HashMap<String, u64>,
    next_seq: SeqId,
    eos_token_ids: Vec<u32>,
    stats: EngineStats,
    /// Built at the first request with structured outputs (the token trie costs tens of ms).
    grammars: Option<Arc<GrammarCompiler>>,
    /// Speculative decoding's proposer and settings, when on.
    speculator: Option<Speculator>,
    /// This step's proposal distributions of sampled proposals (see `spec_decode::Proposal`).
    spec_probs: HashMap<SeqId, Vec<f32>>,
    /// Sizes each step's token budget to a target time (`None`: the fixed maximum).
    pacer: Option<pacing::StepPacer>,
    /// Draws the seeds of requests that bring none (`set_seed`); `None`: the OS's entropy.
    seeds: Option<rand::rngs::StdRng>,
    /// Most top logprobs a request may ask for per token (`set_max_logprobs`).
    max_logprobs: usize,
    /// Whether requests may carry a priority (`set_priority_scheduling`).
    priority_scheduling: bool,
    /// JSON Schema's reading of objects in structured outputs (`set_strict_json_schema`).
    strict_json_schema: bool,
}

/// A step between its submission and its read-back.
struct StepInFlight {
    chunks: Vec<ScheduledChunk>,
    started: Instant,
    executing: Instant,
}

impl<E: Executor> Engine<E> {
    /// `tokenizer` turns text prompts into ids and ids into text deltas; without one, prompts
    /// must be token ids and outputs carry no text.
    pub fn new(
        executor: E,
        tokenizer: Option<Arc<Tokenizer>>,
        config: EngineConfig,
    ) -> Result<Self> {
        if config.block_size == 0 || config.num_device_blocks == 0 || config.max_model_len == 0 {
            return Err(InferError::invalid(
                "engine",
                "block_size, num_device_blocks and max_model_len must be > 0",
            ));
        }
        let blocks = BlockManager::new(
            config.block_size,
            config.num_device_blocks,
            config.num_host_blocks,
            config.enable_prefix_caching,
        )
        .with_sliding_window(executor.sliding_window());
        let eos_token_ids = tokenizer
            .as_ref()
            .map(|t| t.eos_token_ids().to_vec())
            .unwrap_or_default();
        Ok(Engine {
            eos_token_ids,
            executor,
            tokenizer,
            scheduler: Scheduler::new(config.scheduler, blocks)?,
            config,
            requests: HashMap::new(),
            ids: HashMap::new(),
            next_seq: 0,
            stats: EngineStats::default(),
            grammars: None,
            speculator: None,
            spec_probs: HashMap::new(),
            pacer: None,
            seeds: None,
            max_logprobs: crate::sampling::MAX_LOGPROBS,
            priority_scheduling: false,
            strict_json_schema: false,
        })
    }

    /// Token ids that end generation unless a request sets `ignore_eos` (the tokenizer's
    /// by default).
    pub fn set_eos_token_ids(&mut self, ids: Vec<u32>) {
        self.eos_token_ids = ids;
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Counters, with the queue sizes and KV usage as they are now (an abort between steps
    /// shows at once).
    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats;
        self.fill_live_stats(&mut s);
        s
    }

    /// Queue sizes and KV usage as they are now.
    fn fill_live_stats(&self, s: &mut EngineStats) {
        s.num_running = self.scheduler.num_running();
        s.num_waiting = self.scheduler.num_waiting();
        s.num_swapped = self.scheduler.num_swapped();
        let bm = self.scheduler.block_manager();
        s.kv_usage = bm.device_usage();
        s.kv_blocks_logical = bm.num_logical_device_blocks();
        s.kv_blocks_physical = bm.num_referenced_device_blocks();
    }

    pub fn executor(&self) -> &E {
        &self.executor
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    pub fn num_unfinished(&self) -> usize {
        self.requests.len()
    }

    /// Drops a request wherever it is and frees its blocks. False if the id is unknown.
    pub fn abort_request(&mut self, id: &str) -> bool {
        let Some(key) = self.ids.remove(id) else {
            return false;
        };
        if let Some(req) = self.requests.remove(&key) {
            for seq in req.members.iter().filter_map(|m| m.seq) {
                self.scheduler.remove(seq);
            }
        }
        true
    }

    /// Schedules and runs one step; returns an output for every request that sampled a token.
    /// Blocks on the device (native); the browser uses `step_async`, the same step with an
    /// awaited read-back.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>> {
        let started = Instant::now();
        self.propose()?;
        let (step, read) = self.submit_step(started)?;
        let executor = &self.executor;
        let logits = read.wait(|| executor.wait());
        self.finish_step(step, logits)
    }

    /// `step` for event-loop hosts (wasm + WebGPU): awaits the step's read-back instead of
    /// blocking, so the device can complete it.
    pub async fn step_async(&mut self) -> Result<Vec<RequestOutput>> {
        let started = Instant::now();
        self.propose_async().await?;
        let (step, read) = self.submit_step(started)?;
        let logits = read.resolve().await;
        self.finish_step(step, logits)
    }

    /// Schedules, builds the batch and submits it to the executor (after `propose`; the
    /// step's time counts from `started`, before the proposals).
    fn submit_step(&mut self, started: Instant) -> Result<(StepInFlight, PendingLogits)> {
        if let Some(p) = &self.pacer {
            let cap = self.config.scheduler.max_num_batched_tokens;
            let tokens = p.budget(self.scheduler.num_decoding(), cap);
            self.scheduler.set_step_tokens(Some(tokens));
        }
        let plan = self.scheduler.schedule()?;
        if plan.chunks.is_empty()
            && plan.preempted.is_empty()
            && plan.admitted == 0
            && self.scheduler.has_unfinished()
        {
            // add_request refuses what the pool could never hold, so this is a bug.
            return Err(InferError::KvCache(format!(
                "no progress possible: {} waiting, {} swapped, {} KV blocks available",
                self.scheduler.num_waiting(),
                self.scheduler.num_swapped(),
                self.scheduler.block_manager().num_available_device()
            )));
        }
        // A speculating chunk is its last known token followed by the proposals (an empty,
        // unallocated vector for every other chunk).
        let with_proposals: Vec<Vec<u32>> = plan
            .chunks
            .iter()
            .map(|c| match self.scheduler.seq(c.seq) {
                Some(s) if c.num_spec > 0 => [&s.tokens[c.num_computed..], &s.spec[..]].concat(),
                _ => Vec::new(),
            })
            .collect();
        let chunks: Vec<SequenceChunk> = plan
            .chunks
            .iter()
            .zip(&with_proposals)
            .map(|(c, proposed)| {
                let tokens = match c.num_spec {
                    0 => {
                        let all = self.scheduler.seq(c.seq).map_or(&[][..], |s| &s.tokens[..]);
                        &all[c.num_computed..c.num_computed + c.num_new]
                    }
                    _ => &proposed[..],
                };
                SequenceChunk {
                    tokens,
                    num_computed: c.num_computed,
                    block_table: self.scheduler.block_table(c.seq),
                    want_logits: c.want_logits,
                    all_logits: c.all_logits || c.num_spec > 0,
                }
            })
            .collect();
        let batch = if chunks.is_empty() {
            None
        } else {
            let mut b = BatchInput::build(&chunks, self.config.block_size)?;
            b.argmax_only = self.only_plain_greedy_rows(&plan.chunks);
            Some(b)
        };
        let executing = Instant::now();
        let read = self.executor.submit(&plan.cache_ops, batch.as_ref())?;
        self.stats.preemptions += plan.preempted.len() as u64;
        self.stats.window_released_blocks += plan.released_blocks as u64;
        self.stats.prefix_cache_hit_tokens += plan.prefix_hit_tokens as u64;
        self.stats.prefix_cache_query_tokens += plan.prefix_query_tokens as u64;
        for &(seq, cached) in &plan.prefix_hits {
            if let Some(r) = request_of(&self.scheduler, &mut self.requests, seq) {
                // The first admission counts (a recomputation after preemption may find more).
                r.metrics.num_cached_tokens.get_or_insert(cached);
            }
        }
        self.stats.last_step_tokens = plan.num_batched_tokens;
        for seq in &plan.preempted {
            if let Some(r) = request_of(&self.scheduler, &mut self.requests, *seq) {
                r.metrics.num_preemptions += 1;
            }
        }
        let step = StepInFlight {
            chunks: plan.chunks,
            started,
            executing,
        };
        Ok((step, read))
    }

    /// Samples from the step's logits and updates the requests and counters.
    fn finish_step(
        &mut self,
        step: StepInFlight,
        logits: Result<StepLogits>,
    ) -> Result<Vec<RequestOutput>> {
        let mut logits = logits?;
        self.stats.last_execute_time = step.executing.elapsed();
        self.stats.steps += 1;
        self.stats.argmax_steps += u64::from(logits.argmax.is_some());
        let outputs = self.process(&step.chunks, &mut logits, step.started)?;
        let mut stats = self.stats;
        self.fill_live_stats(&mut stats);
        self.stats = stats;
        self.stats.sum_blocks_logical += self.stats.kv_blocks_logical as u64;
        self.stats.sum_blocks_physical += self.stats.kv_blocks_physical as u64;
        self.stats.last_step_time = step.started.elapsed();
        if let Some(p) = &mut self.pacer {
            let tokens = step.chunks.iter().map(|c| c.num_new + c.num_spec).sum();
            p.record(tokens, self.stats.last_step_time);
        }
        Ok(outputs)
    }

    /// Paces steps to `target` (`None`: every step may take `max_num_batched_tokens`): the
    /// token budget follows the measured cost of a token, so no step (no gap between a running
    /// stream's tokens) runs much past the target while long prompts are admitted. For
    /// servers; offline batches want the largest steps.
    pub fn set_step_target(&mut self, target: Option<std::time::Duration>) {
        self.pacer = target.map(pacing::StepPacer::new);
        if target.is_none() {
            self.scheduler.set_step_tokens(None);
        }
    }

    /// vLLM's `--seed`: requests without a seed get one drawn from a generator seeded with
    /// `seed`, so the same requests in the same order give the same outputs on every run.
    pub fn set_seed(&mut self, seed: Option<u64>) {
        use rand::SeedableRng;
        self.seeds = seed.map(rand::rngs::StdRng::seed_from_u64);
    }

    /// vLLM's `--max-logprobs`: the most top logprobs a request may ask for per token
    /// (default 20, OpenAI's limit).
    pub fn set_max_logprobs(&mut self, max: usize) {
        self.max_logprobs = max;
    }

    /// vLLM's `--scheduling-policy priority`: requests with a lower `priority` are admitted
    /// first and preempted last (ties by arrival). Off (first come, first served), a request
    /// with a priority other than 0 is refused, as vLLM does.
    pub fn set_priority_scheduling(&mut self, on: bool) {
        self.priority_scheduling = on;
    }

    /// Structured outputs read JSON schemas as JSON Schema does (an object allows properties
    /// it does not list unless `additionalProperties: false`) instead of as vLLM does by
    /// default (it allows none: `sampling::close_objects`).
    pub fn set_strict_json_schema(&mut self, strict: bool) {
        if strict != self.strict_json_schema {
            self.strict_json_schema = strict;
            self.grammars = None;
        }
    }

    /// Runs every prompt to completion and returns the results in input order. `on_finish`
    /// is called as each request completes (progress bars).
    pub fn generate(
        &mut self,
        prompts: Vec<Prompt>,
        params: &[SamplingParams],
        on_finish: &mut dyn FnMut(&CompletedRequest),
    ) -> Result<Vec<CompletedRequest>> {
        if params.len() != prompts.len() && params.len() != 1 {
            return Err(InferError::invalid(
                "params",
                format!(
                    "{} sets for {} prompts (give one or one each)",
                    params.len(),
                    prompts.len()
                ),
            ));
        }
        let base = self.next_seq;
        let mut slots: Vec<Option<CompletedRequest>> = vec![None; prompts.len()];
        let mut index = HashMap::new();
        let mut prompt_ids = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.into_iter().enumerate() {
            let id = format!("offline-{}", base + i as u64);
            self.add_request(id.clone(), prompt, params[i.min(params.len() - 1)].clone())?;
            let seq = self.ids[&id];
            prompt_ids.push(
                self.scheduler
                    .seq(seq)
                    .map(|s| s.tokens.clone())
                    .unwrap_or_default(),
            );
            index.insert(id, i);
        }
        while slots.iter().any(Option::is_none) {
            for out in self.step()? {
                let (Some(&i), Some(outputs)) = (index.get(&out.request_id), out.outputs) else {
                    continue;
                };
                let done = CompletedRequest {
                    request_id: out.request_id,
                    prompt_token_ids: std::mem::take(&mut prompt_ids[i]),
                    outputs,
                    prompt_logprobs: out.prompt_logprobs,
                    metrics: out.metrics,
                };
                on_finish(&done);
                slots[i] = Some(done);
            }
        }
        Ok(slots.into_iter().flatten().collect())
    }
}

/// The request a live sequence belongs to: the scheduler's record of the sequence names it
/// (its arrival is the request's key). `None` once the sequence has ended.
fn request_of<'a>(
    scheduler: &Scheduler,
    requests: &'a mut HashMap<u64, Request>,
    seq: SeqId,
) -> Option<&'a mut Request> {
    requests.get_mut(&scheduler.seq(seq)?.arrival)
}
