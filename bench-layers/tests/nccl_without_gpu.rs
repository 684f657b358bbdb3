//! `--backend nccl` where there is no GPU (CI, laptops): one line on stderr
//! (the missing library, or the build without CUDA), nothing measured,
//! exit code 2. The degrees come from the visible GPUs, so asking for none
//! still asks the driver.

use std::process::Command;

#[test]
fn nccl_backend_without_a_gpu_exits_2_with_one_line() {
    #[cfg(feature = "cuda")]
    {
        use parbench::gpu::{probe, Lib};
        if probe::probe(Lib::Driver).is_ok() && probe::probe(Lib::Nccl).is_ok() {
            eprintln!("skipped: this machine has a CUDA driver and NCCL (scripts/gpu-check.sh runs the GPU runs)");
            return;
        }
    }
    let out_dir =
        std::env::temp_dir().join(format!("parbench-layers-nogpu-{}", std::process::id()));
    for args in [
        &["--backend", "nccl"][..],
        &["--backend", "nccl", "--tp", "1"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_bench-layers"))
            .args(args)
            .arg("--out")
            .arg(&out_dir)
            .output()
            .expect("bench-layers runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        if cfg!(feature = "cuda") {
            assert!(
                stderr.contains("libcuda") || stderr.contains("libnccl"),
                "{stderr}"
            );
        } else {
            assert!(stderr.contains("--features cuda"), "{stderr}");
        }
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(!out_dir.join("layers.csv").exists(), "nothing recorded");
    }
}
