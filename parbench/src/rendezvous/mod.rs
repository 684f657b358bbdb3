//! How the ranks of a job find each other: the launcher's variables that
//! give a process its rank (torchrun, mpirun, PMI, srun, a spawning
//! parent: [`RankInfo`]) and the rendezvous store on rank 0 where they
//! meet ([`Store`]).
//!
//! It sits below `comm`: the tcp and nccl backends meet here, and the
//! launcher above `comm` (`launch`) reads the same variables to decide
//! how to start the ranks.

mod env;
mod socket;
pub mod store;

pub use env::{
    check_launch_vars, ranks_on_this_host, ranks_on_this_host_from, LaunchSource, RankInfo,
    DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, DEFAULT_TOKEN, LOCAL_SIZE_VARS,
};
pub(crate) use socket::{deepen_backlog, pollfd, raise_fd_limit};
pub use store::Store;

use crate::error_line::duration_text;
use std::time::Duration;

/// What can go wrong while reading the launcher's variables or meeting at
/// the rendezvous store.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
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

impl RendezvousError {
    /// The exit code a binary ends with on this error: 2 for bad launch
    /// variables (bad input), 1 for a store that failed.
    pub fn exit_code(&self) -> i32 {
        match self {
            RendezvousError::HalfSet { .. }
            | RendezvousError::BadVar { .. }
            | RendezvousError::RankOutOfRange { .. } => 2,
            RendezvousError::Store { .. } | RendezvousError::StoreTimeout { .. } => 1,
        }
    }
}
