//! Shared by the `tcp_*` integration tests: a test re-runs its own test
//! binary as the ranks of a job (one process per rank), each child running
//! only that test, in the worker role.
#![allow(dead_code)]

use parbench::launch::{LocalJob, RankInfo};
use std::process::Child;
use std::time::Instant;

/// The variable that makes a test process a worker of the named test.
pub const ROLE: &str = "PARBENCH_TCP_TEST_ROLE";

/// `Some(rank info)` when this process is a rank of `test`'s job.
pub fn worker(test: &str) -> Option<RankInfo> {
    if std::env::var(ROLE).ok().as_deref() != Some(test) {
        return None;
    }
    Some(
        RankInfo::from_env()
            .expect("launch variables")
            .expect("a rank"),
    )
}

/// A job of `n` ranks of this test binary, each running only `test`.
pub fn job(test: &str, n: usize) -> LocalJob {
    let exe = std::env::current_exe().expect("test binary path");
    LocalJob::new(n, exe, [test, "--exact", "--nocapture", "--test-threads=1"]).env(ROLE, test)
}

/// Waits for every child, up to `secs` seconds in all; kills what is left.
/// Returns each rank's exit status (`None`: still running at the deadline).
pub fn wait_all(children: &mut [Child], secs: u64) -> Vec<Option<std::process::ExitStatus>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut out = vec![None; children.len()];
    while std::time::Instant::now() < deadline && out.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if out[i].is_none() {
                out[i] = c.try_wait().expect("try_wait");
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    out
}

/// Every rank sends a `len`-byte pattern to every other, then receives and
/// checks theirs, each call by `deadline`.
pub fn all_pairs(t: &mut parbench::comm::tcp::TcpTransport, len: usize, deadline: Instant) {
    use parbench::comm::{RecvInto, Transport};
    let (rank, world) = (t.rank(), t.world());
    for to in (0..world).filter(|&p| p != rank) {
        t.send(to, &pattern(rank, to, len), deadline).unwrap();
    }
    for from in (0..world).filter(|&p| p != rank) {
        let mut got = vec![0u8; len];
        t.recv(from, RecvInto::Copy(&mut got), deadline).unwrap();
        assert_eq!(got, pattern(from, rank, len));
    }
}

/// Asserts that every rank ended with success.
pub fn assert_all_succeeded(status: &[Option<std::process::ExitStatus>]) {
    for (r, s) in status.iter().enumerate() {
        assert!(s.is_some_and(|s| s.success()), "rank {r}: {status:?}");
    }
}

/// Asserts that rank 1 died of SIGKILL (it kills itself: the fault under
/// test) and that every other rank ended with success.
pub fn assert_rank_1_killed_and_the_rest_succeeded(status: &[Option<std::process::ExitStatus>]) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status[1].and_then(|s| s.signal()),
        Some(libc::SIGKILL),
        "{status:?}"
    );
    for r in (0..status.len()).filter(|&r| r != 1) {
        assert!(
            status[r].is_some_and(|s| s.success()),
            "rank {r}: {status:?}"
        );
    }
}

/// A loopback port that was free a moment ago (the OS picked it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses.
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// A recognisable byte pattern for a message from `from` of `len` bytes.
pub fn pattern(from: usize, to: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (from * 31 + to * 17 + i * 7 + len) as u8)
        .collect()
}
