//! Integer dot products of one decoded weight row (`UnpackedRow`) with R quantized activation
//! rows at once: per 32 weights, eight 4-weight integer partial sums (AVX2 `maddubs` + `madd`,
//! one VNNI `dpbusd`, NEON widening multiplies and pairwise adds or one `sdot` per four lanes),
//! scaled in f32 by the weight scales and the activation block's scale.
//! The weight codes and scales are loaded once for all R rows. The scalar kernel computes the
//! same sums in plain Rust: the fallback and the tests' reference.

/// `Σ_c Σ_lanes scales[8c + lane] * xd[8c + lane] * (Σ of the lane's 4 code·x products)` for
/// each of the R rows: the scalar form of the vector kernels' arithmetic.
#[inline(always)]
pub(crate) fn dot_scalar<const SIGNED: bool, const R: usize>(
    codes: &[u8],
    scales: &[f32],
    x: &[&[i8]; R],
    xd: &[&[f32]; R],
) -> [f32; R] {
    let mut out = [0f32; R];
    for (c, w) in codes.chunks_exact(32).enumerate() {
        for r in 0..R {
            let xs = &x[r][32 * c..32 * c + 32];
            let mut halves = [0i32; 2];
            for (h, sum) in halves.iter_mut().enumerate() {
                for l in 16 * h..16 * h + 16 {
                    let wv = if SIGNED {
                        w[l] as i8 as i32
                    } else {
                        w[l] as i32
                    };
                    *sum += wv * xs[l] as i32;
                }
            }
            let (s, d) = (&scales[8 * c..8 * c + 8], &xd[r][8 * c..8 * c + 8]);
            out[r] += s[0] * d[0] * halves[0] as f32 + s[4] * d[4] * halves[1] as f32;
        }
    }
    out
}

/// The 32-code chunks of a vector kernel's row, its inputs' sizes checked in debug builds (the
/// kernels' safety contract: `scales` 8 per chunk, every `x[r]` as many codes, `xd[r]` 8 per
/// chunk).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn chunks_checked<const R: usize>(
    codes: &[u8],
    scales: &[f32],
    x: &[&[i8]; R],
    xd: &[&[f32]; R],
) -> usize {
    let chunks = codes.len() / 32;
    debug_assert!(scales.len() >= 8 * chunks);
    debug_assert!((0..R).all(|r| x[r].len() >= 32 * chunks && xd[r].len() >= 8 * chunks));
    chunks
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    pub(crate) use crate::blocked::hsum;

    /// Eight i32 lanes, lane i = Σ u[4i..4i+4] · s[4i..4i+4] (u unsigned, s signed bytes);
    /// pairs cannot saturate i16 because |u| ≤ 128 and |s| ≤ 127.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn product_avx2(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    pub(crate) fn product_avxvnni(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
    }

    #[target_feature(enable = "avx2,avx512vnni,avx512vl")]
    #[inline]
    pub(crate) fn product_avx512vnni(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }

    macro_rules! dot_kernel {
        ($name:ident, $features:literal, $product:ident) => {
            /// The vector form of `dot_scalar`.
            ///
            /// # Safety
            /// The CPU must have the enabled features; `codes` holds whole 32-code chunks,
            /// `scales` 8 per chunk, every `x[r]` as many codes and `xd[r]` 8 per chunk.
            #[target_feature(enable = $features)]
            #[inline]
            pub(crate) unsafe fn $name<const SIGNED: bool, const R: usize>(
                codes: &[u8],
                scales: &[f32],
                x: &[&[i8]; R],
                xd: &[&[f32]; R],
            ) -> [f32; R] {
                let chunks = super::chunks_checked(codes, scales, x, xd);
                let mut acc = [_mm256_setzero_ps(); R];
                for c in 0..chunks {
                    // SAFETY: every load is in bounds by the caller's contract (checked in
                    // debug builds by `chunks_checked`); unaligned loads throughout.
                    unsafe {
                        let w = _mm256_loadu_si256(codes.as_ptr().add(32 * c).cast());
                        let s = _mm256_loadu_ps(scales.as_ptr().add(8 * c));
                        let wu = if SIGNED { _mm256_sign_epi8(w, w) } else { w };
                        for r in 0..R {
                            let xv = _mm256_loadu_si256(x[r].as_ptr().add(32 * c).cast());
                            let xs = if SIGNED { _mm256_sign_epi8(xv, w) } else { xv };
                            let p = _mm256_cvtepi32_ps($product(wu, xs));
                            let d = _mm256_mul_ps(s, _mm256_loadu_ps(xd[r].as_ptr().add(8 * c)));
                            acc[r] = _mm256_fmadd_ps(p, d, acc[r]);
                        }
                    }
                }
                acc.map(|a| hsum(a))
            }
        };
    }

    dot_kernel!(dot_avx2, "avx2,fma", product_avx2);
    dot_kernel!(dot_avxvnni, "avx2,fma,avxvnni", product_avxvnni);
    dot_kernel!(
        dot_avx512vnni,
        "avx2,fma,avx512vnni,avx512vl",
        product_avx512vnni
    );
}

#[cfg(target_arch = "aarch64")]
pub(crate) mod arm {
    use std::arch::aarch64::*;

    /// Four i32 lanes, lane i = Σ w[4i..4i+4] · x[4i..4i+4] over 16 signed bytes (unsigned
    /// codes are 0..=63, so they read the same as `i8`), with plain NEON: widening multiplies
    /// of the two halves, pairwise sums to 2 then 4 products.
    #[target_feature(enable = "neon")]
    #[inline]
    pub(crate) fn product_neon(w: int8x16_t, x: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
        let hi = vmull_high_s8(w, x);
        vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi))
    }

    /// `product_neon` in one `sdot` (the dot-product extension). Its intrinsic is not stable
    /// Rust yet, so the instruction is written out.
    #[target_feature(enable = "neon,dotprod")]
    #[inline]
    pub(crate) fn product_sdot(w: int8x16_t, x: int8x16_t) -> int32x4_t {
        let mut acc = vdupq_n_s32(0);
        // SAFETY: `sdot` only reads and writes the three vector registers; this function runs
        // only where the CPU has the dot-product extension (its target features).
        unsafe {
            std::arch::asm!(
                "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
                acc = inout(vreg) acc,
                w = in(vreg) w,
                x = in(vreg) x,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }

    macro_rules! dot_kernel {
        ($name:ident, $features:literal, $product:ident) => {
            /// The NEON form of `dot_scalar`: per 32 codes two 16-code products whose lanes line
            /// up with the eight per-lane scales (lanes 0..4: weights 0..16, 4..8: 16..32).
            ///
            /// # Safety
            /// The CPU must have the enabled features; `codes` holds whole 32-code chunks,
            /// `scales` 8 per chunk, every `x[r]` as many codes and `xd[r]` 8 per chunk.
            #[target_feature(enable = $features)]
            #[inline]
            pub(crate) unsafe fn $name<const SIGNED: bool, const R: usize>(
                codes: &[u8],
                scales: &[f32],
                x: &[&[i8]; R],
                xd: &[&[f32]; R],
            ) -> [f32; R] {
                let chunks = super::chunks_checked(codes, scales, x, xd);
                let mut acc = [(vdupq_n_f32(0.0), vdupq_n_f32(0.0)); R];
                for c in 0..chunks {
                    // SAFETY: every load is in bounds by the caller's contract (checked in
                    // debug builds by `chunks_checked`).
                    unsafe {
                        let w = codes.as_ptr().add(32 * c).cast::<i8>();
                        let (w0, w1) = (vld1q_s8(w), vld1q_s8(w.add(16)));
                        let s = scales.as_ptr().add(8 * c);
                        let (s0, s1) = (vld1q_f32(s), vld1q_f32(s.add(4)));
                        for r in 0..R {
                            let xp = x[r].as_ptr().add(32 * c);
                            let p0 = vcvtq_f32_s32($product(w0, vld1q_s8(xp)));
                            let p1 = vcvtq_f32_s32($product(w1, vld1q_s8(xp.add(16))));
                            let d = xd[r].as_ptr().add(8 * c);
                            let (d0, d1) = (vld1q_f32(d), vld1q_f32(d.add(4)));
                            acc[r].0 = vfmaq_f32(acc[r].0, p0, vmulq_f32(s0, d0));
                            acc[r].1 = vfmaq_f32(acc[r].1, p1, vmulq_f32(s1, d1));
                        }
                    }
                }
                acc.map(|(a, b)| vaddvq_f32(vaddq_f32(a, b)))
            }
        };
    }

    dot_kernel!(dot_neon, "neon", product_neon);
    dot_kernel!(dot_neon_sdot, "neon,dotprod", product_sdot);
}
