//! `--backend mpi` end to end: two ranks under Open MPI's `mpirun`, the rank
//! and world taken from MPI itself, rank 0 recording the rows and the MPI
//! library's version. Needs the `mpi` feature and `mpirun`; prints a SKIP line
//! (and passes) when mpirun is missing, so a build without MPI says why.
#![cfg(feature = "mpi")]

mod common;
use common::*;
use std::process::Command;

/// `mpirun` with the flags a root CI container and a 2-core machine need.
fn mpirun() -> Option<Command> {
    let ok = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        return None;
    }
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    // A launcher variable of the test's own environment must not make the
    // ranks think they are a tcp job.
    .env_remove("RANK")
    .env_remove("WORLD_SIZE")
    .env_remove("PARBENCH_WIRE");
    Some(cmd)
}

#[test]
fn two_mpi_ranks_sweep_all_reduce_exactly_and_record_the_library() {
    let Some(mut cmd) = mpirun() else {
        eprintln!(
            "SKIP two_mpi_ranks_sweep_all_reduce: mpirun not found (apt-get install openmpi-bin)"
        );
        return;
    };
    let dir = scratch("mpi");
    let o = cmd
        .args(["-np", "2", env!("CARGO_BIN_EXE_bench-collectives")])
        .args(["--backend", "mpi", "all_reduce", "-b", "8", "-e", "1M"])
        .args(["-n", "3", "-w", "1", "--timeout", "60", "--out"])
        .arg(&dir)
        .output()
        .expect("mpirun starts");
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    // Only rank 0 prints the table, and it knows the world from MPI.
    assert_eq!(text.matches("# all_reduce, busbw").count(), 1, "{text}");
    assert!(text.contains("mpi over mpi, 2 ranks"), "{text}");
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");

    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    // 8 B .. 1 MiB doubling: 18 sizes, out of place and in place.
    assert_eq!(rows.len(), 18 * 2, "{rows:?}");
    for r in &rows {
        assert_eq!(
            (
                r["collective"].as_str(),
                r["backend"].as_str(),
                r["wire"].as_str(),
                r["world"].as_str(),
                r["wrong"].as_str(),
            ),
            ("all_reduce", "mpi", "mpi", "2", "0"),
            "{r:?}"
        );
    }
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let library = runs[0]["versions"]["mpi"].as_str().unwrap_or_default();
    assert!(
        library.starts_with("Open MPI") && !library.contains('\0'),
        "run.json versions.mpi = {library:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// bench-collectives on two MPI ranks with `args`, recording into `dir`;
/// `None` when mpirun is missing.
fn two_ranks(args: &[&str], dir: &std::path::Path) -> Option<std::process::Output> {
    let mut cmd = mpirun()?;
    let o = cmd
        .args(["-np", "2", env!("CARGO_BIN_EXE_bench-collectives")])
        .args(["--backend", "mpi", "-n", "1", "-w", "0", "--timeout", "60"])
        .args(args)
        .arg("--out")
        .arg(dir)
        .output()
        .expect("mpirun starts");
    Some(o)
}

#[test]
fn mpi_runs_nccl_tests_newer_integer_types_and_mulsum_and_refuses_fp8_reductions() {
    let dir = scratch("mpi-types");
    let newer = "all_reduce reduce_scatter -b 8 -e 4K -f 8 -d int8,uint32,uint64 -o all";
    let Some(o) = two_ranks(&newer.split(' ').collect::<Vec<_>>(), &dir) else {
        eprintln!("SKIP mpi newer types: mpirun not found (apt-get install openmpi-bin)");
        return;
    };
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    assert!(rows
        .iter()
        .any(|r| r["op"] == "mulsum" && r["dtype"] == "int8"));
    assert!(rows.iter().all(|r| r["wrong"] == "0"), "{rows:?}");

    // MPI has no 8-bit float type: its reductions are refused by name
    // before anything is measured; moving the bytes still runs.
    let o = two_ranks(&["all_reduce", "-e", "64", "-d", "f8e4m3"], &dir).unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("MPI has no f8e4m3 type"), "{err}");
    assert!(
        !stdout(&o).contains("# ceiling"),
        "measured: {}",
        stdout(&o)
    );
    let o = two_ranks(&["all_gather", "-e", "64", "-d", "f8e5m2"], &dir).unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mpi_runs_all_to_all_v_and_moe_exactly() {
    let dir = scratch("mpi-moe");
    let Some(o) = two_ranks(&flags("alltoallv -b 8 -e 64K -f 8"), &dir) else {
        eprintln!("SKIP mpi all_to_all_v and moe: mpirun not found (apt-get install openmpi-bin)");
        return;
    };
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    assert!(
        rows.iter()
            .all(|r| r["collective"] == "all_to_all_v" && r["wrong"] == "0"),
        "{rows:?}"
    );
    let moe = "moe --tokens 64 --hidden 256 --experts 8 --topk 4 --routing zipf:1 --payload fp8";
    let o = two_ranks(&flags(moe), &dir).unwrap();
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let (_, rows) = read_csv(&dir.join("moe.csv"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r["wrong"] == "0" && r["backend"] == "mpi"),
        "{rows:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mpi_runs_the_cp_ring_exactly() {
    let dir = scratch("mpi-cp-ring");
    let Some(o) = two_ranks(&flags("cp-ring -b 1K -e 64K -f 8 --compute-us 20"), &dir) else {
        eprintln!("SKIP mpi cp-ring: mpirun not found (apt-get install openmpi-bin)");
        return;
    };
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let (_, rows) = read_csv(&dir.join("cp-ring.csv"));
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r["wrong"] == "0" && r["backend"] == "mpi" && r["steps"] == "1"),
        "{rows:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
