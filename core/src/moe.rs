//! Mixture-of-experts routing: what a family's router does with its logits (`MoeScoring`),
//! and the host form of a step's routing that the CPU backend computes with and the other
//! backends are checked against. The routed layer itself is in `model::decoder`; the backends
//! keep their own `Backend::Routing`.

use crate::error::{BackendError, InferError, Result};

/// How router logits become each token's experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeScoring {
    /// Softmax over every expert, then the top k; their probabilities renormalised to sum to
    /// one when `renormalize` (Mixtral always; Qwen3-MoE with `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// The top k logits, then a softmax over those k (gpt-oss).
    TopKSoftmax,
}

/// A routed layer's shape: `top_k` of `num_experts` experts per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeRouting {
    pub num_experts: usize,
    pub top_k: usize,
    pub scoring: MoeScoring,
}

/// More experts than any released model has (DeepSeek-V3: 256, Qwen3-Next: 512).
pub const MAX_EXPERTS: usize = 1 << 12;

/// A step's routing in host memory: token `t`'s slot `s` (assignment `a = t·k + s`) goes to
/// expert `ids[a]` with weight `weights[a]`; `order` lists the assignments grouped by expert
/// (expert 0's first, each group in assignment order) and expert `e`'s group is
/// `order[offsets[e]..offsets[e + 1]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRouting {
    pub top_k: usize,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
    pub offsets: Vec<u32>,
    pub order: Vec<u32>,
}

impl HostRouting {
    pub fn num_tokens(&self) -> usize {
        self.ids.len() / self.top_k.max(1)
    }

    pub fn num_experts(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The assignments expert `e` computes.
    pub fn group(&self, e: usize) -> &[u32] {
        &self.order[self.offsets[e] as usize..self.offsets[e + 1] as usize]
    }
}

impl MoeRouting {
    /// Checks the counts (from a model file) before anything is sized by them.
    pub fn validate(&self) -> Result<()> {
        if self.num_experts > MAX_EXPERTS {
            return Err(InferError::Config(format!(
                "{} experts (at most {MAX_EXPERTS} are supported)",
                self.num_experts
            )));
        }
        if self.num_experts == 0 || self.top_k == 0 || self.top_k > self.num_experts {
            return Err(InferError::Config(format!(
                "{} experts per token of {} experts",
                self.top_k, self.num_experts
            )));
        }
        Ok(())
    }

    /// Routes every row of `logits [tokens, num_experts]`. Ties go to the lower expert.
    pub fn route(&self, logits: &[f32]) -> Result<HostRouting> {
        self.validate()?;
        let (e, k) = (self.num_experts, self.top_k);
        if !logits.len().is_multiple_of(e) {
            return Err(BackendError::shape(
                "moe_route",
                &[("logits", &[logits.len()])],
                format!("a whole number of rows of {e} experts"),
            )
            .on("host"));
        }
        let tokens = logits.len() / e;
        let mut ids = Vec::with_capacity(tokens * k);
        let mut weights = Vec::with_capacity(tokens * k);
        let mut scores = vec![0f32; e];
        for row in logits.chunks_exact(e) {
            scores.copy_from_slice(row);
            if let MoeScoring::SoftmaxTopK { .. } = self.scoring {
                softmax(&mut scores);
            }
            let top = top_k(&scores, k);
            let mut w: Vec<f32> = top.iter().map(|&i| scores[i as usize]).collect();
            match self.scoring {
                MoeScoring::SoftmaxTopK { renormalize: true } => {
                    let sum: f32 = w.iter().sum();
                    w.iter_mut().for_each(|x| *x /= sum);
                }
                MoeScoring::SoftmaxTopK { renormalize: false } => {}
                MoeScoring::TopKSoftmax => softmax(&mut w),
            }
            ids.extend(top);
            weights.extend(w);
        }
        let (offsets, order) = group_by_expert(&ids, e);
        Ok(HostRouting {
            top_k: k,
            ids,
            weights,
            offsets,
            order,
        })
    }
}

/// Counting sort of assignments by expert: `(offsets [experts + 1], order)`.
pub fn group_by_expert(ids: &[u32], experts: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; experts + 1];
    for &id in ids {
        offsets[id as usize + 1] += 1;
    }
    for e in 0..experts {
        offsets[e + 1] += offsets[e];
    }
    let mut next = offsets.clone();
    let mut order = vec![0u32; ids.len()];
    for (a, &id) in (0u32..).zip(ids) {
        order[next[id as usize] as usize] = a;
        next[id as usize] += 1;
    }
    (offsets, order)
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// Indices of the `k` largest values, largest first; on ties the lower index (NaN ranks last).
fn top_k(x: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0u32..).take(x.len()).collect();
    idx.sort_by(|&a, &b| {
        let (va, vb) = (x[a as usize], x[b as usize]);
        vb.partial_cmp(&va)
            .unwrap_or_else(|| va.is_nan().cmp(&vb.is_nan()))
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_top_k_renormalises_and_groups() {
        let r = MoeRouting {
            num_experts: 4,
            top_k: 2,
            scoring: MoeScoring::SoftmaxTopK { renormalize: true },
        };
        let h = r.route(&[0.0, 2.0, 1.0, 2.0, 3.0, 0.0, 0.0, 1.0]).unwrap();
        assert_eq!(h.ids, vec![1, 3, 0, 3]);
        assert!((h.weights[0] - 0.5).abs() < 1e-6 && (h.weights[1] - 0.5).abs() < 1e-6);
        let e2 = (2f32).exp();
        assert!((h.weights[2] - e2 / (e2 + 1.0)).abs() < 1e-6);
        assert_eq!(h.offsets, vec![0, 1, 2, 2, 4]);
        assert_eq!(h.order, vec![2, 0, 1, 3]);
        assert_eq!(h.group(3), &[1, 3]);
        assert!(h.group(2).is_empty());
    }

    #[test]
    fn top_k_then_softmax_and_plain_top_k() {
        let logits = [1.0, 3.0, 2.0];
        let h = MoeRouting {
            num_experts: 3,
            top_k: 2,
            scoring: MoeScoring::TopKSoftmax,
        }
        .route(&logits)
        .unwrap();
        assert_eq!(h.ids, vec![1, 2]);
        let e = (1f32).exp();
        assert!((h.weights[0] - e / (e + 1.0)).abs() < 1e-6);
        let p = MoeRouting {
            num_experts: 3,
            top_k: 2,
            scoring: MoeScoring::SoftmaxTopK { renormalize: false },
        }
        .route(&logits)
        .unwrap();
        let z = (1f32).exp() + (3f32).exp() + (2f32).exp();
        assert!((p.weights[0] - (3f32).exp() / z).abs() < 1e-6);
    }

    #[test]
    fn bad_shapes_are_refused() {
        let r = MoeRouting {
            num_experts: 4,
            top_k: 5,
            scoring: MoeScoring::TopKSoftmax,
        };
        assert!(r.route(&[0.0; 4]).is_err());
        let r = MoeRouting { top_k: 2, ..r };
        assert!(r.route(&[0.0; 5]).is_err());
    }
}
