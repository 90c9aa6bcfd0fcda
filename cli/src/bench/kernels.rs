//! `infer bench kernels`: with `--backend wgpu`, each WGSL kernel at SmolLM2-135M's shapes, timed
//! on the adapter (timestamp queries where it has them); with `--backend cpu`, the CPU backend's
//! matmul on quantized weights at a model's shapes and batch sizes (by default the 1B Llama's
//! matrices: q/o 2048x2048, gate/up 8192x2048, down 2048x8192), as the forward calls it. Each
//! with GFLOP/s and GB/s next to its name.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use infer_core::gguf::GgmlType;
use infer_cpu::bench::{MatmulBench, MatmulCase};
use infer_wgpu::bench::KernelBench;
use infer_wgpu::GpuContext;
use serde_json::json;

use crate::model::{init_threads, BackendKind, CpuWeights};

#[derive(Debug, Args)]
pub struct KernelsArgs {
    #[arg(long, value_enum, default_value = "wgpu")]
    pub backend: BackendKind,
    /// Calls per timed sample (default: 20 on wgpu, 3 on the CPU).
    #[arg(long)]
    pub reps: Option<u32>,
    /// Timed samples per kernel (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub samples: usize,
    #[arg(long)]
    pub json: bool,
    /// CPU: weight types, as ggml names them (default: Q4_K,Q6_K,Q8_0,Q4_1).
    #[arg(long, value_delimiter = ',')]
    pub dtypes: Option<Vec<String>>,
    /// CPU: weight shapes as ROWSxCOLS (default: 2048x2048,8192x2048,2048x8192).
    #[arg(long, value_delimiter = ',')]
    pub shapes: Option<Vec<String>>,
    /// CPU: activation rows per matmul, 1 for single-stream decode (default: 1,4,32,128).
    #[arg(long, value_delimiter = ',')]
    pub rows: Option<Vec<usize>>,
    /// CPU: copies of each matrix are cycled through until at least this many MB of weights
    /// are read between two reads of one matrix, so none stays in the cache (default: 512;
    /// 0 times one matrix, in the cache from the second call).
    #[arg(long)]
    pub footprint_mb: Option<usize>,
    /// CPU: how the backend holds the weights.
    #[arg(long, value_enum)]
    pub cpu_weights: Option<CpuWeights>,
    /// CPU: worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: KernelsArgs) -> Result<()> {
    match args.backend {
        BackendKind::Wgpu => run_wgpu(args),
        BackendKind::Cpu => run_cpu(args),
        BackendKind::Cuda => bail!(
            "kernel benchmarks exist for --backend wgpu and cpu (the CUDA backend is measured \
             end to end by `bench latency` and `bench throughput`)"
        ),
    }
}

fn run_wgpu(args: KernelsArgs) -> Result<()> {
    let cpu_only = [
        ("--dtypes", args.dtypes.is_some()),
        ("--shapes", args.shapes.is_some()),
        ("--rows", args.rows.is_some()),
        ("--footprint-mb", args.footprint_mb.is_some()),
        ("--cpu-weights", args.cpu_weights.is_some()),
        ("--threads", args.threads.is_some()),
    ];
    if let Some((flag, _)) = cpu_only.iter().find(|(_, given)| *given) {
        bail!("{flag} is for --backend cpu (the wgpu benchmark times SmolLM2-135M's kernels)");
    }
    let ctx = GpuContext::new()?;
    let reps = args.reps.unwrap_or(20);
    let bench = KernelBench::new(&ctx, reps, args.samples);
    let bar = ProgressBar::new_spinner().with_message("timing kernels");
    let timings = bench.run_all(&mut |t| bar.set_message(format!("{} {}", t.kernel, t.shape)))?;
    bar.finish_and_clear();
    if args.json {
        let out = json!({
            "adapter": ctx.adapter_name(),
            "clock": bench.clock(),
            "reps": reps,
            "samples": args.samples,
            "kernels": timings,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "adapter: {} | timed by {:?}, median of {} samples x {} calls",
        ctx.adapter_name(),
        bench.clock(),
        args.samples,
        reps
    );
    println!(
        "{:<16} {:<58} {:>10} {:>9} {:>9}",
        "kernel", "shape", "µs", "GFLOP/s", "GB/s"
    );
    for t in &timings {
        println!(
            "{:<16} {:<58} {:>10.1} {:>9.2} {:>9.2}",
            t.kernel, t.shape, t.median_us, t.gflops, t.gbytes_per_s
        );
    }
    Ok(())
}

fn parse_dtype(name: &str) -> Result<GgmlType> {
    let name = name.trim();
    GgmlType::QUANTIZED
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .with_context(|| {
            let known: Vec<_> = GgmlType::QUANTIZED.iter().map(|t| t.name()).collect();
            format!(
                "--dtypes: unknown type {name:?} (known: {})",
                known.join(", ")
            )
        })
}

fn parse_shape(shape: &str) -> Result<(usize, usize)> {
    let parsed = shape
        .trim()
        .split_once(['x', 'X'])
        .and_then(|(n, k)| Some((n.trim().parse().ok()?, k.trim().parse().ok()?)));
    match parsed {
        Some((n, k)) if n > 0 && k > 0 && n * k <= 1 << 30 => Ok((n, k)),
        _ => bail!("--shapes: {shape:?} is not ROWSxCOLS of at most 2^30 weights"),
    }
}

fn run_cpu(args: KernelsArgs) -> Result<()> {
    init_threads(args.threads)?;
    let dtypes = args
        .dtypes
        .unwrap_or_else(|| ["Q4_K", "Q6_K", "Q8_0", "Q4_1"].map(String::from).to_vec())
        .iter()
        .map(|d| parse_dtype(d))
        .collect::<Result<Vec<_>>>()?;
    let shapes = args
        .shapes
        .unwrap_or_else(|| {
            ["2048x2048", "8192x2048", "2048x8192"]
                .map(String::from)
                .to_vec()
        })
        .iter()
        .map(|s| parse_shape(s))
        .collect::<Result<Vec<_>>>()?;
    let rows = args.rows.unwrap_or_else(|| vec![1, 4, 32, 128]);
    if let Some(m) = rows.iter().find(|&&m| m == 0 || m > 4096) {
        bail!("--rows: {m} is not between 1 and 4096");
    }
    let footprint_mb = args.footprint_mb.unwrap_or(512);
    if footprint_mb > 64 << 10 {
        bail!("--footprint-mb: {footprint_mb} is over 64 GB");
    }
    let weights = args.cpu_weights.unwrap_or(CpuWeights::Packed);
    let reps = args.reps.unwrap_or(3) as usize;
    let bench = MatmulBench::new(weights.backend(), reps, args.samples, footprint_mb << 20);
    let mut cases = Vec::new();
    for &dtype in &dtypes {
        for &(n, k) in &shapes {
            if !k.is_multiple_of(dtype.block().0) {
                bail!(
                    "--shapes {n}x{k}: {} rows are whole blocks of {} weights",
                    dtype.name(),
                    dtype.block().0
                );
            }
            cases.extend(rows.iter().map(|&m| MatmulCase { dtype, m, n, k }));
        }
    }
    let isa = infer_cpu::Isa::current();
    let bar = ProgressBar::new(cases.len() as u64);
    let mut timings = Vec::with_capacity(cases.len());
    for case in &cases {
        bar.set_message(format!(
            "{} {}x{} m={}",
            case.dtype.name(),
            case.n,
            case.k,
            case.m
        ));
        timings.push(bench.time(case)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let threads = rayon::current_num_threads();
    if args.json {
        let kernels: Vec<_> = timings
            .iter()
            .map(|t| {
                json!({
                    "dtype": t.case.dtype.name(),
                    "layout": t.layout,
                    "m": t.case.m,
                    "n": t.case.n,
                    "k": t.case.k,
                    "copies": t.copies,
                    "median_us": t.median_us,
                    "gops": t.gops,
                    "gbytes_per_s": t.gbytes_per_s,
                })
            })
            .collect();
        let out = json!({
            "backend": "cpu",
            "isa": isa.name(),
            "threads": threads,
            "reps": reps,
            "samples": args.samples,
            "footprint_mb": footprint_mb,
            "kernels": kernels,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "cpu: {threads} threads, kernels {isa}, median of {} samples x {reps} calls, \
         {footprint_mb} MB of copies cycled",
        args.samples
    );
    println!(
        "{:<8} {:<12} {:>5} {:>12} {:>10} {:>9} {:>9}",
        "type", "layout", "m", "n x k", "µs", "GOP/s", "GB/s"
    );
    for t in &timings {
        println!(
            "{:<8} {:<12} {:>5} {:>12} {:>10.1} {:>9.1} {:>9.2}",
            t.case.dtype.name(),
            t.layout,
            t.case.m,
            format!("{}x{}", t.case.n, t.case.k),
            t.median_us,
            t.gops,
            t.gbytes_per_s
        );
    }
    Ok(())
}
