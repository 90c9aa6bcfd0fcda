//! Decode attention: one query token against its sequence's cached keys, for the `group` query
//! heads that share a KV head at once, so each key and value row is read from the cache once
//! per group instead of once per head (SmolLM2: 3 heads per KV head).

use crate::matmul::dot_portable;

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

impl Keys<'_> {
    /// Where key (and value) `j` starts in the caches.
    #[inline(always)]
    fn at(&self, j: usize) -> usize {
        let slot = self.table[j / self.block_size] as usize * self.block_size + j % self.block_size;
        slot * self.kv_dim + self.kv_off
    }
}

/// `row = softmax(cap(row · scale))` in place, `cap` the optional soft-cap
/// `c · tanh(s / c)`; a `sink` logit joins the denominator only.
#[inline(always)]
pub(super) fn softmax_scaled(row: &mut [f32], scale: f32, softcap: Option<f32>, sink: Option<f32>) {
    match softcap {
        Some(c) => row
            .iter_mut()
            .for_each(|x| *x = c * (*x * scale / c).tanh()),
        None => row.iter_mut().for_each(|x| *x *= scale),
    }
    let max = row
        .iter()
        .copied()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    let mut total = sink.map_or(0.0, |s| (s - max).exp());
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        total += *x;
    }
    let inv = 1.0 / total;
    row.iter_mut().for_each(|x| *x *= inv);
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
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::Isa::current().has_avx512() {
            // SAFETY: the level in use has AVX-512F, and this CPU runs it (`Isa::current`).
            return unsafe { attend_avx512(q, keys, hd, sm, scores, out) };
        }
        if crate::isa::Isa::current().has_avx2() {
            // SAFETY: the level in use has AVX2 and FMA, and this CPU runs it (`Isa::current`).
            return unsafe { attend_avx2(q, keys, hd, sm, scores, out) };
        }
    }
    attend_portable(q, keys, hd, sm, scores, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn attend_avx512(q: &[f32], keys: &Keys, hd: usize, sm: &Softmax, s: &mut Vec<f32>, o: &mut [f32]) {
    attend_portable(q, keys, hd, sm, s, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn attend_avx2(q: &[f32], keys: &Keys, hd: usize, sm: &Softmax, s: &mut Vec<f32>, o: &mut [f32]) {
    attend_portable(q, keys, hd, sm, s, o)
}

#[inline(always)]
fn attend_portable(
    q: &[f32],
    keys: &Keys,
    hd: usize,
    sm: &Softmax,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let group = q.len() / hd;
    let first = keys.visible.saturating_sub(keys.window);
    let n = keys.visible - first;
    // Scores as [group, keys].
    scores.clear();
    scores.resize(group * n, 0.0);
    for j in 0..n {
        let k = &keys.k_cache[keys.at(first + j)..][..hd];
        for (i, qi) in q.chunks_exact(hd).enumerate() {
            scores[i * n + j] = dot_portable(qi, k);
        }
    }
    for (i, row) in scores.chunks_exact_mut(n.max(1)).enumerate() {
        softmax_scaled(row, sm.scale, sm.softcap, sm.sinks.map(|s| s[i]));
    }
    out.fill(0.0);
    for j in 0..n {
        let v = &keys.v_cache[keys.at(first + j)..][..hd];
        for (i, oi) in out.chunks_exact_mut(hd).enumerate() {
            let w = scores[i * n + j];
            for (acc, &vv) in oi.iter_mut().zip(v) {
                *acc = w.mul_add(vv, *acc);
            }
        }
    }
}
