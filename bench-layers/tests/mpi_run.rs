//! `--backend mpi`: without the `mpi` feature, one line naming the feature
//! and exit code 2; with it, a tensor-parallel block on two ranks under
//! Open MPI's `mpirun` (the job's world is the degree), checked against the
//! unsharded block, rank 0 recording the row and the MPI library's version.
//! Prints a SKIP line (and passes) when mpirun is missing.

#[cfg(feature = "mpi")]
use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_bench-layers");

/// Small enough for a debug build on two cores.
const TINY: [&str; 12] = [
    "--hidden", "32", "--heads", "4", "--ffn", "64", "--seq", "8", "--iters", "2", "--warmup", "1",
];

#[cfg(feature = "mpi")]
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bench-layers-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Two ranks of this binary under mpirun with `args` after the tiny
/// sizes, writing to a fresh `--out`: its output and that folder, or
/// `None` (after a SKIP line naming `test`) when mpirun is missing.
#[cfg(feature = "mpi")]
fn two_mpi_ranks(test: &str, args: &[&str]) -> Option<(std::process::Output, PathBuf)> {
    let found = Command::new("mpirun").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP {test}: mpirun not found (apt-get install openmpi-bin)");
        return None;
    }
    let dir = scratch(test);
    let out = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
        ])
        .args(["-np", "2", BIN, "--backend", "mpi", "--timeout", "60"])
        .args(TINY)
        .args(args)
        .arg("--out")
        .arg(&dir)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("PARBENCH_WIRE")
        .output()
        .unwrap();
    Some((out, dir))
}

#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_feature_mpi_is_one_line_naming_it() {
    let out = Command::new(BIN)
        .args(["--backend", "mpi"])
        .args(TINY)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--features mpi"), "{err}");
}

#[cfg(feature = "mpi")]
#[test]
fn two_mpi_ranks_run_tp_2_exactly_and_record_the_library() {
    let Some((out, dir)) = two_mpi_ranks("mpi-tp", &[]) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = std::fs::read_to_string(dir.join("layers.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 1, "only rank 0 records: {csv}");
    let col = |name: &str| {
        let i = header.iter().position(|h| *h == name);
        i.and_then(|i| rows[0].get(i)).copied().unwrap_or_default()
    };
    assert_eq!(
        (col("backend"), col("wire"), col("tp")),
        ("mpi", "mpi", "2"),
        "{csv}"
    );
    let err: f64 = col("check_max_err").parse().unwrap();
    assert!(
        err < 1e-4,
        "the sharded block differs from the unsharded one by {err}"
    );
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let library = runs[0]["versions"]["mpi"].as_str().unwrap_or_default();
    assert!(
        library.starts_with("Open MPI"),
        "versions.mpi = {library:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--cp` under mpirun: the ring without a second communicator (its
/// transfers in line) forward, each method's backward in train, and
/// tp 2 x cp 1 on a group split from MPI's world, checked against the
/// unsharded attention.
#[cfg(feature = "mpi")]
#[test]
fn two_mpi_ranks_run_the_cp_methods_checked() {
    for (args, row) in [
        (
            &["--cp", "2", "--cp-comm-type", "p2p"][..],
            ",mpi,mpi,p2p,false,",
        ),
        (
            &["--cp", "2", "--cp-comm-type", "p2p", "--mode", "train"][..],
            ",train,1,true",
        ),
        (
            &["--cp", "2", "--cp-comm-type", "a2a", "--mode", "train"][..],
            ",train,1,true",
        ),
        (
            &[
                "--cp",
                "2",
                "--cp-comm-type",
                "all_gather",
                "--mode",
                "train",
            ][..],
            ",train,1,true",
        ),
        (
            &["--cp", "1", "--tp", "2", "--mode", "train"][..],
            ",train,2,true",
        ),
    ] {
        let Some((out, dir)) = two_mpi_ranks("mpi-cp", args) else {
            return;
        };
        assert!(
            out.status.success(),
            "{args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let csv = std::fs::read_to_string(dir.join("layers_cp.csv")).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2, "only rank 0 records: {csv}");
        assert!(lines[1].contains(row), "{args:?}: {csv}");
        let runs = std::fs::read_to_string(dir.join("run.json")).unwrap();
        assert!(runs.contains("Open MPI"), "{runs}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
