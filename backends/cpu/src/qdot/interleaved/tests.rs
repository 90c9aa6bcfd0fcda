//! The interleaved layout against the stored one: the repacking is undone exactly, and every
//! path on it (the vector and scalar group kernels, prefill's decoded tiles, embedding rows)
//! gives what the row-major kernels give on the stored rows.

use infer_core::gguf::GgmlType;
use proptest::prelude::*;

use super::super::tests::{random_packed, Rng};
use super::super::{planes_of, Activations, Isa, Layout, Prepared};
use super::*;

/// `x · wᵀ` on the integer path for a matrix in `layout`.
fn integer(
    activations: Activations,
    x: &[f32],
    w: &[u8],
    layout: Layout,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let planes = planes_of(activations, x, k, 256);
    match layout {
        Layout::Rows => {
            super::super::matmul_planes(Isa::Scalar, &planes, w, GgmlType::Q4K, m, k, n)
        }
        Layout::Interleaved => matmul(&planes, w, m, k, n),
    }
}

fn close(got: &[f32], want: &[f32], what: &str) {
    let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 2e-5 * scale, "{what} #{j}: {g} vs {w}");
    }
}

fn check(m: usize, k: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let w = random_packed(GgmlType::Q4K, n, k, &mut rng);
    let packed = interleave(&w, n, k);
    assert_eq!(packed.len(), n / ROWS * (k / 256) * GROUP_BLOCK);
    let mut back = Vec::new();
    rows_of(&packed, k, 0, n, &mut back);
    assert_eq!(back, w, "the repacking is undone exactly");
    let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 3.0).collect();
    for activations in [Activations::Int8, Activations::Int16] {
        let want = integer(activations, &x, &w, Layout::Rows, m, k, n);
        let what = format!("{activations:?} m={m} k={k} n={n}");
        // The vector kernel where this CPU has it (`matmul` picks it), and the scalar one.
        if kernels_available() {
            let got = integer(activations, &x, &packed, Layout::Interleaved, m, k, n);
            close(&got, &want, &format!("vector {what}"));
        }
        let planes = planes_of(activations, &x, k, 256);
        for r in 0..m {
            let row = ActRow::new(&planes, r);
            for (g, group) in packed.chunks_exact(k / 256 * GROUP_BLOCK).enumerate() {
                let got = dot_group_scalar(group, &row);
                close(
                    &got,
                    &want[r * n + ROWS * g..r * n + ROWS * (g + 1)],
                    &format!("scalar {what}"),
                );
            }
        }
    }
}

#[test]
fn interleaved_kernels_match_the_row_major_ones() {
    for (m, k, n) in [(1, 256, 8), (1, 512, 40), (2, 768, 16), (3, 256, 24)] {
        check(m, k, n, 7 + m as u64 + k as u64 + n as u64);
    }
}

/// Every weight 15 with scale and min 63, activation codes of ±127 in the value plane (all one
/// sign or mixed) or in the residual plane (a group's largest value 127, the rest 0.496 of its
/// step): the i16 sums and the i32 block sums at their largest stay exact.
#[test]
fn the_largest_sums_stay_exact() {
    let (k, n) = (512, 8);
    let mut w = random_packed(GgmlType::Q4K, n, k, &mut Rng(1));
    for block in w.chunks_exact_mut(144) {
        block[4..16].fill(0xff);
        block[16..].fill(0xff);
    }
    let packed = interleave(&w, n, k);
    let patterns = [1.0f32, -1.0].into_iter().flat_map(|sign| {
        [0, 3]
            .map(|every| {
                (0..k)
                    .map(|i| {
                        sign * if every > 0 && i % every == 0 {
                            -1.0
                        } else {
                            1.0
                        }
                    })
                    .collect::<Vec<f32>>()
            })
            .into_iter()
            .chain([(0..k)
                .map(|i| sign * if i % 256 == 0 { 127.0 } else { 0.496 })
                .collect()])
    });
    for x in patterns {
        {
            for activations in [Activations::Int8, Activations::Int16] {
                let want = integer(activations, &x, &w, Layout::Rows, 1, k, n);
                let planes = planes_of(activations, &x, k, 256);
                let row = ActRow::new(&planes, 0);
                close(
                    &dot_group_scalar(&packed, &row),
                    &want,
                    "scalar at the bounds",
                );
                if kernels_available() {
                    let got = integer(activations, &x, &packed, Layout::Interleaved, 1, k, n);
                    close(&got, &want, "vector at the bounds");
                }
            }
        }
    }
}

/// Prefill's decoded tiles and embedding rows decode the interleaved rows to ggml's values.
#[test]
fn other_paths_read_the_stored_rows() {
    let (m, k, n) = (70, 512, 24);
    let mut rng = Rng(9);
    let w = random_packed(GgmlType::Q4K, n, k, &mut rng);
    let packed = interleave(&w, n, k);
    let x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
    let prepared = Prepared::new(Activations::Int16, &x, m, k, &[GgmlType::Q4K]);
    let want = super::super::matmul_prepared(&prepared, &w, Layout::Rows, GgmlType::Q4K, n);
    let got =
        super::super::matmul_prepared(&prepared, &packed, Layout::Interleaved, GgmlType::Q4K, n);
    close(&got, &want, "prefill");
    let rows = [0, 7, 8, 23, 3];
    let got = super::super::gather_rows_in(&packed, Layout::Interleaved, GgmlType::Q4K, k, &rows);
    let mut ggml = vec![0f32; n * k];
    GgmlType::Q4K.dequantize(&w, &mut ggml);
    for (row, r) in got.chunks_exact(k).zip(rows.map(|r| r as usize)) {
        for (g, want) in row.iter().zip(&ggml[r * k..(r + 1) * k]) {
            assert!(
                (g - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "row {r}: {g} vs {want}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn random_shapes_match(m in 1usize..=3, kb in 1usize..4, groups in 1usize..6, seed in 0u64..1000) {
        check(m, 256 * kb, ROWS * groups, seed);
    }
}
