//! Process groups over MPI, between real ranks: this test binary starts itself under Open MPI's
//! `mpirun -n 2` (installed by scripts/setup-mpi.sh), each rank running one of the `rank_*`
//! cases below (ignored when the binary runs on its own).
#![cfg(feature = "mpi")]

#[path = "support/mpirun.rs"]
mod mpirun;

use std::time::{Duration, Instant};

use mpirun::{mpirun, under_mpirun};
use nuvec::distributed;

#[test]
fn two_ranks_exchange_every_kind_of_message() {
    let (out, ok) = mpirun(2, "rank_exchanges", &[], Duration::from_secs(60));
    assert!(ok, "mpirun failed:\n{out}");
    for rank in 0..2 {
        assert!(out.contains(&format!("rank {rank} of 2: every exchange checked")), "rank {rank}:\n{out}");
    }
}

#[test]
#[ignore = "a rank of two_ranks_exchange_every_kind_of_message, under mpirun"]
fn rank_exchanges() {
    if !under_mpirun() {
        return;
    }
    let g = distributed::init(true).unwrap();
    let (rank, size) = (g.rank(), g.size());
    assert_eq!(size, 2);
    // The second init shares the live group.
    assert_eq!(distributed::init(true).unwrap().rank(), rank);
    let mut values = [rank as f32 + 1.0, 10.0 * (rank as f32 + 1.0), -0.5];
    g.all_reduce_sum(&mut values).unwrap();
    assert_eq!(values, [3.0, 30.0, -1.0]);
    assert_eq!(g.all_gather(&[rank as u8; 3]).unwrap(), [0, 0, 0, 1, 1, 1]);
    let mut greeting = if rank == 1 { *b"hello" } else { [0u8; 5] };
    g.broadcast(1, &mut greeting).unwrap();
    assert_eq!(&greeting, b"hello");
    // A message larger than MPI's eager limit, there and back.
    let pattern: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    if rank == 0 {
        g.send(1, &pattern).unwrap();
        let back = g.recv(1).unwrap();
        assert_eq!(back, pattern.iter().rev().copied().collect::<Vec<_>>());
    } else {
        let got = g.recv(0).unwrap();
        assert_eq!(got, pattern);
        g.send(0, &got.into_iter().rev().collect::<Vec<_>>()).unwrap();
    }
    g.barrier().unwrap();
    println!("rank {rank} of {size}: every exchange checked");
}

#[test]
fn a_rank_that_stops_answering_fails_the_waiting_rank_in_time() {
    let (out, _) = mpirun(2, "rank_waits_for_a_silent_peer", &[], Duration::from_secs(60));
    let at = out.find("rank 0 gave up after ").unwrap_or_else(|| panic!("{out}"));
    let line = out[at..].lines().next().unwrap();
    let seconds: f64 = line.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!((1.0..5.0).contains(&seconds), "the timeout is 1 s: {line}");
    assert!(line.contains("rank 1 sent nothing within 1.0 s"), "{line}");
    assert!(out.contains("then: distributed: the group failed earlier"), "{out}");
}

#[test]
#[ignore = "a rank of a_rank_that_stops_answering_fails_the_waiting_rank_in_time, under mpirun"]
fn rank_waits_for_a_silent_peer() {
    if !under_mpirun() {
        return;
    }
    let g = distributed::init(true).unwrap().with_timeout(Duration::from_secs(1));
    g.barrier().unwrap();
    if g.rank() == 1 {
        // Never sends what rank 0 waits for, then leaves.
        std::thread::sleep(Duration::from_secs(3));
        std::process::exit(0);
    }
    let start = Instant::now();
    let e = g.recv(1).unwrap_err();
    println!("rank 0 gave up after {:.2} s: {e}", start.elapsed().as_secs_f64());
    let again = g.barrier().unwrap_err();
    println!("then: {again}");
    assert!(start.elapsed() < Duration::from_secs(2), "the second call fails at once");
    std::process::exit(0);
}

#[test]
fn a_rank_that_dies_ends_the_job_naming_it_long_before_the_timeout() {
    let start = Instant::now();
    let (out, ok) = mpirun(2, "rank_waits_for_a_dying_peer", &[], Duration::from_secs(60));
    let took = start.elapsed();
    assert!(!ok, "{out}");
    // Rank 0 waits for at most 30 s; mpirun ends the job as soon as rank 1 dies.
    assert!(took < Duration::from_secs(20), "{took:?}:\n{out}");
    assert!(!out.contains("rank 0 got"), "{out}");
    assert!(out.contains("process rank 1") && out.contains("signal 9"), "mpirun names the rank:\n{out}");
}

#[test]
#[ignore = "a rank of a_rank_that_dies_ends_the_job_naming_it_long_before_the_timeout, under mpirun"]
fn rank_waits_for_a_dying_peer() {
    if !under_mpirun() {
        return;
    }
    let g = distributed::init(true).unwrap().with_timeout(Duration::from_secs(30));
    g.barrier().unwrap();
    if g.rank() == 1 {
        // Killed, as the OOM killer or a crash would.
        let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        std::thread::sleep(Duration::from_secs(60));
    }
    let got = g.recv(1);
    println!("rank 0 got {got:?}");
}

#[test]
fn a_process_started_alone_is_a_group_of_one_unless_strict() {
    if under_mpirun() {
        return;
    }
    let e = distributed::init(true).unwrap_err().to_string();
    assert!(e.contains("mpirun -n N"), "{e}");
    let g = distributed::init(false).unwrap();
    assert_eq!((g.rank(), g.size()), (0, 1));
}
