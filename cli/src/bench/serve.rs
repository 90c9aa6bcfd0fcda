//! `infer bench serve`: load on a running OpenAI-compatible server (ours, vLLM, anything that
//! streams `/v1/completions` and has `/tokenize`), like vLLM's benchmark_serving: requests
//! arrive at `--request-rate` (Poisson or fixed gaps; `inf` = all at once), at most
//! `--max-concurrency` in flight, each streamed; reports vLLM's metric names.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::percentile;
use super::serve_client::{RequestResult, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Arrivals {
    /// Exponential gaps with mean 1 / rate.
    Poisson,
    /// Every 1 / rate seconds.
    Fixed,
}

#[derive(Debug, Args)]
pub struct ServeBenchArgs {
    /// The server, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub url: String,
    /// Model name to send (default: the first of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, env = "INFER_API_KEY")]
    pub api_key: Option<String>,
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// Prompt length in tokens (random words, tokenized by the server).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens generated per request (EOS ignored).
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    /// Requests per second (`inf`: all arrive at once).
    #[arg(long, default_value = "inf")]
    pub request_rate: f64,
    #[arg(long, value_enum, default_value = "poisson")]
    pub arrivals: Arrivals,
    /// Most requests in flight (default: no limit).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

/// A counting semaphore for `--max-concurrency`.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn acquire(&self) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
    }

    fn release(&self) {
        *self.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.freed.notify_one();
    }
}

const WORDS: &[&str] = &[
    "time", "river", "light", "people", "house", "green", "music", "water", "story", "city",
    "paper", "garden", "morning", "window", "stone", "market", "winter", "bridge", "letter",
    "forest", "number", "table", "mountain", "summer", "island", "engine", "silver", "voice",
    "answer", "little", "quiet", "yellow", "travel", "school", "kitchen", "doctor", "animal",
    "history", "ocean", "road", "family", "picture", "question", "orange", "planet", "bread",
];

/// `len` token ids of random words (tokenized by the server, so they are valid for its model
/// and rarely share a prefix with another prompt).
fn random_prompt(target: &Target, rng: &mut StdRng, len: usize) -> Result<Vec<u32>> {
    let text: Vec<&str> = (0..len + 8)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect();
    let ids = target.tokenize(&text.join(" "))?;
    if ids.len() < len {
        bail!(
            "the server's tokenizer gave {} ids for {} words",
            ids.len(),
            len + 8
        );
    }
    Ok(ids[..len].to_vec())
}

/// Seconds between arrivals.
fn next_gap(args: &ServeBenchArgs, rng: &mut StdRng) -> f64 {
    if !args.request_rate.is_finite() {
        return 0.0;
    }
    match args.arrivals {
        Arrivals::Fixed => 1.0 / args.request_rate,
        Arrivals::Poisson => -(1.0 - rng.random::<f64>()).ln() / args.request_rate,
    }
}

pub fn run(args: ServeBenchArgs) -> Result<()> {
    if args.num_prompts == 0 || args.input_len == 0 || args.output_len < 2 {
        bail!("--num-prompts and --input-len must be at least 1, --output-len at least 2");
    }
    if args.request_rate.is_nan() || args.request_rate <= 0.0 {
        bail!("--request-rate must be > 0 (or inf)");
    }
    if args.max_concurrency == Some(0) {
        bail!("--max-concurrency must be at least 1");
    }
    let base = args.url.trim_end_matches('/').to_string();
    let mut target = Target {
        base,
        model: String::new(),
        api_key: args.api_key.clone(),
    };
    target.model = match &args.model {
        Some(m) => m.clone(),
        None => target
            .served_model()
            .with_context(|| format!("asking {} for its model", args.url))?,
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut prompts = (0..=args.num_prompts)
        .map(|_| random_prompt(&target, &mut rng, args.input_len))
        .collect::<Result<Vec<_>>>()
        .context("building prompts")?;
    // One request first, as vLLM does: a wrong URL or model fails here, not 64 times. Its
    // prompt is an extra one, so no measured prompt finds its blocks in the prefix cache.
    let probe = prompts.pop().unwrap_or_default();
    target
        .complete(&probe, 2)
        .context("the initial test request failed")?;

    let target = Arc::new(target);
    let slots = Arc::new(Slots {
        free: Mutex::new(args.max_concurrency.unwrap_or(usize::MAX)),
        freed: Condvar::new(),
    });
    let (tx, rx) = mpsc::channel();
    let bar = ProgressBar::new(args.num_prompts as u64);
    let start = Instant::now();
    let mut arrival = 0.0;
    for prompt in prompts {
        arrival += next_gap(&args, &mut rng);
        let due = start + Duration::from_secs_f64(arrival);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        slots.acquire();
        let (target, slots, tx) = (target.clone(), slots.clone(), tx.clone());
        let output_len = args.output_len;
        std::thread::spawn(move || {
            let r = target.complete(&prompt, output_len);
            slots.release();
            let _ = tx.send(r);
        });
    }
    drop(tx);
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for r in rx {
        bar.inc(1);
        match r {
            Ok(r) => results.push(r),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    let duration = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if let Some(first) = failures.first() {
        eprintln!("{} requests failed; the first: {first}", failures.len());
    }
    let report = report(&args, &results, failures.len(), duration);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    if results.is_empty() {
        bail!("every request failed");
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// vLLM's result keys: `completed`, `request_throughput`, `{mean,median,p99}_{ttft,tpot,itl,e2el}_ms`.
fn report(args: &ServeBenchArgs, rs: &[RequestResult], failed: usize, duration: f64) -> Value {
    let input: usize = rs.iter().map(|r| r.prompt_len).sum();
    let output: usize = rs.iter().map(|r| r.output_tokens).sum();
    let ttft: Vec<f64> = rs.iter().map(|r| ms(r.ttft)).collect();
    let tpot: Vec<f64> = rs
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| (ms(r.latency) - ms(r.ttft)) / (r.output_tokens - 1) as f64)
        .collect();
    let itl: Vec<f64> = rs
        .iter()
        .flat_map(|r| r.itl.iter().map(|&d| ms(d)))
        .collect();
    let e2el: Vec<f64> = rs.iter().map(|r| ms(r.latency)).collect();
    let mut v = Map::new();
    let rate = if args.request_rate.is_finite() {
        json!(args.request_rate)
    } else {
        json!("inf")
    };
    v.insert("request_rate".into(), rate);
    v.insert("max_concurrency".into(), json!(args.max_concurrency));
    v.insert("completed".into(), json!(rs.len()));
    v.insert("failed".into(), json!(failed));
    v.insert("duration".into(), json!(duration));
    v.insert("total_input_tokens".into(), json!(input));
    v.insert("total_output_tokens".into(), json!(output));
    v.insert(
        "request_throughput".into(),
        json!(rs.len() as f64 / duration),
    );
    v.insert("output_throughput".into(), json!(output as f64 / duration));
    v.insert(
        "total_token_throughput".into(),
        json!((input + output) as f64 / duration),
    );
    for (name, xs) in [
        ("ttft", &ttft),
        ("tpot", &tpot),
        ("itl", &itl),
        ("e2el", &e2el),
    ] {
        let mean = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        v.insert(format!("mean_{name}_ms"), json!(mean));
        v.insert(format!("median_{name}_ms"), json!(percentile(xs, 0.5)));
        v.insert(format!("p99_{name}_ms"), json!(percentile(xs, 0.99)));
    }
    Value::Object(v)
}

fn print_report(v: &Value) {
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!("{:=^50}", " Serving Benchmark Result ");
    println!("{:<40}{:<10}", "Successful requests:", v["completed"]);
    println!("{:<40}{:<10}", "Failed requests:", v["failed"]);
    println!(
        "{:<40}{:<10}",
        "Maximum request concurrency:", v["max_concurrency"]
    );
    println!("{:<40}{:<10.2}", "Benchmark duration (s):", f("duration"));
    println!(
        "{:<40}{:<10}",
        "Total input tokens:", v["total_input_tokens"]
    );
    println!(
        "{:<40}{:<10}",
        "Total generated tokens:", v["total_output_tokens"]
    );
    println!(
        "{:<40}{:<10.2}",
        "Request throughput (req/s):",
        f("request_throughput")
    );
    println!(
        "{:<40}{:<10.2}",
        "Output token throughput (tok/s):",
        f("output_throughput")
    );
    println!(
        "{:<40}{:<10.2}",
        "Total Token throughput (tok/s):",
        f("total_token_throughput")
    );
    for (name, title) in [
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st token)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
    ] {
        println!("{:-^50}", title);
        let upper = name.to_uppercase();
        for stat in ["mean", "median", "p99"] {
            let label = format!("{} {upper} (ms):", capitalize(stat));
            println!("{label:<40}{:<10.2}", f(&format!("{stat}_{name}_ms")));
        }
    }
    println!("{}", "=".repeat(50));
}

fn capitalize(s: &str) -> String {
    match s {
        "p99" => "P99".into(),
        _ => s[..1].to_uppercase() + &s[1..],
    }
}
