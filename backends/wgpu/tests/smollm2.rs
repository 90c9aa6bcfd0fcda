//! SmolLM2 end to end on wgpu (lavapipe in CI): greedy tokens equal the CPU backend's for the
//! reference prompts (few tokens: lavapipe runs about 1-2 GFLOP/s), through the engine so the
//! greedy rows take the device-argmax path (one id read back per sequence) and a batch mixes a
//! prefill with decodes.

mod common;

use common::{cpu, gpu};

use std::sync::Arc;

use infer_core::scheduler::{PreemptionMode, SchedulerConfig};
use infer_core::{
    open_model, Backend, Engine, EngineConfig, LlamaExecutor, LlamaModel, Prompt, SamplingParams,
};
use infer_tests::smollm2_path;
use infer_wgpu::WeightStorage;

/// Greedy tokens of each prompt, and the steps whose ids came from a device argmax.
fn greedy<B: Backend + 'static>(
    backend: B,
    prompts: &[&str],
    max_tokens: usize,
) -> (Vec<Vec<u32>>, u64) {
    let files = open_model(&smollm2_path()).unwrap();
    let model = LlamaModel::load(
        &backend,
        &files.config,
        files.weights.as_ref(),
        Some(256),
        &mut |_, _| {},
    )
    .unwrap();
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: 32,
        num_host_blocks: 0,
        max_model_len: 256,
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            // The second prompt's prefill shares a step with the first one's decode.
            max_num_batched_tokens: 8,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let executor = LlamaExecutor::new(backend, Arc::new(model), 16, 32, 0).unwrap();
    let tokenizer = Arc::new(files.tokenizer);
    let mut engine = Engine::new(executor, Some(tokenizer), config).unwrap();
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    };
    let prompts = prompts
        .iter()
        .map(|p| Prompt::Text(p.to_string()))
        .collect();
    let tokens = engine
        .generate(prompts, &[params], &mut |_| {})
        .unwrap()
        .into_iter()
        .map(|r| r.first().token_ids.clone())
        .collect();
    (tokens, engine.stats().argmax_steps)
}

#[test]
fn smollm2_greedy_tokens_equal_the_cpu_backend() {
    let prompts = ["The capital of France is", "def fibonacci(n):"];
    let (want, cpu_argmax_steps) = greedy(cpu(), &prompts, 4);
    let gpu = gpu(WeightStorage::F32);
    let name = gpu.name();
    let (got, argmax_steps) = greedy(gpu, &prompts, 4);
    assert_eq!(got, want, "on {name}");
    assert_eq!(cpu_argmax_steps, 0, "the CPU backend reads logits rows");
    assert!(
        argmax_steps > 0,
        "no step read back device argmaxes on {name}"
    );
}
