//! NVRTC: which images (CUBIN, PTX) to build for a device, and compiling
//! the kernels into them, once per storage type, kind and architecture.

use super::KERNELS;
use crate::comm::DType;
use crate::compute::{ComputeError, ComputeResult};
use crate::gpu::{self, GpuError, Lib};
use cudarc::nvrtc::sys as nvrtc;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

/// What NVRTC makes of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// Machine code for one architecture (`--gpu-architecture=sm_XY`), `nvrtcGetCUBIN`.
    Cubin,
    /// PTX for a virtual architecture (`--gpu-architecture=compute_XY`),
    /// compiled by the driver when the module loads; runs on that
    /// architecture and every later one the driver knows.
    Ptx,
}

impl ImageKind {
    pub(super) fn option(self, arch: u32) -> String {
        match self {
            ImageKind::Cubin => format!("--gpu-architecture=sm_{arch}"),
            ImageKind::Ptx => format!("--gpu-architecture=compute_{arch}"),
        }
    }

    /// `CUBIN sm_90`, `PTX compute_90`.
    pub fn label(self, arch: u32) -> String {
        match self {
            ImageKind::Cubin => format!("CUBIN sm_{arch}"),
            ImageKind::Ptx => format!("PTX compute_{arch}"),
        }
    }
}

/// The images to try, in order, for a device of architecture `device`
/// (major * 10 + minor) given the architectures NVRTC supports: the CUBIN of
/// the device's own architecture when NVRTC has it, then PTX of the newest
/// architecture NVRTC supports that is not newer than the device (the
/// driver compiles PTX forward, never back). Empty when NVRTC supports
/// nothing at or below the device.
pub fn image_plan(device: u32, supported: &[u32]) -> Vec<(ImageKind, u32)> {
    let mut plan = Vec::new();
    if supported.contains(&device) {
        plan.push((ImageKind::Cubin, device));
    }
    if let Some(&ptx) = supported.iter().filter(|&&a| a <= device).max() {
        plan.push((ImageKind::Ptx, ptx));
    }
    plan
}

/// The architectures this NVRTC compiles for (`nvrtcGetSupportedArchs`), ascending.
pub fn nvrtc_archs() -> Result<Vec<u32>, GpuError> {
    gpu::require(&[Lib::Nvrtc])?;
    gpu::guarded("nvrtcGetSupportedArchs", || {
        let mut n: std::ffi::c_int = 0;
        // SAFETY: valid out-pointer.
        unsafe { nvrtc::nvrtcGetNumSupportedArchs(&mut n) }
            .result()
            .map_err(|e| GpuError::call("nvrtcGetNumSupportedArchs", e))?;
        let mut archs: Vec<std::ffi::c_int> = vec![0; usize::try_from(n).unwrap_or(0)];
        if !archs.is_empty() {
            // SAFETY: room for the `n` entries NVRTC said it would write.
            unsafe { nvrtc::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
                .result()
                .map_err(|e| GpuError::call("nvrtcGetSupportedArchs", e))?;
        }
        let mut archs: Vec<u32> = archs
            .into_iter()
            .filter_map(|a| u32::try_from(a).ok())
            .collect();
        archs.sort_unstable();
        Ok(archs)
    })
}

/// NVRTC's version as `major.minor`.
pub fn nvrtc_version() -> Result<String, GpuError> {
    gpu::require(&[Lib::Nvrtc])?;
    gpu::guarded("nvrtcVersion", || {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| GpuError::call("nvrtcVersion", e))?;
        Ok(format!("{major}.{minor}"))
    })
}

/// Compiles the element-wise kernels for `dtype` with NVRTC as `kind` for
/// architecture `arch` (90 for sm_90 / compute_90) and returns the image
/// (a CUBIN is an ELF file; PTX is text ending in one NUL). Needs NVRTC only,
/// no device or driver: lets a machine without a GPU check the kernel source
/// and both outputs (the `gpu_kernels_compile` test).
pub fn compile_kernels(dtype: DType, kind: ImageKind, arch: u32) -> ComputeResult<Vec<u8>> {
    gpu::require(&[Lib::Nvrtc])?;
    let code = match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        other => return Err(ComputeError::Unsupported(format!("no kernels for {other}"))),
    };
    let image = gpu::guarded("compiling the kernels", || compiled(code, kind, arch))?;
    Ok((*image).clone())
}

/// The kernels' image for one storage type, kind and architecture, compiled
/// on first use and kept for the process (every device of a multi-GPU
/// process of one architecture loads the same image).
pub(super) fn compiled(
    dtype_code: u32,
    kind: ImageKind,
    arch: u32,
) -> Result<Arc<Vec<u8>>, GpuError> {
    type Cache = Mutex<HashMap<(u32, ImageKind, u32), Arc<Vec<u8>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (dtype_code, kind, arch);
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(p) = cache.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(p);
    }
    let src = format!("#define PB_DTYPE {dtype_code}\n{KERNELS}");
    let image = Arc::new(nvrtc_compile(&src, &[kind.option(arch)], kind)?);
    if let Ok(mut m) = cache.lock() {
        m.insert(key, image.clone());
    }
    Ok(image)
}

/// One NVRTC compilation through cudarc's sys layer (its safe layer panics
/// on some failures and offers no CUBIN): the program is destroyed on every path.
pub(super) fn nvrtc_compile(
    src: &str,
    options: &[String],
    kind: ImageKind,
) -> Result<Vec<u8>, GpuError> {
    let what = "compiling the kernels with NVRTC";
    let c_src = CString::new(src).map_err(|e| GpuError::call(what, e))?;
    let name = c"parbench_kernels.cu";
    let c_opts = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| GpuError::call(what, e))?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid out-pointer and NUL-terminated strings that outlive the program; no headers.
    unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut prog,
            c_src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    }
    .result()
    .map_err(|e| GpuError::call("nvrtcCreateProgram", e))?;
    let prog = Program(prog);
    let n = std::ffi::c_int::try_from(opt_ptrs.len()).unwrap_or(0);
    // SAFETY: a live program; `n` options, each a NUL-terminated string.
    let compiled = unsafe { nvrtc::nvrtcCompileProgram(prog.0, n, opt_ptrs.as_ptr()) }.result();
    if let Err(e) = compiled {
        let log = prog.log();
        return Err(GpuError::call(
            format!("{what} ({})", options.join(" ")),
            format!("{e}: {}", log.trim().replace('\n', " | ")),
        ));
    }
    match kind {
        // SAFETY (both): a compiled program; the buffers have the size NVRTC reported.
        ImageKind::Cubin => prog.output(
            "nvrtcGetCUBIN",
            |p, n| unsafe { nvrtc::nvrtcGetCUBINSize(p, n) },
            |p, b| unsafe { nvrtc::nvrtcGetCUBIN(p, b) },
        ),
        ImageKind::Ptx => prog.output(
            "nvrtcGetPTX",
            |p, n| unsafe { nvrtc::nvrtcGetPTXSize(p, n) },
            |p, b| unsafe { nvrtc::nvrtcGetPTX(p, b) },
        ),
    }
}

/// An NVRTC program, destroyed on drop.
pub(super) struct Program(pub(super) nvrtc::nvrtcProgram);

impl Program {
    /// The compiler's log (empty when it cannot be read).
    pub(super) fn log(&self) -> String {
        let mut out = Vec::new();
        let ok = self
            .output(
                "nvrtcGetProgramLog",
                // SAFETY (both): a live program; buffer of the size reported.
                |p, n| unsafe { nvrtc::nvrtcGetProgramLogSize(p, n) },
                |p, b| unsafe { nvrtc::nvrtcGetProgramLog(p, b) },
            )
            .map(|v| out = v)
            .is_ok();
        if !ok {
            return String::new();
        }
        let end = out.iter().position(|&b| b == 0).unwrap_or(out.len());
        String::from_utf8_lossy(&out[..end]).into_owned()
    }

    /// One of the program's outputs: its size, then its bytes.
    pub(super) fn output(
        &self,
        what: &str,
        size: impl FnOnce(nvrtc::nvrtcProgram, *mut usize) -> nvrtc::nvrtcResult,
        get: impl FnOnce(nvrtc::nvrtcProgram, *mut std::ffi::c_char) -> nvrtc::nvrtcResult,
    ) -> Result<Vec<u8>, GpuError> {
        let mut n = 0usize;
        size(self.0, &mut n)
            .result()
            .map_err(|e| GpuError::call(format!("{what}Size"), e))?;
        let mut buf = vec![0u8; n];
        if n > 0 {
            get(self.0, buf.as_mut_ptr() as *mut std::ffi::c_char)
                .result()
                .map_err(|e| GpuError::call(what, e))?;
        }
        Ok(buf)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        let _ = unsafe { nvrtc::nvrtcDestroyProgram(&mut self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_gets_its_own_cubin_then_ptx_it_can_run() {
        let nvrtc_12_9 = [
            50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 120,
        ];
        // H200: sm_90 machine code, PTX for compute_90 as the fallback.
        assert_eq!(
            image_plan(90, &nvrtc_12_9),
            vec![(ImageKind::Cubin, 90), (ImageKind::Ptx, 90)]
        );
        // A device newer than NVRTC (sm_103 here): no CUBIN, the newest PTX below it.
        assert_eq!(image_plan(103, &nvrtc_12_9), vec![(ImageKind::Ptx, 100)]);
        // sm_88 is not an architecture NVRTC lists: PTX of sm_87 runs on it.
        assert_eq!(image_plan(88, &nvrtc_12_9), vec![(ImageKind::Ptx, 87)]);
        // Older than everything NVRTC supports: nothing to try.
        assert!(image_plan(35, &nvrtc_12_9).is_empty());
        assert_eq!(ImageKind::Cubin.option(90), "--gpu-architecture=sm_90");
        assert_eq!(ImageKind::Ptx.option(90), "--gpu-architecture=compute_90");
    }
}
