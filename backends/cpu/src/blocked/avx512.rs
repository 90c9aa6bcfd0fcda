//! The blocked kernels on AVX-512F (32 × 512-bit registers): 32-weight blocks decoded to two
//! 16-lane vectors (`decode`), 8 activation rows by 3 weight rows per call.

use std::arch::x86_64::*;

use super::decode::Rows;

/// Activation rows per kernel call and weight rows decoded per block: 8 × 3 accumulators,
/// 6 decoded weight halves and 2 activation halves fill the 32 vector registers.
pub(super) const MR: usize = 8;
pub(super) const NR: usize = 3;

blocked_tile!("avx512f", [1, 2, 3, 4, 5, 6, 7]);

/// `part[(r + i) * width + j + c] = x row r + i · weight row j + c` for i < M, c < N.
///
/// # Safety
/// AVX-512F; weight rows `j..j + N` and activation rows `r..r + M` exist.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<W: Rows, const M: usize, const N: usize>(
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
