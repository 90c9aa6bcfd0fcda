//! RoPE, the KV-cache write, PagedAttention (with swap out and in) and copy-on-write copies.

use infer_core::{AttentionParams, Backend, BatchInput, KvCacheSpec, RopeStyle};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{assert_close, batch, cpu, host, random, up};

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
    let shape = [b.num_tokens(), heads * head_dim];
    let x = random(&mut rng, shape[0] * shape[1]);
    // Every dimension rotating, and a partial rotary of three quarters (rounded to pairs).
    let partial = (head_dim * 3 / 4) & !1;
    let cases = [RopeStyle::AdjacentPairs, RopeStyle::HalfSplit]
        .into_iter()
        .flat_map(|s| [(s, head_dim), (s, partial.max(2))]);
    for (style, rot) in cases {
        let table = random(&mut rng, max_len * rot);
        let mut want = up(&c, &shape, &x);
        let cos_sin = up(&c, &[max_len, rot], &table);
        c.rope(
            &mut want,
            &c.upload_batch(&b).unwrap(),
            &cos_sin,
            head_dim,
            style,
        )
        .unwrap();
        let mut got = up(g, &shape, &x);
        let cos_sin = up(g, &[max_len, rot], &table);
        g.rope(
            &mut got,
            &g.upload_batch(&b).unwrap(),
            &cos_sin,
            head_dim,
            style,
        )
        .unwrap();
        assert_close(
            &format!("rope {style:?} rotary {rot}/{head_dim}"),
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
        window: None,
        softcap: None,
    };
    let q_shape = [b.num_tokens(), heads * head_dim];
    let q = random(&mut rng, q_shape[0] * q_shape[1]);
    let (gb, cb) = (g.upload_batch(&b).unwrap(), c.upload_batch(&b).unwrap());
    let what = format!("paged_attention {seqs:?} h{heads}/{kv_heads} d{head_dim} bs{block_size}");
    // Plain; a short window; a window of half the longest context (across partitions of long
    // ones) with soft-capped scores (scaled up so the cap bites).
    let longest = b.context_lens.iter().max().copied().unwrap_or(1) as usize;
    let variants = [
        params,
        AttentionParams {
            window: Some(1 + seed as usize % 5),
            ..params
        },
        AttentionParams {
            window: Some(longest.div_ceil(2)),
            softcap: Some(1.5),
            scale: 4.0 / (head_dim as f32).sqrt(),
            ..params
        },
    ];
    // Each also with attention sinks (gpt-oss), large enough to take a real share.
    let sinks: Vec<f32> = random(&mut rng, heads)
        .iter()
        .map(|s| 2.0 * s + 1.0)
        .collect();
    let (g_sinks, c_sinks) = (up(g, &[heads], &sinks), up(&c, &[heads], &sinks));
    for (layer, p) in (0..2).flat_map(|l| variants.iter().map(move |p| (l, p))) {
        for with_sinks in [false, true] {
            let got = g
                .paged_attention(
                    &up(g, &q_shape, &q),
                    &gc,
                    layer,
                    &gb,
                    p,
                    with_sinks.then_some(&g_sinks),
                )
                .unwrap();
            let want = c
                .paged_attention(
                    &up(&c, &q_shape, &q),
                    &cc,
                    layer,
                    &cb,
                    p,
                    with_sinks.then_some(&c_sinks),
                )
                .unwrap();
            let what = format!(
                "{what} window {:?} softcap {:?} sinks {with_sinks}",
                p.window, p.softcap
            );
            assert_close(&what, &host(g, &got), &host(&c, &want), tol);
        }
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
        .paged_attention(&up(g, &q_shape, &q), &gc2, 1, &gb, &params, None)
        .unwrap();
    let want = c
        .paged_attention(&up(&c, &q_shape, &q), &cc2, 1, &cb, &params, None)
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
        window: None,
        softcap: None,
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
            None,
        )
        .unwrap();
    let got = g
        .paged_attention(
            &up(g, &q_shape, &q),
            &gc,
            0,
            &g.upload_batch(&moved).unwrap(),
            &params,
            None,
        )
        .unwrap();
    assert_close(
        "attention over copied blocks",
        &host(g, &got),
        &host(&c, &want),
        tol,
    );
}
