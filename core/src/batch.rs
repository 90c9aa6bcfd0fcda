//! Host-side metadata of one forward step: flat token arrays plus per-sequence block tables,
//! laid out the way GPU kernels want them (vLLM's `query_start_loc` / `seq_lens` scheme).

use crate::error::{InferError, Result};

/// One sequence's part of a step: `tokens` continue after `num_computed` tokens already in
/// the cache (0 for a fresh prompt, `len - 1` for a decode step).
#[derive(Debug, Clone, Copy)]
pub struct SequenceChunk<'a> {
    pub tokens: &'a [u32],
    pub num_computed: usize,
    /// Blocks holding this sequence's cache, enough for `num_computed + tokens.len()`.
    pub block_table: &'a [u32],
    /// Whether the last token's logits are wanted (false for a non-final prefill chunk).
    pub want_logits: bool,
    /// Logits for every token of the chunk (prompt logprobs), the last one's included.
    pub all_logits: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchInput {
    /// `[num_tokens]`
    pub token_ids: Vec<u32>,
    /// `[num_tokens]` absolute positions.
    pub positions: Vec<u32>,
    /// `[num_tokens]` cache slot (`block * block_size + offset`) each token's K/V goes to.
    pub slot_mapping: Vec<u32>,
    /// `[num_seqs + 1]` offsets of each sequence's tokens.
    pub query_start: Vec<u32>,
    /// `[num_seqs]` tokens in the cache after this step, per sequence.
    pub context_lens: Vec<u32>,
    /// `[num_seqs * max_blocks_per_seq]` block tables, padded with 0.
    pub block_tables: Vec<u32>,
    pub max_blocks_per_seq: usize,
    pub block_size: usize,
    /// Token rows whose logits are computed.
    pub logits_indices: Vec<u32>,
    /// Every logits row only needs its argmax (plain greedy decoding): an executor may return
    /// the ids instead of the rows (see `StepLogits`).
    pub argmax_only: bool,
}

impl BatchInput {
    pub fn build(chunks: &[SequenceChunk], block_size: usize) -> Result<Self> {
        if block_size == 0 {
            return Err(InferError::invalid("block_size", "must be > 0"));
        }
        let max_blocks = chunks
            .iter()
            .map(|c| c.block_table.len())
            .max()
            .unwrap_or(0);
        let mut b = BatchInput {
            max_blocks_per_seq: max_blocks,
            block_size,
            query_start: vec![0],
            ..Default::default()
        };
        for c in chunks {
            let ctx = c.num_computed + c.tokens.len();
            if c.tokens.is_empty() {
                return Err(InferError::KvCache("a sequence chunk has no tokens".into()));
            }
            if ctx > c.block_table.len() * block_size {
                return Err(InferError::KvCache(format!(
                    "{ctx} tokens need {} blocks but the block table has {}",
                    ctx.div_ceil(block_size),
                    c.block_table.len()
                )));
            }
            for (i, &t) in c.tokens.iter().enumerate() {
                let pos = c.num_computed + i;
                let block = c.block_table[pos / block_size] as usize;
                b.token_ids.push(t);
                b.positions.push(index32("position", pos)?);
                b.slot_mapping
                    .push(index32("slot", block * block_size + pos % block_size)?);
            }
            let first = index32("token", b.token_ids.len() - c.tokens.len())?;
            let end = index32("token", b.token_ids.len())?;
            if c.all_logits {
                b.logits_indices.extend(first..end);
            } else if c.want_logits {
                b.logits_indices.push(end - 1);
            }
            b.query_start.push(end);
            b.context_lens.push(index32("context length", ctx)?);
            b.block_tables.extend_from_slice(c.block_table);
            b.block_tables
                .resize(b.block_tables.len() + max_blocks - c.block_table.len(), 0);
        }
        Ok(b)
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    pub fn block_table(&self, seq: usize) -> &[u32] {
        &self.block_tables[seq * self.max_blocks_per_seq..(seq + 1) * self.max_blocks_per_seq]
    }

    /// `[num_tokens]` the sequence (index into the block tables) each token belongs to.
    pub fn token_seqs(&self) -> Vec<u32> {
        let mut seqs = Vec::with_capacity(self.num_tokens());
        for (seq, w) in (0u32..).zip(self.query_start.windows(2)) {
            seqs.extend(std::iter::repeat_n(seq, (w[1] - w[0]) as usize));
        }
        seqs
    }
}

/// Kernels index tokens, positions and cache slots with 32 bits.
fn index32(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| InferError::KvCache(format!("{what} {v} is past the kernels' 32-bit indices")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_prefill_chunk_and_decode() {
        let prompt = [5, 6, 7];
        let decode = [9];
        let b = BatchInput::build(
            &[
                SequenceChunk {
                    tokens: &prompt,
                    num_computed: 0,
                    block_table: &[3, 1],
                    want_logits: true,
                    all_logits: false,
                },
                SequenceChunk {
                    tokens: &decode,
                    num_computed: 4,
                    block_table: &[2, 0, 4],
                    want_logits: true,
                    all_logits: false,
                },
            ],
            2,
        )
        .unwrap();
        assert_eq!(b.positions, [0, 1, 2, 4]);
        assert_eq!(b.slot_mapping, [6, 7, 2, 8]);
        assert_eq!(b.query_start, [0, 3, 4]);
        assert_eq!(b.context_lens, [3, 5]);
        assert_eq!(b.logits_indices, [2, 3]);
        assert_eq!(b.block_table(0), [3, 1, 0]);
        assert_eq!(b.block_table(1), [2, 0, 4]);
        assert_eq!(b.token_seqs(), [0, 0, 0, 1]);
    }

    #[test]
    fn short_block_table_is_an_error() {
        let e = BatchInput::build(
            &[SequenceChunk {
                tokens: &[1, 2, 3],
                num_computed: 0,
                block_table: &[0],
                want_logits: true,
                all_logits: false,
            }],
            2,
        );
        assert!(matches!(e, Err(InferError::KvCache(_))));
    }
}
