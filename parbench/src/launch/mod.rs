//! How a process learns its rank: launcher variables (torchrun, mpirun,
//! PMI, srun), self-spawn of N local ranks (`--nprocs N`), and the
//! rendezvous store that ranks meet at.
//!
//! A binary does, before anything else:
//!
//! ```no_run
//! # fn main() -> Result<(), parbench::launch::LaunchError> {
//! use parbench::launch::{self, Role};
//! let nprocs: Option<usize> = None; // from the binary's `--nprocs` flag
//! match launch::join_or_spawn(nprocs)? {
//!     // This process launched N ranks of itself and they all succeeded.
//!     // (A failed rank is `Err(LaunchError::RankFailed)`, already named on
//!     // stderr by the launcher: exit with `err.exit_code()`, that rank's code.)
//!     Role::Launcher(status) => std::process::exit(launch::exit_code(status)),
//!     // This process is one rank of a job (spawned, torchrun, mpirun, srun).
//!     Role::Rank(info) => { /* tcp::connect(&info, timeout) ... */ }
//!     // No launcher variables and no --nprocs: a single process.
//!     Role::Single => {}
//! }
//! # Ok(()) }
//! ```
//!
//! Who prints: rank 0 prints the results table on stdout; the other ranks
//! print nothing on stdout and only their errors on stderr
//! ([`RankInfo::prints`]). The same rule holds under every launcher.

mod env;
pub mod flags;
pub mod interrupt;
pub mod ranks;
pub mod report;
mod spawn;
pub mod store;
pub mod usage;

pub use env::{LaunchSource, RankInfo, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, DEFAULT_TOKEN};
pub use report::{duration_text, eprint_line};
pub use spawn::{exit_code, how_it_ended, new_token, spawn_local_ranks, LocalJob, STOP_GRACE};
pub use store::Store;
pub use usage::{
    check_env_settings, end_on_error, exit_code_of, Reported, UsageError, EXIT_FAULT, EXIT_USAGE,
};

use std::process::ExitStatus;
use std::time::Duration;

/// What can go wrong while finding, spawning or joining the ranks of a job.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// One variable of a launcher family is set and its partner is not.
    #[error("{set} is set but {missing} is not ({family} launch variables must come together)")]
    HalfSet {
        family: &'static str,
        set: &'static str,
        missing: &'static str,
    },
    /// A launch variable holds something that is not what it must be.
    #[error("bad launch variable {var}={value:?}: {why}")]
    BadVar {
        var: &'static str,
        value: String,
        why: String,
    },
    /// Rank and world size contradict each other.
    #[error("{rank_var}={rank} is not below {world_var}={world}")]
    RankOutOfRange {
        rank_var: &'static str,
        rank: usize,
        world_var: &'static str,
        world: usize,
    },
    /// `--nprocs` was asked for something that cannot run.
    #[error("invalid launch request: {0}")]
    Invalid(String),
    /// Starting or watching a child process failed.
    #[error("launching rank {rank}: {source}")]
    Spawn { rank: usize, source: std::io::Error },
    /// A spawned rank ended with a failure, the first to do so; the others
    /// were stopped. The launcher has already said so on stderr.
    #[error("rank {rank} {} {} after launch; the other ranks were stopped", how_it_ended(*.status), duration_text(*.after))]
    RankFailed {
        rank: usize,
        status: ExitStatus,
        /// When it ended, from the launch.
        after: Duration,
    },
    /// The rendezvous store could not be reached or served.
    #[error("rendezvous store at {addr}: {detail}")]
    Store { addr: String, detail: String },
    /// A rendezvous wait passed its deadline.
    #[error("rank {rank}: rendezvous wait for {what} timed out after {} (store at {addr})", duration_text(*.after))]
    StoreTimeout {
        rank: usize,
        what: String,
        addr: String,
        after: Duration,
    },
}

impl LaunchError {
    /// The exit code a binary ends with on this error: a failed rank's own
    /// code (see [`exit_code`]), 2 for bad launch variables or requests
    /// (bad input), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::RankFailed { status, .. } => exit_code(*status),
            LaunchError::HalfSet { .. }
            | LaunchError::BadVar { .. }
            | LaunchError::RankOutOfRange { .. }
            | LaunchError::Invalid(_) => 2,
            _ => 1,
        }
    }
}

/// Raises this process's soft limit on open files to its hard limit (at
/// most 65,536), once: a rank that serves the store or a data port holds a
/// descriptor per connection, and a crowd of strangers must not run it out
/// of them before the job's own ranks are in.
pub(crate) fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: rlimit is plain data; getrlimit fills it, setrlimit reads it.
        unsafe {
            let mut l: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
                let want = l.rlim_max.min(65_536);
                if l.rlim_cur < want {
                    l.rlim_cur = want;
                    let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &l);
                }
            }
        }
    });
}

/// Lets `listener` queue more connections than the standard library's
/// 128 (the kernel caps it at `net.core.somaxconn`), so that a burst of
/// connections does not refuse a rank before the accept loop takes them.
pub(crate) fn deepen_backlog(listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: listen(2) on a listening socket only changes its backlog.
    unsafe { libc::listen(listener.as_raw_fd(), 4096) };
}

/// What this process is in a job (see the module example).
#[derive(Debug)]
pub enum Role {
    /// It spawned `--nprocs` ranks of itself; they have all ended with this status.
    Launcher(ExitStatus),
    /// It is one rank of a job.
    Rank(RankInfo),
    /// It runs alone (no launcher variables, no `--nprocs`).
    Single,
}

/// Decides this process's [`Role`]: launcher variables win (a spawned child
/// sees the same `--nprocs` flag as its parent and must not spawn again);
/// otherwise `nprocs = Some(n)` spawns `n` local ranks of the running binary
/// with the same arguments and waits for them.
pub fn join_or_spawn(nprocs: Option<usize>) -> Result<Role, LaunchError> {
    if let Some(info) = RankInfo::from_env()? {
        return Ok(Role::Rank(info));
    }
    match nprocs {
        Some(n) => Ok(Role::Launcher(spawn_local_ranks(n, &[])?)),
        None => Ok(Role::Single),
    }
}
