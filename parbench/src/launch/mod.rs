//! Starting the ranks of a job: self-spawn of N local ranks (`--nprocs N`),
//! signals, the exit-code convention, the flag values every binary shares,
//! and [`ranks`], the one launcher of every backend. How a process learns
//! its rank (launcher variables) and the store ranks meet at are
//! [`crate::rendezvous`]'s, below `comm`; they are re-exported here.
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

mod choose;
pub mod flags;
pub mod interrupt;
pub mod ranks;
mod spawn;
pub mod usage;

// What a rank finds before any communicator exists lives below `comm` (the
// tcp and nccl backends meet there); the launcher's users find it here too.
pub use crate::error_line as report;
pub use crate::error_line::{duration_text, eprint_line};
pub use crate::rendezvous::{
    ranks_on_this_host, store, LaunchSource, RankInfo, RendezvousError, Store, DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT, DEFAULT_TOKEN,
};
pub use spawn::{
    exit_code, hand_store_listener, how_it_ended, new_token, spawn_local_ranks, LocalJob,
    STOP_GRACE,
};
pub use usage::{
    check_env_settings, end_on_error, exit_code_of, Reported, UsageError, EXIT_FAULT, EXIT_USAGE,
};

use std::process::ExitStatus;
use std::time::Duration;

/// What can go wrong while finding, spawning or joining the ranks of a job.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The launcher's variables or the rendezvous store.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// `--nprocs` was asked for something that cannot run.
    #[error("invalid launch request: {0}")]
    Invalid(String),
    /// Starting or watching a child process failed.
    #[error("launching rank {rank}: {error}")]
    Spawn { rank: usize, error: std::io::Error },
    /// A spawned rank ended with a failure, the first to do so; the others
    /// were stopped. The launcher has already said so on stderr.
    #[error("rank {rank} {} {} after launch; the other ranks were stopped", how_it_ended(*.status), duration_text(*.after))]
    RankFailed {
        rank: usize,
        status: ExitStatus,
        /// When it ended, from the launch.
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
            LaunchError::Invalid(_) => 2,
            LaunchError::Rendezvous(e) => e.exit_code(),
            LaunchError::Spawn { .. } => 1,
        }
    }
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
