//! Swapping preempted sequences' blocks between the device pool and the host pool.

use std::collections::{HashMap, HashSet};

use super::{out_of_blocks, BlockCopy, BlockId, BlockManager, SeqId};
use crate::error::{InferError, Result};

impl BlockManager {
    /// Distinct blocks of `seqs` (shared ones counted once) on the device or the host.
    fn distinct_blocks(&self, seqs: &[SeqId], on_host: bool) -> Result<Vec<BlockId>> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for &id in seqs {
            let s = self.seq(id)?;
            if s.on_host != on_host {
                return Err(InferError::KvCache(format!(
                    "sequence {id} is already on the {}",
                    if on_host { "device" } else { "host" }
                )));
            }
            out.extend(s.live().iter().filter(|&&b| seen.insert(b)));
        }
        Ok(out)
    }

    pub fn can_swap_out(&self, seqs: &[SeqId]) -> bool {
        self.distinct_blocks(seqs, false)
            .is_ok_and(|b| b.len() <= self.host.num_free())
    }

    /// Moves the sequences' blocks to host memory. Returns the `(device, host)` copies, which
    /// must run before this step writes to the freed device blocks.
    pub fn swap_out(&mut self, seqs: &[SeqId]) -> Result<Vec<BlockCopy>> {
        if !self.can_swap_out(seqs) {
            return Err(InferError::KvCache(
                "not enough host blocks to swap out".into(),
            ));
        }
        self.move_blocks(seqs, true)
    }

    /// Whether the sequences fit back on the device with `headroom` blocks to spare.
    pub fn can_swap_in(&self, seqs: &[SeqId], headroom: usize) -> bool {
        self.distinct_blocks(seqs, true)
            .is_ok_and(|b| b.len() + headroom <= self.device.num_available())
    }

    /// Brings swapped sequences back. Returns the `(host, device)` copies.
    pub fn swap_in(&mut self, seqs: &[SeqId]) -> Result<Vec<BlockCopy>> {
        if !self.can_swap_in(seqs, 0) {
            return Err(InferError::KvCache(
                "not enough device blocks to swap in".into(),
            ));
        }
        self.move_blocks(seqs, false)
    }

    fn move_blocks(&mut self, seqs: &[SeqId], to_host: bool) -> Result<Vec<BlockCopy>> {
        let mut mapping: HashMap<BlockId, BlockId> = HashMap::new();
        let mut copies = Vec::new();
        for &id in seqs {
            let Some(mut s) = self.seqs.remove(&id) else {
                return Err(out_of_blocks(id));
            };
            // Released entries stay as they are: stale ids no kernel reads.
            for b in s.table[s.released..].iter_mut() {
                let to = match mapping.get(b) {
                    Some(&to) => {
                        self.incref_on(to, to_host);
                        to
                    }
                    None => {
                        let to = self.allocate_on(to_host).ok_or_else(|| out_of_blocks(id))?;
                        mapping.insert(*b, to);
                        copies.push((*b, to));
                        to
                    }
                };
                self.decref_on(*b, !to_host);
                *b = to;
            }
            s.on_host = to_host;
            if !to_host {
                // The next append re-registers the full blocks at their new places.
                s.hashes.clear();
            }
            self.seqs.insert(id, s);
        }
        Ok(copies)
    }

    fn allocate_on(&mut self, host: bool) -> Option<BlockId> {
        if host {
            self.host.allocate()
        } else {
            self.device.allocate()
        }
    }

    fn incref_on(&mut self, b: BlockId, on_host: bool) {
        if on_host {
            self.host.incref(b);
        } else {
            self.device.incref(b);
        }
    }

    fn decref_on(&mut self, b: BlockId, on_host: bool) {
        if on_host {
            self.host.decref(b);
        } else {
            self.device.decref(b);
        }
    }
}
