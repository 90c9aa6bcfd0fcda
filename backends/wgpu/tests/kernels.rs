//! Every kernel against the CPU backend (the reference) on fresh random inputs, run on a real
//! wgpu adapter: Vulkan (Mesa lavapipe in CI). No adapter is a failure, not a skip.

use std::sync::OnceLock;

use infer_core::{
    AttentionParams, Backend, BatchInput, HostTensor, KvCacheSpec, RopeStyle, SequenceChunk,
};
use infer_cpu::CpuBackend;
use infer_wgpu::{AttentionShape, GpuContext};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn gpu() -> &'static GpuContext {
    static CTX: OnceLock<GpuContext> = OnceLock::new();
    CTX.get_or_init(|| {
        // Pinned to Vulkan: without a driver wgpu would fall back to GL and crawl.
        let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::VULKAN);
        pollster::block_on(GpuContext::open(
            backends,
            std::env::var("WGPU_ADAPTER_NAME").ok(),
        ))
        .unwrap_or_else(|e| panic!("the wgpu tests need an adapter: {e}"))
    })
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn cpu_f32(t: &<CpuBackend as Backend>::Tensor) -> Vec<f32> {
    CpuBackend::new().to_host(t).unwrap().data
}

/// max |a - b| relative to max |b|.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() {
                f32::INFINITY
            } else {
                (g - w).abs()
            }
        })
        .fold(0f32, f32::max);
    assert!(
        worst / scale <= tol,
        "{what}: max error {worst} (scale {scale})"
    );
}

#[test]
fn norm_matmul_elementwise_embedding_gather_argmax_match_the_cpu() {
    let g = gpu();
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(1);
    for &(m, n, k) in &[(1, 7, 5), (3, 33, 17), (17, 64, 96), (40, 20, 130)] {
        let x = random(&mut rng, m * k);
        let w = random(&mut rng, n * k);
        let want = cpu
            .matmul(
                &cpu.upload(&HostTensor::new(vec![m, k], x.clone())).unwrap(),
                &cpu.upload(&HostTensor::new(vec![n, k], w.clone())).unwrap(),
            )
            .unwrap();
        let got = g.matmul(&g.upload_f32(&x), &g.upload_f32(&w), m, n, k);
        assert_close(
            "matmul",
            &g.read_f32(&got, m * n).unwrap(),
            &cpu_f32(&want),
            1e-5,
        );

        let weight = random(&mut rng, k);
        let want = cpu
            .rms_norm(
                &cpu.upload(&HostTensor::new(vec![m, k], x.clone())).unwrap(),
                &cpu.upload(&HostTensor::new(vec![k], weight.clone()))
                    .unwrap(),
                1e-5,
            )
            .unwrap();
        let got = g.rms_norm(&g.upload_f32(&x), &g.upload_f32(&weight), m, k, 1e-5);
        assert_close(
            "rms_norm",
            &g.read_f32(&got, m * k).unwrap(),
            &cpu_f32(&want),
            1e-5,
        );
    }

    let (rows, cols) = (5, 300);
    let a = random(&mut rng, rows * cols);
    let b = random(&mut rng, rows * cols);
    let bias = random(&mut rng, cols);
    let x = g.upload_f32(&a);
    g.add_assign(&x, &g.upload_f32(&b), rows * cols);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_close(
        "add_assign",
        &g.read_f32(&x, rows * cols).unwrap(),
        &want,
        1e-6,
    );
    let x = g.upload_f32(&a);
    g.add_bias(&x, &g.upload_f32(&bias), rows * cols, cols);
    let want: Vec<f32> = a
        .iter()
        .enumerate()
        .map(|(i, x)| x + bias[i % cols])
        .collect();
    assert_close(
        "add_bias",
        &g.read_f32(&x, rows * cols).unwrap(),
        &want,
        1e-6,
    );
    let out = g.silu_mul(&g.upload_f32(&a), &g.upload_f32(&b), rows * cols);
    let shape = vec![rows, cols];
    let want = cpu
        .silu_mul(
            &cpu.upload(&HostTensor::new(shape.clone(), a.clone()))
                .unwrap(),
            &cpu.upload(&HostTensor::new(shape, b.clone())).unwrap(),
        )
        .unwrap();
    assert_close(
        "silu_mul",
        &g.read_f32(&out, rows * cols).unwrap(),
        &cpu_f32(&want),
        1e-5,
    );

    let (vocab, hidden) = (50, 24);
    let table = random(&mut rng, vocab * hidden);
    let ids: Vec<u32> = (0..9).map(|_| rng.random_range(0..vocab as u32)).collect();
    let got = g.embedding(
        &g.upload_f32(&table),
        hidden,
        &g.upload_u32(&ids),
        ids.len(),
    );
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&t| table[t as usize * hidden..(t as usize + 1) * hidden].to_vec())
        .collect();
    assert_close(
        "embedding",
        &g.read_f32(&got, want.len()).unwrap(),
        &want,
        0.0,
    );

    let idx = [3u32, 0, 4];
    let got = g.gather_rows(&g.upload_f32(&a), &g.upload_u32(&idx), idx.len(), cols);
    let want: Vec<f32> = idx
        .iter()
        .flat_map(|&r| a[r as usize * cols..(r as usize + 1) * cols].to_vec())
        .collect();
    assert_close(
        "gather_rows",
        &g.read_f32(&got, want.len()).unwrap(),
        &want,
        0.0,
    );

    let mut logits = random(&mut rng, 4 * 1000);
    logits[2 * 1000 + 17] = 5.0;
    logits[2 * 1000 + 900] = 5.0; // a tie: the lower index wins
    let got = g
        .read_u32(&g.argmax(&g.upload_f32(&logits), 4, 1000), 4)
        .unwrap();
    let want: Vec<u32> = logits
        .chunks(1000)
        .map(infer_core::sampling::argmax)
        .collect();
    assert_eq!(got, want);
    assert_eq!(got[2], 17);
}

/// A batch of sequences `(num_computed, num_new)` over shuffled blocks.
fn batch(rng: &mut StdRng, seqs: &[(usize, usize)], block_size: usize) -> (BatchInput, usize) {
    let mut next_block = 0u32;
    let mut tables = Vec::new();
    let mut tokens = Vec::new();
    for &(done, new) in seqs {
        let blocks = (done + new).div_ceil(block_size);
        tables.push(
            (next_block..next_block + blocks as u32)
                .rev()
                .collect::<Vec<u32>>(),
        );
        next_block += blocks as u32;
        tokens.push(
            (0..new)
                .map(|_| rng.random_range(0..100u32))
                .collect::<Vec<u32>>(),
        );
    }
    let chunks: Vec<SequenceChunk> = seqs
        .iter()
        .enumerate()
        .map(|(i, &(done, _))| SequenceChunk {
            tokens: &tokens[i],
            num_computed: done,
            block_table: &tables[i],
            want_logits: true,
            all_logits: false,
        })
        .collect();
    (
        BatchInput::build(&chunks, block_size).unwrap(),
        next_block as usize,
    )
}

fn token_info(b: &BatchInput) -> Vec<u32> {
    let mut out = Vec::new();
    for t in 0..b.num_tokens() {
        let seq = b.query_start.partition_point(|&s| s as usize <= t) - 1;
        out.extend([b.positions[t], seq as u32]);
    }
    out
}

fn check_rope(seqs: &[(usize, usize)], heads: usize, head_dim: usize, seed: u64) {
    let g = gpu();
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, _) = batch(&mut rng, seqs, 4);
    let max_len = 64;
    let table = random(&mut rng, max_len * head_dim);
    let n = b.num_tokens();
    let x = random(&mut rng, n * heads * head_dim);
    for style in [RopeStyle::AdjacentPairs, RopeStyle::HalfSplit] {
        let mut want = cpu
            .upload(&HostTensor::new(vec![n, heads * head_dim], x.clone()))
            .unwrap();
        let cos_sin = cpu
            .upload(&HostTensor::new(vec![max_len, head_dim], table.clone()))
            .unwrap();
        cpu.rope(
            &mut want,
            &cpu.upload_batch(&b).unwrap(),
            &cos_sin,
            head_dim,
            style,
        )
        .unwrap();
        let got = g.upload_f32(&x);
        let adjacent = style == RopeStyle::AdjacentPairs;
        g.rope(
            &got,
            &g.upload_u32(&b.positions),
            &g.upload_f32(&table),
            n,
            heads,
            head_dim,
            adjacent,
        );
        assert_close(
            "rope",
            &g.read_f32(&got, x.len()).unwrap(),
            &cpu_f32(&want),
            1e-5,
        );
    }
}

fn check_attention(
    seqs: &[(usize, usize)],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    seed: u64,
) {
    let g = gpu();
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, num_blocks) = batch(&mut rng, seqs, block_size);
    let n = b.num_tokens();
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks,
        block_size,
        num_kv_heads: kv_heads,
        head_dim,
    };
    let row = kv_heads * head_dim;
    let mut cache = cpu.alloc_kv_cache(&spec).unwrap();
    let kc = g.poisoned_f32(num_blocks * block_size * row);
    let vc = g.poisoned_f32(num_blocks * block_size * row);
    // Fill every slot the attention may read with known K/V through write_kv over all
    // positions of each sequence (context and new tokens alike).
    let full: Vec<(usize, usize)> = seqs.iter().map(|&(done, new)| (0, done + new)).collect();
    // Same block counts per sequence, so `batch` lays out the same tables.
    let (all, _) = batch(&mut rng, &full, block_size);
    let k = random(&mut rng, all.num_tokens() * row);
    let v = random(&mut rng, all.num_tokens() * row);
    let kv_shape = vec![all.num_tokens(), row];
    let cpu_all = cpu.upload_batch(&all).unwrap();
    cpu.write_kv(
        &mut cache,
        0,
        &cpu.upload(&HostTensor::new(kv_shape.clone(), k.clone()))
            .unwrap(),
        &cpu.upload(&HostTensor::new(kv_shape, v.clone())).unwrap(),
        &cpu_all,
    )
    .unwrap();
    g.write_kv(
        &g.upload_f32(&k),
        &g.upload_f32(&v),
        &g.upload_u32(&all.slot_mapping),
        &kc,
        &vc,
        all.num_tokens(),
        row,
    );

    let q = random(&mut rng, n * heads * head_dim);
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let want = cpu
        .paged_attention(
            &cpu.upload(&HostTensor::new(vec![n, heads * head_dim], q.clone()))
                .unwrap(),
            &cache,
            0,
            &cpu.upload_batch(&b).unwrap(),
            &params,
        )
        .unwrap();
    let max_context = b.context_lens.iter().copied().max().unwrap_or(0) as usize;
    let got = g
        .paged_attention(
            &g.upload_f32(&q),
            &kc,
            &vc,
            &g.upload_u32(&b.block_tables),
            &g.upload_u32(&token_info(&b)),
            AttentionShape {
                num_tokens: n,
                heads,
                kv_heads,
                head_dim,
                block_size,
                max_blocks: b.max_blocks_per_seq,
                max_context,
                scale: params.scale,
            },
        )
        .unwrap();
    assert_close(
        &format!("paged_attention {seqs:?} h{heads}/{kv_heads} d{head_dim} bs{block_size}"),
        &g.read_f32(&got, n * heads * head_dim).unwrap(),
        &cpu_f32(&want),
        1e-4,
    );
}

#[test]
fn rope_both_layouts_match_the_cpu() {
    check_rope(&[(0, 5), (7, 1), (30, 3)], 3, 8, 2);
    check_rope(&[(0, 1)], 1, 64, 3);
}

#[test]
fn paged_attention_matches_the_cpu_across_partitions() {
    // Decode tokens, a prefill chunk after cached context, GQA, and a context longer than one
    // 512-key partition.
    check_attention(&[(5, 1), (0, 7), (13, 4)], 4, 2, 16, 4, 4);
    check_attention(&[(700, 1), (600, 3)], 2, 1, 32, 16, 5);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn paged_attention_on_random_shapes(
        seqs in prop::collection::vec((0usize..40, 1usize..6), 1..4),
        kv_heads in 1usize..3,
        group in 1usize..4,
        head_dim in prop::sample::select(vec![4usize, 8, 16, 64]),
        block_size in prop::sample::select(vec![1usize, 4, 16]),
        seed in any::<u64>(),
    ) {
        check_attention(&seqs, kv_heads * group, kv_heads, head_dim, block_size, seed);
    }
}
