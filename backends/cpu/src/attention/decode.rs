//! Decode attention: one query token against its sequence's cached keys, for the `group` query
//! heads that share a KV head at once, so each key and value row is read from the cache once
//! per group instead of once per head (SmolLM2: 3 heads per KV head).

use crate::isa::on_level;
use crate::matmul::dot_portable;
use crate::ops::exp;

/// Where one token's attention reads: its sequence's keys through the block table.
pub(super) struct Keys<'a> {
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    pub table: &'a [u32],
    pub block_size: usize,
    pub kv_dim: usize,
    /// Offset of the KV head inside a cache row.
    pub kv_off: usize,
    /// Keys up to and including this token's own.
    pub visible: usize,
    /// It sees only the last `window` of them (`usize::MAX`: all).
    pub window: usize,
}

/// `row = softmax(cap(row · scale))` in place, `cap` the optional soft-cap
/// `c · tanh(s / c)`; a `sink` logit joins the denominator only.
pub(super) fn softmax_scaled(row: &mut [f32], scale: f32, softcap: Option<f32>, sink: Option<f32>) {
    on_level!(
        (row: &mut [f32], scale: f32, softcap: Option<f32>, sink: Option<f32>) -> (),
        {
            let (max, sum) = exp_scaled(row, scale, softcap);
            // As `combine` does for a part: the row rescaled to the larger of its max and the
            // sink's (library `exp`: a sink of -inf gives exactly 0).
            let top = sink.map_or(max, |s| s.max(max));
            let rescale = (max - top).exp();
            let total = sum * rescale + sink.map_or(0.0, |s| (s - top).exp());
            let factor = rescale / total;
            row.iter_mut().for_each(|x| *x *= factor);
        }
    )
}

/// How a group's scores become weights: `softmax(cap(s · scale))`, each query head's sink
/// in its denominator.
#[derive(Clone, Copy)]
pub(super) struct Softmax<'a> {
    pub scale: f32,
    pub softcap: Option<f32>,
    /// One per query head of the group.
    pub sinks: Option<&'a [f32]>,
}

/// A group's attention over a part of its keys, not yet normalized: per query head the
/// largest (scaled, capped) score, `Σ e^(score − max)` and `Σ e^(score − max) · v`. Parts of
/// one token's keys computed on different threads combine exactly (`combine`), so a single
/// long sequence is not held to one thread per KV head.
pub(super) struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[group, hd]`.
    out: Vec<f32>,
}

/// `out [group, hd]` = softmax(q·Kᵀ · scale) · V for the `group` queries `q [group, hd]`;
/// `scores` is scratch.
pub(super) fn attend(
    q: &[f32],
    keys: &Keys,
    hd: usize,
    sm: &Softmax,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let whole = attend_part(q, keys, hd, sm, 0..keys.seen(), scores);
    combine(&[&whole], hd, sm.sinks, out);
}

/// The `Partial` of keys `range` of those `keys` shows this token (0 is the first it sees).
pub(super) fn attend_part(
    q: &[f32],
    keys: &Keys,
    hd: usize,
    sm: &Softmax,
    range: std::ops::Range<usize>,
    scores: &mut Vec<f32>,
) -> Partial {
    on_level!(
        (q: &[f32], keys: &Keys, hd: usize, sm: &Softmax, range: std::ops::Range<usize>,
         scores: &mut Vec<f32>) -> Partial,
        part_portable(q, keys, hd, sm, range, scores)
    )
}

impl Keys<'_> {
    /// How many keys this token sees.
    pub(super) fn seen(&self) -> usize {
        self.visible - self.first()
    }

    fn first(&self) -> usize {
        self.visible.saturating_sub(self.window)
    }

    /// Keys `range` (counted from the first seen) as runs of consecutive cache slots, one per
    /// block they touch: `(first key's index, its offset in the caches, keys in the run)`.
    /// Callers loop over a run's keys themselves (a closure's body is compiled once, outside
    /// the per-level copies of its caller) and find none of them by division.
    fn runs(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let (first, bs) = (self.first(), self.block_size);
        let (lo, hi) = (first + range.start, first + range.end);
        let mut p = lo;
        std::iter::from_fn(move || {
            if p >= hi {
                return None;
            }
            let block = p / bs;
            let end = ((block + 1) * bs).min(hi);
            // Position `block · bs` sits at slot `table[block] · bs`.
            let slot = self.table[block] as usize * bs + (p - block * bs);
            let run = (p - first, slot * self.kv_dim + self.kv_off, end - p);
            p = end;
            Some(run)
        })
    }
}

#[inline(always)]
fn part_portable(
    q: &[f32],
    keys: &Keys,
    hd: usize,
    sm: &Softmax,
    range: std::ops::Range<usize>,
    scores: &mut Vec<f32>,
) -> Partial {
    let group = q.len() / hd;
    let (start, n) = (range.start, range.len());
    // Scores as [group, keys of the part].
    scores.clear();
    scores.resize(group * n, 0.0);
    for (j0, at0, len) in keys.runs(range.clone()) {
        for r in 0..len {
            let k = &keys.k_cache[at0 + r * keys.kv_dim..][..hd];
            for (i, qi) in q.chunks_exact(hd).enumerate() {
                scores[i * n + j0 + r - start] = dot_portable(qi, k);
            }
        }
    }
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut sum = vec![0f32; group];
    for ((row, m), total) in scores
        .chunks_exact_mut(n.max(1))
        .zip(&mut max)
        .zip(&mut sum)
    {
        (*m, *total) = exp_scaled(row, sm.scale, sm.softcap);
    }
    let mut out = vec![0f32; group * hd];
    for (j0, at0, len) in keys.runs(range) {
        for r in 0..len {
            let v = &keys.v_cache[at0 + r * keys.kv_dim..][..hd];
            for (i, oi) in out.chunks_exact_mut(hd).enumerate() {
                let w = scores[i * n + j0 + r - start];
                for (acc, &vv) in oi.iter_mut().zip(v) {
                    *acc = w.mul_add(vv, *acc);
                }
            }
        }
    }
    Partial { max, sum, out }
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

/// The normalized attention of a token's parts (over disjoint keys, together all it sees),
/// each query head's `sinks` logit in the denominator: each part rescaled by `e^(its max −
/// the overall max)`.
pub(super) fn combine(parts: &[&Partial], hd: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    for (i, o) in out.chunks_exact_mut(hd).enumerate() {
        let sink = sinks.map(|s| s[i]);
        let max = parts
            .iter()
            .map(|p| p.max[i])
            .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
        // The library exp: a sink of -inf (none, in effect) or an empty part gives exactly 0.
        let mut total = sink.map_or(0.0, |s| (s - max).exp());
        o.fill(0.0);
        for p in parts {
            let w = (p.max[i] - max).exp();
            if w == 0.0 {
                continue;
            }
            total += w * p.sum[i];
            for (acc, &v) in o.iter_mut().zip(&p.out[i * hd..(i + 1) * hd]) {
                *acc = w.mul_add(v, *acc);
            }
        }
        let inv = 1.0 / total;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Softmax rows sum to one, in the order of their scores, on every level's compilation
    /// (the dispatch picks the level this CPU runs).
    #[test]
    fn softmax_rows_sum_to_one_and_match_float64() {
        for n in [1, 7, 8, 9, 33, 300] {
            let row: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
                .collect();
            let mut got = row.clone();
            softmax_scaled(&mut got, 0.5, None, Some(1.5));
            let max = row.iter().fold(1.5f64, |m, &x| m.max(x as f64 * 0.5));
            let total: f64 = row
                .iter()
                .map(|&x| (x as f64 * 0.5 - max).exp())
                .sum::<f64>()
                + (1.5 - max).exp();
            for (g, &x) in got.iter().zip(&row) {
                let want = (x as f64 * 0.5 - max).exp() / total;
                assert!(
                    (*g as f64 - want).abs() < 1e-6 * want.max(1e-3),
                    "n {n}: {g} vs {want}"
                );
            }
        }
    }
}
