//! `infer bench kernels --backend wgpu`: each WGSL kernel at SmolLM2-135M's shapes, timed on the
//! adapter (timestamp queries where it has them), with GFLOP/s and GB/s next to its name.

use anyhow::{bail, Result};
use clap::Args;
use indicatif::ProgressBar;
use infer_wgpu::bench::KernelBench;
use infer_wgpu::GpuContext;
use serde_json::json;

use crate::model::BackendKind;

#[derive(Debug, Args)]
pub struct KernelsArgs {
    #[arg(long, value_enum, default_value = "wgpu")]
    pub backend: BackendKind,
    /// Calls per timed sample.
    #[arg(long, default_value_t = 20)]
    pub reps: u32,
    /// Timed samples per kernel (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub samples: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: KernelsArgs) -> Result<()> {
    if args.backend != BackendKind::Wgpu {
        bail!("kernel benchmarks exist for --backend wgpu (the CPU backend's ops are measured end to end by `bench throughput`)");
    }
    let ctx = GpuContext::new()?;
    let bench = KernelBench::new(&ctx, args.reps, args.samples);
    let bar = ProgressBar::new_spinner().with_message("timing kernels");
    let timings = bench.run_all(&mut |t| bar.set_message(format!("{} {}", t.kernel, t.shape)))?;
    bar.finish_and_clear();
    if args.json {
        let out = json!({
            "adapter": ctx.adapter_name(),
            "clock": bench.clock(),
            "reps": args.reps,
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
        args.reps
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
