//! SmolLM2 end to end on wgpu (lavapipe in CI): greedy tokens equal the CPU backend's for the
//! reference prompts (few tokens: lavapipe runs about 1-2 GFLOP/s), through the engine so the
//! greedy rows take the device-argmax path (one id read back per sequence) and a batch mixes a
//! prefill with decodes.

mod common;

use common::{cpu, gpu};

use infer_core::Backend;
use infer_tests::conformance::smollm2_greedy;
use infer_wgpu::WeightStorage;

#[test]
fn smollm2_greedy_tokens_equal_the_cpu_backend() {
    let prompts = ["The capital of France is", "def fibonacci(n):"];
    let (want, cpu_argmax_steps) = smollm2_greedy(cpu(), &prompts, 4);
    let gpu = gpu(WeightStorage::F32);
    let name = gpu.name();
    let (got, argmax_steps) = smollm2_greedy(gpu, &prompts, 4);
    assert_eq!(got, want, "on {name}");
    assert_eq!(cpu_argmax_steps, 0, "the CPU backend reads logits rows");
    assert!(
        argmax_steps > 0,
        "no step read back device argmaxes on {name}"
    );
}
