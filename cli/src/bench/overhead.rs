//! `infer bench overhead`: what the engine itself costs per step (scheduler, block manager,
//! batch building, sampler, detokenizer) with an executor that returns fixed logits.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use infer_core::engine::testing::FixedLogitsExecutor;
use infer_core::sampling::StructuredOutput;
use infer_core::{
    open_model, Engine, EngineConfig, PreemptionMode, Prompt, SamplingParams, SchedulerConfig,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;

use super::{mean, percentile, random_prompt};

#[derive(Debug, Args)]
pub struct OverheadArgs {
    /// Model whose tokenizer detokenizes the outputs (its weights are not loaded).
    #[arg(long)]
    pub model: Option<String>,
    /// Logit row length without a model.
    #[arg(long, default_value_t = 49152)]
    pub vocab: usize,
    /// Sequences decoding together.
    #[arg(long, default_value_t = 256)]
    pub num_seqs: usize,
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    /// Timed decode steps.
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// 0 = greedy; above 0 the sampler draws from the full softmax.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Top logprobs per token (also tracks the cumulative logprob).
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Constrain every sequence (needs `--model` for the tokenizer), as vLLM's
    /// `structured_outputs`: the report adds the per-step time of the grammar masks. A
    /// constraint random logits can complete ends sequences early, which the run refuses.
    #[arg(long, value_name = "JSON")]
    pub structured_outputs: Option<String>,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: OverheadArgs) -> Result<()> {
    if args.num_seqs == 0 || args.steps == 0 || args.prompt_len == 0 || args.block_size == 0 {
        bail!("--num-seqs, --steps, --prompt-len and --block-size must be at least 1");
    }
    let tokenizer = match &args.model {
        Some(m) => Some(Arc::new(open_model(m)?.tokenizer)),
        None => None,
    };
    let vocab = tokenizer
        .as_ref()
        .map_or(args.vocab, |t| t.inner().get_vocab_size(true));
    let max_tokens = args.steps + 2;
    let max_len = args.prompt_len + max_tokens;
    let blocks = args.num_seqs * max_len.div_ceil(args.block_size);
    let config = EngineConfig {
        block_size: args.block_size,
        num_device_blocks: blocks,
        num_host_blocks: 0,
        max_model_len: max_len + 1,
        enable_prefix_caching: true,
        scheduler: SchedulerConfig {
            max_num_seqs: args.num_seqs,
            max_num_batched_tokens: args.num_seqs * args.prompt_len,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let structured: Option<StructuredOutput> = match &args.structured_outputs {
        Some(s) => {
            Some(serde_json::from_str(s).with_context(|| format!("--structured-outputs `{s}`"))?)
        }
        None => None,
    };
    let mut engine = Engine::new(FixedLogitsExecutor::new(vocab, 7), tokenizer, config)?;
    let mut rng = StdRng::seed_from_u64(0);
    // add_request compiles a request's grammar on the engine thread: time it (the first also
    // builds the vocabulary's token trie).
    let mut add_micros = Vec::with_capacity(args.num_seqs);
    for i in 0..args.num_seqs {
        let params = SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            repetition_penalty: args.repetition_penalty,
            logprobs: args.logprobs,
            seed: Some(i as u64),
            ignore_eos: true,
            structured_outputs: structured.clone(),
            ..Default::default()
        };
        let prompt = Prompt::Tokens(random_prompt(&mut rng, args.prompt_len, vocab));
        let t = Instant::now();
        engine.add_request(i.to_string(), prompt, params)?;
        add_micros.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let first_add = add_micros.first().copied().unwrap_or(0.0);
    let later_adds = add_micros.get(1..).unwrap_or_default();
    // The first step prefills every prompt; the timed steps are pure decode.
    engine.step()?;
    if engine.stats().num_running != args.num_seqs {
        bail!(
            "only {} of {} sequences are running",
            engine.stats().num_running,
            args.num_seqs
        );
    }
    // Engine time = step wall time minus the executor's (copying fixed logits rows).
    let (mut micros, mut exec_micros, mut sample_micros) = (Vec::new(), Vec::new(), Vec::new());
    let mut mask_micros = Vec::new();
    for _ in 0..args.steps {
        let t = Instant::now();
        let outs = engine.step()?;
        let total = t.elapsed();
        let exec = engine.stats().last_execute_time;
        micros.push((total.saturating_sub(exec)).as_secs_f64() * 1e6);
        exec_micros.push(exec.as_secs_f64() * 1e6);
        sample_micros.push(engine.stats().last_sample_time.as_secs_f64() * 1e6);
        mask_micros.push(engine.stats().last_mask_time.as_secs_f64() * 1e6);
        if outs.len() != args.num_seqs {
            bail!(
                "a step produced {} outputs for {} sequences",
                outs.len(),
                args.num_seqs
            );
        }
    }
    let p50 = percentile(&micros, 0.5);
    let report = json!({
        "num_seqs": args.num_seqs,
        "vocab": vocab,
        "detokenizer": args.model.is_some(),
        "temperature": args.temperature,
        "steps": args.steps,
        "us_per_step_p50": p50,
        "us_per_step_mean": mean(&micros),
        "us_per_step_p90": percentile(&micros, 0.9),
        "us_per_seq_p50": p50 / args.num_seqs as f64,
        "executor_us_per_step_p50": percentile(&exec_micros, 0.5),
        "sampler_us_per_step_p50": percentile(&sample_micros, 0.5),
        "structured_outputs": args.structured_outputs,
        "mask_us_per_step_p50": percentile(&mask_micros, 0.5),
        "add_request_us_first": first_add,
        "add_request_us_p50": percentile(later_adds, 0.5),
        "top_p": args.top_p,
        "top_k": args.top_k,
        "repetition_penalty": args.repetition_penalty,
        "logprobs": args.logprobs,
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "engine overhead at {} sequences (vocab {vocab}, detokenizer {}, temperature {}): {:.0} µs/step p50 (mean {:.0}, p90 {:.0}), {:.2} µs per sequence; of which the sampler {:.0} µs and grammar masks {:.0} µs; the fixed-logits executor took {:.0} µs/step more",
            args.num_seqs,
            if args.model.is_some() { "on" } else { "off" },
            args.temperature,
            p50,
            mean(&micros),
            percentile(&micros, 0.9),
            p50 / args.num_seqs as f64,
            percentile(&sample_micros, 0.5),
            percentile(&mask_micros, 0.5),
            percentile(&exec_micros, 0.5)
        );
        println!(
            "add_request (grammar compile included): {:.0} µs p50, the first {:.0} µs",
            percentile(later_adds, 0.5),
            first_add
        );
    }
    Ok(())
}
