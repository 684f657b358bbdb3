//! `--backend nccl` where there is no GPU (CI, laptops): one line on stderr
//! naming the missing library, nothing on stdout, exit code 2.
#![cfg(feature = "cuda")]

mod common;
use common::assert_nccl_missing;
use parbench::gpu::{probe, Lib};
use std::process::Command;

#[test]
fn nccl_backend_without_a_gpu_exits_2_with_one_line() {
    if probe::probe(Lib::Driver).is_ok() && probe::probe(Lib::Nccl).is_ok() {
        eprintln!("skipped: this machine has a CUDA driver and NCCL (scripts/gpu-check.sh runs the GPU sweep)");
        return;
    }
    let out_dir = std::env::temp_dir().join(format!("parbench-nccl-nogpu-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_bench-collectives"))
        .args([
            "--backend",
            "nccl",
            "-np",
            "1",
            "-b",
            "8",
            "-e",
            "64",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .expect("bench-collectives runs");
    assert_nccl_missing(&out, "-np 1");
    assert!(!out_dir.exists(), "no records without a run");
}
