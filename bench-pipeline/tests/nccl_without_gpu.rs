//! `--backend nccl` where there is no GPU (CI, laptops): one line on stderr
//! naming the missing library, nothing on stdout, exit code 2.
#![cfg(feature = "cuda")]

#[path = "../../test-support/binary.rs"]
mod binary;
use binary::assert_nccl_missing;
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
        assert_nccl_missing(&out, &format!("{args:?}"));
    }
}
