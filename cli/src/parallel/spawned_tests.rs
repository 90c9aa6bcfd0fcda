//! The spawned group with real processes: this test binary started as the worker ranks
//! (`worker_rank`), talking to the test as rank 0 over the sockets `spawn` made.

use std::sync::mpsc;

use super::*;

/// This test binary, running only `worker_rank`.
fn worker_command(_rank: usize) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the test binary's path"));
    c.args([
        "parallel::spawned::tests::worker_rank",
        "--exact",
        "--ignored",
        "--nocapture",
    ]);
    c
}

/// Rank 0 of a group of `size` test workers; deaths are sent to the receiver.
fn start(size: usize) -> (Ranks, Arc<SpawnedGroup>, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel();
    let ranks = spawn(size, Duration::from_secs(20), worker_command, move |m| {
        let _ = tx.send(m);
    })
    .expect("spawning the worker ranks");
    let group = ranks.group();
    (ranks, group, rx)
}

fn checksum(msg: &[u8]) -> u64 {
    msg.iter().map(|&b| b as u64).sum()
}

/// Not a test: the worker ranks the tests below start run this (ignored otherwise). Every
/// step is answered with `all_reduce_min(checksum · 10 + rank)`; "exit" returns; "fail" makes
/// rank 2 exit with status 3; rank 0 gone exits with status 4.
#[test]
#[ignore = "the worker ranks of the spawned-group tests run this"]
fn worker_rank() {
    let (rank, size) = worker_env()
        .expect("a valid rank")
        .expect("started by a spawned-group test");
    let group = join(rank, size, Duration::from_secs(20)).expect("joining rank 0");
    loop {
        let msg = match group.broadcast(None, true) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(4);
            }
        };
        match msg.as_slice() {
            b"exit" => return,
            b"fail" if rank == 2 => std::process::exit(3),
            _ => {
                group
                    .all_reduce_min(checksum(&msg) * 10 + rank as u64)
                    .expect("replying");
            }
        }
    }
}

#[test]
fn steps_reach_every_rank_and_the_smallest_reply_comes_back() {
    let (mut ranks, group, deaths) = start(3);
    assert_eq!((group.rank(), group.size()), (0, 3));
    // The second step is larger than a socket buffer.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    for msg in [&b"hello"[..], &big] {
        assert_eq!(group.broadcast(Some(msg), false).unwrap(), msg);
        assert_eq!(
            group.all_reduce_min(u64::MAX).unwrap(),
            checksum(msg) * 10 + 1
        );
    }
    group.broadcast(Some(b"x"), false).unwrap();
    assert_eq!(group.all_reduce_min(3).unwrap(), 3);
    assert_eq!(group.stats().broadcasts, 3);
    group.broadcast(Some(b"exit"), false).unwrap();
    for (rank, status) in ranks.release() {
        assert!(
            status.is_some_and(|s| s.success()),
            "rank {rank}: {status:?}"
        );
    }
    assert!(
        deaths.try_recv().is_err(),
        "a clean exit reported as a death"
    );
}

#[test]
fn a_failed_rank_is_reported_within_a_second_and_the_others_stop() {
    let (mut ranks, group, deaths) = start(3);
    group.broadcast(Some(b"fail"), false).unwrap();
    let sent = Instant::now();
    let message = deaths
        .recv_timeout(Duration::from_secs(10))
        .expect("no death reported");
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert!(
        message.contains("rank 2") && message.contains("exit status: 3"),
        "{message}"
    );
    // Rank 1 was killed with the group: nothing is left running.
    let statuses = ranks.release();
    assert_eq!(statuses.len(), 2);
    assert!(statuses
        .iter()
        .all(|(_, s)| s.is_some_and(|s| !s.success())));
    // Released: rank 0 sends nothing more.
    assert!(group.broadcast(Some(b"late"), false).is_err());
}

#[test]
fn workers_see_rank_0_release_them() {
    let (mut ranks, _group, deaths) = start(2);
    let released = Instant::now();
    let statuses = ranks.release();
    // Exit status 4: the worker saw its socket close (not killed after the grace period).
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].1.and_then(|s| s.code()), Some(4));
    assert!(released.elapsed() < EXIT_GRACE);
    assert!(deaths.try_recv().is_err());
}

#[test]
fn the_cpu_all_reduce_is_refused_naming_mpi() {
    let (_ranks, group, _deaths) = start(1);
    let e = group.all_reduce_sum(&mut [1.0]).unwrap_err().to_string();
    assert!(e.contains("--distributed-executor-backend mpi"), "{e}");
}
