//! scripts/nightly.sh with stand-in bench binaries that copy fixture
//! records: the first nights make the baseline, a later night is compared
//! with them, a slowdown fails the night, a failing bench fails it too.

mod common;
use common::*;
use parbench::results::{append_rows, read_rows, CollectiveRow};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A folder of stand-ins for the three benches (each copies its suite's
/// records from $STUB_SRC into --out and logs its arguments) and the real
/// report binary.
fn stub_bin(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, files) in [
        ("bench-collectives", "collectives.csv run.json"),
        ("bench-layers", "layers.csv"),
        ("bench-pipeline", "pipeline.csv timeline-*.json"),
    ] {
        let script = format!(
            "#!/bin/sh\necho \"$0 $*\" >> \"$STUB_LOG\"\n[ -n \"$STUB_FAIL\" ] && [ \"$STUB_FAIL\" = {name} ] && exit 2\nout=results\nwhile [ $# -gt 0 ]; do [ \"$1\" = --out ] && out=$2; shift; done\nmkdir -p \"$out\"\nfor f in {files}; do cp \"$STUB_SRC\"/$f \"$out\"/; done\n"
        );
        let path = bin.join(name);
        std::fs::write(&path, script).unwrap();
        Command::new("chmod")
            .arg("755")
            .arg(&path)
            .status()
            .unwrap();
    }
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_report"), bin.join("report")).unwrap();
    bin
}

fn nightly(dir: &Path, src: &Path, date: &str, fail: &str) -> (i32, String) {
    nightly_with(dir, src, date, fail, &[])
}

fn nightly_with(dir: &Path, src: &Path, date: &str, fail: &str, flags: &[&str]) -> (i32, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nightly.sh");
    let o = Command::new("bash")
        .arg(&script)
        .args(["--results", dir.join("results").to_str().unwrap()])
        .args(flags)
        .env("PARBENCH_BIN", dir.join("bin"))
        .env("PARBENCH_DATE", date)
        .env("STUB_SRC", src)
        .env("STUB_LOG", dir.join("log"))
        .env("STUB_FAIL", fail)
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", stdout(&o), stderr(&o)),
    )
}

#[test]
fn baseline_then_compare_then_regression() {
    let dir = scratch("nightly");
    stub_bin(&dir);
    let good = fixture("shm");

    // The first three nights make the baseline, unjudged.
    for (k, date) in ["2026-11-26", "2026-11-27", "2026-11-28"]
        .iter()
        .enumerate()
    {
        let (code, out) = nightly(&dir, &good, date, "");
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(&format!("baseline night {} of 3", k + 1))
                && !out.contains("figures compared"),
            "night {k} is kept in the baseline, not judged: {out}"
        );
    }
    let results = dir.join("results");
    assert!(results.join("baseline/2026-11-28/collectives.csv").exists());
    // A line a round on the terminal; the benches' output in the night's log.
    let (_, out) = nightly(&dir, &good, "2026-11-28", "");
    assert!(
        out.contains("nightly: round 1 of 7: collectives layers pipeline"),
        "{out}"
    );
    assert!(!out.contains("nightly: /"), "no bench command lines: {out}");
    assert!(std::fs::read_dir(&results).unwrap().any(|e| e
        .unwrap()
        .path()
        .join("nightly.log")
        .is_file()));
    assert!(results.join("2026-11-28/report.html").exists());
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert!(
        log.contains("bench-collectives all_reduce all_gather -b 8 -e 16M -f 4"),
        "{log}"
    );
    assert!(
        log.contains("--schedule gpipe,1f1b,interleaved,zb-h1"),
        "{log}"
    );

    let (code, out) = nightly(&dir, &good, "2026-11-29", "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": 0 regressions"), "{out}");
    assert!(out.contains("3 baseline folders pooled"), "{out}");
    assert!(!results.join("baseline/2026-11-29").exists(), "{out}");
    assert!(results.join("2026-11-29/compare.md").exists());
    let html = std::fs::read_to_string(results.join("2026-11-29/report.html")).unwrap();
    assert!(
        html.contains("2026-11-26") && html.contains("2026-11-29"),
        "the baseline's nights and tonight in the report"
    );

    // Tonight all_reduce is 20% slower.
    let slow = copy_fixture("shm", "nightly-slow");
    let path = slow.join("collectives.csv");
    let mut rows: Vec<CollectiveRow> = read_rows(&path).unwrap();
    for r in rows.iter_mut().filter(|r| r.collective == "all_reduce") {
        for t in [
            &mut r.time_us,
            &mut r.time_min_us,
            &mut r.time_max_us,
            &mut r.p50_us,
            &mut r.p99_us,
        ] {
            *t *= 1.2;
        }
        r.algbw_gbps /= 1.2;
        r.busbw_gbps /= 1.2;
    }
    std::fs::remove_file(&path).unwrap();
    append_rows(&slow, &rows).unwrap();
    let (code, out) = nightly(&dir, &slow, "2026-11-30", "");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("regression against"), "{out}");
    assert!(
        results.join("2026-11-30/report.html").exists(),
        "report written even on a regression"
    );
    // The trend: every night so far, the regression night marked.
    let trend = std::fs::read_to_string(results.join("trend.html")).unwrap();
    assert!(
        trend.contains("the gate called a regression on 2026-11-30")
            && trend.contains("2026-11-26")
            && trend.contains("all_reduce busbw at")
            && trend.contains("baseline: 3 nights"),
        "{trend}"
    );
    assert!(trend.matches("<svg").count() >= 2, "a chart per figure");

    // The same date again gets its own folder, never the old one.
    let (code, out) = nightly(&dir, &good, "2026-11-30", "bench-layers");
    assert_eq!(code, 2, "a failing bench fails the night: {out}");
    let runs = std::fs::read_dir(&results)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(
        runs, 8,
        "baseline + 7 nights (two of them second runs of a date)"
    );
}

/// A baseline folder holding records itself (made before the baseline had
/// nights) is the baseline as it is; `--baseline-nights 1` judges the
/// second night.
#[test]
fn a_baseline_of_one_night_old_or_asked_for() {
    let dir = scratch("nightly-one");
    stub_bin(&dir);
    let good = fixture("shm");
    let one = ["--baseline-nights", "1"];
    let (code, out) = nightly_with(&dir, &good, "2026-12-01", "", &one);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("baseline night 1 of 1"), "{out}");
    let (code, out) = nightly_with(&dir, &good, "2026-12-02", "", &one);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": 0 regressions"), "{out}");

    let results = dir.join("results");
    std::fs::remove_dir_all(results.join("baseline")).unwrap();
    copy_dir(&results.join("2026-12-01"), &results.join("baseline"));
    let (code, out) = nightly(&dir, &good, "2026-12-03", "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("it is the baseline, as one night"), "{out}");
    assert!(out.contains(": 0 regressions"), "{out}");

    let (code, out) = nightly_with(&dir, &good, "2026-12-04", "", &["--baseline-nights", "0"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--baseline-nights must be 1..99"), "{out}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Relative paths are the caller's: `--results res` and
/// `CARGO_TARGET_DIR=tgt` from the caller's directory (the script itself
/// works in the repository); the suites run in interleaved rounds.
#[test]
fn paths_are_the_callers_and_rounds_interleave() {
    let dir = scratch("nightly-paths");
    let bin = stub_bin(&dir);
    let release = dir.join("tgt/release");
    std::fs::create_dir_all(release.parent().unwrap()).unwrap();
    std::fs::rename(&bin, &release).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nightly.sh");
    let o = Command::new("bash")
        .arg(&script)
        .args(["--results", "res", "--no-build", "--rounds", "2"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", "tgt")
        .env_remove("PARBENCH_BIN")
        .env("PARBENCH_DATE", "2026-12-01")
        .env("STUB_SRC", fixture("shm"))
        .env("STUB_LOG", dir.join("log"))
        .env("STUB_FAIL", "")
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap();
    let out = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(dir.join("res/2026-12-01/collectives.csv").exists(), "{out}");
    assert!(dir.join("res/baseline").is_dir(), "{out}");
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    let order: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|p| p.rsplit('/').next().unwrap_or(p))
        .collect();
    assert_eq!(
        order,
        [
            "bench-collectives",
            "bench-layers",
            "bench-pipeline",
            "bench-collectives",
            "bench-layers",
            "bench-pipeline"
        ],
        "two rounds, interleaved: {log}"
    );
    assert!(log.contains("tgt/release/bench-collectives"), "{log}");
}

/// A night whose rows match no row of the baseline (the wire was renamed)
/// compares nothing: it fails (2) instead of passing.
#[test]
fn a_night_that_compares_nothing_fails() {
    let dir = scratch("nightly-nothing");
    stub_bin(&dir);
    let one = ["--baseline-nights", "1"];
    let (code, out) = nightly_with(&dir, &fixture("shm"), "2026-12-01", "", &one);
    assert_eq!(code, 0, "{out}");
    let renamed = copy_fixture("shm", "nightly-renamed");
    let path = renamed.join("collectives.csv");
    let mut rows: Vec<CollectiveRow> = read_rows(&path).unwrap();
    rows.iter_mut().for_each(|r| r.wire = "tcp-1gbit".into());
    std::fs::remove_file(&path).unwrap();
    append_rows(&renamed, &rows).unwrap();
    let (code, out) = nightly_with(&dir, &renamed, "2026-12-02", "", &one);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("nothing compared"), "{out}");
}

/// Only clean nights make the baseline: a night whose noise guard said
/// noisy is not kept (exit 3), and a second run on a date the baseline
/// already has does not count as another night.
#[test]
fn only_clean_nights_of_distinct_dates_make_the_baseline() {
    let dir = scratch("nightly-clean");
    stub_bin(&dir);
    let good = fixture("shm");
    let noisy = copy_fixture("shm", "nightly-noisy-src");
    let path = noisy.join("run.json");
    let mut runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for r in runs.as_array_mut().unwrap() {
        r["extra"]["noise"] = serde_json::json!({
            "cpus": 2, "foreign_s": 6.0, "fraction": 0.3, "host_s": 20.0,
            "method": "test", "own_s": 14.0, "resolution": 0.001,
            "steal_s": 0.0, "wall_s": 10.0
        });
    }
    std::fs::write(&path, serde_json::to_string(&runs).unwrap()).unwrap();

    let (code, out) = nightly(&dir, &noisy, "2026-12-01", "");
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("noisy: not kept in the baseline"), "{out}");
    let baseline = dir.join("results/baseline");
    assert!(!baseline.join("2026-12-01").exists(), "{out}");

    let (code, out) = nightly(&dir, &good, "2026-12-02", "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("baseline night 1 of 3"), "{out}");
    // The same date again: told apart, not a second baseline night.
    let (code, out) = nightly(&dir, &good, "2026-12-02", "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already has a night of 2026-12-02"), "{out}");
    let kept = std::fs::read_dir(&baseline).unwrap().count();
    assert_eq!(kept, 1, "{out}");
    let (_, out) = nightly(&dir, &good, "2026-12-03", "");
    assert!(out.contains("baseline night 2 of 3"), "{out}");
}
