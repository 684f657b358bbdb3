//! Backend `nccl` (feature `cuda`): the [`Communicator`] over NCCL, on
//! device buffers ([`DeviceBuffer`]), every call issued on the GPU's one stream.
//!
//! Two ways to build one, as nccl-tests offers:
//! - [`NcclComm::init_all`]: one process drives every local GPU, one
//!   communicator per GPU (`ncclCommInitAll`); the caller moves each into its
//!   own thread (nccl-tests' `-t N -g 1`).
//! - [`NcclComm::init_rank`]: one process per GPU, across nodes; rank 0 makes
//!   a [`unique_id`] and every rank receives it through the rendezvous store.
//!
//! Calls are asynchronous on the device: a collective returns once NCCL has
//! queued it. [`Communicator::sync`] waits for the stream with the deadline
//! of [`Communicator::timeout`], polling NCCL's asynchronous error as well;
//! past the deadline the communicator is aborted (`ncclCommAbort`, which
//! frees the GPU of its stuck kernels) and every later call fails. The error
//! is [`CommError::Device`], not [`CommError::Timeout`]: NCCL does not say
//! which peer it waits for, and a Timeout names one.
//!
//! Point-to-point: NCCL's `ncclSend` blocks the *device* until the peer posts
//! the matching receive, so two ranks that send to each other before
//! receiving would hang. To keep the [`Communicator::send`] contract, a send
//! copies its data into a staging buffer on the stream (so the caller may
//! reuse its buffer at once) and is issued in one NCCL group with the next
//! receive, or at the next collective, sync or barrier. `send_recv` and
//! `all_to_all` are grouped directly and stage nothing.
//!
//! Buffers: every buffer comes from `cuMemAlloc` ([`Gpu::alloc`]), never the
//! stream-ordered pool, and none is allocated while a graph is captured:
//! the barrier's token exists from the start, and [`Communicator::capture`]
//! first runs the captured call once in a sizing pass that issues nothing
//! but allocates the staging buffers and the in-place all_to_all scratch it
//! will use, so the graph replays any number of times.
//!
//! Failures: a wait that fails in any way (timeout, NCCL's asynchronous
//! error, a CUDA error) aborts the communicator (`ncclCommAbort`), as does
//! a call that NCCL fails with a system, internal, CUDA or remote error;
//! dropping a communicator destroys it after a clean wait and aborts it
//! otherwise, so NCCL's proxy threads never outlive it.
//!
//! [`CommError::Device`]: crate::comm::CommError::Device
//! [`CommError::Timeout`]: crate::comm::CommError::Timeout
//! [`Communicator::capture`]: crate::comm::Communicator::capture
//! [`Communicator::send`]: crate::comm::Communicator::send
//! [`Communicator::sync`]: crate::comm::Communicator::sync
//! [`Communicator::timeout`]: crate::comm::Communicator::timeout
//! [`Communicator`]: crate::comm::Communicator

use crate::comm::{CommResult, DType};
use crate::gpu::{self, DeviceBuffer, Gpu, GpuError, Lib};
use crate::rendezvous::Store;
use cudarc::nccl::sys;
use std::time::Duration;

/// The 128 bytes that let ranks of different processes find each other
/// (NCCL's `ncclUniqueId`); rank 0 makes it, the store carries it.
pub type UniqueId = [u8; 128];

/// Makes a fresh NCCL unique id (on the rank that hosts the bootstrap: rank 0).
pub fn unique_id() -> CommResult<UniqueId> {
    gpu::require(&[Lib::Nccl])?;
    let id = gpu::guarded("ncclGetUniqueId", || {
        cudarc::nccl::result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e.0))
    })?;
    Ok(id.internal.map(|c| c as u8))
}

/// The NCCL library's version as `major.minor.patch`.
pub fn nccl_version() -> CommResult<String> {
    gpu::require(&[Lib::Nccl])?;
    let v = gpu::guarded("ncclGetVersion", || {
        cudarc::nccl::result::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e.0))
    })?;
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
}

/// A [`Communicator`] over one NCCL communicator and one GPU.
pub struct NcclComm {
    comm: sys::ncclComm_t,
    gpu: Gpu,
    rank: usize,
    world: usize,
    timeout: Duration,
    wire: String,
    /// Set once the communicator was aborted after a timeout or an error.
    aborted: Option<String>,
    /// Sends copied into staging buffers, not yet issued: (staging index, count, dtype, peer).
    pending: Vec<(usize, usize, DType, usize)>,
    /// Staging buffers of pending sends, reused once issued (stream order keeps them safe).
    staging: Vec<DeviceBuffer>,
    /// Scratch for in-place all_to_all.
    scratch: Option<DeviceBuffer>,
    /// One element, for the barrier; allocated with the communicator.
    token: Option<DeviceBuffer>,
    /// Set during [`Communicator::capture`]'s sizing pass: calls check their
    /// arguments and allocate what they need, and issue nothing.
    sizing: bool,
    /// The PreMulSum operator `mulsum` made and keeps (one at a time), and
    /// the type it was made for; see `redop`.
    premul: Option<(DType, redop::RedOp)>,
    /// The rendezvous store of a multi-process job (rank 0 serves it), kept
    /// for the communicator's lifetime as the store asks.
    _store: Option<Store>,
}

// SAFETY: an NCCL communicator may be used from any thread as long as no two
// threads use it at once; `&mut self` on every call guarantees that.
unsafe impl Send for NcclComm {}

mod communicator;
mod device_buffer;
mod redop;
mod setup;
mod transfer;
mod wait;
mod wire;

pub use setup::device_for_rank;

/// NCCL's own text for a result code.
pub(super) fn nccl_text(r: sys::ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString returns a static string for every code.
    let p = unsafe { sys::ncclGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy();
    format!("{s} ({r:?})")
}

pub(super) fn nccl_err(what: &str, r: sys::ncclResult_t) -> GpuError {
    GpuError::call(what, nccl_text(r))
}
