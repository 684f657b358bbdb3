//! Shared by tests that run their own binary as the ranks of an `mpirun`
//! job (Open MPI): each rank runs only the named test, in the worker role.
#![allow(dead_code)]

use std::process::{Command, Stdio};

/// The variable that makes a test process a rank of the named test's job.
pub const ROLE: &str = "PARBENCH_MPI_TEST_ROLE";

/// Whether this process is a rank of `test`'s job.
pub fn is_rank(test: &str) -> bool {
    std::env::var(ROLE).ok().as_deref() == Some(test)
}

/// Runs `test` as `np` ranks under `mpirun` on loopback and returns
/// whether every rank passed within `secs` seconds; `None` (after saying
/// so) when `mpirun` is missing.
pub fn run(test: &str, np: usize, secs: u64) -> Option<bool> {
    let found = Command::new("mpirun").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP {test}: mpirun not found (apt-get install openmpi-bin)");
        return None;
    }
    let exe = std::env::current_exe().expect("test binary");
    let child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .args(["-x", ROLE])
        .arg(&exe)
        .args([test, "--exact", "--nocapture"])
        .env(ROLE, test)
        // Loopback only, no network interfaces probed beyond it.
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .stdout(Stdio::null())
        .spawn()
        .expect("mpirun starts");
    let status = super::tcp_support::wait_all(&mut [child], secs);
    Some(status[0].is_some_and(|s| s.success()))
}
