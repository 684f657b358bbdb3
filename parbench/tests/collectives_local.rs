//! The `local` backend against the sequential reference: the conformance
//! matrix on every world size, each algorithm explicitly, point-to-point
//! transfers, argument checks and faults (a failing, panicking or absent rank).

use parbench::comm::conformance::{run_suite, Matrix};
use parbench::comm::local::run;
use parbench::comm::{
    reference, Algo, Collective, CommError, Communicator, DType, HostBuffer, Io, ReduceOp,
};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

fn conformance(world: usize, algo: Algo, matrix: &Matrix) {
    let results = run(world, algo, TIMEOUT, |c| run_suite(c, matrix));
    let mut problems = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(mismatches) => problems.extend(mismatches.iter().map(|m| m.to_string())),
            Err(e) => problems.push(format!("rank {rank} failed: {e}")),
        }
    }
    assert!(
        problems.is_empty(),
        "world {world}, algo {algo}: {} problems, first ones:\n{}",
        problems.len(),
        problems[..problems.len().min(20)].join("\n")
    );
}

/// Every collective x type x op x placement x root at the small counts, and
/// every collective x placement x type at 1,048,579 elements (which no world
/// size above 1 divides).
fn matrix_for(_world: usize) -> Matrix {
    Matrix::full()
}

#[test]
fn conformance_world_1() {
    conformance(1, Algo::Auto, &matrix_for(1));
}

#[test]
fn conformance_world_2() {
    conformance(2, Algo::Auto, &matrix_for(2));
}

#[test]
fn conformance_world_3() {
    conformance(3, Algo::Auto, &matrix_for(3));
}

#[test]
fn conformance_world_4() {
    conformance(4, Algo::Auto, &matrix_for(4));
}

#[test]
fn conformance_world_8() {
    conformance(8, Algo::Auto, &matrix_for(8));
}

/// Each algorithm by name on every world from 1 to 8, on the operations the
/// choice affects, at counts that leave blocks empty (1, 7 < world), uneven,
/// and large enough to be cut into slices (ring) and chunks (chain).
#[test]
fn every_algorithm_on_worlds_1_to_8() {
    let m = Matrix {
        collectives: vec![
            Collective::AllReduce,
            Collective::Broadcast,
            Collective::Reduce,
        ],
        dtypes: vec![DType::F32, DType::I64],
        ops: vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg],
        counts: vec![1, 7, 1000],
        large_counts: vec![300_007],
        large_dtypes: vec![DType::F32],
    };
    for algo in Algo::ALL {
        for world in 1..=8 {
            conformance(world, algo, &m);
        }
    }
}

#[test]
fn algo_for_names_what_runs() {
    let res = run(4, Algo::Auto, TIMEOUT, |c| {
        Ok((
            c.algo_for(Collective::AllReduce, 8),
            c.algo_for(Collective::AllReduce, 64 << 20),
            c.algo_for(Collective::AllToAll, 8),
            c.algo_for(Collective::Broadcast, 64 << 20),
        ))
    });
    let (small, large, a2a, bcast) = res.into_iter().next().unwrap().unwrap();
    assert_eq!(small, "rd");
    assert_eq!(large, "ring");
    assert_eq!(a2a, "pairwise");
    assert_eq!(bcast, "chain");
    let res = run(3, Algo::HalvingDoubling, TIMEOUT, |c| {
        Ok(c.algo_for(Collective::AllReduce, 8))
    });
    assert_eq!(res[0].as_ref().unwrap(), "rhd");
}

#[test]
fn two_ranks_send_large_messages_to_each_other_at_once() {
    let count = 1 << 20;
    let res = run(2, Algo::Auto, TIMEOUT, |c| {
        let peer = 1 - c.rank();
        let mine = reference::input(c.rank(), count, DType::F32, ReduceOp::Sum, 9);
        let mut send = HostBuffer::zeroed(mine.len());
        send.bytes_mut().copy_from_slice(&mine);
        for _ in 0..3 {
            c.send(&send, count, DType::F32, peer)?;
        }
        let mut ok = true;
        for _ in 0..3 {
            let mut recv = HostBuffer::zeroed(mine.len());
            c.recv(&mut recv, count, DType::F32, peer)?;
            ok &= recv.bytes() == reference::input(peer, count, DType::F32, ReduceOp::Sum, 9);
        }
        c.barrier()?;
        Ok(ok)
    });
    for r in res {
        assert!(r.unwrap());
    }
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let res = run(2, Algo::Auto, TIMEOUT, |c| {
        let mut small = HostBuffer::zeroed(8);
        let big = HostBuffer::zeroed(64);
        let errors = vec![
            c.all_reduce(Io::InPlace(&mut small), 4, DType::F32, ReduceOp::Sum),
            c.all_gather(Io::InPlace(&mut small), 2, DType::F32),
            c.reduce_scatter(
                Io::OutOfPlace {
                    send: &big,
                    recv: &mut small,
                },
                4,
                DType::F32,
                ReduceOp::Sum,
            ),
            c.broadcast(Io::InPlace(&mut small), 1, DType::F32, 2),
            c.reduce(Io::InPlace(&mut small), 1, DType::F32, ReduceOp::Sum, 7),
            c.all_to_all(Io::InPlace(&mut small), usize::MAX / 2, DType::F64),
            c.send(&big, 1, DType::F32, 5),
            c.recv(&mut small, 1, DType::F32, 2),
            c.send(&big, 100, DType::F32, 0),
        ];
        Ok(errors
            .into_iter()
            .all(|e| matches!(e, Err(CommError::InvalidArgument(_)))))
    });
    for r in res {
        assert!(r.unwrap(), "every bad call must be InvalidArgument");
    }
}

/// A rank that fails mid-collective: the others learn it at once, by name.
#[test]
fn failing_rank_is_named_promptly() {
    let start = Instant::now();
    let res = run(4, Algo::Ring, TIMEOUT, |c| {
        let mut buf = HostBuffer::zeroed(4 << 20);
        c.all_reduce(Io::InPlace(&mut buf), 1 << 20, DType::F32, ReduceOp::Sum)?;
        if c.rank() == 2 {
            return Err(CommError::InvalidArgument("rank 2 gives up".into()));
        }
        for _ in 0..100 {
            c.all_reduce(Io::InPlace(&mut buf), 1 << 20, DType::F32, ReduceOp::Sum)?;
        }
        Ok(())
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    for (rank, r) in res.into_iter().enumerate() {
        match (rank, r) {
            (2, Err(CommError::InvalidArgument(_))) => {}
            (_, Err(CommError::PeerLost { peer: 2, .. })) => {}
            (rank, other) => panic!("rank {rank}: expected PeerLost naming rank 2, got {other:?}"),
        }
    }
}

#[test]
fn panicking_rank_is_named() {
    let res = run(3, Algo::Auto, TIMEOUT, |c| {
        if c.rank() == 1 {
            panic!("deliberate test panic");
        }
        c.barrier()
    });
    for (rank, r) in res.into_iter().enumerate() {
        match r {
            Err(CommError::PeerLost { peer: 1, .. }) => {}
            other => panic!("rank {rank}: expected PeerLost naming rank 1, got {other:?}"),
        }
    }
}

/// A rank that never joins: the ranks waiting on it time out naming it
/// within the deadline; the others learn it from the abort.
#[test]
fn absent_rank_times_out_by_name() {
    let deadline = Duration::from_millis(300);
    let start = Instant::now();
    let res = run(4, Algo::Auto, deadline, |c| {
        if c.rank() == 3 {
            return Ok(());
        }
        let mut buf = HostBuffer::zeroed(64);
        c.all_reduce(Io::InPlace(&mut buf), 16, DType::F32, ReduceOp::Sum)
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    let mut timeouts = 0;
    for (rank, r) in res.into_iter().enumerate() {
        match (rank, r) {
            (3, Ok(())) => {}
            (_, Err(CommError::Timeout { peer: 3, op, .. })) => {
                assert_eq!(op, "all_reduce");
                timeouts += 1;
            }
            (_, Err(CommError::PeerLost { peer: 3, .. })) => {}
            (rank, other) => panic!("rank {rank}: expected an error naming rank 3, got {other:?}"),
        }
    }
    assert!(timeouts >= 1);
}
