//! Finds the CUDA libraries before cudarc touches them.
//!
//! cudarc (dynamic loading) opens each library the first time one of its
//! functions is called, and panics when the library or a symbol is missing.
//! [`probe`] opens the same file names cudarc tries (from
//! [`cudarc::get_lib_name_candidates`]) with `dlopen`, and looks up every
//! symbol parbench calls, so that a missing or too-old library becomes one
//! [`GpuError::Missing`] line instead of a panic. Nothing here calls cudarc's
//! loaders.

use super::GpuError;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

/// A library the GPU path loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lib {
    /// The CUDA driver, `libcuda.so.1` (comes with the NVIDIA driver).
    Driver,
    /// NCCL, for the `nccl` communicator.
    Nccl,
    /// cuBLASLt, for the GEMMs of [`crate::compute::cuda`].
    CublasLt,
    /// NVRTC, which compiles the element-wise kernels at run time.
    Nvrtc,
}

impl Lib {
    /// Every library, in the order they are probed.
    pub const ALL: [Lib; 4] = [Lib::Driver, Lib::Nccl, Lib::CublasLt, Lib::Nvrtc];

    /// The stem cudarc builds its candidate file names from.
    fn stem(self) -> &'static str {
        match self {
            Lib::Driver => "cuda",
            Lib::Nccl => "nccl",
            Lib::CublasLt => "cublasLt",
            Lib::Nvrtc => "nvrtc",
        }
    }

    /// The name users know the library by.
    pub fn name(self) -> &'static str {
        match self {
            Lib::Driver => "CUDA driver (libcuda)",
            Lib::Nccl => "NCCL (libnccl)",
            Lib::CublasLt => "cuBLASLt (libcublasLt)",
            Lib::Nvrtc => "NVRTC (libnvrtc)",
        }
    }

    /// The Python wheel that ships the library (PyTorch depends on these).
    fn pip_package(self) -> &'static str {
        match self {
            Lib::Driver => "none: the NVIDIA driver",
            Lib::Nccl => "nvidia-nccl-cu12 or -cu13",
            Lib::CublasLt => "nvidia-cublas-cu12 or -cu13",
            Lib::Nvrtc => "nvidia-cuda-nvrtc-cu12 or -cu13",
        }
    }

    /// The symbols parbench calls through cudarc (each call site loads its
    /// symbol lazily and panics when it is absent, so all are checked here).
    /// `cuEventElapsedTime_v2` is not listed: [`super::timing`] falls back to
    /// `cuEventElapsedTime` on drivers older than CUDA 12.8.
    pub fn symbols(self) -> &'static [&'static str] {
        match self {
            Lib::Driver => &[
                "cuInit",
                "cuDriverGetVersion",
                "cuDeviceGet",
                "cuDeviceGetCount",
                "cuDeviceGetName",
                "cuDeviceGetAttribute",
                "cuDeviceCanAccessPeer",
                "cuDeviceGetP2PAttribute",
                "cuDevicePrimaryCtxRetain",
                "cuDevicePrimaryCtxRelease_v2",
                "cuCtxGetCurrent",
                "cuCtxSetCurrent",
                "cuCtxEnablePeerAccess",
                "cuStreamCreate",
                "cuStreamDestroy_v2",
                "cuStreamSynchronize",
                "cuStreamBeginCapture_v2",
                "cuStreamIsCapturing",
                "cuStreamEndCapture",
                "cuGraphInstantiateWithFlags",
                "cuGraphLaunch",
                "cuGraphUpload",
                "cuGraphExecDestroy",
                "cuGraphDestroy",
                "cuEventCreate",
                "cuEventRecord",
                "cuEventQuery",
                "cuEventSynchronize",
                "cuEventDestroy_v2",
                "cuMemAlloc_v2",
                "cuMemFree_v2",
                "cuMemsetD8Async",
                "cuMemcpyHtoDAsync_v2",
                "cuMemcpyDtoHAsync_v2",
                "cuMemcpyDtoDAsync_v2",
                "cuMemcpyPeerAsync",
                "cuModuleLoadData",
                "cuModuleGetFunction",
                "cuModuleUnload",
                "cuLaunchKernel",
                "cuGetErrorName",
                "cuGetErrorString",
            ],
            Lib::Nccl => &[
                "ncclGetVersion",
                "ncclGetUniqueId",
                "ncclCommInitRank",
                "ncclCommInitAll",
                "ncclCommAbort",
                "ncclCommDestroy",
                "ncclAllReduce",
                "ncclAllGather",
                "ncclReduceScatter",
                "ncclBroadcast",
                "ncclReduce",
                "ncclSend",
                "ncclRecv",
                "ncclGroupStart",
                "ncclGroupEnd",
                "ncclGetErrorString",
                "ncclCommGetAsyncError",
                // mulsum (NCCL 2.11 and later).
                "ncclRedOpCreatePreMulSum",
                "ncclRedOpDestroy",
            ],
            Lib::CublasLt => &[
                "cublasLtCreate",
                "cublasLtDestroy",
                "cublasLtMatmul",
                "cublasLtMatmulDescCreate",
                "cublasLtMatmulDescDestroy",
                "cublasLtMatmulDescSetAttribute",
                "cublasLtMatrixLayoutCreate",
                "cublasLtMatrixLayoutDestroy",
                "cublasLtMatrixLayoutSetAttribute",
                "cublasLtMatmulPreferenceCreate",
                "cublasLtMatmulPreferenceDestroy",
                "cublasLtMatmulPreferenceSetAttribute",
                "cublasLtMatmulAlgoGetHeuristic",
            ],
            Lib::Nvrtc => &[
                "nvrtcCreateProgram",
                "nvrtcCompileProgram",
                "nvrtcDestroyProgram",
                "nvrtcGetPTX",
                "nvrtcGetPTXSize",
                "nvrtcGetCUBIN",
                "nvrtcGetCUBINSize",
                "nvrtcGetNumSupportedArchs",
                "nvrtcGetSupportedArchs",
                "nvrtcGetProgramLog",
                "nvrtcGetProgramLogSize",
                "nvrtcVersion",
            ],
        }
    }
}

/// Where a library was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The library.
    pub lib: Lib,
    /// The name `dlopen` accepted (one of cudarc's candidates).
    pub soname: String,
    /// The file it resolved to, when the loader says.
    pub path: Option<PathBuf>,
}

/// Checks that every library in `libs` loads under a name cudarc tries and
/// exports every symbol parbench calls. Returns where each was found, or the
/// first problem as one line naming the library and what to set.
pub fn require(libs: &[Lib]) -> Result<Vec<Found>, GpuError> {
    libs.iter().map(|&lib| probe(lib)).collect()
}

/// Probes one library (see [`require`]).
pub fn probe(lib: Lib) -> Result<Found, GpuError> {
    let candidates = cudarc::get_lib_name_candidates(lib.stem());
    for name in &candidates {
        let Some(handle) = DlHandle::open(name) else {
            continue;
        };
        let missing: Vec<&str> = lib
            .symbols()
            .iter()
            .copied()
            .filter(|s| handle.sym(s).is_null())
            .collect();
        let path = handle.path_of(lib.symbols()[0]);
        if !missing.is_empty() {
            return Err(GpuError::Missing {
                lib: lib.name(),
                detail: format!(
                    "{} lacks {} (parbench's bindings are for CUDA 13.0 and NCCL 2.30; install a newer {})",
                    path.as_deref().map(Path::display).map(|d| d.to_string()).unwrap_or_else(|| name.clone()),
                    missing.join(", "),
                    lib.name()
                ),
            });
        }
        return Ok(Found {
            lib,
            soname: name.clone(),
            path,
        });
    }
    Err(GpuError::Missing {
        lib: lib.name(),
        detail: not_found_hint(lib, &candidates, || {
            find_library_file(&format!("lib{}.so", lib.stem()))
        }),
    })
}

/// What to tell the user when no candidate name loads.
fn not_found_hint(
    lib: Lib,
    candidates: &[String],
    find: impl FnOnce() -> Option<PathBuf>,
) -> String {
    let tried = format!(
        "tried {}",
        candidates
            .iter()
            .filter(|c| !c.contains("64"))
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    if lib == Lib::Driver {
        return format!(
            "{tried}: no NVIDIA driver on this machine (or set LD_LIBRARY_PATH to the folder holding libcuda.so.1)"
        );
    }
    let prefix = format!("lib{}.so", lib.stem());
    if let Some(file) = find() {
        let dir = file
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let fname = file
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if candidates.contains(&fname) {
            return format!(
                "{tried}: found {} outside the loader's path; export LD_LIBRARY_PATH={dir}:$LD_LIBRARY_PATH",
                file.display()
            );
        }
        return format!(
            "{tried}: only {} exists (its soname, which cudarc does not try); run: mkdir -p $HOME/.cache/parbench/lib && ln -sf {} $HOME/.cache/parbench/lib/{prefix} && export LD_LIBRARY_PATH=$HOME/.cache/parbench/lib:$LD_LIBRARY_PATH (scripts/gpu-check.sh does this)",
            file.display(),
            file.display()
        );
    }
    format!(
        "{tried}: not found; install it (pip package {}) and add its lib folder to LD_LIBRARY_PATH",
        lib.pip_package()
    )
}

/// Looks for a file named `prefix` or `prefix.N...` where libraries live:
/// first through the loader (`dlopen` of NCCL's soname `libnccl.so.2` and
/// the like), then `LD_LIBRARY_PATH`, the system folders, and the `nvidia/*/lib`
/// folders of Python packages (PyTorch's wheels), so that the error can name it.
pub fn find_library_file(prefix: &str) -> Option<PathBuf> {
    for major in ["2", "13", "12", "11", "1"] {
        let name = format!("{prefix}.{major}");
        if let Some(h) = DlHandle::open(&name) {
            if let Some(p) = h.own_path() {
                return Some(p);
            }
        }
    }
    search_dirs()
        .into_iter()
        .find_map(|dir| best_match_in(&dir, prefix))
}

/// Folders where CUDA libraries are commonly installed, most specific first.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/local/nccl/lib",
        "/usr/local/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    for p in ["/usr", "/usr/local", "/opt/conda", "/opt/venv"] {
        prefixes.push(PathBuf::from(p));
    }
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with("python3") {
                    continue;
                }
                for pkgs in ["site-packages", "dist-packages"] {
                    let nvidia = e.path().join(pkgs).join("nvidia");
                    let Ok(subs) = std::fs::read_dir(&nvidia) else {
                        continue;
                    };
                    for s in subs.flatten() {
                        dirs.push(s.path().join("lib"));
                    }
                }
            }
        }
    }
    dirs
}

/// The file in `dir` named `prefix` or `prefix.<version>`, preferring the plain name.
fn best_match_in(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let exact = dir.join(prefix);
    if exact.exists() {
        return Some(exact);
    }
    let entries = std::fs::read_dir(dir).ok()?;
    let mut hits: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(prefix))
                .is_some_and(|rest| {
                    rest.starts_with('.')
                        && rest[1..].chars().all(|c| c.is_ascii_digit() || c == '.')
                })
        })
        .map(|e| e.path())
        .collect();
    hits.sort();
    hits.into_iter().next()
}

/// A `dlopen` handle, closed on drop.
struct DlHandle(*mut libc::c_void);

impl DlHandle {
    fn open(name: &str) -> Option<Self> {
        let c = CString::new(name).ok()?;
        // SAFETY: a valid C string; RTLD_LAZY|RTLD_LOCAL loads without binding
        // symbols into the global namespace, as cudarc's libloading does.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        // Not `then_some`: it would build (and drop, so dlclose) a null handle.
        if h.is_null() {
            None
        } else {
            Some(DlHandle(h))
        }
    }

    fn sym(&self, name: &str) -> *mut libc::c_void {
        let Ok(c) = CString::new(name) else {
            return std::ptr::null_mut();
        };
        // SAFETY: the handle is open and the name a valid C string.
        unsafe { libc::dlsym(self.0, c.as_ptr()) }
    }

    /// The file a symbol of this library lives in.
    fn path_of(&self, symbol: &str) -> Option<PathBuf> {
        let addr = self.sym(symbol);
        if addr.is_null() {
            return None;
        }
        // SAFETY: dladdr fills `info` for an address inside a loaded object;
        // dli_fname then points at a string owned by the loader.
        unsafe {
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(addr as *const _, &mut info) == 0 || info.dli_fname.is_null() {
                return None;
            }
            let s = CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned();
            Some(PathBuf::from(s))
        }
    }

    /// The file this handle opened, found through any exported symbol.
    fn own_path(&self) -> Option<PathBuf> {
        ["ncclGetVersion", "cublasLtCreate", "nvrtcVersion", "cuInit"]
            .iter()
            .find_map(|s| self.path_of(s))
    }
}

impl Drop for DlHandle {
    fn drop(&mut self) {
        // SAFETY: opened by dlopen and closed once.
        unsafe {
            libc::dlclose(self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_versioned_files_by_prefix() {
        let dir = std::env::temp_dir().join(format!("parbench-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libnccl.so.2.21.5"), b"").unwrap();
        std::fs::write(dir.join("libnccl.so.2"), b"").unwrap();
        std::fs::write(dir.join("libnccl-net.so"), b"").unwrap();
        assert_eq!(
            best_match_in(&dir, "libnccl.so"),
            Some(dir.join("libnccl.so.2"))
        );
        assert_eq!(best_match_in(&dir, "libcublasLt.so"), None);
        std::fs::write(dir.join("libnccl.so"), b"").unwrap();
        assert_eq!(
            best_match_in(&dir, "libnccl.so"),
            Some(dir.join("libnccl.so"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hints_name_the_symlink_for_nccl_soname_only() {
        let c = cudarc::get_lib_name_candidates("nccl");
        let wheel =
            PathBuf::from("/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2");
        let h = not_found_hint(Lib::Nccl, &c, || Some(wheel.clone()));
        assert!(h.contains("ln -sf /venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2 $HOME/.cache/parbench/lib/libnccl.so"), "{h}");
        assert!(
            h.contains("LD_LIBRARY_PATH=$HOME/.cache/parbench/lib"),
            "{h}"
        );
        // A name cudarc tries, outside the loader's path: just the folder.
        let cu12 = PathBuf::from("/venv/nvidia/cublas/lib/libcublasLt.so.12");
        let c = cudarc::get_lib_name_candidates("cublasLt");
        let h = not_found_hint(Lib::CublasLt, &c, || Some(cu12.clone()));
        assert!(
            h.contains("export LD_LIBRARY_PATH=/venv/nvidia/cublas/lib:"),
            "{h}"
        );
        let h = not_found_hint(Lib::Nvrtc, &c, || None);
        assert!(
            h.contains("not found") && h.contains("LD_LIBRARY_PATH"),
            "{h}"
        );
    }

    #[test]
    fn candidates_are_cudarcs_and_lack_nccl_soname() {
        // The reason for the libnccl.so.2 hint: cudarc never tries that name.
        let c = cudarc::get_lib_name_candidates("nccl");
        assert!(c.iter().any(|n| n == "libnccl.so"));
        assert!(!c.iter().any(|n| n == "libnccl.so.2"));
    }
}
