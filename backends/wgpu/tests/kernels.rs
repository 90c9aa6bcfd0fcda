//! Every non-attention kernel through the `Backend` trait against the CPU backend (the
//! reference) on fresh random inputs, on a real wgpu adapter (Mesa lavapipe in CI), with every
//! output poisoned first. Shapes are drawn by proptest; weights also as packed f16 (compared
//! with the CPU on the same f16-rounded weights) and split across storage bindings.

mod common;

use common::*;
use half::f16;
use infer_core::{Backend, BackendError, HostTensor, InferError};
use infer_wgpu::WeightStorage;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// What the device holds for `storage`: f16 weights are rounded once, at upload.
fn stored(w: &[f32], storage: WeightStorage) -> Vec<f32> {
    match storage {
        WeightStorage::F32 => w.to_vec(),
        WeightStorage::F16 => w.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
    }
}

fn check_matmul(
    m: usize,
    n: usize,
    k: usize,
    storage: WeightStorage,
    split_rows: Option<usize>,
    seed: u64,
) {
    // The backend keeps rows with k % 4 != 0 in f32 (the vec4 kernels need k % 4 == 0).
    let storage = if k.is_multiple_of(4) {
        storage
    } else {
        WeightStorage::F32
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let x = random(&mut rng, m * k);
    let w = random(&mut rng, n * k);
    for ctx in kernel_set_contexts() {
        check_matmul_on(&ctx, m, n, k, storage, split_rows, &x, &w);
    }
}

#[allow(clippy::too_many_arguments)]
fn check_matmul_on(
    ctx: &std::sync::Arc<infer_wgpu::GpuContext>,
    m: usize,
    n: usize,
    k: usize,
    storage: WeightStorage,
    split_rows: Option<usize>,
    x: &[f32],
    w: &[f32],
) {
    let mut g = gpu_on(ctx, storage);
    if let Some(rows) = split_rows {
        g = g.with_max_binding((rows * k * storage.bytes_per_element()) as u64);
    }
    let gw = g
        .upload_matrix(&HostTensor::new(vec![n, k], w.to_vec()))
        .unwrap();
    if let Some(rows) = split_rows {
        assert_eq!(gw.num_parts(), n.div_ceil(rows), "parts of a split weight");
    }
    // Activations are not split: upload x through a backend with the adapter's limit.
    let gx = up(&gpu_on(ctx, WeightStorage::F32), &[m, k], x);
    let got = g.matmul(&gx, &gw).unwrap();
    let c = cpu();
    let want = c
        .matmul(
            &up(&c, &[m, k], x),
            &up(&c, &[n, k], &stored(w, gw.storage())),
        )
        .unwrap();
    let what = format!(
        "matmul {m}x{n}x{k} {:?} split {split_rows:?} barrier-free {}",
        gw.storage(),
        ctx.barrier_free_kernels()
    );
    assert_close(&what, &host(&g, &got), &host(&c, &want), 1e-5);
}

#[test]
fn matmul_paths_match_the_cpu() {
    // Decode (small-batch kernels, cooperative and barrier-free), its limit, prefill (tiled),
    // k not a multiple of 4 (scalar), f16 weights, weights split across bindings.
    for (i, &(m, n, k)) in [
        (1, 7, 8),
        (8, 33, 64),
        (9, 65, 96),
        (70, 130, 36),
        (3, 20, 13),
    ]
    .iter()
    .enumerate()
    {
        for storage in [WeightStorage::F32, WeightStorage::F16] {
            check_matmul(m, n, k, storage, None, i as u64);
            check_matmul(m, n, k, storage, Some(6), 100 + i as u64);
        }
    }
}

#[test]
fn rms_norm_and_elementwise_kernels_match_the_cpu() {
    let (g, c) = (gpu(WeightStorage::F32), cpu());
    let mut rng = StdRng::seed_from_u64(1);
    for &(rows, cols) in &[(1, 5), (3, 300), (17, 576), (2, 1030)] {
        let shape = [rows, cols];
        let (a, b) = (random(&mut rng, rows * cols), random(&mut rng, rows * cols));
        let weight = random(&mut rng, cols);
        let want = c
            .rms_norm(&up(&c, &shape, &a), &up(&c, &[cols], &weight), 1e-5)
            .unwrap();
        for ctx in kernel_set_contexts() {
            let g = gpu_on(&ctx, WeightStorage::F32);
            let got = g
                .rms_norm(&up(&g, &shape, &a), &up(&g, &[cols], &weight), 1e-5)
                .unwrap();
            let what = format!("rms_norm barrier-free {}", ctx.barrier_free_kernels());
            assert_close(&what, &host(&g, &got), &host(&c, &want), 1e-5);
        }

        let want = c
            .silu_mul(&up(&c, &shape, &a), &up(&c, &shape, &b))
            .unwrap();
        let got = g
            .silu_mul(&up(&g, &shape, &a), &up(&g, &shape, &b))
            .unwrap();
        assert_close("silu_mul", &host(&g, &got), &host(&c, &want), 1e-5);

        let mut want = up(&c, &shape, &a);
        c.add_assign(&mut want, &up(&c, &shape, &b)).unwrap();
        c.add_bias(&mut want, &up(&c, &[cols], &weight)).unwrap();
        let mut got = up(&g, &shape, &a);
        g.add_assign(&mut got, &up(&g, &shape, &b)).unwrap();
        g.add_bias(&mut got, &up(&g, &[cols], &weight)).unwrap();
        assert_close(
            "add_assign + add_bias",
            &host(&g, &got),
            &host(&c, &want),
            1e-6,
        );
    }
}

fn check_embedding_and_gather(
    vocab: usize,
    hidden: usize,
    seqs: &[(usize, usize)],
    storage: WeightStorage,
    split_rows: Option<usize>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, _) = batch(&mut rng, seqs, 4, u32::try_from(vocab).unwrap());
    let table = random(&mut rng, vocab * hidden);
    let mut g = gpu(storage);
    if let Some(rows) = split_rows {
        g = g.with_max_binding((rows * hidden * storage.bytes_per_element()) as u64);
    }
    let gt = g
        .upload_matrix(&HostTensor::new(vec![vocab, hidden], table.clone()))
        .unwrap();
    let c = cpu();
    let ct = up(&c, &[vocab, hidden], &stored(&table, gt.storage()));
    let (gb, cb) = (g.upload_batch(&b).unwrap(), c.upload_batch(&b).unwrap());
    let got = g.embedding(&gt, &gb).unwrap();
    let want = c.embedding(&ct, &cb).unwrap();
    let what = format!(
        "embedding {vocab}x{hidden} {:?} split {split_rows:?}",
        gt.storage()
    );
    assert_close(&what, &host(&g, &got), &host(&c, &want), 0.0);
    let got = g.gather_logit_rows(&got, &gb).unwrap();
    let want = c.gather_logit_rows(&want, &cb).unwrap();
    assert_close("gather_logit_rows", &host(&g, &got), &host(&c, &want), 0.0);
}

#[test]
fn embedding_and_gather_match_the_cpu() {
    let seqs = [(0, 5), (3, 1), (9, 4)];
    check_embedding_and_gather(50, 24, &seqs, WeightStorage::F32, None, 1);
    check_embedding_and_gather(50, 24, &seqs, WeightStorage::F16, Some(7), 2);
    check_embedding_and_gather(37, 10, &seqs, WeightStorage::F32, None, 3);
}

#[test]
fn argmax_reads_back_one_id_per_row_lowest_on_ties() {
    let g = gpu(WeightStorage::F32);
    let mut rng = StdRng::seed_from_u64(9);
    let (rows, cols) = (5, 49_152);
    let mut logits = random(&mut rng, rows * cols);
    logits[2 * cols + 17] = 5.0;
    logits[2 * cols + 40_000] = 5.0;
    let got = g
        .argmax_to_host(&up(&g, &[rows, cols], &logits))
        .unwrap()
        .unwrap();
    let want: Vec<u32> = logits
        .chunks(cols)
        .map(infer_core::sampling::argmax)
        .collect();
    assert_eq!(got, want);
    assert_eq!(got[2], 17);
}

#[test]
fn a_too_large_tensor_is_an_error_not_a_panic() {
    let g = gpu(WeightStorage::F32).with_max_binding(64);
    // Not a matrix, so it cannot be split.
    let err = g
        .upload(&HostTensor::new(vec![2, 2, 8], vec![0.5; 32]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            InferError::Backend {
                source: BackendError::TooLarge {
                    op: "upload",
                    value: 128,
                    limit: 64,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    let row = g
        .upload_matrix(&HostTensor::new(vec![1, 40], vec![0.5; 40]))
        .unwrap_err();
    assert!(row.to_string().contains("row"), "{row}");
    assert!(
        matches!(
            row,
            InferError::Backend {
                source: BackendError::TooLarge {
                    value: 160,
                    limit: 64,
                    ..
                },
                ..
            }
        ),
        "{row:?}"
    );
}

#[test]
fn bad_operands_are_refused_as_on_the_cpu() {
    infer_tests::conformance::check_refusals(&gpu(WeightStorage::F32));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn matmul_on_random_shapes(
        m in 1usize..80,
        n in 1usize..140,
        k in 1usize..100,
        f16 in any::<bool>(),
        split in prop::option::of(1usize..40),
        seed in any::<u64>(),
    ) {
        let storage = if f16 { WeightStorage::F16 } else { WeightStorage::F32 };
        check_matmul(m, n, k, storage, split, seed);
    }

    #[test]
    fn embedding_on_random_ragged_batches(
        seqs in prop::collection::vec((0usize..20, 1usize..6), 1..5),
        vocab in 1usize..90,
        hidden4 in 1usize..20,
        f16 in any::<bool>(),
        split in prop::option::of(1usize..30),
        seed in any::<u64>(),
    ) {
        let storage = if f16 { WeightStorage::F16 } else { WeightStorage::F32 };
        check_embedding_and_gather(vocab, hidden4 * 4, &seqs, storage, split, seed);
    }
}

/// The shared conformance checks (which the CUDA tests use too) pass on wgpu.
#[test]
fn shared_conformance_checks_pass() {
    use infer_tests::conformance::{check_dense_ops, check_matmul};
    for weights in [WeightStorage::F32, WeightStorage::F16] {
        let g = gpu(weights);
        check_dense_ops(&g, 5, 40, 1, 2e-3);
        check_dense_ops(&g, 1, 577, 2, 2e-3);
        check_matmul(&g, 3, 20, 16, false, 3, 2e-3);
        check_matmul(&g, 9, 33, 70, false, 4, 2e-3);
    }
}

/// The routed-MLP ops against the float64 reference: f32 and f16 experts, whole and split
/// across bindings at rows that cut through experts.
#[test]
fn moe_ops_match_the_float64_reference() {
    use infer_tests::conformance::{check_moe_ops, moe_cases};
    for weights in [WeightStorage::F32, WeightStorage::F16] {
        for split in [None, Some(20_000)] {
            let g = match split {
                Some(bytes) => gpu(weights).with_max_binding(bytes),
                None => gpu(weights),
            };
            for (i, case) in moe_cases().iter().enumerate() {
                let half = weights == WeightStorage::F16;
                check_moe_ops(&g, case, half, 200 + i as u64, 2e-3);
            }
        }
    }
}
