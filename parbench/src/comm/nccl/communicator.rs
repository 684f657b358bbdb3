//! The [`Communicator`] trait over NCCL.

use super::redop::{self, RedOp};
use super::transfer::{addr, nccl_type};
use super::NcclComm;
use crate::comm::library::{self, LibraryCalls};
use crate::comm::{
    CollArgs, Collective, CommError, CommResult, Communicator, DType, Io, Replay, StreamClock,
    VCounts,
};
use crate::gpu::timing::{CapturedLoop, EventTimer};
use crate::gpu::{self, bandwidth, DeviceBuffer, Gpu, GpuError};
use cudarc::driver::result as cu;
use cudarc::nccl::sys;
use std::ffi::c_void;
use std::time::Duration;

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
        if let Some(host) = library::host_algo_for(coll, self.world, bytes) {
            return host;
        }
        // NCCL's own choice for this size, from its tuning log (written by
        // rank 0 once a call of this size ran); `unknown` until it says.
        match crate::comm::nccl_tuning::log_path() {
            Some(p) => crate::comm::nccl_tuning::label_for(
                &crate::comm::nccl_tuning::read_log(&p),
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

    fn cache_free_sets(&self, bytes: u64, largest: u64) -> usize {
        cache_free_sets(bytes, largest, self.gpu.l2_bytes())
    }

    fn cannot_run(&self, dtype: DType, _reduces: bool) -> Option<String> {
        self.type_refusal(dtype)
    }

    fn collective(
        &mut self,
        coll: Collective,
        io: Io<'_, DeviceBuffer>,
        args: CollArgs,
    ) -> CommResult<()> {
        library::collective(self, coll, io, args)
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

    fn all_to_all_v(
        &mut self,
        send: &DeviceBuffer,
        recv: &mut DeviceBuffer,
        counts: &VCounts,
        dtype: DType,
    ) -> CommResult<()> {
        self.live()?;
        counts.check(self.world, dtype, send.len(), recv.len())?;
        let size = dtype.size();
        // One group of every non-empty send and receive, as nccl-tests'
        // alltoall and DeepEP's kernels stand for (NCCL has no alltoallv).
        let mut calls = Vec::with_capacity(self.world);
        for peer in 0..self.world {
            let (s, r) = (counts.send_range(peer), counts.recv_range(peer));
            let sp = addr(self.ptr(send, s.start * size, s.len() * size, "send")?) as *const c_void;
            let rp = addr(self.ptr(recv, r.start * size, r.len() * size, "recv")?);
            calls.push((peer as i32, sp, s.len(), rp, r.len()));
        }
        let t = nccl_type(dtype);
        // SAFETY: every pointer was checked to hold its count on this GPU;
        // grouped with any pending sends.
        self.flush_with("ncclSend/ncclRecv (all_to_all_v)", |comm, stream| unsafe {
            let mut first = sys::ncclResult_t::ncclSuccess;
            for &(peer, sp, sn, rp, rn) in &calls {
                if sn > 0 {
                    let r = sys::ncclSend(sp, sn, t, peer, comm, stream);
                    if first == sys::ncclResult_t::ncclSuccess {
                        first = r;
                    }
                }
                if rn > 0 {
                    let r = sys::ncclRecv(rp, rn, t, peer, comm, stream);
                    if first == sys::ncclResult_t::ncclSuccess {
                        first = r;
                    }
                }
            }
            first
        })
    }

    fn barrier(&mut self) -> CommResult<()> {
        self.flush()?;
        let Some(p) = self.token.as_ref().map(|t| addr(t.ptr())) else {
            return Err(CommError::Device("the barrier's token is missing".into()));
        };
        let (comm, stream, calls) = (self.comm, self.stream(), redop::op_calls()?);
        // SAFETY: the token holds one f32.
        self.call("barrier (one-element ncclAllReduce)", || unsafe {
            let (f32, sum) = (sys::ncclDataType_t::ncclFloat32, RedOp::SUM.raw());
            (calls.all_reduce)(p, p, 1, f32, sum, comm, stream)
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

/// NCCL's call of each collective it has, with NCCL's buffer conventions.
impl NcclComm {
    /// Flushes staged sends, then the (send, recv) device pointers of a
    /// call of `coll`, checked against the collective's byte rule, with the
    /// communicator and stream to issue it on.
    fn coll_ptrs(
        &mut self,
        coll: Collective,
        io: &Io<'_, DeviceBuffer>,
        a: &CollArgs,
    ) -> CommResult<(
        *const c_void,
        *mut c_void,
        sys::ncclComm_t,
        sys::cudaStream_t,
    )> {
        self.flush()?;
        let (b, world) = (a.count * a.dtype.size(), self.world);
        let (send, recv) = (b * coll.send_blocks(world), b * coll.recv_blocks(world));
        let input_at = coll.in_place_input(a.count, self.rank) * a.dtype.size();
        let output_at = coll.in_place_output(a.count, self.rank) * a.dtype.size();
        let (s, r) = self.io_ptrs(io, send, recv, input_at, output_at)?;
        Ok((s, r, self.comm, self.stream()))
    }
}

/// NCCL's call of each collective it has, with NCCL's buffer conventions.
impl LibraryCalls for NcclComm {
    fn all_reduce_call(&mut self, io: Io<'_, DeviceBuffer>, a: CollArgs) -> CommResult<()> {
        let (s, r, comm, stream) = self.coll_ptrs(Collective::AllReduce, &io, &a)?;
        let (t, op, calls) = (nccl_type(a.dtype), self.red_op(&a)?, redop::op_calls()?);
        // SAFETY: pointers checked to hold `count` elements on this GPU.
        self.call("ncclAllReduce", || unsafe {
            (calls.all_reduce)(s, r, a.count, t, op.raw(), comm, stream)
        })
    }

    fn all_gather_call(&mut self, io: Io<'_, DeviceBuffer>, a: CollArgs) -> CommResult<()> {
        let (s, r, comm, stream) = self.coll_ptrs(Collective::AllGather, &io, &a)?;
        let t = nccl_type(a.dtype);
        // SAFETY: as in all_reduce.
        self.call("ncclAllGather", || unsafe {
            sys::ncclAllGather(s, r, a.count, t, comm, stream)
        })
    }

    fn reduce_scatter_call(&mut self, io: Io<'_, DeviceBuffer>, a: CollArgs) -> CommResult<()> {
        let (s, r, comm, stream) = self.coll_ptrs(Collective::ReduceScatter, &io, &a)?;
        let (t, op, calls) = (nccl_type(a.dtype), self.red_op(&a)?, redop::op_calls()?);
        // SAFETY: as in all_reduce.
        self.call("ncclReduceScatter", || unsafe {
            (calls.reduce_scatter)(s, r, a.count, t, op.raw(), comm, stream)
        })
    }

    fn broadcast_call(&mut self, io: Io<'_, DeviceBuffer>, a: CollArgs) -> CommResult<()> {
        self.check_root(a.root)?;
        let (s, r, comm, stream) = self.coll_ptrs(Collective::Broadcast, &io, &a)?;
        let (t, root) = (nccl_type(a.dtype), a.root as i32);
        // SAFETY: as in all_reduce.
        self.call("ncclBroadcast", || unsafe {
            sys::ncclBroadcast(s, r, a.count, t, root, comm, stream)
        })
    }

    fn reduce_call(&mut self, io: Io<'_, DeviceBuffer>, a: CollArgs) -> CommResult<()> {
        self.check_root(a.root)?;
        let (s, r, comm, stream) = self.coll_ptrs(Collective::Reduce, &io, &a)?;
        let (t, op, root) = (nccl_type(a.dtype), self.red_op(&a)?, a.root as i32);
        let calls = redop::op_calls()?;
        // SAFETY: as in all_reduce.
        self.call("ncclReduce", || unsafe {
            (calls.reduce)(s, r, a.count, t, op.raw(), root, comm, stream)
        })
    }

    fn all_to_all_call(&mut self, io: Io<'_, DeviceBuffer>, a: CollArgs) -> CommResult<()> {
        let (count, dtype) = (a.count, a.dtype);
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

/// Sets of `bytes` that together hold twice the L2 (so that the set a call
/// uses was evicted since its last use), within the run's `largest` row
/// (whose buffers the memory check before the run allowed for), and at
/// most [`MOST_CACHE_FREE_SETS`]. Without the L2's size, as many as fit.
fn cache_free_sets(bytes: u64, largest: u64, l2: Option<u64>) -> usize {
    if bytes == 0 {
        return 1;
    }
    let fit = largest / bytes;
    let wanted = l2.map_or(fit, |l2| (2 * l2).div_ceil(bytes));
    usize::try_from(wanted.min(fit))
        .unwrap_or(usize::MAX)
        .clamp(1, MOST_CACHE_FREE_SETS)
}

/// The most buffer sets a loop turns through: allocations, not the cache,
/// bound it for small calls, which the launch, not the cache, times.
const MOST_CACHE_FREE_SETS: usize = 64;

#[cfg(test)]
mod cache_tests {
    use super::cache_free_sets;

    #[test]
    fn sets_hold_twice_the_l2_within_the_largest_row() {
        let mib = 1u64 << 20;
        // An L2 of 60 MiB, about an H200's.
        let l2 = Some(60 * mib);
        assert_eq!(cache_free_sets(8 * mib, 256 * mib, l2), 15);
        assert_eq!(cache_free_sets(64 * mib, 256 * mib, l2), 2);
        // Bounded by the largest row's buffers, and at least one set.
        assert_eq!(cache_free_sets(256 * mib, 256 * mib, l2), 1);
        assert_eq!(cache_free_sets(16 * mib, 32 * mib, l2), 2);
        assert_eq!(cache_free_sets(mib, 4 * mib, None), 4);
        // Small calls: at most the cap.
        assert_eq!(cache_free_sets(8, 256 * mib, l2), 64);
        assert_eq!(cache_free_sets(0, 256 * mib, l2), 1);
    }
}
