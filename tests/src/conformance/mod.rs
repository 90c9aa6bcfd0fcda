//! Backend conformance: the same op sequences run on a backend under test and on the CPU
//! backend (f32 weights, the reference), compared elementwise. The wgpu and CUDA tests call
//! these with their backend; every input is fresh random data, never zeros. `smollm2_greedy`
//! runs the real model through the engine.

mod attention;
mod dense;
mod engine;
pub mod families;
mod moe;
mod quant;
mod refusals;
mod steps;

pub use attention::{check_attention, check_block_copies, check_rope};
pub use dense::{check_dense_ops, check_matmul, to_f16};
pub use engine::smollm2_greedy;
pub use moe::{check_moe_ops, moe_cases, MoeCase};
pub use quant::check_packed_matmul;
pub use refusals::check_refusals;
pub use steps::check_decode_steps;

use infer_core::{Backend, BatchInput, HostTensor, SequenceChunk};
use infer_cpu::CpuBackend;
use rand::rngs::StdRng;
use rand::Rng;

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
