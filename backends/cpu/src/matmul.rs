//! `out [m, n] = x [m, k] · wᵀ` for a row-major linear weight `w [n, k]`.
//! Few rows (decode) are bound by reading `w`: each weight row is streamed once and dotted with
//! every input row while it sits in L1; with AVX-512, from two rows on, the register-blocked
//! kernels of `blocked` take them. Many rows (prefill) go to the `gemm` crate.

use rayon::prelude::*;

use crate::blocked::{self, Weights};

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

/// The largest tile (the weight rows one task streams) whose rows `prefetch_ahead` asks for.
/// A long sequential stream is what the hardware prefetchers follow best, and software hints
/// on it only queue behind them: on a 2-core AMD EPYC, the Q4_K kernels streamed 8192 × 2048
/// and 2048 × 8192 matrices (tiles of 590 / 655 KB) at 26 GB/s without the hints and 17 with,
/// and a 1B Llama decoded at 17.8 against 14.6 tok/s (Q8_0) and 16.6 against 15.6 (Q4_1),
/// medians of 6 alternated runs. Short tiles (SmolLM2's hidden matrices: 13-62 KB) keep them:
/// they were measured worth 10-30 % on a Xeon (see the README).
const PREFETCH_MAX_TILE_BYTES: usize = 128 << 10;

/// How many weight rows ahead of the one being dotted the streaming kernels ask the cache for.
/// Weights stream from L3 or DRAM once per step, and the hardware prefetcher alone leaves the
/// core waiting on them: on the 2-core Xeon of the README, SmolLM2 decode went from 81 to
/// 104 tok/s (Q8_0) and from 103 to 116 tok/s (Q4_K_M) with this hint (2 rows: 109 on Q4_K_M).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const PREFETCH_ROWS: usize = 4;

/// Asks for weight row `j + PREFETCH_ROWS` of `rows` (rows of `row_len` elements), if there
/// is one and the tile `rows` is short enough to gain from it.
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(rows: &[T], j: usize, row_len: usize) {
    if std::mem::size_of_val(rows) > PREFETCH_MAX_TILE_BYTES {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let ahead = (j + PREFETCH_ROWS) * row_len;
        if let Some(next) = rows.get(ahead..ahead + row_len) {
            for line in next.chunks(64 / std::mem::size_of::<T>().max(1)) {
                // SAFETY: a hint on an in-bounds address; SSE is part of x86-64.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let ahead = (j + PREFETCH_ROWS) * row_len;
        if let Some(next) = rows.get(ahead..ahead + row_len) {
            for line in next.chunks(64 / std::mem::size_of::<T>().max(1)) {
                // SAFETY: a prefetch hint on an in-bounds address; it reads nothing
                // architecturally and cannot fault.
                unsafe {
                    std::arch::asm!(
                        "prfm pldl1keep, [{p}]",
                        p = in(reg) line.as_ptr(),
                        options(nostack, readonly, preserves_flags)
                    )
                };
            }
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (rows, j, row_len);
}

/// Output columns per task when each weight row is streamed once: wide enough to amortize
/// scheduling, narrow enough that every thread gets several tiles.
pub(crate) fn streaming_tile(n: usize) -> usize {
    (n / (rayon::current_num_threads() * 8)).clamp(16, 512)
}

/// Computes an `[m, n]` row-major output in parallel column tiles of `tile` columns:
/// `f(c0, c1, part)` fills `part` as `[m, c1 - c0]`, and the tiles are stitched together.
pub(crate) fn by_column_tiles(
    m: usize,
    n: usize,
    tile: usize,
    f: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let tile = tile.max(1);
    if m == 1 {
        // One row: the tiles are disjoint slices of the output, filled in place.
        let mut out = vec![0f32; n];
        out.par_chunks_mut(tile)
            .enumerate()
            .for_each(|(t, part)| f(t * tile, t * tile + part.len(), part));
        return out;
    }
    let mut out = vec![0f32; m * n];
    let rows = RowsOut(out.as_mut_ptr());
    (0..n)
        .step_by(tile)
        .collect::<Vec<_>>()
        .into_par_iter()
        .for_each(|c0| {
            let c1 = (c0 + tile).min(n);
            let width = c1 - c0;
            let mut part = vec![0f32; m * width];
            f(c0, c1, &mut part);
            // Each task places its own columns (the copies were a serial pass after all tiles,
            // 2-3 % of a 32-request step).
            for (i, row) in part.chunks_exact(width).enumerate() {
                // SAFETY: `out` holds `m * n` values and outlives this loop; row `i`'s columns
                // `c0..c1` are inside it and written by this task alone (tiles are disjoint).
                unsafe { rows.write(i * n + c0, row) };
            }
        });
    out
}

/// The output of `by_column_tiles`, shared by its tasks, each writing its own columns.
#[derive(Clone, Copy)]
struct RowsOut(*mut f32);

// SAFETY: the tasks write disjoint ranges through it (see `write`'s callers) while the vector
// it points into is alive and not otherwise accessed.
unsafe impl Send for RowsOut {}
// SAFETY: as above.
unsafe impl Sync for RowsOut {}

impl RowsOut {
    /// # Safety
    /// `at..at + values.len()` is inside the output and no other task writes it.
    unsafe fn write(self, at: usize, values: &[f32]) {
        // SAFETY: the caller's contract; `values` is a separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.add(at), values.len()) };
    }
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
