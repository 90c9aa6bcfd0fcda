use proptest::prelude::*;

use super::*;

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Random blocks of `dtype` with sane f16 scales (and mins).
fn random_packed(dtype: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    crate::random::random_packed(dtype, n, k, &mut crate::random::Rng(seed))
}

fn random_f32(len: usize, seed: u64) -> Vec<f32> {
    let mut next = xorshift(seed);
    (0..len)
        .map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
        .collect()
}

/// Checks `got` against a float64 matmul of `x` and the f32 weights `w`, within f32 rounding
/// of a length-k dot product.
fn check(got: &[f32], x: &[f32], w: &[f32], m: usize, k: usize, n: usize) {
    assert_eq!(got.len(), m * n);
    for i in 0..m {
        for j in 0..n {
            let (xr, wr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
            let exact: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let size: f64 = xr
                .iter()
                .zip(wr)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let tol = 1e-6 * k as f64 * size + 1e-7;
            let g = got[i * n + j] as f64;
            assert!(
                (g - exact).abs() <= tol,
                "[{i}, {j}]: {g} vs {exact} (tol {tol})"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Every row-group and column-group remainder (m and n not multiples of 8, 4 and 3), every
    /// layout, every level, against float64 on the weights' dequantized values.
    #[test]
    fn matches_float64_on_the_dequantized_weights(
        m in 2usize..=BLOCKED_MAX_M, kb in 1usize..5, n in 1usize..40, t in 0usize..6, seed in 0u64..1000,
    ) {
        let k = kb * 32;
        let x = random_f32(m * k, seed);
        let (w_f32, packed) = if t == 5 {
            (random_f32(n * k, seed + 1), None)
        } else {
            let dtype = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0][t];
            let packed = random_packed(dtype, n, k, seed + 1);
            let mut w = vec![0f32; n * k];
            dtype.dequantize(&packed, &mut w);
            (w, Some((packed, dtype)))
        };
        let weights = match &packed {
            Some((p, dtype)) => Weights::Packed(p, *dtype),
            None => Weights::F32(&w_f32),
        };
        // Every level this CPU runs that has these kernels (none on some CPUs: nothing there
        // runs them either).
        for isa in Isa::available() {
            if supports_at(isa, weights, m, k) {
                check(&matmul_at(isa, &x, weights, m, k, n), &x, &w_f32, m, k, n);
            }
        }
    }
}

#[test]
fn supports_only_what_it_has_kernels_for() {
    let w = [0u8; 0];
    assert!(!supports(Weights::Packed(&w, GgmlType::Q4K), 16, 256));
    assert!(!supports(Weights::F32(&[]), BLOCKED_MAX_M + 1, 32));
    assert!(!supports(Weights::F32(&[]), 16, 48));
    assert!(!supports(Weights::F32(&[]), 1, 32), "one row streams");
}
