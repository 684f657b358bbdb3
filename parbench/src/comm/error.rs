//! The one error type of every communicator.

use std::time::Duration;

/// What can go wrong in a collective or a point-to-point transfer.
///
/// Every variant that involves another rank names it, so that a hung or dead
/// peer can be found from any rank's message.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A wait passed its deadline.
    #[error("rank {rank}: {op} timed out after {} waiting for rank {peer}", crate::error_line::duration_text(*.after))]
    Timeout {
        rank: usize,
        peer: usize,
        op: &'static str,
        after: Duration,
    },
    /// A peer closed its connection or its thread ended.
    #[error("rank {rank}: lost rank {peer} during {op}: {detail}")]
    PeerLost {
        rank: usize,
        peer: usize,
        op: &'static str,
        detail: String,
    },
    /// A peer sent something that breaks the protocol.
    #[error("rank {rank}: protocol error from rank {peer}: {detail}")]
    Protocol {
        rank: usize,
        peer: usize,
        detail: String,
    },
    /// The caller passed arguments the operation cannot take.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The backend does not offer the operation or type.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Setting up the job (rendezvous, launch, device) failed.
    #[error("setup failed: {0}")]
    Setup(String),
    /// An I/O error outside any one peer (printed, not chained as a
    /// source: a report of the chain would print it twice).
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    /// A device runtime (CUDA, NCCL, MPI) reported an error.
    #[error("{0}")]
    Device(String),
}

impl From<std::io::Error> for CommError {
    fn from(e: std::io::Error) -> Self {
        CommError::Io(e)
    }
}

/// Result of every communicator call.
pub type CommResult<T> = Result<T, CommError>;
/// A GPU call that failed: a bad argument stays one, a missing library or
/// device is a setup error, anything else a device error.
#[cfg(feature = "cuda")]
impl From<crate::gpu::GpuError> for CommError {
    fn from(e: crate::gpu::GpuError) -> Self {
        match e {
            crate::gpu::GpuError::InvalidArgument(m) => CommError::InvalidArgument(m),
            crate::gpu::GpuError::Missing { .. } | crate::gpu::GpuError::NoDevice(_) => {
                CommError::Setup(e.to_string())
            }
            other => CommError::Device(other.to_string()),
        }
    }
}

/// A rendezvous that went wrong is a setup error of the communicator.
impl From<crate::rendezvous::RendezvousError> for CommError {
    fn from(e: crate::rendezvous::RendezvousError) -> Self {
        CommError::Setup(e.to_string())
    }
}
