//! `infer bench latency`: a batch of requests at a time (like vLLM's benchmark_latency):
//! end-to-end latency mean and percentiles, plus time to first token and decode speed.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use infer_core::{Executor, Prompt, SamplingParams};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;

use super::{mean, percentile, random_prompt, ModelArgs};
use crate::parallel;

#[derive(Debug, Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Requests submitted together per iteration.
    #[arg(long, default_value_t = 1)]
    pub batch_size: usize,
    /// Prompt length in tokens (random ids).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens generated per request (EOS is ignored).
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    #[arg(long, default_value_t = 1)]
    pub num_iters_warmup: usize,
    #[arg(long, default_value_t = 5)]
    pub num_iters: usize,
    /// Constrain every request, as vLLM's `structured_outputs` (e.g. `{"regex": "[a-z ]+"}`):
    /// the step time with grammar masks. A constraint the model completes early ends its
    /// requests early, which shortens the run.
    #[arg(long, value_name = "JSON")]
    pub structured_outputs: Option<String>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: LatencyArgs) -> Result<()> {
    if args.num_iters == 0 || args.batch_size == 0 || args.input_len == 0 || args.output_len < 2 {
        bail!(
            "--num-iters, --batch-size and --input-len must be at least 1, --output-len at least 2"
        );
    }
    let (mut engine, _tokenizer, backend) = args.model.engine()?;
    let vocab = engine.executor().vocab_size();
    let mut rng = StdRng::seed_from_u64(0);
    let structured_outputs = match &args.structured_outputs {
        Some(s) => {
            Some(serde_json::from_str(s).with_context(|| format!("--structured-outputs `{s}`"))?)
        }
        None => None,
    };
    let params = SamplingParams {
        ignore_eos: true,
        structured_outputs,
        ..SamplingParams::greedy(args.output_len)
    };
    let bar = ProgressBar::new((args.num_iters_warmup + args.num_iters) as u64);
    let (mut latency, mut ttft, mut decode) = (Vec::new(), Vec::new(), Vec::new());
    let (mut steps_before, mut collectives_before) = (0, None);
    let mut spec_before = engine.stats().spec;
    for iter in 0..args.num_iters_warmup + args.num_iters {
        if iter == args.num_iters_warmup {
            steps_before = engine.stats().steps;
            spec_before = engine.stats().spec;
            collectives_before = parallel::collective_snapshot();
        }
        let prompts = (0..args.batch_size)
            .map(|_| Prompt::Tokens(random_prompt(&mut rng, args.input_len, vocab)))
            .collect();
        let start = Instant::now();
        let results = engine.generate(prompts, std::slice::from_ref(&params), &mut |_| {})?;
        let elapsed = start.elapsed().as_secs_f64();
        bar.inc(1);
        if iter < args.num_iters_warmup {
            continue;
        }
        latency.push(elapsed);
        for r in &results {
            let m = &r.metrics;
            if let (Some(first), Some(done)) = (m.first_token, m.finished) {
                ttft.push((first - m.arrival).as_secs_f64());
                decode.push(
                    (m.num_output_tokens - 1) as f64 / (done - first).as_secs_f64().max(1e-9),
                );
            }
        }
    }
    bar.finish_and_clear();
    let report = json!({
        "backend": backend,
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_iters": args.num_iters,
        "latency_mean_s": mean(&latency),
        "latency_p50_s": percentile(&latency, 0.5),
        "latency_p90_s": percentile(&latency, 0.9),
        "latency_p99_s": percentile(&latency, 0.99),
        "ttft_p50_s": percentile(&ttft, 0.5),
        "decode_tok_s_per_request_p50": percentile(&decode, 0.5),
        "latencies_s": latency,
        "collectives": parallel::collective_report(
            collectives_before,
            engine.stats().steps - steps_before
        ),
        "spec_decode": super::spec_report(
            &spec_before,
            &engine.stats().spec,
            engine.speculator().map(|s| s.num_speculative_tokens)
        ),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "backend: {backend} | batch {} × ({} prompt + {} output tokens), {} iterations",
            args.batch_size, args.input_len, args.output_len, args.num_iters
        );
        println!(
            "latency: mean {:.3} s | p50 {:.3} s | p90 {:.3} s | p99 {:.3} s",
            mean(&latency),
            percentile(&latency, 0.5),
            percentile(&latency, 0.9),
            percentile(&latency, 0.99)
        );
        println!(
            "time to first token p50: {:.1} ms | decode per request p50: {:.1} tok/s | prompt {:.1} tok/s",
            percentile(&ttft, 0.5) * 1e3,
            percentile(&decode, 0.5),
            (args.input_len * args.batch_size) as f64 / percentile(&ttft, 0.5).max(1e-9)
        );
        parallel::print_collectives(&report["collectives"]);
        super::print_spec(&report["spec_decode"]);
    }
    Ok(())
}
