//! The interleaved kernels on x86 (AVX2 and the VNNI levels; F16C for the rows' f16 scales):
//! lane `r` of each vector is row `r` of the group, and each 32-byte register of weights
//! meets 4 activations broadcast to every lane.
//!
//! AVX2 multiplies with `maddubs` into i16 lanes and sums a few in i16 before a multiply-add
//! of lane pairs into i32; VNNI levels add 4 products straight into the row's i32 lane
//! (`vpdpbusd`: one instruction for `maddubs` and the add, no pair sum; prefill on the 1B
//! Q4_K_M model: see the README). Each level's kernels are the same bodies (`kquant`,
//! `blocks32`) compiled with its features, for one activation plane or two, behind `guarded`.

use std::arch::x86_64::*;

use super::{ActRow, GroupDots, Kind, ROWS};
use crate::isa::Isa;

pub(super) mod blocks32;
pub(super) mod kquant;

/// `K`'s group kernel for `R` activation rows at level `isa`, where this CPU runs it.
pub(super) fn kernel<K: Kind, const R: usize>(isa: Isa) -> Option<GroupDots<R>> {
    if !super::kernels_available() || !isa.supported() {
        return None;
    }
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 | Isa::Avx512 => Some(avx2::dot::<K, R>),
        Isa::AvxVnni => Some(avxvnni::dot::<K, R>),
        Isa::Avx512Vnni => Some(avx512vnni::dot::<K, R>),
    }
}

/// A level's way of adding 4-byte products into a row's lane: `maddubs` into i16 lanes (AVX2:
/// the kernels sum a few in i16, then pairs into i32), or `vpdpbusd` straight into the i32
/// lane (VNNI).
pub(super) trait Level {
    const VNNI: bool;
    /// `acc + Σ4 u · s` in each i32 lane (`VNNI` levels only).
    ///
    /// # Safety
    /// The level's features.
    unsafe fn dot4_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

pub(super) struct Avx2;
impl Level for Avx2 {
    const VNNI: bool = false;
    #[inline(always)]
    unsafe fn dot4_add(_: __m256i, _: __m256i, _: __m256i) -> __m256i {
        unreachable!("AVX2 sums in i16")
    }
}

pub(super) struct AvxVnni;
impl Level for AvxVnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dot4_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: a register-only intrinsic; the caller has AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

pub(super) struct Avx512Vnni;
impl Level for Avx512Vnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dot4_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: a register-only intrinsic; the caller has AVX-512 VNNI and VL.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// A kernel compiled with its level's features, for one activation plane (`PAIRED =
/// false`) or two.
///
/// # Safety
/// The level's features; `guarded`'s checks passed.
type Run<const R: usize> = unsafe fn(&[u8], &[&ActRow; R]) -> [[f32; ROWS]; R];

/// `run` (one plane, two) on `R` activation rows, after the checks that make its loads sound
/// and its features present.
#[inline(always)]
fn guarded<K: Kind, const R: usize>(
    isa: Isa,
    group: &[u8],
    xs: &[&ActRow; R],
    run: [Run<R>; 2],
) -> [[f32; ROWS]; R] {
    let nb = group.len() / K::GROUP_BLOCK;
    let paired = xs.first().is_some_and(|x| x.residual.is_some());
    for x in xs {
        assert!(
            group.len() == nb * K::GROUP_BLOCK && x.covers(nb, K::WEIGHTS),
            "interleaved: a group and an activation row of different lengths"
        );
        assert_eq!(
            x.residual.is_some(),
            paired,
            "interleaved: rows of mixed planes"
        );
    }
    assert!(
        super::kernels_available() && isa.supported(),
        "interleaved kernels of a level this CPU lacks"
    );
    // SAFETY: the checks above cover every load and found the level's features.
    unsafe { run[usize::from(paired)](group, xs) }
}

/// The kernels of a level (a module of its own): every type's body (`Kind::dot_x86`)
/// compiled with the level's features, for one plane or two, behind `guarded`.
macro_rules! level_kernels {
    ($module:ident, $level:ident, $isa:ident, $features:literal) => {
        mod $module {
            use super::*;

            /// # Safety
            /// The level's features; `guarded`'s checks passed.
            #[target_feature(enable = $features)]
            unsafe fn run<K: Kind, const PAIRED: bool, const R: usize>(
                group: &[u8],
                xs: &[&ActRow; R],
            ) -> [[f32; ROWS]; R] {
                // SAFETY: forwarded.
                unsafe { K::dot_x86::<$level, PAIRED, R>(group, xs) }
            }

            /// `K`'s group kernel on this level.
            pub(super) fn dot<K: Kind, const R: usize>(
                group: &[u8],
                xs: &[&ActRow; R],
            ) -> [[f32; ROWS]; R] {
                guarded::<K, R>(
                    Isa::$isa,
                    group,
                    xs,
                    [run::<K, false, R>, run::<K, true, R>],
                )
            }
        }
    };
}

level_kernels!(avx2, Avx2, Avx2, "avx2,fma,f16c");
level_kernels!(avxvnni, AvxVnni, AvxVnni, "avx2,fma,f16c,avxvnni");
level_kernels!(
    avx512vnni,
    Avx512Vnni,
    Avx512Vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl"
);

/// The activation rows' code pointers: each plane, or the value plane where there is no
/// residual (never read then).
#[inline(always)]
pub(super) fn planes<const R: usize>(xs: &[&ActRow; R]) -> ([*const i8; R], [*const i8; R]) {
    let mut value = [std::ptr::null(); R];
    let mut residual = [std::ptr::null(); R];
    for r in 0..R {
        value[r] = xs[r].value.as_ptr();
        residual[r] = xs[r].residual.unwrap_or(xs[r].value).as_ptr();
    }
    (value, residual)
}

/// Four codes as one lane, broadcast to all eight.
///
/// # Safety
/// AVX; `p..p + 4` is inside the row.
#[inline(always)]
pub(super) unsafe fn four(p: *const i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Eight bytes from `p`, widened to i32 lanes (unsigned or signed).
///
/// # Safety
/// AVX2; `p..p + 8` is readable.
#[inline(always)]
pub(super) unsafe fn eight<const SIGNED: bool>(p: *const u8) -> __m256i {
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
pub(super) unsafe fn combine<const PAIRED: bool>(value: __m256i, residual: __m256i) -> __m256 {
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
