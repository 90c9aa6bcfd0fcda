//! Register-blocked matmul for batched decode (2 ≤ m ≤ `BLOCKED_MAX_M` rows) on
//! AVX-512: each 32-weight block of `NR` weight rows is decoded to f32 in registers once and
//! multiplied with `MR` activation rows, accumulating `MR × NR` dot products in 16-lane
//! registers. Weights are read straight from their packed (or f32) rows: nothing is decoded to
//! memory or repacked. Through the `gemm` crate these sizes spent about as long packing and
//! decoding tiles as multiplying (perf, SmolLM2 Q8_0, 32 sequences).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use infer_core::gguf::GgmlType;

use crate::matmul::{by_column_tiles, streaming_tile};

/// Up to this many rows take these kernels; above it `gemm`'s packed GEMM wins (prefill).
pub(crate) const BLOCKED_MAX_M: usize = 64;

/// Weights, rows of `k`, in one of the layouts the kernels read.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    F32(&'a [f32]),
    Packed(&'a [u8], GgmlType),
}

/// Whether these kernels take this matmul: weights they decode, 2..=`BLOCKED_MAX_M` rows, on
/// a CPU with AVX-512. One row stays on the streaming kernels, as fast and not tied to
/// AVX-512; from two rows these are faster (SmolLM2 decode at batch 2 / 4 / 8: Q8_0 +5 /
/// +28 / +55 %, Q4_K_M +13 / +50 / +85 % per request, `infer bench latency`).
pub(crate) fn supports(w: Weights, m: usize, k: usize) -> bool {
    let layout = match w {
        Weights::F32(_) => true,
        Weights::Packed(_, dtype) => {
            matches!(
                dtype,
                GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
            )
        }
    };
    layout && (2..=BLOCKED_MAX_M).contains(&m) && k.is_multiple_of(32) && available()
}

/// Whether this CPU runs these kernels (AVX-512F).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `out [m, n] = x [m, k] · wᵀ` in parallel column tiles.
///
/// # Panics
/// If `supports(w, m, k)` is false (callers check it).
pub(crate) fn matmul(x: &[f32], w: Weights, m: usize, k: usize, n: usize) -> Vec<f32> {
    assert!(supports(w, m, k), "blocked::matmul without kernels");
    by_column_tiles(m, n, streaming_tile(n), |c0, c1, part| {
        let rows = match w {
            Weights::F32(w) => Weights::F32(&w[c0 * k..c1 * k]),
            Weights::Packed(w, dtype) => {
                let row_bytes = dtype.row_bytes(k);
                Weights::Packed(&w[c0 * row_bytes..c1 * row_bytes], dtype)
            }
        };
        into_part(x, rows, m, k, part)
    })
}

/// `part [m, rows]` = `x [m, k]` · `rowsᵀ` for the weight rows of one tile.
///
/// # Panics
/// If `supports(rows, m, k)` is false, or the sizes do not match.
pub(crate) fn into_part(x: &[f32], rows: Weights, m: usize, k: usize, part: &mut [f32]) {
    assert!(supports(rows, m, k), "blocked::into_part without kernels");
    assert_eq!(x.len(), m * k, "blocked: x is not [m, k]");
    #[cfg(target_arch = "x86_64")]
    {
        use decode::{BlockRows, F32Rows, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
        // SAFETY: `supports` checked AVX-512F. Each `Rows` checks that its data holds whole
        // rows of `k`, `tile` that `part` is [m, rows].
        unsafe {
            match rows {
                Weights::F32(w) => tile(&F32Rows::new(w, k), x, m, k, part),
                Weights::Packed(w, GgmlType::Q4_0) => {
                    tile(&BlockRows::<Q4_0>::new(w, k), x, m, k, part)
                }
                Weights::Packed(w, GgmlType::Q4_1) => {
                    tile(&BlockRows::<Q4_1>::new(w, k), x, m, k, part)
                }
                Weights::Packed(w, GgmlType::Q5_0) => {
                    tile(&BlockRows::<Q5_0>::new(w, k), x, m, k, part)
                }
                Weights::Packed(w, GgmlType::Q5_1) => {
                    tile(&BlockRows::<Q5_1>::new(w, k), x, m, k, part)
                }
                Weights::Packed(w, _) => tile(&BlockRows::<Q8_0>::new(w, k), x, m, k, part),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod decode;

/// Activation rows per kernel call and weight rows decoded per block: 8 × 3 accumulators,
/// 6 decoded weight halves and 2 activation halves fill the 32 vector registers.
#[cfg(target_arch = "x86_64")]
const MR: usize = 8;
#[cfg(target_arch = "x86_64")]
const NR: usize = 3;

/// Fills `part [m, w.len()]`, `MR` activation rows by `NR` weight rows per kernel call (each
/// weight block decoded once per call).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile<W: decode::Rows>(w: &W, x: &[f32], m: usize, k: usize, part: &mut [f32]) {
    let width = w.len();
    assert_eq!(part.len(), m * width, "blocked: part is not [m, rows]");
    macro_rules! by_rows {
        ($nr:tt, $j:expr, $r:expr, $mr:expr) => {
            // SAFETY (every arm): rows $j..$j + $nr and $r..$r + $mr exist (the loops below
            // bound them), and this function runs with AVX-512F.
            unsafe {
                match $mr {
                    1 => kernel::<W, 1, $nr>(w, $j, x, $r, k, part, width),
                    2 => kernel::<W, 2, $nr>(w, $j, x, $r, k, part, width),
                    3 => kernel::<W, 3, $nr>(w, $j, x, $r, k, part, width),
                    4 => kernel::<W, 4, $nr>(w, $j, x, $r, k, part, width),
                    5 => kernel::<W, 5, $nr>(w, $j, x, $r, k, part, width),
                    6 => kernel::<W, 6, $nr>(w, $j, x, $r, k, part, width),
                    7 => kernel::<W, 7, $nr>(w, $j, x, $r, k, part, width),
                    _ => kernel::<W, MR, $nr>(w, $j, x, $r, k, part, width),
                }
            }
        };
    }
    // Rows outermost: one group's activations (MR × k floats) stay in L1 while the tile's weight
    // rows pass by; columns outermost streamed all m rows from L2 per weight row and ran 20 %
    // slower at 32 rows.
    let mut r = 0;
    while r < m {
        let mr = (m - r).min(MR);
        let mut j = 0;
        while j < width {
            let nr = (width - j).min(NR);
            if r == 0 {
                for c in j..j + nr {
                    w.prefetch(c);
                }
            }
            match nr {
                1 => by_rows!(1, j, r, mr),
                2 => by_rows!(2, j, r, mr),
                3 => by_rows!(3, j, r, mr),
                _ => by_rows!(NR, j, r, mr),
            }
            j += nr;
        }
        r += mr;
    }
}

/// `part[(r + i) * width + j + c] = x row r + i · weight row j + c` for i < M, c < N.
///
/// # Safety
/// AVX-512F; weight rows `j..j + N` and activation rows `r..r + M` exist.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<W: decode::Rows, const M: usize, const N: usize>(
    w: &W,
    j: usize,
    x: &[f32],
    r: usize,
    k: usize,
    part: &mut [f32],
    width: usize,
) {
    // SAFETY: the caller's contract: AVX-512F is present, and every pointer below stays inside
    // rows r..r + M of `x` (k floats each, read 32 at a time up to k) and rows j..j + N of `w`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); N]; M];
        let mut ws = [(_mm512_setzero_ps(), _mm512_setzero_ps()); N];
        let x0 = x.as_ptr().add(r * k);
        for blk in 0..k / 32 {
            for (c, wc) in ws.iter_mut().enumerate() {
                *wc = w.block(j + c, blk);
            }
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let p = x0.add(i * k + blk * 32);
                let (lo, hi) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
                for (a, wc) in acc_i.iter_mut().zip(&ws) {
                    *a = _mm512_fmadd_ps(wc.0, lo, *a);
                    *a = _mm512_fmadd_ps(wc.1, hi, *a);
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (c, a) in acc_i.iter().enumerate() {
                part[(r + i) * width + j + c] = _mm512_reduce_add_ps(*a);
            }
        }
    }
}

#[cfg(test)]
mod tests;
