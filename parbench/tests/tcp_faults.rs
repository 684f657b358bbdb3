//! Faults between real processes: a rank killed or frozen in the middle of
//! a stream of exchanges. Every other rank must return an error naming it
//! (at once for a kill, at the deadline for a freeze, even a rank that
//! waits for a rank that waits for the frozen one), and nothing may hang.

mod tcp_support;

use parbench::comm::tcp;
use parbench::comm::{CommError, RecvInto, Transport};
use std::time::{Duration, Instant};
use tcp_support::{assert_rank_1_killed_and_the_rest_succeeded, job, wait_all, worker};

/// The step at which the victim stops.
const FAULT_STEP: usize = 20;

/// Runs ring exchanges until one fails (or 10,000 pass: then the test fails).
/// The victim, rank 1, applies `fault` at step [`FAULT_STEP`].
/// Returns the error and how long the failing call waited.
fn ring_until_error(
    t: &mut tcp::TcpTransport,
    timeout: Duration,
    fault: impl Fn(),
) -> (CommError, Duration) {
    let (rank, world) = (t.rank(), t.world());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let data = vec![rank as u8; 256 * 1024];
    let mut got = vec![0u8; data.len()];
    for step in 0..10_000 {
        if rank == 1 && step == FAULT_STEP {
            fault();
        }
        let t0 = Instant::now();
        if let Err(e) = t.exchange(next, &data, prev, RecvInto::Copy(&mut got), t0 + timeout) {
            return (e, t0.elapsed());
        }
        assert!(got.iter().all(|&b| b == prev as u8));
    }
    panic!("rank {rank}: no error although rank 1 stopped at step {FAULT_STEP}");
}

#[test]
fn killed_rank_is_named_by_every_other_rank_at_once() {
    let name = "killed_rank_is_named_by_every_other_rank_at_once";
    let timeout = Duration::from_secs(30);
    if let Some(info) = worker(name) {
        let mut t = tcp::connect(&info, timeout).unwrap();
        let (e, waited) = ring_until_error(&mut t, timeout, || {
            // SAFETY: plain libc calls; this process ends here.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
        eprintln!("rank {}: {e} (after {waited:?})", t.rank());
        assert!(
            matches!(e, CommError::PeerLost { peer: 1, .. }),
            "rank {}: {e}",
            t.rank()
        );
        // A closed socket is noticed at once, not at the deadline.
        assert!(waited < timeout / 3, "rank {}: took {waited:?}", t.rank());
        // Later calls fail at once with the same diagnosis.
        let e = t
            .send((t.rank() + 1) % 4, &[1], Instant::now() + timeout)
            .unwrap_err();
        assert!(matches!(e, CommError::PeerLost { peer: 1, .. }), "{e}");
        return;
    }
    // World 4: rank 3 is not next to rank 1 in the ring; it learns from the others.
    let mut children = job(name, 4).start().unwrap();
    let status = wait_all(&mut children, 60);
    assert_rank_1_killed_and_the_rest_succeeded(&status);
}

#[test]
fn frozen_rank_is_named_by_every_other_rank_at_the_deadline() {
    let name = "frozen_rank_is_named_by_every_other_rank_at_the_deadline";
    // Long enough that its tenth (the grace for hints) outlasts scheduling
    // hiccups on a loaded 2-core machine.
    let timeout = Duration::from_secs(5);
    if let Some(info) = worker(name) {
        let mut t = tcp::connect(&info, Duration::from_secs(30)).unwrap();
        let (e, waited) = ring_until_error(&mut t, timeout, || {
            // SAFETY: plain libc call; the parent kills this process later.
            unsafe { libc::raise(libc::SIGSTOP) };
        });
        eprintln!("rank {}: {e} (after {waited:?})", t.rank());
        // A rank whose own deadline passed says how long it waited; one
        // told by another rank names rank 1 as lost, not as its own
        // timeout (its call may have waited only microseconds).
        match &e {
            CommError::Timeout { peer: 1, after, .. } => {
                assert!(*after >= timeout, "rank {}: {e}", t.rank())
            }
            CommError::PeerLost {
                peer: 1, detail, ..
            } => {
                assert!(detail.contains("timed out"), "rank {}: {e}", t.rank())
            }
            _ => panic!("rank {}: {e}", t.rank()),
        }
        assert!(waited < timeout * 3, "rank {}: took {waited:?}", t.rank());
        return;
    }
    // World 4: ranks 3 and 0 wait for ranks that wait in turn (a chain
    // of waits ending at rank 1); each must still name rank 1.
    let mut children = job(name, 4).start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    let live = [0, 2, 3];
    let mut status = [None; 4];
    while Instant::now() < deadline && live.iter().any(|&r| status[r].is_none()) {
        for r in live {
            if status[r].is_none() {
                status[r] = children[r].try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    for r in live {
        assert!(
            status[r].is_some_and(|s| s.success()),
            "rank {r}: {status:?}"
        );
    }
}
