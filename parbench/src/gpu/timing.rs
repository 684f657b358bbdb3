//! Timing on the GPU: CUDA events recorded on the stream around launches,
//! as nccl-tests does, and CUDA graphs that capture a loop of launches and
//! replay it (nccl-tests' `-G`), which removes the host's launch cost.
//!
//! Events measure the device's own clock between two points of the stream;
//! a host timer would add the launch and synchronisation latency.

use super::device::poll_until;
use super::{probe, Gpu, GpuError};
use cudarc::driver::{sys, CudaEvent, CudaGraph};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Events recorded between launches: `marks + 1` points give `marks`
/// intervals, one per timed iteration (or one for the whole loop).
pub struct EventTimer {
    gpu: Gpu,
    events: Vec<CudaEvent>,
    recorded: usize,
}

impl EventTimer {
    /// A timer with room for `points` recorded events.
    pub fn new(gpu: &Gpu, points: usize) -> Result<EventTimer, GpuError> {
        let events = (0..points.max(2))
            .map(|_| {
                gpu.context()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| GpuError::call("creating a timing event", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EventTimer {
            gpu: gpu.clone(),
            events,
            recorded: 0,
        })
    }

    /// Forgets earlier marks, so the events can time another loop.
    pub fn reset(&mut self) {
        self.recorded = 0;
    }

    /// Records the next point on the stream (after everything issued so far).
    pub fn mark(&mut self) -> Result<(), GpuError> {
        let Some(ev) = self.events.get(self.recorded) else {
            return Err(GpuError::InvalidArgument(format!(
                "timer holds {} points",
                self.events.len()
            )));
        };
        ev.record(self.gpu.stream())
            .map_err(|e| GpuError::call("recording a timing event", e))?;
        self.recorded += 1;
        Ok(())
    }

    /// Waits (until `timeout`) for the last point, then returns the time
    /// between consecutive points, in seconds.
    pub fn intervals(&self, timeout: Duration) -> Result<Vec<f64>, GpuError> {
        if self.recorded < 2 {
            return Ok(Vec::new());
        }
        let last = &self.events[self.recorded - 1];
        poll_until(last, Instant::now() + timeout).map_err(|e| {
            e.unwrap_or_else(|| GpuError::Timeout {
                ordinal: self.gpu.ordinal(),
                what: "the timed loop".into(),
                after: timeout,
            })
        })?;
        self.events[..self.recorded]
            .windows(2)
            .map(|w| elapsed_s(&w[0], &w[1]))
            .collect()
    }
}

/// Seconds between two completed events, through `cuEventElapsedTime_v2`
/// (CUDA 12.8+, what cudarc's 13.0 bindings call) or, on older drivers,
/// `cuEventElapsedTime` (same signature; cudarc's 13.0 bindings omit it).
pub fn elapsed_s(start: &CudaEvent, end: &CudaEvent) -> Result<f64, GpuError> {
    type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
    static ELAPSED: OnceLock<Option<usize>> = OnceLock::new();
    let f = ELAPSED.get_or_init(|| {
        let found = probe::probe(probe::Lib::Driver).ok()?;
        let name = std::ffi::CString::new(found.soname).ok()?;
        // SAFETY: dlopen of the driver the probe accepted; the handle is kept
        // open for the process (the driver is never unloaded anyway).
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if h.is_null() {
            return None;
        }
        [c"cuEventElapsedTime_v2", c"cuEventElapsedTime"]
            .iter()
            // SAFETY: valid handle and C strings.
            .map(|s| unsafe { libc::dlsym(h, s.as_ptr()) } as usize)
            .find(|&p| p != 0)
    });
    let Some(addr) = *f else {
        return Err(GpuError::Missing {
            lib: probe::Lib::Driver.name(),
            detail: "neither cuEventElapsedTime_v2 nor cuEventElapsedTime is exported".into(),
        });
    };
    // SAFETY: both symbols have the signature CUresult(float*, CUevent, CUevent).
    let f: ElapsedFn = unsafe { std::mem::transmute::<usize, ElapsedFn>(addr) };
    let mut ms = 0f32;
    start
        .context()
        .bind_to_thread()
        .map_err(|e| GpuError::call("binding the CUDA context", e))?;
    // SAFETY: both events belong to the bound context and have completed.
    let r = unsafe { f(&mut ms, start.cu_event(), end.cu_event()) };
    r.result()
        .map_err(|e| GpuError::call("reading event times", e))?;
    Ok(ms as f64 / 1e3)
}

/// A loop of launches captured once as a CUDA graph and replayed
/// (`--graph N`: N launches per graph).
pub struct CapturedLoop {
    graph: CudaGraph,
    launches: usize,
}

impl CapturedLoop {
    /// Captures `launches` calls of `launch` on the GPU's stream. The calls
    /// are recorded, not run; [`CapturedLoop::replay`] runs them. NCCL calls
    /// can be captured (NCCL 2.9+); each thread captures its own stream.
    pub fn capture<E: From<GpuError>>(
        gpu: &Gpu,
        launches: usize,
        mut launch: impl FnMut() -> Result<(), E>,
    ) -> Result<CapturedLoop, E> {
        let stream = gpu.stream();
        gpu.bind()?;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| GpuError::call("beginning a graph capture", e))?;
        let mut issued = Ok(());
        for _ in 0..launches {
            issued = launch();
            if issued.is_err() {
                break;
            }
        }
        // End the capture whatever happened, so the stream is usable again.
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        issued?;
        let graph = graph
            .map_err(|e| GpuError::call("instantiating the captured graph", e))?
            .ok_or_else(|| GpuError::call("capturing a graph", "the capture recorded nothing"))?;
        graph
            .upload()
            .map_err(|e| GpuError::call("uploading the graph", e))?;
        Ok(CapturedLoop { graph, launches })
    }

    /// Launches the graph once (all its captured launches) on the stream.
    pub fn replay(&self) -> Result<(), GpuError> {
        self.graph
            .launch()
            .map_err(|e| GpuError::call("launching the graph", e))
    }

    /// How many launches one replay runs.
    pub fn launches(&self) -> usize {
        self.launches
    }
}
