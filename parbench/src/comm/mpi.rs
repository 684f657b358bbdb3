//! Backend `mpi` (feature `mpi`): the [`Communicator`] over MPI's own
//! collectives, through rsmpi's raw bindings, so that parbench's backends can
//! be measured beside the engine users already trust, in one report.
//!
//! Launch with `mpirun -np N BINARY --backend mpi ...`.
//!
//! Two things MPI does not give us, and what this backend does instead:
//! - Deadlines: MPI calls cannot time out. A watchdog thread is armed around
//!   every call; when a call outlives the communicator's timeout it prints
//!   which rank gave up on which operation and exits the process (status 3),
//!   which makes mpirun end the whole job — the nearest MPI allows to "no
//!   receive waits forever".
//! - Half types: MPI has no f16/bf16, so reductions on them are
//!   [`CommError::Unsupported`]; data movement (gather, broadcast, all-to-all,
//!   send/recv) carries them as bytes.
//!
//! In place: rsmpi exposes no `MPI_IN_PLACE`. Its value is
//! implementation-defined (`(void*)1` in Open MPI, `(void*)-1` in MPICH); the
//! library version string tells which one is loaded. With an unknown
//! implementation, in-place calls copy the input to a scratch buffer first
//! and say so in [`Communicator::algo_for`].

use super::collective::premul::premultiplied;
use super::library::{self, LibraryCalls};
use super::{
    copy_bytes, nbytes, need, CollArgs, Collective, CommBuffer, CommError, CommResult,
    Communicator, DType, HostBuffer, Io, ReduceOp, VCounts,
};
use mpi::ffi;
use mpi::traits::{AsRaw, Communicator as _};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs this process's own binary as an `np`-rank job under `mpirun`
/// (loopback only), each rank with `args` and the variable `role` set to
/// `value` (and passed on by `-x`): how a test re-runs itself as the ranks
/// of an MPI job. `None` when `mpirun` is not installed.
pub fn rerun_under_mpirun(
    np: usize,
    args: &[&str],
    (role, value): (&str, &str),
) -> Option<std::io::Result<std::process::Output>> {
    let probe = std::process::Command::new("mpirun")
        .arg("--version")
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return None;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return Some(Err(e)),
    };
    let np = np.to_string();
    Some(
        std::process::Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                &np,
                "-x",
                role,
            ])
            .arg(exe)
            .args(args)
            .env(role, value)
            // Loopback only, no network interfaces probed beyond it.
            .env("OMPI_MCA_btl_tcp_if_include", "lo")
            .env("OMPI_MCA_oob_tcp_if_include", "lo")
            .output(),
    )
}

/// The MPI communicator: MPI_COMM_WORLD of this process.
pub struct MpiComm {
    _universe: mpi::environment::Universe,
    comm: ffi::MPI_Comm,
    rank: usize,
    world: usize,
    timeout: Duration,
    in_place: *mut c_void,
    library: String,
    watchdog: Watchdog,
    scratch: Vec<u8>,
    /// The scaled copy of an out-of-place input that `mulsum` sums
    /// (`collective::premul`), kept between calls.
    premul: HostBuffer,
    /// Sends in flight, with the copies they read from.
    pending: Vec<(ffi::MPI_Request, Vec<u8>)>,
}

// SAFETY: MpiComm is used from one thread at a time (Communicator methods take
// &mut self); MPI is initialised with at least funneled support and the handle
// is a plain value.
unsafe impl Send for MpiComm {}

impl MpiComm {
    /// Initialises MPI (once per process) and wraps MPI_COMM_WORLD.
    pub fn init(timeout: Duration) -> CommResult<Self> {
        let (universe, _threading) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| CommError::Setup("MPI is already initialised in this process".into()))?;
        let world = universe.world();
        let comm = world.as_raw();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        let library = mpi::environment::library_version()
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or("")
            // Open MPI's string carries its C terminator: keep it out of run.json.
            .trim_matches(|c: char| c == '\0' || c == ',' || c.is_whitespace())
            .to_string();
        let in_place = if library.contains("Open MPI") {
            std::ptr::without_provenance_mut::<c_void>(1)
        } else if library.contains("MPICH") || library.contains("Intel") {
            std::ptr::without_provenance_mut::<c_void>(usize::MAX)
        } else {
            std::ptr::null_mut()
        };
        Ok(MpiComm {
            _universe: universe,
            comm,
            rank,
            world: size,
            timeout,
            in_place,
            library,
            watchdog: Watchdog::start(rank),
            scratch: Vec::new(),
            premul: HostBuffer::default(),
            pending: Vec::new(),
        })
    }

    /// The MPI library's version line (e.g. `Open MPI v4.1.4`), for run metadata.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Runs one MPI call under the watchdog and maps its return code.
    fn call(&self, op: &'static str, f: impl FnOnce() -> c_int) -> CommResult<()> {
        self.watchdog.arm(op, self.timeout);
        let rc = f();
        self.watchdog.disarm();
        if rc == 0 {
            Ok(())
        } else {
            Err(CommError::Device(format!(
                "rank {}: MPI {op} failed with error code {rc}",
                self.rank
            )))
        }
    }

    /// Completes finished sends (all of them, waiting, with `wait`).
    fn reap_sends(&mut self, wait: bool) -> CommResult<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let mut done: c_int = 0;
            let req: *mut ffi::MPI_Request = &mut self.pending[i].0;
            if wait {
                // SAFETY: req is a live request from MPI_Isend.
                self.call("MPI_Wait(send)", || unsafe {
                    ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE)
                })?;
                done = 1;
            } else {
                // SAFETY: as above.
                self.call("MPI_Test(send)", || unsafe {
                    ffi::MPI_Test(req, &mut done, ffi::RSMPI_STATUS_IGNORE)
                })?;
            }
            if done != 0 {
                self.pending.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn check_rank(&self, what: &str, r: usize) -> CommResult<()> {
        if r >= self.world {
            return Err(CommError::InvalidArgument(format!(
                "{what} {r} is not a rank of a world of {}",
                self.world
            )));
        }
        Ok(())
    }

    /// MPI's count and the bytes of a message of `count` elements to or
    /// from `peer`, after checking the peer and that `buf` (the `what`
    /// buffer) holds them.
    fn message(
        &self,
        buf: &HostBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
        what: &str,
    ) -> CommResult<(c_int, usize)> {
        self.check_rank("peer", peer)?;
        let n = count_i32(count)?;
        let bytes = nbytes(count, 1, dtype)?;
        need(buf, bytes, what)?;
        Ok((n, bytes))
    }

    /// (send pointer, recv pointer) for an operation whose in-place form keeps
    /// the input where MPI_IN_PLACE expects it. With an unknown MPI, the input is
    /// staged through `scratch` instead.
    fn io_ptrs(
        &mut self,
        io: Io<'_, HostBuffer>,
        send_bytes: usize,
        recv_bytes: usize,
        in_place_input_offset: usize,
    ) -> CommResult<(*const c_void, *mut c_void)> {
        match io {
            Io::OutOfPlace { send, recv } => {
                need(send, send_bytes, "send")?;
                need(recv, recv_bytes, "recv")?;
                Ok((
                    send.bytes().as_ptr() as *const c_void,
                    recv.bytes_mut().as_mut_ptr() as *mut c_void,
                ))
            }
            Io::InPlace(buf) => {
                need(buf, send_bytes.max(recv_bytes), "in-place")?;
                let recv = buf.bytes_mut().as_mut_ptr() as *mut c_void;
                if !self.in_place.is_null() {
                    return Ok((self.in_place as *const c_void, recv));
                }
                self.scratch.clear();
                self.scratch.extend_from_slice(
                    &buf.bytes()[in_place_input_offset..in_place_input_offset + send_bytes],
                );
                Ok((self.scratch.as_ptr() as *const c_void, recv))
            }
        }
    }
}

fn datatype(dtype: DType) -> ffi::MPI_Datatype {
    // SAFETY: reading constants that mpi-sys initialises at load time.
    unsafe {
        match dtype {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
            DType::I8 => ffi::RSMPI_INT8_T,
            DType::U32 => ffi::RSMPI_UINT32_T,
            DType::U64 => ffi::RSMPI_UINT64_T,
            // Moved as words of their size; reductions on them are refused before this.
            DType::F16 | DType::BF16 => ffi::RSMPI_UINT16_T,
            DType::F8E4M3 | DType::F8E5M2 => ffi::RSMPI_UINT8_T,
        }
    }
}

/// Why MPI cannot reduce `dtype`: it has no 16- or 8-bit float type.
fn cannot_reduce(dtype: DType) -> Option<String> {
    matches!(
        dtype,
        DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
    )
    .then(|| {
        format!(
            "MPI has no {dtype} type, so the mpi backend cannot reduce it (data movement works)"
        )
    })
}

fn reduce_op(dtype: DType, op: ReduceOp) -> CommResult<ffi::MPI_Op> {
    if let Some(why) = cannot_reduce(dtype) {
        return Err(CommError::Unsupported(why));
    }
    // SAFETY: reading constants that mpi-sys initialises at load time.
    Ok(unsafe {
        match op {
            // MulSum's inputs arrive scaled (`MpiComm::collective`).
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => ffi::RSMPI_SUM,
            ReduceOp::Prod => ffi::RSMPI_PROD,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Max => ffi::RSMPI_MAX,
        }
    })
}

/// An MPI call that moves blocks (`MPI_Allgather`, `MPI_Alltoall`: one
/// signature), with its name.
struct BlockCall(
    &'static str,
    unsafe extern "C" fn(
        *const c_void,
        c_int,
        ffi::MPI_Datatype,
        *mut c_void,
        c_int,
        ffi::MPI_Datatype,
        ffi::MPI_Comm,
    ) -> c_int,
);

/// MPI's operator, the count and the block's bytes of a reducing call.
fn reducing(args: &CollArgs) -> CommResult<(ffi::MPI_Op, c_int, usize)> {
    Ok((
        reduce_op(args.dtype, args.op)?,
        count_i32(args.count)?,
        nbytes(args.count, 1, args.dtype)?,
    ))
}

fn count_i32(count: usize) -> CommResult<c_int> {
    c_int::try_from(count).map_err(|_| {
        CommError::InvalidArgument(format!(
            "MPI counts are 32-bit: {count} elements is too many"
        ))
    })
}

impl Communicator for MpiComm {
    type Buffer = HostBuffer;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        "mpi"
    }
    fn wire(&self) -> String {
        std::env::var("PARBENCH_WIRE").unwrap_or_else(|_| "mpi".into())
    }
    fn algo_for(&self, coll: Collective, bytes: usize) -> String {
        if let Some(host) = library::host_algo_for(coll, self.world, bytes) {
            return host;
        }
        // MPI chooses its own algorithm (Open MPI's tuned component); we cannot see which.
        if self.in_place.is_null() {
            "mpi(staged-in-place)".into()
        } else {
            "mpi".into()
        }
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn alloc(&self, bytes: usize) -> CommResult<HostBuffer> {
        Ok(HostBuffer::zeroed(bytes))
    }

    fn collective(
        &mut self,
        coll: Collective,
        io: Io<'_, HostBuffer>,
        args: CollArgs,
    ) -> CommResult<()> {
        // MPI has no PreMulSum: `mulsum` sums inputs scaled beforehand.
        let mut args = args;
        let mut copy = std::mem::take(&mut self.premul);
        let (rank, world) = (self.rank, self.world);
        let io = premultiplied(coll, io, &mut args, rank, world, &mut copy)?;
        let result = library::collective(self, coll, io, args);
        self.premul = copy;
        result
    }

    fn cannot_run(&self, dtype: DType, reduces: bool) -> Option<String> {
        cannot_reduce(dtype).filter(|_| reduces)
    }

    fn send(
        &mut self,
        buf: &HostBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        let (n, bytes) = self.message(buf, count, dtype, peer, "send")?;
        // The trait promises that two ranks sending to each other at once do
        // not deadlock, and MPI_Send of a large message waits for the receiver:
        // so the message is copied and sent with MPI_Isend, and completed later
        // (at the next send, at a barrier, or when the communicator drops).
        let staged = buf.bytes()[..bytes].to_vec();
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let comm = self.comm;
        // SAFETY: `staged` lives in `pending` until the request completes.
        self.call("MPI_Isend", || unsafe {
            ffi::MPI_Isend(
                staged.as_ptr() as *const c_void,
                n,
                datatype(dtype),
                peer as c_int,
                0,
                comm,
                &mut req,
            )
        })?;
        self.pending.push((req, staged));
        self.reap_sends(false)
    }

    fn recv(
        &mut self,
        buf: &mut HostBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        let (n, _) = self.message(buf, count, dtype, peer, "recv")?;
        let p = buf.bytes_mut().as_mut_ptr() as *mut c_void;
        let comm = self.comm;
        // SAFETY: p covers the message.
        self.call("MPI_Recv", || unsafe {
            ffi::MPI_Recv(
                p,
                n,
                datatype(dtype),
                peer as c_int,
                0,
                comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        })
    }

    fn send_recv(
        &mut self,
        send: &HostBuffer,
        to: usize,
        recv: &mut HostBuffer,
        from: usize,
        count: usize,
        dtype: DType,
    ) -> CommResult<()> {
        self.check_rank("peer", to)?;
        self.check_rank("peer", from)?;
        let n = count_i32(count)?;
        let bytes = nbytes(count, 1, dtype)?;
        need(send, bytes, "send")?;
        need(recv, bytes, "recv")?;
        let (s, r) = (
            send.bytes().as_ptr() as *const c_void,
            recv.bytes_mut().as_mut_ptr() as *mut c_void,
        );
        let (comm, dt) = (self.comm, datatype(dtype));
        // SAFETY: sizes checked above.
        self.call("MPI_Sendrecv", || unsafe {
            ffi::MPI_Sendrecv(
                s,
                n,
                dt,
                to as c_int,
                1,
                r,
                n,
                dt,
                from as c_int,
                1,
                comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        })
    }

    fn all_to_all_v(
        &mut self,
        send: &HostBuffer,
        recv: &mut HostBuffer,
        counts: &VCounts,
        dtype: DType,
    ) -> CommResult<()> {
        counts.check(self.world, dtype, send.len_bytes(), recv.len_bytes())?;
        // MPI's counts and displacements are 32-bit element counts.
        let ints = |list: Vec<usize>| {
            list.into_iter()
                .map(count_i32)
                .collect::<CommResult<Vec<_>>>()
        };
        let world = self.world;
        let send_counts = ints(counts.send().to_vec())?;
        let send_at = ints((0..world).map(|j| counts.send_range(j).start).collect())?;
        let recv_counts = ints(counts.recv().to_vec())?;
        let recv_at = ints((0..world).map(|i| counts.recv_range(i).start).collect())?;
        let (s, r) = (
            send.bytes().as_ptr() as *const c_void,
            recv.bytes_mut().as_mut_ptr() as *mut c_void,
        );
        let (comm, dt) = (self.comm, datatype(dtype));
        // SAFETY: the counts were checked against both buffers; every list holds `world` entries.
        self.call("MPI_Alltoallv", || unsafe {
            ffi::MPI_Alltoallv(
                s,
                send_counts.as_ptr(),
                send_at.as_ptr(),
                dt,
                r,
                recv_counts.as_ptr(),
                recv_at.as_ptr(),
                dt,
                comm,
            )
        })
    }

    fn barrier(&mut self) -> CommResult<()> {
        self.reap_sends(true)?;
        let comm = self.comm;
        // SAFETY: no buffers.
        self.call("MPI_Barrier", || unsafe { ffi::MPI_Barrier(comm) })
    }
}

impl MpiComm {
    /// The (send, recv) pointers of a call of `coll`, its buffers checked
    /// against the collective's byte rule.
    fn coll_ptrs(
        &mut self,
        coll: Collective,
        io: Io<'_, HostBuffer>,
        a: &CollArgs,
    ) -> CommResult<(*const c_void, *mut c_void)> {
        let send = nbytes(a.count, coll.send_blocks(self.world), a.dtype)?;
        let recv = nbytes(a.count, coll.recv_blocks(self.world), a.dtype)?;
        let input_at = coll.in_place_input(a.count, self.rank) * a.dtype.size();
        self.io_ptrs(io, send, recv, input_at)
    }

    /// A collective that moves `count`-element blocks with `call` (its
    /// buffers checked against `coll`'s byte rule).
    fn blocks_call(
        &mut self,
        coll: Collective,
        io: Io<'_, HostBuffer>,
        a: CollArgs,
        call: BlockCall,
    ) -> CommResult<()> {
        let n = count_i32(a.count)?;
        let (s, r) = self.coll_ptrs(coll, io, &a)?;
        let (comm, dt) = (self.comm, datatype(a.dtype));
        // SAFETY: sizes checked in io_ptrs.
        self.call(call.0, || unsafe { (call.1)(s, n, dt, r, n, dt, comm) })
    }

    /// MPI's sum made NCCL's `Avg`: divides the `bytes` at `r` by the world.
    ///
    /// # Safety
    /// `r` covers `bytes` bytes of a receive buffer borrowed mutably.
    unsafe fn finish_avg_at(&self, r: *mut u8, bytes: usize, dtype: DType) {
        let out = std::slice::from_raw_parts_mut(r, bytes);
        super::finish_avg(out, dtype, self.world);
    }
}

/// MPI's call of each collective it has, with NCCL's buffer conventions.
impl LibraryCalls for MpiComm {
    fn all_reduce_call(&mut self, io: Io<'_, HostBuffer>, a: CollArgs) -> CommResult<()> {
        let (mpi_op, n, bytes) = reducing(&a)?;
        let (s, r) = self.coll_ptrs(Collective::AllReduce, io, &a)?;
        let (comm, dt) = (self.comm, datatype(a.dtype));
        // SAFETY: both pointers cover `bytes` bytes (checked in io_ptrs).
        self.call("MPI_Allreduce", || unsafe {
            ffi::MPI_Allreduce(s, r, n, dt, mpi_op, comm)
        })?;
        if a.op == ReduceOp::Avg {
            // SAFETY: r covers `bytes` bytes of the receive buffer, which is borrowed mutably.
            unsafe { self.finish_avg_at(r as *mut u8, bytes, a.dtype) };
        }
        Ok(())
    }

    fn all_gather_call(&mut self, io: Io<'_, HostBuffer>, a: CollArgs) -> CommResult<()> {
        let call = BlockCall("MPI_Allgather", ffi::MPI_Allgather);
        self.blocks_call(Collective::AllGather, io, a, call)
    }

    fn reduce_scatter_call(&mut self, io: Io<'_, HostBuffer>, a: CollArgs) -> CommResult<()> {
        let (mpi_op, n, bytes) = reducing(&a)?;
        let in_place = matches!(io, Io::InPlace(_));
        let (s, r) = self.coll_ptrs(Collective::ReduceScatter, io, &a)?;
        let (comm, dt) = (self.comm, datatype(a.dtype));
        // MPI's in-place reduce_scatter leaves the block at the start of the
        // buffer; NCCL's convention (ours) wants it at rank x count.
        let out_off = if in_place { bytes * self.rank } else { 0 };
        // SAFETY: sizes checked in io_ptrs.
        self.call("MPI_Reduce_scatter_block", || unsafe {
            ffi::MPI_Reduce_scatter_block(s, r, n, dt, mpi_op, comm)
        })?;
        // SAFETY: r covers world x bytes in place, bytes out of place.
        unsafe {
            let out = (r as *mut u8).add(out_off);
            if out_off != 0 {
                std::ptr::copy(r as *const u8, out, bytes);
            }
            if a.op == ReduceOp::Avg {
                self.finish_avg_at(out, bytes, a.dtype);
            }
        }
        Ok(())
    }

    fn broadcast_call(&mut self, io: Io<'_, HostBuffer>, a: CollArgs) -> CommResult<()> {
        self.check_rank("root", a.root)?;
        let n = count_i32(a.count)?;
        let bytes = nbytes(a.count, 1, a.dtype)?;
        let buf = match io {
            Io::InPlace(b) => {
                need(b, bytes, "in-place")?;
                b
            }
            Io::OutOfPlace { send, recv } => {
                need(recv, bytes, "recv")?;
                if self.rank == a.root {
                    need(send, bytes, "send")?;
                    copy_bytes(&mut recv.bytes_mut()[..bytes], &send.bytes()[..bytes]);
                }
                recv
            }
        };
        let p = buf.bytes_mut().as_mut_ptr() as *mut c_void;
        let (comm, dt, root) = (self.comm, datatype(a.dtype), a.root as c_int);
        // SAFETY: p covers `bytes` bytes.
        self.call("MPI_Bcast", || unsafe {
            ffi::MPI_Bcast(p, n, dt, root, comm)
        })
    }

    fn reduce_call(&mut self, io: Io<'_, HostBuffer>, a: CollArgs) -> CommResult<()> {
        self.check_rank("root", a.root)?;
        let (mpi_op, n, bytes) = reducing(&a)?;
        let is_root = self.rank == a.root;
        let (s, r) = match io {
            // Only the root may pass MPI_IN_PLACE to MPI_Reduce.
            Io::InPlace(b) if !is_root => {
                need(b, bytes, "in-place")?;
                (b.bytes().as_ptr() as *const c_void, std::ptr::null_mut())
            }
            io => self.coll_ptrs(Collective::Reduce, io, &a)?,
        };
        let (comm, dt, root) = (self.comm, datatype(a.dtype), a.root as c_int);
        // SAFETY: sizes checked above.
        self.call("MPI_Reduce", || unsafe {
            ffi::MPI_Reduce(s, r, n, dt, mpi_op, root, comm)
        })?;
        if is_root && a.op == ReduceOp::Avg {
            // SAFETY: r covers `bytes` bytes on the root.
            unsafe { self.finish_avg_at(r as *mut u8, bytes, a.dtype) };
        }
        Ok(())
    }

    fn all_to_all_call(&mut self, io: Io<'_, HostBuffer>, a: CollArgs) -> CommResult<()> {
        let call = BlockCall("MPI_Alltoall", ffi::MPI_Alltoall);
        self.blocks_call(Collective::AllToAll, io, a, call)
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        // Sends must complete before their copies are freed and MPI finalises.
        let _ = self.reap_sends(true);
    }
}

/// Ends the process when an MPI call outlives its deadline (MPI calls cannot
/// be interrupted), after saying which rank and which call.
struct Watchdog {
    /// Deadline in microseconds since `epoch`, 0 when disarmed.
    deadline_us: Arc<AtomicU64>,
    op: Arc<std::sync::Mutex<&'static str>>,
    epoch: Instant,
}

impl Watchdog {
    fn start(rank: usize) -> Self {
        let deadline_us = Arc::new(AtomicU64::new(0));
        let op = Arc::new(std::sync::Mutex::new(""));
        let epoch = Instant::now();
        let (d, o) = (deadline_us.clone(), op.clone());
        std::thread::Builder::new()
            .name("parbench-mpi-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(50));
                let dl = d.load(Ordering::Acquire);
                if dl != 0 && epoch.elapsed().as_micros() as u64 > dl {
                    let name = o.lock().map(|g| *g).unwrap_or("an MPI call");
                    eprintln!(
                        "rank {rank}: {name} passed its deadline; MPI calls cannot be cancelled, so this rank exits and mpirun ends the job"
                    );
                    // SAFETY: _exit ends the process without running destructors
                    // that could block inside MPI.
                    unsafe { libc::_exit(3) };
                }
            })
            .ok();
        Watchdog {
            deadline_us,
            op,
            epoch,
        }
    }

    fn arm(&self, op: &'static str, timeout: Duration) {
        if let Ok(mut g) = self.op.lock() {
            *g = op;
        }
        let at = (self.epoch.elapsed() + timeout).as_micros() as u64;
        self.deadline_us.store(at.max(1), Ordering::Release);
    }

    fn disarm(&self) {
        self.deadline_us.store(0, Ordering::Release);
    }
}
