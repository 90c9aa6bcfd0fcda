//! The interleaved kernels on AVX2 (every x86 level but scalar; F16C for the rows' f16
//! scales): lane `r` of each vector is row `r` of the group, and each `maddubs` meets 4
//! weights of every row with 4 activations broadcast.
//!
//! Q4_K, per 32-weight sub-block: 8 `maddubs` per plane summed in i16 (at most 16 products of
//! 15 · 127 per lane: 30,480), one multiply-add of lane pairs into i32 and one multiply by the
//! rows' 6-bit scales. Q6_K, per 16 weights: 4 `maddubs` per plane, summed two by two in i16
//! (codes up to 63: 32,004), each pair's lanes multiplied-and-added with the rows' signed
//! scales. Value and residual planes are summed apart (per block at most 8 · 63 · 32 · 15 ·
//! 127, and 16 · 128 · 16 · 63 · 127: exact in i32) and meet in f32 once per block as
//! `256 · value + residual`, in the residual's step. Q4_K's mins meet the activations'
//! per-32 code sums already combined that way (`ActRow::sums32`: at most 257 · 32 · 127 · 63
//! · 8), Q6_K's centre of 32 each plane's per-16 sums.

use std::arch::x86_64::*;

use super::q4k::{self, qs_at};
use super::q6k::{self, qh_at, ql_at};
use super::{ActRow, Kind, ROWS};

/// The checks that make the kernels' loads sound.
fn check(group: &[u8], group_block: usize, x: &ActRow) {
    let nb = group.len() / group_block;
    assert!(
        group.len() == nb * group_block && x.covers(nb),
        "interleaved: a group and an activation row of different lengths"
    );
    assert!(
        super::kernels_available(),
        "interleaved kernels without AVX2 and F16C"
    );
}

/// `Q4K::dot_scalar` on AVX2.
pub(super) fn dot_q4k(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    check(group, q4k::Q4K::GROUP_BLOCK, x);
    // SAFETY: `check` covers every load and found AVX2, FMA and F16C.
    unsafe {
        if x.residual.is_some() {
            q4k_dot::<true>(group, x)
        } else {
            q4k_dot::<false>(group, x)
        }
    }
}

/// `Q6K::dot_scalar` on AVX2.
pub(super) fn dot_q6k(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    check(group, q6k::Q6K::GROUP_BLOCK, x);
    // SAFETY: as in `dot_q4k`.
    unsafe {
        if x.residual.is_some() {
            q6k_dot::<true>(group, x)
        } else {
            q6k_dot::<false>(group, x)
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

/// Eight bytes from `p`, widened to i32 lanes (unsigned or signed).
///
/// # Safety
/// AVX2; `p..p + 8` is readable.
#[inline(always)]
unsafe fn eight<const SIGNED: bool>(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let b = _mm_loadl_epi64(p.cast());
        if SIGNED {
            _mm256_cvtepi8_epi32(b)
        } else {
            _mm256_cvtepu8_epi32(b)
        }
    }
}

/// A block's dots in f32: `256 · value + residual` (or the value alone), in the row's step.
///
/// # Safety
/// AVX2 and FMA.
#[inline(always)]
unsafe fn combine<const PAIRED: bool>(value: __m256i, residual: __m256i) -> __m256 {
    // SAFETY: register-only intrinsics.
    unsafe {
        if PAIRED {
            _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(value),
                _mm256_set1_ps(256.0),
                _mm256_cvtepi32_ps(residual),
            )
        } else {
            _mm256_cvtepi32_ps(value)
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C; `check` passed for `group` and `x`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_dot<const PAIRED: bool>(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let value = x.value.as_ptr();
    let residual = x.residual.unwrap_or(x.value).as_ptr();
    let mut acc = _mm256_setzero_ps();
    let mut min_acc = _mm256_setzero_ps();
    for (b, gb) in group.chunks_exact(q4k::Q4K::GROUP_BLOCK).enumerate() {
        let p = gb.as_ptr();
        // SAFETY (the block): loads inside the group-block `gb` and block `b` of the
        // activation row (`check`).
        unsafe {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(q4k::D).cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(q4k::DMIN).cast()));
            let mut sums_v = _mm256_setzero_si256();
            let mut sums_r = _mm256_setzero_si256();
            let mut mins = _mm256_setzero_si256();
            for s in 0..8 {
                let scale = eight::<false>(p.add(q4k::SCALES + 8 * s));
                let min = eight::<false>(p.add(q4k::MINS + 8 * s));
                let sums = _mm256_set1_epi32(*x.sums32.get_unchecked(8 * b + s));
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
                        let (r0, r4) = (four(residual.add(at)), four(residual.add(at + 4)));
                        r16 = _mm256_add_epi16(r16, _mm256_maddubs_epi16(lo, r0));
                        r16 = _mm256_add_epi16(r16, _mm256_maddubs_epi16(hi, r4));
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
            let sums = combine::<PAIRED>(sums_v, sums_r);
            acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, step), acc);
            let mins = _mm256_cvtepi32_ps(mins);
            min_acc = _mm256_fmadd_ps(mins, _mm256_mul_ps(dmin, step), min_acc);
        }
    }
    let mut out = [0f32; ROWS];
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, min_acc)) };
    out
}

/// One row's dots with Q6_K's 16 weights `w` (weights i, 4 + i, 8 + i, 12 + i of each row)
/// at `codes`, scaled by `pair` (each row's scale in both i16 halves of its lane).
///
/// # Safety
/// AVX2; `codes..codes + 16` is inside the row.
#[inline(always)]
unsafe fn q6k_sixteen(w: &[__m256i; 4], pair: __m256i, codes: *const i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let a = _mm256_add_epi16(
            _mm256_maddubs_epi16(w[0], four(codes)),
            _mm256_maddubs_epi16(w[1], four(codes.add(4))),
        );
        let c = _mm256_add_epi16(
            _mm256_maddubs_epi16(w[2], four(codes.add(8))),
            _mm256_maddubs_epi16(w[3], four(codes.add(12))),
        );
        _mm256_add_epi32(_mm256_madd_epi16(a, pair), _mm256_madd_epi16(c, pair))
    }
}

/// # Safety
/// AVX2, FMA and F16C; `check` passed for `group` and `x`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_dot<const PAIRED: bool>(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let low16 = _mm256_set1_epi32(0xffff);
    let value = x.value.as_ptr();
    let residual = x.residual.unwrap_or(x.value).as_ptr();
    let residual_sums = x.residual_sums.unwrap_or(x.value_sums);
    let mut acc = _mm256_setzero_ps();
    for (b, gb) in group.chunks_exact(q6k::Q6K::GROUP_BLOCK).enumerate() {
        let p = gb.as_ptr();
        // SAFETY (the block): as in `q4k_dot`.
        unsafe {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(q6k::D).cast()));
            let mut sums_v = _mm256_setzero_si256();
            let mut sums_r = _mm256_setzero_si256();
            let mut centre_v = _mm256_setzero_si256();
            let mut centre_r = _mm256_setzero_si256();
            for g in 0..16 {
                let scale = eight::<true>(p.add(q6k::SCALES + 8 * g));
                // Each row's scale in both i16 halves of its lane.
                let pair =
                    _mm256_or_si256(_mm256_and_si256(scale, low16), _mm256_slli_epi32(scale, 16));
                let sixteen = 16 * b + g;
                let sum_v = *x.value_sums.get_unchecked(sixteen) as i32;
                centre_v = _mm256_add_epi32(
                    centre_v,
                    _mm256_mullo_epi32(scale, _mm256_set1_epi32(sum_v)),
                );
                let ql0 = _mm256_loadu_si256(p.add(ql_at(g, 0, 0, 0)).cast());
                let ql1 = _mm256_loadu_si256(p.add(ql_at(g, 1, 0, 0)).cast());
                let qh = _mm256_loadu_si256(p.add(qh_at(g, 0, 0)).cast());
                // Weights i, 4 + i, 8 + i, 12 + i of the sixteen: low nibbles with their top
                // bits moved to bits 4-5 (16-bit shifts: each byte's own bits land there).
                let code = |low: __m256i, top: __m256i| {
                    _mm256_or_si256(_mm256_and_si256(low, m4), _mm256_and_si256(top, m30))
                };
                let w = [
                    code(ql0, _mm256_slli_epi16(qh, 4)),
                    code(_mm256_srli_epi16(ql0, 4), _mm256_slli_epi16(qh, 2)),
                    code(ql1, qh),
                    code(_mm256_srli_epi16(ql1, 4), _mm256_srli_epi16(qh, 2)),
                ];
                let at = 256 * b + 16 * g;
                sums_v = _mm256_add_epi32(sums_v, q6k_sixteen(&w, pair, value.add(at)));
                if PAIRED {
                    sums_r = _mm256_add_epi32(sums_r, q6k_sixteen(&w, pair, residual.add(at)));
                    let sum_r = *residual_sums.get_unchecked(sixteen) as i32;
                    centre_r = _mm256_add_epi32(
                        centre_r,
                        _mm256_mullo_epi32(scale, _mm256_set1_epi32(sum_r)),
                    );
                }
            }
            let value = _mm256_sub_epi32(sums_v, _mm256_slli_epi32(centre_v, 5));
            let residual = _mm256_sub_epi32(sums_r, _mm256_slli_epi32(centre_r, 5));
            let step = _mm256_set1_ps(*x.steps.get_unchecked(b));
            let sums = combine::<PAIRED>(value, residual);
            acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, step), acc);
        }
    }
    let mut out = [0f32; ROWS];
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    out
}
