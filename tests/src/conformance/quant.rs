//! Matrices kept in their GGUF blocks (`Backend::upload_packed`): matmul at several batch
//! sizes and the embedding gather, against the CPU backend's f32 ops on the same blocks
//! dequantized by core (ggml's layouts). Blocks are random quants under fixed scales.

use infer_core::dummy::random_blocks;
use infer_core::gguf::GgmlType;
use infer_core::{Backend, PackedTensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{assert_close, batch, cpu, host, random, up};

/// `x [m, k] · wᵀ` for each `m` of `ms` and the embedding of a few rows, `w [n, k]` random
/// `dtype` blocks. `tol(m)` is the tolerance for that batch size (a backend may round to f16
/// for large ones). Panics when the backend does not take the blocks packed.
pub fn check_packed_matmul<B: Backend>(
    g: &B,
    dtype: GgmlType,
    ms: &[usize],
    n: usize,
    k: usize,
    seed: u64,
    tol: impl Fn(usize) -> f32,
) {
    let c = cpu();
    let data = random_blocks(dtype, n, k, seed).expect("a type random_blocks makes");
    let packed = PackedTensor {
        shape: vec![n, k],
        dtype,
        data: data.into(),
    };
    let dense = packed.dequantize();
    let gw = g
        .upload_packed(&packed)
        .unwrap()
        .unwrap_or_else(|| panic!("{} did not take {} blocks", g.name(), dtype.name()));
    let cw = up(&c, &[n, k], &dense.data);
    let mut rng = StdRng::seed_from_u64(seed);
    for &m in ms {
        let x = random(&mut rng, m * k);
        let xg = up(g, &[m, k], &x);
        let got = g.matmul(&xg, &gw).unwrap();
        let want = host(&c, &c.matmul(&up(&c, &[m, k], &x), &cw).unwrap());
        let what = format!("{} matmul {m}x{k} · {n}x{k}ᵀ", dtype.name());
        assert_close(&what, &host(g, &got), &want, tol(m));
        // Several matrices on one input (QKV): a backend may share work between them.
        for (j, t) in g.matmul_many(&xg, &[&gw, &gw]).unwrap().iter().enumerate() {
            assert_close(
                &format!("{what}, matmul_many #{j}"),
                &host(g, t),
                &want,
                tol(m),
            );
        }
    }
    let rows = 5.min(n);
    let (b, _) = batch(&mut rng, &[(0, rows)], 4, n as u32);
    let got = g.embedding(&gw, &g.upload_batch(&b).unwrap()).unwrap();
    let want = c.embedding(&cw, &c.upload_batch(&b).unwrap()).unwrap();
    let what = format!("{} embedding of {rows} rows", dtype.name());
    assert_close(&what, &host(g, &got), &host(&c, &want), 1e-6);
}
