//! The routed MLP's ops (`moe_route`, `moe_matmul`, `moe_combine`) against a float64
//! reference written here, independently of `MoeRouting::route`: random logits, experts that
//! get no token, every token on one expert, both scorings, and x per token or per assignment.

use infer_core::moe::{MoeRouting, MoeScoring};
use infer_core::{Backend, HostTensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{assert_close, dense::to_f16, host, random, up};

/// One routing problem: `tokens` rows of router logits over `experts`, `top_k` each; `skew`
/// adds a large bonus to expert 0 so every token picks it.
#[derive(Debug, Clone, Copy)]
pub struct MoeCase {
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub scoring: MoeScoring,
    pub skew: bool,
}

/// The cases every backend runs: a decode-sized step, a prefill-sized one where every expert
/// gets tokens, one where most experts get none, all tokens on one expert.
pub fn moe_cases() -> Vec<MoeCase> {
    let renorm = MoeScoring::SoftmaxTopK { renormalize: true };
    vec![
        MoeCase {
            tokens: 1,
            experts: 8,
            top_k: 2,
            scoring: renorm,
            skew: false,
        },
        MoeCase {
            tokens: 37,
            experts: 8,
            top_k: 2,
            scoring: renorm,
            skew: false,
        },
        MoeCase {
            tokens: 3,
            experts: 32,
            top_k: 4,
            scoring: MoeScoring::SoftmaxTopK { renormalize: false },
            skew: false,
        },
        MoeCase {
            tokens: 19,
            experts: 16,
            top_k: 3,
            scoring: MoeScoring::TopKSoftmax,
            skew: false,
        },
        MoeCase {
            tokens: 11,
            experts: 8,
            top_k: 1,
            scoring: renorm,
            skew: true,
        },
    ]
}

/// Float64 routing: (ids, weights) per assignment, ties to the lower expert.
fn reference_route(logits: &[f32], c: &MoeCase) -> (Vec<u32>, Vec<f64>) {
    let mut ids = Vec::new();
    let mut weights = Vec::new();
    for row in logits.chunks(c.experts) {
        let l: Vec<f64> = row.iter().map(|&x| x as f64).collect();
        let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = l.iter().map(|x| (x - max).exp()).collect();
        let total: f64 = exp.iter().sum();
        let mut order: Vec<usize> = (0..c.experts).collect();
        order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
        let top = &order[..c.top_k];
        let picked: f64 = top.iter().map(|&e| exp[e]).sum();
        let denom = match c.scoring {
            MoeScoring::SoftmaxTopK { renormalize: false } => total,
            _ => picked,
        };
        for &e in top {
            ids.push(e as u32);
            weights.push(exp[e] / denom);
        }
    }
    (ids, weights)
}

/// `out[a] = x[row(a)] · w[ids[a]]ᵀ` in float64.
fn reference_matmul(
    x: &[f32],
    w: &[f32],
    ids: &[u32],
    k: usize,
    n: usize,
    per_token: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * n);
    for (a, &e) in ids.iter().enumerate() {
        let row = &x[a / per_token * k..(a / per_token + 1) * k];
        for j in 0..n {
            let wr = &w[(e as usize * n + j) * k..(e as usize * n + j + 1) * k];
            out.push(
                row.iter()
                    .zip(wr)
                    .map(|(&p, &q)| p as f64 * q as f64)
                    .sum::<f64>() as f32,
            );
        }
    }
    out
}

/// Runs every op of `c` on `g`; experts are stored by `upload_matrix` (rounded to f16 when
/// `half_weights`, as the backend stores them, so the reference sees the same values).
pub fn check_moe_ops<B: Backend>(g: &B, c: &MoeCase, half_weights: bool, seed: u64, tol: f32) {
    let what = format!("{c:?}");
    let mut rng = StdRng::seed_from_u64(seed);
    let (hidden, ff) = (64, 24);
    let mut logits = random(&mut rng, c.tokens * c.experts);
    for v in logits.iter_mut() {
        *v *= 3.0;
    }
    if c.skew {
        logits
            .iter_mut()
            .step_by(c.experts)
            .for_each(|v| *v += 50.0);
    }
    let routing = MoeRouting {
        num_experts: c.experts,
        top_k: c.top_k,
        scoring: c.scoring,
    };
    let route = g
        .moe_route(&up(g, &[c.tokens, c.experts], &logits), &routing)
        .unwrap_or_else(|e| panic!("{what}: moe_route: {e}"));
    let h = g.routing_to_host(&route).unwrap();
    let (ids, weights) = reference_route(&logits, c);
    assert_eq!(h.ids, ids, "{what}: expert ids");
    let want_w: Vec<f32> = weights.iter().map(|&w| w as f32).collect();
    assert_close(
        &format!("{what}: routing weights"),
        &h.weights,
        &want_w,
        1e-5,
    );
    // The grouping: by expert, each group in assignment order.
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    order.sort_by_key(|&a| (ids[a as usize], a));
    assert_eq!(h.order, order, "{what}: order");
    let mut offsets = vec![0u32; c.experts + 1];
    for &e in &ids {
        offsets[e as usize + 1] += 1;
    }
    for e in 0..c.experts {
        offsets[e + 1] += offsets[e];
    }
    assert_eq!(h.offsets, offsets, "{what}: offsets");
    if c.skew {
        assert!(
            ids.iter().all(|&e| e == 0),
            "{what}: every token on expert 0"
        );
    }

    let round = |v: Vec<f32>| if half_weights { to_f16(&v) } else { v };
    let x = random(&mut rng, c.tokens * hidden);
    let w_up = random(&mut rng, c.experts * ff * hidden);
    let w_down = random(&mut rng, c.experts * hidden * ff);
    let upload = |shape: &[usize], w: &[f32]| {
        g.upload_matrix(&HostTensor::new(shape.to_vec(), w.to_vec()))
            .unwrap()
    };
    let gu = upload(&[c.experts, ff, hidden], &w_up);
    let gd = upload(&[c.experts, hidden, ff], &w_down);
    let (w_up, w_down) = (round(w_up), round(w_down));
    // Per token (gate/up), then per assignment (down).
    let y = g
        .moe_matmul(&up(g, &[c.tokens, hidden], &x), &gu, &route)
        .unwrap();
    // Activations stay f32: the kernels widen f16 weights, never narrow x.
    let want = reference_matmul(&x, &w_up, &ids, hidden, ff, c.top_k);
    assert_close(
        &format!("{what}: moe_matmul per token"),
        &host(g, &y),
        &want,
        tol,
    );
    let act = random(&mut rng, ids.len() * ff);
    let z = g
        .moe_matmul(&up(g, &[ids.len(), ff], &act), &gd, &route)
        .unwrap();
    // As above: only the weights were rounded.
    let want_z = reference_matmul(&act, &w_down, &ids, ff, hidden, 1);
    let got_z = host(g, &z);
    assert_close(
        &format!("{what}: moe_matmul per assignment"),
        &got_z,
        &want_z,
        tol,
    );

    let out = g.moe_combine(&z, &route).unwrap();
    let mut want = vec![0f32; c.tokens * hidden];
    for (t, o) in want.chunks_mut(hidden).enumerate() {
        for (j, o) in o.iter_mut().enumerate() {
            *o = (0..c.top_k)
                .map(|s| {
                    let a = t * c.top_k + s;
                    weights[a] * got_z[a * hidden + j] as f64
                })
                .sum::<f64>() as f32;
        }
    }
    assert_close(&format!("{what}: moe_combine"), &host(g, &out), &want, 1e-5);
}
