//! Q4_K, Q5_K and Q6_K dots on activations quantized with one scale per 256 values
//! (`activations::group_of`), as llama.cpp's `vec_dot_q*_K_q8_K`: a weight block's sub-block
//! scales are small integers, so its whole 256-weight dot is summed in i32 (`maddubs` of codes
//! and activations, then a multiply-add of pairs by the sub-block scale) and meets floats once,
//! `d_w · d_x · Σ`. The mins (Q4_K, Q5_K) and Q6_K's centre of 32 come from the activations'
//! per-16 code sums in one more integer multiply-add per block. The per-32 float path
//! (`dot_rows` over `decode::Q45K`/`Q6K`) spent a conversion, two float operations and a
//! decoded scale per 32 weights and row, which made K-quant decode compute-bound.
//!
//! One weight row at a time: two rows sharing each activation load measured 3× slower on the
//! 1B model's shapes (two interleaved weight streams starve the hardware prefetcher).
//!
//! The sums are exact in i32 (per block at most 8 · 2 · 2 · 63 · 127 · 128 in magnitude), so
//! these match the scalar kernel to f32 rounding (`tests`).

use std::arch::x86_64::*;

use super::decode::{f16_at, table};
use super::Product;
use crate::qdot::activations::XRow;
use crate::qdot::kernels::x86::hsum;

/// A K-quant weight type with an integer-summed block kernel.
pub(crate) trait KQuant {
    /// The dots of one packed weight row with R activation rows.
    ///
    /// # Safety
    /// AVX2, FMA and `P`'s features; `w_row` holds whole blocks and every activation row as
    /// many values, quantized in groups of 256.
    unsafe fn dot<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R];
}

/// The per-row state of a block: its activation scale and the activation codes' base pointer.
struct BlockRow {
    d: f32,
    codes: *const i8,
}

/// Block `blk` of each activation row: its one scale and its codes.
///
/// # Safety
/// Every row holds block `blk` (256 codes, a group scale).
#[inline(always)]
unsafe fn block_rows<const R: usize>(rows: &[XRow; R], blk: usize) -> [BlockRow; R] {
    std::array::from_fn(|r| {
        debug_assert!(rows[r].codes.len() >= 256 * (blk + 1) && rows[r].group_scales.len() > blk);
        // SAFETY: block `blk` is in every row (the caller's contract).
        unsafe {
            BlockRow {
                d: *rows[r].group_scales.get_unchecked(blk),
                codes: rows[r].codes.as_ptr().add(256 * blk),
            }
        }
    })
}

/// The 16 per-16 code sums of block `blk` of row `x`.
///
/// # Safety
/// AVX2; the row holds block `blk`.
#[inline(always)]
unsafe fn code_sums(x: &XRow, blk: usize) -> __m256i {
    debug_assert!(x.code_sums.len() >= 16 * (blk + 1));
    // SAFETY: 16 i16 of block `blk` are in the row (the caller's contract).
    unsafe { _mm256_loadu_si256(x.code_sums.as_ptr().add(16 * blk).cast()) }
}

/// Adds `d_w · d_x · sum` for each activation row to `acc`.
///
/// # Safety
/// AVX2 and FMA.
#[inline(always)]
unsafe fn scale_into<const R: usize>(
    acc: &mut [__m256; R],
    sums: &[__m256i; R],
    d: f32,
    xs: &[BlockRow; R],
) {
    for r in 0..R {
        // SAFETY: register-only intrinsics; the caller has AVX2 and FMA.
        unsafe {
            let scale = _mm256_set1_ps(d * xs[r].d);
            acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums[r]), acc[r]);
        }
    }
}

/// Q4_K's and Q5_K's 6-bit sub-block scales and mins of a block (`scales`: its 12 bytes), as
/// eight i16 each. Byte j < 4 of the first two words holds scale j and min j in its low six
/// bits; scales and mins 4..8 are the third word's nibbles with those bytes' top two bits above.
///
/// # Safety
/// SSE4.1.
#[inline(always)]
unsafe fn scales_mins(scales: &[u8]) -> (__m128i, __m128i) {
    let word = |i: usize| {
        u32::from_le_bytes([
            scales[4 * i],
            scales[4 * i + 1],
            scales[4 * i + 2],
            scales[4 * i + 3],
        ])
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let (low6, low4, top2) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    let sc = [w0 & low6, (w2 & low4) | (((w0 >> 6) & top2) << 4)];
    let mn = [w1 & low6, ((w2 >> 4) & low4) | (((w1 >> 6) & top2) << 4)];
    let bytes = |v: [u32; 2]| (v[0] as u64 | (v[1] as u64) << 32) as i64;
    // SAFETY: register-only intrinsics; the caller has SSE4.1.
    unsafe {
        (
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128(bytes(sc))),
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128(bytes(mn))),
        )
    }
}

/// i16 lane `i` of `v` in every i16 lane of a 256-bit vector.
///
/// # Safety
/// AVX2.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "I < 8: byte indices")]
unsafe fn broadcast_i16<const I: i32>(v: __m128i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller has AVX2.
    unsafe {
        let pick = _mm_set1_epi16(((2 * I) | ((2 * I + 1) << 8)) as i16);
        _mm256_broadcastsi128_si256(_mm_shuffle_epi8(v, pick))
    }
}

/// Q4_K (`FIVE` false) and Q5_K (true).
pub(crate) struct Q45K<const FIVE: bool>;

impl<const FIVE: bool> KQuant for Q45K<FIVE> {
    #[inline(always)]
    #[expect(clippy::cast_possible_truncation, reason = "j < 4: shift counts")]
    unsafe fn dot<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R] {
        let t = table();
        let bytes = if FIVE { 176 } else { 144 };
        let qs_at = if FIVE { 48 } else { 16 };
        // SAFETY: register-only intrinsics and loads inside the whole block `b` and block
        // `blk` of every activation row (the caller's contract); the caller has AVX2, FMA and
        // `P`'s features.
        unsafe {
            let m4 = _mm256_set1_epi8(0x0f);
            let one = _mm256_set1_epi8(1);
            let mut acc = [_mm256_setzero_ps(); R];
            let mut min_acc = [_mm_setzero_ps(); R];
            for (blk, b) in w_row.chunks_exact(bytes).enumerate() {
                debug_assert!(b.len() >= qs_at + 128);
                let (d, dmin) = (f16_at(t, b, 0), f16_at(t, b, 2));
                let (sc, mins) = scales_mins(&b[4..16]);
                let xs = block_rows(rows, blk);
                // Σ_sub min · (the sub-block's codes summed, from the per-16 sums).
                for r in 0..R {
                    let s16 = code_sums(&rows[r], blk);
                    let s32 = _mm_hadd_epi16(
                        _mm256_castsi256_si128(s16),
                        _mm256_extracti128_si256(s16, 1),
                    );
                    let m = _mm_cvtepi32_ps(_mm_madd_epi16(mins, s32));
                    min_acc[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * xs[r].d), m, min_acc[r]);
                }
                let sub_scales = [
                    (broadcast_i16::<0>(sc), broadcast_i16::<1>(sc)),
                    (broadcast_i16::<2>(sc), broadcast_i16::<3>(sc)),
                    (broadcast_i16::<4>(sc), broadcast_i16::<5>(sc)),
                    (broadcast_i16::<6>(sc), broadcast_i16::<7>(sc)),
                ];
                let qh = if FIVE {
                    _mm256_loadu_si256(b.as_ptr().add(16).cast())
                } else {
                    _mm256_setzero_si256()
                };
                let mut sums = [_mm256_setzero_si256(); R];
                for (j, (s_lo, s_hi)) in sub_scales.into_iter().enumerate() {
                    // Chunk 2j in the low nibbles, 2j+1 in the high ones.
                    let q = _mm256_loadu_si256(b.as_ptr().add(qs_at + 32 * j).cast());
                    let mut lo = _mm256_and_si256(q, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    if FIVE {
                        // Bit 2j (2j+1) of byte l is the fifth bit of weight l of chunk 2j
                        // (2j+1); 16-bit shifts move whole bytes' bits as each byte is masked.
                        let bits = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32));
                        let lo5 = _mm256_and_si256(bits, one);
                        let hi5 = _mm256_and_si256(_mm256_srli_epi16(bits, 1), one);
                        lo = _mm256_or_si256(lo, _mm256_slli_epi16(lo5, 4));
                        hi = _mm256_or_si256(hi, _mm256_slli_epi16(hi5, 4));
                    }
                    for r in 0..R {
                        let x = xs[r].codes.add(64 * j);
                        let p_lo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(x.cast()));
                        let p_hi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(x.add(32).cast()));
                        sums[r] = P::madd_add(sums[r], p_lo, s_lo);
                        sums[r] = P::madd_add(sums[r], p_hi, s_hi);
                    }
                }
                scale_into(&mut acc, &sums, d, &xs);
            }
            std::array::from_fn(|r| hsum(acc[r]) - hsum128(min_acc[r]))
        }
    }
}

/// Q6_K: 16 signed 8-bit scales per block, codes 0..=63 around 32.
pub(crate) struct Q6K;

impl KQuant for Q6K {
    #[inline(always)]
    #[expect(clippy::cast_possible_truncation, reason = "i < 4: shift counts")]
    unsafe fn dot<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R] {
        let t = table();
        // SAFETY: as in `Q45K::dot`: loads inside the whole 210-byte block and block `blk` of
        // every activation row; the caller has the features.
        unsafe {
            let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
            let mut acc = [_mm256_setzero_ps(); R];
            for (blk, b) in w_row.chunks_exact(210).enumerate() {
                let d = f16_at(t, b, 208);
                let xs = block_rows(rows, blk);
                let sc_bytes = _mm_loadu_si128(b.as_ptr().add(192).cast());
                // The centre: Σ_16 scale · 32 · (the 16's codes summed), subtracted up front.
                let sc16 = _mm256_cvtepi8_epi16(sc_bytes);
                let mut sums = [_mm256_setzero_si256(); R];
                for (r, sum) in sums.iter_mut().enumerate() {
                    let centre = _mm256_madd_epi16(sc16, code_sums(&rows[r], blk));
                    *sum = _mm256_sub_epi32(*sum, _mm256_slli_epi32(centre, 5));
                }
                for c in 0..8 {
                    let (n, i) = (c / 4, c % 4);
                    // Chunk c: the low (i < 2) or high nibbles of ql[64n + 32(i % 2)..], with
                    // bits 2i..2i+2 of qh[32n..] above them.
                    let ql = _mm256_loadu_si256(b.as_ptr().add(64 * n + 32 * (i % 2)).cast());
                    let ql = if i < 2 { ql } else { _mm256_srli_epi16(ql, 4) };
                    let qh = _mm256_loadu_si256(b.as_ptr().add(128 + 32 * n).cast());
                    let high =
                        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i as i32)), m2);
                    let codes =
                        _mm256_or_si256(_mm256_and_si256(ql, m4), _mm256_slli_epi16(high, 4));
                    // i16 lanes 0..8 (weights 0..16 of the chunk) take scale 2c, 8..16 2c+1.
                    let pick = _mm_set_epi64x(
                        0x0101_0101_0101_0101 * (2 * c as i64 + 1),
                        0x0101_0101_0101_0101 * (2 * c as i64),
                    );
                    let scales = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc_bytes, pick));
                    for r in 0..R {
                        let x = _mm256_loadu_si256(xs[r].codes.add(32 * c).cast());
                        let p = _mm256_maddubs_epi16(codes, x);
                        sums[r] = P::madd_add(sums[r], p, scales);
                    }
                }
                scale_into(&mut acc, &sums, d, &xs);
            }
            std::array::from_fn(|r| hsum(acc[r]))
        }
    }
}

/// The sum of four lanes.
///
/// # Safety
/// SSE3 (part of every level these kernels run on).
#[inline(always)]
unsafe fn hsum128(v: __m128) -> f32 {
    // SAFETY: register-only intrinsics.
    unsafe {
        let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}
