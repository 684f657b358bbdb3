//! `--backend mpi`: without the `mpi` feature, one line naming the feature
//! and exit code 2; with it, the composed dp 2 x tp 2 x pp 2 step on eight
//! ranks under Open MPI's `mpirun` (the job's world is the mesh's), its
//! gradient check passing, rank 0 recording the rows, the composed section
//! with every world rank's clock, and the MPI library's version; and a job
//! of another size refused (exit code 2) before anything is measured.
//! Prints a SKIP line (and passes) when mpirun is missing. Timings are
//! never asserted.

#[path = "../../test-support/binary.rs"]
mod binary;
#[cfg(feature = "mpi")]
#[path = "../../test-support/run_json.rs"]
mod run_json;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_bench-pipeline");

/// A small block, two microbatches, one step: 8 ranks in a few seconds.
#[cfg(feature = "mpi")]
const SMALL: &str = "--dp 2 --tp 2 --stages 2 --schedule 1f1b --hidden 16 --heads 2 --seq 8 --layers-per-stage 1 --microbatches 2 --iters 1 --warmup 0 --timeout 60";

#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_feature_mpi_is_one_line_naming_it() {
    binary::refused_in_one_line(
        Command::new(BIN),
        &["--backend", "mpi", "--dp", "2"],
        &["--features mpi"],
        "pipeline.csv",
    );
}

#[cfg(feature = "mpi")]
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("bench-pipeline-mpi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `mpirun -np N` of the binary with `line`, on loopback, into a fresh
/// scratch folder named `name`: the folder and the run's output; `None`
/// (after saying so) when mpirun is missing.
#[cfg(feature = "mpi")]
fn mpirun(
    test: &str,
    np: usize,
    line: &str,
    name: &str,
) -> Option<(std::path::PathBuf, std::process::Output)> {
    use std::process::Stdio;
    let dir = scratch(name);
    let found = Command::new("mpirun").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP {test}: mpirun not found (apt-get install openmpi-bin)");
        return None;
    }
    let child = Command::new("mpirun")
        // Tests may run as root (CI's containers); ranks share the cores.
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
        ])
        .args(["-np", &np.to_string(), BIN, "--backend", "mpi"])
        .args(line.split_whitespace())
        .arg("--out")
        .arg(&dir)
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    Some((dir, binary::finish_within(child, 180)))
}

/// The standard output of a run that must have succeeded (both outputs in
/// the message when it did not).
#[cfg(feature = "mpi")]
fn succeeded(o: &std::process::Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

#[cfg(feature = "mpi")]
#[test]
fn dp2_tp2_pp2_on_eight_mpi_ranks_matches_one_rank() {
    let Some((dir, o)) = mpirun("dp2_tp2_pp2_on_eight_mpi_ranks", 8, SMALL, "composed") else {
        return;
    };
    let out = succeeded(&o);
    assert!(
        out.contains("backend mpi, 8 ranks = dp 2 x tp 2 x pp 2"),
        "{out}"
    );
    assert!(out.contains("check: passed"), "{out}");
    let rows =
        parbench::results::read_rows::<parbench::results::PipelineRow>(&dir.join("pipeline.csv"))
            .unwrap();
    assert_eq!(rows.len(), 1, "only world rank 0 records: {rows:?}");
    let r = &rows[0];
    assert_eq!((r.backend.as_str(), r.dp, r.tp, r.stages), ("mpi", 2, 2, 2));
    assert!(r.grad_max_err <= 1e-5, "{r:?}");
    let composed = run_json::composed_sections(&dir);
    let c = &composed[0];
    let replicas = c["check"]["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2, "{c}");
    for rep in replicas {
        assert!(rep["max_rel_err"].as_f64().unwrap() <= 1e-5, "{rep}");
    }
    assert_eq!(c["measured"]["ranks"].as_array().unwrap().len(), 8);
    // Processes: every world rank's offset estimated, on the trace.
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(c["timeline"].as_str().unwrap())).unwrap())
            .unwrap();
    assert_eq!(
        trace["otherData"]["time_base"],
        "offsets to rank 0 by ping-pong"
    );
    assert_eq!(
        trace["otherData"]["world_clock"].as_array().unwrap().len(),
        8
    );
    let runs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    let library = runs[0]["versions"]["mpi"].as_str().unwrap_or_default();
    assert!(
        library.starts_with("Open MPI"),
        "versions.mpi = {library:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "mpi")]
#[test]
fn a_job_of_another_size_is_refused_before_measuring() {
    let Some((dir, o)) = mpirun("a_job_of_another_size", 4, SMALL, "size") else {
        return;
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    // Named once (mpirun adds its own report of the exit codes).
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("bench-pipeline:"))
        .collect();
    assert_eq!(ours.len(), 1, "{err}");
    assert!(
        ours[0].contains("4 ranks") && ours[0].contains("mpirun -np 8"),
        "{err}"
    );
    assert!(!dir.join("pipeline.csv").exists(), "measured: {err}");
}

/// The plain pipeline on two MPI ranks: one row from rank 0, the
/// gradient check against one rank running the whole model, and the
/// offsets estimated as for processes.
#[cfg(feature = "mpi")]
#[test]
fn the_plain_pipeline_runs_on_two_mpi_ranks() {
    // Every schedule of the registry (M = 4: DualPipeV needs 2R).
    let line = "-v --stages 2 --schedule all --microbatches 4 --hidden 32 --microbatch-size 4 --iters 1 --warmup 0 --timeout 60";
    let test = "the_plain_pipeline_runs_on_two_mpi_ranks";
    let Some((dir, o)) = mpirun(test, 2, line, "plain") else {
        return;
    };
    let out = succeeded(&o);
    assert!(
        out.contains("offsets to rank 0 estimated and applied"),
        "{out}"
    );
    let rows =
        parbench::results::read_rows::<parbench::results::PipelineRow>(&dir.join("pipeline.csv"))
            .unwrap();
    assert_eq!(
        rows.len(),
        parbench::schedule::ScheduleKind::ALL.len(),
        "{rows:?}"
    );
    for row in &rows {
        assert_eq!((row.backend.as_str(), row.stages), ("mpi", 2));
        assert!(row.grad_max_err <= 1e-5, "{row:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
