//! Speculative decoding's roll-back: a sequence gives back the slots of rejected proposals.

use super::{register_full_blocks, BlockManager, SeqId};
use crate::error::{InferError, Result};

impl BlockManager {
    /// Rolls a sequence back to `num_tokens` tokens (rejected proposals): blocks past them
    /// are released, last first, and blocks the accepted `tokens` now fill are registered in
    /// the prefix cache.
    pub fn truncate(&mut self, seq: SeqId, tokens: &[u32], num_tokens: usize) -> Result<()> {
        let (bs, caching) = (self.block_size, self.prefix_caching);
        let Self { device, seqs, .. } = self;
        let s = seqs
            .get_mut(&seq)
            .ok_or_else(|| InferError::KvCache(format!("sequence {seq} has no blocks")))?;
        if s.on_host || num_tokens > tokens.len() || num_tokens / bs < s.hashes.len() {
            return Err(InferError::KvCache(format!(
                "sequence {seq}: cannot roll back to {num_tokens} tokens"
            )));
        }
        let keep = num_tokens.div_ceil(bs).max(s.released);
        while s.table.len() > keep {
            if let Some(b) = s.table.pop() {
                device.decref(b);
            }
        }
        register_full_blocks(device, bs, caching, s, tokens, num_tokens);
        Ok(())
    }
}
