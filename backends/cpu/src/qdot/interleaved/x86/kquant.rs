//! Q4_K and Q6_K on x86. AVX2 sums in i16 over Q4_K's 32-weight sub-block (at most 16
//! products of 15 · 127 per lane: 30,480) and Q6_K's products two by two (codes up to 63:
//! 32,004), each pair then multiplied-and-added with the rows' signed scales. Value and
//! residual planes are summed apart (per block at most 8 · 63 · 32 · 15 · 127, and 16 · 128 ·
//! 16 · 63 · 127: exact in i32) and meet in f32 once per block as `256 · value + residual`, in
//! the residual's step. Q4_K's mins meet the activations' per-32 code sums already combined
//! that way (`ActRow::sums32`: at most 257 · 32 · 127 · 63 · 8), Q6_K's centre of 32 each
//! plane's per-16 sums.

use std::arch::x86_64::*;

use super::super::q4k::{self, qs_at};
use super::super::q6k::{self, qh_at, ql_at};
use super::super::{ActRow, Kind, ROWS};
use super::blocks32::nibbles32;
use super::{combine, eight, four, planes, Level};

/// The dots of the group with `R` activation rows, each group of weights decoded once for
/// all of them (prefill: 4 rows).
///
/// # Safety
/// AVX2, FMA, F16C and `L`'s features; `guarded`'s checks passed for `group` and every row,
/// and every row has a residual plane exactly when `PAIRED`.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn q4k_dot<L: Level, const PAIRED: bool, const R: usize>(
    group: &[u8],
    xs: &[&ActRow; R],
) -> [[f32; ROWS]; R] {
    // SAFETY: loads inside the group-block `gb` and block `b` of every activation row
    // (`guarded`); the caller has the features.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let (value, residual) = planes(xs);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut min_acc = [_mm256_setzero_ps(); R];
        for (b, gb) in group.chunks_exact(q4k::Q4K::GROUP_BLOCK).enumerate() {
            let p = gb.as_ptr();
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(q4k::D).cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(q4k::DMIN).cast()));
            let mut sums_v = [_mm256_setzero_si256(); R];
            let mut sums_r = [_mm256_setzero_si256(); R];
            let mut mins = [_mm256_setzero_si256(); R];
            for s in 0..8 {
                let scale = eight::<false>(p.add(q4k::SCALES + 8 * s));
                let min = eight::<false>(p.add(q4k::MINS + 8 * s));
                let mut w = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
                for (c, w) in w.iter_mut().enumerate() {
                    let q = _mm256_loadu_si256(p.add(qs_at(s, c, 0, 0)).cast());
                    *w = (
                        _mm256_and_si256(q, m4),
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                    );
                }
                let at = 256 * b + 32 * s;
                for r in 0..R {
                    let sums = _mm256_set1_epi32(*xs[r].sums32.get_unchecked(8 * b + s));
                    mins[r] = _mm256_add_epi32(mins[r], _mm256_mullo_epi32(min, sums));
                    let v = nibbles32::<L, false>(&w, value[r].add(at));
                    sums_v[r] = _mm256_add_epi32(sums_v[r], _mm256_mullo_epi32(v, scale));
                    if PAIRED {
                        let res = nibbles32::<L, false>(&w, residual[r].add(at));
                        sums_r[r] = _mm256_add_epi32(sums_r[r], _mm256_mullo_epi32(res, scale));
                    }
                }
            }
            for r in 0..R {
                let step = _mm256_set1_ps(*xs[r].steps.get_unchecked(b));
                let sums = combine::<PAIRED>(sums_v[r], sums_r[r]);
                acc[r] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, step), acc[r]);
                let mins = _mm256_cvtepi32_ps(mins[r]);
                min_acc[r] = _mm256_fmadd_ps(mins, _mm256_mul_ps(dmin, step), min_acc[r]);
            }
        }
        let mut out = [[0f32; ROWS]; R];
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_sub_ps(acc[r], min_acc[r]));
        }
        out
    }
}

/// One row's dots with Q6_K's 16 weights `w` (weights i, 4 + i, 8 + i, 12 + i of each row)
/// at `codes`, times each row's signed `scale` (`pair`: the scale in both i16 halves of its
/// lane).
///
/// # Safety
/// AVX2 and `L`'s features; `codes..codes + 16` is inside the row.
#[inline(always)]
unsafe fn q6k_sixteen<L: Level>(
    w: &[__m256i; 4],
    scale: __m256i,
    pair: __m256i,
    codes: *const i8,
) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        if L::VNNI {
            let mut acc = _mm256_setzero_si256();
            for (t, w) in w.iter().enumerate() {
                acc = L::dot4_add(acc, *w, four(codes.add(4 * t)));
            }
            _mm256_mullo_epi32(acc, scale)
        } else {
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
}

/// Q6_K's dots with each of `R` activation rows in turn (the group stays in cache).
///
/// # Safety
/// As `q6k_row`'s, for every row.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn q6k_dot<L: Level, const PAIRED: bool, const R: usize>(
    group: &[u8],
    xs: &[&ActRow; R],
) -> [[f32; ROWS]; R] {
    let mut out = [[0f32; ROWS]; R];
    for r in 0..R {
        // SAFETY: the caller's contract.
        out[r] = unsafe { q6k_row::<L, PAIRED>(group, xs[r]) };
    }
    out
}

/// # Safety
/// AVX2, FMA, F16C and `L`'s features; `guarded`'s checks passed for `group` and `x`, which
/// has a residual plane exactly when `PAIRED`.
#[inline(always)]
unsafe fn q6k_row<L: Level, const PAIRED: bool>(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    // SAFETY: as in `q4k_dot`.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let m30 = _mm256_set1_epi8(0x30);
        let low16 = _mm256_set1_epi32(0xffff);
        let value = x.value.as_ptr();
        let residual = x.residual.unwrap_or(x.value).as_ptr();
        let residual_sums = x.residual_sums.unwrap_or(x.value_sums);
        let mut acc = _mm256_setzero_ps();
        for (b, gb) in group.chunks_exact(q6k::Q6K::GROUP_BLOCK).enumerate() {
            let p = gb.as_ptr();
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(q6k::D).cast()));
            let mut sums_v = _mm256_setzero_si256();
            let mut sums_r = _mm256_setzero_si256();
            let mut centre_v = _mm256_setzero_si256();
            let mut centre_r = _mm256_setzero_si256();
            for g in 0..16 {
                let scale = eight::<true>(p.add(q6k::SCALES + 8 * g));
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
                let w = [
                    (ql0, _mm256_slli_epi16(qh, 4)),
                    (_mm256_srli_epi16(ql0, 4), _mm256_slli_epi16(qh, 2)),
                    (ql1, qh),
                    (_mm256_srli_epi16(ql1, 4), _mm256_srli_epi16(qh, 2)),
                ];
                let mut codes = [_mm256_setzero_si256(); 4];
                for (code, (low, top)) in codes.iter_mut().zip(w) {
                    *code = _mm256_or_si256(_mm256_and_si256(low, m4), _mm256_and_si256(top, m30));
                }
                let at = 256 * b + 16 * g;
                sums_v =
                    _mm256_add_epi32(sums_v, q6k_sixteen::<L>(&codes, scale, pair, value.add(at)));
                if PAIRED {
                    sums_r = _mm256_add_epi32(
                        sums_r,
                        q6k_sixteen::<L>(&codes, scale, pair, residual.add(at)),
                    );
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
        let mut out = [0f32; ROWS];
        _mm256_storeu_ps(out.as_mut_ptr(), acc);
        out
    }
}
