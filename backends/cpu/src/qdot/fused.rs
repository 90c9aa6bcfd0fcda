//! Fused x86 kernels: the packed blocks of the common types decoded in registers inside the dot
//! product, as llama.cpp's `vec_dot_*` do, instead of through an `UnpackedRow` in memory (whose
//! stores and reloads cost as much as the integer math saves). Each 32-weight chunk becomes 32
//! byte codes and an 8-lane scale vector in the layout `kernels` uses, then meets up to four
//! activation rows; the arithmetic is the scalar kernel's, so `tests` checks these against it.
//! Q2_K, Q3_K and IQ4_XS stay on the unpacked path.

use std::arch::x86_64::*;

use infer_core::gguf::{kquants, GgmlType};

use super::kernels::x86;
use super::Job;
use crate::quant::f16_table;

/// Whether `dtype` has a fused kernel.
pub(crate) fn has_fused(dtype: GgmlType) -> bool {
    matches!(
        dtype,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4NL
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
    )
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

/// Eight i32 lanes, lane i = Σ u[4i..4i+4] · s[4i..4i+4] (`u` unsigned, `s` signed bytes).
pub(crate) trait Product {
    /// # Safety
    /// The CPU must have the implementation's features.
    unsafe fn product(u: __m256i, s: __m256i) -> __m256i;
}

macro_rules! product {
    ($name:ident, $f:ident) => {
        pub(crate) struct $name;
        impl Product for $name {
            #[inline(always)]
            unsafe fn product(u: __m256i, s: __m256i) -> __m256i {
                // SAFETY: forwarded from the caller.
                unsafe { x86::$f(u, s) }
            }
        }
    };
}
product!(Avx2, product_avx2);
product!(AvxVnni, product_avxvnni);
product!(Avx512Vnni, product_avx512vnni);

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
fn table() -> &'static [f32; 1 << 16] {
    f16_table()
        .try_into()
        .expect("the f16 table has an entry per u16")
}

#[inline(always)]
fn f16_at(table: &[f32; 1 << 16], b: &[u8], at: usize) -> f32 {
    table[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
}

/// 16 bytes of nibble pairs as 32 codes: low nibbles are weights 0..16, high nibbles 16..32.
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

/// Q4_K / Q5_K: 256-weight blocks of 8 chunks with 6-bit scales and mins.
#[inline(always)]
unsafe fn q45_k<const FIVE: bool>(w: &[u8], mut f: impl FnMut(usize, Chunk)) {
    let t = table();
    let bytes = if FIVE { 176 } else { 144 };
    let qs_at = if FIVE { 48 } else { 16 };
    let mask = _mm256_set1_epi8(0x0f);
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

pub(crate) struct Q4K;
impl FusedType for Q4K {
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn chunks(w: &[u8], f: impl FnMut(usize, Chunk)) {
        // SAFETY: forwarded from the caller.
        unsafe { q45_k::<false>(w, f) }
    }
}

pub(crate) struct Q5K;
impl FusedType for Q5K {
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn chunks(w: &[u8], f: impl FnMut(usize, Chunk)) {
        // SAFETY: forwarded from the caller.
        unsafe { q45_k::<true>(w, f) }
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
        let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
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

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only intrinsics; the caller has AVX.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// One activation row as the kernels read it: codes, 8-lane scales, per-16 and per-32 sums.
pub(crate) type XRow<'a> = (&'a [i8], &'a [f32], &'a [f32], &'a [f32]);

/// The dots of one packed weight row with the activation rows `rows`.
///
/// # Safety
/// AVX2 and FMA, and `P`'s features, must be available; `w_row` holds as many weights as
/// every row.
#[inline(always)]
pub(crate) unsafe fn dot_rows<T: FusedType, P: Product, const R: usize>(
    w_row: &[u8],
    rows: &[XRow; R],
) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let mut offsets = [0f32; R];
    // SAFETY: the caller's contract; the loads stay inside each activation row (`c` counts
    // the row's 32-weight chunks, and each row holds 32 codes and 8 scales per chunk).
    unsafe {
        T::chunks(w_row, |c, chunk| {
            debug_assert!(rows.iter().all(|r| r.0.len() >= 32 * c + 32));
            let wu = if T::SIGNED {
                _mm256_sign_epi8(chunk.codes, chunk.codes)
            } else {
                chunk.codes
            };
            for (r, (codes, scales, sums, sums32)) in rows.iter().enumerate() {
                let xv = _mm256_loadu_si256(codes.as_ptr().add(32 * c).cast());
                let xs = if T::SIGNED {
                    _mm256_sign_epi8(xv, chunk.codes)
                } else {
                    xv
                };
                let p = _mm256_cvtepi32_ps(P::product(wu, xs));
                let d = _mm256_mul_ps(chunk.scales, _mm256_loadu_ps(scales.as_ptr().add(8 * c)));
                acc[r] = _mm256_fmadd_ps(p, d, acc[r]);
                if !T::SIGNED && T::UNIFORM {
                    offsets[r] = chunk.lo.mul_add(sums32[c], offsets[r]);
                } else if !T::SIGNED {
                    offsets[r] += chunk.lo * sums[2 * c] + chunk.hi * sums[2 * c + 1];
                }
            }
        });
        std::array::from_fn(|r| hsum(acc[r]) + offsets[r])
    }
}

const PREFETCH_ROWS: usize = 2;

/// Adds to `part [m, width]` the rows of `w_tile` dotted with every activation plane's rows
/// (the planes of one output row add up), each weight row decoded once per four of them.
#[inline(always)]
unsafe fn tile<T: FusedType, P: Product>(job: &Job, w_tile: &[u8], part: &mut [f32]) {
    let width = w_tile.len() / job.row_bytes;
    // (output row, activation row) for every plane.
    let rows: Vec<(usize, XRow)> = (0..job.m)
        .flat_map(|r| job.planes.iter().map(move |x| (r, x.row_with_sums32(r))))
        .collect();
    for (j, w_row) in w_tile.chunks_exact(job.row_bytes).enumerate() {
        // Weights stream from L3 or DRAM once per step: ask for a row ahead now.
        let ahead = (j + PREFETCH_ROWS) * job.row_bytes;
        if let Some(next) = w_tile.get(ahead..ahead + job.row_bytes) {
            for line in next.chunks(64) {
                // SAFETY: a hint on an in-bounds address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
            }
        }
        for group in rows.chunks(4) {
            macro_rules! run {
                ($r:literal) => {{
                    let xs: [XRow; $r] = std::array::from_fn(|i| group[i].1);
                    // SAFETY: forwarded from the caller.
                    let dots = unsafe { dot_rows::<T, P, $r>(w_row, &xs) };
                    for ((out_row, _), v) in group.iter().zip(dots) {
                        part[out_row * width + j] += v;
                    }
                }};
            }
            match group.len() {
                4 => run!(4),
                3 => run!(3),
                2 => run!(2),
                _ => run!(1),
            }
        }
    }
}

#[inline(always)]
unsafe fn by_type<P: Product>(job: &Job, w_tile: &[u8], part: &mut [f32]) {
    // SAFETY (every arm): forwarded from the caller.
    unsafe {
        match job.dtype {
            GgmlType::Q4_0 => tile::<Q4_0, P>(job, w_tile, part),
            GgmlType::Q4_1 => tile::<Q4_1, P>(job, w_tile, part),
            GgmlType::Q5_0 => tile::<Q5_0, P>(job, w_tile, part),
            GgmlType::Q5_1 => tile::<Q5_1, P>(job, w_tile, part),
            GgmlType::Q8_0 => tile::<Q8_0, P>(job, w_tile, part),
            GgmlType::IQ4NL => tile::<IQ4NL, P>(job, w_tile, part),
            GgmlType::Q4K => tile::<Q4K, P>(job, w_tile, part),
            GgmlType::Q5K => tile::<Q5K, P>(job, w_tile, part),
            GgmlType::Q6K => tile::<Q6K, P>(job, w_tile, part),
            other => unreachable!("{} has no fused kernel (see has_fused)", other.name()),
        }
    }
}

/// `by_type` compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `has_fused(job.dtype)`; `w_tile` holds whole rows.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile_avx2(job: &Job, w_tile: &[u8], part: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe { by_type::<Avx2>(job, w_tile, part) }
}

/// `by_type` compiled for AVX-VNNI.
///
/// # Safety
/// As `tile_avx2`, and the CPU must have AVX-VNNI.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(crate) unsafe fn tile_avxvnni(job: &Job, w_tile: &[u8], part: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe { by_type::<AvxVnni>(job, w_tile, part) }
}

/// `by_type` compiled for AVX-512 VNNI on 256-bit registers.
///
/// # Safety
/// As `tile_avx2`, and the CPU must have AVX-512 VNNI and VL.
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
pub(crate) unsafe fn tile_avx512vnni(job: &Job, w_tile: &[u8], part: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe { by_type::<Avx512Vnni>(job, w_tile, part) }
}

/// Decodes packed rows (`k` weights each) to f32 through the fused chunk decoders.
#[inline(always)]
unsafe fn dequantize_as<T: FusedType>(w: &[u8], row_bytes: usize, k: usize, out: &mut [f32]) {
    for (w_row, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(k)) {
        // SAFETY: the caller has AVX2 and FMA; each chunk `c` of the row writes o[32c..32c+32],
        // inside the row's `k` outputs.
        unsafe {
            T::chunks(w_row, |c, chunk| {
                debug_assert!(o.len() >= 32 * c + 32);
                let mut bytes = [0u8; 32];
                _mm256_storeu_si256(bytes.as_mut_ptr().cast(), chunk.codes);
                for q in 0..4 {
                    let b8 = _mm_loadl_epi64(bytes.as_ptr().add(8 * q).cast());
                    let wide = if T::SIGNED {
                        _mm256_cvtepi8_epi32(b8)
                    } else {
                        _mm256_cvtepu8_epi32(b8)
                    };
                    // Lanes 0..4 of `scales` hold the first 16 weights' scale, 4..8 the rest.
                    let scale = if q < 2 {
                        _mm256_permute2f128_ps(chunk.scales, chunk.scales, 0x00)
                    } else {
                        _mm256_permute2f128_ps(chunk.scales, chunk.scales, 0x11)
                    };
                    let offset = _mm256_set1_ps(if q < 2 { chunk.lo } else { chunk.hi });
                    let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide), scale, offset);
                    _mm256_storeu_ps(o.as_mut_ptr().add(32 * c + 8 * q), v);
                }
            })
        }
    }
}

/// `dequantize_as` for `dtype`, compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `has_fused(dtype)`; `w` holds whole rows of `k` weights and
/// `out` room for them.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dequantize_avx2(dtype: GgmlType, w: &[u8], k: usize, out: &mut [f32]) {
    let row_bytes = dtype.row_bytes(k);
    // SAFETY (every arm): forwarded from the caller.
    unsafe {
        match dtype {
            GgmlType::Q4_0 => dequantize_as::<Q4_0>(w, row_bytes, k, out),
            GgmlType::Q4_1 => dequantize_as::<Q4_1>(w, row_bytes, k, out),
            GgmlType::Q5_0 => dequantize_as::<Q5_0>(w, row_bytes, k, out),
            GgmlType::Q5_1 => dequantize_as::<Q5_1>(w, row_bytes, k, out),
            GgmlType::Q8_0 => dequantize_as::<Q8_0>(w, row_bytes, k, out),
            GgmlType::IQ4NL => dequantize_as::<IQ4NL>(w, row_bytes, k, out),
            GgmlType::Q4K => dequantize_as::<Q4K>(w, row_bytes, k, out),
            GgmlType::Q5K => dequantize_as::<Q5K>(w, row_bytes, k, out),
            GgmlType::Q6K => dequantize_as::<Q6K>(w, row_bytes, k, out),
            other => unreachable!("{} has no fused kernel (see has_fused)", other.name()),
        }
    }
}
