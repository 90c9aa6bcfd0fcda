//! Whole decode steps through `Model::forward` on a backend under test against a reference
//! backend, with the same tiny random model loaded on both: the backend's step machinery
//! (CUDA graphs: padding to a recorded size, replays with new metadata, contexts crossing an
//! attention partition) must give the logits the reference computes op by op.

use infer_core::gguf::GgmlType;
use infer_core::{open_model, Backend, BatchInput, Model, SequenceChunk};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gguf_writer::{tiny_llama, tiny_llama_blocks, Meta};

use super::{assert_close, host};

/// Longest context the steps reach: past one 512-key attention partition.
const MAX_CONTEXT: usize = 1100;
const BLOCK_SIZE: usize = 16;

/// Decode batches of `sizes` sequences, each batch `steps` steps long after its prompts
/// (prefilled in one step), compared row by row with tolerance `tol` relative to the largest
/// logit. One batch starts its sequences at ~505 tokens so its decode crosses 512 keys.
/// `blocks`: the layers' matrices as random blocks of that type (else f32, f16 and Q8_0 as
/// `tiny_llama` writes them).
pub fn check_decode_steps<A: Backend, B: Backend>(
    under_test: &A,
    reference: &B,
    blocks: Option<GgmlType>,
    sizes: &[usize],
    steps: usize,
    tol: f32,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let mut w = match blocks {
        Some(dtype) => tiny_llama_blocks(7, dtype),
        None => tiny_llama(7),
    };
    w.meta("llama.context_length", Meta::U32(MAX_CONTEXT as u32));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let files = open_model(path.to_str().unwrap()).unwrap();
    let (config, weights) = (&files.config, files.weights.as_ref());
    let model = Model::load(under_test, config, weights, None, &mut |_, _| {})
        .expect("loading the tiny model");
    let model_ref = Model::load(reference, config, weights, None, &mut |_, _| {})
        .expect("loading the tiny model");
    let vocab = files.config.vocab_size as u32;
    let mut rng = StdRng::seed_from_u64(11);
    for (case, &n) in sizes.iter().enumerate() {
        let long = case == 1;
        let blocks_per_seq = MAX_CONTEXT.div_ceil(BLOCK_SIZE);
        let spec = model.kv_cache_spec(n * blocks_per_seq, BLOCK_SIZE);
        let mut kv = under_test.alloc_kv_cache(&spec).unwrap();
        let mut kv_ref = reference.alloc_kv_cache(&spec).unwrap();
        // Each sequence's blocks, in a scrambled order so the tables matter.
        let tables: Vec<Vec<u32>> = (0..n)
            .map(|s| {
                (0..blocks_per_seq)
                    .map(|b| ((b * n + s) * 7 % (n * blocks_per_seq)) as u32)
                    .collect()
            })
            .collect();
        let mut seqs: Vec<Vec<u32>> = (0..n)
            .map(|s| {
                let len = if long { 500 + s % 9 } else { 3 + (s * 5) % 17 };
                (0..len).map(|_| rng.random_range(0..vocab)).collect()
            })
            .collect();
        let mut done = vec![0usize; n];
        for step in 0..=steps {
            let chunks: Vec<SequenceChunk> = (0..n)
                .map(|s| SequenceChunk {
                    tokens: &seqs[s][done[s]..],
                    num_computed: done[s],
                    block_table: &tables[s],
                    want_logits: true,
                    all_logits: false,
                })
                .collect();
            let batch = BatchInput::build(&chunks, BLOCK_SIZE).unwrap();
            let got = model.forward(under_test, &batch, &mut kv).unwrap();
            let want = model_ref.forward(reference, &batch, &mut kv_ref).unwrap();
            let (got, want) = (host(under_test, &got), host(reference, &want));
            assert_close(
                &format!("{n} sequences, step {step} (long: {long})"),
                &got,
                &want,
                tol,
            );
            for s in 0..n {
                done[s] = seqs[s].len();
                seqs[s].push(rng.random_range(0..vocab));
            }
        }
    }
}
