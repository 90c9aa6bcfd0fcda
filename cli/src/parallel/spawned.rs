//! `--distributed-executor-backend mp`: tensor parallelism on one node without MPI (vLLM's
//! default there). Rank 0 starts the other ranks as child processes of its own binary, each
//! with one end of a Unix socket pair as its standard input. Rank 0 sends every step down the
//! sockets and reads the ranks' replies (the KV pool each can hold) back. vLLM's
//! multiprocessing executor does the same with its message queue.
//!
//! Nothing here sums tensors: the all-reduces inside the forward are NCCL's (CUDA), so the
//! CPU backend, whose all-reduce is MPI's, is refused.
//!
//! A dead rank ends the group:
//! - rank 0 watches its children and exits when one fails;
//! - the children die with rank 0 (Linux's parent-death signal);
//! - between steps, they also see their socket close.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use infer_core::parallel::CollectiveStats;
use infer_core::{InferError, ProcessGroup, Result};

/// Set by rank 0 on the ranks it starts: their rank, the group's size and rank 0's pid.
pub const RANK_ENV: &str = "INFER_TP_RANK";
const SIZE_ENV: &str = "INFER_TP_WORLD_SIZE";
const PARENT_ENV: &str = "INFER_TP_PARENT_PID";

/// A frame longer than this is a broken stream, not a step (a step is a few kB).
const MAX_FRAME: u64 = 1 << 30;
/// How long rank 0 waits for its workers to exit after releasing them.
const EXIT_GRACE: Duration = Duration::from_secs(10);

fn err(what: String) -> InferError {
    InferError::Distributed(what)
}

/// One process of a spawned group.
pub struct SpawnedGroup {
    rank: usize,
    size: usize,
    link: Link,
    timeout: Duration,
    stats: Mutex<CollectiveStats>,
}

enum Link {
    /// Rank 0: one socket per worker, rank 1 first. Emptied when the group is released.
    Leader(Mutex<Vec<UnixStream>>),
    Worker(Mutex<UnixStream>),
}

/// This process's place in a group rank 0 spawned (`None` when it was not started so).
pub fn worker_env() -> Result<Option<(usize, usize)>> {
    let Ok(rank) = std::env::var(RANK_ENV) else {
        return Ok(None);
    };
    let parse = |name: &str, v: &str| {
        v.parse::<usize>()
            .map_err(|_| err(format!("{name}={v:?} is not a number")))
    };
    let size = std::env::var(SIZE_ENV).unwrap_or_default();
    let (rank, size) = (parse(RANK_ENV, &rank)?, parse(SIZE_ENV, &size)?);
    if rank == 0 || rank >= size {
        return Err(err(format!(
            "{RANK_ENV}={rank} is outside a group of {size}"
        )));
    }
    Ok(Some((rank, size)))
}

/// Joins the group rank 0 started this process in: its socket is this process's stdin.
pub fn join(rank: usize, size: usize, timeout: Duration) -> Result<Arc<SpawnedGroup>> {
    #[cfg(target_os = "linux")]
    {
        // Die with rank 0 even inside a collective that will never complete.
        // SAFETY: sets this process's parent-death signal; no memory is touched.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        if std::env::var(PARENT_ENV).ok() != Some(parent.to_string()) {
            return Err(err("rank 0, which started this rank, is gone".into()));
        }
    }
    let stdin = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| err(format!("rank {rank}: taking the socket to rank 0: {e}")))?;
    let socket = UnixStream::from(stdin);
    socket.set_write_timeout(Some(timeout)).map_err(|e| {
        err(format!(
            "rank {rank}: standard input is not rank 0's socket: {e}"
        ))
    })?;
    Ok(Arc::new(SpawnedGroup {
        rank,
        size,
        link: Link::Worker(Mutex::new(socket)),
        timeout,
        stats: Mutex::default(),
    }))
}

/// Rank 0's hold on the processes it started. Dropping it releases them: their sockets
/// close, and those still running after a grace period are killed.
pub struct Ranks {
    group: Arc<SpawnedGroup>,
    children: Arc<Mutex<Vec<(usize, Child)>>>,
    finished: Arc<AtomicBool>,
}

/// Starts ranks `1..size`, `command(rank)` each (this binary with rank 0's arguments), and
/// a thread that calls `on_death` with a message naming the rank when one exits with a
/// failure before the group is released.
pub fn spawn(
    size: usize,
    timeout: Duration,
    command: impl Fn(usize) -> Command,
    on_death: impl Fn(String) + Send + 'static,
) -> Result<Ranks> {
    let mut sockets = Vec::with_capacity(size.saturating_sub(1));
    let mut children = Vec::with_capacity(size.saturating_sub(1));
    let started = |e: std::io::Error, rank| err(format!("starting rank {rank}: {e}"));
    for rank in 1..size {
        let (mine, theirs) = UnixStream::pair().map_err(|e| started(e, rank))?;
        mine.set_write_timeout(Some(timeout))
            .map_err(|e| started(e, rank))?;
        let child = command(rank)
            .env(RANK_ENV, rank.to_string())
            .env(SIZE_ENV, size.to_string())
            .env(PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            // Rank 0 alone writes results; the workers' logs go to stderr.
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| started(e, rank))?;
        sockets.push(mine);
        children.push((rank, child));
    }
    let ranks = Ranks {
        group: Arc::new(SpawnedGroup {
            rank: 0,
            size,
            link: Link::Leader(Mutex::new(sockets)),
            timeout,
            stats: Mutex::default(),
        }),
        children: Arc::new(Mutex::new(children)),
        finished: Arc::default(),
    };
    let (children, finished) = (ranks.children.clone(), ranks.finished.clone());
    std::thread::Builder::new()
        .name("tp-ranks".into())
        .spawn(move || watch(&children, &finished, on_death))
        .map_err(|e| err(format!("starting the rank watcher: {e}")))?;
    Ok(ranks)
}

/// Polls the children until the group is released; the first that fails is reported (after
/// the others are killed, so none outlives the group).
fn watch(children: &Mutex<Vec<(usize, Child)>>, finished: &AtomicBool, on_death: impl Fn(String)) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let Ok(mut children) = children.lock() else {
            return;
        };
        if finished.load(Ordering::Acquire) {
            return;
        }
        let failed = children
            .iter_mut()
            .find_map(|(rank, c)| match c.try_wait() {
                Ok(Some(status)) if !status.success() => {
                    Some(format!("rank {rank} (pid {}) exited with {status}", c.id()))
                }
                _ => None,
            });
        if let Some(message) = failed {
            for (_, c) in children.iter_mut() {
                let _ = c.kill();
            }
            drop(children);
            return on_death(message);
        }
    }
}

impl Ranks {
    pub fn group(&self) -> Arc<SpawnedGroup> {
        self.group.clone()
    }

    /// Releases the workers (their sockets close) and waits for them, killing those still
    /// running after `EXIT_GRACE`. Returns each rank's exit status (`None`: killed).
    pub fn release(&mut self) -> Vec<(usize, Option<ExitStatus>)> {
        self.finished.store(true, Ordering::Release);
        if let Link::Leader(sockets) = &self.group.link {
            if let Ok(mut s) = sockets.lock() {
                s.clear();
            }
        }
        let Ok(mut children) = self.children.lock() else {
            return vec![];
        };
        let deadline = Instant::now() + EXIT_GRACE;
        let mut out = vec![];
        for (rank, mut child) in children.drain(..) {
            let status = loop {
                match child.try_wait() {
                    Ok(Some(s)) => break Some(s),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        tracing::warn!(rank, "rank still running after release; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                }
            };
            out.push((rank, status));
        }
        out
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        self.release();
    }
}

fn write_frame(s: &mut UnixStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(&(data.len() as u64).to_le_bytes())?;
    s.write_all(data)
}

/// One frame; `first_byte_timeout` bounds the wait for it to start (`None`: as long as it
/// takes), the collective timeout the rest.
fn read_frame(
    s: &mut UnixStream,
    first_byte_timeout: Option<Duration>,
    timeout: Duration,
) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    s.set_read_timeout(first_byte_timeout)?;
    s.read_exact(&mut len[..1])?;
    s.set_read_timeout(Some(timeout))?;
    s.read_exact(&mut len[1..])?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {len} bytes")));
    }
    // At most MAX_FRAME, checked above.
    let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

impl SpawnedGroup {
    fn leader(&self) -> Result<MutexGuard<'_, Vec<UnixStream>>> {
        match &self.link {
            Link::Leader(s) => s
                .lock()
                .map_err(|_| err("the rank sockets' lock is poisoned".into())),
            Link::Worker(_) => Err(err(format!("rank {} is not rank 0", self.rank))),
        }
    }

    fn worker(&self) -> Result<MutexGuard<'_, UnixStream>> {
        match &self.link {
            Link::Worker(s) => s
                .lock()
                .map_err(|_| err("the socket's lock is poisoned".into())),
            Link::Leader(_) => Err(err("rank 0 has no socket to rank 0".into())),
        }
    }

    /// Rank 0: `data` to every worker.
    fn send_all(&self, data: &[u8], what: &str) -> Result<()> {
        let mut sockets = self.leader()?;
        if sockets.len() + 1 != self.size {
            return Err(err("the group was released".into()));
        }
        for (i, s) in sockets.iter_mut().enumerate() {
            write_frame(s, data)
                .map_err(|e| err(format!("sending {what} to rank {}: {e}", i + 1)))?;
        }
        Ok(())
    }

    /// A worker's read of rank 0's next frame, started within `first` (`None`: whenever).
    fn receive(&self, first: Option<Duration>, what: &str) -> Result<Vec<u8>> {
        read_frame(&mut *self.worker()?, first, self.timeout).map_err(|e| {
            err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    format!("rank {}: rank 0 closed the group", self.rank)
                }
                _ => format!("rank {}: waiting for {what} from rank 0: {e}", self.rank),
            })
        })
    }
}

impl ProcessGroup for SpawnedGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn broadcast(&self, data: Option<&[u8]>, idle: bool) -> Result<Vec<u8>> {
        let started = Instant::now();
        let out = match (self.rank, data) {
            (0, Some(d)) => {
                self.send_all(d, "the step")?;
                d.to_vec()
            }
            (0, None) => return Err(err("rank 0 broadcast nothing".into())),
            _ => self.receive((!idle).then_some(self.timeout), "the step")?,
        };
        if !idle {
            if let Ok(mut s) = self.stats.lock() {
                s.broadcasts += 1;
                s.broadcast_time += started.elapsed();
            }
        }
        Ok(out)
    }

    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Err(err(
            "the mp executor sums on the GPU (NCCL); the cpu backend's ranks sum over MPI (--distributed-executor-backend mpi)".into(),
        ))
    }

    /// Rank 0 takes the workers' values (each rank's reply, as vLLM's executor does for the
    /// KV pool) and sends back the smallest.
    fn all_reduce_min(&self, value: u64) -> Result<u64> {
        // Ranks reach this after loading their weights: allow for a slow disk.
        let load = self.timeout.max(Duration::from_secs(600));
        let decode = |b: Vec<u8>| -> Result<u64> {
            let bytes: [u8; 8] = b
                .try_into()
                .map_err(|b: Vec<u8>| err(format!("a reply of {} bytes, not 8", b.len())))?;
            Ok(u64::from_le_bytes(bytes))
        };
        if self.rank != 0 {
            write_frame(&mut *self.worker()?, &value.to_le_bytes())
                .map_err(|e| err(format!("rank {}: replying to rank 0: {e}", self.rank)))?;
            return decode(self.receive(Some(load), "the agreed value")?);
        }
        let mut min = value;
        for (i, s) in self.leader()?.iter_mut().enumerate() {
            let reply = read_frame(s, Some(load), self.timeout)
                .map_err(|e| err(format!("waiting for rank {}'s reply: {e}", i + 1)))?;
            min = min.min(decode(reply)?);
        }
        self.send_all(&min.to_le_bytes(), "the agreed value")?;
        Ok(min)
    }

    fn describe(&self) -> String {
        format!(
            "spawned processes (mp), rank {} of {}",
            self.rank, self.size
        )
    }

    fn stats(&self) -> CollectiveStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "spawned_tests.rs"]
mod tests;
