//! The registers the interleaved kernels run on, one i32 or f32 lane per weight row: 256-bit
//! (`Ymm`: one group of 8 rows, every level) or 512-bit (`Zmm`: two groups side by side, lanes
//! 8..16 the second group's rows, on the AVX-512 levels). Each kernel body is written once
//! against `Lanes` and compiled for both, so a 512-bit register carries two groups' weights
//! through the same instructions; where a CPU runs 512-bit operations at the 256-bit ones'
//! rate (Intel's server cores), that halves the instructions per weight (see the README).
//!
//! Every method is `#[inline(always)]` and only called from the levels' `#[target_feature]`
//! kernels (`super::level_kernels`), which have the features the intrinsics need.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::Level;

/// `$shift::<N>($a)` for the 256-bit shifts, whose immediate is an `i32` where the 512-bit
/// ones' is a `u32` (stable Rust cannot cast a const parameter): the match on `N` folds away.
macro_rules! by_immediate {
    ($shift:ident, $n:expr, $a:expr) => {
        match $n {
            1 => $shift::<1>($a),
            2 => $shift::<2>($a),
            3 => $shift::<3>($a),
            4 => $shift::<4>($a),
            5 => $shift::<5>($a),
            8 => $shift::<8>($a),
            16 => $shift::<16>($a),
            n => unreachable!("no shift by {n}"),
        }
    };
}

/// Where each register's groups' bytes start: one group-block per group (the second is the
/// first again for `Ymm`, and never read).
pub(in crate::qdot::interleaved) type Blocks = [*const u8; 2];

/// A register of row lanes and the operations the kernel bodies use on it.
///
/// # Safety
/// Every method needs the features of the level the implementation belongs to; pointers name
/// readable bytes (the sizes in each method's doc).
pub(in crate::qdot::interleaved) trait Lanes {
    /// Groups of 8 rows per register.
    const GROUPS: usize;
    /// Whether products add into the i32 lanes with `vpdpbusd` (else `maddubs` into i16).
    const VNNI: bool;
    /// Integer lanes (i32, or i16 / i8 inside them).
    type I: Copy;
    /// f32 lanes.
    type F: Copy;

    unsafe fn zero() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn splat(v: i32) -> Self::I;
    unsafe fn splat8(v: i8) -> Self::I;
    unsafe fn splat16(v: i16) -> Self::I;
    unsafe fn splat_f(v: f32) -> Self::F;
    /// 32 bytes at `at` of each group-block.
    unsafe fn load(p: Blocks, at: usize) -> Self::I;
    /// 8 bytes at `at` of each group-block, widened to i32 lanes (unsigned or signed).
    unsafe fn eight<const SIGNED: bool>(p: Blocks, at: usize) -> Self::I;
    /// 8 f16 at `at` of each group-block, as f32 lanes.
    unsafe fn halves(p: Blocks, at: usize) -> Self::F;
    /// The 4 codes at `p` as one i32 lane, broadcast to all.
    unsafe fn four(p: *const i8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn xor(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mullo32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add16(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn srli16<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn slli16<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn slli32<const N: u32>(a: Self::I) -> Self::I;
    /// `acc + Σ4 u · s` in each i32 lane (`VNNI` only).
    unsafe fn dot4_add(acc: Self::I, u: Self::I, s: Self::I) -> Self::I;
    /// Unsigned `u` times signed `s`, pairs summed into i16 lanes (saturating).
    unsafe fn maddubs(u: Self::I, s: Self::I) -> Self::I;
    /// i16 `a` times `b`, pairs summed into i32 lanes.
    unsafe fn madd16(a: Self::I, b: Self::I) -> Self::I;
    /// |a| of each i8.
    unsafe fn abs8(a: Self::I) -> Self::I;
    /// Each i8 of `a`, negated where `b`'s is negative, zeroed where it is zero.
    unsafe fn sign8(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sub_f(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The lanes into `out[..8 · GROUPS]`.
    unsafe fn store(a: Self::F, out: &mut [f32; 16]);
}

/// 256-bit registers at level `L`: one group.
pub(in crate::qdot::interleaved) struct Ymm<L>(PhantomData<L>);

impl<L: Level> Lanes for Ymm<L> {
    const GROUPS: usize = 1;
    const VNNI: bool = L::VNNI;
    type I = __m256i;
    type F = __m256;

    // SAFETY (every method): AVX2, FMA and F16C (every level's features); the loads' sizes are
    // the caller's contract.
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: i32) -> __m256i {
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> __m256i {
        unsafe { _mm256_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn splat16(v: i16) -> __m256i {
        unsafe { _mm256_set1_epi16(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m256 {
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(p: Blocks, at: usize) -> __m256i {
        unsafe { _mm256_loadu_si256(p[0].add(at).cast()) }
    }
    #[inline(always)]
    unsafe fn eight<const SIGNED: bool>(p: Blocks, at: usize) -> __m256i {
        unsafe {
            let b = _mm_loadl_epi64(p[0].add(at).cast());
            if SIGNED {
                _mm256_cvtepi8_epi32(b)
            } else {
                _mm256_cvtepu8_epi32(b)
            }
        }
    }
    #[inline(always)]
    unsafe fn halves(p: Blocks, at: usize) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p[0].add(at).cast())) }
    }
    #[inline(always)]
    unsafe fn four(p: *const i8) -> __m256i {
        unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_xor_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub32(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mullo32(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn add16(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn srli16<const N: u32>(a: __m256i) -> __m256i {
        unsafe { by_immediate!(_mm256_srli_epi16, N, a) }
    }
    #[inline(always)]
    unsafe fn slli16<const N: u32>(a: __m256i) -> __m256i {
        unsafe { by_immediate!(_mm256_slli_epi16, N, a) }
    }
    #[inline(always)]
    unsafe fn slli32<const N: u32>(a: __m256i) -> __m256i {
        unsafe { by_immediate!(_mm256_slli_epi32, N, a) }
    }
    #[inline(always)]
    unsafe fn dot4_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: forwarded (the level has VNNI where this is reached).
        unsafe { L::dot4_add(acc, u, s) }
    }
    #[inline(always)]
    unsafe fn maddubs(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_maddubs_epi16(u, s) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn abs8(a: __m256i) -> __m256i {
        unsafe { _mm256_abs_epi8(a) }
    }
    #[inline(always)]
    unsafe fn sign8(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_sign_epi8(a, b) }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(a: __m256, out: &mut [f32; 16]) {
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), a) }
    }
}

/// 512-bit registers (AVX-512 F/BW, with VNNI or not): two groups, the second in lanes 8..16.
pub(in crate::qdot::interleaved) struct Zmm<const VNNI: bool>;

impl<const VNNI: bool> Lanes for Zmm<VNNI> {
    const GROUPS: usize = 2;
    const VNNI: bool = VNNI;
    type I = __m512i;
    type F = __m512;

    // SAFETY (every method): AVX-512 F/BW/VL, F16C (and VNNI for `dot4_add`, reached only
    // with `VNNI`); the loads' sizes are the caller's contract, for both group-blocks.
    #[inline(always)]
    unsafe fn zero() -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: i32) -> __m512i {
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> __m512i {
        unsafe { _mm512_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn splat16(v: i16) -> __m512i {
        unsafe { _mm512_set1_epi16(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m512 {
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(p: Blocks, at: usize) -> __m512i {
        unsafe {
            let low = _mm512_castsi256_si512(_mm256_loadu_si256(p[0].add(at).cast()));
            _mm512_inserti64x4::<1>(low, _mm256_loadu_si256(p[1].add(at).cast()))
        }
    }
    #[inline(always)]
    unsafe fn eight<const SIGNED: bool>(p: Blocks, at: usize) -> __m512i {
        unsafe {
            let b = _mm_unpacklo_epi64(
                _mm_loadl_epi64(p[0].add(at).cast()),
                _mm_loadl_epi64(p[1].add(at).cast()),
            );
            if SIGNED {
                _mm512_cvtepi8_epi32(b)
            } else {
                _mm512_cvtepu8_epi32(b)
            }
        }
    }
    #[inline(always)]
    unsafe fn halves(p: Blocks, at: usize) -> __m512 {
        unsafe {
            let low = _mm256_castsi128_si256(_mm_loadu_si128(p[0].add(at).cast()));
            let both = _mm256_inserti128_si256::<1>(low, _mm_loadu_si128(p[1].add(at).cast()));
            _mm512_cvtph_ps(both)
        }
    }
    #[inline(always)]
    unsafe fn four(p: *const i8) -> __m512i {
        unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_xor_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub32(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mullo32(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn add16(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn srli16<const N: u32>(a: __m512i) -> __m512i {
        unsafe { _mm512_srli_epi16::<N>(a) }
    }
    #[inline(always)]
    unsafe fn slli16<const N: u32>(a: __m512i) -> __m512i {
        unsafe { _mm512_slli_epi16::<N>(a) }
    }
    #[inline(always)]
    unsafe fn slli32<const N: u32>(a: __m512i) -> __m512i {
        unsafe { _mm512_slli_epi32::<N>(a) }
    }
    #[inline(always)]
    unsafe fn dot4_add(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        assert!(VNNI, "vpdpbusd without VNNI");
        unsafe { _mm512_dpbusd_epi32(acc, u, s) }
    }
    #[inline(always)]
    unsafe fn maddubs(u: __m512i, s: __m512i) -> __m512i {
        unsafe { _mm512_maddubs_epi16(u, s) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn abs8(a: __m512i) -> __m512i {
        unsafe { _mm512_abs_epi8(a) }
    }
    #[inline(always)]
    unsafe fn sign8(a: __m512i, b: __m512i) -> __m512i {
        // AVX-512 has no `vpsignb`: `a` where `b` is positive, `0 - a` where negative, 0 else.
        unsafe {
            let zero = _mm512_setzero_si512();
            let negative = _mm512_movepi8_mask(b);
            let nonzero = _mm512_test_epi8_mask(b, b);
            _mm512_mask_sub_epi8(_mm512_maskz_mov_epi8(nonzero, a), negative, zero, a)
        }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(a: __m512, out: &mut [f32; 16]) {
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), a) }
    }
}
