//! The real model through the engine on a backend.

use std::sync::Arc;

use infer_core::scheduler::{PreemptionMode, SchedulerConfig};
use infer_core::{
    open_model, Backend, Engine, EngineConfig, Model, ModelExecutor, Prompt, SamplingParams,
};

use crate::smollm2_path;

/// SmolLM2 through the engine on `backend` (a prefill sharing steps with a decode, greedy
/// rows on the device-argmax path where the backend has one).
/// Returns each prompt's greedy tokens and the steps whose ids came from a device argmax.
pub fn smollm2_greedy<B: Backend + 'static>(
    backend: B,
    prompts: &[&str],
    max_tokens: usize,
) -> (Vec<Vec<u32>>, u64) {
    let files = open_model(&smollm2_path()).unwrap();
    let model = Model::load(
        &backend,
        &files.config,
        files.weights.as_ref(),
        Some(512),
        &mut |_, _| {},
    )
    .unwrap();
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: 32,
        num_host_blocks: 0,
        max_model_len: 512,
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            // The second prompt's prefill shares a step with the first one's decode.
            max_num_batched_tokens: 8,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let executor = ModelExecutor::new(backend, Arc::new(model), 16, 32, 0).unwrap();
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
