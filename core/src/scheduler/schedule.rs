//! One scheduling step: running groups first, then swapped groups back, then new prompts.

use std::collections::VecDeque;

use super::{insert_by_arrival, PreemptionMode, Queue, ScheduledChunk, Scheduler, SchedulerOutput};
use crate::block_manager::{PrefixHit, SeqId};
use crate::error::{InferError, Result};

/// A group member's share of a step, before its blocks are taken.
#[derive(Debug, Clone, Copy)]
struct Share {
    id: SeqId,
    num_computed: usize,
    /// Known tokens, then proposals after them.
    num_new: usize,
    num_spec: usize,
}

impl Scheduler {
    /// Plans the next step and advances each scheduled sequence's `num_computed`.
    pub fn schedule(&mut self) -> Result<SchedulerOutput> {
        let mut out = SchedulerOutput::default();
        let cap = self.config.max_num_batched_tokens;
        let mut budget = self.step_tokens.map_or(cap, |n| n.clamp(1, cap));
        // Blocks every running sequence's window has left go back before anything grows.
        if self.blocks.releases_out_of_window() {
            for id in &self.running {
                out.released_blocks += self
                    .blocks
                    .release_out_of_window(*id, self.seqs[id].0.num_computed);
            }
        }
        // Members rejoining their running group first: the group cannot sample without them.
        self.schedule_waiting(&mut budget, &mut out, true)?;
        self.schedule_running(&mut budget, &mut out)?;
        if out.preempted.is_empty() {
            self.schedule_swapped(&mut budget, &mut out)?;
        }
        if out.preempted.is_empty() && self.swapped.is_empty() {
            self.schedule_waiting(&mut budget, &mut out, false)?;
        }
        out.num_batched_tokens = out.chunks.iter().map(|c| c.num_new).sum();
        Ok(out)
    }

    /// Running groups, earliest first; the latest arrivals give way when blocks run out. A
    /// prompt's chunk leaves a token for each decoding sequence after it, so a long prompt
    /// never holds back the streams already running (they decode between its chunks).
    fn schedule_running(&mut self, budget: &mut usize, out: &mut SchedulerOutput) -> Result<()> {
        let mut i = 0;
        let mut reserved = self.num_decoding();
        while i < self.running.len() && *budget > 0 {
            let members = self.group(&self.running, i);
            let arrival = self.seqs[&members[0]].0.arrival;
            let own = members
                .iter()
                .filter(|id| Self::decoding(&self.seqs[*id].0))
                .count();
            reserved = reserved.saturating_sub(own);
            let available = if own == members.len() {
                *budget
            } else {
                budget.saturating_sub(reserved)
            };
            if available == 0 {
                i += members.len();
                continue;
            }
            let mut shares = self.share_budget(&members, available);
            let fits = loop {
                let plan: Vec<_> = shares
                    .iter()
                    .map(|s| (s.id, s.num_computed, s.num_new + s.num_spec))
                    .collect();
                if self.blocks.blocks_to_append_group(&plan) <= self.blocks.num_available_device() {
                    break true;
                }
                // Proposals give way before anyone is preempted.
                if shares.iter().any(|s| s.num_spec > 0) {
                    shares.iter_mut().for_each(|s| s.num_spec = 0);
                    continue;
                }
                let Some(&last) = self.running.back() else {
                    break false;
                };
                let victim = self.seqs[&last].0.arrival;
                self.preempt_group(victim, out)?;
                if victim == arrival {
                    break false;
                }
            };
            if !fits {
                break;
            }
            self.append_shares(&shares, budget, out)?;
            i += members.len();
        }
        Ok(())
    }

    /// Swapped groups come back, earliest first, before anything new is admitted.
    fn schedule_swapped(&mut self, budget: &mut usize, out: &mut SchedulerOutput) -> Result<()> {
        while *budget > 0 && !self.swapped.is_empty() {
            let members = self.group(&self.swapped, 0);
            if self.running_slots() + self.seqs[&members[0]].0.group_size > self.config.max_num_seqs
            {
                break;
            }
            let mut shares = self.share_budget(&members, *budget);
            // A group coming back from host memory verifies no proposals.
            shares.iter_mut().for_each(|s| s.num_spec = 0);
            let plan: Vec<_> = shares
                .iter()
                .map(|s| (s.id, s.num_computed, s.num_new))
                .collect();
            let growth = self.blocks.blocks_to_append_group(&plan);
            if !self.blocks.can_swap_in(&members, growth) {
                break;
            }
            out.cache_ops.swap_in.extend(self.blocks.swap_in(&members)?);
            self.swapped.drain(..members.len());
            out.admitted += members.len();
            for s in &shares {
                self.set_queue(s.id, Queue::Running);
            }
            self.append_shares(&shares, budget, out)?;
        }
        Ok(())
    }

    /// New prompts and recomputed sequences, first come first served: one that does not fit
    /// blocks the rest. A recomputed group comes back one member at a time: the first like a
    /// new prompt, each other one once the first has computed the prefix they share, taking
    /// those blocks instead of computing them again. With `joiners_only`, only members of
    /// groups already running are admitted (they are part of running requests, not new work).
    fn schedule_waiting(
        &mut self,
        budget: &mut usize,
        out: &mut SchedulerOutput,
        joiners_only: bool,
    ) -> Result<()> {
        let mut i = 0;
        while *budget > 0 && i < self.waiting.len() {
            let id = self.waiting[i];
            let arrival = self.seqs[&id].0.arrival;
            // Only a member of a multi-sequence group can have a running leader: the common
            // single-sequence request skips the scan of the running queue (this pass runs over
            // the whole waiting queue every step).
            let leader = if self.group_members(arrival) > 1 {
                self.running
                    .iter()
                    .copied()
                    .find(|r| self.seqs[r].0.arrival == arrival)
            } else {
                None
            };
            let admitted = if joiners_only && leader.is_none() {
                false
            } else {
                self.admit(id, leader, budget, out)?
            };
            if admitted {
                out.admitted += 1;
                self.waiting.remove(i);
                self.set_queue(id, Queue::Running);
            } else if joiners_only {
                i += 1;
            } else {
                break;
            }
        }
        Ok(())
    }

    /// Gives a waiting sequence its blocks and first chunk if it fits now.
    fn admit(
        &mut self,
        id: SeqId,
        leader: Option<SeqId>,
        budget: &mut usize,
        out: &mut SchedulerOutput,
    ) -> Result<bool> {
        let bs = self.blocks.block_size();
        let s = &self.seqs[&id].0;
        if leader.is_none() && self.running_slots() + s.group_size > self.config.max_num_seqs {
            return Ok(false);
        }
        let len = s.tokens.len();
        // A member of a group stops short of sampling until the whole group is back.
        let limit = if self.group_members(s.arrival) > 1 {
            len - 1
        } else {
            len
        };
        let (hit, shared_blocks) = match leader {
            None => {
                let hit = if s.all_logits_until > 0 {
                    PrefixHit::none(s.cache_root)
                } else {
                    self.blocks.find_cached_prefix(&s.tokens, s.cache_root)
                };
                let n = hit.num_blocks();
                (Some(hit), n)
            }
            Some(l) => {
                let lead = &self.seqs[&l].0;
                let common = lead
                    .tokens
                    .iter()
                    .zip(&s.tokens)
                    .take_while(|(a, b)| a == b)
                    .count()
                    .min(len - 1);
                if lead.num_computed < common {
                    return Ok(false);
                }
                // Blocks the leader's window has left are gone: recompute from the start.
                if self.blocks.num_released(l) > 0 {
                    (None, 0)
                } else {
                    (None, common / bs)
                }
            }
        };
        let num_computed = shared_blocks * bs;
        let num_new = (limit - num_computed).min(*budget);
        let need = match &hit {
            Some(hit) => self.blocks.blocks_to_allocate(hit, num_computed + num_new),
            None => self.blocks.blocks_for(num_computed + num_new) - shared_blocks,
        };
        // With nothing running, the watermark would only stall a prompt that fits.
        if !self.blocks.has_room(need, !self.running.is_empty()) {
            return Ok(false);
        }
        let hit = match (hit, leader) {
            (Some(hit), _) => {
                out.prefix_hit_tokens += num_computed;
                out.prefix_query_tokens += len;
                out.prefix_hits.push((id, num_computed));
                hit
            }
            (None, Some(l)) => self.blocks.shared_prefix(l, shared_blocks)?,
            (None, None) => PrefixHit::none(self.seqs[&id].0.cache_root),
        };
        let tokens = &self.seqs[&id].0.tokens;
        self.blocks
            .allocate(id, hit, tokens, num_computed + num_new)?;
        if let Some((s, _)) = self.seqs.get_mut(&id) {
            s.num_computed = num_computed;
        }
        if num_new > 0 {
            self.push_chunk(id, num_new, out);
            *budget -= num_new;
        }
        Ok(true)
    }

    /// Live sequences of the group that arrived at `arrival`.
    fn group_members(&self, arrival: u64) -> usize {
        self.group_sizes.get(&arrival).copied().unwrap_or(0)
    }

    /// Splits the budget over a group in order. A member that would reach its next token
    /// while another would not (or while members are still waiting) holds that token back,
    /// so the group samples together.
    fn share_budget(&self, members: &[SeqId], budget: usize) -> Vec<Share> {
        let mut left = budget;
        let mut shares: Vec<Share> = members
            .iter()
            .map(|&id| {
                let s = &self.seqs[&id].0;
                let num_new = (s.tokens.len() - s.num_computed).min(left);
                left -= num_new;
                Share {
                    id,
                    num_computed: s.num_computed,
                    num_new,
                    num_spec: 0,
                }
            })
            .collect();
        let ends = |s: &Share| s.num_computed + s.num_new == self.seqs[&s.id].0.tokens.len();
        let all_here = self.group_members(self.seqs[&members[0]].0.arrival) == members.len();
        if shares.iter().any(ends) && (!all_here || !shares.iter().all(ends)) {
            for s in shares.iter_mut() {
                if ends(s) {
                    s.num_new -= 1;
                }
            }
            return shares;
        }
        // Proposals ride along with a decode token, as far as the budget goes.
        for s in shares.iter_mut() {
            let spec = &self.seqs[&s.id].0.spec;
            if s.num_new == 1 && ends(s) && !spec.is_empty() {
                s.num_spec = spec.len().min(left);
                left -= s.num_spec;
            }
        }
        shares
    }

    /// Takes the blocks counted for `shares` (copy-on-write included) and schedules them.
    fn append_shares(
        &mut self,
        shares: &[Share],
        budget: &mut usize,
        out: &mut SchedulerOutput,
    ) -> Result<()> {
        for s in shares {
            if let Some((state, _)) = self.seqs.get_mut(&s.id) {
                state.spec.truncate(s.num_spec);
            }
            if s.num_new == 0 {
                continue;
            }
            let tokens = &self.seqs[&s.id].0.tokens;
            let copies = self
                .blocks
                .append_speculative_slots(s.id, tokens, s.num_computed, s.num_new, s.num_spec)?
                .ok_or_else(|| counted_blocks_missing(s.id))?;
            out.cache_ops.copy.extend(copies);
            self.push_chunk(s.id, s.num_new + s.num_spec, out);
            *budget -= s.num_new + s.num_spec;
        }
        Ok(())
    }

    /// The group starting at `queue[start]`: it and the following ids of the same arrival.
    fn group(&self, queue: &VecDeque<SeqId>, start: usize) -> Vec<SeqId> {
        let arrival = self.seqs[&queue[start]].0.arrival;
        queue
            .iter()
            .skip(start)
            .take_while(|id| self.seqs[id].0.arrival == arrival)
            .copied()
            .collect()
    }

    /// Sequence slots the running groups may grow to.
    fn running_slots(&self) -> usize {
        let mut slots = 0;
        let mut last = None;
        for id in &self.running {
            let s = &self.seqs[id].0;
            if last != Some(s.arrival) {
                slots += s.group_size;
                last = Some(s.arrival);
            }
        }
        slots.max(self.running.len())
    }

    /// Schedules `num_new` tokens after the computed ones: known tokens, then any proposals.
    fn push_chunk(&mut self, id: SeqId, num_new: usize, out: &mut SchedulerOutput) {
        if let Some((s, _)) = self.seqs.get_mut(&id) {
            let num_spec = (s.num_computed + num_new).saturating_sub(s.tokens.len());
            out.chunks.push(ScheduledChunk {
                seq: id,
                num_computed: s.num_computed,
                num_new,
                want_logits: s.num_computed + num_new == s.tokens.len() + num_spec,
                all_logits: s.num_computed < s.all_logits_until,
                num_spec,
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

    /// Takes a running group off the device: by swap when asked (always for groups of several
    /// sequences, which then keep sharing their blocks) and when the host has room, else by
    /// recompute.
    fn preempt_group(&mut self, arrival: u64, out: &mut SchedulerOutput) -> Result<()> {
        let members: Vec<SeqId> = self
            .running
            .iter()
            .filter(|id| self.seqs[id].0.arrival == arrival)
            .copied()
            .collect();
        self.running.retain(|id| !members.contains(id));
        out.preempted.extend(&members);
        // A member that rejoined this step already has a chunk: take it back.
        let seqs = &mut self.seqs;
        out.chunks.retain(|c| {
            if !members.contains(&c.seq) {
                return true;
            }
            if let Some((s, _)) = seqs.get_mut(&c.seq) {
                s.num_computed = c.num_computed;
            }
            false
        });
        for id in &members {
            if let Some((s, _)) = self.seqs.get_mut(id) {
                s.spec.clear();
            }
        }
        let want_swap = self.config.preemption_mode == PreemptionMode::Swap || members.len() > 1;
        if want_swap && self.blocks.can_swap_out(&members) {
            out.cache_ops
                .swap_out
                .extend(self.blocks.swap_out(&members)?);
            for id in members {
                self.set_queue(id, Queue::Swapped);
            }
            return Ok(());
        }
        for id in members {
            self.blocks.free(id);
            if let Some((s, _)) = self.seqs.get_mut(&id) {
                s.num_computed = 0;
            }
            self.set_queue(id, Queue::Waiting);
        }
        Ok(())
    }
}

fn counted_blocks_missing(id: SeqId) -> InferError {
    InferError::KvCache(format!("sequence {id}: blocks counted free were not"))
}
