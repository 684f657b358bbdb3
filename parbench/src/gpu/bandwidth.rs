//! The GPU wire's ceiling, measured before a sweep: the copy bandwidth inside
//! one device's memory and, between every pair of devices, the peer copy
//! bandwidth (NVLink where the GPUs have it, PCIe otherwise). Collective bus
//! bandwidths are read against these figures.
//!
//! GB/s are 1e9 bytes per second of bytes *copied* (what nccl-tests' algbw
//! counts); a device-to-device copy also reads each byte, so its memory
//! traffic is twice the figure.

use super::timing::EventTimer;
use super::{Gpu, GpuError};
use cudarc::driver::{result as cu, sys};
use std::time::Duration;

/// Copies timed per measurement (after one untimed warm-up copy).
const COPIES: usize = 20;

/// Bandwidth of `cuMemcpyDtoDAsync` of `bytes` bytes inside `gpu`'s memory, in GB/s.
pub fn device_copy_gbps(gpu: &Gpu, bytes: usize, timeout: Duration) -> Result<f64, GpuError> {
    if bytes == 0 {
        return Err(GpuError::InvalidArgument(
            "copy size must be positive".into(),
        ));
    }
    let src = gpu.alloc(bytes)?;
    let dst = gpu.alloc(bytes)?;
    let stream = gpu.stream().cu_stream();
    time_copies(gpu, bytes, timeout, || {
        // SAFETY: both allocations hold `bytes` bytes on this device.
        unsafe { cu::memcpy_dtod_async(dst.ptr(), src.ptr(), bytes, stream) }
            .map_err(|e| GpuError::call("device-to-device copy", e))
    })
}

/// One direction between two devices.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerCopy {
    /// Device the bytes leave.
    pub src: usize,
    /// Device the bytes arrive at.
    pub dst: usize,
    /// Whether the driver reports direct peer access (NVLink or PCIe P2P);
    /// without it the copy is staged through host memory.
    pub direct: bool,
    /// Copy bandwidth in GB/s.
    pub gbps: f64,
}

/// Peer copy bandwidth between every ordered pair of `gpus`, `bytes` per copy,
/// issued on the source device's stream.
pub fn peer_copy_gbps(
    gpus: &[Gpu],
    bytes: usize,
    timeout: Duration,
) -> Result<Vec<PeerCopy>, GpuError> {
    if bytes == 0 {
        return Err(GpuError::InvalidArgument(
            "copy size must be positive".into(),
        ));
    }
    let mut out = Vec::new();
    for s in gpus {
        for d in gpus {
            if s.ordinal() == d.ordinal() {
                continue;
            }
            let direct = enable_peer_access(s, d)?;
            let src = s.alloc(bytes)?;
            let dst = d.alloc(bytes)?;
            // The destination is zeroed on its own GPU's stream: let that
            // finish before the copies on the source's stream are timed.
            d.wait("zeroing the peer copy's destination", timeout)?;
            let (sctx, dctx) = (s.context().cu_ctx(), d.context().cu_ctx());
            let stream = s.stream().cu_stream();
            let gbps = time_copies(s, bytes, timeout, || {
                // SAFETY: each allocation holds `bytes` bytes in its own context.
                unsafe { cu::memcpy_peer_async(dctx, dst.ptr(), sctx, src.ptr(), bytes, stream) }
                    .map_err(|e| GpuError::call("peer copy", e))
            });
            // `dst` is freed after its own stream's work, but the copies run
            // on the source's: wait for those, or leak it if they hang.
            if let Err(e) = s.wait("the peer copies", timeout) {
                std::mem::forget(dst);
                return Err(e);
            }
            let gbps = gbps?;
            out.push(PeerCopy {
                src: s.ordinal(),
                dst: d.ordinal(),
                direct,
                gbps,
            });
        }
    }
    Ok(out)
}

/// One warm-up copy, then [`COPIES`] copies between two events.
fn time_copies(
    gpu: &Gpu,
    bytes: usize,
    timeout: Duration,
    mut copy: impl FnMut() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    gpu.bind()?;
    copy()?;
    let mut timer = EventTimer::new(gpu, 2)?;
    timer.mark()?;
    for _ in 0..COPIES {
        copy()?;
    }
    timer.mark()?;
    let t = timer.intervals(timeout)?.first().copied().unwrap_or(0.0);
    if t <= 0.0 {
        return Err(GpuError::call(
            "timing copies",
            "the events measured no time",
        ));
    }
    Ok((bytes * COPIES) as f64 / t / 1e9)
}

/// Turns on `src`'s access to `dst`'s memory where the hardware allows it.
fn enable_peer_access(src: &Gpu, dst: &Gpu) -> Result<bool, GpuError> {
    let mut can = 0;
    // SAFETY: both handles come from opened contexts.
    unsafe {
        sys::cuDeviceCanAccessPeer(
            &mut can,
            src.context().cu_device(),
            dst.context().cu_device(),
        )
    }
    .result()
    .map_err(|e| GpuError::call("querying peer access", e))?;
    if can == 0 {
        return Ok(false);
    }
    src.bind()?;
    // SAFETY: the current context is src's; dst's context is alive.
    match unsafe { sys::cuCtxEnablePeerAccess(dst.context().cu_ctx(), 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(true)
        }
        e => Err(GpuError::call(
            format!(
                "enabling peer access {} -> {}",
                src.ordinal(),
                dst.ordinal()
            ),
            cudarc::driver::DriverError(e),
        )),
    }
}
