//! Continuous batching, first come first served, over waiting / running / swapped queues.
//!
//! Every step fills a token budget and a sequence cap: first the running sequences (a decode
//! token each, or the next chunk of a prompt: chunked prefill), then swapped sequences coming
//! back, then new prompts. When blocks run out, the latest-arrived running sequence is
//! preempted, by recompute (blocks freed, back to waiting) or swap (blocks copied to host
//! memory). While anything is swapped out, or after a preemption, no new prompt is admitted.

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};

use crate::block_manager::{BlockCopy, BlockId, BlockManager, SeqId};
use crate::error::{InferError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptionMode {
    /// Free the victim's blocks; its prompt and output so far are computed again later.
    #[default]
    Recompute,
    /// Copy the victim's blocks to host memory and back (falls back to recompute when the
    /// swap space is full).
    Swap,
}

impl std::str::FromStr for PreemptionMode {
    type Err = InferError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "recompute" => Ok(PreemptionMode::Recompute),
            "swap" => Ok(PreemptionMode::Swap),
            _ => Err(InferError::invalid(
                "preemption_mode",
                format!("`{s}` (expected recompute or swap)"),
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub preemption_mode: PreemptionMode,
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<()> {
        if self.max_num_seqs == 0 {
            return Err(InferError::invalid("max_num_seqs", "must be > 0"));
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(InferError::invalid(
                "max_num_batched_tokens",
                format!(
                    "{} is below max_num_seqs {}: every running sequence needs a token per step",
                    self.max_num_batched_tokens, self.max_num_seqs
                ),
            ));
        }
        Ok(())
    }
}

/// A sequence as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct SeqState {
    /// Arrival order (smaller came first).
    pub arrival: u64,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache (or scheduled into it this step).
    pub num_computed: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Waiting,
    Running,
    Swapped,
}

/// One sequence's share of a step: `num_new` tokens after `num_computed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub seq: SeqId,
    pub num_computed: usize,
    pub num_new: usize,
    /// The chunk ends the known tokens: sample the next one from its logits.
    pub want_logits: bool,
}

/// Block moves the backend performs before the step's forward, in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheOps {
    /// `(device, host)`
    pub swap_out: Vec<BlockCopy>,
    /// `(host, device)`
    pub swap_in: Vec<BlockCopy>,
    /// `(device, device)` copy-on-write.
    pub copy: Vec<BlockCopy>,
}

impl CacheOps {
    pub fn is_empty(&self) -> bool {
        self.swap_out.is_empty() && self.swap_in.is_empty() && self.copy.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput {
    pub chunks: Vec<ScheduledChunk>,
    pub cache_ops: CacheOps,
    /// Sequences preempted this step.
    pub preempted: Vec<SeqId>,
    /// Prompt tokens found in the prefix cache among the prompts admitted this step.
    pub prefix_hit_tokens: usize,
    pub num_batched_tokens: usize,
}

pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    seqs: HashMap<SeqId, (SeqState, Queue)>,
    /// Each queue is kept in arrival order.
    waiting: VecDeque<SeqId>,
    running: VecDeque<SeqId>,
    swapped: VecDeque<SeqId>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, blocks: BlockManager) -> Result<Self> {
        config.validate()?;
        Ok(Scheduler {
            config,
            blocks,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: VecDeque::new(),
            swapped: VecDeque::new(),
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_swapped(&self) -> usize {
        self.swapped.len()
    }

    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    pub fn seq(&self, id: SeqId) -> Option<&SeqState> {
        self.seqs.get(&id).map(|(s, _)| s)
    }

    pub fn block_table(&self, id: SeqId) -> &[BlockId] {
        self.blocks.block_table(id).unwrap_or(&[])
    }

    /// Queues a new sequence; it must arrive later than every sequence added before.
    pub fn add(&mut self, id: SeqId, state: SeqState) -> Result<()> {
        if state.tokens.is_empty() || self.seqs.contains_key(&id) {
            return Err(InferError::invalid(
                "sequence",
                format!("{id} is empty or known"),
            ));
        }
        self.seqs.insert(id, (state, Queue::Waiting));
        insert_by_arrival(&self.seqs, &mut self.waiting, id);
        Ok(())
    }

    /// Appends a sampled token to a running sequence.
    pub fn append_token(&mut self, id: SeqId, token: u32) {
        if let Some((s, _)) = self.seqs.get_mut(&id) {
            s.tokens.push(token);
        }
    }

    /// Drops a sequence from whichever queue holds it and frees its blocks (finish or abort).
    pub fn remove(&mut self, id: SeqId) -> Option<SeqState> {
        let (state, queue) = self.seqs.remove(&id)?;
        match queue {
            Queue::Waiting => self.waiting.retain(|&s| s != id),
            Queue::Running => self.running.retain(|&s| s != id),
            Queue::Swapped => self.swapped.retain(|&s| s != id),
        }
        self.blocks.free(id);
        Some(state)
    }

    /// Plans the next step and advances each scheduled sequence's `num_computed`.
    pub fn schedule(&mut self) -> Result<SchedulerOutput> {
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;

        // 1. Running sequences, earliest first; the latest arrivals give way when blocks run out.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let s = &self.seqs[&id].0;
            let (num_computed, num_new) = (
                s.num_computed,
                (s.tokens.len() - s.num_computed).min(budget),
            );
            let copies = loop {
                let tokens = &self.seqs[&id].0.tokens;
                if let Some(copies) = self
                    .blocks
                    .append_slots(id, tokens, num_computed, num_new)?
                {
                    break Some(copies);
                }
                let Some(&victim) = self.running.back() else {
                    break None;
                };
                self.preempt(victim, &mut out)?;
                if victim == id {
                    break None;
                }
            };
            let Some(copies) = copies else { break };
            out.cache_ops.copy.extend(copies);
            self.push_chunk(id, num_new, &mut out);
            budget -= num_new;
            i += 1;
        }

        // 2. Swapped sequences come back before anything new is admitted.
        while out.preempted.is_empty()
            && budget > 0
            && self.running.len() < self.config.max_num_seqs
        {
            let Some(&id) = self.swapped.front() else {
                break;
            };
            let s = &self.seqs[&id].0;
            let num_new = (s.tokens.len() - s.num_computed).min(budget);
            let table_len = self.block_table(id).len();
            let growth = self
                .blocks
                .blocks_for(s.num_computed + num_new)
                .saturating_sub(table_len);
            if !self.blocks.can_swap_in(&[id], growth) {
                break;
            }
            out.cache_ops.swap_in.extend(self.blocks.swap_in(&[id])?);
            let s = &self.seqs[&id].0;
            let copies = self
                .blocks
                .append_slots(id, &s.tokens, s.num_computed, num_new)?
                .ok_or_else(|| {
                    InferError::KvCache(format!("sequence {id}: no room after swap-in"))
                })?;
            out.cache_ops.copy.extend(copies);
            self.swapped.pop_front();
            self.set_queue(id, Queue::Running);
            self.push_chunk(id, num_new, &mut out);
            budget -= num_new;
        }

        // 3. New prompts, first come first served: one that does not fit blocks the rest.
        while out.preempted.is_empty()
            && self.swapped.is_empty()
            && budget > 0
            && self.running.len() < self.config.max_num_seqs
        {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let tokens = &self.seqs[&id].0.tokens;
            let hit = self.blocks.find_cached_prefix(tokens);
            let hit_tokens = hit.num_blocks() * self.blocks.block_size();
            let num_new = (tokens.len() - hit_tokens).min(budget);
            // With nothing running, the watermark would only stall a prompt that fits.
            let keep_watermark = !self.running.is_empty();
            if !self
                .blocks
                .can_allocate(&hit, hit_tokens + num_new, keep_watermark)
            {
                break;
            }
            self.blocks
                .allocate(id, hit, tokens, hit_tokens + num_new)?;
            out.prefix_hit_tokens += hit_tokens;
            self.waiting.pop_front();
            if let Some((s, _)) = self.seqs.get_mut(&id) {
                s.num_computed = hit_tokens;
            }
            self.set_queue(id, Queue::Running);
            self.push_chunk(id, num_new, &mut out);
            budget -= num_new;
        }
        out.num_batched_tokens = self.config.max_num_batched_tokens - budget;
        Ok(out)
    }

    fn push_chunk(&mut self, id: SeqId, num_new: usize, out: &mut SchedulerOutput) {
        if let Some((s, _)) = self.seqs.get_mut(&id) {
            out.chunks.push(ScheduledChunk {
                seq: id,
                num_computed: s.num_computed,
                num_new,
                want_logits: s.num_computed + num_new == s.tokens.len(),
            });
            s.num_computed += num_new;
        }
    }

    fn set_queue(&mut self, id: SeqId, queue: Queue) {
        if let Some(entry) = self.seqs.get_mut(&id) {
            entry.1 = queue;
        }
        let q = match queue {
            Queue::Waiting => &mut self.waiting,
            Queue::Running => &mut self.running,
            Queue::Swapped => &mut self.swapped,
        };
        insert_by_arrival(&self.seqs, q, id);
    }

    /// Takes a running sequence off the device, by swap when asked and possible.
    fn preempt(&mut self, id: SeqId, out: &mut SchedulerOutput) -> Result<()> {
        self.running.retain(|&s| s != id);
        out.preempted.push(id);
        if self.config.preemption_mode == PreemptionMode::Swap && self.blocks.can_swap_out(&[id]) {
            out.cache_ops.swap_out.extend(self.blocks.swap_out(&[id])?);
            self.set_queue(id, Queue::Swapped);
        } else {
            self.blocks.free(id);
            if let Some((s, _)) = self.seqs.get_mut(&id) {
                s.num_computed = 0;
            }
            self.set_queue(id, Queue::Waiting);
        }
        Ok(())
    }

    /// Block-manager invariants, and that every sequence sits in exactly the queue it says.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.blocks.check_invariants()?;
        let counted = self.waiting.len() + self.running.len() + self.swapped.len();
        if counted != self.seqs.len() {
            return Err(format!(
                "{counted} queued but {} sequences",
                self.seqs.len()
            ));
        }
        let queues = [
            (&self.waiting, Queue::Waiting),
            (&self.running, Queue::Running),
            (&self.swapped, Queue::Swapped),
        ];
        for (ids, queue) in queues {
            for id in ids {
                let (s, q) = self
                    .seqs
                    .get(id)
                    .ok_or(format!("{id} queued but unknown"))?;
                let has_blocks = self.blocks.block_table(*id).is_some();
                if *q != queue
                    || has_blocks == (queue == Queue::Waiting)
                    || self.blocks.is_on_host(*id) != (queue == Queue::Swapped)
                {
                    return Err(format!(
                        "sequence {id} in {queue:?} but marked {q:?} (blocks {has_blocks})"
                    ));
                }
                if queue == Queue::Waiting && s.num_computed != 0 {
                    return Err(format!(
                        "waiting sequence {id} has {} computed",
                        s.num_computed
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Inserts `id` after every queued sequence that arrived before it.
fn insert_by_arrival(
    seqs: &HashMap<SeqId, (SeqState, Queue)>,
    queue: &mut VecDeque<SeqId>,
    id: SeqId,
) {
    let arrival = seqs[&id].0.arrival;
    let at = queue.partition_point(|s| seqs[s].0.arrival < arrival);
    queue.insert(at, id);
}
