//! Executors without a model, for tests and the engine-overhead benchmark.

use crate::batch::BatchInput;
use crate::block_manager::BlockCopy;
use crate::error::{InferError, Result};
use crate::scheduler::CacheOps;

use super::{Executor, PendingLogits, StepLogits};

/// Returns one of a few fixed logit rows (chosen by the token's position), at the full cost
/// of a real vocabulary for the sampler: isolates the engine's own per-step overhead.
pub struct FixedLogitsExecutor {
    rows: Vec<Vec<f32>>,
}

impl FixedLogitsExecutor {
    pub fn new(vocab: usize, seed: u64) -> Self {
        let mut state = seed | 1;
        let rows = (0..8)
            .map(|_| {
                (0..vocab)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state % 10_000) as f32 / 1000.0
                    })
                    .collect()
            })
            .collect();
        FixedLogitsExecutor { rows }
    }
}

impl Executor for FixedLogitsExecutor {
    fn vocab_size(&self) -> usize {
        self.rows[0].len()
    }

    fn submit(&mut self, _ops: &CacheOps, batch: Option<&BatchInput>) -> Result<PendingLogits> {
        let mut step = StepLogits::default();
        if let Some(b) = batch {
            for &i in &b.logits_indices {
                let row = &self.rows[b.positions[i as usize] as usize % self.rows.len()];
                step.rows.extend(row);
            }
        }
        Ok(PendingLogits::Ready(step))
    }
}

/// The token a `SimulatedKvExecutor` "predicts" after `context`: a hash of all of it, so a
/// single wrong cache slot changes the answer.
pub fn simulated_next_token(context: &[u32], vocab: usize) -> u32 {
    u32::try_from(context_hash(context) % vocab as u64).expect("a test vocabulary fits 32 bits")
}

/// FNV-1a over the context's ids.
fn context_hash(context: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in context {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The logits a `SimulatedKvExecutor` returns after `context`: noise in [0, 2) that depends on
/// the whole context, and 4 at `simulated_next_token` (so greedy decoding follows it while
/// sampling and beam search have real alternatives).
pub fn simulated_logits(context: &[u32], row: &mut [f32]) {
    let vocab = row.len();
    // The hash's low 32 bits seed the noise.
    let h = context_hash(context) & 0xFFFF_FFFF;
    for (v, l) in row.iter_mut().enumerate() {
        let x = (h ^ (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        *l = (x >> 54) as f32 / 512.0;
    }
    row[simulated_next_token(context, vocab) as usize] = 4.0;
}

/// Keeps (token, position) in every cache slot, device and host, performs the block moves,
/// and reads each sequence's context back through its block table: a model whose output
/// proves the block manager and scheduler kept every sequence's cache intact.
pub struct SimulatedKvExecutor {
    vocab: usize,
    block_size: usize,
    device: Vec<Option<(u32, u32)>>,
    host: Vec<Option<(u32, u32)>>,
    /// Answer `argmax_only` batches with ids, as a GPU backend does.
    pub device_argmax: bool,
    /// Each row reads only its last `window` positions (a model whose every layer slides),
    /// so the engine may free older blocks; the rest are never read.
    pub window: Option<usize>,
}

impl SimulatedKvExecutor {
    pub fn new(
        vocab: usize,
        block_size: usize,
        num_device_blocks: usize,
        num_host_blocks: usize,
    ) -> Self {
        SimulatedKvExecutor {
            vocab,
            block_size,
            device: vec![None; num_device_blocks * block_size],
            host: vec![None; num_host_blocks * block_size],
            device_argmax: false,
            window: None,
        }
    }

    fn copy(
        from: &[Option<(u32, u32)>],
        to: &mut [Option<(u32, u32)>],
        copies: &[BlockCopy],
        bs: usize,
    ) {
        for &(f, t) in copies {
            let (f, t) = (f as usize * bs, t as usize * bs);
            to[t..t + bs].copy_from_slice(&from[f..f + bs]);
        }
    }
}

impl Executor for SimulatedKvExecutor {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn submit(&mut self, ops: &CacheOps, batch: Option<&BatchInput>) -> Result<PendingLogits> {
        let mut step = StepLogits::default();
        let out = &mut step.rows;
        let bs = self.block_size;
        Self::copy(&self.device, &mut self.host, &ops.swap_out, bs);
        Self::copy(&self.host, &mut self.device, &ops.swap_in, bs);
        let snapshot = self.device.clone();
        Self::copy(&snapshot, &mut self.device, &ops.copy, bs);
        let Some(b) = batch else {
            return Ok(PendingLogits::Ready(step));
        };
        for (t, &slot) in b.slot_mapping.iter().enumerate() {
            self.device[slot as usize] = Some((b.token_ids[t], b.positions[t]));
        }
        out.resize(b.logits_indices.len() * self.vocab, 0.0);
        for (row, &idx) in b.logits_indices.iter().enumerate() {
            let seq = b.query_start.partition_point(|&s| s <= idx) - 1;
            let table = b.block_table(seq);
            // Causal: the row sees its own token and those before it.
            let len = b.positions[idx as usize] as usize + 1;
            let first = self.window.map_or(0, |w| len.saturating_sub(w));
            let mut context = Vec::with_capacity(len - first);
            for p in first..len {
                let slot = table[p / bs] as usize * bs + p % bs;
                match self.device[slot] {
                    Some((tok, pos)) if pos as usize == p => context.push(tok),
                    other => {
                        return Err(InferError::KvCache(format!(
                            "sequence {seq}: position {p} reads slot {slot} holding {other:?}"
                        )))
                    }
                }
            }
            simulated_logits(&context, &mut out[row * self.vocab..(row + 1) * self.vocab]);
        }
        if b.argmax_only && self.device_argmax {
            let ids = out
                .chunks(self.vocab)
                .map(crate::sampling::math::argmax)
                .collect();
            step.argmax = Some(ids);
            step.rows.clear();
        }
        Ok(PendingLogits::Ready(step))
    }

    fn sliding_window(&self) -> Option<usize> {
        self.window
    }
}
