//! The interleaved Q4_K kernel on AVX2 (every x86 level but scalar): lane `r` of each vector
//! is row `r` of the group.
//!
//! Per 32-weight sub-block: 8 `maddubs` per plane (4 weights of every row against 4
//! activations broadcast), summed in i16 (at most 16 products of 15 · 127 per lane: 30,480),
//! then one multiply-add of lane pairs into i32 and one multiply by the rows' 6-bit scales.
//! The value and residual planes are summed apart (each at most 8 · 63 · 32 · 15 · 127 per
//! block: exact in i32) and meet in f32 once per block as `256 · value + residual`, in the
//! residual's step. The mins meet the activations' per-32 code sums, already combined that
//! way (`ActRow::code_sums`: at most 257 · 32 · 127 · 63 · 8 per block).

use std::arch::x86_64::*;

use super::{qs_at, ActRow, GROUP_BLOCK, ROWS};

/// `dot_group_scalar` on AVX2.
pub(super) fn dot_group(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    let nb = group.len() / GROUP_BLOCK;
    assert!(
        group.len() == nb * GROUP_BLOCK
            && x.value.len() >= 256 * nb
            && x.residual.is_none_or(|r| r.len() >= 256 * nb)
            && x.code_sums.len() >= 8 * nb
            && x.steps.len() >= nb,
        "interleaved: a group and an activation row of different lengths"
    );
    assert!(
        super::kernels_available(),
        "interleaved kernels without AVX2 and F16C"
    );
    // SAFETY: the lengths checked above cover every load; the CPU has AVX2, FMA and F16C
    // (`kernels_available`).
    unsafe {
        if x.residual.is_some() {
            dot::<true>(group, x)
        } else {
            dot::<false>(group, x)
        }
    }
}

/// Four codes as one lane, broadcast to all eight.
///
/// # Safety
/// AVX; `p..p + 4` is inside the row.
#[inline(always)]
unsafe fn four(p: *const i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// # Safety
/// AVX2, FMA and F16C; `group` holds whole group-blocks and `x` as many blocks of values (and
/// residuals when `PAIRED`), code sums and steps.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const PAIRED: bool>(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let value = x.value.as_ptr();
    let residual = x.residual.unwrap_or(x.value).as_ptr();
    let mut acc = _mm256_setzero_ps();
    let mut min_acc = _mm256_setzero_ps();
    for (b, gb) in group.chunks_exact(GROUP_BLOCK).enumerate() {
        let p = gb.as_ptr();
        // SAFETY (the block): loads inside the group-block `gb` and block `b` of the
        // activation row (the caller's contract).
        unsafe {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast()));
            let mut sums_v = _mm256_setzero_si256();
            let mut sums_r = _mm256_setzero_si256();
            let mut mins = _mm256_setzero_si256();
            for s in 0..8 {
                let scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(32 + 8 * s).cast()));
                let min = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(96 + 8 * s).cast()));
                let sums = _mm256_set1_epi32(*x.code_sums.get_unchecked(8 * b + s));
                mins = _mm256_add_epi32(mins, _mm256_mullo_epi32(min, sums));
                let mut v16 = _mm256_setzero_si256();
                let mut r16 = _mm256_setzero_si256();
                for c in 0..4 {
                    let q = _mm256_loadu_si256(p.add(qs_at(s, c, 0, 0)).cast());
                    let lo = _mm256_and_si256(q, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    let at = 256 * b + 32 * s + 8 * c;
                    v16 = _mm256_add_epi16(v16, _mm256_maddubs_epi16(lo, four(value.add(at))));
                    v16 = _mm256_add_epi16(v16, _mm256_maddubs_epi16(hi, four(value.add(at + 4))));
                    if PAIRED {
                        r16 =
                            _mm256_add_epi16(r16, _mm256_maddubs_epi16(lo, four(residual.add(at))));
                        r16 = _mm256_add_epi16(
                            r16,
                            _mm256_maddubs_epi16(hi, four(residual.add(at + 4))),
                        );
                    }
                }
                let v = _mm256_madd_epi16(v16, ones);
                sums_v = _mm256_add_epi32(sums_v, _mm256_mullo_epi32(v, scale));
                if PAIRED {
                    let r = _mm256_madd_epi16(r16, ones);
                    sums_r = _mm256_add_epi32(sums_r, _mm256_mullo_epi32(r, scale));
                }
            }
            let step = _mm256_set1_ps(*x.steps.get_unchecked(b));
            let sums = if PAIRED {
                _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(sums_v),
                    _mm256_set1_ps(256.0),
                    _mm256_cvtepi32_ps(sums_r),
                )
            } else {
                _mm256_cvtepi32_ps(sums_v)
            };
            acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, step), acc);
            min_acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, step), min_acc);
        }
    }
    let mut out = [0f32; ROWS];
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, min_acc)) };
    out
}
