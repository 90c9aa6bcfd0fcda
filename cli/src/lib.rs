//! The `infer` command line as a library: the binary's `main`, and what the Python package
//! shares with it (the flags of `infer serve`, model loading, the server's state).

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

pub mod backend_kind;
pub mod bench;
pub mod engine_args;
pub mod generate;
pub mod model;
pub mod parallel;
pub mod pooling_args;
pub mod sampling_args;
pub mod serve;
pub mod tokenizer_cmd;
pub mod vllm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "infer", version, about = "LLM inference and serving engine")]
struct Cli {
    /// Log lines as text (colours only on a terminal) or as JSON objects, one per line.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up and moved into the command that runs: the size of the largest
// variant costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streamed) or from a JSONL file of prompts (batched).
    Generate(generate::GenerateArgs),
    /// OpenAI-compatible HTTP server (completions, chat, models, tokenize, metrics, chat page at /).
    /// Takes vLLM's command line: `infer serve MODEL --dtype auto --api-key KEY ...`.
    #[command(args_override_self = true)]
    Serve(serve::ServeArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The model's tokenizer for other tools (`export`: a Hugging Face folder).
    #[command(subcommand)]
    Tokenizer(tokenizer_cmd::TokenizerCommand),
}

/// Logs to stderr: `INFER_LOG` filters (default: `info` for the server, whose access and
/// engine lines operators read, as vLLM's; `warn` otherwise); colours only on a terminal.
fn init_logs(json: bool, serving: bool) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("INFER_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if serving { "info" } else { "warn" })
    });
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// `infer`'s entry point: parses the command line and runs the command.
pub fn main() {
    let args = match vllm::rewrite(parallel::normalize_args(std::env::args())) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let cli = Cli::parse_from(args.args);
    init_logs(
        cli.log_format == "json",
        matches!(cli.command, Command::Serve(_)),
    );
    for note in &args.notes {
        tracing::info!("{note}");
    }
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

impl Command {
    /// The model flags of commands that run a model.
    fn model_args(&self) -> Option<&model::ModelArgs> {
        match self {
            Command::Generate(a) => Some(&a.load),
            Command::Serve(a) => Some(&a.model),
            Command::Bench(b) => b.model_args(),
            Command::Tokenizer(_) => None,
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    // Ranks start (MPI, or rank 0 starting them: mp) before anything else; ranks other than
    // 0 only run the steps rank 0 sends, whichever command was given. `_ranks` keeps MPI up,
    // or rank 0's hold on the ranks it started, until the command is done.
    let _ranks = match cli.command.model_args() {
        Some(m) => {
            let runtime = parallel::start(&m.parallel, m.backend, m.cuda_device)?;
            if parallel::group().is_some_and(|g| g.rank() != 0) {
                parallel::ignore_stop_signals();
                return m.run_worker();
            }
            Some(runtime)
        }
        None => None,
    };
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Serve(args) => serve::run(args),
        Command::Tokenizer(cmd) => tokenizer_cmd::run(cmd),
    }
}

/// `infer serve`'s flags from an argument list written as on the command line after
/// `infer serve` (vLLM's spellings, `-tp`, `--config` files), for front ends other than the
/// command line (the Python package); the notes are what the rewrite accepted and dropped.
pub fn serve_args(args: Vec<String>) -> Result<(serve::ServeArgs, Vec<String>)> {
    let full = ["infer".to_string(), "serve".to_string()]
        .into_iter()
        .chain(args);
    let rewritten = vllm::rewrite(parallel::normalize_args(full))?;
    let cli = Cli::try_parse_from(rewritten.args).map_err(|e| anyhow::anyhow!("{e}"))?;
    match cli.command {
        Command::Serve(args) => Ok((args, rewritten.notes)),
        _ => anyhow::bail!("not a serve command line"),
    }
}
