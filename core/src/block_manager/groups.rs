//! Block accounting for groups of sequences that share blocks: what a group's next step
//! takes, a recomputed member sharing its first member's prefix, and what sharing saves.

use std::collections::HashMap;

use super::{BlockId, BlockManager, PrefixHit, SeqId};
use crate::error::{InferError, Result};

impl BlockManager {
    /// Device blocks `append_slots` would take for each `(seq, num_computed, num_new)` in
    /// turn: a block shared only within the list is copied by all its writers but the last.
    /// For swapped sequences, what they would take once swapped back in (swapping keeps the
    /// group's sharing, so host reference counts stand for the device ones).
    pub fn blocks_to_append_group(&self, plan: &[(SeqId, usize, usize)]) -> usize {
        let mut released: HashMap<BlockId, u32> = HashMap::new();
        let mut total = 0;
        for &(seq, num_computed, num_new) in plan.iter().filter(|p| p.2 > 0) {
            let Some(s) = self.seqs.get(&seq) else {
                total += self.blocks_for(num_computed + num_new);
                continue;
            };
            total += self
                .blocks_for(num_computed + num_new)
                .saturating_sub(s.table.len());
            if let Some(&b) = s.table.get(num_computed / self.block_size) {
                let gone = released.entry(b).or_default();
                let refs = if s.on_host {
                    self.host.ref_count(b)
                } else {
                    self.device.ref_count(b)
                };
                if refs - *gone > 1 {
                    total += 1;
                    *gone += 1;
                }
            }
        }
        total
    }

    /// The first `num_blocks` blocks of `seq`, as a hit for a sequence that starts with the
    /// same tokens (a recomputed group member sharing its first member's prompt).
    pub fn shared_prefix(&self, seq: SeqId, num_blocks: usize) -> Result<PrefixHit> {
        let s = self.seq(seq)?;
        // Released blocks are another sequence's now: nothing before the live ones is shared.
        if s.on_host || num_blocks > s.table.len() || (num_blocks > 0 && s.released > 0) {
            return Err(InferError::KvCache(format!(
                "sequence {seq} has no {num_blocks} device blocks to share"
            )));
        }
        Ok(PrefixHit {
            blocks: s.table[..num_blocks].to_vec(),
            hashes: s.hashes[..num_blocks.min(s.hashes.len())].to_vec(),
            root: s.root,
        })
    }

    /// Block-table entries of the sequences on the device: a shared block counts once per
    /// holder, as it would take a block of its own without sharing.
    pub fn num_logical_device_blocks(&self) -> usize {
        self.seqs
            .values()
            .filter(|s| !s.on_host)
            .map(|s| s.live().len())
            .sum()
    }

    /// Distinct device blocks the sequences hold.
    pub fn num_referenced_device_blocks(&self) -> usize {
        self.device.num_blocks() - self.device.num_available()
    }
}
