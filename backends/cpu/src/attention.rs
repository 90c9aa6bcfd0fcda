//! Paged attention on the CPU. The cache of each layer is `[num_blocks, block_size, kv_heads,
//! head_dim]` for K and for V; tokens find their keys through their sequence's block table.

use infer_core::{AttentionParams, BatchInput};
use rayon::prelude::*;

use crate::matmul::gemm_into;

mod decode;

/// Writes each token's K/V row at its slot.
pub fn write_kv(cache: &mut [f32], rows: &[f32], slot_mapping: &[u32], kv_dim: usize) {
    for (row, &slot) in rows.chunks_exact(kv_dim).zip(slot_mapping) {
        let at = slot as usize * kv_dim;
        cache[at..at + kv_dim].copy_from_slice(row);
    }
}

/// Queries of one sequence from which attention runs as GEMMs (prefill chunks); fewer (decode)
/// use one dot product per key.
const GEMM_MIN_QUERIES: usize = 8;

/// For each token of the batch, the index of its sequence.
pub fn seq_of_token(batch: &BatchInput) -> Vec<usize> {
    let mut seq_of = vec![0usize; batch.num_tokens()];
    for s in 0..batch.num_seqs() {
        let range = batch.query_start[s] as usize..batch.query_start[s + 1] as usize;
        seq_of[range].iter_mut().for_each(|x| *x = s);
    }
    seq_of
}

/// Causal attention for every (token, head), within `p.window` where it is set, scores
/// soft-capped where `p.softcap` is. `q` is `[num_tokens, heads * head_dim]`; `seq_of` is
/// `seq_of_token(batch)`.
pub fn paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    batch: &BatchInput,
    seq_of: &[usize],
    p: &AttentionParams,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let decode_tasks = seq_of
        .iter()
        .filter(|&&s| {
            ((batch.query_start[s + 1] - batch.query_start[s]) as usize) < GEMM_MIN_QUERIES
        })
        .count()
        * p.num_kv_heads;
    let parts = decode_parts(decode_tasks, rayon::current_num_threads());
    attention_in_parts(q, k_cache, v_cache, batch, seq_of, p, sinks, parts)
}

/// Into how many parts each decode token's keys are split: one while there are (token, KV
/// head) tasks enough for every thread, more when a few long sequences (one: a single
/// stream) would leave threads idle or unevenly loaded (SmolLM2's 3 KV heads on 2 threads).
fn decode_parts(tasks: usize, threads: usize) -> usize {
    if tasks == 0 || tasks >= 2 * threads {
        1
    } else {
        (4 * threads).div_ceil(tasks)
    }
}

/// Fewest keys in a part of a split decode token: below this the parts' bookkeeping costs
/// more than the threads gain. (Tests split short contexts too.)
const MIN_PART_KEYS: usize = if cfg!(test) { 2 } else { 256 };

/// `paged_attention` with decode tokens' keys split into up to `parts` parts.
#[allow(clippy::too_many_arguments)]
fn attention_in_parts(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    batch: &BatchInput,
    seq_of: &[usize],
    p: &AttentionParams,
    sinks: Option<&[f32]>,
    parts: usize,
) -> Vec<f32> {
    let (hd, heads) = (p.head_dim, p.num_heads);
    let group = heads / p.num_kv_heads;
    let kv_dim = p.num_kv_heads * hd;
    let mut out = vec![0f32; q.len()];
    let q_range = |s: usize| batch.query_start[s] as usize..batch.query_start[s + 1] as usize;
    let is_long = |s: usize| q_range(s).len() >= GEMM_MIN_QUERIES;
    // Decode-sized runs: one task per (token, KV head) for the group of query heads sharing
    // it, `idx = token · kv_heads + kv head`.
    let task = |idx: usize| {
        let (t, g) = (idx / p.num_kv_heads, idx % p.num_kv_heads);
        let s = seq_of[t];
        let q_end = batch.query_start[s + 1] as usize;
        let keys = decode::Keys {
            k_cache,
            v_cache,
            table: batch.block_table(s),
            block_size: batch.block_size,
            kv_dim,
            kv_off: g * hd,
            // This token sees the cache up to itself: later tokens of its run are masked.
            visible: batch.context_lens[s] as usize - (q_end - 1 - t),
            window: p.window.unwrap_or(usize::MAX),
        };
        let qs = &q[t * heads * hd + g * group * hd..][..group * hd];
        let sm = decode::Softmax {
            scale: p.scale,
            softcap: p.softcap,
            sinks: sinks.map(|s| &s[g * group..(g + 1) * group]),
        };
        (keys, qs, sm)
    };
    if parts <= 1 {
        out.par_chunks_mut(group * hd)
            .enumerate()
            .filter(|(idx, _)| !is_long(seq_of[idx / p.num_kv_heads]))
            .for_each_init(Vec::new, |scores, (idx, o)| {
                let (keys, qs, sm) = task(idx);
                decode::attend(qs, &keys, hd, &sm, scores, o);
            });
    } else {
        // (task, key range) jobs, a task's parts next to each other.
        let jobs: Vec<(usize, std::ops::Range<usize>)> = (0..seq_of.len() * p.num_kv_heads)
            .filter(|idx| !is_long(seq_of[idx / p.num_kv_heads]))
            .flat_map(|idx| {
                let seen = task(idx).0.seen();
                let n = parts.min(seen / MIN_PART_KEYS).max(1);
                (0..n).map(move |i| (idx, seen * i / n..seen * (i + 1) / n))
            })
            .collect();
        let partials: Vec<(usize, decode::Partial)> = jobs
            .into_par_iter()
            .map_init(Vec::new, |scores, (idx, range)| {
                let (keys, qs, sm) = task(idx);
                (idx, decode::attend_part(qs, &keys, hd, &sm, range, scores))
            })
            .collect();
        for same in partials.chunk_by(|a, b| a.0 == b.0) {
            let idx = same[0].0;
            let own: Vec<&decode::Partial> = same.iter().map(|(_, part)| part).collect();
            let (_, _, sm) = task(idx);
            decode::combine(
                &own,
                hd,
                sm.sinks,
                &mut out[idx * group * hd..][..group * hd],
            );
        }
    }

    // Long query runs: one task per (sequence, kv head, tile of queries) computes the tile for
    // the whole group of heads; scores are [tile, visible keys], never [queries, context].
    let tasks: Vec<(usize, usize, usize)> = (0..batch.num_seqs())
        .filter(|&s| is_long(s))
        .flat_map(|s| {
            let q_len = q_range(s).len();
            (0..p.num_kv_heads)
                .flat_map(move |g| (0..q_len).step_by(QUERY_TILE).map(move |r0| (s, g, r0)))
        })
        .collect();
    let results: Vec<(usize, usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(s, g, r0)| {
            (
                s,
                g,
                r0,
                prefill_tile(q, k_cache, v_cache, batch, p, sinks, s, g, r0),
            )
        })
        .collect();
    for (s, g, r0, o) in results {
        // `o` is [group, tile rows, hd]; scatter into rows of `out`.
        let rows = q_range(s);
        let tile = (rows.len() - r0).min(QUERY_TILE);
        for (i, h) in (g * group..(g + 1) * group).enumerate() {
            for r in 0..tile {
                let t = rows.start + r0 + r;
                let src = &o[(i * tile + r) * hd..][..hd];
                out[t * heads * hd + h * hd..][..hd].copy_from_slice(src);
            }
        }
    }
    out
}

/// Query rows per prefill attention task: bounds the score matrix to `QUERY_TILE` rows of the
/// keys they see (an 8K prompt's tile holds 128 × 8K scores, not 8K × 8K). Tests use small
/// tiles so their short runs span several.
const QUERY_TILE: usize = if cfg!(test) { 5 } else { 128 };

/// Attention of queries `r0..r0 + QUERY_TILE` (of sequence `s`'s run) for the heads of kv head
/// `g`, as GEMMs over the keys the tile sees: `S = Q·Kᵀ`, causal softmax per row, `O = P·V`.
/// Returns `[group, tile rows, head_dim]`.
#[allow(clippy::too_many_arguments)]
fn prefill_tile(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    batch: &BatchInput,
    p: &AttentionParams,
    sinks: Option<&[f32]>,
    s: usize,
    g: usize,
    r0: usize,
) -> Vec<f32> {
    let (hd, heads) = (p.head_dim, p.num_heads);
    let group = heads / p.num_kv_heads;
    let kv_dim = p.num_kv_heads * hd;
    let bs = batch.block_size;
    let (q0, q1) = (
        batch.query_start[s] as usize,
        batch.query_start[s + 1] as usize,
    );
    let q_len = q1 - q0;
    let rows = (q_len - r0).min(QUERY_TILE);
    // Query r of the run sits at position ctx - q_len + r and sees keys 0..=that: the tile's
    // last row sees `keys`, no row more.
    let past = batch.context_lens[s] as usize - q_len;
    let window = p.window.unwrap_or(usize::MAX);
    // Keys k0..end: the tile's first row sees back to k0 (its window), its last row up to end.
    let k0 = (past + r0 + 1).saturating_sub(window);
    let keys = past + r0 + rows - k0;
    let table = batch.block_table(s);
    // K as [keys, hd] and V transposed as [hd, keys], gathered through the block table.
    let mut k = vec![0f32; keys * hd];
    let mut vt = vec![0f32; hd * keys];
    for j in 0..keys {
        let pos = k0 + j;
        let at = (table[pos / bs] as usize * bs + pos % bs) * kv_dim + g * hd;
        k[j * hd..(j + 1) * hd].copy_from_slice(&k_cache[at..at + hd]);
        for (d, &x) in v_cache[at..at + hd].iter().enumerate() {
            vt[d * keys + j] = x;
        }
    }
    let mut out = vec![0f32; group * rows * hd];
    let mut qh = vec![0f32; rows * hd];
    let mut scores = vec![0f32; rows * keys];
    for i in 0..group {
        let h = g * group + i;
        for r in 0..rows {
            let t = q0 + r0 + r;
            qh[r * hd..(r + 1) * hd].copy_from_slice(&q[t * heads * hd + h * hd..][..hd]);
        }
        gemm_into(&qh, &k, rows, hd, keys, &mut scores, false);
        for (r, row) in scores.chunks_exact_mut(keys).enumerate() {
            // Row r sits at position past + r0 + r and sees keys [lo, hi) of the gathered.
            let hi = past + r0 + r + 1 - k0;
            let lo = (past + r0 + r + 1).saturating_sub(window) - k0;
            row[..lo].iter_mut().for_each(|x| *x = 0.0);
            row[hi..].iter_mut().for_each(|x| *x = 0.0);
            let sink = sinks.map(|s| s[h]);
            decode::softmax_scaled(&mut row[lo..hi], p.scale, p.softcap, sink);
        }
        gemm_into(
            &scores,
            &vt,
            rows,
            keys,
            hd,
            &mut out[i * rows * hd..(i + 1) * rows * hd],
            false,
        );
    }
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
            seqs in prop::collection::vec((0usize..40, 1usize..24), 1..5),
            block_size in 1usize..6,
            kv_heads in 1usize..4,
            group in 1usize..4,
            head_dim in 1usize..9,
            window in prop::option::of(1usize..12),
            softcap in prop::option::of(0.3f32..3.0),
            with_sinks in any::<bool>(),
            parts in 1usize..5,
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
                .map(|(i, (done, _))| SequenceChunk { tokens: &tokens[i], num_computed: *done, block_table: &tables[i], want_logits: true, all_logits: false })
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
            let p = AttentionParams { num_heads: heads, num_kv_heads: kv_heads, head_dim, scale: 0.7, window, softcap };
            // Sinks of about the scores' size, so they take a real share of each softmax.
            let sinks: Vec<f32> = rand_vec(heads, &mut s);
            let sinks = with_sinks.then_some(sinks.as_slice());
            let out = attention_in_parts(&q, &k_cache, &v_cache, &batch, &seq_of_token(&batch), &p, sinks, parts);

            let mut t = 0;
            for (i, (done, new)) in seqs.iter().enumerate() {
                for j in 0..*new {
                    let pos = done + j; // sees keys lo..=pos
                    let lo = (pos + 1).saturating_sub(window.unwrap_or(usize::MAX));
                    for h in 0..heads {
                        let qv = &q[(t * heads + h) * head_dim..][..head_dim];
                        let kh = h / group;
                        let row = |m: &Vec<f32>, p: usize| m[p * kv_dim + kh * head_dim..][..head_dim].to_vec();
                        let scores: Vec<f64> = (lo..=pos)
                            .map(|kp| {
                                let s = row(&dense_k[i], kp).iter().zip(qv).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * 0.7;
                                softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
                            })
                            .collect();
                        let sink = sinks.map(|s| s[h] as f64);
                        let max = scores.iter().cloned().fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
                        let w: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                        let total: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
                        for d in 0..head_dim {
                            let want: f64 = (lo..=pos).map(|kp| w[kp - lo] / total * row(&dense_v[i], kp)[d] as f64).sum();
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
