//! Matmul (f32 or f16 weights) and the dense ops: norms, element-wise, embedding, gather,
//! argmax.

use infer_core::{Backend, HostTensor};
use infer_cpu::CpuBackend;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{assert_close, batch, cpu, host, random, up};

/// Rounds through IEEE half precision (what f16 weights and activations hold).
pub fn to_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// `x [m, k] · wᵀ` with `w` stored by `upload_matrix`. `half_inputs`: the backend rounds
/// weights and activations to f16 (accumulating in f32), so the CPU gets the rounded values.
pub fn check_matmul<B: Backend>(
    g: &B,
    m: usize,
    n: usize,
    k: usize,
    half_inputs: bool,
    seed: u64,
    tol: f32,
) {
    let c = cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let x = random(&mut rng, m * k);
    let w = random(&mut rng, n * k);
    let (xr, wr) = if half_inputs {
        (to_f16(&x), to_f16(&w))
    } else {
        (x.clone(), w.clone())
    };
    let gw = g.upload_matrix(&HostTensor::new(vec![n, k], w)).unwrap();
    let got = g.matmul(&up(g, &[m, k], &x), &gw).unwrap();
    let want = c
        .matmul(&up(&c, &[m, k], &xr), &up(&c, &[n, k], &wr))
        .unwrap();
    assert_close(
        &format!("matmul {m}x{k} · {n}x{k}ᵀ"),
        &host(g, &got),
        &host(&c, &want),
        tol,
    );
}

/// rms_norm (whole rows and per head), add_rms_norm, silu_mul, gelu_tanh_mul, swiglu_clamped, scale, softcap, add_assign,
/// add_bias, embedding (f32 and `upload_matrix` tables),
/// gather_logit_rows and argmax_to_host (when the backend has it) on `rows x cols`.
pub fn check_dense_ops<B: Backend>(g: &B, rows: usize, cols: usize, seed: u64, tol: f32) {
    let c = cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = [rows, cols];
    let (x, y, wv) = (
        random(&mut rng, rows * cols),
        random(&mut rng, rows * cols),
        random(&mut rng, cols),
    );
    let cmp = |what: &str, got: &B::Tensor, want: &<CpuBackend as Backend>::Tensor| {
        assert_close(
            &format!("{what} {rows}x{cols}"),
            &host(g, got),
            &host(&c, want),
            tol,
        )
    };
    let got = g
        .rms_norm(&up(g, &shape, &x), &up(g, &[cols], &wv), 1e-5)
        .unwrap();
    let want = c
        .rms_norm(&up(&c, &shape, &x), &up(&c, &[cols], &wv), 1e-5)
        .unwrap();
    cmp("rms_norm", &got, &want);
    // The residual add fused with the norm: both the normed rows and the updated residual.
    let (mut gx, mut cx) = (up(g, &shape, &x), up(&c, &shape, &x));
    let got = g
        .add_rms_norm(&mut gx, &up(g, &shape, &y), &up(g, &[cols], &wv), 1e-5)
        .unwrap();
    let want = c
        .add_rms_norm(&mut cx, &up(&c, &shape, &y), &up(&c, &[cols], &wv), 1e-5)
        .unwrap();
    cmp("add_rms_norm", &got, &want);
    cmp("add_rms_norm residual", &gx, &cx);
    let got = g.silu_mul(&up(g, &shape, &x), &up(g, &shape, &y)).unwrap();
    let want = c
        .silu_mul(&up(&c, &shape, &x), &up(&c, &shape, &y))
        .unwrap();
    cmp("silu_mul", &got, &want);
    // Gate values up to ±6, where GELU-tanh's cubic term matters and tanh saturates.
    let big: Vec<f32> = x.iter().map(|v| v * 6.0).collect();
    let got = g
        .gelu_tanh_mul(&up(g, &shape, &big), &up(g, &shape, &y))
        .unwrap();
    let want = c
        .gelu_tanh_mul(&up(&c, &shape, &big), &up(&c, &shape, &y))
        .unwrap();
    cmp("gelu_tanh_mul", &got, &want);
    // Values past the limit on both sides, so both clamps bite.
    let big_up: Vec<f32> = y.iter().map(|v| v * 6.0).collect();
    let got = g
        .swiglu_clamped(&up(g, &shape, &big), &up(g, &shape, &big_up), 1.702, 4.0)
        .unwrap();
    let want = c
        .swiglu_clamped(&up(&c, &shape, &big), &up(&c, &shape, &big_up), 1.702, 4.0)
        .unwrap();
    cmp("swiglu_clamped", &got, &want);
    // Per-head norms: a weight a quarter (or half) of the row wide normalizes each part.
    let part = if cols.is_multiple_of(4) {
        cols / 4
    } else {
        cols
    };
    let got = g
        .rms_norm(&up(g, &shape, &x), &up(g, &[part], &wv[..part]), 1e-6)
        .unwrap();
    let want = c
        .rms_norm(&up(&c, &shape, &x), &up(&c, &[part], &wv[..part]), 1e-6)
        .unwrap();
    cmp("rms_norm per head", &got, &want);
    for (what, cap) in [("scale", false), ("softcap", true)] {
        let (mut got, mut want) = (up(g, &shape, &big), up(&c, &shape, &big));
        if cap {
            g.softcap(&mut got, 2.5).unwrap();
            c.softcap(&mut want, 2.5).unwrap();
        } else {
            g.scale(&mut got, -0.37).unwrap();
            c.scale(&mut want, -0.37).unwrap();
        }
        cmp(what, &got, &want);
    }
    let (mut got, mut want) = (up(g, &shape, &x), up(&c, &shape, &x));
    g.add_assign(&mut got, &up(g, &shape, &y)).unwrap();
    c.add_assign(&mut want, &up(&c, &shape, &y)).unwrap();
    g.add_bias(&mut got, &up(g, &[cols], &wv)).unwrap();
    c.add_bias(&mut want, &up(&c, &[cols], &wv)).unwrap();
    cmp("add_assign + add_bias", &got, &want);

    // A batch of `rows` tokens over a table of `rows + 7` rows; every row's logits.
    let vocab = rows + 7;
    let table = random(&mut rng, vocab * cols);
    let seqs: Vec<(usize, usize)> = vec![(0, rows)];
    let (mut b, _) = batch(&mut rng, &seqs, 4, vocab as u32);
    b.logits_indices = (0..rows as u32).rev().collect();
    for (gt, ct) in [
        (
            up(g, &[vocab, cols], &table),
            up(&c, &[vocab, cols], &table),
        ),
        (
            g.upload_matrix(&HostTensor::new(vec![vocab, cols], table.clone()))
                .unwrap(),
            c.upload_matrix(&HostTensor::new(vec![vocab, cols], table.clone()))
                .unwrap(),
        ),
    ] {
        let (gb, cb) = (g.upload_batch(&b).unwrap(), c.upload_batch(&b).unwrap());
        let got = g.embedding(&gt, &gb).unwrap();
        let want = c.embedding(&ct, &cb).unwrap();
        // Tables stored as f16 by `upload_matrix` round each value (relative 2^-11).
        cmp("embedding", &got, &want);
        let got = g.gather_logit_rows(&got, &gb).unwrap();
        let want = c.gather_logit_rows(&want, &cb).unwrap();
        cmp("gather_logit_rows", &got, &want);
    }
    // argmax on rows with a planted tie: the lowest index wins.
    let mut logits = random(&mut rng, rows * cols);
    for r in 0..rows {
        let (a, b2) = (r % cols, (r * 7 + 3) % cols);
        logits[r * cols + a.min(b2)] = 5.0;
        logits[r * cols + a.max(b2)] = 5.0;
    }
    if let Some(ids) = g.argmax_to_host(&up(g, &shape, &logits)).unwrap() {
        let want: Vec<u32> = (0..rows)
            .map(|r| {
                let row = &logits[r * cols..(r + 1) * cols];
                let best = row.iter().cloned().fold(f32::MIN, f32::max);
                row.iter().position(|&v| v == best).unwrap() as u32
            })
            .collect();
        assert_eq!(ids, want, "argmax {rows}x{cols}");
    }
}
