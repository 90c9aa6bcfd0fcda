//! The engine: `add_request` / `abort_request` / `step()` over the scheduler and an executor,
//! plus the offline `generate` that runs the loop to completion.

mod executor;
mod request;
pub mod sizing;
pub mod testing;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use executor::{Executor, LlamaExecutor};
use request::Request;
pub use request::{CompletedRequest, Prompt, RequestMetrics, RequestOutput};
use serde::Serialize;

use crate::batch::{BatchInput, SequenceChunk};
use crate::block_manager::{BlockManager, SeqId};
use crate::error::{InferError, Result};
use crate::generate::{FinishReason, GenerationParams};
use crate::sampler::Sampler;
use crate::scheduler::{Scheduler, SchedulerConfig, SeqState};
use crate::tokenizer::{IncrementalDetokenizer, Tokenizer};

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
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_swapped: usize,
    /// Fraction of device KV blocks in use.
    pub kv_usage: f64,
    pub prefix_cache_hit_tokens: u64,
    pub preemptions: u64,
    /// Prompt tokens computed (recomputation included).
    pub prompt_tokens_computed: u64,
    pub output_tokens: u64,
    pub last_step_tokens: usize,
    /// Wall time of the last `step()`, and the executor's part of it (block moves and the
    /// forward); the rest is the engine's own overhead.
    pub last_step_time: Duration,
    pub last_execute_time: Duration,
}

pub struct Engine<E: Executor> {
    executor: E,
    tokenizer: Option<Arc<Tokenizer>>,
    config: EngineConfig,
    scheduler: Scheduler,
    requests: HashMap<SeqId, Request>,
    ids: HashMap<String, SeqId>,
    next_seq: SeqId,
    stats: EngineStats,
    /// Logits rows of the last step, reused.
    logits: Vec<f32>,
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
        );
        Ok(Engine {
            executor,
            tokenizer,
            scheduler: Scheduler::new(config.scheduler, blocks)?,
            config,
            requests: HashMap::new(),
            ids: HashMap::new(),
            next_seq: 0,
            stats: EngineStats::default(),
            logits: Vec::new(),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
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

    /// Queues a request. Fails, with nothing queued, on a known id, an empty prompt, a prompt
    /// that leaves no room in the context, bad parameters, or a request the KV pool could
    /// never hold.
    pub fn add_request(
        &mut self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: GenerationParams,
    ) -> Result<()> {
        let id = id.into();
        if self.ids.contains_key(&id) {
            return Err(InferError::invalid(
                "request_id",
                format!("`{id}` is already in use"),
            ));
        }
        let tokens = match prompt.into() {
            Prompt::Tokens(t) => t,
            Prompt::Text(text) => match &self.tokenizer {
                Some(tok) => tok.encode(&text, true)?,
                None => return Err(InferError::invalid("prompt", "text needs a tokenizer")),
            },
        };
        if tokens.is_empty() {
            return Err(InferError::EmptyPrompt);
        }
        let max_model_len = self.config.max_model_len;
        if tokens.len() >= max_model_len {
            return Err(InferError::PromptTooLong {
                prompt_tokens: tokens.len(),
                max_model_len,
            });
        }
        if params.max_tokens == 0 {
            return Err(InferError::invalid("max_tokens", "must be at least 1"));
        }
        let max_len = (tokens.len() + params.max_tokens).min(max_model_len);
        let needed = max_len.div_ceil(self.config.block_size);
        if needed > self.config.num_device_blocks {
            return Err(InferError::KvCache(format!(
                "the request may grow to {max_len} tokens ({needed} blocks) but the KV pool holds {} blocks; lower max_tokens or enlarge the pool",
                self.config.num_device_blocks
            )));
        }
        let sampler = Sampler::new(params.temperature, params.seed)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.scheduler.add(
            seq,
            SeqState {
                arrival: seq,
                tokens: tokens.clone(),
                num_computed: 0,
            },
        )?;
        let detokenizer = self
            .tokenizer
            .as_ref()
            .map(|_| IncrementalDetokenizer::new(&tokens, true));
        self.requests.insert(
            seq,
            Request {
                id: id.clone(),
                params,
                sampler,
                detokenizer,
                prompt_len: tokens.len(),
                max_len,
                metrics: RequestMetrics {
                    arrival: Instant::now(),
                    first_scheduled: None,
                    first_token: None,
                    finished: None,
                    num_prompt_tokens: tokens.len(),
                    num_output_tokens: 0,
                    num_preemptions: 0,
                },
            },
        );
        self.ids.insert(id, seq);
        Ok(())
    }

    /// Drops a request wherever it is and frees its blocks. False if the id is unknown.
    pub fn abort_request(&mut self, id: &str) -> bool {
        let Some(seq) = self.ids.remove(id) else {
            return false;
        };
        self.scheduler.remove(seq);
        self.requests.remove(&seq);
        true
    }

    /// Schedules and runs one step; returns an output for every request that sampled a token.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>> {
        let started = Instant::now();
        let plan = self.scheduler.schedule()?;
        if plan.chunks.is_empty() && plan.preempted.is_empty() && self.scheduler.has_unfinished() {
            // add_request refuses what the pool could never hold, so this is a bug.
            return Err(InferError::KvCache(format!(
                "no progress possible: {} waiting, {} swapped, {} KV blocks available",
                self.scheduler.num_waiting(),
                self.scheduler.num_swapped(),
                self.scheduler.block_manager().num_available_device()
            )));
        }
        let chunks: Vec<SequenceChunk> = plan
            .chunks
            .iter()
            .map(|c| {
                let tokens = self.scheduler.seq(c.seq).map_or(&[][..], |s| &s.tokens[..]);
                SequenceChunk {
                    tokens: &tokens[c.num_computed..c.num_computed + c.num_new],
                    num_computed: c.num_computed,
                    block_table: self.scheduler.block_table(c.seq),
                    want_logits: c.want_logits,
                }
            })
            .collect();
        let batch = if chunks.is_empty() {
            None
        } else {
            Some(BatchInput::build(&chunks, self.config.block_size)?)
        };
        let executing = Instant::now();
        let mut logits = std::mem::take(&mut self.logits);
        self.executor
            .execute(&plan.cache_ops, batch.as_ref(), &mut logits)?;
        self.stats.last_execute_time = executing.elapsed();

        self.stats.steps += 1;
        self.stats.preemptions += plan.preempted.len() as u64;
        self.stats.prefix_cache_hit_tokens += plan.prefix_hit_tokens as u64;
        self.stats.last_step_tokens = plan.num_batched_tokens;
        for seq in &plan.preempted {
            if let Some(r) = self.requests.get_mut(seq) {
                r.metrics.num_preemptions += 1;
            }
        }
        let vocab = self.executor.vocab_size();
        let mut outputs = Vec::new();
        let mut row = 0;
        for c in &plan.chunks {
            let Some(req) = self.requests.get_mut(&c.seq) else {
                continue;
            };
            req.metrics.first_scheduled.get_or_insert(started);
            let decoding = c.num_computed >= req.prompt_len;
            if !decoding {
                self.stats.prompt_tokens_computed += c.num_new as u64;
            }
            if !c.want_logits {
                continue;
            }
            let Some(logits) = logits.get(row * vocab..(row + 1) * vocab) else {
                return Err(InferError::Backend {
                    backend: "executor",
                    message: format!("{} logits for row {row} of vocab {vocab}", logits.len()),
                });
            };
            row += 1;
            let token = req.sampler.sample(logits);
            self.scheduler.append_token(c.seq, token);
            self.stats.output_tokens += 1;
            let now = Instant::now();
            let m = &mut req.metrics;
            m.first_token.get_or_insert(now);
            m.num_output_tokens += 1;
            let len = req.prompt_len + m.num_output_tokens;
            let finish_reason = if req.params.stop_token_ids.contains(&token) {
                Some(FinishReason::Stop)
            } else if len >= req.max_len {
                Some(FinishReason::Length)
            } else {
                None
            };
            let text_delta = match (&mut req.detokenizer, &self.tokenizer) {
                (Some(d), Some(t)) if finish_reason != Some(FinishReason::Stop) => {
                    d.push(t, token)?
                }
                _ => String::new(),
            };
            if finish_reason.is_some() {
                m.finished = Some(now);
            }
            outputs.push(RequestOutput {
                request_id: req.id.clone(),
                new_token_ids: vec![token],
                text_delta,
                finish_reason,
                metrics: *m,
            });
            if finish_reason.is_some() {
                self.scheduler.remove(c.seq);
                if let Some(r) = self.requests.remove(&c.seq) {
                    self.ids.remove(&r.id);
                }
            }
        }
        self.stats.num_running = self.scheduler.num_running();
        self.stats.num_waiting = self.scheduler.num_waiting();
        self.stats.num_swapped = self.scheduler.num_swapped();
        self.stats.kv_usage = self.scheduler.block_manager().device_usage();
        self.logits = logits;
        self.stats.last_step_time = started.elapsed();
        Ok(outputs)
    }

    /// Runs every prompt to completion and returns the results in input order. `on_finish`
    /// is called as each request completes (progress bars).
    pub fn generate(
        &mut self,
        prompts: Vec<Prompt>,
        params: &[GenerationParams],
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
        let mut generated: Vec<Vec<u32>> = vec![Vec::new(); slots.len()];
        while slots.iter().any(Option::is_none) {
            for out in self.step()? {
                let Some(&i) = index.get(&out.request_id) else {
                    continue;
                };
                generated[i].extend(&out.new_token_ids);
                if let Some(reason) = out.finish_reason {
                    let token_ids = std::mem::take(&mut generated[i]);
                    let text = match &self.tokenizer {
                        Some(t) => t.decode(&token_ids, true)?,
                        None => String::new(),
                    };
                    let done = CompletedRequest {
                        request_id: out.request_id,
                        prompt_token_ids: std::mem::take(&mut prompt_ids[i]),
                        token_ids,
                        text,
                        finish_reason: reason,
                        metrics: out.metrics,
                    };
                    on_finish(&done);
                    slots[i] = Some(done);
                }
            }
        }
        Ok(slots.into_iter().flatten().collect())
    }
}
