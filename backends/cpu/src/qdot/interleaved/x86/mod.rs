//! The interleaved kernels on x86 (AVX2 and the VNNI levels; F16C for the rows' f16 scales):
//! lane `r` of each vector is row `r` of the group, and each 32 bytes of weights meet 4
//! activations broadcast to every lane. Every type's body is written once against `Lanes`
//! and compiled for 256-bit registers (one group) and, on the AVX-512 levels, 512-bit ones
//! carrying two groups side by side (`lanes::Zmm`: half the instructions per weight; on the
//! Xeon of the README the Q4_K / Q5_0 / Q8_0 kernels ran 1.2-1.5x faster, see there).
//!
//! AVX2 multiplies with `maddubs` into i16 lanes and sums a few in i16 before a multiply-add
//! of lane pairs into i32; VNNI levels add 4 products straight into the row's i32 lane
//! (`vpdpbusd`: one instruction for `maddubs` and the add, no pair sum; prefill on the 1B
//! Q4_K_M model: see the README). Each level's kernels are the same bodies (each type's `x86`
//! module: `blocks32::x86`, `q4k::x86`, `q6k::x86`) compiled with its features, for one
//! activation plane or two, behind `guarded`.

use std::arch::x86_64::*;

use super::{ActRow, Kernels, Kind};
use crate::isa::Isa;
pub(super) use lanes::{Blocks, Lanes};
use lanes::{Ymm, Zmm};

mod lanes;

/// `K`'s group kernels for `R` activation rows at level `isa`, where this CPU runs them: on
/// 256-bit registers at every level, and on 512-bit ones (two groups at a time) at the
/// AVX-512 levels.
pub(super) fn kernels<K: Kind, const R: usize>(isa: Isa) -> Option<Kernels<R>> {
    if !super::kernels_available() || !isa.supported() {
        return None;
    }
    Some(match isa {
        Isa::Scalar => return None,
        Isa::Avx2 => Kernels {
            one: avx2::dot::<K, R>,
            two: None,
        },
        Isa::AvxVnni => Kernels {
            one: avxvnni::dot::<K, R>,
            two: None,
        },
        Isa::Avx512 => Kernels {
            one: avx2::dot::<K, R>,
            two: Some(avx512::dot::<K, R>),
        },
        Isa::Avx512Vnni => Kernels {
            one: avx512vnni::dot::<K, R>,
            two: Some(avx512vnni_wide::dot::<K, R>),
        },
    })
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
type Run<const R: usize> = unsafe fn(Blocks, usize, &[&ActRow; R]) -> [[f32; 16]; R];

/// `run` (one plane, two) on `groups` (as many as `V` holds) and `R` activation rows, after
/// the checks that make its loads sound and its features present.
#[inline(always)]
fn guarded<K: Kind, V: Lanes, const R: usize>(
    isa: Isa,
    groups: &[&[u8]],
    xs: &[&ActRow; R],
    run: [Run<R>; 2],
) -> [[f32; 16]; R] {
    assert_eq!(groups.len(), V::GROUPS, "interleaved: groups per register");
    let nb = groups[0].len() / K::GROUP_BLOCK;
    let paired = xs.first().is_some_and(|x| x.residual.is_some());
    for g in groups {
        assert_eq!(
            g.len(),
            nb * K::GROUP_BLOCK,
            "interleaved: groups of different lengths"
        );
    }
    for x in xs {
        assert!(
            x.covers(nb, K::WEIGHTS),
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
    let blocks = [groups[0].as_ptr(), groups[V::GROUPS - 1].as_ptr()];
    // SAFETY: the checks above cover every load and found the level's features.
    unsafe { run[usize::from(paired)](blocks, nb, xs) }
}

/// The kernels of a level on registers `$lanes` (a module of its own): every type's body
/// (`Kind::dot_x86`) compiled with the level's features, for one plane or two, behind
/// `guarded`.
macro_rules! level_kernels {
    ($module:ident, $lanes:ty, $isa:ident, $features:literal) => {
        mod $module {
            use super::*;

            /// # Safety
            /// The level's features; `guarded`'s checks passed.
            #[target_feature(enable = $features)]
            unsafe fn run<K: Kind, const PAIRED: bool, const R: usize>(
                blocks: Blocks,
                nb: usize,
                xs: &[&ActRow; R],
            ) -> [[f32; 16]; R] {
                // SAFETY: forwarded.
                unsafe { K::dot_x86::<$lanes, PAIRED, R>(blocks, nb, xs) }
            }

            /// `K`'s group kernel on this level.
            pub(super) fn dot<K: Kind, const R: usize>(
                groups: &[&[u8]],
                xs: &[&ActRow; R],
            ) -> [[f32; 16]; R] {
                guarded::<K, $lanes, R>(
                    Isa::$isa,
                    groups,
                    xs,
                    [run::<K, false, R>, run::<K, true, R>],
                )
            }
        }
    };
}

level_kernels!(avx2, Ymm<Avx2>, Avx2, "avx2,fma,f16c");
level_kernels!(avxvnni, Ymm<AvxVnni>, AvxVnni, "avx2,fma,f16c,avxvnni");
level_kernels!(
    avx512vnni,
    Ymm<Avx512Vnni>,
    Avx512Vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl"
);
level_kernels!(
    avx512,
    Zmm<false>,
    Avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
);
level_kernels!(
    avx512vnni_wide,
    Zmm<true>,
    Avx512Vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
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

/// How far ahead of the block being read the single-row kernels ask for each group's bytes.
/// Decode streams every matrix once per token and the hardware prefetchers alone left the
/// kernels waiting: on the Xeon of the README the 1B Q4_K_M model decoded at 19.3 tok/s
/// without the hints, 24.4 / 26.3 / 25.0 with them 1, 2 and 3 KB ahead (medians of 3
/// alternated runs; Q8_0 14.8 → 16.9, SmolLM2 Q4_K_M 105 → 107-117). Not measured on AMD,
/// where hints on the row-major kernels' long tiles were slower (`tiles::prefetch_ahead`).
const PREFETCH_BYTES: usize = 2048;

/// Group-block `b`'s start in each group (`Kind::GROUP_BLOCK` bytes apart), and with
/// `prefetch` (the single-row kernels: several rows read a group from cache after the first)
/// a hint for the bytes `PREFETCH_BYTES` further on.
///
/// # Safety
/// Block `b` is inside every group.
#[inline(always)]
pub(super) unsafe fn block(groups: Blocks, b: usize, group_block: usize, prefetch: bool) -> Blocks {
    if prefetch {
        // One group (`Ymm`) names its start twice.
        let distinct = if groups[0] == groups[1] { 1 } else { 2 };
        for &p in &groups[..distinct] {
            for line in (0..group_block).step_by(64) {
                let ahead = p.wrapping_add(b * group_block + PREFETCH_BYTES + line);
                // SAFETY: a hint, which reads nothing architecturally and cannot fault, even
                // past the matrix's end.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.cast()) };
            }
        }
    }
    // SAFETY: the caller's contract.
    unsafe { groups.map(|p| p.add(b * group_block)) }
}

/// A block's dots in f32: `256 · value + residual` (or the value alone), in the row's step.
///
/// # Safety
/// `V`'s features.
#[inline(always)]
pub(super) unsafe fn combine<V: Lanes, const PAIRED: bool>(value: V::I, residual: V::I) -> V::F {
    // SAFETY: register-only operations.
    unsafe {
        if PAIRED {
            V::fmadd(V::cvt(value), V::splat_f(256.0), V::cvt(residual))
        } else {
            V::cvt(value)
        }
    }
}

/// The lanes of `acc` for each of `R` rows.
///
/// # Safety
/// `V`'s features.
#[inline(always)]
pub(super) unsafe fn stored<V: Lanes, const R: usize>(acc: [V::F; R]) -> [[f32; 16]; R] {
    let mut out = [[0f32; 16]; R];
    for r in 0..R {
        // SAFETY: a register store into an array of 16.
        unsafe { V::store(acc[r], &mut out[r]) };
    }
    out
}
