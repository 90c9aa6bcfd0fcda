//! Row kernels the sampler runs over 49k-wide logits rows: written as plain loops over `f32`
//! that the compiler vectorizes (libm's `expf` per element would cost ~0.25 ms a row).

use crate::narrow::{f32_of, u32_index};

/// `e^x` to about 2 ulp for x in [-87, 88]; 0 below (so masked `-inf` logits get exactly 0).
/// Cephes-style: 2^n by exponent bits, a degree-6 polynomial on the remainder.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so `x - n ln 2` stays exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_66;
    let p = p * r + 0.5;
    let p = p * r * r + r + 1.0;
    let bits = (t.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127)) << 23;
    let y = p * f32::from_bits(bits);
    if x < -87.0 {
        0.0
    } else {
        y
    }
}

/// Runs `$body` compiled for AVX2 + FMA when the CPU has them (the loops below are plain `f32`
/// loops the compiler widens to the vector width it may use), else for the baseline.
macro_rules! with_avx2 {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn inner($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) -> $ret {
                    inner($($arg),*)
                }
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU was just checked to support AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            inner($($arg),*)
        }
    };
}
pub(crate) use with_avx2;

with_avx2! {
/// Largest element (−∞ for an empty row; NaN ignored).
fn max(row: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    tail.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}
}

/// Index of the largest logit; ties go to the lowest index (as torch.argmax and numpy do).
/// NaN logits are never picked unless all are NaN.
pub fn argmax(row: &[f32]) -> u32 {
    let m = max(row);
    u32_index(row.iter().position(|&x| x == m).unwrap_or(0))
}

with_avx2! {
/// `sum(exp((x - shift) * scale))`, accumulated in 16 f32 lanes then f64.
fn sum_exp(row: &[f32], shift: f32, scale: f32) -> f64 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            lanes[l] += fast_exp((c[l] - shift) * scale);
        }
    }
    let tail: f64 = tail
        .iter()
        .map(|&x| fast_exp((x - shift) * scale) as f64)
        .sum();
    lanes.iter().map(|&x| x as f64).sum::<f64>() + tail
}
}

/// `log(sum(exp(row)))`, so `row[i] - log_sum_exp(row)` is token i's log-probability.
pub fn log_sum_exp(row: &[f32]) -> f32 {
    let m = max(row);
    if !m.is_finite() {
        return m;
    }
    m + f32_of(sum_exp(row, m, 1.0).ln())
}

/// The `n` largest `(index, value)` pairs, largest first, ties to the lower index.
pub fn top_n(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    const CHUNK: usize = 16;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    let mut floor = f32::NEG_INFINITY;
    let consider = |top: &mut Vec<(u32, f32)>, floor: &mut f32, i: usize, x: f32| {
        if top.len() == n && x <= *floor || x.is_nan() {
            return;
        }
        let at = top.partition_point(|&(_, v)| v >= x);
        top.insert(at, (u32_index(i), x));
        top.truncate(n);
        if top.len() == n {
            *floor = top[n - 1].1;
        }
    };
    let chunks = row.chunks_exact(CHUNK);
    let tail_start = row.len() - chunks.remainder().len();
    for (c, chunk) in chunks.enumerate() {
        // Once the buffer is full almost every chunk is skipped on its (vectorized) maximum.
        let chunk_max = chunk
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        if top.len() == n && chunk_max <= floor {
            continue;
        }
        for (j, &x) in chunk.iter().enumerate() {
            consider(&mut top, &mut floor, c * CHUNK + j, x);
        }
    }
    for (j, &x) in row[tail_start..].iter().enumerate() {
        consider(&mut top, &mut floor, tail_start + j, x);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let rel = ((fast_exp(x) - x.exp()) / x.exp()).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 5e-7, "relative error {worst}");
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
    }

    #[test]
    fn argmax_ties_nan_and_log_sum_exp() {
        assert_eq!(argmax(&[0.0, 3.0, 3.0, -1.0]), 1);
        let mut row: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        row[5] = f32::NAN;
        assert_eq!(
            argmax(&row),
            (0..1000).find(|i| (i * 37) % 101 == 100).unwrap() as u32
        );
        row[999] = 500.0;
        assert_eq!(argmax(&row), 999);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);

        let row: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        let exact = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        assert!((log_sum_exp(&row) as f64 - exact).abs() < 1e-5);
    }

    #[test]
    fn top_n_is_sorted_with_low_index_ties() {
        let row = [1.0, 5.0, 3.0, 5.0, f32::NAN, 4.0, 0.0];
        assert_eq!(top_n(&row, 3), [(1, 5.0), (3, 5.0), (5, 4.0)]);
        assert_eq!(top_n(&row, 0), []);
        assert_eq!(top_n(&[2.0], 4), [(0, 2.0)]);
    }
}
