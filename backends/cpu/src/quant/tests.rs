//! `matmul_packed` and its row kernels against dequantized f32 and float64 references.

use half::f16;

use super::*;
use crate::matmul::matmul;
use proptest::prelude::*;

/// Random bytes make valid blocks once the f16 scales are set to sane values.
fn random_packed(dtype: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    crate::random::random_packed(dtype, n, k, &mut crate::random::Rng(seed))
}

#[test]
fn other_block_types_take_the_dequantize_tile_path() {
    // Q4_K: 256-weight blocks; random bytes with small f16 scales are valid blocks.
    let (k, n) = (512, 70);
    let mut w = random_packed(GgmlType::Q4K, n, k, 3);
    for b in w.chunks_exact_mut(144) {
        b[..2].copy_from_slice(&f16::from_f32(0.002).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.001).to_le_bytes());
    }
    assert_eq!(w.len(), n * k / 256 * 144);
    let mut w_f32 = vec![0f32; n * k];
    GgmlType::Q4K.dequantize(&w, &mut w_f32);
    for m in [1, 3, 12] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let want = matmul(&x, &w_f32, m, k, n);
        let got = matmul_packed(&x, &w, GgmlType::Q4K, m, k, n);
        for (g, r) in got.iter().zip(&want) {
            assert!((g - r).abs() <= 1e-4 * (1.0 + r.abs()), "m={m}: {g} vs {r}");
        }
    }
}

/// The streaming row kernels of every level, for every row count they take, against the
/// float64 dot of the dequantized weights (the matmul above reaches them only for the rows
/// that the blocked kernels leave).
#[test]
fn row_kernels_of_every_level_match_float64() {
    for (t, dtype) in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
    ]
    .into_iter()
    .enumerate()
    {
        let (k, n) = (7 * QK, 5);
        let w = random_packed(dtype, n, k, 40 + t as u64);
        let mut w_f32 = vec![0f32; n * k];
        dtype.dequantize(&w, &mut w_f32);
        let x: Vec<f32> = (0..SMALL_M * k)
            .map(|i| ((i * 53 + t) % 97) as f32 / 40.0 - 1.2)
            .collect();
        let x_sums: Vec<f32> = x.chunks_exact(QK).map(|c| c.iter().sum()).collect();
        let row_bytes = dtype.row_bytes(k);
        for isa in Isa::available() {
            for m in 1..=SMALL_M {
                for (j, w_row) in w.chunks_exact(row_bytes).enumerate() {
                    let mut out = vec![0f32; m];
                    let x = &x[..m * k];
                    match dtype {
                        GgmlType::Q4_0 => {
                            dot_rows_dispatch::<Q4_0>(isa, w_row, x, &x_sums, k, &mut out)
                        }
                        GgmlType::Q4_1 => {
                            dot_rows_dispatch::<Q4_1>(isa, w_row, x, &x_sums, k, &mut out)
                        }
                        GgmlType::Q8_0 => {
                            dot_rows_dispatch::<Q8_0>(isa, w_row, x, &x_sums, k, &mut out)
                        }
                        _ => dot_rows_dispatch::<Mxfp4>(isa, w_row, x, &x_sums, k, &mut out),
                    }
                    for (i, got) in out.iter().enumerate() {
                        let (xr, wr) = (&x[i * k..(i + 1) * k], &w_f32[j * k..(j + 1) * k]);
                        let exact: f64 =
                            xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let scale: f64 = xr
                            .iter()
                            .zip(wr)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum();
                        assert!(
                            (*got as f64 - exact).abs() <= 1e-5 * scale + 1e-6,
                            "{} {isa:?} m={m} ({i},{j}): {got} vs {exact}",
                            dtype.name()
                        );
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn packed_matmul_equals_dequantized_matmul(m in 1usize..20, kb in 1usize..6, n in 1usize..90, t in 0usize..4, seed in 0u64..1000) {
        let dtype = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::MXFP4][t];
        let k = kb * QK;
        let w = random_packed(dtype, n, k, seed);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 + seed as usize) % 101) as f32 / 50.0 - 1.0).collect();
        let mut w_f32 = vec![0f32; n * k];
        dtype.dequantize(&w, &mut w_f32);
        let want = matmul(&x, &w_f32, m, k, n);
        for isa in Isa::available() {
        let got = matmul_packed_on(isa, &x, &w, dtype, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let (xr, wr) = (&x[i * k..(i + 1) * k], &w_f32[j * k..(j + 1) * k]);
                let exact: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                // f32 rounding bound for a length-k dot product, with margin.
                let scale: f64 = xr.iter().zip(wr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                let tol = 1e-6 * (k as f64) * scale + 1e-6;
                let (g, r) = (got[i * n + j] as f64, want[i * n + j] as f64);
                prop_assert!((g - exact).abs() <= tol, "{:?}: packed {} vs exact {} (tol {})", isa, g, exact, tol);
                prop_assert!((r - exact).abs() <= tol, "f32 {} vs exact {} (tol {})", r, exact, tol);
            }
        }
        }
        let rows = [0u32, (n - 1) as u32];
        let gathered = gather_rows_packed(&w, dtype, k, &rows);
        prop_assert_eq!(&gathered[..k], &w_f32[..k]);
        prop_assert_eq!(&gathered[k..], &w_f32[(n - 1) * k..]);
    }
}
