//! `infer generate`: one prompt streamed to stdout, or a JSONL file of prompts run together
//! through the continuous-batching engine.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use infer_core::{ChatMessage, Prompt, RequestMetrics, SamplingParams, Tokenizer};

mod prompts_file;

use crate::model::{AnyEngine, ModelArgs};
use crate::sampling_args::{completion_json, SamplingArgs};

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub load: ModelArgs,
    #[arg(
        long,
        required_unless_present = "prompts_file",
        conflicts_with = "prompts_file"
    )]
    pub prompt: Option<String>,
    /// JSONL, one `{"prompt": "..."}` per line (optionally `"max_tokens"`): all run together.
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Wrap each prompt in the model's chat template as one user message.
    #[arg(long)]
    pub chat: bool,
    /// Print JSON (one object per prompt, in input order) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Prompt text as the model should see it: the chat template applied when asked.
pub fn prompt_ids(tokenizer: &Tokenizer, text: &str, chat: bool) -> Result<Vec<u32>> {
    Ok(if chat {
        let templated = tokenizer.apply_chat_template(&[ChatMessage::user(text)], true)?;
        tokenizer.encode(&templated, false)?
    } else {
        tokenizer.encode(text, true)?
    })
}

pub fn run(args: GenerateArgs) -> Result<()> {
    // Read the prompts before the (slow) model load, so a bad file fails fast.
    let file = match &args.prompts_file {
        Some(path) => Some(prompts_file::read(path)?),
        None => None,
    };
    // Bad sampling flags fail before the model load too.
    let params = args.sampling.params(None)?;
    let (mut engine, tokenizer, name) = args.load.engine()?;
    match file {
        Some(entries) => prompts_file::run(&mut engine, &tokenizer, entries, &args),
        None => {
            let text = args.prompt.as_deref().context("--prompt is required")?;
            let ids = prompt_ids(&tokenizer, text, args.chat)?;
            stream_one(&mut engine, ids, params, args.json, &name)
        }
    }
}

/// Prompt and decode speed of one request from its metrics.
fn speeds(m: &RequestMetrics) -> (f64, f64) {
    let (Some(first), Some(done)) = (m.first_token, m.finished) else {
        return (0.0, 0.0);
    };
    let prefill = m.num_prompt_tokens as f64 / (first - m.arrival).as_secs_f64().max(1e-9);
    let decode =
        m.num_output_tokens.saturating_sub(1) as f64 / (done - first).as_secs_f64().max(1e-9);
    (prefill, decode)
}

fn stream_one(
    engine: &mut AnyEngine,
    ids: Vec<u32>,
    params: SamplingParams,
    json: bool,
    backend_name: &str,
) -> Result<()> {
    let prompt_token_ids = ids.clone();
    // Text streams for one sequence; several are printed when they are all done.
    let stream = !json && params.n == 1 && params.streamable();
    engine.add_request("0", Prompt::Tokens(ids), params)?;
    let mut stdout = std::io::stdout().lock();
    loop {
        for out in engine.step()? {
            if stream {
                for d in &out.deltas {
                    // A closed stdout (e.g. `| head`) must not abort generation with a panic.
                    let _ = stdout
                        .write_all(d.text_delta.as_bytes())
                        .and_then(|_| stdout.flush());
                }
            }
            let Some(outputs) = &out.outputs else {
                continue;
            };
            if json {
                let obj = completion_json(&prompt_token_ids, outputs, out.prompt_logprobs.as_ref());
                writeln!(stdout, "{obj}")?;
                return Ok(());
            }
            if stream {
                writeln!(stdout)?;
            } else {
                for o in outputs {
                    writeln!(
                        stdout,
                        "--- output {} ({})\n{}",
                        o.index, o.finish_reason, o.text
                    )?;
                }
            }
            stdout.flush()?;
            let (prefill, decode) = speeds(&out.metrics);
            let first = &outputs[0];
            eprintln!(
                "prompt tokens: {} | generated tokens: {} | finish: {} | prefill: {prefill:.1} tok/s | decode: {decode:.1} tok/s | backend: {backend_name}",
                prompt_token_ids.len(),
                out.metrics.num_output_tokens,
                first.finish_reason,
            );
            let spec = engine.stats().spec;
            if let Some(rate) = spec.acceptance_rate() {
                eprintln!(
                    "speculative decoding: {} of {} proposed tokens accepted ({:.1}%) | mean acceptance length {:.2}",
                    spec.num_accepted_tokens,
                    spec.num_draft_tokens,
                    rate * 100.0,
                    spec.mean_acceptance_length().unwrap_or(1.0)
                );
            }
            return Ok(());
        }
    }
}
