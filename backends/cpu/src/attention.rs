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

#[cfg(test)]
mod tests {
    use super::*;
    use infer_core::SequenceChunk;
    use proptest::prelude::*;

    fn rand_vec(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Ragged batches mixing prefill chunks (with a cached prefix) and decodes, GQA, block
        /// tables drawn from a shuffled pool, contexts not a multiple of the block size: paged
        /// attention equals dense causal attention over each sequence's own K/V, in float64.
        #[test]
        fn paged_equals_dense_causal_attention(
            seqs in prop::collection::vec((0usize..40, 1usize..12), 1..5),
            block_size in 1usize..6,
            kv_heads in 1usize..4,
            group in 1usize..4,
            head_dim in 1usize..9,
            seed in 1u64..u64::MAX,
        ) {
            let heads = kv_heads * group;
            let kv_dim = kv_heads * head_dim;
            let mut s = seed;
            // Give every sequence its blocks from a shuffled pool.
            let need: Vec<usize> = seqs.iter().map(|(done, new)| (done + new).div_ceil(block_size)).collect();
            let num_blocks: usize = need.iter().sum::<usize>() + 3;
            let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
            for i in (1..pool.len()).rev() {
                let j = (rand_vec(1, &mut s)[0].abs() * i as f32) as usize % (i + 1);
                pool.swap(i, j);
            }
            let mut tables = Vec::new();
            for n in &need {
                tables.push(pool.drain(..*n).collect::<Vec<u32>>());
            }
            let tokens: Vec<Vec<u32>> = seqs.iter().map(|(_, new)| vec![0; *new]).collect();
            let chunks: Vec<SequenceChunk> = seqs
                .iter()
                .enumerate()
                .map(|(i, (done, _))| SequenceChunk { tokens: &tokens[i], num_computed: *done, block_table: &tables[i], want_logits: true })
                .collect();
            let batch = BatchInput::build(&chunks, block_size).unwrap();

            // Each sequence's full K/V (cached prefix + this step), written through the slots.
            let mut k_cache = rand_vec(num_blocks * block_size * kv_dim, &mut s);
            let mut v_cache = rand_vec(num_blocks * block_size * kv_dim, &mut s);
            let mut dense_k = Vec::new();
            let mut dense_v = Vec::new();
            for (i, (done, new)) in seqs.iter().enumerate() {
                let (k, v) = (rand_vec((done + new) * kv_dim, &mut s), rand_vec((done + new) * kv_dim, &mut s));
                let slots: Vec<u32> = (0..done + new)
                    .map(|p| tables[i][p / block_size] * block_size as u32 + (p % block_size) as u32)
                    .collect();
                write_kv(&mut k_cache, &k, &slots, kv_dim);
                write_kv(&mut v_cache, &v, &slots, kv_dim);
                dense_k.push(k);
                dense_v.push(v);
            }
            let q = rand_vec(batch.num_tokens() * heads * head_dim, &mut s);
            let p = AttentionParams { num_heads: heads, num_kv_heads: kv_heads, head_dim, scale: 0.7 };
            let out = paged_attention(&q, &k_cache, &v_cache, &batch, &p);

            let mut t = 0;
            for (i, (done, new)) in seqs.iter().enumerate() {
                for j in 0..*new {
                    let pos = done + j; // sees keys 0..=pos
                    for h in 0..heads {
                        let qv = &q[(t * heads + h) * head_dim..][..head_dim];
                        let kh = h / group;
                        let row = |m: &Vec<f32>, p: usize| m[p * kv_dim + kh * head_dim..][..head_dim].to_vec();
                        let scores: Vec<f64> = (0..=pos)
                            .map(|kp| row(&dense_k[i], kp).iter().zip(qv).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * 0.7)
                            .collect();
                        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let w: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                        let total: f64 = w.iter().sum();
                        for d in 0..head_dim {
                            let want: f64 = (0..=pos).map(|kp| w[kp] / total * row(&dense_v[i], kp)[d] as f64).sum();
                            let got = out[(t * heads + h) * head_dim + d] as f64;
                            prop_assert!((got - want).abs() < 1e-5, "seq {} token {} head {} dim {}: {} vs {}", i, j, h, d, got, want);
                        }
                    }
                    t += 1;
                }
            }
        }
    }
}
