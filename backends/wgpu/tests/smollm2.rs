//! SmolLM2 end to end on wgpu (lavapipe in CI): greedy tokens equal the CPU backend's for the
//! reference prompts (few tokens: lavapipe runs about 1-2 GFLOP/s).

use std::sync::Arc;

use infer_core::{open_model, Backend, Generator, LlamaModel, SamplingParams};
use infer_cpu::CpuBackend;
use infer_tests::smollm2_path;
use infer_wgpu::{GpuContext, WgpuBackend};

fn greedy<B: Backend>(backend: &B, prompts: &[&str], max_tokens: usize) -> Vec<Vec<u32>> {
    let files = open_model(&smollm2_path()).unwrap();
    let model = LlamaModel::load(
        backend,
        &files.config,
        files.weights.as_ref(),
        None,
        &mut |_, _| {},
    )
    .unwrap();
    let gen = Generator::new(backend, &model, &files.tokenizer);
    prompts
        .iter()
        .map(|p| {
            let ids = files.tokenizer.encode(p, true).unwrap();
            let params = SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(max_tokens)
            };
            gen.generate(&ids, &params, &mut |_| {}).unwrap().token_ids
        })
        .collect()
}

#[test]
fn smollm2_greedy_tokens_equal_the_cpu_backend() {
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::VULKAN);
    let ctx = pollster::block_on(GpuContext::open(
        backends,
        std::env::var("WGPU_ADAPTER_NAME").ok(),
    ))
    .unwrap_or_else(|e| panic!("the wgpu tests need an adapter: {e}"));
    let gpu = WgpuBackend::with_context(Arc::new(ctx));
    let prompts = ["The capital of France is", "def fibonacci(n):"];
    let want = greedy(&CpuBackend::f32_weights(), &prompts, 4);
    let got = greedy(&gpu, &prompts, 4);
    assert_eq!(got, want, "on {}", gpu.name());
}
