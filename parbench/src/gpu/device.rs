//! One CUDA device with one stream, and the buffers that live on it.

use super::{guarded, GpuError};
use cudarc::driver::{result as cu, sys, CudaContext, CudaStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A device and the one stream parbench issues all its work on.
///
/// Everything a benchmark does on a GPU is ordered on this stream, so cudarc's
/// per-buffer event tracking (which records events around every use, and
/// would add work to each timed call) is turned off.
#[derive(Clone, Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Deadline of the waits buffers make before host copies, in ms, shared
    /// by every clone (the communicator's `set_timeout` sets it).
    timeout_ms: Arc<AtomicU64>,
}

impl Gpu {
    /// Opens device `ordinal` (its primary context) and creates a stream.
    /// Probe the driver first ([`super::require`]); this does it again cheaply.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        let count = super::device_count()?;
        if ordinal >= count {
            return Err(GpuError::NoDevice(format!(
                "device {ordinal} asked for, this machine has {count}"
            )));
        }
        guarded("opening the device", || {
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| GpuError::call(format!("GPU {ordinal}: creating its context"), e))?;
            // SAFETY: every buffer of this context is used on `stream` only,
            // so cudarc's cross-stream tracking is not needed.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx
                .new_stream()
                .map_err(|e| GpuError::call(format!("GPU {ordinal}: creating a stream"), e))?;
            let ms = crate::limits::DEFAULT_TIMEOUT.as_millis() as u64;
            Ok(Gpu {
                ctx,
                stream,
                timeout_ms: Arc::new(AtomicU64::new(ms)),
            })
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's marketing name (`NVIDIA H200`).
    pub fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|_| format!("CUDA device {}", self.ordinal()))
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> Option<(i32, i32)> {
        self.ctx.compute_capability().ok()
    }

    /// The GPU's L2 cache in bytes (`None` where the driver does not say).
    pub fn l2_bytes(&self) -> Option<u64> {
        let attr = cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE;
        self.ctx
            .attribute(attr)
            .ok()
            .and_then(|b| u64::try_from(b).ok())
            .filter(|&b| b > 0)
    }

    /// Sets the deadline of the waits this GPU's buffers make before host copies.
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The deadline of those waits.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// The context (for cudarc calls of the other modules).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream all work goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Binds the context to the calling thread (NCCL and raw driver calls
    /// act on the current context).
    pub fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::call("binding the CUDA context", e))
    }

    /// A zeroed device buffer of `bytes` bytes, from `cuMemAlloc`.
    ///
    /// Not cudarc's `alloc`, which takes stream-ordered pool memory
    /// (`cuMemAllocAsync`) where the device has pools: peers cannot reach
    /// pool memory without `cuMemPoolSetAccess`, NCCL's buffer registration
    /// expects `cudaMalloc`/cuMem memory (nccl-tests uses `cudaMalloc`), and
    /// an allocation on a capturing stream would become part of the graph.
    /// The zeroing is queued on the stream, before every later use of the
    /// buffer there; a buffer is never allocated while the stream captures
    /// (that is refused: allocate before [`super::timing::CapturedLoop::capture`]).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        let what = || format!("GPU {}: allocating {bytes} bytes", self.ordinal());
        self.bind()?;
        if self.is_capturing()? {
            return Err(GpuError::InvalidArgument(format!(
                "{}: the stream is capturing a graph; allocate before the capture begins",
                what()
            )));
        }
        // A zero-byte allocation is refused by cuMemAlloc; keep one byte.
        let size = bytes.max(1);
        // SAFETY: plain allocation in the bound context.
        let ptr = unsafe { cu::malloc_sync(size) }.map_err(|e| GpuError::call(what(), e))?;
        let buf = DeviceBuffer {
            ptr,
            len: bytes,
            gpu: self.clone(),
        };
        // SAFETY: `size` bytes at `ptr` belong to this allocation; the memset
        // is ordered before every later use on the stream.
        unsafe { cu::memset_d8_async(ptr, 0, size, self.stream.cu_stream()) }
            .map_err(|e| GpuError::call(format!("{}: zeroing", what()), e))?;
        Ok(buf)
    }

    /// Whether the stream is capturing a graph now.
    pub fn is_capturing(&self) -> Result<bool, GpuError> {
        // SAFETY: the stream is alive for `self`.
        let status = unsafe { cu::stream::is_capturing(self.stream.cu_stream()) }
            .map_err(|e| GpuError::call("cuStreamIsCapturing", e))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Waits until every call issued on the stream so far has finished, or
    /// `timeout` passes ([`GpuError::Timeout`]; the work is still queued).
    pub fn wait(&self, what: &str, timeout: Duration) -> Result<(), GpuError> {
        let deadline = Instant::now() + timeout;
        self.bind()?;
        let event = self
            .ctx
            .new_event(None)
            .map_err(|e| GpuError::call("creating an event", e))?;
        event
            .record(&self.stream)
            .map_err(|e| GpuError::call("recording an event", e))?;
        poll_until(&event, deadline).map_err(|e| {
            e.unwrap_or_else(|| GpuError::Timeout {
                ordinal: self.ordinal(),
                what: what.to_string(),
                after: timeout,
            })
        })
    }
}

/// Polls `event` until it completes; `Err(None)` when `deadline` passes first.
/// Spins briefly, then sleeps in short steps, so a short wait stays short
/// and a long one does not burn a core.
pub(crate) fn poll_until(
    event: &cudarc::driver::CudaEvent,
    deadline: Instant,
) -> Result<(), Option<GpuError>> {
    let start = Instant::now();
    loop {
        match event.try_is_complete() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(Some(GpuError::call("waiting for the stream", e))),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(None);
        }
        if now - start < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Device memory of one [`Gpu`] (`cuMemAlloc`), sized in bytes: the buffer
/// type of the NCCL communicator, of the CUDA compute device and of the
/// copy-bandwidth ceilings. Freed on drop once the stream has finished with
/// it (see the `Drop` impl).
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    gpu: Gpu,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer(GPU {}, {} bytes)",
            self.gpu.ordinal(),
            self.len
        )
    }
}

impl DeviceBuffer {
    /// The raw device address of byte 0.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The raw device address of byte `offset`, checked to leave `bytes` bytes after it.
    pub fn ptr_at(&self, offset: usize, bytes: usize) -> Result<sys::CUdeviceptr, GpuError> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.len => Ok(self.ptr + offset as u64),
            _ => Err(GpuError::InvalidArgument(format!(
                "{bytes} bytes at offset {offset} do not fit a buffer of {} bytes",
                self.len
            ))),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the buffer lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Copies `src` into the buffer at byte `offset` and waits.
    ///
    /// A copy from pageable host memory first waits for everything queued on
    /// the stream, with no deadline of its own; so the stream is first
    /// drained with the GPU's deadline ([`Gpu::timeout`]), and only an idle
    /// stream is given the copy.
    pub fn upload_at(&mut self, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        let dst = self.ptr_at(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.gpu.wait(
            "work queued before a host-to-device copy",
            self.gpu.timeout(),
        )?;
        // SAFETY: dst..dst+len lies inside this allocation (checked above);
        // the host slice outlives the copy because we synchronise before returning.
        unsafe { cu::memcpy_htod_async(dst, src, self.gpu.stream.cu_stream()) }
            .and_then(|_| self.gpu.stream.synchronize())
            .map_err(|e| GpuError::call("copying host to device", e))
    }

    /// Copies bytes from `offset` into `dst` and waits (draining the stream
    /// first, with the deadline, as [`DeviceBuffer::upload_at`] does).
    pub fn download_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        let src = self.ptr_at(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.gpu.wait(
            "work queued before a device-to-host copy",
            self.gpu.timeout(),
        )?;
        // SAFETY: as in upload_at, with the roles swapped.
        unsafe { cu::memcpy_dtoh_async(dst, src, self.gpu.stream.cu_stream()) }
            .and_then(|_| self.gpu.stream.synchronize())
            .map_err(|e| GpuError::call("copying device to host", e))
    }

    /// Copies the start of `src` into the start of this buffer and waits
    /// (draining the stream first, with the deadline, as
    /// [`DeviceBuffer::upload_at`] does).
    pub fn copy_from_device(&mut self, src: &DeviceBuffer) -> Result<(), GpuError> {
        let n = src.len.min(self.len);
        if n == 0 {
            return Ok(());
        }
        self.gpu.wait(
            "work queued before a device-to-device copy",
            self.gpu.timeout(),
        )?;
        // SAFETY: both allocations hold at least `n` bytes on this context's
        // device; the copy is waited for before returning.
        unsafe { cu::memcpy_dtod_async(self.ptr, src.ptr, n, self.gpu.stream.cu_stream()) }
            .and_then(|_| self.gpu.stream.synchronize())
            .map_err(|e| GpuError::call("copying device to device", e))
    }
}

impl Drop for DeviceBuffer {
    /// Frees the memory after the stream's work on it has finished. The wait
    /// has the GPU's deadline; when it fails (a hung collective, a capture
    /// in progress) the memory is leaked rather than freed under a kernel
    /// that may still use it, or waited for without end.
    fn drop(&mut self) {
        // Waiting records an event, which a capture in progress would take
        // into its graph: leave a capturing stream alone.
        let idle = matches!(self.gpu.is_capturing(), Ok(false))
            && self
                .gpu
                .wait("work queued before freeing a buffer", self.gpu.timeout())
                .is_ok();
        if idle {
            // SAFETY: allocated by cuMemAlloc in this context (bound by the
            // wait), freed once, no work of the stream uses it any more.
            let _ = unsafe { cu::free_sync(self.ptr) };
        }
    }
}
