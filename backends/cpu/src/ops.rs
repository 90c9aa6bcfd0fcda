//! Element-wise and row-wise ops of the CPU backend, parallel over rows.

use infer_core::narrow::f32_of;
use infer_core::RopeStyle;
use rayon::prelude::*;

/// Rows per rayon task: small rows are grouped so each task has real work.
fn rows_per_task(row_len: usize) -> usize {
    (16384 / row_len.max(1)).max(1)
}

pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let d = weight.len();
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(d * rows_per_task(d))
        .zip(x.par_chunks(d * rows_per_task(d)))
        .for_each(|(o, xi)| {
            for (orow, xrow) in o.chunks_exact_mut(d).zip(xi.chunks_exact(d)) {
                // Sum of squares in f64: cheap at these sizes and closer to the reference.
                let ms = xrow.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
                let inv = f32_of(1.0 / (ms + eps as f64).sqrt());
                for ((o, &v), &w) in orow.iter_mut().zip(xrow).zip(weight) {
                    *o = v * inv * w;
                }
            }
        });
    out
}

/// `gate · sigmoid(gate) · up`, on the library's `exp`. The vectorized `exp` below (a few
/// ulps from it) was 2-3 % faster on a prefill but moved SmolLM2's logprobs at `-tp 3` from
/// those at `-tp 1` past the tensor-parallel test's bound (2.4e-3 against 2e-3), which the
/// library's `exp` keeps within; not used here until that is understood.
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.par_iter()
        .zip(up.par_iter())
        .with_min_len(4096)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

/// `e^x` in f32 arithmetic the compiler vectorizes (the library's `exp` is a call per value,
/// which made softmax a large part of long-context attention): `x = n ln 2 + r` with `n` an
/// integer and `|r| ≤ ln 2 / 2`, `e^r` by its Taylor series to `r^7` (truncation below 1e-8),
/// and `2^n` built in the exponent bits. Relative error within a few ulps for `x` in
/// [-87.3, 88]; below, the smallest normal float's neighbourhood (where softmax weights vanish
/// beside the largest, which is 1); above, `e^88`.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "n is a whole number in -126..=127"
)]
pub(crate) fn exp(x: f32) -> f32 {
    // ln 2 split so that `n · LN2_HI` is exact for |n| < 2^9 (Cody and Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding and subtracting it rounds a float below 2^22 to an integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_55, 88.0);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // n is in -126..=127: a normal float's biased exponent.
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// GELU, tanh approximation, times `up` (as PyTorch's `gelu(approximate="tanh")`).
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    gate.par_iter()
        .zip(up.par_iter())
        .with_min_len(4096)
        .map(|(&g, &u)| 0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)).tanh()) * u)
        .collect()
}

/// gpt-oss's SwiGLU: `(clamp(up, ±limit) + 1) · g · σ(alpha · g)`, `g = min(gate, limit)`.
pub fn swiglu_clamped(gate: &[f32], up: &[f32], alpha: f32, limit: f32) -> Vec<f32> {
    gate.par_iter()
        .zip(up.par_iter())
        .with_min_len(4096)
        .map(|(&g, &u)| {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            (u + 1.0) * g / (1.0 + (-alpha * g).exp())
        })
        .collect()
}

pub fn scale(x: &mut [f32], s: f32) {
    x.par_iter_mut().with_min_len(4096).for_each(|a| *a *= s);
}

pub fn softcap(x: &mut [f32], cap: f32) {
    x.par_iter_mut()
        .with_min_len(4096)
        .for_each(|a| *a = cap * (*a / cap).tanh());
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.par_iter_mut()
        .zip(y.par_iter())
        .with_min_len(4096)
        .for_each(|(a, b)| *a += b);
}

pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    x.par_chunks_mut(bias.len()).for_each(|row| {
        for (a, b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    });
}

/// Rotates the first `rotary_dim` dimensions of every head of every token row in place.
/// `cos_sin` rows are `[cos.., sin..]`, `rotary_dim` wide.
pub fn rope(
    x: &mut [f32],
    positions: &[u32],
    cos_sin: &[f32],
    head_dim: usize,
    rotary_dim: usize,
    style: RopeStyle,
) {
    let row_len = x.len() / positions.len().max(1);
    let half = rotary_dim / 2;
    x.par_chunks_mut(row_len)
        .zip(positions.par_iter())
        .for_each(|(row, &pos)| {
            let table = &cos_sin[pos as usize * rotary_dim..(pos as usize + 1) * rotary_dim];
            let (cos, sin) = table.split_at(half);
            for head in row.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = match style {
                        RopeStyle::AdjacentPairs => (2 * i, 2 * i + 1),
                        RopeStyle::HalfSplit => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos[i] - x1 * sin[i];
                    head[b] = x0 * sin[i] + x1 * cos[i];
                }
            }
        });
}

pub fn gather_rows(x: &[f32], row_len: usize, rows: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * row_len);
    for &r in rows {
        out.extend_from_slice(&x[r as usize * row_len..(r as usize + 1) * row_len]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_clamped_matches_gpt_oss_formula() {
        let (alpha, limit) = (1.702f64, 7.0f64);
        let gate = [-9.0f32, -1.0, 0.0, 0.5, 6.9, 7.5, 30.0];
        let up = [9.0f32, -8.0, 1.0, -0.5, 2.0, -30.0, 0.25];
        let got = swiglu_clamped(&gate, &up, alpha as f32, limit as f32);
        for ((&g, &u), got) in gate.iter().zip(&up).zip(got) {
            let g = (g as f64).min(limit);
            let u = (u as f64).clamp(-limit, limit);
            let want = (u + 1.0) * g / (1.0 + (-alpha * g).exp());
            assert!(
                (got as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }

    #[test]
    fn rms_norm_unit_rows() {
        let out = rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 2.0], 1e-6);
        let r = (12.5f32 + 1e-6).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 8.0 / r).abs() < 1e-6);
        assert_eq!(&out[2..], &[0.0, 0.0]);
    }

    #[test]
    fn rope_styles_rotate_different_pairs() {
        // one head of dim 4, position 1, angle 90° for pair 0 and 0° for pair 1
        let cos_sin = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0];
        let mut adj = [1.0, 2.0, 3.0, 4.0];
        rope(&mut adj, &[1], &cos_sin, 4, 4, RopeStyle::AdjacentPairs);
        assert_eq!(adj, [-2.0, 1.0, 3.0, 4.0]);
        let mut half = [1.0, 2.0, 3.0, 4.0];
        rope(&mut half, &[1], &cos_sin, 4, 4, RopeStyle::HalfSplit);
        assert_eq!(half, [-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn partial_rope_leaves_the_tail_of_each_head() {
        // two heads of dim 4, rotary dim 2 (one pair, 90°)
        let cos_sin = [1.0, 0.0, 0.0, 1.0];
        let mut x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        rope(&mut x, &[1], &cos_sin, 4, 2, RopeStyle::HalfSplit);
        assert_eq!(x, [-2.0, 1.0, 3.0, 4.0, -6.0, 5.0, 7.0, 8.0]);
    }

    #[test]
    fn gelu_tanh_matches_known_values() {
        let out = gelu_tanh_mul(&[0.0, 1.0, -2.0], &[1.0, 1.0, 2.0]);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 0.841_192).abs() < 1e-5, "{}", out[1]);
        assert!((out[2] - 2.0 * -0.045_402_3).abs() < 1e-5, "{}", out[2]);
    }

    #[test]
    fn softcap_bounds_values() {
        let mut x = [100.0, -100.0, 0.5];
        softcap(&mut x, 30.0);
        assert!(x[0] < 30.0 && x[0] > 29.9 && x[1] > -30.0);
        assert!((x[2] - 30.0 * (0.5f32 / 30.0).tanh()).abs() < 1e-7);
    }

    /// Within 4e-7 of float64's `exp` over the range softmax uses (and past it), and the
    /// clamped ends stay finite.
    #[test]
    fn exp_matches_float64() {
        let mut worst = 0f64;
        let mut x = -87.3f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.000_37;
        }
        assert!(worst < 4e-7, "relative error {worst}");
        assert!(exp(-1000.0) < 1.2e-38 && exp(-1000.0) >= 0.0);
        assert!(exp(f32::NEG_INFINITY) < 1.2e-38);
        assert!(exp(1000.0).is_finite());
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// Over several chunks and the range where the sigmoid saturates, within a few ulps of
    /// float64.
    #[test]
    fn silu_mul_matches_formula() {
        let out = silu_mul(&[0.0, 2.0], &[5.0, 3.0]);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 / (1.0 + (-2.0f32).exp()) * 3.0).abs() < 1e-6);
        let n = 10_000;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.61).sin() * 120.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).cos() * 3.0).collect();
        for ((&got, &g), &u) in silu_mul(&gate, &up).iter().zip(&gate).zip(&up) {
            let (g, u) = (g as f64, u as f64);
            let want = g / (1.0 + (-g).exp()) * u;
            let err = (got as f64 - want).abs();
            assert!(
                err <= 1e-6 * want.abs() + 1e-30,
                "silu({g}) · {u}: {got}, want {want}"
            );
        }
    }
}
