//! Backend conformance: the same op sequences run on a backend under test and on the CPU
//! backend (f32 weights, the reference), compared elementwise. The wgpu and CUDA tests call
//! these with their backend; every input is fresh random data, never zeros.

use infer_core::{
    AttentionParams, Backend, BatchInput, HostTensor, KvCacheSpec, RopeStyle, SequenceChunk,
};
use infer_cpu::CpuBackend;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn cpu() -> CpuBackend {
    CpuBackend::f32_weights()
}

pub fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

pub fn host<B: Backend>(b: &B, t: &B::Tensor) -> Vec<f32> {
    b.to_host(t).unwrap().data
}

pub fn up<B: Backend>(b: &B, shape: &[usize], data: &[f32]) -> B::Tensor {
    b.upload(&HostTensor::new(shape.to_vec(), data.to_vec()))
        .unwrap()
}

/// max |a - b| relative to max |b|; NaN (an unwritten element) always fails.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
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

/// A ragged batch of sequences `(num_computed, num_new)` over shuffled blocks; returns it and
/// the number of blocks used. Token ids are below `vocab`.
pub fn batch(
    rng: &mut StdRng,
    seqs: &[(usize, usize)],
    block_size: usize,
    vocab: u32,
) -> (BatchInput, usize) {
    let total: usize = seqs
        .iter()
        .map(|&(d, n)| (d + n).div_ceil(block_size))
        .sum();
    let mut blocks: Vec<u32> = (0..total as u32).collect();
    rand::seq::SliceRandom::shuffle(&mut blocks[..], rng);
    let mut tables = Vec::new();
    let mut tokens = Vec::new();
    let mut next = 0;
    for &(done, new) in seqs {
        let n = (done + new).div_ceil(block_size);
        tables.push(blocks[next..next + n].to_vec());
        next += n;
        tokens.push(
            (0..new)
                .map(|_| rng.random_range(0..vocab))
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
    (BatchInput::build(&chunks, block_size).unwrap(), total)
}

pub fn check_rope<B: Backend>(
    g: &B,
    seqs: &[(usize, usize)],
    heads: usize,
    head_dim: usize,
    seed: u64,
) {
    let c = cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, _) = batch(&mut rng, seqs, 4, 100);
    let max_len = seqs.iter().map(|&(d, n)| d + n).max().unwrap_or(1);
    let table = random(&mut rng, max_len * head_dim);
    let shape = [b.num_tokens(), heads * head_dim];
    let x = random(&mut rng, shape[0] * shape[1]);
    for style in [RopeStyle::AdjacentPairs, RopeStyle::HalfSplit] {
        let mut want = up(&c, &shape, &x);
        let cos_sin = up(&c, &[max_len, head_dim], &table);
        c.rope(
            &mut want,
            &c.upload_batch(&b).unwrap(),
            &cos_sin,
            head_dim,
            style,
        )
        .unwrap();
        let mut got = up(g, &shape, &x);
        let cos_sin = up(g, &[max_len, head_dim], &table);
        g.rope(
            &mut got,
            &g.upload_batch(&b).unwrap(),
            &cos_sin,
            head_dim,
            style,
        )
        .unwrap();
        assert_close(
            &format!("rope {style:?}"),
            &host(g, &got),
            &host(&c, &want),
            1e-5,
        );
    }
}

/// Writes random K/V for every position of each sequence into both caches (through
/// `write_kv`, at the batch's slot mapping), then compares attention of `seqs`' new tokens.
#[allow(clippy::too_many_arguments)]
pub fn check_attention<B: Backend>(
    g: &B,
    seqs: &[(usize, usize)],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    seed: u64,
    tol: f32,
) {
    let c = cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, num_blocks) = batch(&mut rng, seqs, block_size, 100);
    let spec = KvCacheSpec {
        num_layers: 2,
        num_blocks,
        block_size,
        num_kv_heads: kv_heads,
        head_dim,
    };
    let mut gc = g.alloc_kv_cache(&spec).unwrap();
    let mut cc = c.alloc_kv_cache(&spec).unwrap();
    // The whole context of each sequence, laid out on the same tables.
    let mut full = b.clone();
    full.token_ids.clear();
    full.positions.clear();
    full.slot_mapping.clear();
    full.query_start = vec![0];
    for (s, &len) in b.context_lens.iter().enumerate() {
        let table = b.block_table(s).to_vec();
        for p in 0..len as usize {
            full.token_ids.push(0);
            full.positions.push(p as u32);
            full.slot_mapping
                .push(table[p / block_size] * block_size as u32 + (p % block_size) as u32);
        }
        full.query_start.push(full.token_ids.len() as u32);
    }
    full.logits_indices.clear();
    let row = kv_heads * head_dim;
    let kv_shape = [full.num_tokens(), row];
    let (gf, cf) = (
        g.upload_batch(&full).unwrap(),
        c.upload_batch(&full).unwrap(),
    );
    for layer in 0..2 {
        let k = random(&mut rng, kv_shape[0] * row);
        let v = random(&mut rng, kv_shape[0] * row);
        g.write_kv(
            &mut gc,
            layer,
            &up(g, &kv_shape, &k),
            &up(g, &kv_shape, &v),
            &gf,
        )
        .unwrap();
        c.write_kv(
            &mut cc,
            layer,
            &up(&c, &kv_shape, &k),
            &up(&c, &kv_shape, &v),
            &cf,
        )
        .unwrap();
    }
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let q_shape = [b.num_tokens(), heads * head_dim];
    let q = random(&mut rng, q_shape[0] * q_shape[1]);
    let (gb, cb) = (g.upload_batch(&b).unwrap(), c.upload_batch(&b).unwrap());
    let what = format!("paged_attention {seqs:?} h{heads}/{kv_heads} d{head_dim} bs{block_size}");
    for layer in 0..2 {
        let got = g
            .paged_attention(&up(g, &q_shape, &q), &gc, layer, &gb, &params)
            .unwrap();
        let want = c
            .paged_attention(&up(&c, &q_shape, &q), &cc, layer, &cb, &params)
            .unwrap();
        assert_close(&what, &host(g, &got), &host(&c, &want), tol);
    }

    // Swap every block out to reversed host blocks and back into a fresh cache: attention over
    // it still equals the CPU's after the same moves.
    let host_spec = KvCacheSpec { num_blocks, ..spec };
    let mut gs = g.alloc_swap_space(&host_spec).unwrap();
    let mut cs = c.alloc_swap_space(&host_spec).unwrap();
    let out: Vec<(u32, u32)> = (0..num_blocks as u32)
        .map(|i| (i, num_blocks as u32 - 1 - i))
        .collect();
    g.swap_out(&gc, &mut gs, &out).unwrap();
    c.swap_out(&cc, &mut cs, &out).unwrap();
    let back: Vec<(u32, u32)> = out.iter().map(|&(d, h)| (h, d)).collect();
    let mut gc2 = g.alloc_kv_cache(&spec).unwrap();
    let mut cc2 = c.alloc_kv_cache(&spec).unwrap();
    g.swap_in(&gs, &mut gc2, &back).unwrap();
    c.swap_in(&cs, &mut cc2, &back).unwrap();
    let got = g
        .paged_attention(&up(g, &q_shape, &q), &gc2, 1, &gb, &params)
        .unwrap();
    let want = c
        .paged_attention(&up(&c, &q_shape, &q), &cc2, 1, &cb, &params)
        .unwrap();
    assert_close(
        &format!("{what} after swap"),
        &host(g, &got),
        &host(&c, &want),
        tol,
    );
}

/// Copy-on-write block copies: a sequence whose blocks were copied elsewhere attends the same.
pub fn check_block_copies<B: Backend>(g: &B, seed: u64, tol: f32) {
    let c = cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, num_blocks) = batch(&mut rng, &[(9, 1), (4, 2)], 4, 100);
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks: 2 * num_blocks,
        block_size: 4,
        num_kv_heads: 1,
        head_dim: 8,
    };
    let mut gc = g.alloc_kv_cache(&spec).unwrap();
    let mut cc = c.alloc_kv_cache(&spec).unwrap();
    let slots = [spec.num_blocks * 4, 8];
    let k = random(&mut rng, slots[0] * slots[1]);
    let v = random(&mut rng, slots[0] * slots[1]);
    let mut all = BatchInput {
        block_size: 4,
        ..Default::default()
    };
    all.slot_mapping = (0..slots[0] as u32).collect();
    all.token_ids = vec![0; slots[0]];
    all.positions = vec![0; slots[0]];
    all.query_start = vec![0, slots[0] as u32];
    all.context_lens = vec![1];
    all.block_tables = vec![0];
    all.max_blocks_per_seq = 1;
    let (ga, ca) = (g.upload_batch(&all).unwrap(), c.upload_batch(&all).unwrap());
    g.write_kv(&mut gc, 0, &up(g, &slots, &k), &up(g, &slots, &v), &ga)
        .unwrap();
    c.write_kv(&mut cc, 0, &up(&c, &slots, &k), &up(&c, &slots, &v), &ca)
        .unwrap();
    // Move every block of the batch to block + num_blocks, then point the tables there.
    let copies: Vec<(u32, u32)> = (0..num_blocks as u32)
        .map(|i| (i, i + num_blocks as u32))
        .collect();
    g.copy_blocks(&mut gc, &copies).unwrap();
    c.copy_blocks(&mut cc, &copies).unwrap();
    let mut moved = b.clone();
    for t in &mut moved.block_tables {
        *t += num_blocks as u32;
    }
    let params = AttentionParams {
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 8,
        scale: 0.3,
    };
    let q_shape = [b.num_tokens(), 16];
    let q = random(&mut rng, q_shape[0] * 16);
    let want = c
        .paged_attention(
            &up(&c, &q_shape, &q),
            &cc,
            0,
            &c.upload_batch(&b).unwrap(),
            &params,
        )
        .unwrap();
    let got = g
        .paged_attention(
            &up(g, &q_shape, &q),
            &gc,
            0,
            &g.upload_batch(&moved).unwrap(),
            &params,
        )
        .unwrap();
    assert_close(
        "attention over copied blocks",
        &host(g, &got),
        &host(&c, &want),
        tol,
    );
}

/// Rounds through IEEE half precision (what f16 weights and activations hold).
pub fn to_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// `x [m, k] · wᵀ` with `w` stored by `upload_matrix`. `half_inputs`: the backend rounds
/// weights and activations to f16 (accumulating in f32), so the CPU gets the rounded values.
pub fn check_matmul<B: Backend>(
    g: &B,
    m: usize,
    n: usize,
    k: usize,
    half_inputs: bool,
    seed: u64,
    tol: f32,
) {
    let c = cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let x = random(&mut rng, m * k);
    let w = random(&mut rng, n * k);
    let (xr, wr) = if half_inputs {
        (to_f16(&x), to_f16(&w))
    } else {
        (x.clone(), w.clone())
    };
    let gw = g.upload_matrix(&HostTensor::new(vec![n, k], w)).unwrap();
    let got = g.matmul(&up(g, &[m, k], &x), &gw).unwrap();
    let want = c
        .matmul(&up(&c, &[m, k], &xr), &up(&c, &[n, k], &wr))
        .unwrap();
    assert_close(
        &format!("matmul {m}x{k} · {n}x{k}ᵀ"),
        &host(g, &got),
        &host(&c, &want),
        tol,
    );
}

/// rms_norm, silu_mul, add_assign, add_bias, embedding (f32 and `upload_matrix` tables),
/// gather_logit_rows and argmax_to_host (when the backend has it) on `rows x cols`.
pub fn check_dense_ops<B: Backend>(g: &B, rows: usize, cols: usize, seed: u64, tol: f32) {
    let c = cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = [rows, cols];
    let (x, y, wv) = (
        random(&mut rng, rows * cols),
        random(&mut rng, rows * cols),
        random(&mut rng, cols),
    );
    let cmp = |what: &str, got: &B::Tensor, want: &<CpuBackend as Backend>::Tensor| {
        assert_close(
            &format!("{what} {rows}x{cols}"),
            &host(g, got),
            &host(&c, want),
            tol,
        )
    };
    let got = g
        .rms_norm(&up(g, &shape, &x), &up(g, &[cols], &wv), 1e-5)
        .unwrap();
    let want = c
        .rms_norm(&up(&c, &shape, &x), &up(&c, &[cols], &wv), 1e-5)
        .unwrap();
    cmp("rms_norm", &got, &want);
    let got = g.silu_mul(&up(g, &shape, &x), &up(g, &shape, &y)).unwrap();
    let want = c
        .silu_mul(&up(&c, &shape, &x), &up(&c, &shape, &y))
        .unwrap();
    cmp("silu_mul", &got, &want);
    let (mut got, mut want) = (up(g, &shape, &x), up(&c, &shape, &x));
    g.add_assign(&mut got, &up(g, &shape, &y)).unwrap();
    c.add_assign(&mut want, &up(&c, &shape, &y)).unwrap();
    g.add_bias(&mut got, &up(g, &[cols], &wv)).unwrap();
    c.add_bias(&mut want, &up(&c, &[cols], &wv)).unwrap();
    cmp("add_assign + add_bias", &got, &want);

    // A batch of `rows` tokens over a table of `rows + 7` rows; every row's logits.
    let vocab = rows + 7;
    let table = random(&mut rng, vocab * cols);
    let seqs: Vec<(usize, usize)> = vec![(0, rows)];
    let (mut b, _) = batch(&mut rng, &seqs, 4, vocab as u32);
    b.logits_indices = (0..rows as u32).rev().collect();
    for (gt, ct) in [
        (
            up(g, &[vocab, cols], &table),
            up(&c, &[vocab, cols], &table),
        ),
        (
            g.upload_matrix(&HostTensor::new(vec![vocab, cols], table.clone()))
                .unwrap(),
            c.upload_matrix(&HostTensor::new(vec![vocab, cols], table.clone()))
                .unwrap(),
        ),
    ] {
        let (gb, cb) = (g.upload_batch(&b).unwrap(), c.upload_batch(&b).unwrap());
        let got = g.embedding(&gt, &gb).unwrap();
        let want = c.embedding(&ct, &cb).unwrap();
        // Tables stored as f16 by `upload_matrix` round each value (relative 2^-11).
        cmp("embedding", &got, &want);
        let got = g.gather_logit_rows(&got, &gb).unwrap();
        let want = c.gather_logit_rows(&want, &cb).unwrap();
        cmp("gather_logit_rows", &got, &want);
    }
    // argmax on rows with a planted tie: the lowest index wins.
    let mut logits = random(&mut rng, rows * cols);
    for r in 0..rows {
        let (a, b2) = (r % cols, (r * 7 + 3) % cols);
        logits[r * cols + a.min(b2)] = 5.0;
        logits[r * cols + a.max(b2)] = 5.0;
    }
    if let Some(ids) = g.argmax_to_host(&up(g, &shape, &logits)).unwrap() {
        let want: Vec<u32> = (0..rows)
            .map(|r| {
                let row = &logits[r * cols..(r + 1) * cols];
                let best = row.iter().cloned().fold(f32::MIN, f32::max);
                row.iter().position(|&v| v == best).unwrap() as u32
            })
            .collect();
        assert_eq!(ids, want, "argmax {rows}x{cols}");
    }
}
