//! The GPU path's shared layer (feature `cuda`): probing the CUDA libraries,
//! opening a device with one stream, device buffers, waits with deadlines,
//! CUDA-event and CUDA-graph timing, and the copy-bandwidth ceilings.
//!
//! The NCCL communicator ([`crate::comm::nccl`]) and the CUDA compute device
//! ([`crate::compute::cuda`]) are built on this module and share its
//! [`DeviceBuffer`], so a layer computes and all-reduces the same memory.
//!
//! Order of use: [`probe::require`] first (it never calls cudarc, so a
//! missing library is an error, not cudarc's panic), then [`Gpu::open`].

pub mod bandwidth;
mod device;
pub mod probe;
pub mod timing;

pub use device::{DeviceBuffer, Gpu};
pub use probe::{require, Found, Lib};

/// Errors of the GPU layer. Each is one line that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A library cannot be loaded or lacks a symbol parbench calls.
    #[error("{lib} not usable: {detail}")]
    Missing { lib: &'static str, detail: String },
    /// The driver loads but reports no usable device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA, cuBLAS, NVRTC or NCCL call failed.
    #[error("{what}: {detail}")]
    Call { what: String, detail: String },
    /// Device work did not finish before its deadline.
    #[error("GPU {ordinal}: {what} did not finish within {after:?}")]
    Timeout {
        ordinal: usize,
        what: String,
        after: std::time::Duration,
    },
    /// Arguments the GPU call cannot take.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A cudarc call panicked despite the probe (caught at the boundary).
    #[error("cudarc panicked in {what}: {detail}")]
    Panic { what: String, detail: String },
}

impl GpuError {
    /// A failed call, with the library's own description of the error.
    pub fn call(what: impl Into<String>, err: impl std::fmt::Display) -> Self {
        GpuError::Call {
            what: what.into(),
            detail: err.to_string(),
        }
    }
}

/// Runs `f`, turning a panic inside cudarc into [`GpuError::Panic`].
///
/// The last resort behind the probe: cudarc's dynamic loading panics when a
/// library or symbol is missing, and [`probe::require`] checks both first,
/// so this should never fire; it guards the entry points (opening a device,
/// creating communicators and compute handles) so that a library we did not
/// foresee cannot abort a whole sweep. The panic message is still printed by
/// the default hook.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(GpuError::Panic {
                what: what.into(),
                detail,
            })
        }
    }
}

/// How many CUDA devices this machine has; probes the driver first.
pub fn device_count() -> Result<usize, GpuError> {
    require(&[Lib::Driver])?;
    guarded("counting devices", || {
        cudarc::driver::result::init().map_err(|e| GpuError::NoDevice(e.to_string()))?;
        let n = cudarc::driver::result::device::get_count()
            .map_err(|e| GpuError::NoDevice(e.to_string()))?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}

/// The names of every visible device, for run metadata (`NVIDIA H200`, ...).
pub fn device_names() -> Result<Vec<String>, GpuError> {
    let n = device_count()?;
    guarded("naming devices", || {
        (0..n)
            .map(|o| {
                let d = cudarc::driver::result::device::get(o as i32)
                    .map_err(|e| GpuError::call("cuDeviceGet", e))?;
                cudarc::driver::result::device::get_name(d)
                    .map_err(|e| GpuError::call("cuDeviceGetName", e))
            })
            .collect()
    })
}

/// The memory of device `ordinal`, bytes (`cuDeviceTotalMem`): what a run's
/// buffers on one GPU are held against before any is allocated.
pub fn device_memory(ordinal: usize) -> Result<u64, GpuError> {
    require(&[Lib::Driver])?;
    guarded("cuDeviceTotalMem", || {
        cudarc::driver::result::init().map_err(|e| GpuError::NoDevice(e.to_string()))?;
        let d = cudarc::driver::result::device::get(ordinal as i32)
            .map_err(|e| GpuError::call("cuDeviceGet", e))?;
        // SAFETY: a device handle the driver just returned.
        let bytes = unsafe { cudarc::driver::result::device::total_mem(d) }
            .map_err(|e| GpuError::call("cuDeviceTotalMem", e))?;
        Ok(bytes as u64)
    })
}

/// The CUDA version the driver supports, as `major.minor` (`12.8`).
pub fn driver_version() -> Result<String, GpuError> {
    require(&[Lib::Driver])?;
    guarded("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(|e| GpuError::call("cuDriverGetVersion", e))?;
        Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
    })
}
