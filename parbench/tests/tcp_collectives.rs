//! The collectives over the `tcp` backend, one process per rank: the
//! conformance suite against the sequential reference on worlds 1 to 4,
//! each algorithm by name (with the seeded all_to_all_v cases), and a rank killed in the middle of all-reduces.

mod tcp_support;

use parbench::comm::conformance::{run_suite, run_v_suite, Matrix};
use parbench::comm::tcp;
use parbench::comm::{Algo, CommError, Communicator, DType, Io, ReduceOp};
use std::time::{Duration, Instant};
use tcp_support::{assert_rank_1_killed_and_the_rest_succeeded, job, wait_all, worker};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Worker side: runs the suite named by the job's environment.
fn conformance_worker(info: &parbench::launch::RankInfo) {
    let algo: Algo = std::env::var("TEST_ALGO").unwrap().parse().unwrap();
    let matrix = match std::env::var("TEST_MATRIX").unwrap().as_str() {
        // Every collective x type x op x placement x root at counts 0, 1, 7,
        // and every collective x placement x type at 1,048,579 elements.
        "full" => Matrix::full(),
        // For each named algorithm: counts that leave blocks empty, uneven, and sliced.
        _ => Matrix {
            dtypes: vec![DType::F32, DType::I64, DType::BF16],
            ops: vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg],
            counts: vec![1, 7, 1000],
            large_counts: vec![300_007],
            large_dtypes: vec![DType::F32],
            ..Matrix::full()
        },
    };
    let mut comm = tcp::comm(info, algo, TIMEOUT).unwrap();
    assert_eq!((comm.backend(), comm.world()), ("tcp", info.world));
    let mut mismatches = run_suite(&mut comm, &matrix).unwrap();
    mismatches.extend(run_v_suite(&mut comm).unwrap());
    let shown: Vec<String> = mismatches.iter().take(20).map(|m| m.to_string()).collect();
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        shown.join("\n")
    );
}

fn conformance(world: usize, algo: Algo, matrix: &str) {
    let name = "conformance_on_worlds_1_to_4";
    let status = job(name, world)
        .env("TEST_ALGO", algo.name())
        .env("TEST_MATRIX", matrix)
        .run();
    assert!(
        status.is_ok_and(|s| s.success()),
        "world {world}, algo {algo}"
    );
}

#[test]
fn conformance_on_worlds_1_to_4() {
    if let Some(info) = worker("conformance_on_worlds_1_to_4") {
        conformance_worker(&info);
        return;
    }
    for world in 1..=4 {
        conformance(world, Algo::Auto, "full");
    }
}

#[test]
fn every_algorithm_by_name_on_three_ranks() {
    for algo in Algo::ALL.into_iter().filter(|&a| a != Algo::Auto) {
        conformance(3, algo, "per-algo");
    }
}

#[test]
fn rank_killed_mid_collective_is_named_by_the_others() {
    let name = "rank_killed_mid_collective_is_named_by_the_others";
    if let Some(info) = worker(name) {
        let mut comm = tcp::comm(&info, Algo::Ring, TIMEOUT).unwrap();
        let count = 1 << 20;
        let mut buf = comm.alloc(count * 4).unwrap();
        for step in 0..10_000 {
            if info.rank == 1 && step == 5 {
                // SAFETY: plain libc calls; this process ends here.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            let t0 = Instant::now();
            if let Err(e) = comm.all_reduce(Io::InPlace(&mut buf), count, DType::F32, ReduceOp::Sum)
            {
                eprintln!("rank {}: {e} (after {:?})", info.rank, t0.elapsed());
                assert!(
                    matches!(e, CommError::PeerLost { peer: 1, .. }),
                    "rank {}: {e}",
                    info.rank
                );
                assert!(
                    t0.elapsed() < TIMEOUT / 3,
                    "rank {}: took {:?}",
                    info.rank,
                    t0.elapsed()
                );
                return;
            }
        }
        panic!("rank {}: no error although rank 1 died", info.rank);
    }
    let mut children = job(name, 4).start().unwrap();
    let status = wait_all(&mut children, 60);
    assert_rank_1_killed_and_the_rest_succeeded(&status);
}
