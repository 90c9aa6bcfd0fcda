//! `out [m, n] = x [m, k] · wᵀ` for a row-major linear weight `w [n, k]`.
//! Few rows (decode) are bound by reading `w`: each weight row is streamed once and dotted with
//! every input row while it sits in L1; with AVX-512, from two rows on, the register-blocked
//! kernels of `blocked` take them. Many rows (prefill) go to the `gemm` crate.

use crate::blocked::{self, Weights};
use crate::tiles::{by_column_tiles, prefetch_ahead, streaming_tile};

/// Up to this many rows use the streaming path; above it GEMM's blocking wins.
pub(crate) const SMALL_M: usize = 8;

pub fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(w.len(), n * k);
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    if blocked::supports(Weights::F32(w), m, k) {
        return blocked::matmul(x, Weights::F32(w), m, k, n);
    }
    if m <= SMALL_M {
        return matmul_small_m(x, w, m, k, n);
    }
    let mut out = vec![0f32; m * n];
    gemm_into(x, w, m, k, n, &mut out, true);
    out
}

/// `out [m, n] = x [m, k] · wᵀ` through the `gemm` crate, on all threads when `parallel`.
pub(crate) fn gemm_into(
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
    parallel: bool,
) {
    assert!(
        x.len() == m * k && w.len() == n * k && out.len() == m * n,
        "gemm_into: bad sizes"
    );
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: `out` is m×n row-major (row stride n, column stride 1); `x` is m×k row-major;
    // `w` is n×k row-major, read as the k×n right-hand side with row stride 1 and column
    // stride k. The assert above checks all three sizes, and `out` is a distinct `&mut`
    // borrow, so it does not alias the inputs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Few rows: each weight row is streamed once and dotted with every input row.
fn matmul_small_m(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    by_column_tiles(m, n, streaming_tile(n), |c0, c1, part| {
        let width = c1 - c0;
        let w_tile = &w[c0 * k..c1 * k];
        for (j, wrow) in w_tile.chunks_exact(k).enumerate() {
            prefetch_ahead(w_tile, j, k);
            for (i, xrow) in x.chunks_exact(k).enumerate() {
                part[i * width + j] = dot(xrow, wrow);
            }
        }
    })
}

/// Dot product with runtime dispatch to AVX2/AVX-512 where the CPU has them.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::Isa::current().has_avx512() {
            // SAFETY: the level in use has AVX-512F, and this CPU runs it (`Isa::current`).
            return unsafe { dot_avx512(a, b) };
        }
        if crate::isa::Isa::current().has_avx2() {
            // SAFETY: the level in use has AVX2 and FMA, and this CPU runs it (`Isa::current`).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

/// 32 independent lanes let the compiler vectorize without reassociating a single sum.
#[inline(always)]
pub(crate) fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 32;
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                    .sum();
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn matches_float64_reference(m in 1usize..20, k in 1usize..90, n in 1usize..70, seed in 0u64..1000) {
            let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let mut rnd = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5 };
            let x: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let got = matmul(&x, &w, m, k, n);
            for (g, r) in got.iter().zip(naive(&x, &w, m, k, n)) {
                prop_assert!((*g as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()), "{g} vs {r}");
            }
        }
    }
}
