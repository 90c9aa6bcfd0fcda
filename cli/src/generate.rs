//! `infer generate`: one prompt streamed to stdout, or a JSONL file of prompts run together
//! through the continuous-batching engine.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use infer_core::{
    Backend, ChatMessage, Engine, GenerationParams, LlamaExecutor, Prompt, RequestMetrics,
    Tokenizer,
};
use serde_json::json;

use crate::model::ModelArgs;
use crate::prompts_file;

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
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 samples greedily.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long)]
    pub seed: Option<u64>,
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
    let (mut engine, tokenizer, name) = args.load.engine()?;
    let params = |max_tokens: Option<usize>| GenerationParams {
        max_tokens: max_tokens.unwrap_or(args.max_tokens),
        temperature: args.temperature,
        seed: args.seed,
        stop_token_ids: tokenizer.eos_token_ids().to_vec(),
    };
    match file {
        Some(entries) => prompts_file::run(&mut engine, &tokenizer, entries, &args, &params),
        None => {
            let text = args.prompt.as_deref().context("--prompt is required")?;
            let ids = prompt_ids(&tokenizer, text, args.chat)?;
            stream_one(&mut engine, ids, params(None), args.json, &name)
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

fn stream_one<B: Backend>(
    engine: &mut Engine<LlamaExecutor<B>>,
    ids: Vec<u32>,
    params: GenerationParams,
    json: bool,
    backend_name: &str,
) -> Result<()> {
    let prompt_token_ids = ids.clone();
    engine.add_request("0", Prompt::Tokens(ids), params)?;
    let mut stdout = std::io::stdout().lock();
    let mut token_ids: Vec<u32> = Vec::new();
    let mut text = String::new();
    loop {
        for out in engine.step()? {
            token_ids.extend(&out.new_token_ids);
            text.push_str(&out.text_delta);
            if !json {
                // A closed stdout (e.g. `| head`) must not abort generation with a panic.
                let _ = stdout
                    .write_all(out.text_delta.as_bytes())
                    .and_then(|_| stdout.flush());
            }
            let Some(reason) = out.finish_reason else {
                continue;
            };
            if json {
                let obj = json!({
                    "prompt_token_ids": prompt_token_ids,
                    "token_ids": token_ids,
                    "text": text,
                    "finish_reason": reason,
                });
                writeln!(stdout, "{obj}")?;
            } else {
                writeln!(stdout)?;
                stdout.flush()?;
                let (prefill, decode) = speeds(&out.metrics);
                eprintln!(
                    "prompt tokens: {} | generated tokens: {} | finish: {reason:?} | prefill: {prefill:.1} tok/s | decode: {decode:.1} tok/s | backend: {backend_name}",
                    prompt_token_ids.len(),
                    token_ids.len(),
                );
            }
            return Ok(());
        }
    }
}
