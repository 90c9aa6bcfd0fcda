//! RoPE, the KV-cache write, PagedAttention and the block moves (copy-on-write copies, swap
//! out and in) through the `Backend` trait against the CPU backend, on ragged batches of
//! prefill chunks and decode tokens over shuffled blocks, GQA ratios, block sizes that do not
//! divide the context, and contexts over several 512-key partitions.

mod common;

use common::gpu;
use infer_tests::conformance::{check_attention, check_block_copies, check_rope};
use infer_wgpu::WeightStorage;
use proptest::prelude::*;

#[test]
fn rope_both_layouts_match_the_cpu() {
    check_rope(
        &gpu(WeightStorage::F32),
        &[(0, 5), (7, 1), (30, 3)],
        3,
        8,
        2,
    );
    check_rope(&gpu(WeightStorage::F32), &[(0, 1)], 1, 64, 3);
}

#[test]
fn paged_attention_matches_the_cpu_across_partitions() {
    // Decode tokens, a prefill chunk after cached context, GQA, and a context longer than one
    // 512-key partition.
    check_attention(
        &gpu(WeightStorage::F32),
        &[(5, 1), (0, 7), (13, 4)],
        4,
        2,
        16,
        4,
        4,
        1e-4,
    );
    check_attention(
        &gpu(WeightStorage::F32),
        &[(700, 1), (600, 3)],
        2,
        1,
        32,
        16,
        5,
        1e-4,
    );
}

#[test]
fn copied_blocks_attend_like_the_originals() {
    check_block_copies(&gpu(WeightStorage::F32), 6, 1e-4);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn paged_attention_on_random_shapes(
        seqs in prop::collection::vec((0usize..40, 1usize..6), 1..4),
        kv_heads in 1usize..3,
        group in 1usize..4,
        head_dim in prop::sample::select(vec![4usize, 8, 16, 64]),
        block_size in prop::sample::select(vec![1usize, 3, 4, 16]),
        seed in any::<u64>(),
    ) {
        check_attention(&gpu(WeightStorage::F32), &seqs, kv_heads * group, kv_heads, head_dim, block_size, seed, 1e-4);
    }

    #[test]
    fn rope_on_random_shapes(
        seqs in prop::collection::vec((0usize..30, 1usize..6), 1..4),
        heads in 1usize..4,
        half_dim in 1usize..33,
        seed in any::<u64>(),
    ) {
        check_rope(&gpu(WeightStorage::F32), &seqs, heads, half_dim * 2, seed);
    }
}
