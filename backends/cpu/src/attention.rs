//! Paged attention on the CPU. The cache of each layer is `[num_blocks, block_size, kv_heads,
//! head_dim]` for K and for V; tokens find their keys through their sequence's block table.

use std::ops::Range;

use infer_core::{AttentionParams, BatchInput};
use rayon::prelude::*;

use parts::{attend, combine, part_len, Gathered, Row, Scores, Scratch, Source};

mod parts;

/// Writes each token's K/V row at its slot.
pub fn write_kv(cache: &mut [f32], rows: &[f32], slot_mapping: &[u32], kv_dim: usize) {
    for (row, &slot) in rows.chunks_exact(kv_dim).zip(slot_mapping) {
        let at = slot as usize * kv_dim;
        cache[at..at + kv_dim].copy_from_slice(row);
    }
}

/// Keys per part of a token's attention. Every token, decode or prefill, sums its keys in the
/// same parts, cut at absolute positions `[i · PART_KEYS, (i + 1) · PART_KEYS)`, and combines
/// them in order: its result then does not depend on the batch it came in, on how its prompt
/// was chunked or on how many threads ran, bit for bit (with the matmuls' own invariance, a
/// seeded request draws the same tokens alone and under load). The parts also spread one long
/// stream's decode over the threads. Tests use tiny parts so their short contexts span several.
const PART_KEYS: usize = if cfg!(test) { 3 } else { 256 };

/// Query tokens of one sequence whose parts run next to each other, so that a part's keys come
/// from memory once for all of them (128 tokens' queries and 256 keys of a KV head: ~250 KB for
/// SmolLM2). Tests use small tiles so their short runs span several.
const QUERY_TILE: usize = if cfg!(test) { 5 } else { 128 };

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
    let (hd, kv_heads) = (p.head_dim, p.num_kv_heads);
    let group = p.num_heads / kv_heads;
    let window = p.window.unwrap_or(usize::MAX);
    // The keys token `t` sees: up to itself (later tokens of its run are masked), within the
    // window.
    let seen = |t: usize| {
        let s = seq_of[t];
        let visible = batch.context_lens[s] as usize - (batch.query_start[s + 1] as usize - 1 - t);
        visible.saturating_sub(window)..visible
    };
    let parts_of = |keys: Range<usize>| keys.start / PART_KEYS..keys.end.div_ceil(PART_KEYS);
    // A task is one token's group of query heads sharing a KV head, `idx = token · kv_heads +
    // kv head`: its output is `out[idx · group · hd..][..group · hd]`, its parts' results the
    // slots `slot_of[first[idx]..first[idx + 1]]`, in order.
    let tasks = seq_of.len() * kv_heads;
    let mut first = Vec::with_capacity(tasks + 1);
    first.push(0);
    for idx in 0..tasks {
        first.push(first[idx] + parts_of(seen(idx / kv_heads)).len());
    }
    let mut slot_of = vec![0usize; first[tasks]];
    // Jobs `(sequence, KV head, part, tokens)`, in slot order: for each tile of a sequence's
    // query tokens and part of the keys, the tile's tokens that see some of the part
    // (consecutive: later tokens see later keys), once per KV head.
    let mut jobs: Vec<(usize, usize, usize, Range<usize>)> = Vec::new();
    let mut slots = 0;
    for s in 0..batch.num_seqs() {
        let run = batch.query_start[s] as usize..batch.query_start[s + 1] as usize;
        for t0 in run.clone().step_by(QUERY_TILE) {
            let tile = t0..(t0 + QUERY_TILE).min(run.end);
            for part in parts_of(seen(tile.start).start..seen(tile.end - 1).end) {
                let sees = |t: &usize| parts_of(seen(*t)).contains(&part);
                let from = tile.clone().find(sees).unwrap_or(tile.end);
                let to = (from..tile.end).find(|t| !sees(t)).unwrap_or(tile.end);
                let rows = from..to;
                if rows.is_empty() {
                    continue;
                }
                for g in 0..kv_heads {
                    for t in rows.clone() {
                        let idx = t * kv_heads + g;
                        slot_of[first[idx] + part - parts_of(seen(t)).start] = slots;
                        slots += 1;
                    }
                    jobs.push((s, g, part, rows.clone()));
                }
            }
        }
    }
    let len = part_len(group, hd);
    let mut partials = vec![0f32; slots * len];
    // Each job's slots, as its own slice for the parallel loop.
    let mut outs = Vec::with_capacity(jobs.len());
    let mut rest = &mut partials[..];
    for (.., rows) in &jobs {
        let (mine, after) = rest.split_at_mut(rows.len() * len);
        outs.push(mine);
        rest = after;
    }
    let sc = Scores {
        scale: p.scale,
        softcap: p.softcap,
    };
    jobs.par_iter().zip(outs).for_each_init(
        || (Gathered::default(), Scratch::default()),
        |(gathered, scratch), ((s, g, part, rows), out)| {
            let src = Source {
                k_cache,
                v_cache,
                table: batch.block_table(*s),
                block_size: batch.block_size,
                kv_dim: kv_heads * hd,
                kv_off: g * hd,
                head_dim: hd,
            };
            // The part's keys that any of the rows sees.
            let lo = (part * PART_KEYS).max(seen(rows.start).start);
            let hi = ((part + 1) * PART_KEYS).min(seen(rows.end - 1).end);
            gathered.fill(&src, lo..hi);
            let mut rows: Vec<Row> = rows
                .clone()
                .zip(out.chunks_exact_mut(len))
                .map(|(t, out)| {
                    let keys = seen(t);
                    let mine = keys.start.max(lo) - lo..keys.end.min(hi) - lo;
                    let idx = t * kv_heads + g;
                    Row {
                        q: &q[idx * group * hd..][..group * hd],
                        keys: mine,
                        out,
                    }
                })
                .collect();
            attend(gathered, hd, sc, &mut rows, scratch);
        },
    );
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(group * hd)
        .enumerate()
        .for_each_init(Vec::new, |own, (idx, o)| {
            own.clear();
            let slots = &slot_of[first[idx]..first[idx + 1]];
            own.extend(slots.iter().map(|&j| &partials[j * len..(j + 1) * len]));
            let g = idx % kv_heads;
            combine(own, hd, sinks.map(|s| &s[g * group..(g + 1) * group]), o);
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
            seqs in prop::collection::vec((0usize..40, 1usize..24), 1..5),
            block_size in 1usize..6,
            kv_heads in 1usize..4,
            group in 1usize..4,
            head_dim in 1usize..9,
            window in prop::option::of(1usize..12),
            softcap in prop::option::of(0.3f32..3.0),
            with_sinks in any::<bool>(),
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
            let out = paged_attention(&q, &k_cache, &v_cache, &batch, &seq_of_token(&batch), &p, sinks);

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

    /// A token's attention is the same bits whether its sequence's tokens came in one prefill
    /// chunk, one at a time (decode), or in two chunks batched with another sequence (a
    /// continuous batch under load), with a sliding window, soft-cap and sinks or without.
    #[test]
    fn a_token_gets_the_same_bits_however_it_is_batched() {
        let (len, block_size, kv_heads, group, hd) = (23usize, 4usize, 2, 3, 8);
        let (heads, kv_dim) = (kv_heads * group, kv_heads * hd);
        let mut s = 7u64;
        let table: Vec<u32> = (0..len.div_ceil(block_size) as u32).rev().collect();
        let other_table = vec![table.len() as u32];
        let num_blocks = table.len() + 1;
        let k_cache = rand_vec(num_blocks * block_size * kv_dim, &mut s);
        let v_cache = rand_vec(num_blocks * block_size * kv_dim, &mut s);
        // One query row per position, whichever batch computes it.
        let q = rand_vec(len * heads * hd, &mut s);
        let other_q = rand_vec(3 * heads * hd, &mut s);
        let sinks = rand_vec(heads, &mut s);
        for (window, softcap, sinks) in [(None, None, None), (Some(6), Some(1.5), Some(&sinks[..]))]
        {
            let p = AttentionParams {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: hd,
                scale: 0.4,
                window,
                softcap,
            };
            let tokens = vec![0u32; len];
            // Positions `from..to` of the sequence, after `other` tokens of a second sequence.
            let run = |cuts: &[(usize, usize)], other: usize| -> Vec<f32> {
                let mut out = Vec::new();
                for &(from, to) in cuts {
                    let mut chunks = Vec::new();
                    let other_tokens = vec![0u32; other];
                    if other > 0 {
                        chunks.push(SequenceChunk {
                            tokens: &other_tokens,
                            num_computed: 0,
                            block_table: &other_table,
                            want_logits: true,
                            all_logits: false,
                        });
                    }
                    chunks.push(SequenceChunk {
                        tokens: &tokens[from..to],
                        num_computed: from,
                        block_table: &table,
                        want_logits: true,
                        all_logits: false,
                    });
                    let batch = BatchInput::build(&chunks, block_size).unwrap();
                    let rows = [
                        &other_q[..other * heads * hd],
                        &q[from * heads * hd..to * heads * hd],
                    ]
                    .concat();
                    let got = paged_attention(
                        &rows,
                        &k_cache,
                        &v_cache,
                        &batch,
                        &seq_of_token(&batch),
                        &p,
                        sinks,
                    );
                    out.extend_from_slice(&got[other * heads * hd..]);
                }
                out
            };
            let whole = run(&[(0, len)], 0);
            let one_by_one: Vec<(usize, usize)> = (0..len).map(|t| (t, t + 1)).collect();
            for (what, got) in [
                ("one at a time", run(&one_by_one, 0)),
                ("in two chunks beside another", run(&[(0, 9), (9, len)], 3)),
            ] {
                for (j, (a, b)) in whole.iter().zip(&got).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{what}, window {window:?}: value {j}: {b} vs {a} in one chunk"
                    );
                }
            }
        }
    }
}
