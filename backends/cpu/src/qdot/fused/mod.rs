//! Fused x86 kernels: the packed blocks of the common types decoded in registers inside the dot
//! product, as llama.cpp's `vec_dot_*` do, instead of through an `UnpackedRow` in memory (whose
//! stores and reloads cost as much as the integer math saves). Each 32-weight chunk becomes 32
//! byte codes and an 8-lane scale vector in the layout `kernels` uses, then meets up to four
//! activation rows; the arithmetic is the scalar kernel's, so `tests` checks these against it.
//! Q4_K, Q5_K and Q6_K sum whole blocks in integers instead (`kquant`). Q2_K, Q3_K and IQ4_XS
//! stay on the unpacked path.

mod decode;
mod kquant;

use std::arch::x86_64::*;

use infer_core::gguf::GgmlType;

use super::activations::{group_of, XRow};
use super::kernels::x86::{self, hsum};
use super::Job;
use crate::tiles::prefetch_ahead;
pub(crate) use decode::has_fused;
use decode::{with_decoder, Chunk, FusedType};
use kquant::KQuant;

/// The integer multiply-adds of a level.
pub(crate) trait Product {
    /// Eight i32 lanes, lane i = Σ u[4i..4i+4] · s[4i..4i+4] (`u` unsigned, `s` signed bytes).
    ///
    /// # Safety
    /// The CPU must have the implementation's features.
    unsafe fn product(u: __m256i, s: __m256i) -> __m256i;

    /// `acc` plus `product(u, s)`.
    ///
    /// # Safety
    /// The CPU must have the implementation's features.
    unsafe fn product_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;

    /// `acc` plus, in each i32 lane, the two products of its i16 pairs of `a` and `b`.
    ///
    /// # Safety
    /// The CPU must have the implementation's features.
    unsafe fn madd_add(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

macro_rules! product {
    ($name:ident, $f:ident, |$pacc:ident, $u:ident, $s:ident| $product_add:expr,
     |$acc:ident, $a:ident, $b:ident| $madd_add:expr) => {
        pub(crate) struct $name;
        impl Product for $name {
            #[inline(always)]
            unsafe fn product(u: __m256i, s: __m256i) -> __m256i {
                // SAFETY: forwarded from the caller.
                unsafe { x86::$f(u, s) }
            }

            #[inline(always)]
            unsafe fn product_add($pacc: __m256i, $u: __m256i, $s: __m256i) -> __m256i {
                // SAFETY: register-only intrinsics of the caller's features.
                unsafe { $product_add }
            }

            #[inline(always)]
            unsafe fn madd_add($acc: __m256i, $a: __m256i, $b: __m256i) -> __m256i {
                // SAFETY: register-only intrinsics of the caller's features.
                unsafe { $madd_add }
            }
        }
    };
}
product!(
    Avx2,
    product_avx2,
    |acc, u, s| _mm256_add_epi32(acc, x86::product_avx2(u, s)),
    |acc, a, b| _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
);
product!(
    AvxVnni,
    product_avxvnni,
    |acc, u, s| _mm256_dpbusd_avx_epi32(acc, u, s),
    |acc, a, b| _mm256_dpwssd_avx_epi32(acc, a, b)
);
product!(
    Avx512Vnni,
    product_avx512vnni,
    |acc, u, s| _mm256_dpbusd_epi32(acc, u, s),
    |acc, a, b| _mm256_dpwssd_epi32(acc, a, b)
);

/// A chunk's weight bytes as `maddubs` takes them (unsigned): signed types' magnitudes, whose
/// signs `activation_bytes` moves onto the activations.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn weight_bytes<T: FusedType>(chunk: &Chunk) -> __m256i {
    // SAFETY: a register-only intrinsic; the caller has AVX2.
    unsafe {
        if T::SIGNED {
            _mm256_sign_epi8(chunk.codes, chunk.codes)
        } else {
            chunk.codes
        }
    }
}

/// Row `x`'s 32 codes of chunk `c`, signed by the chunk's weights for signed types.
///
/// # Safety
/// AVX2; `x` holds chunk `c`.
#[inline(always)]
unsafe fn activation_bytes<T: FusedType>(chunk: &Chunk, x: &XRow, c: usize) -> __m256i {
    debug_assert!(x.codes.len() >= 32 * c + 32);
    // SAFETY: the 32 bytes lie in the row (the caller's contract); the caller has AVX2.
    unsafe {
        let xv = _mm256_loadu_si256(x.codes.as_ptr().add(32 * c).cast());
        if T::SIGNED {
            _mm256_sign_epi8(xv, chunk.codes)
        } else {
            xv
        }
    }
}

/// What the chunk's per-16 offsets add to row `x`'s dot (nothing for signed codes).
#[inline(always)]
fn offset<T: FusedType>(chunk: &Chunk, x: &XRow, c: usize) -> f32 {
    if T::SIGNED {
        0.0
    } else if T::UNIFORM {
        chunk.lo * x.sums32[c]
    } else {
        chunk.lo * x.sums[2 * c] + chunk.hi * x.sums[2 * c + 1]
    }
}

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
    // SAFETY: the caller's contract (AVX).
    let mut acc = [unsafe { _mm256_setzero_ps() }; R];
    let mut offsets = [0f32; R];
    // SAFETY: the caller's contract; the loads stay inside each activation row (`c` counts
    // the row's 32-weight chunks, and each row holds 32 codes and 8 scales per chunk).
    unsafe {
        T::chunks(w_row, |c, chunk| {
            let wu = weight_bytes::<T>(&chunk);
            for (r, x) in rows.iter().enumerate() {
                let xs = activation_bytes::<T>(&chunk, x, c);
                let p = _mm256_cvtepi32_ps(P::product(wu, xs));
                let d = _mm256_mul_ps(chunk.scales, _mm256_loadu_ps(x.scales.as_ptr().add(8 * c)));
                acc[r] = _mm256_fmadd_ps(p, d, acc[r]);
                offsets[r] += offset::<T>(&chunk, x, c);
            }
        });
        std::array::from_fn(|r| hsum(acc[r]) + offsets[r])
    }
}

/// `dot_rows` for rows that come in (value, residual) pairs of one output row: each pair's
/// integer sums are added as `256 · value + residual` (the residual's step is exactly the
/// value's / 256, `quantize_residual`) and converted and scaled once, which halves the float
/// work per chunk. Each pair's dot is in its first slot, zero in the second (both add to the
/// same output). Exact in integers: `|256 · value + residual|` stays below 2^24 (four
/// products of at most 128 · 127 each), so its conversion to f32 is exact too.
///
/// # Safety
/// As `dot_rows`; `R` is even and `rows[2i + 1]` is `rows[2i]`'s residual.
#[inline(always)]
pub(crate) unsafe fn dot_pairs<T: FusedType, P: Product, const R: usize>(
    w_row: &[u8],
    rows: &[XRow; R],
) -> [f32; R] {
    debug_assert!(R.is_multiple_of(2));
    // SAFETY: the caller's contract (AVX).
    let mut acc = [unsafe { _mm256_setzero_ps() }; R];
    let mut offsets = [0f32; R];
    // SAFETY: as in `dot_rows`.
    unsafe {
        T::chunks(w_row, |c, chunk| {
            let wu = weight_bytes::<T>(&chunk);
            for i in 0..R / 2 {
                let (value, residual) = (&rows[2 * i], &rows[2 * i + 1]);
                let high =
                    _mm256_slli_epi32(P::product(wu, activation_bytes::<T>(&chunk, value, c)), 8);
                let both = P::product_add(high, wu, activation_bytes::<T>(&chunk, residual, c));
                // The residual's scales: the value's / 256.
                let d = _mm256_mul_ps(
                    chunk.scales,
                    _mm256_loadu_ps(residual.scales.as_ptr().add(8 * c)),
                );
                acc[2 * i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(both), d, acc[2 * i]);
                offsets[2 * i] += offset::<T>(&chunk, value, c) + offset::<T>(&chunk, residual, c);
            }
        });
        std::array::from_fn(|r| {
            if r % 2 == 0 {
                hsum(acc[r]) + offsets[r]
            } else {
                0.0
            }
        })
    }
}

/// A kernel for one packed weight row against up to four activation rows.
trait RowKernel {
    /// # Safety
    /// AVX2, FMA and `P`'s features; `w_row` holds as many weights as every row.
    unsafe fn dot<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R];

    /// `dot` for rows in (value, residual) pairs; the pair's dot may be in either slot, the
    /// other's zero.
    ///
    /// # Safety
    /// As `dot`; `R` is even and `rows[2i + 1]` is `rows[2i]`'s residual.
    unsafe fn dot_paired<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R] {
        // SAFETY: forwarded from the caller.
        unsafe { Self::dot::<P, R>(w_row, rows) }
    }
}

/// `dot_rows` on a chunk decoder.
struct Chunked<T>(std::marker::PhantomData<T>);
impl<T: FusedType> RowKernel for Chunked<T> {
    #[inline(always)]
    unsafe fn dot<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R] {
        // SAFETY: forwarded from the caller.
        unsafe { dot_rows::<T, P, R>(w_row, rows) }
    }

    #[inline(always)]
    unsafe fn dot_paired<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R] {
        // SAFETY: forwarded from the caller.
        unsafe { dot_pairs::<T, P, R>(w_row, rows) }
    }
}

/// An integer-summed K-quant kernel (activations in groups of 256).
struct Blockwise<T>(std::marker::PhantomData<T>);
impl<T: KQuant> RowKernel for Blockwise<T> {
    #[inline(always)]
    unsafe fn dot<P: Product, const R: usize>(w_row: &[u8], rows: &[XRow; R]) -> [f32; R] {
        // SAFETY: forwarded from the caller; `matmul_planes` quantizes the activations of
        // these types in groups of 256 (`group_of`).
        unsafe { T::dot::<P, R>(w_row, rows) }
    }
}

/// Adds to `part [m, width]` the rows of `w_tile` dotted with every activation plane's rows
/// (the planes of one output row add up), each weight row decoded once per four of them.
///
/// # Safety
/// AVX2, FMA and `P`'s features; `w_tile` holds whole rows.
#[inline(always)]
unsafe fn tile<K: RowKernel, P: Product>(job: &Job, w_tile: &[u8], part: &mut [f32]) {
    let width = w_tile.len() / job.row_bytes;
    // Two planes: `job.rows` lists each output row's value row, then its residual row.
    let paired = job.planes.len() == 2;
    for (j, w_row) in w_tile.chunks_exact(job.row_bytes).enumerate() {
        prefetch_ahead(w_tile, j, job.row_bytes);
        for group in job.rows.chunks(4) {
            macro_rules! run {
                ($r:literal, $dot:ident) => {{
                    let xs: [XRow; $r] = std::array::from_fn(|i| group[i].1);
                    // SAFETY: forwarded from the caller; with two planes the groups of 4 and
                    // 2 hold whole pairs.
                    let dots = unsafe { K::$dot::<P, $r>(w_row, &xs) };
                    for ((out_row, _), v) in group.iter().zip(dots) {
                        part[out_row * width + j] += v;
                    }
                }};
            }
            match (group.len(), paired) {
                (4, true) => run!(4, dot_paired),
                (2, true) => run!(2, dot_paired),
                (4, false) => run!(4, dot),
                (3, _) => run!(3, dot),
                (2, false) => run!(2, dot),
                _ => run!(1, dot),
            }
        }
    }
}

/// The tile on `job.dtype`'s kernel.
///
/// # Safety
/// AVX2, FMA and `P`'s features; `has_fused(job.dtype)`; `w_tile` holds whole rows.
#[inline(always)]
unsafe fn by_type<P: Product>(job: &Job, w_tile: &[u8], part: &mut [f32]) {
    debug_assert!(job.planes.iter().all(|p| p.group == group_of(job.dtype)));
    // SAFETY (every arm): forwarded from the caller.
    unsafe {
        match job.dtype {
            GgmlType::Q4K => tile::<Blockwise<kquant::Q45K<false>>, P>(job, w_tile, part),
            GgmlType::Q5K => tile::<Blockwise<kquant::Q45K<true>>, P>(job, w_tile, part),
            GgmlType::Q6K => tile::<Blockwise<kquant::Q6K>, P>(job, w_tile, part),
            dtype => with_decoder!(dtype, T => tile::<Chunked<T>, P>(job, w_tile, part))
                .unwrap_or_else(|| unreachable!("{} has no fused kernel", dtype.name())),
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
///
/// # Safety
/// AVX2 and FMA; `w` holds whole rows of `row_bytes` and `out` room for their `k` weights each.
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
    // SAFETY: forwarded from the caller.
    with_decoder!(dtype, T => unsafe { dequantize_as::<T>(w, row_bytes, k, out) })
        .unwrap_or_else(|| unreachable!("{} has no fused kernel", dtype.name()))
}
