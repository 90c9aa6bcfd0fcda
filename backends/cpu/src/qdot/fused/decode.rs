//! The fused kernels' block decoders: each type's packed blocks turned, 32 weights at a time,
//! into byte codes and an 8-lane scale vector in registers (the layout of `UnpackedRow`).

use std::arch::x86_64::*;

use infer_core::gguf::{kquants, GgmlType};

use crate::scale_table::f16_table;

/// Evaluates `$body` with `$T` naming the decoder of `$dtype`: `Some(body)`, or `None` for the
/// types without one (Q2_K, Q3_K, IQ4_XS and the float types).
macro_rules! with_decoder {
    ($dtype:expr, $T:ident => $body:expr) => {{
        use $crate::qdot::fused::decode::*;
        match $dtype {
            GgmlType::Q4_0 => Some({
                type $T = Q4_0;
                $body
            }),
            GgmlType::Q4_1 => Some({
                type $T = Q4_1;
                $body
            }),
            GgmlType::Q5_0 => Some({
                type $T = Q5_0;
                $body
            }),
            GgmlType::Q5_1 => Some({
                type $T = Q5_1;
                $body
            }),
            GgmlType::Q8_0 => Some({
                type $T = Q8_0;
                $body
            }),
            GgmlType::IQ4NL => Some({
                type $T = IQ4NL;
                $body
            }),
            GgmlType::Q4K => Some({
                type $T = Q45K<false>;
                $body
            }),
            GgmlType::Q5K => Some({
                type $T = Q45K<true>;
                $body
            }),
            GgmlType::Q6K => Some({
                type $T = Q6K;
                $body
            }),
            _ => None,
        }
    }};
}
pub(crate) use with_decoder;

/// Whether `dtype` has a fused kernel.
pub(crate) fn has_fused(dtype: GgmlType) -> bool {
    // `T` is used only so that the alias the macro declares is not unused.
    with_decoder!(dtype, T => std::mem::size_of::<T>()).is_some()
}

/// One decoded 32-weight chunk: `w = scales[lane] * code + offset` (offset per 16 weights,
/// `lo` for weights 0..16, `hi` for 16..32; zero for signed codes).
#[derive(Clone, Copy)]
pub(crate) struct Chunk {
    pub codes: __m256i,
    pub scales: __m256,
    pub lo: f32,
    pub hi: f32,
}

/// A type's blocks, decoded chunk by chunk.
pub(crate) trait FusedType {
    const SIGNED: bool;
    /// Whether both halves of every chunk share one offset (all but Q6_K).
    const UNIFORM: bool = true;
    /// Calls `f(c, chunk)` for every 32-weight chunk `c` of the packed row `w`.
    ///
    /// # Safety
    /// AVX2 must be available; `w` holds whole blocks.
    unsafe fn chunks(w: &[u8], f: impl FnMut(usize, Chunk));
}

/// Every f16 as f32, as an array so u16 indices need no bounds checks.
#[inline(always)]
pub(super) fn table() -> &'static [f32; 1 << 16] {
    f16_table()
        .try_into()
        .expect("the f16 table has an entry per u16")
}

#[inline(always)]
pub(super) fn f16_at(table: &[f32; 1 << 16], b: &[u8], at: usize) -> f32 {
    table[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
}

/// 16 bytes of nibble pairs as 32 codes: low nibbles are weights 0..16, high nibbles 16..32.
///
/// # Safety
/// AVX2; `qs` holds at least 16 bytes.
#[inline(always)]
unsafe fn nibbles(qs: &[u8]) -> __m256i {
    debug_assert!(qs.len() >= 16);
    // SAFETY: 16 bytes are in bounds (checked in debug builds; callers slice whole blocks).
    unsafe {
        let q = _mm_loadu_si128(qs.as_ptr().cast());
        let mask = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        _mm256_set_m128i(hi, lo)
    }
}

/// Byte j is 0x10 where bit j of `bits` is set (Q5_0 / Q5_1's fifth bits), as llama.cpp's
/// `bytes_from_bits_32`.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn fifth_bits(bits: u32) -> __m256i {
    // SAFETY: register-only intrinsics; the caller has AVX2.
    unsafe {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi64x(
                0x0000000000000000,
                0x0101010101010101,
                0x0202020202020202,
                0x0303030303030303,
            ),
        );
        let all = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        let set = _mm256_cmpeq_epi8(all, _mm256_set1_epi64x(-1));
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

#[inline(always)]
fn uniform(codes: __m256i, d: f32, offset: f32) -> Chunk {
    // SAFETY: a register-only intrinsic; every caller runs with AVX.
    let scales = unsafe { _mm256_set1_ps(d) };
    Chunk {
        codes,
        scales,
        lo: offset,
        hi: offset,
    }
}

macro_rules! block32 {
    ($name:ident, $bytes:expr, $signed:expr, |$t:ident, $b:ident| $body:expr) => {
        pub(crate) struct $name;
        impl FusedType for $name {
            const SIGNED: bool = $signed;
            #[inline(always)]
            unsafe fn chunks(w: &[u8], mut f: impl FnMut(usize, Chunk)) {
                let $t = table();
                for (c, $b) in w.chunks_exact($bytes).enumerate() {
                    // SAFETY: the block is whole; the caller has AVX2.
                    f(c, unsafe { $body });
                }
            }
        }
    };
}

block32!(Q4_0, 18, false, |t, b| {
    let d = f16_at(t, b, 0);
    uniform(nibbles(&b[2..]), d, -8.0 * d)
});
block32!(Q4_1, 20, false, |t, b| uniform(
    nibbles(&b[4..]),
    f16_at(t, b, 0),
    f16_at(t, b, 2)
));
block32!(Q5_0, 22, false, |t, b| {
    let d = f16_at(t, b, 0);
    let bits = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let codes = _mm256_or_si256(nibbles(&b[6..]), fifth_bits(bits));
    uniform(codes, d, -16.0 * d)
});
block32!(Q5_1, 24, false, |t, b| {
    let bits = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let codes = _mm256_or_si256(nibbles(&b[8..]), fifth_bits(bits));
    uniform(codes, f16_at(t, b, 0), f16_at(t, b, 2))
});
block32!(Q8_0, 34, true, |t, b| {
    debug_assert!(b.len() >= 34);
    uniform(
        _mm256_loadu_si256(b.as_ptr().add(2).cast()),
        f16_at(t, b, 0),
        0.0,
    )
});
block32!(IQ4NL, 18, true, |t, b| {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(kquants::IQ4_VALUES.as_ptr().cast()));
    uniform(
        _mm256_shuffle_epi8(table, nibbles(&b[2..])),
        f16_at(t, b, 0),
        0.0,
    )
});

/// Q4_K (`FIVE` false) / Q5_K (true): 256-weight blocks of 8 chunks with 6-bit scales and mins,
/// Q5_K with a fifth bit per weight.
pub(crate) struct Q45K<const FIVE: bool>;
impl<const FIVE: bool> FusedType for Q45K<FIVE> {
    const SIGNED: bool = false;
    #[inline(always)]
    #[expect(clippy::cast_possible_truncation, reason = "j < 4: bit positions")]
    unsafe fn chunks(w: &[u8], mut f: impl FnMut(usize, Chunk)) {
        let t = table();
        let bytes = if FIVE { 176 } else { 144 };
        let qs_at = if FIVE { 48 } else { 16 };
        // SAFETY: the caller's contract (AVX2).
        let mask = unsafe { _mm256_set1_epi8(0x0f) };
        for (blk, b) in w.chunks_exact(bytes).enumerate() {
            let (d, dmin) = (f16_at(t, b, 0), f16_at(t, b, 2));
            let scales = &b[4..16];
            debug_assert!(b.len() >= qs_at + 128);
            // SAFETY: every load lies inside the whole block `b`; the caller has AVX2.
            unsafe {
                let qh = if FIVE {
                    _mm256_loadu_si256(b.as_ptr().add(16).cast())
                } else {
                    _mm256_setzero_si256()
                };
                for j in 0..4 {
                    let q = _mm256_loadu_si256(b.as_ptr().add(qs_at + 32 * j).cast());
                    let mut lo = _mm256_and_si256(q, mask);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                    if FIVE {
                        let bit = |s: i32| {
                            let m = _mm256_set1_epi8((1u8 << s) as i8);
                            let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m);
                            _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                        };
                        lo = _mm256_or_si256(lo, bit(2 * j as i32));
                        hi = _mm256_or_si256(hi, bit(2 * j as i32 + 1));
                    }
                    for (c, codes) in [(2 * j, lo), (2 * j + 1, hi)] {
                        let (sc, m) = kquants::scale_min_k4(c, scales);
                        f(8 * blk + c, uniform(codes, d * sc, -dmin * m));
                    }
                }
            }
        }
    }
}

/// Q6_K: 256-weight blocks of 16 groups of 16 six-bit codes with signed 8-bit scales; codes
/// stay unsigned (0..=63) with the centre, `-32 d sc`, as the offset.
pub(crate) struct Q6K;
impl FusedType for Q6K {
    const SIGNED: bool = false;
    const UNIFORM: bool = false;
    #[inline(always)]
    unsafe fn chunks(w: &[u8], mut f: impl FnMut(usize, Chunk)) {
        let t = table();
        // SAFETY: the caller's contract (AVX2).
        let (m4, m2) = unsafe { (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3)) };
        for (blk, b) in w.chunks_exact(210).enumerate() {
            let d = f16_at(t, b, 208);
            let dl = |g: usize| d * (b[192 + g] as i8) as f32;
            // SAFETY: every load lies inside the whole 210-byte block; the caller has AVX2.
            unsafe {
                for n in 0..2 {
                    let ql0 = _mm256_loadu_si256(b.as_ptr().add(64 * n).cast());
                    let ql1 = _mm256_loadu_si256(b.as_ptr().add(64 * n + 32).cast());
                    let qh = _mm256_loadu_si256(b.as_ptr().add(128 + 32 * n).cast());
                    let high = |s: i32| {
                        let bits = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), m2);
                        _mm256_slli_epi16(bits, 4)
                    };
                    let codes = [
                        _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)),
                    ];
                    for (i, codes) in codes.into_iter().enumerate() {
                        let c = 4 * n + i;
                        let (s0, s1) = (dl(2 * c), dl(2 * c + 1));
                        let scales = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
                        let chunk = Chunk {
                            codes,
                            scales,
                            lo: -32.0 * s0,
                            hi: -32.0 * s1,
                        };
                        f(8 * blk + c, chunk);
                    }
                }
            }
        }
    }
}
