//! `infer generate`: one prompt, streamed to stdout, with a timing summary (or one JSON object).

use std::io::Write;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use infer_core::{
    open_model, Backend, ChatMessage, GenerationParams, Generator, LlamaModel, ModelFiles,
    Tokenizer,
};
use infer_cpu::CpuBackend;
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    Cpu,
    Wgpu,
    Cuda,
}

/// How the CPU backend holds Q4_0 / Q4_1 / Q8_0 weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CpuWeights {
    /// As stored, decoded inside the matmul (fast).
    Packed,
    /// Dequantized to f32 at load (the plain reference path).
    F32,
}

impl CpuWeights {
    pub fn backend(self) -> CpuBackend {
        match self {
            CpuWeights::Packed => CpuBackend::new(),
            CpuWeights::F32 => CpuBackend::f32_weights(),
        }
    }
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// GGUF file, HF model directory, or Hugging Face hub id (org/name).
    #[arg(long)]
    model: String,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 samples greedily.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    chat: bool,
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendKind,
    #[arg(long, value_enum, default_value = "packed")]
    cpu_weights: CpuWeights,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Cap the context length (default: the model's).
    #[arg(long)]
    max_model_len: Option<usize>,
}

/// Builds rayon's global pool (default: one thread per core). The calling thread is one of the
/// workers, so the forward's parallel ops start without a hand-off to another thread.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    if threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .use_current_thread()
        .build_global()
        .context("configuring the thread pool")
}

pub fn run(args: GenerateArgs) -> Result<()> {
    init_threads(args.threads)?;
    match args.backend {
        BackendKind::Cpu => run_with(&args.cpu_weights.backend(), &args),
        BackendKind::Wgpu | BackendKind::Cuda => bail!(
            "the {:?} backend is not available in this build yet; use --backend cpu",
            args.backend
        ),
    }
}

fn load_progress() -> ProgressBar {
    ProgressBar::new(0).with_style(
        ProgressStyle::with_template("loading weights {bar:30} {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// Opens a model and uploads its weights to `backend`, with a progress bar; the weight files
/// are released once uploaded.
pub fn load_model<B: Backend>(
    backend: &B,
    spec: &str,
    max_model_len: Option<usize>,
) -> Result<(LlamaModel<B>, Tokenizer)> {
    let ModelFiles {
        config,
        weights,
        tokenizer,
        location,
    } = open_model(spec)?;
    tracing::info!(?location, backend = backend.name(), "loading model");
    let bar = load_progress();
    let model = LlamaModel::load(
        backend,
        &config,
        weights.as_ref(),
        max_model_len,
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    Ok((model, tokenizer))
}

fn run_with<B: Backend>(backend: &B, args: &GenerateArgs) -> Result<()> {
    let (model, tokenizer) = load_model(backend, &args.model, args.max_model_len)?;

    let (text, add_special) = if args.chat {
        (
            tokenizer.apply_chat_template(&[ChatMessage::user(&args.prompt)], true)?,
            false,
        )
    } else {
        (args.prompt.clone(), true)
    };
    let prompt_ids = tokenizer.encode(&text, add_special)?;
    let params = GenerationParams {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        seed: args.seed,
        stop_token_ids: tokenizer.eos_token_ids().to_vec(),
    };
    let generator = Generator::new(backend, &model, &tokenizer);
    let mut stdout = std::io::stdout().lock();
    let out = generator.generate(&prompt_ids, &params, &mut |delta| {
        if !args.json {
            // A closed stdout (e.g. `| head`) must not abort generation with a panic.
            let _ = stdout
                .write_all(delta.as_bytes())
                .and_then(|_| stdout.flush());
        }
    })?;
    if args.json {
        let obj = json!({
            "prompt_token_ids": out.prompt_token_ids,
            "token_ids": out.token_ids,
            "text": out.text,
            "finish_reason": out.finish_reason,
        });
        writeln!(stdout, "{obj}")?;
    } else {
        writeln!(stdout)?;
        stdout.flush()?;
        eprintln!(
            "prompt tokens: {} | generated tokens: {} | finish: {:?} | prefill: {:.1} tok/s | decode: {:.1} tok/s | backend: {}",
            out.prompt_token_ids.len(),
            out.token_ids.len(),
            out.finish_reason,
            out.prefill_tokens_per_s(),
            out.decode_tokens_per_s(),
            backend.name(),
        );
    }
    Ok(())
}
