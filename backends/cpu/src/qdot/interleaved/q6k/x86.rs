//! Q6_K on x86: products two by two (codes up to 63: 32,004 per i16 lane), each pair then
//! multiplied-and-added with the rows' signed scales. With VNNI the planes meet in i32 per
//! sixteen less the combined centre and the scale applies in f32; without it each plane sums
//! in i32 over a block (at most 16 · 16 · 32 · 127 · 128), the two meeting in f32 once per
//! block, in the residual's step; its centre of 32 comes off each plane's per-16 sums.

use super::super::x86::{block, combine, planes, stored, Blocks, Lanes};
use super::super::{ActRow, Kind};
use super::{qh_at, ql_at, Q6K};

/// One row's dots with Q6_K's 16 weights `w` (weights i, 4 + i, 8 + i, 12 + i of each row)
/// at `codes`, unscaled (VNNI levels).
///
/// # Safety
/// `V`'s level's features; `codes..codes + 16` is inside the row.
#[inline(always)]
unsafe fn q6k_codes<V: Lanes>(w: &[V::I; 4], codes: *const i8) -> V::I {
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = V::zero();
        for (t, w) in w.iter().enumerate() {
            acc = V::dot4_add(acc, *w, V::four(codes.add(4 * t)));
        }
        acc
    }
}

/// The same times each row's signed scale with `maddubs` (`pair`: the scale in both i16 halves
/// of its lane), the centre left to the caller (levels without VNNI).
///
/// # Safety
/// As `q6k_codes`'.
#[inline(always)]
unsafe fn q6k_scaled<V: Lanes>(w: &[V::I; 4], pair: V::I, codes: *const i8) -> V::I {
    // SAFETY: the caller's contract.
    unsafe {
        let a = V::add16(
            V::maddubs(w[0], V::four(codes)),
            V::maddubs(w[1], V::four(codes.add(4))),
        );
        let c = V::add16(
            V::maddubs(w[2], V::four(codes.add(8))),
            V::maddubs(w[3], V::four(codes.add(12))),
        );
        V::add32(V::madd16(a, pair), V::madd16(c, pair))
    }
}

/// Q6_K's dots with `R` activation rows, each sixteen's codes decoded once for all of them.
/// VNNI levels combine a sixteen's planes in i32 as `256 · value + residual` less 32 times
/// the codes' sums combined the same way (at most 257 · 16 · 32 · 127, below 2^24: exact in
/// f32) and apply the signed scale in f32; `maddubs` applies the scale itself, so there each
/// plane sums in i32 over the block and the centre comes off per sixteen.
///
/// # Safety
/// `V`'s level's features; `guarded`'s checks passed for the groups and every row, and every
/// row has a residual plane exactly when `PAIRED`.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn q6k_dot<V: Lanes, const PAIRED: bool, const R: usize>(
    groups: Blocks,
    nb: usize,
    xs: &[&ActRow; R],
) -> [[f32; 16]; R] {
    // SAFETY: as in `q4k_dot`.
    unsafe {
        let m4 = V::splat8(0x0f);
        let m30 = V::splat8(0x30);
        let low16 = V::splat(0xffff);
        let (value, residual) = planes(xs);
        let mut acc = [V::zero_f(); R];
        for b in 0..nb {
            let p = block(groups, b, Q6K::GROUP_BLOCK, R == 1);
            let d = V::halves(p, super::D);
            let mut sums_f = [V::zero_f(); R];
            let mut sums_v = [V::zero(); R];
            let mut sums_r = [V::zero(); R];
            for g in 0..16 {
                let scale = V::eight::<true>(p, super::SCALES + 8 * g);
                let ql0 = V::load(p, ql_at(g, 0, 0, 0));
                let ql1 = V::load(p, ql_at(g, 1, 0, 0));
                let qh = V::load(p, qh_at(g, 0, 0));
                // Weights i, 4 + i, 8 + i, 12 + i of the sixteen: low nibbles with their top
                // bits moved to bits 4-5 (16-bit shifts: each byte's own bits land there).
                let w = [
                    (ql0, V::slli16::<4>(qh)),
                    (V::srli16::<4>(ql0), V::slli16::<2>(qh)),
                    (ql1, qh),
                    (V::srli16::<4>(ql1), V::srli16::<2>(qh)),
                ];
                let codes = w.map(|(low, top)| V::or(V::and(low, m4), V::and(top, m30)));
                let at = 256 * b + 16 * g;
                let sixteen = 16 * b + g;
                if V::VNNI {
                    let scale = V::cvt(scale);
                    for r in 0..R {
                        let x = xs[r];
                        let mut dot = q6k_codes::<V>(&codes, value[r].add(at));
                        let mut sum = *x.value_sums.get_unchecked(sixteen) as i32;
                        if PAIRED {
                            let res = q6k_codes::<V>(&codes, residual[r].add(at));
                            dot = V::add32(V::slli32::<8>(dot), res);
                            let res_sums = x.residual_sums.unwrap_or(x.value_sums);
                            sum = 256 * sum + *res_sums.get_unchecked(sixteen) as i32;
                        }
                        let centred = V::sub32(dot, V::splat(32 * sum));
                        sums_f[r] = V::fmadd(V::cvt(centred), scale, sums_f[r]);
                    }
                    continue;
                }
                let pair = V::or(V::and(scale, low16), V::slli32::<16>(scale));
                for r in 0..R {
                    let x = xs[r];
                    let sum_v = *x.value_sums.get_unchecked(sixteen) as i32;
                    let dot = q6k_scaled::<V>(&codes, pair, value[r].add(at));
                    let centre = V::mullo32(scale, V::splat(32 * sum_v));
                    sums_v[r] = V::add32(sums_v[r], V::sub32(dot, centre));
                    if PAIRED {
                        let res_sums = x.residual_sums.unwrap_or(x.value_sums);
                        let sum_r = *res_sums.get_unchecked(sixteen) as i32;
                        let dot = q6k_scaled::<V>(&codes, pair, residual[r].add(at));
                        let centre = V::mullo32(scale, V::splat(32 * sum_r));
                        sums_r[r] = V::add32(sums_r[r], V::sub32(dot, centre));
                    }
                }
            }
            for r in 0..R {
                let step = V::splat_f(*xs[r].steps.get_unchecked(b));
                let sums = if V::VNNI {
                    sums_f[r]
                } else {
                    combine::<V, PAIRED>(sums_v[r], sums_r[r])
                };
                acc[r] = V::fmadd(sums, V::mul(d, step), acc[r]);
            }
        }
        stored::<V, R>(acc)
    }
}
