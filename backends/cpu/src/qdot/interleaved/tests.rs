//! The interleaved layouts against the stored one: the repacking is undone exactly, and every
//! path on them (the vector and scalar group kernels, prefill, embedding rows) gives what the
//! row-major kernels give on the stored rows.

use infer_core::gguf::GgmlType;
use proptest::prelude::*;

use super::super::tests::{random_packed, Rng};
use super::super::{dequantized_activations, matmul_dequantized};
use super::super::{gather_rows_in, matmul_planes, matmul_prepared, planes_of};
use super::super::{Activations, Isa, Layout, Prepared};
use super::*;

const TYPES: [GgmlType; 7] = [
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// Weights per block of `dtype`, and values per activation step.
fn block_weights(dtype: GgmlType) -> usize {
    activation_group(dtype)
}

/// `x · wᵀ` on the integer path for a matrix in `layout`.
fn integer(
    dtype: GgmlType,
    activations: Activations,
    x: &[f32],
    w: &[u8],
    layout: Layout,
    (m, k, n): (usize, usize, usize),
) -> Vec<f32> {
    let planes = planes_of(activations, x, k, block_weights(dtype));
    match layout {
        Layout::Rows => matmul_planes(Isa::Scalar, &planes, w, dtype, m, k, n),
        Layout::Interleaved => matmul(dtype, &planes, w, m, k, n),
    }
}

fn close(got: &[f32], want: &[f32], what: &str) {
    let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 2e-5 * scale, "{what} #{j}: {g} vs {w}");
    }
}

/// The group kernels of `dtype` at level `isa` (the scalar one for `Isa::Scalar`) on every
/// group of `packed`, one at a time and, where the level has them, two at a time (`None` where
/// this CPU has no such kernels): each form's outputs.
fn by_groups(
    dtype: GgmlType,
    isa: Isa,
    packed: &[u8],
    x: &ActRow,
    k: usize,
) -> Option<Vec<Vec<f32>>> {
    fn as_kind<K: Kind>(isa: Isa, packed: &[u8], x: &ActRow, k: usize) -> Option<Vec<Vec<f32>>> {
        let groups: Vec<&[u8]> = packed
            .chunks_exact(k / K::WEIGHTS * K::GROUP_BLOCK)
            .collect();
        let Some(kernels) = (match isa {
            Isa::Scalar => None,
            isa => Some(vector_kernels::<K, 1>(isa)?),
        }) else {
            return Some(vec![groups
                .iter()
                .flat_map(|g| K::dot_scalar(g, x))
                .collect()]);
        };
        let one = |g: &[u8]| (kernels.one)(&[g], &[x])[0][..ROWS].to_vec();
        let mut forms = vec![groups.iter().flat_map(|g| one(g)).collect()];
        if let Some(two) = kernels.two {
            forms.push(by_pairs(&groups, |pair| two(pair, &[x])[0], one));
        }
        Some(forms)
    }
    with_kind!(dtype, K => as_kind::<K>(isa, packed, x, k))
}

/// Every group's 8 outputs from `two` on consecutive pairs, and `one` on an odd last group.
fn by_pairs(
    groups: &[&[u8]],
    two: impl Fn(&[&[u8]]) -> [f32; 16],
    one: impl Fn(&[u8]) -> Vec<f32>,
) -> Vec<f32> {
    let mut out = Vec::new();
    for pair in groups.chunks(2) {
        match pair {
            [_, _] => out.extend_from_slice(&two(pair)),
            _ => out.extend(one(pair[0])),
        }
    }
    out
}

/// Four rows' outputs for one or two groups.
type Dots4<'a> = dyn Fn(&[&[u8]]) -> [[f32; 16]; 4] + 'a;

/// The 4-row kernels of `dtype` at level `isa` on every group, one and two at a time where
/// there are such kernels: each form's outputs for each row.
fn by_groups4(
    dtype: GgmlType,
    isa: Isa,
    packed: &[u8],
    xs: &[&ActRow; 4],
    k: usize,
) -> Option<Vec<[Vec<f32>; 4]>> {
    fn as_kind<K: Kind>(
        isa: Isa,
        packed: &[u8],
        xs: &[&ActRow; 4],
        k: usize,
    ) -> Option<Vec<[Vec<f32>; 4]>> {
        let kernels = vector_kernels::<K, 4>(isa)?;
        let groups: Vec<&[u8]> = packed
            .chunks_exact(k / K::WEIGHTS * K::GROUP_BLOCK)
            .collect();
        let row = |dots: &Dots4, r: usize| {
            by_pairs(
                &groups,
                |pair| dots(pair)[r],
                |g| (kernels.one)(&[g], xs)[r][..ROWS].to_vec(),
            )
        };
        let one = |pair: &[&[u8]]| {
            let mut out = [[0f32; 16]; 4];
            for (half, g) in pair.iter().enumerate() {
                for (o, dots) in out.iter_mut().zip((kernels.one)(&[*g], xs)) {
                    o[ROWS * half..ROWS * (half + 1)].copy_from_slice(&dots[..ROWS]);
                }
            }
            out
        };
        let mut forms = vec![std::array::from_fn(|r| row(&one, r))];
        if let Some(two) = kernels.two {
            let two = |pair: &[&[u8]]| two(pair, xs);
            forms.push(std::array::from_fn(|r| row(&two, r)));
        }
        Some(forms)
    }
    with_kind!(dtype, K => as_kind::<K>(isa, packed, xs, k))
}

fn check(dtype: GgmlType, x: &[f32], w: &[u8], (m, k, n): (usize, usize, usize)) {
    let packed = interleave(dtype, w, n, k);
    // The stored bytes exactly, but Q4_K's 6-bit scales and mins take a byte each (+2.8 %).
    let extra = if dtype == GgmlType::Q4K {
        32 * n / ROWS * k / 256
    } else {
        0
    };
    assert_eq!(packed.len(), w.len() + extra, "{}", dtype.name());
    assert_eq!(
        rows_of(dtype, &packed, k, 0, n),
        w,
        "the repacking is undone exactly"
    );
    for activations in [Activations::Int8, Activations::Int16] {
        let want = integer(dtype, activations, x, w, Layout::Rows, (m, k, n));
        let what = format!("{} {activations:?} m={m} k={k} n={n}", dtype.name());
        // The matmul (on the level in use), and every level's group kernel, scalar included.
        let got = integer(
            dtype,
            activations,
            x,
            &packed,
            Layout::Interleaved,
            (m, k, n),
        );
        close(&got, &want, &what);
        let planes = planes_of(activations, x, k, block_weights(dtype));
        let mut levels = 0;
        for isa in Isa::available() {
            for r in 0..m {
                let row = ActRow::new(&planes, r);
                let Some(forms) = by_groups(dtype, isa, &packed, &row, k) else {
                    continue;
                };
                for (f, got) in forms.iter().enumerate() {
                    let what = format!("{isa} {} at a time, {what}", f + 1);
                    close(got, &want[r * n..(r + 1) * n], &what);
                }
                levels += usize::from(r == 0);
            }
        }
        // Four rows at once (prefill), on every level with such a kernel.
        if m >= 4 {
            let rows: Vec<ActRow> = (0..4).map(|r| ActRow::new(&planes, r)).collect();
            let xs = [&rows[0], &rows[1], &rows[2], &rows[3]];
            for isa in Isa::available() {
                let Some(forms) = by_groups4(dtype, isa, &packed, &xs, k) else {
                    continue;
                };
                for (f, got) in forms.iter().enumerate() {
                    for (r, got) in got.iter().enumerate() {
                        let what = format!("{isa} four rows, {} at a time, {what}", f + 1);
                        close(got, &want[r * n..(r + 1) * n], &what);
                    }
                }
            }
        }
        // The scalar kernel, and the vector ones on x86 levels with them.
        assert!(
            levels > usize::from(kernels_available()),
            "{what}: {levels} levels"
        );
    }
}

fn check_random(dtype: GgmlType, (m, k, n): (usize, usize, usize), seed: u64) {
    let mut rng = Rng(seed);
    let w = random_packed(dtype, n, k, &mut rng);
    let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 3.0).collect();
    check(dtype, &x, &w, (m, k, n));
}

#[test]
fn interleaved_kernels_match_the_row_major_ones() {
    for dtype in TYPES {
        let kb = block_weights(dtype);
        for (m, blocks, n) in [
            (1, 1, 8),
            (1, 2, 40),
            (2, 3, 16),
            (3, 1, 24),
            (9, 2, 16),
            (5, 18, 8),
        ] {
            let k = kb * blocks;
            check_random(dtype, (m, k, n), 7 + m as u64 + k as u64 + n as u64);
        }
    }
}

/// The largest codes with the largest scales (every byte 0xff but the f16 scales: Q4_K codes
/// 15 with scales and mins 63, Q6_K codes 63 with scale -1, Q4 codes 15, Q5 codes 31; and Q6_K
/// scale -128, Q8_0 codes -128 and 127), activation codes of ±127 in the value plane (all one
/// sign or mixed) or in the residual plane (a group's largest value 127, the rest 0.496 of its
/// step): the i16 sums and the i32 block sums at their largest stay exact.
#[test]
fn the_largest_sums_stay_exact() {
    let (k, n) = (512, 16);
    for dtype in TYPES {
        let group = block_weights(dtype);
        let patterns: Vec<Vec<f32>> = [1.0f32, -1.0]
            .into_iter()
            .flat_map(|sign| {
                [
                    (0..k).map(|_| sign).collect(),
                    (0..k)
                        .map(|i| if i % 3 == 0 { -sign } else { sign })
                        .collect(),
                    (0..k)
                        .map(|i| sign * if i % group == 0 { 127.0 } else { 0.496 })
                        .collect(),
                ]
            })
            .collect();
        for extreme in [0xff, 0x80, 0x7f] {
            let mut w = random_packed(dtype, n, k, &mut Rng(1));
            let bytes = dtype.block().1;
            for block in w.chunks_exact_mut(bytes) {
                match dtype {
                    GgmlType::Q4K | GgmlType::Q4_1 | GgmlType::Q5_1 => block[4..].fill(0xff),
                    GgmlType::Q4_0 | GgmlType::Q5_0 => block[2..].fill(0xff),
                    GgmlType::Q8_0 => block[2..].fill(extreme),
                    _ => {
                        block[..192].fill(0xff);
                        block[192..208].fill(extreme);
                    }
                }
            }
            for x in &patterns {
                check(dtype, x, &w, (1, k, n));
            }
        }
    }
}

/// Prefill (integer kernels or GEMM) and embedding rows on the interleaved form give ggml's
/// numbers.
#[test]
fn other_paths_read_the_same_numbers() {
    let (m, k, n) = (70, 512, 24);
    for dtype in TYPES {
        let mut rng = Rng(9);
        let w = random_packed(dtype, n, k, &mut rng);
        let packed = interleave(dtype, &w, n, k);
        let x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
        let prepared = Prepared::new(Activations::Int16, &x, m, k, &[(dtype, Layout::Rows)]);
        let want = matmul_prepared(&prepared, &w, Layout::Rows, dtype, n);
        let got = matmul_prepared(&prepared, &packed, Layout::Interleaved, dtype, n);
        close(&got, &want, &format!("{} prefill", dtype.name()));
        // GEMM on f32 tiles decoded from the interleaved form (the backend keeps interleaved
        // matrices on the integer kernels at every batch size; the decoding still has to agree).
        let values = dequantized_activations(Activations::Int16, &x, k, block_weights(dtype));
        let want = matmul_dequantized(&values, &w, Layout::Rows, dtype, m, k, n);
        let got = matmul_dequantized(&values, &packed, Layout::Interleaved, dtype, m, k, n);
        close(&got, &want, &format!("{} GEMM on tiles", dtype.name()));
        let rows = [0, 7, 8, 23, 3];
        let got = gather_rows_in(&packed, Layout::Interleaved, dtype, k, &rows);
        let mut ggml = vec![0f32; n * k];
        dtype.dequantize(&w, &mut ggml);
        for (row, r) in got.chunks_exact(k).zip(rows.map(|r| r as usize)) {
            for (g, want) in row.iter().zip(&ggml[r * k..(r + 1) * k]) {
                let at = format!("{} row {r}", dtype.name());
                assert!(
                    (g - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{at}: {g} vs {want}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn random_shapes_match(
        t in 0usize..TYPES.len(),
        m in 1usize..=6,
        kb in 1usize..4,
        groups in 1usize..6,
        seed in 0u64..1000,
    ) {
        check_random(TYPES[t], (m, block_weights(TYPES[t]) * kb, ROWS * groups), seed);
    }
}

/// A row's result does not depend on its batch at all: alone, or anywhere in a batch (the
/// four-row kernels, then the one-row ones for the rest), on every level, bit for bit, through
/// the kernels and through the dispatch that picks them (up to `integer_max_m`). Q8_0 once took
/// GEMM on f32 tiles from 4 rows on CPUs without VNNI: SmolLM2's logprobs moved by 6-8e-4
/// between a request alone and in a batch of 16, and seeded sampling drew other tokens (the
/// Python suite's 16 streams, on AVX2).
#[test]
fn a_row_gets_the_same_bits_alone_as_in_any_batch() {
    // Five groups of 8 rows: pairs of groups and an odd last one.
    let n = 5 * ROWS;
    for dtype in TYPES {
        let group = block_weights(dtype);
        let k = 2 * group.max(128);
        let mut rng = Rng(11);
        let w = random_packed(dtype, n, k, &mut rng);
        let packed = interleave(dtype, &w, n, k);
        for m in [2, 7, 64, 70] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 3.0).collect();
            for activations in [Activations::Int8, Activations::Int16] {
                let what = format!("{} {activations:?} m={m}", dtype.name());
                let planes = planes_of(activations, &x, k, group);
                for isa in Isa::available() {
                    let batch = matmul_at(isa, dtype, &planes, &packed, m, k, n);
                    for (r, row) in x.chunks_exact(k).enumerate() {
                        let alone = planes_of(activations, row, k, group);
                        let alone = matmul_at(isa, dtype, &alone, &packed, 1, k, n);
                        let at = format!("{isa} {what} row {r}");
                        same_bits(&batch[r * n..(r + 1) * n], &alone, &at);
                    }
                }
                // The dispatch on the level in use, as the backend calls it, up to the rows it
                // keeps on the integer kernels.
                if m > integer_max_m(dtype, Isa::current()) {
                    continue;
                }
                let layouts = [(dtype, Layout::Interleaved)];
                let prepared = Prepared::new(activations, &x, m, k, &layouts);
                let batch = matmul_prepared(&prepared, &packed, Layout::Interleaved, dtype, n);
                for (r, row) in x.chunks_exact(k).enumerate() {
                    let one = Prepared::new(activations, row, 1, k, &layouts);
                    let alone = matmul_prepared(&one, &packed, Layout::Interleaved, dtype, n);
                    let at = format!("dispatch {what} row {r}");
                    same_bits(&batch[r * n..(r + 1) * n], &alone, &at);
                }
            }
        }
    }
}

fn same_bits(got: &[f32], want: &[f32], what: &str) {
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what} #{j}: {g} in the batch, {w} alone"
        );
    }
}
