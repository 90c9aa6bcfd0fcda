//! Tensor-parallel launch, with vLLM's flag names: `--tensor-parallel-size/-tp N` under
//! `mpirun`/`srun` (MPI gives every process its rank), or on one node with rank 0 starting
//! the other ranks itself (`mp`, CUDA without MPI). Rank 0 serves; the others run
//! `run_worker`.

#[cfg(unix)]
mod spawned;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use infer_core::parallel::CollectiveStats;
use infer_core::ProcessGroup;
use serde_json::{json, Value};

use crate::backend_kind::BackendKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExecutorBackend {
    /// One process per rank, ranks from an MPI launcher (`mpirun -np N`, `srun`), one node or
    /// many; on CUDA, MPI also hands out the NCCL id (NCCL's documented recipe).
    Mpi,
    /// One node without MPI (vLLM's default there): rank 0 starts the other ranks as child
    /// processes, one GPU each, and NCCL sums their partial results. CUDA only.
    Mp,
    /// One process, one device (tensor-parallel size 1).
    Uni,
}

#[derive(Debug, Clone, Args)]
pub struct ParallelArgs {
    /// Split every layer over N devices/processes (Megatron tensor parallelism; vLLM's
    /// `--tensor-parallel-size`, also `-tp N`). Attention and KV heads and the MLP's columns
    /// must divide by N (KV heads are replicated when N exceeds them).
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// How ranks are launched. Default: `uni` at N = 1; `mpi` under an MPI launcher or on the
    /// cpu backend; `mp` on cuda otherwise.
    #[arg(long, value_enum)]
    pub distributed_executor_backend: Option<ExecutorBackend>,
    /// Seconds a collective inside a step may wait for the other ranks before the whole group
    /// is aborted (a rank died or hangs). Under `mp` it bounds the step hand-off; NCCL's
    /// all-reduces are not bounded (a dead rank ends the group as its process exits).
    #[arg(long, default_value_t = 60)]
    pub collective_timeout: u64,
}

/// vLLM writes `-tp 2`; clap's short flags are one letter, so the spelling is rewritten
/// before parsing.
pub fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    args.map(|a| match a.as_str() {
        "-tp" => "--tensor-parallel-size".to_string(),
        _ => match a.strip_prefix("-tp=") {
            Some(n) => format!("--tensor-parallel-size={n}"),
            None => a,
        },
    })
    .collect()
}

/// Whether this process was started by an MPI launcher (Open MPI, MPICH/Hydra, PMIx, Slurm).
fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// This rank's index among the ranks on its node (the GPU it takes), from the launcher.
pub fn local_rank() -> Option<usize> {
    [
        #[cfg(unix)]
        spawned::RANK_ENV,
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "LOCAL_RANK",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// Workers leave SIGTERM / SIGINT to rank 0: the launcher forwards a stop signal to every
/// rank, and rank 0's bounded shutdown then releases the workers (a dead rank 0 ends the job
/// through the launcher).
pub fn ignore_stop_signals() {
    #[cfg(unix)]
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installs the default "ignore" disposition; no handler code runs.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

static GROUP: OnceLock<Arc<dyn ProcessGroup>> = OnceLock::new();

/// The tensor-parallel group of this process, once `start` made one.
pub fn group() -> Option<Arc<dyn ProcessGroup>> {
    GROUP.get().cloned()
}

/// This rank's collective counters now (`None` without a group).
pub fn collective_snapshot() -> Option<CollectiveStats> {
    group().map(|g| g.stats())
}

/// The collectives' cost per engine step since `before` (rank 0's view, which includes
/// waiting for slower ranks), for benchmark reports.
pub fn collective_report(before: Option<CollectiveStats>, steps: u64) -> Option<Value> {
    let (before, now) = (before?, collective_snapshot()?);
    let steps = steps.max(1) as f64;
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / steps;
    let all_reduces = now.all_reduces - before.all_reduces;
    // CUDA's all-reduces are NCCL's, queued on the stream and timed inside the step: the
    // group sees none of them, so there is nothing to report (null), not zero.
    let (count, time) = match all_reduces {
        0 => (Value::Null, Value::Null),
        n => (
            json!(n as f64 / steps),
            json!(ms(now.all_reduce_time - before.all_reduce_time)),
        ),
    };
    Some(json!({
        "all_reduces_per_step": count,
        "all_reduce_ms_per_step": time,
        "step_handoff_ms_per_step": ms(now.broadcast_time - before.broadcast_time),
    }))
}

/// Prints a `collective_report` line (human-readable bench output).
pub fn print_collectives(report: &Value) {
    if report.is_null() {
        return;
    }
    if report["all_reduces_per_step"].is_null() {
        println!(
            "collectives per step: all-reduces on the device (NCCL, inside the step time), {:.2} ms handing the step to the ranks",
            report["step_handoff_ms_per_step"].as_f64().unwrap_or(0.0)
        );
        return;
    }
    println!(
        "collectives per step: {:.0} all-reduces, {:.2} ms in them, {:.2} ms handing the step to the ranks",
        report["all_reduces_per_step"].as_f64().unwrap_or(0.0),
        report["all_reduce_ms_per_step"].as_f64().unwrap_or(0.0),
        report["step_handoff_ms_per_step"].as_f64().unwrap_or(0.0)
    );
}

/// Keeps the launcher's runtime up until dropped (end of `main`): MPI, or the ranks rank 0
/// started (released on drop).
pub enum Runtime {
    /// One process, or a rank that rank 0 started.
    Single,
    #[cfg(feature = "mpi")]
    Mpi { _mpi: infer_mpi::MpiRuntime },
    #[cfg(unix)]
    Spawned { _ranks: spawned::Ranks },
}

/// Checks the flags against the backend and starts the group: refused before any model
/// is read when the size, the backend or the launch do not fit. `cuda_device` is the GPU
/// of rank 0 (rank i takes the i-th after it).
pub fn start(args: &ParallelArgs, backend: BackendKind, cuda_device: usize) -> Result<Runtime> {
    #[cfg(unix)]
    if let Some((rank, size)) = spawned::worker_env()? {
        // A rank that rank 0 started (`mp`): the same flags, so nothing else to check.
        let timeout = Duration::from_secs(args.collective_timeout.max(1));
        let group = spawned::join(rank, size, timeout)?;
        let _ = GROUP.set(group);
        return Ok(Runtime::Single);
    }
    let tp = args.tensor_parallel_size;
    if tp == 0 {
        bail!("--tensor-parallel-size must be at least 1");
    }
    let executor = args
        .distributed_executor_backend
        .unwrap_or(match (tp, backend) {
            (1, _) => ExecutorBackend::Uni,
            _ if launched_by_mpi() => ExecutorBackend::Mpi,
            (_, BackendKind::Cuda) => ExecutorBackend::Mp,
            _ => ExecutorBackend::Mpi,
        });
    if executor == ExecutorBackend::Uni {
        if tp > 1 {
            bail!(
                "--distributed-executor-backend uni runs one process; --tensor-parallel-size {tp} needs `mpi` (mpirun -np {tp}) or, on cuda, `mp`"
            );
        }
        return Ok(Runtime::Single);
    }
    if backend == BackendKind::Wgpu {
        bail!(
            "--backend wgpu has no collectives: tensor parallelism runs on --backend cpu (MPI) or cuda (NCCL)"
        );
    }
    match executor {
        ExecutorBackend::Mp => start_spawned(args, tp, backend, cuda_device),
        _ => start_mpi(args, tp, backend),
    }
}

/// `mp`: checks that this node has the GPUs and NCCL (so nothing starts that would fail),
/// then starts ranks 1..N as this binary with rank 0's arguments. A rank that fails ends
/// the group, rank 0 included, naming it.
#[cfg(unix)]
fn start_spawned(
    args: &ParallelArgs,
    tp: usize,
    backend: BackendKind,
    cuda_device: usize,
) -> Result<Runtime> {
    if backend != BackendKind::Cuda {
        bail!(
            "--distributed-executor-backend mp runs CUDA ranks (NCCL sums their results); the cpu backend's ranks sum over MPI: use --distributed-executor-backend mpi"
        );
    }
    infer_cuda::check_devices(cuda_device, tp)?;
    let exe = std::env::current_exe()?;
    let args_now = normalize_args(std::env::args().skip(1));
    let timeout = Duration::from_secs(args.collective_timeout.max(1));
    // Called on the main thread, which outlives the children: Linux sends them the
    // parent-death signal when the thread that started them ends.
    let ranks = spawned::spawn(
        tp,
        timeout,
        |_| {
            let mut c = std::process::Command::new(&exe);
            c.args(&args_now);
            c
        },
        |message| {
            eprintln!("infer: {message}: ending the tensor-parallel group");
            // SAFETY: ends this process at once. `_exit` skips the atexit handlers, which
            // could block on a GPU stuck in a collective with the dead rank.
            unsafe { libc::_exit(1) }
        },
    )?;
    let group = ranks.group();
    tracing::info!(group = %group.describe(), "tensor parallel");
    let _ = GROUP.set(group);
    Ok(Runtime::Spawned { _ranks: ranks })
}

#[cfg(not(unix))]
fn start_spawned(_: &ParallelArgs, tp: usize, _: BackendKind, _: usize) -> Result<Runtime> {
    bail!("--distributed-executor-backend mp needs a Unix system: launch the ranks with mpiexec -n {tp} infer ...")
}

#[cfg(feature = "mpi")]
fn start_mpi(args: &ParallelArgs, tp: usize, backend: BackendKind) -> Result<Runtime> {
    if !launched_by_mpi() {
        // One node, no launcher: start the ranks through the MPI launcher on PATH.
        relaunch_under_mpirun(tp, backend)?;
    }
    let (runtime, group) = infer_mpi::init(Duration::from_secs(args.collective_timeout.max(1)))?;
    if group.size() != tp {
        bail!(
            "--tensor-parallel-size {tp} but the launcher started {} processes (mpirun -np {tp})",
            group.size()
        );
    }
    tracing::info!(group = %group.describe(), "tensor parallel");
    let _ = GROUP.set(group);
    Ok(Runtime::Mpi { _mpi: runtime })
}

/// Replaces this process by `mpirun -np N <this command>` (Open MPI's or MPICH's), so
/// `infer serve -tp N` on one node starts its own ranks; signals then go to the launcher,
/// which forwards them. Returns only if that cannot be done.
#[cfg(all(feature = "mpi", unix))]
fn relaunch_under_mpirun(tp: usize, backend: BackendKind) -> Result<()> {
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    let launcher = ["mpirun", "mpiexec"].into_iter().find(|l| {
        Command::new(l)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(launcher) = launcher else {
        bail!(
            "--tensor-parallel-size {tp} runs one process per rank and no MPI launcher (mpirun, mpiexec) is on PATH: install Open MPI or MPICH, or start the ranks yourself (mpirun -np {tp} infer ..., srun)"
        );
    };
    let version = Command::new(launcher).arg("--version").output()?;
    let open_mpi = String::from_utf8_lossy(&version.stdout).contains("Open MPI");
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(launcher);
    cmd.args(["-np", &tp.to_string()]);
    if open_mpi {
        // Threads per rank are infer's business (rayon), not the launcher's core binding; CPU
        // ranks may outnumber cores.
        cmd.args(["--bind-to", "none"]);
        if backend == BackendKind::Cpu {
            cmd.arg("--oversubscribe");
        }
    }
    cmd.arg(exe).args(normalize_args(std::env::args().skip(1)));
    tracing::info!(?cmd, "starting the tensor-parallel ranks");
    let err = cmd.exec();
    bail!("starting {launcher}: {err}")
}

#[cfg(all(feature = "mpi", not(unix)))]
fn relaunch_under_mpirun(tp: usize, _backend: BackendKind) -> Result<()> {
    bail!("--tensor-parallel-size {tp}: launch the ranks with mpiexec -n {tp} infer ...")
}

#[cfg(not(feature = "mpi"))]
fn start_mpi(args: &ParallelArgs, tp: usize, _backend: BackendKind) -> Result<Runtime> {
    let _ = (args.collective_timeout, Duration::ZERO);
    bail!(
        "--tensor-parallel-size {tp} needs MPI, and this infer was built without it: rebuild with `cargo build --release -p infer-cli --features mpi` (needs Open MPI or MPICH and libclang)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_short_flag_is_rewritten() {
        let args = ["infer", "serve", "-tp", "3", "-tp=2", "--tp-x"].map(String::from);
        assert_eq!(
            normalize_args(args.into_iter()),
            [
                "infer",
                "serve",
                "--tensor-parallel-size",
                "3",
                "--tensor-parallel-size=2",
                "--tp-x"
            ]
        );
    }
}
