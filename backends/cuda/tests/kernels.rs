//! Every CUDA op through the `Backend` trait against the CPU backend on fresh random inputs
//! (shared checks in `infer_tests::conformance`). f16 GEMM inputs and the f16 KV cache bound
//! the tolerances: 2e-3 relative to the largest output. Skipped (and saying so) without a GPU.

mod common;

use common::gpu;
use infer_cuda::CudaWeights;
use infer_tests::conformance::{
    check_attention, check_block_copies, check_decode_steps, check_dense_ops, check_matmul,
    check_packed_matmul, check_refusals, check_rope,
};

#[test]
fn bad_operands_are_refused_as_on_the_cpu() {
    if let Some(g) = gpu(CudaWeights::F32) {
        check_refusals(&g);
    }
}

#[test]
fn dense_ops_match_the_cpu() {
    for weights in [CudaWeights::F32, CudaWeights::F16] {
        let Some(g) = gpu(weights) else { return };
        check_dense_ops(&g, 5, 40, 1, 2e-3);
        check_dense_ops(&g, 1, 577, 2, 2e-3);
        check_dense_ops(&g, 130, 1536, 3, 2e-3);
    }
}

#[test]
fn matmul_matches_the_cpu() {
    let shapes = [
        (1, 576, 576),
        (8, 1536, 576),
        (128, 576, 1536),
        (3, 49152, 576),
        (77, 33, 70),
    ];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        if let Some(g) = gpu(CudaWeights::F32) {
            check_matmul(&g, m, n, k, false, i as u64, 1e-4);
        }
        if let Some(g) = gpu(CudaWeights::F16) {
            check_matmul(&g, m, n, k, true, i as u64, 1e-3);
        }
    }
}

/// Matrices kept in their GGUF blocks: the matvec (up to `MATVEC_MAX_ROWS` rows, exact f32
/// arithmetic on the dequantized weights) and, above it, dequantization to f16 for cuBLAS
/// (f16 rounding); 300 rows leave a partial block of warps.
#[test]
fn packed_matmul_matches_the_cpu() {
    use infer_core::dummy::RANDOM_BLOCK_TYPES;
    use infer_cuda::MATVEC_MAX_ROWS;
    let Some(g) = gpu(CudaWeights::Packed) else {
        return;
    };
    // Decode rows run on q8_1 activations (8-bit codes per 32, as llama.cpp's MMVQ).
    let tol = |m: usize| if m <= MATVEC_MAX_ROWS { 1e-2 } else { 3e-3 };
    for (i, dtype) in RANDOM_BLOCK_TYPES.into_iter().enumerate() {
        let seed = 40 + i as u64;
        check_packed_matmul(
            &g,
            dtype,
            &[1, 2, 5, MATVEC_MAX_ROWS, 9, 70],
            300,
            512,
            seed,
            tol,
        );
        check_packed_matmul(&g, dtype, &[1, 4], 64, 4096, seed, tol);
    }
}

#[test]
fn rope_matches_the_cpu() {
    let Some(g) = gpu(CudaWeights::F32) else {
        return;
    };
    check_rope(&g, &[(0, 5), (7, 1), (30, 3)], 3, 8, 2);
    check_rope(&g, &[(0, 1)], 1, 64, 3);
    check_rope(&g, &[(100, 17), (0, 64)], 9, 64, 4);
}

#[test]
fn paged_attention_matches_the_cpu_across_partitions() {
    let Some(g) = gpu(CudaWeights::F32) else {
        return;
    };
    check_attention(&g, &[(5, 1), (0, 7), (13, 4)], 4, 2, 16, 4, 4, 2e-3);
    check_attention(&g, &[(700, 1), (600, 3)], 2, 1, 32, 16, 5, 2e-3);
    check_attention(&g, &[(1500, 1), (0, 40), (31, 1)], 9, 3, 64, 16, 6, 2e-3);
    check_attention(&g, &[(2, 3)], 2, 2, 128, 1, 7, 2e-3);
    check_block_copies(&g, 6, 2e-3);
}

#[test]
fn moe_ops_match_the_float64_reference() {
    use infer_tests::conformance::{check_moe_ops, moe_cases};
    for weights in [CudaWeights::F32, CudaWeights::F16] {
        let Some(g) = gpu(weights) else { return };
        for (i, case) in moe_cases().iter().enumerate() {
            check_moe_ops(&g, case, weights == CudaWeights::F16, 300 + i as u64, 1e-4);
        }
    }
}

/// Decode steps replayed from CUDA graphs (padded to a recorded batch size, new metadata
/// copied in each step, contexts crossing a 512-key partition) against the same steps run op
/// by op, for each weight layout; and the graphs were used, not fallen back from.
#[test]
fn graph_replays_match_eager_steps() {
    for weights in [CudaWeights::Packed, CudaWeights::F16, CudaWeights::F32] {
        let Some(graphed) = gpu(weights) else { return };
        let eager = gpu(weights).unwrap().with_cuda_graphs(0);
        check_decode_steps(&graphed, &eager, None, &[1, 3, 9, 20], 14, 1e-3);
        let (recorded, replayed) = graphed.graph_stats();
        eprintln!("{weights:?}: {recorded} decode shapes recorded, {replayed} steps replayed");
        assert!(
            recorded >= 5 && replayed >= 40,
            "{weights:?}: {recorded} recorded, {replayed} replayed"
        );
        assert_eq!(eager.graph_stats(), (0, 0));
    }
}

/// Whole decode steps of tiny models whose layer matrices are Q4_0, Q4_1 and Q8_0 blocks: the
/// integer matvecs (QKV and gate/up quantizing their input once) against the CPU's f32
/// arithmetic, through CUDA graphs.
#[test]
fn packed_decode_steps_match_the_cpu() {
    use infer_core::gguf::GgmlType;
    for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let Some(g) = gpu(CudaWeights::Packed) else {
            return;
        };
        check_decode_steps(
            &g,
            &infer_tests::conformance::cpu(),
            Some(dtype),
            &[1, 5],
            8,
            3e-2,
        );
    }
}
