//! Attention over one part of the keys for a tile of query tokens, and a token's parts
//! combined. A part's keys are gathered from the paged cache once per tile and KV head (K
//! transposed, so a vector holds one dimension of `LANES` keys; V as rows), and every query
//! head of the group sharing that KV head reads them (SmolLM2: 3). Each score and each output
//! value is summed in one lane in a fixed order (over the dimensions, then over the keys), so
//! a token gets the same bits from a tile of one (decode) as from a tile of 128 (prefill).

use std::ops::Range;

use crate::isa::on_level;
use crate::ops::exp;

/// Keys or dimensions per vector of the kernels (512 bits; AVX2 takes two registers).
const LANES: usize = 16;

/// Query tokens whose scores are computed together, each key vector loaded once for all.
const ROW_BLOCK: usize = 4;

/// A sequence's keys for one KV head, through its block table.
pub(super) struct Source<'a> {
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    pub table: &'a [u32],
    pub block_size: usize,
    pub kv_dim: usize,
    /// Offset of the KV head inside a cache row.
    pub kv_off: usize,
    pub head_dim: usize,
}

/// The keys of one part, gathered in vectors of `LANES`: K as `[n_pad / LANES, head_dim,
/// LANES]` (a vector holds one dimension of `LANES` keys), V as `[hd_pad / LANES, n, LANES]` (a
/// vector holds `LANES` dimensions of one key), padded to whole vectors. Scratch reused across
/// parts.
#[derive(Default)]
pub(super) struct Gathered {
    k: Vec<f32>,
    v: Vec<f32>,
    n: usize,
    hd: usize,
}

impl Gathered {
    /// Gathers the keys at absolute positions `keys` of `src`.
    pub(super) fn fill(&mut self, src: &Source, keys: Range<usize>) {
        let hd = src.head_dim;
        let n = keys.len();
        let (n_pad, hd_pad) = (n.div_ceil(LANES) * LANES, hd.div_ceil(LANES) * LANES);
        // The padding keeps whatever it held: the lanes it fills are never read back.
        self.k.resize(n_pad * hd, 0.0);
        self.v.resize(hd_pad * n, 0.0);
        let bs = src.block_size;
        for (j, pos) in keys.enumerate() {
            // Position `block · bs` sits at slot `table[block] · bs`.
            let slot = src.table[pos / bs] as usize * bs + pos % bs;
            let at = slot * src.kv_dim + src.kv_off;
            let k_block = &mut self.k[j / LANES * hd * LANES..][..hd * LANES];
            for (d, &x) in src.k_cache[at..at + hd].iter().enumerate() {
                k_block[d * LANES + j % LANES] = x;
            }
            for (d, &x) in src.v_cache[at..at + hd].iter().enumerate() {
                self.v[(d / LANES * n + j) * LANES + d % LANES] = x;
            }
        }
        (self.n, self.hd) = (n, hd);
    }

    /// The keys, padded to whole vectors.
    fn n_pad(&self) -> usize {
        self.n.div_ceil(LANES) * LANES
    }

    /// Keys `j0..j0 + LANES`: `[head_dim, LANES]`.
    fn k_block(&self, j0: usize) -> &[f32] {
        &self.k[j0 * self.hd..][..self.hd * LANES]
    }

    /// Dimensions `d0..d0 + LANES` of keys `keys`: `[keys, LANES]`.
    fn v_block(&self, d0: usize, keys: Range<usize>) -> &[f32] {
        &self.v[d0 * self.n..][keys.start * LANES..keys.end * LANES]
    }
}

/// Floats of one token's result for one part (`attend`) with `group` query heads of `hd`.
pub(super) fn part_len(group: usize, hd: usize) -> usize {
    group * (hd + 2)
}

/// One query token of a tile: its queries `[group, hd]`, the keys of the part it sees
/// (`lo..hi`, counted from the part's first), and where its result goes (`part_len` floats):
/// per query head the largest (scaled, capped) score, then per head `Σ e^(score − max)`, then
/// per head `Σ e^(score − max) · v` (`[group, hd]`).
pub(super) struct Row<'a> {
    pub q: &'a [f32],
    pub keys: Range<usize>,
    pub out: &'a mut [f32],
}

/// How scores become weights: `e^(cap(s · scale) − max)`.
#[derive(Clone, Copy)]
pub(super) struct Scores {
    pub scale: f32,
    pub softcap: Option<f32>,
}

/// A thread's buffers for `attend`, reused across parts.
#[derive(Default)]
pub(super) struct Scratch {
    /// `[ROW_BLOCK, n_pad]`: a block's scores, then its weights.
    scores: Vec<f32>,
    /// The keys all rows of a block see: their weights side by side, `[keys, ROW_BLOCK]`.
    side_by_side: Vec<[f32; ROW_BLOCK]>,
}

/// Each row's attention over its keys of the gathered part, not yet normalized.
pub(super) fn attend(g: &Gathered, hd: usize, sc: Scores, rows: &mut [Row], scratch: &mut Scratch) {
    on_level!(
        (g: &Gathered, hd: usize, sc: Scores, rows: &mut [Row], scratch: &mut Scratch) -> (),
        attend_portable(g, hd, sc, rows, scratch)
    )
}

#[inline(always)]
fn attend_portable(g: &Gathered, hd: usize, sc: Scores, rows: &mut [Row], scratch: &mut Scratch) {
    let n_pad = g.n_pad();
    // Stale values may stay: every score a row reads is written first.
    scratch.scores.resize(ROW_BLOCK * n_pad, 0.0);
    let Scratch {
        scores: weights,
        side_by_side,
    } = scratch;
    for block in rows.chunks_mut(ROW_BLOCK) {
        let group = block[0].q.len() / hd;
        // The keys any row of the block sees, in whole vectors.
        let end = block.iter().map(|r| r.keys.end).max().unwrap_or(0);
        let end = end.div_ceil(LANES) * LANES;
        for i in 0..group {
            match block.len() {
                ROW_BLOCK => scores::<ROW_BLOCK>(g, hd, i, block, end, weights),
                _ => {
                    for (r, row) in block.iter().enumerate() {
                        let one = std::slice::from_ref(row);
                        scores::<1>(g, hd, i, one, end, &mut weights[r * n_pad..]);
                    }
                }
            }
            for (r, row) in block.iter_mut().enumerate() {
                let w = &mut weights[r * n_pad..][row.keys.clone()];
                let (max, sum) = exp_scaled(w, sc.scale, sc.softcap);
                row.out[i] = max;
                row.out[group + i] = sum;
            }
            weighted_values(g, hd, i, block, weights, side_by_side);
        }
    }
}

/// `scores[r, j] = q_r · k_j` for query head `i` of the `R` rows and keys `0..end` (a whole
/// number of vectors), summed over the dimensions in order in each lane.
#[inline(always)]
fn scores<const R: usize>(
    g: &Gathered,
    hd: usize,
    i: usize,
    rows: &[Row],
    end: usize,
    scores: &mut [f32],
) {
    let n_pad = g.n_pad();
    let qs: [&[f32]; R] = std::array::from_fn(|r| &rows[r].q[i * hd..(i + 1) * hd]);
    for j0 in (0..end).step_by(LANES) {
        let mut acc = [[0f32; LANES]; R];
        for (d, k) in g.k_block(j0).chunks_exact(LANES).enumerate() {
            for (acc, q) in acc.iter_mut().zip(&qs) {
                let q = q[d];
                for (a, &k) in acc.iter_mut().zip(k) {
                    *a = q.mul_add(k, *a);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            scores[r * n_pad + j0..][..LANES].copy_from_slice(acc);
        }
    }
}

/// `out_r = Σ_j w_rj · v_j` for query head `i` of each row over its own keys, the weights
/// `w_r` in `weights[r · n_pad..]`, summed over the keys in order in each lane. The keys all
/// rows of a block of `ROW_BLOCK` see are summed for them together (each value vector loaded
/// once, their weights from `side_by_side`); a row's keys before and after those, on its own,
/// in the same order.
#[inline(always)]
fn weighted_values(
    g: &Gathered,
    hd: usize,
    i: usize,
    rows: &mut [Row],
    weights: &[f32],
    side_by_side: &mut Vec<[f32; ROW_BLOCK]>,
) {
    let n_pad = g.n_pad();
    let group = rows[0].q.len() / hd;
    let common = rows.iter().map(|r| r.keys.start).max().unwrap_or(0)
        ..rows.iter().map(|r| r.keys.end).min().unwrap_or(0);
    let ws = |r: usize| &weights[r * n_pad..][..n_pad];
    let together = rows.len() == ROW_BLOCK && !common.is_empty();
    // The common keys' weights side by side: one stream for the loop.
    side_by_side.clear();
    if together {
        side_by_side.extend(common.clone().map(|j| std::array::from_fn(|r| ws(r)[j])));
    }
    for d0 in (0..hd).step_by(LANES) {
        let mut acc = [[0f32; LANES]; ROW_BLOCK];
        if together {
            for (r, row) in rows.iter().enumerate() {
                alone(g, d0, &mut acc[r], ws(r), row.keys.start..common.start);
            }
            let values = g.v_block(d0, common.clone()).chunks_exact(LANES);
            let mut block = acc;
            for (v, w) in values.zip(side_by_side.iter()) {
                for (acc, &w) in block.iter_mut().zip(w) {
                    *acc = fma(w, v, *acc);
                }
            }
            acc = block;
            for (r, row) in rows.iter().enumerate() {
                alone(g, d0, &mut acc[r], ws(r), common.end..row.keys.end);
            }
        } else {
            for (r, row) in rows.iter().enumerate() {
                alone(g, d0, &mut acc[r], ws(r), row.keys.clone());
            }
        }
        let n = (hd - d0).min(LANES);
        for (row, acc) in rows.iter_mut().zip(&acc) {
            row.out[2 * group + i * hd + d0..][..n].copy_from_slice(&acc[..n]);
        }
    }
}

/// One row's keys on their own: `acc += Σ_j w_j · v_j[d0..d0 + LANES]` over `keys`, in order.
/// A function, not a closure: a closure's body would be compiled without the level's features.
#[inline(always)]
fn alone(g: &Gathered, d0: usize, acc: &mut [f32; LANES], w: &[f32], keys: Range<usize>) {
    // The accumulator moved in and out by value, so that the loop keeps it in registers.
    let mut sum = *acc;
    let values = g.v_block(d0, keys.clone()).chunks_exact(LANES);
    for (v, &w) in values.zip(&w[keys]) {
        sum = fma(w, v, sum);
    }
    *acc = sum;
}

/// `acc + w · v` in each lane (one rounding).
#[inline(always)]
fn fma(w: f32, v: &[f32], mut acc: [f32; LANES]) -> [f32; LANES] {
    for (a, &v) in acc.iter_mut().zip(v) {
        *a = w.mul_add(v, *a);
    }
    acc
}

/// `row = e^(cap(row · scale) − max)` in place; returns the max and the sum of the row.
#[inline(always)]
fn exp_scaled(row: &mut [f32], scale: f32, softcap: Option<f32>) -> (f32, f32) {
    match softcap {
        Some(c) => row
            .iter_mut()
            .for_each(|x| *x = c * (*x * scale / c).tanh()),
        None => row.iter_mut().for_each(|x| *x *= scale),
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for x in row.iter_mut() {
        *x = exp(*x - max);
    }
    (max, sum_lanes(row))
}

/// The sum in eight partial sums: a sequential sum would not vectorize (float addition order).
#[inline(always)]
fn sum_lanes(row: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = row.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The normalized attention of a token's parts (`attend` results over disjoint keys, in
/// order, together all it sees), each query head's `sinks` logit in the denominator: each part
/// rescaled by `e^(its max − the overall max)`. `out` is `[group, hd]`.
pub(super) fn combine(parts: &[&[f32]], hd: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    on_level!(
        (parts: &[&[f32]], hd: usize, sinks: Option<&[f32]>, out: &mut [f32]) -> (),
        combine_portable(parts, hd, sinks, out)
    )
}

#[inline(always)]
fn combine_portable(parts: &[&[f32]], hd: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    let group = out.len() / hd;
    for (i, o) in out.chunks_exact_mut(hd).enumerate() {
        let sink = sinks.map(|s| s[i]);
        let max = parts
            .iter()
            .map(|p| p[i])
            .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
        // The library exp: a sink of -inf (none, in effect) or an empty part gives exactly 0.
        let mut total = sink.map_or(0.0, |s| (s - max).exp());
        o.fill(0.0);
        for p in parts {
            let w = (p[i] - max).exp();
            if w == 0.0 {
                continue;
            }
            total += w * p[group + i];
            let values = &p[2 * group + i * hd..][..hd];
            for (acc, &v) in o.iter_mut().zip(values) {
                *acc = w.mul_add(v, *acc);
            }
        }
        let inv = 1.0 / total;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}
