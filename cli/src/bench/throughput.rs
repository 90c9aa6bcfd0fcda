//! `infer bench throughput`: N requests submitted at once; requests/s and tokens/s.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use infer_core::{Executor, Prompt, SamplingParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use serde_json::json;

use super::{random_prompt, ModelArgs};
use crate::parallel;

#[derive(Debug, Args)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 32)]
    pub num_prompts: usize,
    /// Prompt length in tokens (random ids), unless `--dataset` is given.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens to generate per request (a dataset entry's `output_len` wins).
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    /// Draw lengths uniformly from [len × (1 − r), len × (1 + r)].
    #[arg(long, default_value_t = 0.0)]
    pub range_ratio: f64,
    /// JSON array (or JSONL) of `{"prompt": "...", "output_len": n}`.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Generate exactly the output length, never stopping at EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Parallel samples per request (sharing the prompt's blocks).
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Beam search with this many beams instead of sampling.
    #[arg(long)]
    pub beam_width: Option<usize>,
    /// Sampling temperature (vLLM's benchmark samples at 1; 0 is greedy).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Deserialize)]
struct DatasetEntry {
    prompt: String,
    #[serde(default)]
    output_len: Option<usize>,
}

fn read_dataset(path: &PathBuf) -> Result<Vec<DatasetEntry>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if let Ok(v) = serde_json::from_str::<Vec<DatasetEntry>>(&text) {
        return Ok(v);
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!(
                    "{}:{}: expected {{\"prompt\": ..., \"output_len\": ...}}",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "lengths near `len`, rounded, at least 1 (a float past usize saturates)"
)]
fn draw(rng: &mut StdRng, len: usize, ratio: f64) -> usize {
    let lo = ((len as f64) * (1.0 - ratio)).round().max(1.0) as usize;
    let hi = ((len as f64) * (1.0 + ratio)).round().max(lo as f64) as usize;
    rng.random_range(lo..=hi)
}

pub fn run(args: ThroughputArgs) -> Result<()> {
    if args.num_prompts == 0 || args.input_len == 0 || args.output_len == 0 {
        bail!("--num-prompts, --input-len and --output-len must be at least 1");
    }
    if !(0.0..1.0).contains(&args.range_ratio) {
        bail!("--range-ratio must be in [0, 1)");
    }
    let dataset = args.dataset.as_ref().map(read_dataset).transpose()?;
    let (mut engine, tokenizer, backend) = args.model.engine()?;
    let vocab = engine.executor().vocab_size();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut prompts = Vec::new();
    let mut params = Vec::new();
    for i in 0..args.num_prompts {
        let (ids, out_len) = match &dataset {
            Some(d) if d.is_empty() => bail!("the dataset is empty"),
            Some(d) => {
                let e = &d[i % d.len()];
                (
                    tokenizer.encode(&e.prompt, true)?,
                    e.output_len.unwrap_or(args.output_len),
                )
            }
            None => {
                let n = draw(&mut rng, args.input_len, args.range_ratio);
                (
                    random_prompt(&mut rng, n, vocab),
                    draw(&mut rng, args.output_len, args.range_ratio),
                )
            }
        };
        prompts.push(Prompt::Tokens(ids));
        let p = SamplingParams {
            max_tokens: Some(out_len),
            seed: Some(args.seed + i as u64),
            ignore_eos: args.ignore_eos,
            n: args.n,
            best_of: args.beam_width,
            use_beam_search: args.beam_width.is_some(),
            temperature: if args.beam_width.is_some() {
                0.0
            } else {
                args.temperature
            },
            ..Default::default()
        };
        p.validate()?;
        params.push(p);
    }
    // Warm-up: one short request (thread pool, page faults of the first KV blocks).
    let warm = SamplingParams {
        max_tokens: Some(2),
        ..params[0].clone()
    };
    engine.generate(
        vec![Prompt::Tokens(random_prompt(&mut rng, 8, vocab))],
        &[warm],
        &mut |_| {},
    )?;

    let before = engine.stats();
    let collectives_before = parallel::collective_snapshot();
    let bar = ProgressBar::new(prompts.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} requests {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let results = engine.generate(prompts, &params, &mut |_| bar.inc(1))?;
    let elapsed = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let stats = engine.stats();
    // Every sampled token counts (all n samples, every beam extension).
    let output = usize::try_from(stats.output_tokens - before.output_tokens).unwrap_or(usize::MAX);
    let saved = {
        let logical = stats.sum_blocks_logical - before.sum_blocks_logical;
        let physical = stats.sum_blocks_physical - before.sum_blocks_physical;
        1.0 - physical as f64 / logical.max(1) as f64
    };
    let input: usize = results.iter().map(|r| r.prompt_token_ids.len()).sum();
    let n = results.len() as f64;
    let cfg = engine.config();
    let report = json!({
        "backend": backend,
        "num_prompts": results.len(),
        "max_num_seqs": cfg.scheduler.max_num_seqs,
        "max_num_batched_tokens": cfg.scheduler.max_num_batched_tokens,
        "num_kv_blocks": cfg.num_device_blocks,
        "input_tokens": input,
        "output_tokens": output,
        "elapsed_s": elapsed,
        "requests_per_s": n / elapsed,
        "output_tokens_per_s": output as f64 / elapsed,
        "total_tokens_per_s": (input + output) as f64 / elapsed,
        "preemptions": stats.preemptions - before.preemptions,
        "prefix_cache_hit_tokens": stats.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens,
        "steps": stats.steps - before.steps,
        "n": args.n,
        "beam_width": args.beam_width,
        "kv_blocks_saved_by_sharing": saved,
        "collectives": parallel::collective_report(collectives_before, stats.steps - before.steps),
        "spec_decode": super::spec_report(
            &before.spec,
            &stats.spec,
            engine.speculator().map(|s| s.num_speculative_tokens)
        ),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "backend: {backend} | {} requests, {input} prompt + {output} output tokens, max {} concurrent",
            results.len(),
            cfg.scheduler.max_num_seqs
        );
        println!(
            "throughput: {:.2} requests/s, {:.1} output tok/s, {:.1} total tok/s ({:.1} s, {} preemptions)",
            n / elapsed,
            output as f64 / elapsed,
            (input + output) as f64 / elapsed,
            elapsed,
            report["preemptions"]
        );
        println!(
            "KV blocks saved by sharing (mean over steps): {:.1}%",
            saved * 100.0
        );
        parallel::print_collectives(&report["collectives"]);
        super::print_spec(&report["spec_decode"]);
    }
    Ok(())
}
