//! The interleaved layouts of the 32-weight block types, exactly their 8 rows' bytes per
//! group-block (block `b` of 8 rows):
//! - Q4_0, Q4_1, Q5_0 and Q5_1 (`Q45<MIN, FIFTH>`): `d[8]` (the rows' f16 scales), the `_1`
//!   types' `m[8]` (f16 offsets), then `qs[4][32]`, where for chunk `c` (weights `8c..8c+8`)
//!   byte `4r + i` holds the low four bits of weight `8c + i` of row `r` in its low nibble and
//!   of `8c + 4 + i` in its high one (Q4_K's sub-block layout); the Q5 types then `qh[32]`,
//!   where byte `4r + i` holds the fifth bits of weights `8c + i` at bit `2c` and of
//!   `8c + 4 + i` at bit `2c + 1`. The `_0` types' codes are centred (Q4_0's 0..=15 on 8,
//!   Q5_0's 0..=31 on 16): the kernels subtract the centre times the activations' per-32
//!   sums; the `_1` types' offsets meet those sums in f32.
//! - Q8_0: `d[8]`, then `qs[8][32]`, where for chunk `c` byte `4r + i` is weight `4c + i` of
//!   row `r`.
//!
//! The activations come in groups of 32 (`activation_group`), one step per block, so each
//! block's integer sum converts to f32 once and meets the row's scale times that step.

#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use super::{f16_at, ActRow, Kind, ROWS};

/// The 4- and 5-bit types: with offsets `m` (`MIN`: Q4_1, Q5_1) or centred codes, and with a
/// fifth bit per weight (`FIFTH`: Q5_0, Q5_1) or not.
pub(crate) struct Q45<const MIN: bool, const FIFTH: bool>;
pub(crate) type Q4_0 = Q45<false, false>;
pub(crate) type Q4_1 = Q45<true, false>;
pub(crate) type Q5_0 = Q45<false, true>;
pub(crate) type Q5_1 = Q45<true, true>;

pub(super) const D: usize = 0;
pub(super) const M: usize = 16;

impl<const MIN: bool, const FIFTH: bool> Q45<MIN, FIFTH> {
    /// Where the low four bits start.
    pub(super) const QS: usize = if MIN { 32 } else { 16 };
    /// Where the fifth bits start.
    pub(super) const QH: usize = Self::QS + 128;
    /// The `_0` types' centre.
    pub(super) const CENTRE: i32 = if FIFTH { 16 } else { 8 };
    /// Bytes of the stored block before `qs`: `d`, the `_1` types' `m`, the Q5 types' `qh`.
    const HEAD: usize = if MIN { 4 } else { 2 } + if FIFTH { 4 } else { 0 };

    /// The byte holding weight `8c + i` (low nibble) and `8c + 4 + i` (high) of row `r`.
    fn qs_at(c: usize, r: usize, i: usize) -> usize {
        Self::QS + 32 * c + 4 * r + i
    }

    /// Row `r`'s 32 codes, in order.
    fn codes(gb: &[u8], r: usize) -> [u8; 32] {
        let mut codes = [0u8; 32];
        for c in 0..4 {
            for i in 0..4 {
                let byte = gb[Self::qs_at(c, r, i)];
                codes[8 * c + i] = byte & 0x0f;
                codes[8 * c + 4 + i] = byte >> 4;
                if FIFTH {
                    let high = gb[Self::QH + 4 * r + i];
                    codes[8 * c + i] |= ((high >> (2 * c)) & 1) << 4;
                    codes[8 * c + 4 + i] |= ((high >> (2 * c + 1)) & 1) << 4;
                }
            }
        }
        codes
    }
}

impl<const MIN: bool, const FIFTH: bool> Kind for Q45<MIN, FIFTH> {
    const WEIGHTS: usize = 32;
    const BLOCK: usize = Self::HEAD + 16;
    const GROUP_BLOCK: usize = ROWS * Self::BLOCK;

    #[expect(clippy::cast_possible_truncation, reason = "high holds 8 bits")]
    fn pack_block(block: &[u8], r: usize, gb: &mut [u8]) {
        gb[D + 2 * r..D + 2 * r + 2].copy_from_slice(&block[0..2]);
        if MIN {
            gb[M + 2 * r..M + 2 * r + 2].copy_from_slice(&block[2..4]);
        }
        // As stored, byte `j` of `qs` holds weight `j` in its low nibble and `16 + j` in its
        // high one, and bit `w` of the little-endian `qh` is weight `w`'s fifth bit. Whole
        // bytes at a time: this runs over every block of the model at load.
        let qs = &block[Self::HEAD..Self::HEAD + 16];
        for c in 0..4 {
            let mut four = [0u8; 4];
            for (i, byte) in four.iter_mut().enumerate() {
                // Weights 8c + i and 8c + 4 + i: low nibbles of the first 16, high ones after.
                let (a, b) = (8 * c + i, 8 * c + 4 + i);
                *byte = if c < 2 {
                    (qs[a] & 0x0f) | (qs[b] << 4)
                } else {
                    (qs[a - 16] >> 4) | (qs[b - 16] & 0xf0)
                };
            }
            let at = Self::qs_at(c, r, 0);
            gb[at..at + 4].copy_from_slice(&four);
        }
        if FIFTH {
            let at = Self::HEAD - 4;
            let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            for i in 0..4 {
                let mut high = 0u32;
                for c in 0..4 {
                    high |= ((qh >> (8 * c + i)) & 1) << (2 * c);
                    high |= ((qh >> (8 * c + 4 + i)) & 1) << (2 * c + 1);
                }
                gb[Self::QH + 4 * r + i] = high as u8;
            }
        }
    }

    #[cfg(test)]
    fn unpack_block(gb: &[u8], r: usize, block: &mut [u8]) {
        block[0..2].copy_from_slice(&gb[D + 2 * r..D + 2 * r + 2]);
        if MIN {
            block[2..4].copy_from_slice(&gb[M + 2 * r..M + 2 * r + 2]);
        }
        let codes = Self::codes(gb, r);
        for (j, byte) in block[Self::HEAD..Self::HEAD + 16].iter_mut().enumerate() {
            *byte = (codes[j] & 0x0f) | ((codes[16 + j] & 0x0f) << 4);
        }
        if FIFTH {
            let qh = (0..32).fold(0u32, |qh, w| qh | (((codes[w] >> 4) as u32) << w));
            block[Self::HEAD - 4..Self::HEAD].copy_from_slice(&qh.to_le_bytes());
        }
    }

    fn dequantize(gb: &[u8], r: usize, out: &mut [f32]) {
        let d = f16_at(gb, D + 2 * r);
        let codes = Self::codes(gb, r);
        if MIN {
            let m = f16_at(gb, M + 2 * r);
            for (o, &q) in out.iter_mut().zip(&codes) {
                *o = q as f32 * d + m;
            }
        } else {
            for (o, &q) in out.iter_mut().zip(&codes) {
                *o = (q as i32 - Self::CENTRE) as f32 * d;
            }
        }
    }

    fn dot_scalar(group: &[u8], x: &ActRow) -> [f32; ROWS] {
        let mut out = [0f32; ROWS];
        for (b, gb) in group.chunks_exact(Self::GROUP_BLOCK).enumerate() {
            let (step, sums) = (x.steps[b], x.sums32[b]);
            for (r, o) in out.iter_mut().enumerate() {
                let codes = Self::codes(gb, r);
                let at = 32 * b;
                let sum = |plane: &[i8]| -> i32 {
                    let plane = &plane[at..at + 32];
                    codes
                        .iter()
                        .zip(plane)
                        .map(|(&q, &a)| q as i32 * a as i32)
                        .sum()
                };
                let mut dot = sum(x.value);
                if let Some(residual) = x.residual {
                    dot = 256 * dot + sum(residual);
                }
                let d = f16_at(gb, D + 2 * r);
                if MIN {
                    *o += dot as f32 * (d * step) + f16_at(gb, M + 2 * r) * (sums as f32 * step);
                } else {
                    *o += (dot - Self::CENTRE * sums) as f32 * (d * step);
                }
            }
        }
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dot_x86<V: super::x86::Lanes, const PAIRED: bool, const R: usize>(
        groups: super::x86::Blocks,
        nb: usize,
        xs: &[&ActRow; R],
    ) -> [[f32; 16]; R] {
        // SAFETY: forwarded.
        unsafe { x86::q45_dot::<V, PAIRED, R, MIN, FIFTH>(groups, nb, xs) }
    }
}

pub(crate) struct Q8_0;

impl Q8_0 {
    pub(super) const QS: usize = 16;

    /// Weight `4c + i` of row `r`.
    fn qs_at(c: usize, r: usize, i: usize) -> usize {
        Self::QS + 32 * c + 4 * r + i
    }

    fn code(gb: &[u8], r: usize, w: usize) -> i8 {
        gb[Self::qs_at(w / 4, r, w % 4)] as i8
    }
}

impl Kind for Q8_0 {
    const WEIGHTS: usize = 32;
    const BLOCK: usize = 34;
    const GROUP_BLOCK: usize = ROWS * Self::BLOCK;

    fn pack_block(block: &[u8], r: usize, gb: &mut [u8]) {
        gb[D + 2 * r..D + 2 * r + 2].copy_from_slice(&block[0..2]);
        for (c, four) in block[2..34].chunks_exact(4).enumerate() {
            let at = Self::qs_at(c, r, 0);
            gb[at..at + 4].copy_from_slice(four);
        }
    }

    #[cfg(test)]
    fn unpack_block(gb: &[u8], r: usize, block: &mut [u8]) {
        block[0..2].copy_from_slice(&gb[D + 2 * r..D + 2 * r + 2]);
        for (w, q) in block[2..34].iter_mut().enumerate() {
            *q = Self::code(gb, r, w) as u8;
        }
    }

    fn dequantize(gb: &[u8], r: usize, out: &mut [f32]) {
        let d = f16_at(gb, D + 2 * r);
        // Chunk by chunk (GEMM's tiles on levels without VNNI come from here).
        for (c, four) in out.chunks_exact_mut(4).enumerate() {
            let at = Self::qs_at(c, r, 0);
            for (o, &q) in four.iter_mut().zip(&gb[at..at + 4]) {
                *o = q as i8 as f32 * d;
            }
        }
    }

    fn dot_scalar(group: &[u8], x: &ActRow) -> [f32; ROWS] {
        let mut out = [0f32; ROWS];
        for (b, gb) in group.chunks_exact(Self::GROUP_BLOCK).enumerate() {
            let step = x.steps[b];
            for (r, o) in out.iter_mut().enumerate() {
                let at = 32 * b;
                let sum = |plane: &[i8]| -> i32 {
                    (0..32)
                        .map(|w| Self::code(gb, r, w) as i32 * plane[at + w] as i32)
                        .sum()
                };
                let mut dot = sum(x.value);
                if let Some(residual) = x.residual {
                    dot = 256 * dot + sum(residual);
                }
                *o += dot as f32 * (f16_at(gb, D + 2 * r) * step);
            }
        }
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dot_x86<V: super::x86::Lanes, const PAIRED: bool, const R: usize>(
        groups: super::x86::Blocks,
        nb: usize,
        xs: &[&ActRow; R],
    ) -> [[f32; 16]; R] {
        // SAFETY: forwarded.
        unsafe { x86::q8_0_dot::<V, PAIRED, R>(groups, nb, xs) }
    }
}
