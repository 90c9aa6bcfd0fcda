//! `infer generate --prompts-file`: every prompt of a JSONL file through the engine at once,
//! results in input order, then one summary line.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use infer_core::{Prompt, Tokenizer};
use serde::Deserialize;
use serde_json::json;

use super::{prompt_ids, GenerateArgs};
use crate::model::AnyEngine;
use crate::sampling_args::completion_json;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub prompt: String,
    #[serde(default)]
    pub max_tokens: Option<usize>,
}

/// Parses the whole file first: a bad line is reported with its number and nothing runs.
pub fn read(path: &Path) -> Result<Vec<Entry>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading prompts file {}", path.display()))?;
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let entry: Entry = serde_json::from_str(line).with_context(|| {
            format!(
                "{}:{}: expected {{\"prompt\": \"...\"}} (optionally \"max_tokens\")",
                path.display(),
                i + 1
            )
        })?;
        entries.push(entry);
    }
    if entries.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(entries)
}

pub fn run(
    engine: &mut AnyEngine,
    tokenizer: &Tokenizer,
    entries: Vec<Entry>,
    args: &GenerateArgs,
) -> Result<()> {
    let mut prompts = Vec::with_capacity(entries.len());
    let mut per_request = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let ids = prompt_ids(tokenizer, &e.prompt, args.chat)
            .with_context(|| format!("prompt {}", i + 1))?;
        prompts.push(Prompt::Tokens(ids));
        per_request.push(
            args.sampling
                .params(e.max_tokens)
                .with_context(|| format!("prompt {}", i + 1))?,
        );
    }
    let bar = ProgressBar::new(prompts.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} requests {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let mut generated = 0usize;
    let results = engine.generate(prompts, &per_request, &mut |done| {
        generated += done.metrics.num_output_tokens;
        bar.inc(1);
        bar.set_message(format!(
            "{:.1} output tok/s",
            generated as f64 / start.elapsed().as_secs_f64().max(1e-9)
        ));
    });
    bar.finish_and_clear();
    let results = results?;
    let elapsed = start.elapsed().as_secs_f64();
    let stats = engine.stats();
    let output_tokens: usize = results.iter().map(|r| r.metrics.num_output_tokens).sum();
    let prompt_tokens: usize = results.iter().map(|r| r.prompt_token_ids.len()).sum();
    // Per request, first token to last: decode speed without the prefill.
    let decode: Vec<f64> = results
        .iter()
        .filter_map(|r| {
            let m = &r.metrics;
            let span = (m.finished? - m.first_token?).as_secs_f64();
            (m.num_output_tokens > 1 && span > 0.0).then(|| (m.num_output_tokens - 1) as f64 / span)
        })
        .collect();
    let summary = json!({"summary": {
        "requests": results.len(),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "elapsed_s": elapsed,
        "output_tokens_per_s": output_tokens as f64 / elapsed.max(1e-9),
        "decode_tok_s_per_request_p50": crate::bench::percentile(&decode, 0.5),
        "preemptions": stats.preemptions,
        "prefix_cache_hit_tokens": stats.prefix_cache_hit_tokens,
        "steps": stats.steps,
        "kv_blocks_saved_by_sharing": saved_fraction(&stats),
        "spec_decode": crate::bench::spec_report(
            &Default::default(),
            &stats.spec,
            engine.speculator().map(|s| s.num_speculative_tokens),
        ),
    }});
    let mut stdout = std::io::stdout().lock();
    for (i, r) in results.iter().enumerate() {
        if args.json {
            let mut obj =
                completion_json(&r.prompt_token_ids, &r.outputs, r.prompt_logprobs.as_ref());
            obj["index"] = json!(i);
            writeln!(stdout, "{obj}")?;
        } else {
            for o in &r.outputs {
                writeln!(stdout, "--- {} ({})\n{}", i + 1, o.finish_reason, o.text)?;
            }
        }
    }
    if args.json {
        writeln!(stdout, "{summary}")?;
    } else {
        eprintln!("{}", summary_line(&summary["summary"]));
    }
    Ok(())
}

/// The summary as one readable line (the JSON form is for `--json`).
fn summary_line(s: &serde_json::Value) -> String {
    format!(
        "requests: {} | prompt tokens: {} | output tokens: {} | {:.2} s | {:.1} output tok/s | preemptions: {} | prefix-cache hit tokens: {}",
        s["requests"],
        s["prompt_tokens"],
        s["output_tokens"],
        s["elapsed_s"].as_f64().unwrap_or(0.0),
        s["output_tokens_per_s"].as_f64().unwrap_or(0.0),
        s["preemptions"],
        s["prefix_cache_hit_tokens"],
    )
}

/// Fraction of block-table entries served by shared blocks, averaged over steps.
pub fn saved_fraction(stats: &infer_core::EngineStats) -> f64 {
    if stats.sum_blocks_logical == 0 {
        return 0.0;
    }
    1.0 - stats.sum_blocks_physical as f64 / stats.sum_blocks_logical as f64
}
