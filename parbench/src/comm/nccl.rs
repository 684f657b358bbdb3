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

use super::{
    Collective, CommError, CommResult, Communicator, DType, Io, ReduceOp, Replay, StreamClock,
};
use crate::gpu::timing::{CapturedLoop, EventTimer};
use crate::gpu::{self, bandwidth, DeviceBuffer, Gpu, GpuError, Lib};
use crate::launch::{RankInfo, Store};
use cudarc::driver::{result as cu, sys as cusys};
use cudarc::nccl::sys;
use std::ffi::c_void;
use std::time::{Duration, Instant};

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
    /// The rendezvous store of a multi-process job (rank 0 serves it), kept
    /// for the communicator's lifetime as the store asks.
    _store: Option<Store>,
}

// SAFETY: an NCCL communicator may be used from any thread as long as no two
// threads use it at once; `&mut self` on every call guarantees that.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// One communicator per GPU in `ordinals`, all in this process
    /// (`ncclCommInitAll`); rank i drives `ordinals[i]`.
    pub fn init_all(ordinals: &[usize], timeout: Duration) -> CommResult<Vec<NcclComm>> {
        gpu::require(&[Lib::Driver, Lib::Nccl])?;
        if ordinals.is_empty() {
            return Err(CommError::InvalidArgument("no GPU given".into()));
        }
        let gpus = ordinals
            .iter()
            .map(|&o| Gpu::open(o))
            .collect::<Result<Vec<_>, _>>()?;
        let world = gpus.len();
        let devs: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); world];
        gpu::guarded("ncclCommInitAll", || {
            // SAFETY: `comms` has room for `world` handles and `devs` lists as many devices.
            unsafe { sys::ncclCommInitAll(comms.as_mut_ptr(), world as i32, devs.as_ptr()) }
                .result()
                .map(|_| ())
                .map_err(|e| nccl_err("ncclCommInitAll", e.0))
        })?;
        let wire = local_wire(ordinals);
        // Wrapped first, so that a failure below still destroys every communicator.
        let comms: Vec<NcclComm> = comms
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (comm, gpu))| {
                NcclComm::wrap(comm, gpu, rank, world, timeout, wire.clone())
            })
            .collect();
        comms.into_iter().map(NcclComm::with_token).collect()
    }

    /// Joins rank `rank` of `world` on GPU `ordinal`, all ranks holding the
    /// same `id` (`ncclCommInitRank`). NCCL's initialisation has no deadline
    /// of its own, so it runs on a helper thread: past `timeout` this returns
    /// [`CommError::Timeout`] and leaves that thread blocked (the process is
    /// expected to exit).
    pub fn init_rank(
        id: &UniqueId,
        rank: usize,
        world: usize,
        ordinal: usize,
        timeout: Duration,
    ) -> CommResult<NcclComm> {
        gpu::require(&[Lib::Driver, Lib::Nccl])?;
        if rank >= world {
            return Err(CommError::InvalidArgument(format!(
                "rank {rank} of a world of {world}"
            )));
        }
        let gpu = Gpu::open(ordinal)?;
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let g = gpu.clone();
        std::thread::Builder::new()
            .name(format!("nccl-init-{rank}"))
            .spawn(move || {
                let r = gpu::guarded("ncclCommInitRank", || {
                    g.bind()?;
                    let mut comm = std::ptr::null_mut();
                    // SAFETY: valid out-pointer; the id is the one rank 0 made.
                    unsafe { sys::ncclCommInitRank(&mut comm, world as i32, uid, rank as i32) }
                        .result()
                        .map_err(|e| nccl_err("ncclCommInitRank", e.0))?;
                    Ok(comm as usize)
                });
                let _ = tx.send(r);
            })
            .map_err(CommError::Io)?;
        match rx.recv_timeout(timeout) {
            Ok(r) => {
                let comm = r? as sys::ncclComm_t;
                NcclComm::wrap(comm, gpu, rank, world, timeout, "nccl".into()).with_token()
            }
            Err(_) => Err(CommError::Timeout {
                rank,
                peer: 0,
                op: "ncclCommInitRank (waiting for every rank to join rank 0's bootstrap)",
                after: timeout,
            }),
        }
    }

    /// Joins the multi-process job `info` describes (torchrun, mpirun, srun
    /// or `--nprocs` self-spawn): rank 0 makes the NCCL unique id and puts it
    /// in the job's rendezvous store, every rank reads it and initialises.
    /// The GPU is chosen by [`device_for_rank`] before anything else. The
    /// wire is recorded as NVLink/PCIe when all ranks share one host and
    /// this process sees their GPUs, `intra-node` when it sees only its own,
    /// `network` across hosts.
    pub fn join(info: &RankInfo, timeout: Duration) -> CommResult<NcclComm> {
        gpu::require(&[Lib::Driver, Lib::Nccl])?;
        let visible = gpu::device_count()?;
        let ordinal = device_for_rank(
            info.rank,
            info.local_rank,
            visible,
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        )
        .map_err(CommError::InvalidArgument)?;
        let deadline = Instant::now() + timeout;
        let mut store = Store::join(info, timeout)?;
        let id = if info.rank == 0 {
            let id = unique_id()?;
            store.put("nccl/unique_id", &id, deadline)?;
            id
        } else {
            let v = store.get("nccl/unique_id", deadline)?;
            v.as_slice().try_into().map_err(|_| CommError::Protocol {
                rank: info.rank,
                peer: 0,
                detail: format!("NCCL unique id of {} bytes, expected 128", v.len()),
            })?
        };
        // Which hosts the ranks are on decides the recorded wire.
        let host = hostname();
        store.put(
            &format!("nccl/host/{}", info.rank),
            host.as_bytes(),
            deadline,
        )?;
        let mut hosts = std::collections::BTreeSet::new();
        for r in 0..info.world {
            hosts.insert(store.get(&format!("nccl/host/{r}"), deadline)?);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let mut comm = NcclComm::init_rank(
            &id,
            info.rank,
            info.world,
            ordinal,
            left.max(Duration::from_secs(1)),
        )?;
        comm.set_timeout(timeout);
        comm.wire = if hosts.len() > 1 {
            "network".into()
        } else if visible < info.world.min(2) {
            // One GPU per process (CUDA_VISIBLE_DEVICES): the peers' GPUs
            // cannot be queried from here.
            "intra-node".into()
        } else {
            local_wire(&(0..visible).collect::<Vec<_>>())
        };
        comm._store = Some(store);
        Ok(comm)
    }

    fn wrap(
        comm: sys::ncclComm_t,
        gpu: Gpu,
        rank: usize,
        world: usize,
        timeout: Duration,
        wire: String,
    ) -> NcclComm {
        gpu.set_timeout(timeout);
        NcclComm {
            comm,
            gpu,
            rank,
            world,
            timeout,
            wire,
            aborted: None,
            pending: Vec::new(),
            staging: Vec::new(),
            scratch: None,
            token: None,
            sizing: false,
            _store: None,
        }
    }

    /// Allocates the barrier's token, so that no barrier allocates (a
    /// barrier inside a capture must not); dropping `self` on failure
    /// destroys the communicator.
    fn with_token(mut self) -> CommResult<NcclComm> {
        self.token = Some(self.gpu.alloc(4)?);
        Ok(self)
    }

    /// Sets the wire recorded for this communicator (the launcher knows
    /// whether the ranks share a node: `nvlink`, or the network's name).
    pub fn set_wire(&mut self, wire: impl Into<String>) {
        self.wire = wire.into();
    }

    /// The GPU this rank drives.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn live(&self) -> CommResult<()> {
        match &self.aborted {
            None => Ok(()),
            Some(why) => Err(CommError::Device(format!(
                "rank {}: NCCL communicator was aborted earlier ({why})",
                self.rank
            ))),
        }
    }

    /// Checks that `buf` lives on this rank's GPU and holds `bytes` bytes at
    /// `offset`; returns the device address of byte `offset`.
    fn ptr(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        bytes: usize,
        what: &str,
    ) -> CommResult<cusys::CUdeviceptr> {
        if buf.gpu().ordinal() != self.gpu.ordinal() {
            return Err(CommError::InvalidArgument(format!(
                "{what} buffer is on GPU {}, this rank drives GPU {}",
                buf.gpu().ordinal(),
                self.gpu.ordinal()
            )));
        }
        let p = buf.ptr_at(offset, bytes).map_err(|_| {
            CommError::InvalidArgument(format!(
                "{what} buffer holds {} bytes, the call needs {} (offset {offset})",
                buf.len(),
                offset.saturating_add(bytes)
            ))
        })?;
        Ok(p)
    }

    /// (send, recv) pointers of `io`: out of place, `send_bytes` and
    /// `recv_bytes` from each buffer's start; in place, one buffer of
    /// `max(send, recv)` bytes with the send part at `send_off` and the
    /// receive part at `recv_off` (the module table of [`super`]).
    fn io_ptrs(
        &self,
        io: &Io<'_, DeviceBuffer>,
        send_bytes: usize,
        recv_bytes: usize,
        send_off: usize,
        recv_off: usize,
    ) -> CommResult<(*const c_void, *mut c_void)> {
        match io {
            Io::InPlace(buf) => {
                self.ptr(buf, 0, send_bytes.max(recv_bytes), "in-place")?;
                Ok((
                    addr(self.ptr(buf, send_off, send_bytes, "in-place")?),
                    addr(self.ptr(buf, recv_off, recv_bytes, "in-place")?),
                ))
            }
            Io::OutOfPlace { send, recv } => Ok((
                addr(self.ptr(send, 0, send_bytes, "send")?),
                addr(self.ptr(recv, 0, recv_bytes, "recv")?),
            )),
        }
    }

    fn stream(&self) -> sys::cudaStream_t {
        self.gpu.stream().cu_stream() as sys::cudaStream_t
    }

    /// Runs one NCCL call (or group) after binding the context, reported
    /// with NCCL's text on failure. A usage error (bad argument) leaves the
    /// communicator usable; any other error aborts it. In the sizing pass
    /// nothing is issued.
    fn call(
        &mut self,
        what: &'static str,
        f: impl FnOnce() -> sys::ncclResult_t,
    ) -> CommResult<()> {
        self.live()?;
        if self.sizing {
            return Ok(());
        }
        self.gpu.bind()?;
        match f().result() {
            Ok(_) => Ok(()),
            Err(e) => {
                let msg = format!("{what} failed: {}", nccl_text(e.0));
                if !is_usage_error(e.0) {
                    self.abort(&msg);
                }
                Err(CommError::Device(format!("rank {}: {msg}", self.rank)))
            }
        }
    }

    /// Issues pending sends, grouped with `more` (the receive that pairs with them).
    fn flush_with(
        &mut self,
        what: &'static str,
        more: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> sys::ncclResult_t,
    ) -> CommResult<()> {
        let pending = std::mem::take(&mut self.pending);
        let (comm, stream) = (self.comm, self.stream());
        let mut sends = Vec::with_capacity(pending.len());
        for &(idx, count, dtype, peer) in &pending {
            sends.push((
                addr(self.staging[idx].ptr()) as *const c_void,
                count,
                nccl_type(dtype),
                peer as i32,
            ));
        }
        self.call(what, || {
            // SAFETY: every pointer is a live staging buffer sized for its count; the
            // group is closed on every path.
            unsafe {
                let r = sys::ncclGroupStart();
                if r != sys::ncclResult_t::ncclSuccess {
                    return r;
                }
                let mut first = sys::ncclResult_t::ncclSuccess;
                for &(p, count, t, peer) in &sends {
                    let r = sys::ncclSend(p, count, t, peer, comm, stream);
                    if first == sys::ncclResult_t::ncclSuccess {
                        first = r;
                    }
                }
                let r = more(comm, stream);
                if first == sys::ncclResult_t::ncclSuccess {
                    first = r;
                }
                let r = sys::ncclGroupEnd();
                if first == sys::ncclResult_t::ncclSuccess {
                    first = r;
                }
                first
            }
        })
    }

    /// Issues pending sends on their own.
    fn flush(&mut self) -> CommResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.flush_with("ncclSend (pending sends)", |_, _| {
            sys::ncclResult_t::ncclSuccess
        })
    }

    /// Waits for the stream until the deadline, watching NCCL's asynchronous
    /// error; aborts the communicator whenever the wait fails (timeout, NCCL
    /// error, CUDA error), so that no stuck kernel or proxy thread stays.
    fn wait(&mut self, what: &'static str) -> CommResult<()> {
        self.live()?;
        if self.sizing {
            return Ok(());
        }
        let r = self.wait_for_stream(what);
        if let Err(e) = &r {
            self.abort(&e.to_string());
        }
        r
    }

    /// [`NcclComm::wait`] without the abort.
    fn wait_for_stream(&mut self, what: &'static str) -> CommResult<()> {
        let deadline = Instant::now() + self.timeout;
        self.gpu.bind()?;
        let event = self
            .gpu
            .context()
            .new_event(None)
            .map_err(|e| GpuError::call("creating an event", e))?;
        event
            .record(self.gpu.stream())
            .map_err(|e| GpuError::call("recording an event", e))?;
        let start = Instant::now();
        loop {
            match event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    return Err(CommError::Device(format!(
                        "rank {}: {what}: {e}; communicator aborted",
                        self.rank
                    )))
                }
            }
            let mut async_err = sys::ncclResult_t::ncclSuccess;
            // SAFETY: live communicator, valid out-pointer.
            let r = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut async_err) };
            let failed = [r, async_err].into_iter().find(|x| {
                !matches!(
                    x,
                    sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
                )
            });
            if let Some(e) = failed {
                return Err(CommError::Device(format!(
                    "rank {}: {what}: NCCL reported {}; communicator aborted",
                    self.rank,
                    nccl_text(e)
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                // NCCL does not say which peer is missing, so this is not a
                // CommError::Timeout (whose message names one peer).
                return Err(CommError::Device(format!(
                    "rank {}: NCCL {what} did not finish within {:?}; communicator aborted (NCCL cannot tell which rank is missing: rerun with NCCL_DEBUG=INFO, or look for the rank that failed first)",
                    self.rank, self.timeout
                )));
            }
            if now - start < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// `ncclCommAbort`: stops this rank's NCCL kernels so the GPU is usable again.
    fn abort(&mut self, why: &str) {
        if self.aborted.is_none() && !self.comm.is_null() {
            // SAFETY: live communicator, aborted once.
            unsafe {
                let _ = sys::ncclCommAbort(self.comm);
            }
            self.comm = std::ptr::null_mut();
        }
        self.aborted.get_or_insert_with(|| why.to_string());
    }

    /// Ensures `slot` holds a buffer of at least `bytes` bytes.
    fn ensure(gpu: &Gpu, slot: &mut Option<DeviceBuffer>, bytes: usize) -> CommResult<()> {
        if slot.as_ref().is_none_or(|b| b.len() < bytes) {
            *slot = Some(gpu.alloc(bytes)?);
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> CommResult<()> {
        if peer >= self.world {
            return Err(CommError::InvalidArgument(format!(
                "peer {peer} outside a world of {}",
                self.world
            )));
        }
        Ok(())
    }

    fn check_root(&self, root: usize) -> CommResult<()> {
        if root >= self.world {
            return Err(CommError::InvalidArgument(format!(
                "root {root} outside a world of {}",
                self.world
            )));
        }
        Ok(())
    }
}

impl Drop for NcclComm {
    /// Finishes what was queued (within the deadline) so that buffers are
    /// not freed under running kernels, then destroys the communicator, or
    /// aborts it when anything failed: never leaves it (and NCCL's proxy
    /// threads) behind.
    fn drop(&mut self) {
        if self.comm.is_null() {
            return;
        }
        self.sizing = false;
        let flushed = self.flush().is_ok();
        let finished = self.wait("finishing before destroy").is_ok();
        match drop_action(self.comm.is_null(), flushed && finished) {
            DropAction::Nothing => {}
            DropAction::Destroy => {
                // SAFETY: live communicator, destroyed once.
                unsafe {
                    let _ = sys::ncclCommDestroy(self.comm);
                }
                self.comm = std::ptr::null_mut();
            }
            DropAction::Abort => self.abort("dropped after a failed call"),
        }
    }
}

/// What dropping a communicator does to its NCCL handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DropAction {
    /// Already aborted (the handle is gone).
    Nothing,
    /// Everything finished: `ncclCommDestroy`.
    Destroy,
    /// Something failed: `ncclCommAbort`.
    Abort,
}

fn drop_action(aborted: bool, finished: bool) -> DropAction {
    match (aborted, finished) {
        (true, _) => DropAction::Nothing,
        (false, true) => DropAction::Destroy,
        (false, false) => DropAction::Abort,
    }
}

/// Whether NCCL refused a call for its arguments or its use, which leaves
/// the communicator usable (every other error aborts it).
fn is_usage_error(r: sys::ncclResult_t) -> bool {
    matches!(
        r,
        sys::ncclResult_t::ncclInvalidArgument | sys::ncclResult_t::ncclInvalidUsage
    )
}

/// A device address as the pointer NCCL's C signature takes (never
/// dereferenced on the host).
fn addr(p: cusys::CUdeviceptr) -> *mut c_void {
    p as usize as *mut c_void
}

/// The GPU a rank of a multi-process job drives, among the `visible` GPUs
/// this process sees (`cuDeviceGetCount`, which CUDA_VISIBLE_DEVICES
/// narrows; `cuda_visible_devices` is its value, for the message).
///
/// - One visible GPU: device 0, whatever the local rank (the launcher gave
///   each process its own GPU through CUDA_VISIBLE_DEVICES, or there is one).
/// - A local rank: that device, refused in one line when it is not visible.
/// - Neither: the rank modulo the visible GPUs.
pub fn device_for_rank(
    rank: usize,
    local_rank: Option<usize>,
    visible: usize,
    cuda_visible_devices: Option<&str>,
) -> Result<usize, String> {
    let shown = match cuda_visible_devices {
        Some(v) => format!("CUDA_VISIBLE_DEVICES={v}"),
        None => "CUDA_VISIBLE_DEVICES unset".into(),
    };
    match (visible, local_rank) {
        (0, _) => Err(format!("rank {rank}: no GPU visible to this process ({shown})")),
        (1, _) => Ok(0),
        (v, Some(l)) if l >= v => Err(format!(
            "rank {rank}: local rank {l} but this process sees {v} GPUs ({shown}); one process per GPU needs a local rank below {v}, or one GPU made visible to each process"
        )),
        (_, Some(l)) => Ok(l),
        (v, None) => Ok(rank % v),
    }
}

/// This host's name, to tell ranks on one node from ranks across nodes.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::from("unknown-host")
    }
}

fn nccl_type(d: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match d {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::I32 => T::ncclInt32,
        DType::I64 => T::ncclInt64,
        DType::U8 => T::ncclUint8,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as O;
    match op {
        ReduceOp::Sum => O::ncclSum,
        ReduceOp::Prod => O::ncclProd,
        ReduceOp::Min => O::ncclMin,
        ReduceOp::Max => O::ncclMax,
        ReduceOp::Avg => O::ncclAvg,
    }
}

/// NCCL's own text for a result code.
fn nccl_text(r: sys::ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString returns a static string for every code.
    let p = unsafe { sys::ncclGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy();
    format!("{s} ({r:?})")
}

fn nccl_err(what: &str, r: sys::ncclResult_t) -> GpuError {
    GpuError::call(what, nccl_text(r))
}

/// The wire between GPUs of one process: NVLink when every pair has native
/// peer atomics (which PCIe peer-to-peer lacks), `pcie` with plain peer
/// access, `host` without it, `local` for one GPU.
fn local_wire(ordinals: &[usize]) -> String {
    if ordinals.len() < 2 {
        return "local".into();
    }
    let mut all_p2p = true;
    let mut all_atomic = true;
    for &a in ordinals {
        for &b in ordinals {
            if a == b {
                continue;
            }
            let (Ok(da), Ok(db)) = (cu::device::get(a as i32), cu::device::get(b as i32)) else {
                return "unknown".into();
            };
            let mut v = 0;
            // SAFETY: valid devices and out-pointer.
            let ok = unsafe {
                cusys::cuDeviceGetP2PAttribute(
                    &mut v,
                    cusys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                    da,
                    db,
                )
            } == cusys::CUresult::CUDA_SUCCESS;
            all_p2p &= ok && v == 1;
            let mut atomic = 0;
            // SAFETY: as above.
            let ok = unsafe {
                cusys::cuDeviceGetP2PAttribute(
                    &mut atomic,
                    cusys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                    da,
                    db,
                )
            } == cusys::CUresult::CUDA_SUCCESS;
            all_atomic &= ok && atomic == 1;
        }
    }
    match (all_p2p, all_atomic) {
        (true, true) => "nvlink",
        (true, false) => "pcie",
        _ => "host",
    }
    .into()
}

impl Communicator for NcclComm {
    type Buffer = DeviceBuffer;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        "nccl"
    }
    fn wire(&self) -> String {
        self.wire.clone()
    }
    fn algo_for(&self, coll: Collective, bytes: usize) -> String {
        // NCCL's own choice for this size, from its tuning log (written by
        // rank 0 once a call of this size ran); `unknown` until it says.
        match super::nccl_tuning::log_path() {
            Some(p) => super::nccl_tuning::label_for(
                &super::nccl_tuning::read_log(&p),
                coll,
                bytes as u64,
                self.world,
            ),
            None => "unknown".into(),
        }
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        self.gpu.set_timeout(timeout);
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn alloc(&self, bytes: usize) -> CommResult<DeviceBuffer> {
        Ok(self.gpu.alloc(bytes)?)
    }

    fn all_reduce(
        &mut self,
        io: Io<'_, DeviceBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> CommResult<()> {
        self.flush()?;
        let b = count * dtype.size();
        let (s, r) = self.io_ptrs(&io, b, b, 0, 0)?;
        let (comm, stream) = (self.comm, self.stream());
        // SAFETY: pointers checked to hold `count` elements on this GPU.
        self.call("ncclAllReduce", || unsafe {
            sys::ncclAllReduce(s, r, count, nccl_type(dtype), nccl_op(op), comm, stream)
        })
    }

    fn all_gather(
        &mut self,
        io: Io<'_, DeviceBuffer>,
        count: usize,
        dtype: DType,
    ) -> CommResult<()> {
        self.flush()?;
        let b = count * dtype.size();
        let (s, r) = self.io_ptrs(&io, b, b * self.world, self.rank * b, 0)?;
        let (comm, stream) = (self.comm, self.stream());
        // SAFETY: as in all_reduce.
        self.call("ncclAllGather", || unsafe {
            sys::ncclAllGather(s, r, count, nccl_type(dtype), comm, stream)
        })
    }

    fn reduce_scatter(
        &mut self,
        io: Io<'_, DeviceBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> CommResult<()> {
        self.flush()?;
        let b = count * dtype.size();
        let (s, r) = self.io_ptrs(&io, b * self.world, b, 0, self.rank * b)?;
        let (comm, stream) = (self.comm, self.stream());
        // SAFETY: as in all_reduce.
        self.call("ncclReduceScatter", || unsafe {
            sys::ncclReduceScatter(s, r, count, nccl_type(dtype), nccl_op(op), comm, stream)
        })
    }

    fn broadcast(
        &mut self,
        io: Io<'_, DeviceBuffer>,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> CommResult<()> {
        self.check_root(root)?;
        self.flush()?;
        let b = count * dtype.size();
        let (s, r) = self.io_ptrs(&io, b, b, 0, 0)?;
        let (comm, stream) = (self.comm, self.stream());
        // SAFETY: as in all_reduce.
        self.call("ncclBroadcast", || unsafe {
            sys::ncclBroadcast(s, r, count, nccl_type(dtype), root as i32, comm, stream)
        })
    }

    fn reduce(
        &mut self,
        io: Io<'_, DeviceBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> CommResult<()> {
        self.check_root(root)?;
        self.flush()?;
        let b = count * dtype.size();
        let (s, r) = self.io_ptrs(&io, b, b, 0, 0)?;
        let (comm, stream) = (self.comm, self.stream());
        // SAFETY: as in all_reduce.
        self.call("ncclReduce", || unsafe {
            sys::ncclReduce(
                s,
                r,
                count,
                nccl_type(dtype),
                nccl_op(op),
                root as i32,
                comm,
                stream,
            )
        })
    }

    fn all_to_all(
        &mut self,
        io: Io<'_, DeviceBuffer>,
        count: usize,
        dtype: DType,
    ) -> CommResult<()> {
        self.flush()?;
        let b = count * dtype.size();
        let total = b * self.world;
        let (s, r) = match io {
            Io::InPlace(buf) => {
                // Grouped sends and receives on one buffer would overwrite blocks
                // not yet sent: send from a copy.
                let r = self.ptr(buf, 0, total, "in-place")?;
                Self::ensure(&self.gpu, &mut self.scratch, total)?;
                let Some(scratch) = self.scratch.as_ref().map(|s| s.ptr()) else {
                    return Err(CommError::Device("all_to_all scratch missing".into()));
                };
                if !self.sizing && total > 0 {
                    self.gpu.bind()?;
                    // SAFETY: both regions hold `total` bytes on this GPU.
                    unsafe {
                        cu::memcpy_dtod_async(scratch, r, total, self.gpu.stream().cu_stream())
                    }
                    .map_err(|e| GpuError::call("in-place all_to_all copy", e))?;
                }
                (scratch, r)
            }
            Io::OutOfPlace { send, recv } => (
                self.ptr(send, 0, total, "send")?,
                self.ptr(recv, 0, total, "recv")?,
            ),
        };
        let (comm, stream, world, t) = (self.comm, self.stream(), self.world, nccl_type(dtype));
        // SAFETY: block j of each buffer lies inside it (checked `total`); the group closes on every path.
        self.call("all_to_all (grouped ncclSend/ncclRecv)", || unsafe {
            let r0 = sys::ncclGroupStart();
            if r0 != sys::ncclResult_t::ncclSuccess {
                return r0;
            }
            let mut first = sys::ncclResult_t::ncclSuccess;
            for j in 0..world {
                // Device addresses by integer arithmetic: they point into no
                // Rust allocation, so pointer offsets would be undefined.
                let off = (j * b) as u64;
                for r in [
                    sys::ncclSend(addr(s + off), count, t, j as i32, comm, stream),
                    sys::ncclRecv(addr(r + off), count, t, j as i32, comm, stream),
                ] {
                    if first == sys::ncclResult_t::ncclSuccess {
                        first = r;
                    }
                }
            }
            let r = sys::ncclGroupEnd();
            if first == sys::ncclResult_t::ncclSuccess {
                r
            } else {
                first
            }
        })
    }

    fn send(
        &mut self,
        buf: &DeviceBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        self.live()?;
        self.check_peer(peer)?;
        let b = count * dtype.size();
        let src = self.ptr(buf, 0, b, "send")?;
        // Staging buffers are reused round-robin once their send was issued
        // (the capture's sizing pass allocates the ones a graph will use).
        let idx = self.pending.len();
        if self.staging.len() <= idx {
            self.staging.push(self.gpu.alloc(b)?);
        } else if self.staging[idx].len() < b {
            self.staging[idx] = self.gpu.alloc(b)?;
        }
        if !self.sizing && b > 0 {
            self.gpu.bind()?;
            // SAFETY: both regions hold `b` bytes on this GPU; stream order keeps
            // the copy after earlier uses of the staging buffer.
            unsafe {
                cu::memcpy_dtod_async(
                    self.staging[idx].ptr(),
                    src,
                    b,
                    self.gpu.stream().cu_stream(),
                )
            }
            .map_err(|e| GpuError::call("staging a send", e))?;
        }
        self.pending.push((idx, count, dtype, peer));
        Ok(())
    }

    fn recv(
        &mut self,
        buf: &mut DeviceBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        self.check_peer(peer)?;
        let r = addr(self.ptr(buf, 0, count * dtype.size(), "recv")?);
        let t = nccl_type(dtype);
        // SAFETY: `r` holds `count` elements on this GPU.
        self.flush_with("ncclRecv", |comm, stream| unsafe {
            sys::ncclRecv(r, count, t, peer as i32, comm, stream)
        })
    }

    fn send_recv(
        &mut self,
        send: &DeviceBuffer,
        to: usize,
        recv: &mut DeviceBuffer,
        from: usize,
        count: usize,
        dtype: DType,
    ) -> CommResult<()> {
        self.check_peer(to)?;
        self.check_peer(from)?;
        let b = count * dtype.size();
        let s = addr(self.ptr(send, 0, b, "send")?) as *const c_void;
        let r = addr(self.ptr(recv, 0, b, "recv")?);
        let t = nccl_type(dtype);
        // SAFETY: both hold `count` elements on this GPU; grouped with any pending sends.
        self.flush_with("ncclSend/ncclRecv", |comm, stream| unsafe {
            let a = sys::ncclSend(s, count, t, to as i32, comm, stream);
            let b = sys::ncclRecv(r, count, t, from as i32, comm, stream);
            if a == sys::ncclResult_t::ncclSuccess {
                b
            } else {
                a
            }
        })
    }

    fn barrier(&mut self) -> CommResult<()> {
        self.flush()?;
        let Some(p) = self.token.as_ref().map(|t| addr(t.ptr())) else {
            return Err(CommError::Device("the barrier's token is missing".into()));
        };
        let (comm, stream) = (self.comm, self.stream());
        // SAFETY: the token holds one f32.
        self.call("barrier (one-element ncclAllReduce)", || unsafe {
            sys::ncclAllReduce(
                p,
                p,
                1,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                comm,
                stream,
            )
        })?;
        self.wait("barrier")
    }

    fn sync(&mut self) -> CommResult<()> {
        self.flush()?;
        self.wait("sync")
    }

    fn stream_clock(&mut self, points: usize) -> CommResult<Option<Box<dyn StreamClock>>> {
        self.flush()?;
        Ok(Some(Box::new(EventClock {
            timer: EventTimer::new(&self.gpu, points)?,
            timeout: self.timeout,
        })))
    }

    /// Captures `launches` calls of `op`. First `op` runs once in a sizing
    /// pass that checks its arguments and allocates every staging buffer and
    /// scratch it needs while issuing nothing, because nothing may be
    /// allocated during the capture (see the module documentation).
    fn capture(
        &mut self,
        launches: usize,
        op: &mut dyn FnMut(&mut Self) -> CommResult<()>,
    ) -> CommResult<Box<dyn Replay>> {
        self.flush()?;
        self.sizing = true;
        let sized = op(self).and_then(|()| self.flush());
        self.sizing = false;
        self.pending.clear();
        sized?;
        let gpu = self.gpu.clone();
        let graph = CapturedLoop::capture(&gpu, launches, || -> CommResult<()> {
            op(self)?;
            // Staged sends must be issued inside the capture, not after it.
            self.flush()
        });
        // A failed capture may leave staged sends that were recorded, not run.
        self.pending.clear();
        Ok(Box::new(GraphReplay(graph?)))
    }

    /// One rank, or ranks on several hosts: this GPU's device-to-device copy
    /// bandwidth. Ranks on one host: the peer copy bandwidth from this rank's
    /// GPU to the next visible one (the NVLink figure). Each rank measures
    /// its own; the sweep combines them as for host backends.
    fn device_ceiling(&mut self) -> CommResult<Option<(String, f64)>> {
        self.sync()?;
        let bytes = 256 << 20;
        if self.world == 1 || self.wire == "network" {
            let gbps = bandwidth::device_copy_gbps(&self.gpu, bytes, self.timeout)?;
            return Ok(Some((
                format!(
                    "device-to-device copy on GPU {}, 256 MiB",
                    self.gpu.ordinal()
                ),
                gbps,
            )));
        }
        let visible = gpu::device_count()?;
        let next = (self.gpu.ordinal() + 1) % visible.max(1);
        if next == self.gpu.ordinal() {
            return Ok(None);
        }
        let peer = Gpu::open(next)?;
        let copies = bandwidth::peer_copy_gbps(&[self.gpu.clone(), peer], bytes, self.timeout)?;
        let out = copies.iter().find(|c| c.src == self.gpu.ordinal());
        Ok(out.map(|c| {
            (
                format!(
                    "peer copy GPU {} -> GPU {}, 256 MiB ({})",
                    c.src,
                    c.dst,
                    if c.direct {
                        "direct"
                    } else {
                        "staged through the host"
                    }
                ),
                c.gbps,
            )
        }))
    }
}

/// CUDA events on the communicator's stream.
struct EventClock {
    timer: EventTimer,
    timeout: Duration,
}

impl StreamClock for EventClock {
    fn mark(&mut self) -> CommResult<()> {
        Ok(self.timer.mark()?)
    }
    fn intervals(&mut self) -> CommResult<Vec<f64>> {
        Ok(self.timer.intervals(self.timeout)?)
    }
}

/// A CUDA graph of captured NCCL calls.
struct GraphReplay(CapturedLoop);

impl Replay for GraphReplay {
    fn replay(&mut self) -> CommResult<()> {
        Ok(self.0.replay()?)
    }
    fn launches(&self) -> usize {
        self.0.launches()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_visible_gpu_is_device_zero_whatever_the_local_rank() {
        // torchrun with CUDA_VISIBLE_DEVICES=$LOCAL_RANK per process.
        for l in [None, Some(0), Some(3), Some(7)] {
            assert_eq!(device_for_rank(3, l, 1, Some("3")), Ok(0), "{l:?}");
        }
    }

    #[test]
    fn the_local_rank_picks_among_several_visible_gpus() {
        assert_eq!(device_for_rank(9, Some(1), 8, None), Ok(1));
        assert_eq!(device_for_rank(9, Some(7), 8, None), Ok(7));
        // No local rank: the rank modulo the visible GPUs.
        assert_eq!(device_for_rank(9, None, 8, None), Ok(1));
        assert_eq!(device_for_rank(3, None, 2, Some("4,5")), Ok(1));
    }

    #[test]
    fn a_local_rank_beyond_the_visible_gpus_is_one_line() {
        let e = device_for_rank(5, Some(5), 4, Some("0,1,2,3")).unwrap_err();
        assert!(e.contains("local rank 5") && e.contains("4 GPUs"), "{e}");
        assert!(e.contains("CUDA_VISIBLE_DEVICES=0,1,2,3"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = device_for_rank(0, Some(0), 0, Some("")).unwrap_err();
        assert!(e.contains("no GPU visible"), "{e}");
    }

    #[test]
    fn drop_destroys_after_a_clean_finish_and_aborts_otherwise() {
        assert_eq!(drop_action(false, true), DropAction::Destroy);
        assert_eq!(drop_action(false, false), DropAction::Abort);
        assert_eq!(drop_action(true, false), DropAction::Nothing);
        assert_eq!(drop_action(true, true), DropAction::Nothing);
    }

    #[test]
    fn only_usage_errors_leave_the_communicator_usable() {
        use sys::ncclResult_t as R;
        assert!(is_usage_error(R::ncclInvalidArgument));
        assert!(is_usage_error(R::ncclInvalidUsage));
        for r in [
            R::ncclUnhandledCudaError,
            R::ncclSystemError,
            R::ncclInternalError,
            R::ncclRemoteError,
        ] {
            assert!(!is_usage_error(r), "{r:?}");
        }
    }

    #[test]
    fn device_addresses_are_integers() {
        let base: cusys::CUdeviceptr = 0x7f00_0000_1000;
        assert_eq!(addr(base + 256) as usize, 0x7f00_0000_1100);
    }
}
