//! Without a GPU (CI, laptops) every entry point of the GPU path returns one
//! clear error naming the missing library and LD_LIBRARY_PATH, and never
//! panics; with one, the probe finds the libraries under cudarc's names.
//! Runs everywhere the crate builds with `--features cuda`.
#![cfg(feature = "cuda")]

use parbench::comm::nccl::NcclComm;
use parbench::comm::DType;
use parbench::compute::cuda::CudaCompute;
use parbench::gpu::{self, probe, Gpu, Lib};
use std::time::Duration;

#[test]
fn probe_names_the_library_and_the_variable_or_finds_it() {
    // On the GPU check (scripts/gpu-check.sh sets PARBENCH_GPU=1) every
    // library must be found; elsewhere a clean error is the contract.
    let gpu_check = std::env::var("PARBENCH_GPU").is_ok_and(|v| v == "1");
    for lib in Lib::ALL {
        match probe::probe(lib) {
            Ok(found) => {
                eprintln!("{}: {} ({:?})", lib.name(), found.soname, found.path);
                let stem = found.soname.trim_start_matches("lib");
                assert!(!stem.is_empty(), "{lib:?} found as {}", found.soname);
            }
            Err(e) if gpu_check => panic!("PARBENCH_GPU=1 but {e}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.contains('\n'), "one line: {msg}");
                assert!(msg.contains(lib.name()), "names the library: {msg}");
                assert!(msg.contains("LD_LIBRARY_PATH"), "names the variable: {msg}");
            }
        }
    }
}

#[test]
fn entry_points_fail_cleanly_without_a_driver() {
    if probe::probe(Lib::Driver).is_ok() {
        eprintln!("skipped: this machine has a CUDA driver (the GPU tests cover it)");
        return;
    }
    let t = Duration::from_secs(5);
    let errs = [
        gpu::device_count().err().map(|e| e.to_string()),
        Gpu::open(0).err().map(|e| e.to_string()),
        NcclComm::init_all(&[0], t).err().map(|e| e.to_string()),
        CudaCompute::new(0, DType::BF16)
            .err()
            .map(|e| e.to_string()),
    ];
    for e in errs {
        let e = e.expect("an error, not a device");
        eprintln!("{e}");
        assert!(
            e.contains("libcuda") || e.contains("libnccl"),
            "names a library: {e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
    }
}
