//! The interleaved kernels on x86 (AVX2 and the VNNI levels; F16C for the rows' f16 scales):
//! lane `r` of each vector is row `r` of the group, and each 32-byte register of weights
//! meets 4 activations broadcast to every lane.
//!
//! AVX2 multiplies with `maddubs` into i16 lanes and sums in i16 before one multiply-add of
//! lane pairs: Q4_K over a 32-weight sub-block (at most 16 products of 15 · 127 per lane:
//! 30,480), Q6_K two by two (codes up to 63: 32,004), each pair then multiplied-and-added with
//! the rows' signed scales. VNNI levels add 4 products straight into the row's i32 lane
//! (`vpdpbusd`: one instruction for `maddubs` and the add, no pair sum; prefill on the 1B
//! Q4_K_M model: see the README). Value and residual planes are summed apart (per block at
//! most 8 · 63 · 32 · 15 · 127, and 16 · 128 · 16 · 63 · 127: exact in i32) and meet in f32
//! once per block as `256 · value + residual`, in the residual's step. Q4_K's mins meet the
//! activations' per-32 code sums already combined that way (`ActRow::sums32`: at most 257 · 32
//! · 127 · 63 · 8), Q6_K's centre of 32 each plane's per-16 sums.

use std::arch::x86_64::*;

use super::q4k::{self, qs_at};
use super::q6k::{self, qh_at, ql_at};
use super::{ActRow, Kernels, Kind, ROWS};
use crate::isa::Isa;

/// The group kernels of the level `isa`, where this CPU runs it.
pub(super) fn kernels(isa: Isa) -> Option<Kernels> {
    if !super::kernels_available() || !isa.supported() {
        return None;
    }
    macro_rules! of {
        ($q4k:ident, $q6k:ident) => {
            Kernels {
                q4k: |group, x| $q4k::<1>(group, &[x])[0],
                q4k_4: $q4k::<4>,
                q6k: $q6k,
            }
        };
    }
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 | Isa::Avx512 => Some(of!(q4k_avx2, q6k_avx2)),
        Isa::AvxVnni => Some(of!(q4k_avxvnni, q6k_avxvnni)),
        Isa::Avx512Vnni => Some(of!(q4k_avx512vnni, q6k_avx512vnni)),
    }
}

/// A level's way of adding 4-byte products into a row's lane: `maddubs` into i16 lanes (AVX2:
/// the kernels sum a few in i16, then pairs into i32), or `vpdpbusd` straight into the i32
/// lane (VNNI).
trait Level {
    const VNNI: bool;
    /// `acc + Σ4 u · s` in each i32 lane (`VNNI` levels only).
    ///
    /// # Safety
    /// The level's features.
    unsafe fn dot4_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

struct Avx2;
impl Level for Avx2 {
    const VNNI: bool = false;
    #[inline(always)]
    unsafe fn dot4_add(_: __m256i, _: __m256i, _: __m256i) -> __m256i {
        unreachable!("AVX2 sums in i16")
    }
}

struct AvxVnni;
impl Level for AvxVnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dot4_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: a register-only intrinsic; the caller has AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

struct Avx512Vnni;
impl Level for Avx512Vnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dot4_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: a register-only intrinsic; the caller has AVX-512 VNNI and VL.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// The safe kernels of a level: the checks that make the loads sound and the level's
/// features present, then the body compiled with those features, for one plane or two.
macro_rules! level_kernels {
    ($level:ident, $isa:ident, $features:literal, $q4k:ident, $q6k:ident) => {
        /// `Q4K::dot_scalar` on this level, for `R` activation rows at once.
        fn $q4k<const R: usize>(group: &[u8], xs: &[&ActRow; R]) -> [[f32; ROWS]; R] {
            /// # Safety
            /// The level's features; `check` passed for every row.
            #[target_feature(enable = $features)]
            unsafe fn run<const PAIRED: bool, const R: usize>(
                group: &[u8],
                xs: &[&ActRow; R],
            ) -> [[f32; ROWS]; R] {
                // SAFETY: forwarded.
                unsafe { q4k_dot::<$level, PAIRED, R>(group, xs) }
            }
            let paired = xs.first().is_some_and(|x| x.residual.is_some());
            for x in xs {
                check(group, q4k::Q4K::GROUP_BLOCK, x, Isa::$isa);
                assert_eq!(
                    x.residual.is_some(),
                    paired,
                    "interleaved: rows of mixed planes"
                );
            }
            // SAFETY: `check` covers every load and found the level's features.
            unsafe {
                if paired {
                    run::<true, R>(group, xs)
                } else {
                    run::<false, R>(group, xs)
                }
            }
        }

        /// `Q6K::dot_scalar` on this level.
        fn $q6k(group: &[u8], x: &ActRow) -> [f32; ROWS] {
            /// # Safety
            /// The level's features; `check` passed.
            #[target_feature(enable = $features)]
            unsafe fn run<const PAIRED: bool>(group: &[u8], x: &ActRow) -> [f32; ROWS] {
                // SAFETY: forwarded.
                unsafe { q6k_dot::<$level, PAIRED>(group, x) }
            }
            check(group, q6k::Q6K::GROUP_BLOCK, x, Isa::$isa);
            // SAFETY: as above.
            unsafe {
                if x.residual.is_some() {
                    run::<true>(group, x)
                } else {
                    run::<false>(group, x)
                }
            }
        }
    };
}

level_kernels!(Avx2, Avx2, "avx2,fma,f16c", q4k_avx2, q6k_avx2);
level_kernels!(
    AvxVnni,
    AvxVnni,
    "avx2,fma,f16c,avxvnni",
    q4k_avxvnni,
    q6k_avxvnni
);
level_kernels!(
    Avx512Vnni,
    Avx512Vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    q4k_avx512vnni,
    q6k_avx512vnni
);

/// The checks that make the kernels' loads sound and their features present.
fn check(group: &[u8], group_block: usize, x: &ActRow, isa: Isa) {
    let nb = group.len() / group_block;
    assert!(
        group.len() == nb * group_block && x.covers(nb),
        "interleaved: a group and an activation row of different lengths"
    );
    assert!(
        super::kernels_available() && isa.supported(),
        "interleaved kernels of a level this CPU lacks"
    );
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

/// Row-lane dots of a Q4_K sub-block's 32 weights (4 chunks of `lo`/`hi` registers) with
/// the codes at `codes`: i32 per row.
///
/// # Safety
/// AVX2 and `L`'s features; `codes..codes + 32` is inside the row.
#[inline(always)]
unsafe fn q4k_sub<L: Level>(w: &[(__m256i, __m256i); 4], codes: *const i8) -> __m256i {
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
            let mut acc16 = _mm256_setzero_si256();
            for (c, (lo, hi)) in w.iter().enumerate() {
                acc16 = _mm256_add_epi16(acc16, _mm256_maddubs_epi16(*lo, four(codes.add(8 * c))));
                let p = _mm256_maddubs_epi16(*hi, four(codes.add(8 * c + 4)));
                acc16 = _mm256_add_epi16(acc16, p);
            }
            _mm256_madd_epi16(acc16, _mm256_set1_epi16(1))
        }
    }
}

/// The dots of the group with `R` activation rows, each group of weights decoded once for
/// all of them (prefill: 4 rows).
///
/// # Safety
/// AVX2, FMA, F16C and `L`'s features; `check` passed for `group` and every row, and every
/// row has a residual plane exactly when `PAIRED`.
#[inline(always)]
unsafe fn q4k_dot<L: Level, const PAIRED: bool, const R: usize>(
    group: &[u8],
    xs: &[&ActRow; R],
) -> [[f32; ROWS]; R] {
    // SAFETY: loads inside the group-block `gb` and block `b` of every activation row
    // (`check`); the caller has the features.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let mut value = [std::ptr::null(); R];
        let mut residual = [std::ptr::null(); R];
        for r in 0..R {
            value[r] = xs[r].value.as_ptr();
            residual[r] = xs[r].residual.unwrap_or(xs[r].value).as_ptr();
        }
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
                    let v = q4k_sub::<L>(&w, value[r].add(at));
                    sums_v[r] = _mm256_add_epi32(sums_v[r], _mm256_mullo_epi32(v, scale));
                    if PAIRED {
                        let res = q4k_sub::<L>(&w, residual[r].add(at));
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

/// # Safety
/// AVX2, FMA, F16C and `L`'s features; `check` passed for `group` and `x`.
#[inline(always)]
unsafe fn q6k_dot<L: Level, const PAIRED: bool>(group: &[u8], x: &ActRow) -> [f32; ROWS] {
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
