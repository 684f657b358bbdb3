//! The real libnccl, without a GPU: what can be checked before the first GPU
//! run. The library reports its version, exports every NCCL function
//! parbench calls (in the release scripts/gpu-libs.sh pins and in the
//! oldest release docs/gpu.md supports), and makes a unique id whose
//! bootstrap listens on loopback. NCCL needs no GPU for any of this; it
//! does for a communicator, which `gpu_nccl` covers on the GPU check.
//!
//! Without the library (a developer without the wheels) each test prints one
//! `skipped: ...` line; in CI (.ci/run sets PARBENCH_REQUIRE_GPU_LIBS=1) and
//! on the GPU check (PARBENCH_GPU=1) a missing library is a failure.
#![cfg(feature = "cuda")]

use parbench::comm::nccl;
use parbench::gpu::{probe, Lib};
use std::collections::BTreeSet;
use std::ffi::{c_int, CString};
use std::path::{Path, PathBuf};

fn required() -> bool {
    ["PARBENCH_GPU", "PARBENCH_REQUIRE_GPU_LIBS"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

/// Whether the test can go on: `false` after printing the skip line.
fn nccl_here() -> bool {
    match probe::probe(Lib::Nccl) {
        Ok(found) => {
            eprintln!("NCCL: {} ({:?})", found.soname, found.path);
            true
        }
        Err(e) => {
            assert!(!required(), "libnccl required here but {e}");
            eprintln!("skipped: {e}");
            false
        }
    }
}

/// `major.minor.patch` from NCCL's code (major*10000 + minor*100 + patch
/// since NCCL 2.9).
fn version_of_code(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100)
}

/// The NCCL functions parbench's source calls: every `ncclName(` in
/// parbench/src, every symbol it looks up by name (`b"ncclName\0"`), plus
/// those behind the cudarc wrappers it uses. Read from
/// the source so that a new call cannot be forgotten in the probe's list.
fn nccl_calls_in_source() -> BTreeSet<String> {
    // cudarc's safe-ish wrappers, each one NCCL function.
    const WRAPPERS: [(&str, &str); 2] = [
        ("nccl::result::get_uniqueid(", "ncclGetUniqueId"),
        ("nccl::result::get_nccl_version(", "ncclGetVersion"),
    ];
    let mut calls = BTreeSet::new();
    let mut files = Vec::new();
    rs_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(!files.is_empty(), "parbench/src has Rust files");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (wrapper, f) in WRAPPERS {
            if text.contains(wrapper) {
                calls.insert(f.to_string());
            }
        }
        assert!(
            !text.contains("nccl::result::") || WRAPPERS.iter().any(|(w, _)| text.contains(w)),
            "{}: a cudarc nccl::result wrapper this test does not know; add it to WRAPPERS",
            file.display()
        );
        let mut rest = text.as_str();
        while let Some(i) = rest.find("nccl") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            let before = rest[..i].chars().last();
            let starts_word = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let upper = name[4..].starts_with(|c: char| c.is_ascii_uppercase());
            // A call, or a symbol looked up by name (`b"ncclName\0"`).
            let called = tail[end..].starts_with('(') || tail[end..].starts_with("\\0\"");
            if starts_word && upper && called {
                calls.insert(name.to_string());
            }
            rest = &tail[end.max(4)..];
        }
    }
    calls
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_probe_lists_every_nccl_function_the_source_calls() {
    // Needs no library: the list the probe (and the tests below) check
    // against a real libnccl must be the one the code calls.
    let calls = nccl_calls_in_source();
    for f in ["ncclAllReduce", "ncclCommInitRank", "ncclGetUniqueId"] {
        assert!(calls.contains(f), "the scan finds {f}: {calls:?}");
    }
    let listed: BTreeSet<String> = Lib::Nccl.symbols().iter().map(|s| s.to_string()).collect();
    let unlisted: Vec<&String> = calls.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "parbench calls {unlisted:?}, which gpu::probe's NCCL list lacks"
    );
}

#[test]
fn the_library_reports_its_version() {
    if !nccl_here() {
        return;
    }
    let v = nccl::nccl_version().unwrap();
    eprintln!("ncclGetVersion: {v}");
    let parts: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{v}");
    assert!(
        parts[0] == 2 && parts[1] >= 18,
        "NCCL {v} is older than 2.18"
    );
    // scripts/gpu-libs.sh's env.sh names the release it installed: the one
    // loaded must be it, not another libnccl earlier on the loader's path.
    if let Ok(want) = std::env::var("PARBENCH_NCCL_VERSION") {
        assert_eq!(v, want, "loaded NCCL {v}, installed {want}");
    }
}

#[test]
fn the_library_exports_every_function_parbench_calls() {
    if !nccl_here() {
        return;
    }
    let path = probe::probe(Lib::Nccl).unwrap().path.expect("its path");
    let lib = Dl::open(&path).unwrap();
    let missing = missing_functions(&lib);
    assert!(missing.is_empty(), "{} lacks {missing:?}", path.display());
}

#[test]
fn the_oldest_supported_nccl_exports_every_function_parbench_calls() {
    let (Ok(path), Ok(want)) = (
        std::env::var("PARBENCH_NCCL_OLDEST"),
        std::env::var("PARBENCH_NCCL_OLDEST_VERSION"),
    ) else {
        assert!(
            !std::env::var("PARBENCH_REQUIRE_GPU_LIBS").is_ok_and(|v| v == "1"),
            "PARBENCH_REQUIRE_GPU_LIBS=1 but PARBENCH_NCCL_OLDEST(_VERSION) unset (. target/gpu-libs/env.sh)"
        );
        eprintln!(
            "skipped: PARBENCH_NCCL_OLDEST unset (scripts/gpu-libs.sh installs the oldest NCCL)"
        );
        return;
    };
    // Opened by path beside the other release: RTLD_LOCAL keeps their
    // symbols apart, and only ncclGetVersion, which touches no state, runs.
    let lib = Dl::open(Path::new(&path)).unwrap();
    let missing = missing_functions(&lib);
    assert!(missing.is_empty(), "NCCL {want} ({path}) lacks {missing:?}");
    let get_version = lib.sym("ncclGetVersion");
    assert!(!get_version.is_null());
    // SAFETY: ncclGetVersion's C signature, `ncclResult_t (int*)`, with a
    // valid out-pointer.
    let (rc, code) = unsafe {
        let f: unsafe extern "C" fn(*mut c_int) -> c_int = std::mem::transmute(get_version);
        let mut code: c_int = 0;
        (f(&mut code), code)
    };
    assert_eq!(rc, 0, "ncclGetVersion of {path}");
    assert_eq!(version_of_code(code), want, "{path}");
    eprintln!(
        "NCCL {want} ({path}) exports all {} functions",
        Lib::Nccl.symbols().len()
    );
}

#[test]
fn a_unique_id_names_a_loopback_bootstrap() {
    if !nccl_here() {
        return;
    }
    // The interface rank 0's bootstrap listens on; read once, at NCCL's
    // first initialising call, which this test is (no other test here
    // makes one).
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let a = nccl::unique_id().unwrap();
    let b = nccl::unique_id().unwrap();
    assert_ne!(a, b, "two ids, two bootstraps");
    for id in [a, b] {
        // The id is NCCL's bootstrap handle: a random magic, then the root's
        // socket address, a sockaddr_in (family AF_INET in host order, port
        // and address in network order) for 127.0.0.1.
        let at = id
            .windows(8)
            .position(|w| {
                u16::from_ne_bytes([w[0], w[1]]) == libc::AF_INET as u16
                    && w[4..8] == [127, 0, 0, 1]
            })
            .unwrap_or_else(|| panic!("no 127.0.0.1 socket address in {id:02x?}"));
        let port = u16::from_be_bytes([id[at + 2], id[at + 3]]);
        assert_ne!(port, 0, "a listening port");
        // What the id's root accepts connections on: a rank joining would
        // connect here, so a refused connection is a broken bootstrap.
        std::net::TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("the bootstrap at 127.0.0.1:{port}: {e}"));
        eprintln!("ncclGetUniqueId: bootstrap at 127.0.0.1:{port}");
    }
}

/// The functions parbench calls that `lib` does not export.
fn missing_functions(lib: &Dl) -> Vec<&'static str> {
    Lib::Nccl
        .symbols()
        .iter()
        .copied()
        .filter(|s| !lib.has(s))
        .collect()
}

/// A `dlopen` handle of one file, closed on drop.
struct Dl(*mut libc::c_void);

impl Dl {
    fn open(path: &Path) -> Result<Dl, String> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a valid C string; RTLD_LOCAL keeps its symbols to this handle.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if h.is_null() {
            Err(format!("dlopen {} failed", path.display()))
        } else {
            Ok(Dl(h))
        }
    }

    fn sym(&self, name: &str) -> *mut libc::c_void {
        let c = CString::new(name).expect("no NUL in a symbol name");
        // SAFETY: an open handle and a valid C string.
        unsafe { libc::dlsym(self.0, c.as_ptr()) }
    }

    fn has(&self, name: &str) -> bool {
        !self.sym(name).is_null()
    }
}

impl Drop for Dl {
    fn drop(&mut self) {
        // SAFETY: opened by dlopen, closed once.
        unsafe {
            libc::dlclose(self.0);
        }
    }
}
