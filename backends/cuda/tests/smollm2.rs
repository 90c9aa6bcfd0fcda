//! SmolLM2 end to end on CUDA through the engine: greedy tokens equal the CPU backend's (f32
//! weights: only the f16 KV cache differs), and with f16 or packed weights the first tokens
//! agree.
//! Skipped (and saying so) without a GPU.

mod common;

use common::gpu;
use infer_core::Backend;
use infer_cuda::CudaWeights;
use infer_tests::conformance::{cpu, smollm2_greedy};

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
];

#[test]
fn smollm2_greedy_tokens_equal_the_cpu_backend() {
    let Some(g) = gpu(CudaWeights::F32) else {
        return;
    };
    let name = g.name();
    let (want, _) = smollm2_greedy(cpu(), &PROMPTS, 24);
    let (got, argmax_steps) = smollm2_greedy(g, &PROMPTS, 24);
    assert_eq!(got, want, "f32 weights on {name}");
    assert!(
        argmax_steps > 0,
        "no step read back device argmaxes on {name}"
    );
    // f16 matrices, and the GGUF's Q4_1 / Q8_0 blocks computed on in-kernel.
    for weights in [CudaWeights::F16, CudaWeights::Packed] {
        let Some(g) = gpu(weights) else {
            return;
        };
        let (got, _) = smollm2_greedy(g, &PROMPTS, 24);
        for (p, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g[..8],
                w[..8],
                "{weights:?} weights, prompt {p}: {g:?} vs {w:?}"
            );
        }
    }
}
