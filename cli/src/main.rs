//! `infer`: LLM inference from the command line.

mod bench;
mod engine_args;
mod generate;
mod model;
mod prompts_file;
mod sampling_args;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "infer", version, about = "LLM inference and serving engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streamed) or from a JSONL file of prompts (batched).
    Generate(generate::GenerateArgs),
    /// OpenAI-compatible HTTP server (completions, chat, models, tokenize, metrics, chat page at /).
    Serve(serve::ServeArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("INFER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Serve(args) => serve::run(args),
    }
}
