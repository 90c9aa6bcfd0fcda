//! Paged attention on the CPU. The cache of each layer is `[num_blocks, block_size, kv_heads,
//! head_dim]` for K and for V; tokens find their keys through their sequence's block table.

use infer_core::{AttentionParams, BatchInput};
use rayon::prelude::*;

use crate::matmul::dot;

/// Writes each token's K/V row at its slot.
pub fn write_kv(cache: &mut [f32], rows: &[f32], slot_mapping: &[u32], kv_dim: usize) {
    for (row, &slot) in rows.chunks_exact(kv_dim).zip(slot_mapping) {
        let at = slot as usize * kv_dim;
        cache[at..at + kv_dim].copy_from_slice(row);
    }
}

/// Causal attention for every (token, head). `q` is `[num_tokens, heads * head_dim]`.
pub fn paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    batch: &BatchInput,
    p: &AttentionParams,
) -> Vec<f32> {
    let (hd, heads) = (p.head_dim, p.num_heads);
    let group = heads / p.num_kv_heads;
    let kv_dim = p.num_kv_heads * hd;
    let bs = batch.block_size;
    let mut out = vec![0f32; q.len()];
    // token index → its sequence
    let mut seq_of = vec![0usize; batch.num_tokens()];
    for s in 0..batch.num_seqs() {
        let (a, b) = (
            batch.query_start[s] as usize,
            batch.query_start[s + 1] as usize,
        );
        seq_of[a..b].iter_mut().for_each(|x| *x = s);
    }
    out.par_chunks_mut(hd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (idx, o)| {
            let (t, h) = (idx / heads, idx % heads);
            let s = seq_of[t];
            let q_end = batch.query_start[s + 1] as usize;
            // This token sees the cache up to itself: later tokens of its chunk are masked.
            let visible = batch.context_lens[s] as usize - (q_end - 1 - t);
            let table = batch.block_table(s);
            let qv = &q[t * heads * hd + h * hd..][..hd];
            let kv_off = (h / group) * hd;
            let slot = |j: usize| table[j / bs] as usize * bs + j % bs;
            scores.clear();
            scores.extend(
                (0..visible)
                    .map(|j| dot(qv, &k_cache[slot(j) * kv_dim + kv_off..][..hd]) * p.scale),
            );
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0f32;
            for x in scores.iter_mut() {
                *x = (*x - max).exp();
                total += *x;
            }
            for (j, &w) in scores.iter().enumerate() {
                let v = &v_cache[slot(j) * kv_dim + kv_off..][..hd];
                for (acc, &vv) in o.iter_mut().zip(v) {
                    *acc += w * vv;
                }
            }
            let inv = 1.0 / total;
            o.iter_mut().for_each(|x| *x *= inv);
        });
    out
}
