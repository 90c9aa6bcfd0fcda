//! Q4_K on x86. AVX2 sums in i16 over a 32-weight sub-block (at most 16 products of
//! 15 · 127 per lane: 30,480); the two planes meet in i32 per sub-block as
//! `256 · value + residual` (at most 257 · 32 · 15 · 127, below 2^24: exact in f32) and the
//! sub-block's scale applies in f32, as do its mins to the activations' per-32 sums
//! (`ActRow::sums32_f`).

use super::super::blocks32::x86::nibbles32;
use super::super::x86::{block, planes, stored, Blocks, Lanes};
use super::super::{ActRow, Kind};
use super::{qs_at, Q4K};

/// The dots of the groups with `R` activation rows, each group of weights decoded once for
/// all of them (prefill: 4 rows).
///
/// # Safety
/// `V`'s level's features; `guarded`'s checks passed for the groups and every row, and every
/// row has a residual plane exactly when `PAIRED`.
#[inline(always)]
pub(in crate::qdot::interleaved) unsafe fn q4k_dot<V: Lanes, const PAIRED: bool, const R: usize>(
    groups: Blocks,
    nb: usize,
    xs: &[&ActRow; R],
) -> [[f32; 16]; R] {
    // SAFETY: loads inside group-block `b` of each group and block `b` of every activation
    // row (`guarded`); the caller has the features.
    unsafe {
        let m4 = V::splat8(0x0f);
        let (value, residual) = planes(xs);
        let mut acc = [V::zero_f(); R];
        let mut min_acc = [V::zero_f(); R];
        for b in 0..nb {
            let p = block(groups, b, Q4K::GROUP_BLOCK, R == 1);
            let d = V::halves(p, super::D);
            let dmin = V::halves(p, super::DMIN);
            let mut sums = [V::zero_f(); R];
            let mut mins = [V::zero_f(); R];
            for s in 0..8 {
                let scale = V::cvt(V::eight::<false>(p, super::SCALES + 8 * s));
                let min = V::cvt(V::eight::<false>(p, super::MINS + 8 * s));
                let mut w = [(V::zero(), V::zero()); 4];
                for (c, w) in w.iter_mut().enumerate() {
                    let q = V::load(p, qs_at(s, c, 0, 0));
                    *w = (V::and(q, m4), V::and(V::srli16::<4>(q), m4));
                }
                let at = 256 * b + 32 * s;
                for r in 0..R {
                    let x_sums = V::splat_f(*xs[r].sums32_f.get_unchecked(8 * b + s));
                    mins[r] = V::fmadd(min, x_sums, mins[r]);
                    let mut dot = nibbles32::<V, false>(&w, value[r].add(at));
                    if PAIRED {
                        let res = nibbles32::<V, false>(&w, residual[r].add(at));
                        dot = V::add32(V::slli32::<8>(dot), res);
                    }
                    sums[r] = V::fmadd(V::cvt(dot), scale, sums[r]);
                }
            }
            for r in 0..R {
                let step = V::splat_f(*xs[r].steps.get_unchecked(b));
                acc[r] = V::fmadd(sums[r], V::mul(d, step), acc[r]);
                min_acc[r] = V::fmadd(mins[r], V::mul(dmin, step), min_acc[r]);
            }
        }
        for r in 0..R {
            acc[r] = V::sub_f(acc[r], min_acc[r]);
        }
        stored::<V, R>(acc)
    }
}
