//! The batch sampler: one call per engine step over every row that samples. Each stage is one
//! pass over the rows that need it (penalties, then bias and bans, then the structured-output
//! mask, then log-probabilities, then greedy or random draws), rows in parallel; no stage runs
//! for a row that does not need it, so a greedy batch costs one max-and-find pass per row.
//!
//! Draws are inverse-CDF over the kept tokens with a uniform the caller supplies: a request's
//! seeded generator feeds exactly one uniform per drawn token, so its output does not depend on
//! what else is in the batch.

use std::cell::RefCell;
use std::collections::HashMap;

use rayon::prelude::*;

use super::math::{argmax, log_sum_exp, max, top_n};
use super::params::SamplingParams;
use super::structured::apply_mask;
use crate::narrow::{f32_of, u32_index};
use llguidance::toktrie::SimpleVob;

/// One logits row and what to do with it.
pub struct SamplerRow<'a> {
    /// Modified in place (penalties, bias, bans).
    pub logits: &'a mut [f32],
    pub params: &'a SamplingParams,
    /// Prompt and output so far, for the penalties.
    pub prompt: &'a [u32],
    pub output: &'a [u32],
    /// One uniform in [0, 1) per token to draw (greedy rows: the count is what matters).
    pub uniforms: &'a [f64],
    /// Token ids that may not come next (EOS and stop tokens before `min_tokens`).
    pub banned: &'a [u32],
    /// How many of the most likely tokens to report with their log-probabilities.
    pub num_top: usize,
    /// Structured outputs: the only tokens that may come next.
    pub allowed: Option<&'a SimpleVob>,
    /// Speculative decoding: the proposed token this row verifies. Greedy rows take the
    /// argmax as always (the proposal stands if it is the argmax); random rows accept it with
    /// probability min(1, p/q) using `uniforms[0]` and otherwise draw from the residual
    /// max(0, p − q) using `uniforms[1]` (rejection sampling), so the token is distributed
    /// exactly as a plain draw.
    pub proposal: Option<u32>,
    /// The distribution q the proposal was drawn from (`None`: deterministic, q one-hot).
    pub proposal_probs: Option<&'a [f32]>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub token: u32,
    /// Log-probability under the processed logits (penalties and bias applied, before
    /// temperature and truncation), when the request tracks them.
    pub logprob: Option<f32>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampledRow {
    pub samples: Vec<Sample>,
    /// The `num_top` most likely tokens, most likely first, with log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// Samples every row; results in row order.
pub fn sample_batch(rows: &mut [SamplerRow]) -> Vec<SampledRow> {
    rows.par_iter_mut()
        .filter(|r| r.params.has_penalties())
        .for_each(|r| apply_penalties(r.logits, r.params, r.prompt, r.output));
    rows.par_iter_mut()
        .filter(|r| {
            !r.params.logit_bias.is_empty()
                || !r.banned.is_empty()
                || r.params.allowed_token_ids.is_some()
        })
        .for_each(|r| apply_bias_and_bans(r.logits, r.params, r.banned));
    rows.par_iter_mut()
        .filter_map(|r| Some((r.allowed?, &mut *r.logits)))
        .for_each(|(allowed, logits)| apply_mask(logits, allowed));
    rows.par_iter()
        .map(|r| {
            let lse = (r.params.needs_logprobs() || r.num_top > 0).then(|| log_sum_exp(r.logits));
            let top = match lse {
                Some(lse) => top_n(r.logits, r.num_top)
                    .into_iter()
                    .map(|(t, l)| (t, l - lse))
                    .collect(),
                None => Vec::new(),
            };
            let tokens = if r.params.is_greedy() {
                vec![argmax(r.logits); r.uniforms.len()]
            } else if let Some(x) = r.proposal {
                let q = r.proposal_probs;
                vec![verify_proposal(r.logits, r.params, x, q, r.uniforms)]
            } else {
                draw(r.logits, r.params, r.uniforms)
            };
            let samples = tokens
                .into_iter()
                .map(|token| Sample {
                    token,
                    logprob: lse.map(|lse| r.logits[token as usize] - lse),
                })
                .collect();
            SampledRow { samples, top }
        })
        .collect()
}

/// Repetition penalty over prompt and output tokens (CTRL: positive logits divided, negative
/// multiplied); presence and frequency penalties over output tokens (OpenAI's formula).
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, prompt: &[u32], output: &[u32]) {
    if p.repetition_penalty != 1.0 {
        let mut seen: Vec<u32> = prompt.iter().chain(output).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        let r = p.repetition_penalty;
        for t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / r } else { *l * r };
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.frequency_penalty * c as f32 + p.presence_penalty;
            }
        }
    }
}

fn apply_bias_and_bans(logits: &mut [f32], p: &SamplingParams, banned: &[u32]) {
    for (&t, &b) in &p.logit_bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
    for &t in banned {
        if let Some(l) = logits.get_mut(t as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    if let Some(allowed) = &p.allowed_token_ids {
        let kept: Vec<(usize, f32)> = allowed
            .iter()
            .filter_map(|&t| Some((t as usize, *logits.get(t as usize)?)))
            .collect();
        logits.fill(f32::NEG_INFINITY);
        for (t, l) in kept {
            logits[t] = l;
        }
    }
}

thread_local! {
    /// The row's sampling weights, reused across rows.
    static WEIGHTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Draws `uniforms.len()` tokens at the row's temperature after min-p, top-k and top-p (in
/// vLLM's order). Weights are `exp((logit - max) / T)`, so the most likely token weighs 1;
/// each filter zeroes weights below a threshold, which keeps tied tokens together.
fn draw(logits: &[f32], p: &SamplingParams, uniforms: &[f64]) -> Vec<u32> {
    if uniforms.is_empty() {
        return Vec::new();
    }
    let m = max(logits);
    if !m.is_finite() {
        // Everything masked: nothing to draw from but the first token.
        return vec![argmax(logits); uniforms.len()];
    }
    WEIGHTS.with_borrow_mut(|w| {
        let total = sampling_weights(logits, m, p, w);
        uniforms.iter().map(|&u| find_mass(w, u * total)).collect()
    })
}

/// The weights a draw samples from (min-p, top-k and top-p applied) and their total.
fn sampling_weights(logits: &[f32], max: f32, p: &SamplingParams, w: &mut Vec<f32>) -> f64 {
    w.resize(logits.len(), 0.0);
    kernels::weights(logits, max, 1.0 / p.temperature, p.min_p, w);
    if p.top_k > 0 && p.top_k < w.len() {
        let kth = kth_largest(w, p.top_k);
        kernels::zero_below(w, kth);
    }
    if p.top_p < 1.0 {
        let cut = top_p_cutoff(w, p.top_p as f64);
        kernels::zero_below(w, cut);
    }
    kernels::sum(w)
}

/// Rejection sampling of a proposal `x` drawn from `q`: kept with probability
/// min(1, p(x)/q(x)) (uniform `u[0]`), else a draw from max(0, p − q) renormalized (`u[1]`).
/// Then P(y) = min(p, q)(y) + (1 − Σ min(p, q)) · (p − q)⁺(y) / Σ (p − q)⁺ = p(y), since
/// Σ (p − q)⁺ = 1 − Σ min(p, q). A deterministic proposal has q one-hot on x: kept with
/// probability p(x), else drawn from p without x.
fn verify_proposal(
    logits: &[f32],
    p: &SamplingParams,
    x: u32,
    q: Option<&[f32]>,
    u: &[f64],
) -> u32 {
    let (u_accept, u_draw) = (
        u.first().copied().unwrap_or(0.0),
        u.get(1).copied().unwrap_or(0.0),
    );
    let m = max(logits);
    if !m.is_finite() {
        return argmax(logits);
    }
    WEIGHTS.with_borrow_mut(|w| {
        let total = sampling_weights(logits, m, p, w);
        let wx = w.get(x as usize).copied().unwrap_or(0.0) as f64;
        // Weights are p scaled by `total`: compare p(x) with u q(x) in the same scale.
        let qx = q.map_or(1.0, |q| q.get(x as usize).copied().unwrap_or(0.0) as f64);
        if u_accept * qx * total < wx {
            return x;
        }
        // The residual (p - q)+, scaled by `total`.
        match q {
            None => {
                if let Some(slot) = w.get_mut(x as usize) {
                    *slot = 0.0;
                }
            }
            Some(q) => {
                let scale = f32_of(total);
                for (wy, &qy) in w.iter_mut().zip(q) {
                    *wy = (*wy - qy * scale).max(0.0);
                }
            }
        }
        let rest = kernels::sum(w);
        if rest <= 0.0 {
            return x;
        }
        find_mass(w, u_draw * rest)
    })
}

/// The `k`-th largest weight.
fn kth_largest(w: &[f32], k: usize) -> f32 {
    if k <= 64 {
        return top_n(w, k).last().map_or(0.0, |t| t.1);
    }
    let mut copy = w.to_vec();
    let (_, kth, _) = copy.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// The weight at which the heaviest tokens first reach `top_p` of the total mass: one pass
/// sums the weights into 1024 logarithmic buckets (exponent and 3 mantissa bits), then only
/// the bucket where the mass is reached is sorted.
fn top_p_cutoff(w: &[f32], top_p: f64) -> f32 {
    const BUCKETS: usize = 1024;
    // Weights are in [0, 1]: this key grows as the weight shrinks, 0 for weight 1.
    let key =
        |x: f32| (((0x3F80_0000 - x.to_bits().min(0x3F80_0000)) >> 20) as usize).min(BUCKETS - 1);
    let mut mass = [0f64; BUCKETS];
    for &x in w {
        if x > 0.0 {
            mass[key(x)] += x as f64;
        }
    }
    let target = top_p * mass.iter().sum::<f64>();
    let mut before = 0.0;
    let Some(b) = (0..BUCKETS).find(|&b| {
        let reached = before + mass[b] >= target;
        if !reached {
            before += mass[b];
        }
        reached
    }) else {
        return 0.0;
    };
    let mut bucket: Vec<f32> = w
        .iter()
        .copied()
        .filter(|&x| x > 0.0 && key(x) == b)
        .collect();
    bucket.sort_unstable_by(|a, b| b.total_cmp(a));
    let mut sum = before;
    for &x in &bucket {
        sum += x as f64;
        if sum >= target {
            return x;
        }
    }
    bucket.last().copied().unwrap_or(0.0)
}

/// The first token whose cumulative weight passes `target`: block sums first, then one block.
fn find_mass(w: &[f32], target: f64) -> u32 {
    const BLOCK: usize = 256;
    let mut acc = 0f64;
    for (b, chunk) in w.chunks(BLOCK).enumerate() {
        let s = kernels::sum(chunk);
        if acc + s > target {
            let mut inner = acc;
            for (j, &x) in chunk.iter().enumerate() {
                inner += x as f64;
                if inner > target && x > 0.0 {
                    return u32_index(b * BLOCK + j);
                }
            }
        }
        acc += s;
    }
    // Rounding left the target past the end: the last token with weight.
    u32_index(w.iter().rposition(|&x| x > 0.0).unwrap_or(0))
}

/// The draw's row loops, compiled for AVX2 when the CPU has it.
mod kernels {
    use crate::sampling::math::{fast_exp, with_avx2};

    const LANES: usize = 16;

    with_avx2! {
    /// `w[i] = exp((logits[i] - max) * inv_t)`, 0 below `min_p` (and below f32's smallest
    /// normal: masked or hopeless tokens).
    fn weights(logits: &[f32], max: f32, inv_t: f32, min_p: f32, w: &mut [f32]) -> () {
        let min_p = min_p.max(f32::MIN_POSITIVE);
        for (o, &l) in w.iter_mut().zip(logits) {
            let x = fast_exp((l - max) * inv_t);
            *o = if x < min_p { 0.0 } else { x };
        }
    }
    }

    with_avx2! {
    /// Sum in 16 f32 lanes, then f64.
    fn sum(w: &[f32]) -> f64 {
        let mut lanes = [0f32; LANES];
        let chunks = w.chunks_exact(LANES);
        let tail: f64 = chunks.remainder().iter().map(|&x| x as f64).sum();
        for c in chunks {
            for l in 0..LANES {
                lanes[l] += c[l];
            }
        }
        lanes.iter().map(|&x| x as f64).sum::<f64>() + tail
    }
    }

    with_avx2! {
    /// Zeroes weights below `cut`.
    fn zero_below(w: &mut [f32], cut: f32) -> () {
        for x in w.iter_mut() {
            *x = if *x < cut { 0.0 } else { *x };
        }
    }
    }
}
