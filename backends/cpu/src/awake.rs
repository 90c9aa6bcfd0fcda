//! Keeps the thread pool's workers awake for the length of a step.
//!
//! A step runs a few hundred parallel regions (every matmul, attention, norm), each a few to a
//! few hundred microseconds. Between two of them rayon's idle workers yield 32 times and then
//! sleep on a futex, so the next region starts by waking them: on the 2-core VM of the README
//! a decode step of SmolLM2 spent about a sixth of its samples in the kernel's scheduler
//! (`finish_task_switch`, `__schedule`, futex wake-ups). llama.cpp's thread pool polls between
//! its graph's nodes for the same reason (`--poll`, on by default), and OpenMP runtimes spin
//! (`OMP_WAIT_POLICY`). Here each worker but the caller runs a job for the step that takes
//! whatever work the pool has (`rayon::yield_now`) and spins when there is none, until the
//! step's guard is dropped or it has found no work for a while (`IDLE_LIMIT`).
//!
//! Only when the step runs on one of the pool's own threads (the `infer` binary's engine
//! thread is one): a caller outside the pool would compete for a core with every spinning
//! worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a spinner goes on without finding work before it leaves (and its worker sleeps as
/// rayon's do): longer than the serial stretches between a step's parallel regions, short
/// enough that a spinner never holds a core for long where there is nothing to do, or holds
/// up a `join` it was started inside (rayon runs whatever a waiting worker finds, so a
/// spinner may run on top of a join the step waits for: with no limit that was a deadlock).
const IDLE_LIMIT: Duration = Duration::from_micros(200);

/// While alive, the pool's other workers look for work without sleeping.
pub(crate) struct KeepAwake(Option<Arc<AtomicBool>>);

impl KeepAwake {
    pub(crate) fn new() -> Self {
        let Some(caller) = rayon::current_thread_index() else {
            return KeepAwake(None);
        };
        if rayon::current_num_threads() < 2 {
            return KeepAwake(None);
        }
        let awake = Arc::new(AtomicBool::new(true));
        let flag = awake.clone();
        rayon::spawn_broadcast(move |ctx| {
            // The caller's own copy runs whenever it next looks for work: nothing to do there.
            if ctx.index() == caller {
                return;
            }
            let mut last_work = Instant::now();
            while flag.load(Ordering::Acquire) {
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    last_work = Instant::now();
                } else if last_work.elapsed() > IDLE_LIMIT {
                    break;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        KeepAwake(Some(awake))
    }
}

impl Drop for KeepAwake {
    fn drop(&mut self) {
        if let Some(awake) = &self.0 {
            awake.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Steps of nested parallel work, each under its own guard, on a pool whose caller is a
    /// worker: every step finishes with the right answer (a spinner without an idle limit,
    /// started inside a `join`, hung a benchmark), and the workers return to the pool.
    #[test]
    fn steps_of_nested_parallel_work_finish() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap();
            let total: u64 = pool.install(|| {
                let mut total = 0;
                for step in 0..300u64 {
                    // Serial work between steps, long enough for idle workers to sleep.
                    std::thread::sleep(std::time::Duration::from_micros(300));
                    let guard = KeepAwake::new();
                    assert!(guard.0.is_some());
                    total += (0..64u64)
                        .into_par_iter()
                        .map(|i| {
                            (0..256u64)
                                .into_par_iter()
                                .map(|j| i * j + step)
                                .sum::<u64>()
                        })
                        .sum::<u64>();
                }
                total
            });
            let seen = pool.broadcast(|ctx| ctx.index());
            let _ = done.send((total, seen));
        });
        let (total, seen) = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the steps hung");
        let one: u64 = (0..64u64)
            .map(|i| (0..256u64).map(|j| i * j).sum::<u64>())
            .sum();
        let steps: u64 = (0..300u64).map(|s| one + s * 64 * 256).sum();
        assert_eq!(total, steps);
        assert_eq!(seen, vec![0, 1, 2]);
        // Outside any pool thread nothing is kept awake.
        assert!(KeepAwake::new().0.is_none());
    }
}
