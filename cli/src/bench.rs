//! `infer bench latency`: single-stream prefill and decode speed on synthetic prompts, reported
//! as medians over several runs (these machines are shared and noisy).

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use indicatif::ProgressBar;
use infer_core::{Backend, GenerationParams, Generator};
use serde_json::json;

use crate::generate::{init_threads, load_model, BackendKind, CpuWeights};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// One request at a time: prefill tok/s for a prompt, then decode tok/s.
    Latency(LatencyArgs),
}

#[derive(Debug, Args)]
pub struct LatencyArgs {
    #[arg(long)]
    model: String,
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendKind,
    #[arg(long, value_enum, default_value = "packed")]
    cpu_weights: CpuWeights,
    /// Prompt length in tokens (ids drawn deterministically from the vocabulary).
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Tokens generated per run (EOS is ignored).
    #[arg(long, default_value_t = 64)]
    gen_len: usize,
    /// Timed runs after one warm-up run.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Latency(args) => {
            init_threads(args.threads)?;
            match args.backend {
                BackendKind::Cpu => latency(&args.cpu_weights.backend(), &args),
                other => bail!(
                    "the {other:?} backend is not available in this build yet; use --backend cpu"
                ),
            }
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn latency<B: Backend>(backend: &B, args: &LatencyArgs) -> Result<()> {
    if args.runs == 0 || args.prompt_len == 0 || args.gen_len < 2 {
        bail!("--runs and --prompt-len must be at least 1 and --gen-len at least 2");
    }
    let (model, tokenizer) = load_model(backend, &args.model, None)?;
    // Deterministic ids away from the special tokens at the start of most vocabularies.
    let vocab = model.config().vocab_size as u64;
    let prompt: Vec<u32> = (0..args.prompt_len as u64)
        .map(|i| (1000 + i.wrapping_mul(7919)) % vocab.max(1))
        .map(|t| t as u32)
        .collect();
    let params = GenerationParams {
        max_tokens: args.gen_len,
        temperature: 0.0,
        seed: None,
        stop_token_ids: vec![],
    };
    let generator = Generator::new(backend, &model, &tokenizer);
    let bar = ProgressBar::new(args.runs as u64 + 1);
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for run in 0..=args.runs {
        let out = generator.generate(&prompt, &params, &mut |_| {})?;
        bar.inc(1);
        if run > 0 {
            prefill.push(out.prefill_tokens_per_s());
            decode.push(out.decode_tokens_per_s());
        }
    }
    bar.finish_and_clear();
    let (p, d) = (median(prefill.clone()), median(decode.clone()));
    if args.json {
        println!(
            "{}",
            json!({"backend": backend.name(), "prompt_len": args.prompt_len, "gen_len": args.gen_len,
                   "runs": args.runs, "prefill_tok_s_median": p, "decode_tok_s_median": d,
                   "prefill_tok_s": prefill, "decode_tok_s": decode})
        );
    } else {
        let ms = |tps: f64| Duration::from_secs_f64(1.0 / tps.max(1e-9)).as_secs_f64() * 1e3;
        println!(
            "backend: {} | prompt {} tokens, {} generated, {} runs",
            backend.name(),
            args.prompt_len,
            args.gen_len,
            args.runs
        );
        println!(
            "prefill: {p:.1} tok/s (median) | decode: {d:.1} tok/s (median, {:.2} ms/token)",
            ms(d)
        );
    }
    Ok(())
}
