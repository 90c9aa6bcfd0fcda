//! Weight rows as the kernels read them: any 32-weight block of any row as two f32 vectors,
//! decoded in registers from GGUF blocks (`w = d * code + m`, as `GgmlType::dequantize` computes
//! it, so the values are the same bits) or loaded from f32 rows.

use std::arch::x86_64::*;

use super::rows::{BlockRows, F32Rows, Layout, RowSource, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// Rows of `k` weights, a block at a time.
pub(super) trait Rows: RowSource {
    /// Weights `32 * blk ..` of row `j`, as (first 16, last 16).
    ///
    /// # Safety
    /// AVX-512F must be present; `j < len()` and `blk < k / 32`.
    unsafe fn block(&self, j: usize, blk: usize) -> (__m512, __m512);
}

impl Rows for F32Rows<'_> {
    #[inline(always)]
    unsafe fn block(&self, j: usize, blk: usize) -> (__m512, __m512) {
        // SAFETY: the caller's contract puts the 32 floats inside row j.
        unsafe {
            let p = self.block_ptr(j, blk);
            (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
        }
    }
}

/// A 32-weight GGUF block layout.
pub(super) trait Block: Layout {
    /// # Safety
    /// AVX-512F; `b` points at `BYTES` readable bytes.
    unsafe fn decode(b: *const u8, table: &[f32]) -> (__m512, __m512);
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

/// 16 bytes of 4-bit codes as (low nibbles, high nibbles): the codes of weights 0..16 and
/// 16..32.
///
/// # Safety
/// AVX-512F; `q` points at 16 readable bytes.
#[inline(always)]
unsafe fn nibble_codes(q: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        let bytes = _mm_loadu_si128(q.cast());
        let mask = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(bytes, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), mask);
        (_mm512_cvtepu8_epi32(lo), _mm512_cvtepu8_epi32(hi))
    }
}

/// `nibble_codes` as f32.
///
/// # Safety
/// AVX-512F; `q` points at 16 readable bytes.
#[inline(always)]
unsafe fn nibbles(q: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller's contract.
    unsafe {
        let (lo, hi) = nibble_codes(q);
        (_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi))
    }
}

/// 5-bit codes: the nibbles at `q` with their fifth bits from the 32-bit `qh` at `h` (bit j
/// for weight j), as f32.
///
/// # Safety
/// AVX-512F; `h` points at 4 and `q` at 16 readable bytes.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the low 16 bits are the lane mask"
)]
unsafe fn five_bit_codes(h: *const u8, q: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller's contract.
    unsafe {
        let qh = u32::from_le_bytes([*h, *h.add(1), *h.add(2), *h.add(3)]);
        let (lo, hi) = nibble_codes(q);
        let sixteen = |bits: u32| _mm512_maskz_set1_epi32(bits as u16, 16);
        (
            _mm512_cvtepi32_ps(_mm512_or_si512(lo, sixteen(qh))),
            _mm512_cvtepi32_ps(_mm512_or_si512(hi, sixteen(qh >> 16))),
        )
    }
}

impl Block for Q5_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, table: &[f32]) -> (__m512, __m512) {
        // SAFETY: the caller's contract (22 bytes: f16 d, u32 qh, 16 bytes of codes).
        unsafe {
            let d = _mm512_set1_ps(scale(b, table));
            let (lo, hi) = five_bit_codes(b.add(2), b.add(6));
            let off = _mm512_set1_ps(-16.0);
            (
                _mm512_mul_ps(_mm512_add_ps(lo, off), d),
                _mm512_mul_ps(_mm512_add_ps(hi, off), d),
            )
        }
    }
}

impl Block for Q5_1 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, table: &[f32]) -> (__m512, __m512) {
        // SAFETY: the caller's contract (24 bytes: f16 d, f16 m, u32 qh, 16 bytes of codes).
        unsafe {
            let (d, m) = (scale(b, table), scale(b.add(2), table));
            let (lo, hi) = five_bit_codes(b.add(4), b.add(8));
            let (d, m) = (_mm512_set1_ps(d), _mm512_set1_ps(m));
            (_mm512_fmadd_ps(lo, d, m), _mm512_fmadd_ps(hi, d, m))
        }
    }
}

impl Block for Q4_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, table: &[f32]) -> (__m512, __m512) {
        // SAFETY: the caller's contract (18 bytes: f16 d, 16 bytes of codes).
        unsafe {
            let d = scale(b, table);
            let (lo, hi) = nibbles(b.add(2));
            let (d, off) = (_mm512_set1_ps(d), _mm512_set1_ps(-8.0));
            (
                _mm512_mul_ps(_mm512_add_ps(lo, off), d),
                _mm512_mul_ps(_mm512_add_ps(hi, off), d),
            )
        }
    }
}

impl Block for Q4_1 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, table: &[f32]) -> (__m512, __m512) {
        // SAFETY: the caller's contract (20 bytes: f16 d, f16 m, 16 bytes of codes).
        unsafe {
            let (d, m) = (scale(b, table), scale(b.add(2), table));
            let (lo, hi) = nibbles(b.add(4));
            let (d, m) = (_mm512_set1_ps(d), _mm512_set1_ps(m));
            (_mm512_fmadd_ps(lo, d, m), _mm512_fmadd_ps(hi, d, m))
        }
    }
}

impl Block for Q8_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, table: &[f32]) -> (__m512, __m512) {
        // SAFETY: the caller's contract (34 bytes: f16 d, 32 signed codes).
        unsafe {
            let d = _mm512_set1_ps(scale(b, table));
            let lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2).cast()));
            let hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18).cast()));
            (
                _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d),
                _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d),
            )
        }
    }
}

impl<B: Block> Rows for BlockRows<'_, B> {
    #[inline(always)]
    unsafe fn block(&self, j: usize, blk: usize) -> (__m512, __m512) {
        // SAFETY: the caller's contract puts block `blk` of row `j` inside the data.
        unsafe { B::decode(self.block_ptr(j, blk), self.table) }
    }
}
