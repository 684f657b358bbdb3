//! Bad flags, sizes, roots and unsupported backends: one line, exit code 2.

mod common;
use common::*;

fn assert_usage_error(args: &[&str], mentions: &str) {
    let o = run(args, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line, got {err:?}"
    );
    assert!(
        err.contains(mentions),
        "{args:?}: {err:?} does not mention {mentions:?}"
    );
    assert!(o.stdout.is_empty(), "{args:?} printed a table");
}

#[test]
fn bad_input_is_one_line_and_exit_code_two() {
    assert_usage_error(&["--frobnicate"], "--frobnicate");
    assert_usage_error(&["all_scatter"], "all_scatter");
    assert_usage_error(&["-b", "12Q"], "12Q");
    assert_usage_error(&["-b", "1M", "-e", "1K"], "larger");
    assert_usage_error(&["-d", "complex"], "complex");
    assert_usage_error(&["-a", "7"], "average");
    assert_usage_error(&["--straggler", "oops"], "RANK:MS");
    assert_usage_error(
        &["broadcast", "--backend", "local", "-np", "2", "-r", "2"],
        "root",
    );
    assert_usage_error(
        &["--backend", "local", "-np", "2", "--straggler", "5:1"],
        "straggler",
    );
    assert_usage_error(
        &["--tokens", "5"],
        "--tokens is a flag of the `moe` pattern",
    );
    assert_usage_error(&["moe", "all_reduce"], "`moe` runs alone");
    assert_usage_error(&["moe", "--routing", "zipf:x"], "uniform or zipf:S");
    assert_usage_error(&["moe", "--payload", "fp16"], "bf16 or fp8");
    assert_usage_error(&["moe", "--copies", "all"], "dedup");
    assert_usage_error(&["moe", "--topk", "-1"], "--topk");
    let local = ["moe", "--backend", "local", "-np", "4"];
    assert_usage_error(
        &with(&local, &["--experts", "6", "--topk", "2"]),
        "divide evenly",
    );
    assert_usage_error(&with(&local, &["--topk", "0"]), "--topk 0");
    assert_usage_error(
        &with(&local, &["--payload", "fp8", "--hidden", "100"]),
        "multiple of 128",
    );
    assert_usage_error(
        &with(&local, &["--node-limit", "1", "--experts", "8"]),
        "hold only 2",
    );
    assert_usage_error(
        &with(&local, &["--capacity-factor", "-1"]),
        "--capacity-factor",
    );
    assert_usage_error(
        &["--compute-us", "5"],
        "--compute-us is a flag of the `cp-ring` pattern",
    );
    assert_usage_error(&["cp-ring", "all_reduce"], "`cp-ring` runs alone");
    assert_usage_error(&["cp-ring", "--compute-us", "soon"], "--compute-us 'soon'");
    assert_usage_error(&["cp-ring", "--compute-us", "-3"], "or auto");
    let ring = ["cp-ring", "--backend", "local"];
    assert_usage_error(&with(&ring, &["-np", "1"]), "at least 2 ranks");
    assert_usage_error(&with(&ring, &["-np", "2", "-e", "16G"]), "--max-bytes");
    if !cfg!(feature = "cuda") {
        assert_usage_error(&["--backend", "nccl"], "cuda");
    }
    if !cfg!(feature = "mpi") {
        assert_usage_error(&["--backend", "mpi"], "mpi");
    }
}

#[test]
fn counts_past_their_limits_are_refused_before_anything_is_allocated() {
    // Was: -n 99999999999 aborted both tcp ranks ("memory allocation of
    // 799999999992 bytes failed", rc 134), -n of u64::MAX panicked
    // ("capacity overflow"), and -w, -N, -c ran until killed.
    for n in ["99999999999", "18446744073709551615"] {
        for flag in ["-n", "-w", "-c", "-N"] {
            let args = ["--backend", "local", "-np", "2", "-e", "64", flag, n];
            assert_usage_error(&args, "at most");
        }
        assert_usage_error(&["links", "--backend", "local", "-np", "2", "-n", n], n);
        assert_usage_error(&["--backend", "tcp", "-np", "2", "-e", "64", "-n", n], n);
    }
}

#[test]
fn settings_from_the_environment_are_checked_before_anything_starts() {
    // Was: rc 1 and two or three lines from the ranks (for -5 the last
    // said "interrupted by SIGTERM"); PARBENCH_TCP_BUF_BYTES=4096 stalled
    // 80 s past a 10 s --timeout. Only PARBENCH_BIND gave one line, exit 2.
    for (k, v) in [
        ("PARBENCH_TCP_SPIN_US", "abc"),
        ("PARBENCH_TCP_BUF_BYTES", "-5"),
        ("PARBENCH_TCP_BUF_BYTES", "1T"),
        ("PARBENCH_TCP_BUF_BYTES", "4096"),
        ("PARBENCH_TCP_CONGESTION", "nosuchcc"),
        ("PARBENCH_IFADDR", "not-an-ip"),
        ("PARBENCH_BIND", "abc"),
    ] {
        let o = run(
            &[
                "--backend",
                "tcp",
                "-np",
                "2",
                "-e",
                "64",
                "-n",
                "1",
                "-T",
                "10",
            ],
            &[(k, v)],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{k}={v}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{k}={v}: {err:?}");
        assert!(err.contains(k), "{k}={v}: {err:?}");
        assert!(o.stdout.is_empty(), "{k}={v} measured");
    }
}

#[test]
fn a_file_limit_too_small_for_the_job_is_refused_before_it_starts() {
    // Was: 20 s, then "rank 34: setup failed: ... lost the store (rank 0):
    // Connection reset by peer", with no word of file descriptors.
    let out = scratch("fd-limit");
    let script = "ulimit -S -n 32 && ulimit -H -n 32 && exec \"$@\"";
    let o = std::process::Command::new("sh")
        .args(["-c", script, "sh", env!("CARGO_BIN_EXE_bench-collectives")])
        .args([
            "--backend",
            "tcp",
            "-np",
            "40",
            "-e",
            "64",
            "-n",
            "1",
            "-T",
            "20",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
    assert!(
        err.contains("open files") && err.contains("ulimit -n"),
        "{err}"
    );
}
