//! Continuous batching, first come first served, over waiting / running / swapped queues.
//!
//! Every step fills a token budget and a sequence cap: first the running sequences (a decode
//! token each, or the next chunk of a prompt: chunked prefill), then swapped sequences coming
//! back, then new prompts. When blocks run out, the latest-arrived running sequence is
//! preempted, by recompute (blocks freed, back to waiting) or swap (blocks copied to host
//! memory). While anything is swapped out, or after a preemption, no new prompt is admitted.
//!
//! Sequences with the same arrival form a group (a request's parallel samples or beams): a
//! group is preempted, swapped and admitted as a whole, and its members sample in the same
//! step, so beam search sees every beam's logits at once.

mod schedule;
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
    /// Arrival order (smaller came first); sequences forked from one another share it.
    pub arrival: u64,
    /// Scheduling priority, lower first (vLLM's `priority`); ties go by arrival. Every queue
    /// is kept in (priority, arrival) order, so with priorities the lowest one is also the
    /// first preempted.
    pub priority: i64,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache (or scheduled into it this step).
    pub num_computed: usize,
    /// Sequences the group may grow to (n / best_of / beam width): counted against
    /// `max_num_seqs` when it is admitted.
    pub group_size: usize,
    /// Logits are wanted for every position before this one (prompt logprobs); such a
    /// sequence takes no prefix-cache hit, as cached tokens have no logits.
    pub all_logits_until: usize,
    /// Proposed next tokens (speculative decoding), verified in the next step after the
    /// known ones; empty unless the sequence is decoding.
    pub spec: Vec<u32>,
    /// Where its prompt's prefix-cache chain starts (`cache_salt_root` of its request's
    /// salt; `None`: the unsalted chain).
    pub cache_root: Option<crate::block_manager::BlockHash>,
}

impl SeqState {
    pub fn new(arrival: u64, tokens: Vec<u32>) -> Self {
        SeqState {
            arrival,
            priority: 0,
            tokens,
            num_computed: 0,
            group_size: 1,
            all_logits_until: 0,
            spec: Vec::new(),
            cache_root: None,
        }
    }
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
    /// Logits for every token of the chunk (prompt logprobs), not just the last.
    pub all_logits: bool,
    /// The last `num_spec` tokens of the chunk are proposals (`SeqState::spec`): the chunk
    /// wants logits for them and for the known token before them.
    pub num_spec: usize,
}

/// Block moves the backend performs before the step's forward, in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// Prompt tokens looked up in the prefix cache this step (hit rate = hits / queries).
    pub prefix_query_tokens: usize,
    /// Each admitted sequence that looked up the prefix cache, with the tokens it found.
    pub prefix_hits: Vec<(SeqId, usize)>,
    /// Sequences that entered the running queue this step (a recomputed one may enter with
    /// nothing to compute yet: its tokens were all cached or shared).
    pub admitted: usize,
    pub num_batched_tokens: usize,
    /// Blocks given back because every layer's sliding window had left them.
    pub released_blocks: usize,
}

pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    seqs: HashMap<SeqId, (SeqState, Queue)>,
    /// Each queue is kept in arrival order.
    waiting: VecDeque<SeqId>,
    running: VecDeque<SeqId>,
    swapped: VecDeque<SeqId>,
    /// Live sequences per arrival (a group's members), wherever they are queued.
    group_sizes: HashMap<u64, usize>,
    /// The next steps' token budget when the engine paces steps by time (at most
    /// `max_num_batched_tokens`); `None`: that maximum.
    step_tokens: Option<usize>,
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
            group_sizes: HashMap::new(),
            step_tokens: None,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Sets the token budget of the next steps (capped by `max_num_batched_tokens`; `None`:
    /// that cap). The engine lowers it so a step stays within its target time.
    pub fn set_step_tokens(&mut self, tokens: Option<usize>) {
        self.step_tokens = tokens;
    }

    /// Running sequences with one known token left to compute: each needs a token per step.
    pub fn num_decoding(&self) -> usize {
        self.running
            .iter()
            .filter(|id| Self::decoding(&self.seqs[id].0))
            .count()
    }

    fn decoding(s: &SeqState) -> bool {
        s.tokens.len() - s.num_computed <= 1
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// For blocks the scheduler does not track: an embedding's prompt borrows them for its
    /// prefill and returns them before any step of its own.
    pub(crate) fn block_manager_mut(&mut self) -> &mut BlockManager {
        &mut self.blocks
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
        *self.group_sizes.entry(state.arrival).or_default() += 1;
        self.seqs.insert(id, (state, Queue::Waiting));
        insert_by_arrival(&self.seqs, &mut self.waiting, id);
        Ok(())
    }

    /// Running sequences, earliest arrival first.
    pub fn running(&self) -> impl Iterator<Item = (SeqId, &SeqState)> + '_ {
        self.running.iter().map(|id| (*id, &self.seqs[id].0))
    }

    /// Sets a decoding sequence's proposals for the next step (ignored for one that is not
    /// running with exactly one token left to compute).
    pub fn set_proposals(&mut self, id: SeqId, spec: Vec<u32>) {
        if let Some((s, Queue::Running)) = self.seqs.get_mut(&id) {
            if s.num_computed + 1 == s.tokens.len() {
                s.spec = spec;
            }
        }
    }

    /// After a speculative step: the sequence's first `num_computed` tokens have valid K/V
    /// (the known ones and the accepted proposals); the proposals are dropped and the blocks
    /// past them released.
    pub fn finish_speculation(&mut self, id: SeqId, num_computed: usize) -> Result<()> {
        let Some((s, _)) = self.seqs.get_mut(&id) else {
            return Ok(());
        };
        s.spec.clear();
        if num_computed >= s.tokens.len() {
            return Err(InferError::KvCache(format!(
                "sequence {id}: {num_computed} verified of {} tokens",
                s.tokens.len()
            )));
        }
        s.num_computed = num_computed;
        self.blocks.truncate(id, &s.tokens, num_computed)
    }

    /// Appends a sampled token to a running sequence.
    pub fn append_token(&mut self, id: SeqId, token: u32) {
        if let Some((s, _)) = self.seqs.get_mut(&id) {
            s.tokens.push(token);
        }
    }

    /// A running sequence's copy (parallel sample, beam candidate): same tokens, same arrival,
    /// every block shared until one of them writes.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        let state = match self.seqs.get(&parent) {
            Some((s, Queue::Running)) if !self.seqs.contains_key(&child) => s.clone(),
            _ => {
                return Err(InferError::invalid(
                    "sequence",
                    format!("cannot fork {parent} into {child}: not running, or the child exists"),
                ))
            }
        };
        self.blocks.fork(parent, child)?;
        *self.group_sizes.entry(state.arrival).or_default() += 1;
        self.seqs.insert(child, (state, Queue::Running));
        insert_by_arrival(&self.seqs, &mut self.running, child);
        Ok(())
    }

    /// Drops a sequence from whichever queue holds it and frees its blocks (finish or abort).
    pub fn remove(&mut self, id: SeqId) -> Option<SeqState> {
        let (state, queue) = self.seqs.remove(&id)?;
        if let Some(n) = self.group_sizes.get_mut(&state.arrival) {
            *n -= 1;
            if *n == 0 {
                self.group_sizes.remove(&state.arrival);
            }
        }
        match queue {
            Queue::Waiting => self.waiting.retain(|&s| s != id),
            Queue::Running => self.running.retain(|&s| s != id),
            Queue::Swapped => self.swapped.retain(|&s| s != id),
        }
        self.blocks.free(id);
        Some(state)
    }

    /// Block-manager invariants, and that every sequence sits in exactly the queue it says.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.blocks.check_invariants()?;
        let mut groups: HashMap<u64, usize> = HashMap::new();
        for (s, _) in self.seqs.values() {
            *groups.entry(s.arrival).or_default() += 1;
        }
        if groups != self.group_sizes {
            return Err("group sizes out of step with the sequences".into());
        }
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

/// Inserts `id` after every queued sequence of a higher priority (a lower number) or of its
/// priority that arrived before it.
fn insert_by_arrival(
    seqs: &HashMap<SeqId, (SeqState, Queue)>,
    queue: &mut VecDeque<SeqId>,
    id: SeqId,
) {
    let key = |s: &SeqState| (s.priority, s.arrival);
    let new = key(&seqs[&id].0);
    let at = queue.partition_point(|s| key(&seqs[s].0) < new);
    queue.insert(at, id);
}
