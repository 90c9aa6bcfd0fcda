//! `infer tokenizer export MODEL DIR`: the model's tokenizer as a Hugging Face folder, for
//! benchmark and evaluation tools that load one (`AutoTokenizer.from_pretrained(DIR)`:
//! guidellm's `--processor`, aiperf's `--tokenizer`) when the model is a GGUF.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use infer_core::{open_request, LoadRequest, WeightsFrom};

#[derive(Debug, Subcommand)]
pub enum TokenizerCommand {
    /// Write tokenizer.json, tokenizer_config.json (special tokens, chat template, context
    /// length) and special_tokens_map.json to DIR; the ids equal the server's `/tokenize`.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// GGUF file, HF model directory or hub id.
    pub model: String,
    /// The folder to write (created if missing).
    pub dir: PathBuf,
    /// A Jinja chat template to write instead of the model's (as `serve --chat-template`).
    #[arg(long)]
    pub chat_template: Option<String>,
}

pub fn run(cmd: TokenizerCommand) -> Result<()> {
    let TokenizerCommand::Export(args) = cmd;
    let opened = open_request(&LoadRequest {
        model: &args.model,
        weights: WeightsFrom::File,
        tokenizer: None,
        chat_template: args.chat_template.as_deref(),
    })
    .with_context(|| format!("opening {}", args.model))?;
    let context = opened.config.max_position_embeddings;
    opened
        .tokenizer
        .save_hf_dir(&args.dir, context)
        .with_context(|| format!("writing {}", args.dir.display()))?;
    eprintln!(
        "wrote {} (vocabulary {}, context {context})",
        args.dir.display(),
        opened.tokenizer.vocab_size()
    );
    Ok(())
}
