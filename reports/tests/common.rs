//! Shared by the integration tests: the binary, the fixtures, scratch folders.
#![allow(dead_code)]

use parbench::results::{append_rows, read_rows, CollectiveRow};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The synthetic fixtures (see fixtures/make_synthetic.py).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fresh scratch folder under cargo's target tmp dir, emptied on each run
/// (one name per test, so runs do not pile up folders).
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("report-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Copies a fixture folder's files into a new scratch folder.
pub fn copy_fixture(name: &str, to: &str) -> PathBuf {
    let dst = scratch(to);
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

/// A command line written as one string: its words (split at white space),
/// then `more` as they are (paths, which may hold spaces).
pub fn words<'a>(line: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    line.split_whitespace()
        .chain(more.iter().copied())
        .collect()
}

/// Runs `report ARGS`.
pub fn report(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_report"))
        .args(args)
        .output()
        .unwrap()
}

/// The bands `report plan --validation --output-file` writes (in a
/// scratch folder `name`).
pub fn validation_bands(name: &str) -> Vec<serde_json::Value> {
    let json = scratch(name).join("validation.json");
    let o = report(&[
        "plan",
        "--validation",
        "--output-file",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Scales every time figure of the row and its bandwidths inversely.
pub fn slow_down(r: &mut CollectiveRow, factor: f64) {
    r.time_us *= factor;
    r.time_min_us *= factor;
    r.time_max_us *= factor;
    r.p50_us *= factor;
    r.p99_us *= factor;
    r.algbw_gbps /= factor;
    r.busbw_gbps /= factor;
}

/// A folder of `rounds` runs of the shm fixture's collectives: run i's
/// rows are the fixture's times times `factor(i, row)`, each run with its
/// own run.json entry (`foreign`: the share of the machine others took).
pub fn rounds_folder(
    name: &str,
    rounds: usize,
    factor: impl Fn(usize, usize) -> f64,
    foreign: impl Fn(usize) -> f64,
) -> PathBuf {
    let dir = scratch(name);
    let src: Vec<CollectiveRow> = read_rows(&fixture("shm").join("collectives.csv")).unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("shm").join("run.json")).unwrap())
            .unwrap();
    let mut runs = Vec::new();
    let mut rows = Vec::new();
    for i in 0..rounds {
        let id = format!("collectives-20261129T0{i}0000Z-{i}");
        for (j, r) in src.iter().enumerate() {
            let mut r = r.clone();
            r.run_id = id.clone();
            slow_down(&mut r, factor(i, j));
            rows.push(r);
        }
        let mut m = meta[0].clone();
        m["run_id"] = id.into();
        m["extra"]["noise"] = serde_json::json!({
            "wall_s": 10.0, "cpus": 2, "host_s": 0.0, "own_s": 0.0, "steal_s": 0.0,
            "foreign_s": 20.0 * foreign(i), "fraction": foreign(i), "resolution": 0.01,
            "method": "test"
        });
        m["extra"]["floor"] = serde_json::json!({"floor_us": 0.05});
        runs.push(m);
    }
    write_folder(&dir, &rows, &runs);
    dir
}

/// Writes `rows` and the run.json entries `runs` into `dir`.
pub fn write_folder<R: parbench::results::Record>(
    dir: &Path,
    rows: &[R],
    runs: &[serde_json::Value],
) {
    append_rows(dir, rows).unwrap();
    std::fs::write(
        dir.join("run.json"),
        serde_json::to_string_pretty(runs).unwrap(),
    )
    .unwrap();
}
