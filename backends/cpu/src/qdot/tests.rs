//! The integer path against its references, for every quant type and every kernel this CPU
//! runs: the scalar kernel (same integer sums), the exact dot of the dequantized weights with
//! the dequantized 8-bit activations (only f32 rounding apart), and the f32 activations (within
//! the 8-bit quantization bound).

use infer_core::gguf::GgmlType;
use proptest::prelude::*;

use super::*;

pub(super) use crate::random::{random_packed, Rng};

fn dequantized(dtype: GgmlType, w: &[u8], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * k];
    dtype.dequantize(w, &mut out);
    out
}

fn check_type(dtype: GgmlType, m: usize, k: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let w = random_packed(dtype, n, k, &mut rng);
    let w_f32 = dequantized(dtype, &w, n, k);
    let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 3.0).collect();
    let xq = quantize_rows(&x, k, group_of(dtype));
    let scalar = matmul_integer(Isa::Scalar, Activations::Int8, &x, &w, dtype, m, k, n);
    for isa in Isa::available() {
        let got = matmul_integer(isa, Activations::Int8, &x, &w, dtype, m, k, n);
        let precise = matmul_integer(isa, Activations::Int16, &x, &w, dtype, m, k, n);
        for i in 0..m {
            let XRow { codes, scales, .. } = xq.row(i);
            let x_row = &x[i * k..(i + 1) * k];
            for j in 0..n {
                let w_row = &w_f32[j * k..(j + 1) * k];
                // The 8-bit activations as the kernel sees them, and their exact dot.
                let mut exact_q = 0f64;
                let mut magnitude = 0f64;
                let mut bound = 0f64;
                let mut exact_f = 0f64;
                for p in 0..k {
                    let step = Q8Rows::scale_of(scales, p) as f64;
                    let xd = codes[p] as f64 * step;
                    exact_q += xd * w_row[p] as f64;
                    magnitude += (xd * w_row[p] as f64).abs();
                    exact_f += x_row[p] as f64 * w_row[p] as f64;
                    // Round to nearest: each value is off by at most half a step.
                    bound += 0.5 * step * (w_row[p] as f64).abs();
                }
                let g = got[i * n + j] as f64;
                let s = scalar[i * n + j] as f64;
                let tol = 1e-5 * magnitude + 1e-6;
                let at = format!("{} {isa:?} m={m} k={k} n={n} ({i},{j})", dtype.name());
                assert!((g - exact_q).abs() <= tol, "{at}: {g} vs exact {exact_q}");
                assert!((g - s).abs() <= tol, "{at}: {g} vs scalar {s}");
                assert!(
                    (g - exact_f).abs() <= bound * 1.0001 + tol,
                    "{at}: {g} vs f32 activations {exact_f} beyond the rounding bound {bound}"
                );
                // The residual plane's step is at most 1/254 of the first plane's.
                let p = precise[i * n + j] as f64;
                assert!(
                    (p - exact_f).abs() <= bound / 254.0 + 2.0 * tol,
                    "{at}: 16-bit {p} vs f32 activations {exact_f} (8-bit bound {bound})"
                );
            }
        }
    }
}

#[test]
fn every_type_every_kernel_matches_the_references() {
    for (t, dtype) in GgmlType::QUANTIZED.into_iter().enumerate() {
        let per_block = dtype.block().0;
        let k = per_block.max(64) * 2;
        for m in [1, 3, 4, 6, 9] {
            check_type(dtype, m, k, 37, 17 + t as u64 * 100 + m as u64);
        }
    }
}

#[test]
fn decoded_rows_equal_ggml_dequantization() {
    for dtype in GgmlType::QUANTIZED {
        let (n, k) = (5, 512);
        let w = random_packed(dtype, n, k, &mut Rng(3));
        let want = dequantized(dtype, &w, n, k);
        let got = gather_rows_in(&w, Layout::Rows, dtype, k, &[0, 1, 2, 3, 4]);
        for (g, r) in got.iter().zip(&want) {
            assert!(
                (g - r).abs() <= 1e-6 * (1.0 + r.abs()),
                "{}: {g} vs {r}",
                dtype.name()
            );
        }
    }
}

/// The GEMM path's one-pass round trip gives exactly the values of the planes the integer
/// kernels read, so the two paths differ only in how they sum.
#[test]
fn round_trip_equals_the_planes_added_up() {
    let mut rng = Rng(11);
    let k = 512;
    // Mixed magnitudes, exact zeros, an all-zero group of 16 and one of 256.
    let mut x: Vec<f32> = (0..5 * k)
        .map(|i| rng.uniform() * if i % 37 == 0 { 40.0 } else { 1.0 })
        .collect();
    x[16..32].fill(0.0);
    x[50] = 0.0;
    x[3 * k + 256..4 * k].fill(0.0);
    for group in [16, 256] {
        for activations in [Activations::Int8, Activations::Int16] {
            let mut want = vec![0f32; x.len()];
            for plane in planes_of(activations, &x, k, group) {
                plane.add_to(&mut want);
            }
            let mut got = x.clone();
            round_trip(&mut got, activations.residual(), group);
            assert_eq!(got, want, "{activations:?} group {group}");
            assert_ne!(got, x, "{activations:?}: quantization changes values");
        }
    }
}

/// The residual plane's step is exactly its group's value step / 256 (what lets the paired
/// kernels add the planes' integer sums before converting), its codes stay within ±127, and
/// the two planes together are closer to `x` than the value plane alone by about that factor.
#[test]
fn the_residual_step_is_the_value_step_over_256() {
    let mut rng = Rng(13);
    let k = 512;
    let mut x: Vec<f32> = (0..3 * k)
        .map(|i| rng.uniform() * if i % 29 == 0 { 30.0 } else { 1.0 })
        .collect();
    x[32..48].fill(0.0);
    for group in [16, 256] {
        let planes = planes_of(Activations::Int16, &x, k, group);
        let (value, residual) = (&planes[0], &planes[1]);
        for (&v, &r) in value.group_scales.iter().zip(&residual.group_scales) {
            assert_eq!(r, v / 256.0, "group {group}");
        }
        assert!(residual.codes.iter().all(|&c| (-127..=127).contains(&c)));
        let err = |planes: &[Q8Rows]| {
            let mut sum = vec![0f32; x.len()];
            planes.iter().for_each(|p| p.add_to(&mut sum));
            sum.iter()
                .zip(&x)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        };
        let (one, two) = (err(&planes[..1]), err(&planes));
        assert!(
            two * 100.0 < one,
            "group {group}: one plane {one}, two {two}"
        );
    }
}

/// The per-16 integer code sums are the codes summed, and the float sums their scaled values.
#[test]
fn code_sums_add_up_the_codes() {
    let mut rng = Rng(12);
    let k = 512;
    let x: Vec<f32> = (0..2 * k).map(|_| rng.uniform() * 5.0).collect();
    for group in [16, 256] {
        let q = quantize_rows(&x, k, group);
        for (g, c16) in q.codes.chunks_exact(16).enumerate() {
            let want: i32 = c16.iter().map(|&c| c as i32).sum();
            assert_eq!(q.code_sums[g] as i32, want, "group {group}, 16 #{g}");
            assert_eq!(q.sums[g], q.scales[4 * g] * want as f32);
        }
        // One scale per group, also packed.
        for (scales, &packed) in q.scales.chunks_exact(group / 4).zip(&q.group_scales) {
            assert!(scales.iter().all(|&s| s == packed));
        }
        assert_eq!(q.group_scales.len(), x.len() / group);
    }
}

/// Both planes' codes and steps are a plain per-group rounding of the values, also where the
/// input spans several bands coded in parallel (the last one partial).
#[test]
fn planes_are_the_plain_rounding_across_bands() {
    let mut rng = Rng(31);
    let k = 4096;
    // 5 rows: 20,480 values, two and a half bands.
    let mut x: Vec<f32> = (0..5 * k).map(|_| rng.uniform() * 4.0).collect();
    // A group of zeros, a NaN and an exact tie (a value on a half step of its group).
    x[256..512].fill(0.0);
    x[600] = f32::NAN;
    x[1024] = 127.0;
    x[1025] = 2.5;
    for group in [16, 32, 256] {
        let value = quantize_rows(&x, k, group);
        let residual = quantize_residual(&x, &value);
        for (g, xs) in x.chunks_exact(group).enumerate() {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let step = scale / 256.0;
            let inv_step = if step > 0.0 { 1.0 / step } else { 0.0 };
            assert_eq!(value.group_scales[g], scale, "group {group} #{g}");
            assert_eq!(residual.group_scales[g], step, "group {group} #{g}");
            for (i, v) in xs.iter().enumerate() {
                let c = (v * inv).round_ties_even() as i8;
                let r = ((v - c as f32 * scale) * inv_step)
                    .round_ties_even()
                    .clamp(-127.0, 127.0) as i8;
                let p = g * group + i;
                assert_eq!(
                    (value.codes[p], residual.codes[p]),
                    (c, r),
                    "group {group}, value {p}"
                );
            }
        }
        assert_eq!(value.codes[1025], 2, "2.5 steps round to even");
    }
}

/// One row takes the integer kernels, batched decode the blocked f32 kernels (with AVX-512),
/// prefill-sized batches GEMM on decoded tiles; all
/// see the same 8-bit (or 16-bit) activations, so a row's result does not depend on the batch it
/// came in beyond f32 rounding, far below the activation quantization error. (With f32
/// activations on the GEMM side, batched and single requests of K-quant models gave different
/// greedy tokens.)
#[test]
fn a_row_gets_the_same_result_alone_as_in_a_batch() {
    for dtype in [
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::IQ4XS,
    ] {
        for (activations, m) in [
            (Activations::Int8, 3),
            (Activations::Int8, INT_MAX_M + 3),
            (Activations::Int16, 3),
            (Activations::Int16, crate::blocked::BLOCKED_MAX_M + 5),
        ] {
            let (k, n) = (512, 70);
            let mut rng = Rng(5);
            let w = random_packed(dtype, n, k, &mut rng);
            let w_f32 = dequantized(dtype, &w, n, k);
            let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 3.0).collect();
            let batch = matmul_quantized(activations, &x, &w, dtype, m, k, n);
            for (i, x_row) in x.chunks_exact(k).enumerate() {
                let alone = matmul_quantized(activations, x_row, &w, dtype, 1, k, n);
                for (j, w_row) in w_f32.chunks_exact(k).enumerate() {
                    let magnitude: f64 = x_row
                        .iter()
                        .zip(w_row)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    let (b, a) = (batch[i * n + j], alone[j]);
                    assert!(
                        ((b - a) as f64).abs() <= 1e-5 * magnitude + 1e-6,
                        "{} {activations:?} ({i},{j}): {b} in the batch, {a} alone",
                        dtype.name()
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_shapes_match_the_references(m in 1usize..=INT_MAX_M, kb in 1usize..4, n in 1usize..40, t in 0usize..12, seed in 0u64..1000) {
        let dtype = GgmlType::QUANTIZED[t];
        check_type(dtype, m, kb * dtype.block().0, n, seed);
    }
}
