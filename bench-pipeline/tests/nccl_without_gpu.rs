//! `--backend nccl` where there is no GPU (CI, laptops): one line on stderr
//! naming the missing library, nothing on stdout, exit code 2.
#![cfg(feature = "cuda")]

use parbench::gpu::{probe, Lib};
use std::process::Command;

#[test]
fn nccl_backend_without_a_gpu_exits_2_with_one_line() {
    if probe::probe(Lib::Driver).is_ok() && probe::probe(Lib::Nccl).is_ok() {
        eprintln!("skipped: this machine has a CUDA driver and NCCL (scripts/gpu-check.sh runs the GPU runs)");
        return;
    }
    let out_dir = std::env::temp_dir().join(format!("parbench-pp-nogpu-{}", std::process::id()));
    // With --stages, and without: the default stages come from the visible GPUs.
    for args in [
        &["--backend", "nccl", "--stages", "2"][..],
        &["--backend", "nccl"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_bench-pipeline"))
            .args(args)
            .arg("--out")
            .arg(&out_dir)
            .output()
            .expect("bench-pipeline runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: stderr: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(
            stderr.contains("libcuda") || stderr.contains("libnccl"),
            "{stderr}"
        );
        assert!(stderr.contains("LD_LIBRARY_PATH"), "{stderr}");
        assert!(
            out.stdout.is_empty(),
            "stdout: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
