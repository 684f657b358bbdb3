//! Issuing NCCL calls: argument checks, device pointers, the staged sends
//! and the groups that flush them.

use super::{nccl_text, NcclComm};
use crate::comm::{CommError, CommResult, DType, Io};
use crate::gpu::{DeviceBuffer, Gpu};
use cudarc::driver::sys as cusys;
use cudarc::nccl::sys;
use std::ffi::c_void;

impl NcclComm {
    pub(super) fn live(&self) -> CommResult<()> {
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
    pub(super) fn ptr(
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
    pub(super) fn io_ptrs(
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

    pub(super) fn stream(&self) -> sys::cudaStream_t {
        self.gpu.stream().cu_stream() as sys::cudaStream_t
    }

    /// Runs one NCCL call (or group) after binding the context, reported
    /// with NCCL's text on failure. A usage error (bad argument) leaves the
    /// communicator usable; any other error aborts it. In the sizing pass
    /// nothing is issued.
    pub(super) fn call(
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
    pub(super) fn flush_with(
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
    pub(super) fn flush(&mut self) -> CommResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.flush_with("ncclSend (pending sends)", |_, _| {
            sys::ncclResult_t::ncclSuccess
        })
    }
    /// Ensures `slot` holds a buffer of at least `bytes` bytes.
    pub(super) fn ensure(
        gpu: &Gpu,
        slot: &mut Option<DeviceBuffer>,
        bytes: usize,
    ) -> CommResult<()> {
        if slot.as_ref().is_none_or(|b| b.len() < bytes) {
            *slot = Some(gpu.alloc(bytes)?);
        }
        Ok(())
    }

    pub(super) fn check_peer(&self, peer: usize) -> CommResult<()> {
        if peer >= self.world {
            return Err(CommError::InvalidArgument(format!(
                "peer {peer} outside a world of {}",
                self.world
            )));
        }
        Ok(())
    }

    pub(super) fn check_root(&self, root: usize) -> CommResult<()> {
        if root >= self.world {
            return Err(CommError::InvalidArgument(format!(
                "root {root} outside a world of {}",
                self.world
            )));
        }
        Ok(())
    }
}

/// Whether NCCL refused a call for its arguments or its use, which leaves
/// the communicator usable (every other error aborts it).
pub(super) fn is_usage_error(r: sys::ncclResult_t) -> bool {
    matches!(
        r,
        sys::ncclResult_t::ncclInvalidArgument | sys::ncclResult_t::ncclInvalidUsage
    )
}

/// A device address as the pointer NCCL's C signature takes (never
/// dereferenced on the host).
pub(super) fn addr(p: cusys::CUdeviceptr) -> *mut c_void {
    p as usize as *mut c_void
}

pub(super) fn nccl_type(d: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match d {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::I32 => T::ncclInt32,
        DType::I64 => T::ncclInt64,
        DType::U8 => T::ncclUint8,
        DType::I8 => T::ncclInt8,
        DType::U32 => T::ncclUint32,
        DType::U64 => T::ncclUint64,
        DType::F8E4M3 => T::ncclFloat8e4m3,
        DType::F8E5M2 => T::ncclFloat8e5m2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn only_usage_errors_leave_the_communicator_usable() {
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
    pub(super) fn device_addresses_are_integers() {
        let base: cusys::CUdeviceptr = 0x7f00_0000_1000;
        assert_eq!(addr(base + 256) as usize, 0x7f00_0000_1100);
    }
}
