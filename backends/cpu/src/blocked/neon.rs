//! The blocked kernels on NEON (32 × 128-bit registers): each 8-weight eighth of a 32-weight
//! block of `NR` weight rows is decoded in registers (two 4-lane vectors) once and multiplied
//! with `MR` activation rows: 8 × 2 accumulators, 4 decoded halves and 2 activation halves
//! leave room for the decoding. The decoders give the bits `GgmlType::dequantize` gives.

use std::arch::aarch64::*;

use super::rows::{BlockRows, F32Rows, Layout, RowSource, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

pub(super) const MR: usize = 8;
pub(super) const NR: usize = 2;

/// Eight weights as two 4-lane vectors.
type Eighth = (float32x4_t, float32x4_t);

/// Rows of `k` weights, read 8 at a time.
pub(super) trait Rows: RowSource {
    /// Weights `32 * blk + 8 * e ..` (8 of them) of row `j`.
    ///
    /// # Safety
    /// `j < len()`, `blk < k / 32`, `e < 4`.
    unsafe fn eighth(&self, j: usize, blk: usize, e: usize) -> Eighth;
}

impl Rows for F32Rows<'_> {
    #[inline(always)]
    unsafe fn eighth(&self, j: usize, blk: usize, e: usize) -> Eighth {
        // SAFETY: the caller's contract puts the 8 floats inside row j.
        unsafe {
            let p = self.block_ptr(j, blk).add(e * 8);
            (vld1q_f32(p), vld1q_f32(p.add(4)))
        }
    }
}

/// A 32-weight GGUF block layout, decoded an eighth at a time.
pub(super) trait Block: Layout {
    /// # Safety
    /// `b` points at `BYTES` readable bytes; `e < 4`.
    unsafe fn eighth(b: *const u8, e: usize, table: &[f32]) -> Eighth;
}

/// The f16 at `b` as f32.
///
/// # Safety
/// `b` points at 2 readable bytes.
#[inline(always)]
unsafe fn scale(b: *const u8, table: &[f32]) -> f32 {
    // SAFETY: the caller's contract.
    let bits = unsafe { u16::from_le_bytes([*b, *b.add(1)]) };
    table[bits as usize]
}

/// Eight small unsigned codes (`u16` lanes) as two f32 vectors.
#[inline(always)]
fn widen(codes: uint16x8_t) -> Eighth {
    // SAFETY: NEON is part of aarch64.
    unsafe {
        (
            vcvtq_f32_u32(vmovl_u16(vget_low_u16(codes))),
            vcvtq_f32_u32(vmovl_high_u16(codes)),
        )
    }
}

/// The 4-bit codes of weights `8e .. 8e + 8` of the 16 code bytes at `qs` (weights 0..16 in the
/// low nibbles, 16..32 in the high).
///
/// # Safety
/// `qs` points at 16 readable bytes; `e < 4`.
#[inline(always)]
unsafe fn nibbles(qs: *const u8, e: usize) -> uint16x8_t {
    // SAFETY: the caller's contract: 8 bytes at `qs + 8 * (e % 2)` are readable.
    unsafe {
        let bytes = vld1_u8(qs.add(8 * (e % 2)));
        let codes = if e >= 2 {
            vshr_n_u8::<4>(bytes)
        } else {
            vand_u8(bytes, vdup_n_u8(0x0f))
        };
        vmovl_u8(codes)
    }
}

/// `nibbles` with each weight's fifth bit (bit j of the 32-bit `qh` at `h` for weight j).
///
/// # Safety
/// `h` points at 4 and `qs` at 16 readable bytes; `e < 4`.
#[inline(always)]
unsafe fn five_bit_codes(h: *const u8, qs: *const u8, e: usize) -> Eighth {
    // SAFETY: the caller's contract.
    unsafe {
        let qh = u32::from_le_bytes([*h, *h.add(1), *h.add(2), *h.add(3)]);
        let bits = vdupq_n_u16(((qh >> (8 * e)) & 0xff) as u16);
        const LANE_BIT: [u16; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
        let set = vtstq_u16(bits, vld1q_u16(LANE_BIT.as_ptr()));
        let fifth = vandq_u16(set, vdupq_n_u16(16));
        widen(vorrq_u16(nibbles(qs, e), fifth))
    }
}

/// `(codes + offset) * d` per lane, as `GgmlType::dequantize` rounds it.
#[inline(always)]
fn centred((lo, hi): Eighth, offset: f32, d: f32) -> Eighth {
    // SAFETY: NEON is part of aarch64.
    unsafe {
        let (o, d) = (vdupq_n_f32(offset), vdupq_n_f32(d));
        (
            vmulq_f32(vaddq_f32(lo, o), d),
            vmulq_f32(vaddq_f32(hi, o), d),
        )
    }
}

/// `codes * d + m` per lane, fused as the other levels do.
#[inline(always)]
fn affine((lo, hi): Eighth, d: f32, m: f32) -> Eighth {
    // SAFETY: NEON is part of aarch64.
    unsafe {
        let (d, m) = (vdupq_n_f32(d), vdupq_n_f32(m));
        (vfmaq_f32(m, lo, d), vfmaq_f32(m, hi, d))
    }
}

impl Block for Q4_0 {
    #[inline(always)]
    unsafe fn eighth(b: *const u8, e: usize, table: &[f32]) -> Eighth {
        // SAFETY: the caller's contract (f16 d, 16 bytes of codes).
        unsafe { centred(widen(nibbles(b.add(2), e)), -8.0, scale(b, table)) }
    }
}

impl Block for Q4_1 {
    #[inline(always)]
    unsafe fn eighth(b: *const u8, e: usize, table: &[f32]) -> Eighth {
        // SAFETY: the caller's contract (f16 d, f16 m, 16 bytes of codes).
        unsafe {
            let codes = widen(nibbles(b.add(4), e));
            affine(codes, scale(b, table), scale(b.add(2), table))
        }
    }
}

impl Block for Q5_0 {
    #[inline(always)]
    unsafe fn eighth(b: *const u8, e: usize, table: &[f32]) -> Eighth {
        // SAFETY: the caller's contract (f16 d, u32 qh, 16 bytes of codes).
        unsafe {
            centred(
                five_bit_codes(b.add(2), b.add(6), e),
                -16.0,
                scale(b, table),
            )
        }
    }
}

impl Block for Q5_1 {
    #[inline(always)]
    unsafe fn eighth(b: *const u8, e: usize, table: &[f32]) -> Eighth {
        // SAFETY: the caller's contract (f16 d, f16 m, u32 qh, 16 bytes of codes).
        unsafe {
            let codes = five_bit_codes(b.add(4), b.add(8), e);
            affine(codes, scale(b, table), scale(b.add(2), table))
        }
    }
}

impl Block for Q8_0 {
    #[inline(always)]
    unsafe fn eighth(b: *const u8, e: usize, table: &[f32]) -> Eighth {
        // SAFETY: the caller's contract (f16 d, 32 signed codes).
        unsafe {
            let codes = vmovl_s8(vld1_s8(b.add(2 + 8 * e).cast()));
            let d = vdupq_n_f32(scale(b, table));
            (
                vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(codes))), d),
                vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(codes)), d),
            )
        }
    }
}

impl<B: Block> Rows for BlockRows<'_, B> {
    #[inline(always)]
    unsafe fn eighth(&self, j: usize, blk: usize, e: usize) -> Eighth {
        // SAFETY: the caller's contract puts block `blk` of row `j` inside the data.
        unsafe { B::eighth(self.block_ptr(j, blk), e, self.table) }
    }
}

blocked_tile!("neon", [1, 2, 3, 4, 5, 6, 7]);

/// `part[(r + i) * width + j + c] = x row r + i · weight row j + c` for i < M, c < N.
///
/// # Safety
/// Weight rows `j..j + N` and activation rows `r..r + M` exist.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<W: Rows, const M: usize, const N: usize>(
    w: &W,
    j: usize,
    x: &[f32],
    r: usize,
    k: usize,
    part: &mut [f32],
    width: usize,
) {
    // SAFETY: the caller's contract: every pointer below stays inside rows r..r + M of `x`
    // (k floats each, read 8 at a time up to k) and rows j..j + N of `w`.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); N]; M];
        let x0 = x.as_ptr().add(r * k);
        for blk in 0..k / 32 {
            for e in 0..4 {
                let mut ws = [(vdupq_n_f32(0.0), vdupq_n_f32(0.0)); N];
                for (c, wc) in ws.iter_mut().enumerate() {
                    *wc = w.eighth(j + c, blk, e);
                }
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let p = x0.add(i * k + blk * 32 + e * 8);
                    let (lo, hi) = (vld1q_f32(p), vld1q_f32(p.add(4)));
                    for (a, wc) in acc_i.iter_mut().zip(&ws) {
                        *a = vfmaq_f32(*a, wc.0, lo);
                        *a = vfmaq_f32(*a, wc.1, hi);
                    }
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (c, a) in acc_i.iter().enumerate() {
                part[(r + i) * width + j + c] = vaddvq_f32(*a);
            }
        }
    }
}
