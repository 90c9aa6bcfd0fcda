//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 on x86: per 32-weight block, each plane's integer dot in
//! the row's i32 lane, `256 · value + residual` in i32 (at most 257 · 32 · 255 · 127: exact),
//! one conversion, one multiply-add with the rows' scales times the block's activation step.
//!
//! The 4- and 5-bit codes are unsigned, as `maddubs` and `vpdpbusd` want them (AVX2 sums 5-bit
//! products in i16 two chunks at a time: 8 of 31 · 127, 31,496). Q8_0's are signed:
//! AVX2 multiplies their magnitudes by the activations carrying their signs (`sign`: at most
//! 2 · 128 · 127 per i16 lane, so each product pair goes to i32 at once); VNNI levels flip the
//! codes' top bit (code + 128, unsigned) and take 128 times the activations' sums off after.

use std::arch::x86_64::*;

use super::super::blocks32::{self, Q45, Q8_0};
use super::super::{ActRow, Kind, ROWS};
use super::{four, planes, Level};

/// `256 · value + residual`, or the value alone.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn paired<const PAIRED: bool>(value: __m256i, residual: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics.
    unsafe {
        if PAIRED {
            _mm256_add_epi32(_mm256_slli_epi32(value, 8), residual)
        } else {
            value
        }
    }
}

/// Bit `b` of each byte of `h` at bit 4, the rest cleared (16-bit shifts: each byte's own bit
/// lands there for shifts up to 4 either way).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn bit_at_4(h: __m256i, b: usize) -> __m256i {
    // SAFETY: register-only intrinsics.
    unsafe {
        let moved = match b {
            0 => _mm256_slli_epi16(h, 4),
            1 => _mm256_slli_epi16(h, 3),
            2 => _mm256_slli_epi16(h, 2),
            3 => _mm256_slli_epi16(h, 1),
            4 => h,
            5 => _mm256_srli_epi16(h, 1),
            6 => _mm256_srli_epi16(h, 2),
            _ => _mm256_srli_epi16(h, 3),
        };
        _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
    }
}

/// Row-lane dots of 32 weights of 4 or 5 bits (4 chunks of `lo`/`hi` registers: Q4_K's
/// sub-block, a Q4 / Q5 block) with the codes at `codes`: i32 per row. AVX2 sums `maddubs`
/// pairs in i16 over the whole 32 for 4-bit codes (16 of 15 · 127: 30,480), over 16 for
/// 5-bit ones.
///
/// # Safety
/// AVX2 and `L`'s features; `codes..codes + 32` is inside the row.
#[inline(always)]
pub(super) unsafe fn nibbles32<L: Level, const FIFTH: bool>(
    w: &[(__m256i, __m256i); 4],
    codes: *const i8,
) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        if L::VNNI {
            let mut acc = _mm256_setzero_si256();
            for (c, (lo, hi)) in w.iter().enumerate() {
                acc = L::dot4_add(acc, *lo, four(codes.add(8 * c)));
                acc = L::dot4_add(acc, *hi, four(codes.add(8 * c + 4)));
            }
            acc
        } else {
            let ones = _mm256_set1_epi16(1);
            let mut acc = _mm256_setzero_si256();
            let mut acc16 = _mm256_setzero_si256();
            for (c, (lo, hi)) in w.iter().enumerate() {
                acc16 = _mm256_add_epi16(acc16, _mm256_maddubs_epi16(*lo, four(codes.add(8 * c))));
                let p = _mm256_maddubs_epi16(*hi, four(codes.add(8 * c + 4)));
                acc16 = _mm256_add_epi16(acc16, p);
                if FIFTH && c % 2 == 1 {
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(acc16, ones));
                    acc16 = _mm256_setzero_si256();
                }
            }
            if FIFTH {
                acc
            } else {
                _mm256_madd_epi16(acc16, ones)
            }
        }
    }
}

/// The 4- and 5-bit types (`MIN`: offsets `m`, else centred codes; `FIFTH`: a fifth bit per
/// weight) with `R` activation rows, each block's codes decoded once for all of them.
///
/// # Safety
/// AVX2, FMA, F16C and `L`'s features; `guarded`'s checks passed for `group` and every row,
/// and every row has a residual plane exactly when `PAIRED`.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn q45_dot<
    L: Level,
    const PAIRED: bool,
    const R: usize,
    const MIN: bool,
    const FIFTH: bool,
>(
    group: &[u8],
    xs: &[&ActRow; R],
) -> [[f32; ROWS]; R] {
    type K<const MIN: bool, const FIFTH: bool> = Q45<MIN, FIFTH>;
    // SAFETY: loads inside the group-block `gb` and block `b` of every activation row
    // (`guarded`); the caller has the features.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let (value, residual) = planes(xs);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, gb) in group.chunks_exact(K::<MIN, FIFTH>::GROUP_BLOCK).enumerate() {
            let p = gb.as_ptr();
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(blocks32::D).cast()));
            let high = if FIFTH {
                _mm256_loadu_si256(p.add(K::<MIN, FIFTH>::QH).cast())
            } else {
                _mm256_setzero_si256()
            };
            let mut w = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
            for (c, w) in w.iter_mut().enumerate() {
                let q = _mm256_loadu_si256(p.add(K::<MIN, FIFTH>::QS + 32 * c).cast());
                *w = (
                    _mm256_and_si256(q, m4),
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                );
                if FIFTH {
                    w.0 = _mm256_or_si256(w.0, bit_at_4(high, 2 * c));
                    w.1 = _mm256_or_si256(w.1, bit_at_4(high, 2 * c + 1));
                }
            }
            for r in 0..R {
                let x = xs[r];
                let at = 32 * b;
                let v = nibbles32::<L, FIFTH>(&w, value[r].add(at));
                let res = if PAIRED {
                    nibbles32::<L, FIFTH>(&w, residual[r].add(at))
                } else {
                    v
                };
                let mut dot = paired::<PAIRED>(v, res);
                let sums = *x.sums32.get_unchecked(b);
                let step = *x.steps.get_unchecked(b);
                if !MIN {
                    let centre = K::<MIN, FIFTH>::CENTRE;
                    dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(centre * sums));
                }
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(step));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
                if MIN {
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(p.add(blocks32::M).cast()));
                    acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(sums as f32 * step), acc[r]);
                }
            }
        }
        let mut out = [[0f32; ROWS]; R];
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
        out
    }
}

/// One plane's dot with Q8_0's 32 weights of each row: `w` the chunks (as stored on AVX2,
/// top bit flipped on VNNI levels), `mag` their magnitudes (AVX2).
///
/// # Safety
/// AVX2 and `L`'s features; `codes..codes + 32` is inside the row.
#[inline(always)]
unsafe fn q8_plane<L: Level>(w: &[__m256i; 8], mag: &[__m256i; 8], codes: *const i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = _mm256_setzero_si256();
        for c in 0..8 {
            let x = four(codes.add(4 * c));
            acc = if L::VNNI {
                L::dot4_add(acc, w[c], x)
            } else {
                let p = _mm256_maddubs_epi16(mag[c], _mm256_sign_epi8(x, w[c]));
                _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
            };
        }
        acc
    }
}

/// Q8_0 with `R` activation rows.
///
/// # Safety
/// As `q45_dot`'s.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn q8_0_dot<
    L: Level,
    const PAIRED: bool,
    const R: usize,
>(
    group: &[u8],
    xs: &[&ActRow; R],
) -> [[f32; ROWS]; R] {
    // SAFETY: as in `q45_dot`.
    unsafe {
        let top = _mm256_set1_epi8(-128);
        let (value, residual) = planes(xs);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, gb) in group.chunks_exact(Q8_0::GROUP_BLOCK).enumerate() {
            let p = gb.as_ptr();
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(blocks32::D).cast()));
            let mut w = [_mm256_setzero_si256(); 8];
            let mut mag = [_mm256_setzero_si256(); 8];
            for c in 0..8 {
                let q = _mm256_loadu_si256(p.add(Q8_0::QS + 32 * c).cast());
                if L::VNNI {
                    w[c] = _mm256_xor_si256(q, top);
                } else {
                    w[c] = q;
                    mag[c] = _mm256_abs_epi8(q);
                }
            }
            for r in 0..R {
                let x = xs[r];
                let at = 32 * b;
                let v = q8_plane::<L>(&w, &mag, value[r].add(at));
                let res = if PAIRED {
                    q8_plane::<L>(&w, &mag, residual[r].add(at))
                } else {
                    v
                };
                let mut dot = paired::<PAIRED>(v, res);
                if L::VNNI {
                    // Each plane's codes met code + 128: 128 times their sums (both planes'
                    // combined as the dots are) come off.
                    let sums = *x.sums32.get_unchecked(b);
                    dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(128 * sums));
                }
                let step = _mm256_set1_ps(*x.steps.get_unchecked(b));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, step), acc[r]);
            }
        }
        let mut out = [[0f32; ROWS]; R];
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
        out
    }
}
