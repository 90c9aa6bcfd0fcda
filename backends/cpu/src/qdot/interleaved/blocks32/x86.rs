//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 on x86: per 32-weight block, each plane's integer dot in
//! the row's i32 lane, `256 · value + residual` in i32 (at most 257 · 32 · 255 · 127: exact),
//! one conversion, one multiply-add with the rows' scales times the block's activation step.
//!
//! The 4- and 5-bit codes are unsigned, as `maddubs` and `vpdpbusd` want them (AVX2 sums 5-bit
//! products in i16 two chunks at a time: 8 of 31 · 127, 31,496). Q8_0's are signed:
//! AVX2 multiplies their magnitudes by the activations carrying their signs (`sign`: at most
//! 2 · 128 · 127 per i16 lane, so each product pair goes to i32 at once); VNNI levels flip the
//! codes' top bit (code + 128, unsigned) and take 128 times the activations' sums off after.

use super::super::x86::{block, planes, stored, Blocks, Lanes};
use super::super::{ActRow, Kind};
use super::{Q45, Q8_0};

/// `256 · value + residual`, or the value alone.
///
/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn paired<V: Lanes, const PAIRED: bool>(value: V::I, residual: V::I) -> V::I {
    // SAFETY: register-only operations.
    unsafe {
        if PAIRED {
            V::add32(V::slli32::<8>(value), residual)
        } else {
            value
        }
    }
}

/// Bit `b` of each byte of `h` at bit 4, the rest cleared (16-bit shifts: each byte's own bit
/// lands there for shifts up to 4 either way).
///
/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn bit_at_4<V: Lanes>(h: V::I, b: usize) -> V::I {
    // SAFETY: register-only operations.
    unsafe {
        let moved = match b {
            0 => V::slli16::<4>(h),
            1 => V::slli16::<3>(h),
            2 => V::slli16::<2>(h),
            3 => V::slli16::<1>(h),
            4 => h,
            5 => V::srli16::<1>(h),
            6 => V::srli16::<2>(h),
            _ => V::srli16::<3>(h),
        };
        V::and(moved, V::splat8(0x10))
    }
}

/// Row-lane dots of 32 weights of 4 or 5 bits (4 chunks of `lo`/`hi` registers: Q4_K's
/// sub-block, a Q4 / Q5 block) with the codes at `codes`: i32 per row. AVX2 sums `maddubs`
/// pairs in i16 over the whole 32 for 4-bit codes (16 of 15 · 127: 30,480), over 16 for
/// 5-bit ones.
///
/// # Safety
/// `V`'s features; `codes..codes + 32` is inside the row.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn nibbles32<V: Lanes, const FIFTH: bool>(
    w: &[(V::I, V::I); 4],
    codes: *const i8,
) -> V::I {
    // SAFETY: the caller's contract.
    unsafe {
        if V::VNNI {
            let mut acc = V::zero();
            for (c, (lo, hi)) in w.iter().enumerate() {
                acc = V::dot4_add(acc, *lo, V::four(codes.add(8 * c)));
                acc = V::dot4_add(acc, *hi, V::four(codes.add(8 * c + 4)));
            }
            acc
        } else {
            let ones = V::splat16(1);
            let mut acc = V::zero();
            let mut acc16 = V::zero();
            for (c, (lo, hi)) in w.iter().enumerate() {
                acc16 = V::add16(acc16, V::maddubs(*lo, V::four(codes.add(8 * c))));
                acc16 = V::add16(acc16, V::maddubs(*hi, V::four(codes.add(8 * c + 4))));
                if FIFTH && c % 2 == 1 {
                    acc = V::add32(acc, V::madd16(acc16, ones));
                    acc16 = V::zero();
                }
            }
            if FIFTH {
                acc
            } else {
                V::madd16(acc16, ones)
            }
        }
    }
}

/// The 4- and 5-bit types (`MIN`: offsets `m`, else centred codes; `FIFTH`: a fifth bit per
/// weight) with `R` activation rows, each block's codes decoded once for all of them.
///
/// # Safety
/// `V`'s level's features; `guarded`'s checks passed for the groups and every row, and every
/// row has a residual plane exactly when `PAIRED`.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn q45_dot<
    V: Lanes,
    const PAIRED: bool,
    const R: usize,
    const MIN: bool,
    const FIFTH: bool,
>(
    groups: Blocks,
    nb: usize,
    xs: &[&ActRow; R],
) -> [[f32; 16]; R] {
    type K<const MIN: bool, const FIFTH: bool> = Q45<MIN, FIFTH>;
    // SAFETY: loads inside group-block `b` of each group and block `b` of every activation
    // row (`guarded`); the caller has the features.
    unsafe {
        let m4 = V::splat8(0x0f);
        let (value, residual) = planes(xs);
        let mut acc = [V::zero_f(); R];
        for b in 0..nb {
            let p = block(groups, b, K::<MIN, FIFTH>::GROUP_BLOCK, R == 1);
            let d = V::halves(p, super::D);
            let high = if FIFTH {
                V::load(p, K::<MIN, FIFTH>::QH)
            } else {
                V::zero()
            };
            let mut w = [(V::zero(), V::zero()); 4];
            for (c, w) in w.iter_mut().enumerate() {
                let q = V::load(p, K::<MIN, FIFTH>::QS + 32 * c);
                *w = (V::and(q, m4), V::and(V::srli16::<4>(q), m4));
                if FIFTH {
                    w.0 = V::or(w.0, bit_at_4::<V>(high, 2 * c));
                    w.1 = V::or(w.1, bit_at_4::<V>(high, 2 * c + 1));
                }
            }
            for r in 0..R {
                let x = xs[r];
                let at = 32 * b;
                let v = nibbles32::<V, FIFTH>(&w, value[r].add(at));
                let res = if PAIRED {
                    nibbles32::<V, FIFTH>(&w, residual[r].add(at))
                } else {
                    v
                };
                let mut dot = paired::<V, PAIRED>(v, res);
                let sums = *x.sums32.get_unchecked(b);
                let step = *x.steps.get_unchecked(b);
                if !MIN {
                    let centre = K::<MIN, FIFTH>::CENTRE;
                    dot = V::sub32(dot, V::splat(centre * sums));
                }
                let scale = V::mul(d, V::splat_f(step));
                acc[r] = V::fmadd(V::cvt(dot), scale, acc[r]);
                if MIN {
                    let m = V::halves(p, super::M);
                    acc[r] = V::fmadd(m, V::splat_f(sums as f32 * step), acc[r]);
                }
            }
        }
        stored::<V, R>(acc)
    }
}

/// One plane's dot with Q8_0's 32 weights of each row: `w` the chunks (as stored without
/// VNNI, top bit flipped with it), `mag` their magnitudes (without VNNI).
///
/// # Safety
/// `V`'s features; `codes..codes + 32` is inside the row.
#[inline(always)]
unsafe fn q8_plane<V: Lanes>(w: &[V::I; 8], mag: &[V::I; 8], codes: *const i8) -> V::I {
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = V::zero();
        for c in 0..8 {
            let x = V::four(codes.add(4 * c));
            acc = if V::VNNI {
                V::dot4_add(acc, w[c], x)
            } else {
                let p = V::maddubs(mag[c], V::sign8(x, w[c]));
                V::add32(acc, V::madd16(p, V::splat16(1)))
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
    V: Lanes,
    const PAIRED: bool,
    const R: usize,
>(
    groups: Blocks,
    nb: usize,
    xs: &[&ActRow; R],
) -> [[f32; 16]; R] {
    // SAFETY: as in `q45_dot`.
    unsafe {
        let top = V::splat8(-128);
        let (value, residual) = planes(xs);
        let mut acc = [V::zero_f(); R];
        for b in 0..nb {
            let p = block(groups, b, Q8_0::GROUP_BLOCK, R == 1);
            let d = V::halves(p, super::D);
            let mut w = [V::zero(); 8];
            let mut mag = [V::zero(); 8];
            for c in 0..8 {
                let q = V::load(p, Q8_0::QS + 32 * c);
                if V::VNNI {
                    w[c] = V::xor(q, top);
                } else {
                    w[c] = q;
                    mag[c] = V::abs8(q);
                }
            }
            for r in 0..R {
                let x = xs[r];
                let at = 32 * b;
                let v = q8_plane::<V>(&w, &mag, value[r].add(at));
                let res = if PAIRED {
                    q8_plane::<V>(&w, &mag, residual[r].add(at))
                } else {
                    v
                };
                let mut dot = paired::<V, PAIRED>(v, res);
                if V::VNNI {
                    // Each plane's codes met code + 128: 128 times their sums (both planes'
                    // combined as the dots are) come off.
                    let sums = *x.sums32.get_unchecked(b);
                    dot = V::sub32(dot, V::splat(128 * sums));
                }
                let step = V::splat_f(*x.steps.get_unchecked(b));
                acc[r] = V::fmadd(V::cvt(dot), V::mul(d, step), acc[r]);
            }
        }
        stored::<V, R>(acc)
    }
}
