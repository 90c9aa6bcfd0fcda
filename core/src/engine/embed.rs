//! Embedding (a pooling model's only work): prompts prefilled in chunks under the scheduler's
//! budgets, the final-normed hidden rows pooling needs read back per step, KV blocks borrowed
//! from the block manager and returned as each prompt finishes.

use super::{Engine, Executor};
use crate::batch::{BatchInput, SequenceChunk};
use crate::block_manager::{PrefixHit, SeqId};
use crate::error::{InferError, Result};
use crate::narrow::u32_index;
use crate::pooling::{EmbedParams, PooledRows, PoolingType};
use crate::scheduler::CacheOps;

/// A prompt being embedded.
struct Embedding {
    prompt: usize,
    seq: SeqId,
    done: usize,
    pooled: PooledRows,
}

impl<E: Executor> Engine<E> {
    /// The embedding of each prompt, in order. Runs to completion before returning; a
    /// pooling engine serves nothing else, and a generating one's running sequences keep
    /// their blocks (the prompts take only free ones). On an error every borrowed block is
    /// returned.
    pub fn embed(&mut self, prompts: &[Vec<u32>], params: &EmbedParams) -> Result<Vec<Vec<f32>>> {
        for p in prompts {
            if p.is_empty() {
                return Err(InferError::EmptyPrompt);
            }
            if p.len() > self.config.max_model_len {
                return Err(InferError::PromptTooLong {
                    prompt_tokens: p.len(),
                    max_model_len: self.config.max_model_len,
                });
            }
        }
        let pool = self.scheduler.block_manager().num_device_blocks();
        for p in prompts {
            let need = self.scheduler.block_manager().blocks_for(p.len());
            if need > pool {
                return Err(InferError::invalid(
                    "input",
                    format!(
                        "a prompt of {} tokens needs {need} KV blocks but the cache has {pool}",
                        p.len()
                    ),
                ));
            }
        }
        let mut active = Vec::new();
        let result = self.embed_all(prompts, params, &mut active);
        for e in &active {
            self.scheduler.block_manager_mut().free(e.seq);
        }
        result
    }

    fn embed_all(
        &mut self,
        prompts: &[Vec<u32>],
        params: &EmbedParams,
        active: &mut Vec<Embedding>,
    ) -> Result<Vec<Vec<f32>>> {
        let block_size = self.config.block_size;
        let budget = self.config.scheduler.max_num_batched_tokens.max(1);
        let max_seqs = self.config.scheduler.max_num_seqs.max(1);
        let mut out: Vec<Option<Vec<f32>>> = vec![None; prompts.len()];
        let mut next = 0;
        while next < prompts.len() || !active.is_empty() {
            // Start prompts while their whole KV fits in the free blocks.
            while next < prompts.len() && active.len() < max_seqs {
                let prompt = &prompts[next];
                let blocks = self.scheduler.block_manager_mut();
                let need = blocks.blocks_for(prompt.len());
                if !blocks.has_room(need, false) {
                    if active.is_empty() {
                        return Err(InferError::KvCache(format!(
                            "a prompt of {} tokens needs {need} KV blocks but {} are free",
                            prompt.len(),
                            blocks.num_available_device()
                        )));
                    }
                    break;
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                blocks.allocate(seq, PrefixHit::default(), prompt, prompt.len())?;
                active.push(Embedding {
                    prompt: next,
                    seq,
                    done: 0,
                    pooled: PooledRows::default(),
                });
                next += 1;
            }
            // One step: a chunk of each prompt in order while the token budget lasts.
            let blocks = self.scheduler.block_manager();
            let (mut chunks, mut rows, mut taken) = (Vec::new(), Vec::new(), Vec::new());
            let mut left = budget;
            let mut offset = 0u32;
            for (i, e) in active.iter().enumerate() {
                if left == 0 {
                    break;
                }
                let prompt = &prompts[e.prompt];
                let n = left.min(prompt.len() - e.done);
                let last = e.done + n == prompt.len();
                // A step's tokens fit 32 bits (the batch's indices are u32).
                let n32 = u32_index(n);
                let wanted = match params.pooling {
                    PoolingType::Mean => offset..offset + n32,
                    PoolingType::Last if last => offset + n32 - 1..offset + n32,
                    PoolingType::Cls if e.done == 0 => offset..offset + 1,
                    _ => offset..offset,
                };
                rows.extend(wanted.clone().map(|r| (i, r)));
                chunks.push(SequenceChunk {
                    tokens: &prompt[e.done..e.done + n],
                    num_computed: e.done,
                    block_table: blocks.block_table(e.seq).unwrap_or_default(),
                    want_logits: false,
                    all_logits: false,
                });
                taken.push(n);
                offset += n32;
                left -= n;
            }
            let mut batch = BatchInput::build(&chunks, block_size)?;
            batch.logits_indices = rows.iter().map(|&(_, r)| r).collect();
            if rows.is_empty() {
                // Non-final chunks of last-token pooling: the cache is all this step makes.
                let pending = self.executor.submit(&CacheOps::default(), Some(&batch))?;
                let executor = &self.executor;
                pending.wait(|| executor.wait())?;
            } else {
                let hidden = self.executor.hidden_rows(&batch)?;
                let width = hidden.shape.last().copied().unwrap_or(0);
                params.check(width)?;
                for (&(i, _), row) in rows.iter().zip(hidden.data.chunks_exact(width)) {
                    active[i].pooled.add(row);
                }
            }
            self.stats.steps += 1;
            self.stats.last_step_tokens = offset as usize;
            self.stats.prompt_tokens_computed += u64::from(offset);
            for (e, n) in active.iter_mut().zip(&taken) {
                e.done += n;
            }
            // Finished prompts give their blocks back at once.
            let mut i = 0;
            while i < active.len() {
                if active[i].done < prompts[active[i].prompt].len() {
                    i += 1;
                    continue;
                }
                let e = active.remove(i);
                self.scheduler.block_manager_mut().free(e.seq);
                out[e.prompt] = Some(params.finish(e.pooled.mean()));
            }
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| InferError::KvCache("a prompt was not embedded".into())))
            .collect()
    }
}
