//! infer's `ProcessGroup` over MPI (the `mpi` crate on Open MPI or MPICH): ranks come from
//! the launcher (`mpirun`, `srun`, one process per rank on one node or many), rank 0's step
//! messages reach the others by `MPI_Bcast`, CPU tensors are summed by `MPI_Allreduce`. Waits
//! are non-blocking requests polled against a deadline: a collective that does not complete
//! (a rank died or hangs) aborts the whole job with a message naming it, never a hang.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use infer_core::parallel::CollectiveStats;
use infer_core::{InferError, ProcessGroup, Result};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::request::{scope, Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

/// Keeps MPI initialized; finalizes it when dropped (the end of `main`: a rank that exits
/// without finalizing is reported by the launcher as failed).
pub struct MpiRuntime {
    _universe: Universe,
}

/// The world communicator as a tensor-parallel group.
pub struct MpiGroup {
    /// SAFETY (Send/Sync below): MPI was initialized with `MPI_THREAD_MULTIPLE` or
    /// `MPI_THREAD_SERIALIZED` (checked in `init`), and every call goes through this mutex, so
    /// calls are serialized and issued in one order on every rank.
    world: Mutex<SimpleCommunicator>,
    rank: usize,
    size: usize,
    collective_timeout: Duration,
    library: String,
    stats: Mutex<CollectiveStats>,
}

// SAFETY: see the `world` field: the communicator handle is only used under the mutex, from
// a thread level MPI granted for calls from any thread one at a time.
unsafe impl Send for MpiGroup {}
// SAFETY: as above; `&MpiGroup` reaches the communicator only through the mutex.
unsafe impl Sync for MpiGroup {}

/// Initializes MPI. `collective_timeout` bounds each all-reduce and step hand-off inside a
/// step (the wait for the next step, while idle, is unbounded).
pub fn init(collective_timeout: Duration) -> Result<(MpiRuntime, Arc<MpiGroup>)> {
    let unavailable = |reason: String| InferError::Distributed(format!("MPI: {reason}"));
    let (universe, level) = mpi::initialize_with_threading(Threading::Multiple)
        .ok_or_else(|| unavailable("already initialized".into()))?;
    if level < Threading::Serialized {
        return Err(unavailable(format!(
            "the library grants only {level:?} threading; infer needs Serialized or Multiple"
        )));
    }
    let world = universe.world();
    let library = mpi::environment::library_version()
        .map(|v| v.split([',', '\n']).next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|_| "unknown MPI".into());
    let group = MpiGroup {
        rank: world.rank() as usize,
        size: world.size() as usize,
        world: Mutex::new(world),
        collective_timeout,
        library,
        stats: Mutex::default(),
    };
    Ok((
        MpiRuntime {
            _universe: universe,
        },
        Arc::new(group),
    ))
}

impl MpiGroup {
    fn world(&self) -> Result<MutexGuard<'_, SimpleCommunicator>> {
        self.world
            .lock()
            .map_err(|_| InferError::Distributed("the MPI communicator lock is poisoned".into()))
    }

    /// Polls `req` until it completes. Past `deadline` the whole job is aborted (`MPI_Abort`:
    /// the launcher ends every rank): the other ranks are stuck in the same collective, so
    /// returning an error would leave them hanging. `idle` waits sleep between polls.
    fn complete<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        world: &SimpleCommunicator,
        mut req: Request<'a, D, S>,
        what: &str,
        deadline: Option<Instant>,
    ) {
        let mut polls = 0u32;
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            polls = polls.saturating_add(1);
            if polls < 2000 {
                std::thread::yield_now();
                continue;
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    eprintln!(
                        "infer: rank {}: {what} did not complete within {:?}: another rank died or hangs; aborting the group",
                        self.rank, self.collective_timeout
                    );
                    world.abort(70);
                }
                std::thread::yield_now();
            } else {
                // Waiting for work: keep the core free (a step arrives within ~1 ms of this).
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    fn deadline(&self) -> Option<Instant> {
        Some(Instant::now() + self.collective_timeout)
    }

    fn count(&self, f: impl FnOnce(&mut CollectiveStats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }
}

/// The largest step hand-off a rank accepts (a step's metadata is kilobytes).
const MAX_HAND_OFF: usize = 1 << 30;

impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn broadcast(&self, data: Option<&[u8]>, idle: bool) -> Result<Vec<u8>> {
        let world = self.world()?;
        let started = Instant::now();
        let root = world.process_at_rank(0);
        let mut len = [data.map_or(0, |d| d.len() as u64)];
        let deadline = if idle { None } else { self.deadline() };
        scope(|s| {
            let req = root.immediate_broadcast_into(s, &mut len[..]);
            self.complete(&world, req, "the step hand-off", deadline);
        });
        let mut buf = match data {
            Some(d) if self.rank == 0 => d.to_vec(),
            _ => {
                // Sized by another process: bounded before anything is allocated.
                let n = usize::try_from(len[0]).ok().filter(|&n| n <= MAX_HAND_OFF);
                let n = n.ok_or_else(|| {
                    InferError::Distributed(format!(
                        "rank 0 announced a step hand-off of {} bytes (at most {MAX_HAND_OFF})",
                        len[0]
                    ))
                })?;
                vec![0u8; n]
            }
        };
        scope(|s| {
            let req = root.immediate_broadcast_into(s, &mut buf[..]);
            self.complete(&world, req, "the step hand-off", self.deadline());
        });
        if !idle {
            self.count(|s| {
                s.broadcasts += 1;
                s.broadcast_time += started.elapsed();
            });
        }
        Ok(buf)
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let world = self.world()?;
        let started = Instant::now();
        let send = buf.to_vec();
        scope(|s| {
            let req = world.immediate_all_reduce_into(s, &send[..], buf, SystemOperation::sum());
            self.complete(&world, req, "an all-reduce", self.deadline());
        });
        self.count(|s| {
            s.all_reduces += 1;
            s.all_reduce_time += started.elapsed();
        });
        Ok(())
    }

    fn all_reduce_min(&self, value: u64) -> Result<u64> {
        let world = self.world()?;
        let mut out = [0u64];
        // Ranks reach this after loading their weights: allow for a slow disk.
        let deadline = Some(Instant::now() + self.collective_timeout.max(Duration::from_secs(600)));
        let send = [value];
        scope(|s| {
            let req =
                world.immediate_all_reduce_into(s, &send[..], &mut out[..], SystemOperation::min());
            self.complete(&world, req, "agreeing on the KV pool size", deadline);
        });
        Ok(out[0])
    }

    fn describe(&self) -> String {
        format!(
            "MPI ({}), rank {} of {}",
            self.library, self.rank, self.size
        )
    }

    fn stats(&self) -> CollectiveStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }
}
