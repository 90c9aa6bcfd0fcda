//! The blocked kernels on AVX2 + FMA (16 × 256-bit registers): each 8-weight quarter of a
//! 32-weight block of `NR` weight rows is decoded in registers once and multiplied with `MR`
//! activation rows: 6 × 2 accumulators, 2 decoded quarters and an activation vector take 15 of
//! the 16 registers. The decoders give the bits `GgmlType::dequantize` gives, like the AVX-512
//! ones.

use std::arch::x86_64::*;

use super::rows::{BlockRows, F32Rows, Layout, RowSource, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// Activation rows per kernel call and weight rows decoded per quarter. 6 × 2 decodes each
/// quarter for 6 rows; 4 × 3 (12 accumulators too) decoded it for 4 and ran 10-40 % slower at
/// 8 and 32 rows (SmolLM2 Q4_1, `INFER_CPU_ISA=avx2 infer bench latency`, 2026-11-27).
pub(super) const MR: usize = 6;
pub(super) const NR: usize = 2;

/// Rows of `k` weights, read 8 at a time.
pub(super) trait Rows: RowSource {
    /// Weights `32 * blk + 8 * q ..` (8 of them) of row `j`.
    ///
    /// # Safety
    /// AVX2 and FMA must be present; `j < len()`, `blk < k / 32`, `q < 4`.
    unsafe fn quarter(&self, j: usize, blk: usize, q: usize) -> __m256;
}

impl Rows for F32Rows<'_> {
    #[inline(always)]
    unsafe fn quarter(&self, j: usize, blk: usize, q: usize) -> __m256 {
        // SAFETY: the caller's contract puts the 8 floats inside row j.
        unsafe { _mm256_loadu_ps(self.block_ptr(j, blk).add(q * 8)) }
    }
}

/// A 32-weight GGUF block layout, decoded a quarter at a time.
pub(super) trait Block: Layout {
    /// # Safety
    /// AVX2 and FMA; `b` points at `BYTES` readable bytes; `q < 4`.
    unsafe fn quarter(b: *const u8, q: usize, table: &[f32]) -> __m256;
}

/// The f16 at `b`, broadcast.
///
/// # Safety
/// AVX; `b` points at 2 readable bytes.
#[inline(always)]
unsafe fn scale(b: *const u8, table: &[f32]) -> __m256 {
    // SAFETY: the caller's contract.
    let bits = unsafe { u16::from_le_bytes([*b, *b.add(1)]) };
    // SAFETY: the caller's contract (AVX).
    unsafe { _mm256_set1_ps(table[bits as usize]) }
}

/// The 4-bit codes of weights `8q .. 8q + 8` of the 16 code bytes at `qs` (weights 0..16 in the
/// low nibbles, 16..32 in the high), as i32 lanes.
///
/// # Safety
/// AVX2; `qs` points at 16 readable bytes; `q < 4`.
#[inline(always)]
unsafe fn nibbles(qs: *const u8, q: usize) -> __m256i {
    // SAFETY: the caller's contract: 8 bytes at `qs + 8 * (q % 2)` are readable.
    unsafe {
        let bytes = _mm_loadl_epi64(qs.add(8 * (q % 2)).cast());
        let bytes = if q >= 2 {
            _mm_srli_epi16::<4>(bytes)
        } else {
            bytes
        };
        _mm256_cvtepu8_epi32(_mm_and_si128(bytes, _mm_set1_epi8(0x0f)))
    }
}

/// `nibbles` with each weight's fifth bit (bit j of the 32-bit `qh` at `h` for weight j).
///
/// # Safety
/// AVX2; `h` points at 4 and `qs` at 16 readable bytes; `q < 4`.
#[inline(always)]
unsafe fn five_bit_codes(h: *const u8, qs: *const u8, q: usize) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let qh = u32::from_le_bytes([*h, *h.add(1), *h.add(2), *h.add(3)]);
        let bits = _mm256_set1_epi32(((qh >> (8 * q)) & 0xff) as i32);
        let lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let set = _mm256_cmpeq_epi32(_mm256_and_si256(bits, lane_bit), lane_bit);
        let fifth = _mm256_and_si256(set, _mm256_set1_epi32(16));
        _mm256_cvtepi32_ps(_mm256_or_si256(nibbles(qs, q), fifth))
    }
}

impl Block for Q4_0 {
    #[inline(always)]
    unsafe fn quarter(b: *const u8, q: usize, table: &[f32]) -> __m256 {
        // SAFETY: the caller's contract (f16 d, 16 bytes of codes).
        unsafe {
            let codes = _mm256_cvtepi32_ps(nibbles(b.add(2), q));
            _mm256_mul_ps(_mm256_add_ps(codes, _mm256_set1_ps(-8.0)), scale(b, table))
        }
    }
}

impl Block for Q4_1 {
    #[inline(always)]
    unsafe fn quarter(b: *const u8, q: usize, table: &[f32]) -> __m256 {
        // SAFETY: the caller's contract (f16 d, f16 m, 16 bytes of codes).
        unsafe {
            let codes = _mm256_cvtepi32_ps(nibbles(b.add(4), q));
            _mm256_fmadd_ps(codes, scale(b, table), scale(b.add(2), table))
        }
    }
}

impl Block for Q5_0 {
    #[inline(always)]
    unsafe fn quarter(b: *const u8, q: usize, table: &[f32]) -> __m256 {
        // SAFETY: the caller's contract (f16 d, u32 qh, 16 bytes of codes).
        unsafe {
            let codes = five_bit_codes(b.add(2), b.add(6), q);
            _mm256_mul_ps(_mm256_add_ps(codes, _mm256_set1_ps(-16.0)), scale(b, table))
        }
    }
}

impl Block for Q5_1 {
    #[inline(always)]
    unsafe fn quarter(b: *const u8, q: usize, table: &[f32]) -> __m256 {
        // SAFETY: the caller's contract (f16 d, f16 m, u32 qh, 16 bytes of codes).
        unsafe {
            let codes = five_bit_codes(b.add(4), b.add(8), q);
            _mm256_fmadd_ps(codes, scale(b, table), scale(b.add(2), table))
        }
    }
}

impl Block for Q8_0 {
    #[inline(always)]
    unsafe fn quarter(b: *const u8, q: usize, table: &[f32]) -> __m256 {
        // SAFETY: the caller's contract (f16 d, 32 signed codes).
        unsafe {
            let codes = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2 + 8 * q).cast()));
            _mm256_mul_ps(_mm256_cvtepi32_ps(codes), scale(b, table))
        }
    }
}

impl<B: Block> Rows for BlockRows<'_, B> {
    #[inline(always)]
    unsafe fn quarter(&self, j: usize, blk: usize, q: usize) -> __m256 {
        // SAFETY: the caller's contract puts block `blk` of row `j` inside the data.
        unsafe { B::quarter(self.block_ptr(j, blk), q, self.table) }
    }
}

blocked_tile!("avx2,fma", [1, 2, 3, 4, 5]);

/// `part[(r + i) * width + j + c] = x row r + i · weight row j + c` for i < M, c < N.
///
/// # Safety
/// AVX2 and FMA; weight rows `j..j + N` and activation rows `r..r + M` exist.
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
    // SAFETY: the caller's contract: AVX2 and FMA are present, and every pointer below stays
    // inside rows r..r + M of `x` (k floats each, read 8 at a time up to k) and rows j..j + N
    // of `w`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        let x0 = x.as_ptr().add(r * k);
        for blk in 0..k / 32 {
            for q in 0..4 {
                let mut ws = [_mm256_setzero_ps(); N];
                for (c, wc) in ws.iter_mut().enumerate() {
                    *wc = w.quarter(j + c, blk, q);
                }
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x0.add(i * k + blk * 32 + q * 8));
                    for (a, wc) in acc_i.iter_mut().zip(&ws) {
                        *a = _mm256_fmadd_ps(*wc, xv, *a);
                    }
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (c, a) in acc_i.iter().enumerate() {
                part[(r + i) * width + j + c] = hsum(*a);
            }
        }
    }
}

/// The sum of a vector's eight lanes (the qdot kernels' too).
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}
