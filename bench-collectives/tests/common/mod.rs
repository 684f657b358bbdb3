//! Running the built binary and reading what it wrote (with the helpers
//! every binary's tests share).

#![allow(dead_code)]

#[path = "../../../test-support/binary.rs"]
mod binary;
pub use binary::*;

use std::path::PathBuf;
use std::process::{Command, Output};

/// A fresh folder under the system's temporary directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "bench-collectives-test-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The binary, without the self-test's fault injection a caller's
/// environment might carry.
pub fn binary() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench-collectives"));
    cmd.env_remove("PARBENCH_SELFTEST_CORRUPT_RANK");
    cmd
}

/// Runs the binary with `args` (and `env`) to its end.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = binary();
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the binary starts")
}

/// Flags that keep a run small on `backend`: 2 ranks, 8 B to 4 KiB by
/// factors of 8, 5 iterations after 1 warm-up.
pub fn small_on(backend: &str) -> Vec<&str> {
    let mut v = vec!["--backend", backend];
    v.extend(flags("-np 2 -b 8 -e 4K -f 8 -n 5 -w 1"));
    v
}

/// A command line's words: `flags("-np 2 -b 8")` is `["-np", "2", "-b", "8"]`.
pub fn flags(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs the binary with arguments that need not be UTF-8.
pub fn run_os(args: &[std::ffi::OsString]) -> Output {
    binary().args(args).output().expect("the binary starts")
}

/// Starts the binary with `args`, its output captured, without waiting.
pub fn start(args: &[&str]) -> std::process::Child {
    binary()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

/// Data rows in `dir/collectives.csv` so far (0 when there is no file).
pub fn rows_in(dir: &std::path::Path) -> usize {
    data_rows(&dir.join("collectives.csv"))
}

/// `base` with the flags of `extra` set: a flag `base` has already takes
/// `extra`'s value in its place (a flag may be given once), the rest of
/// `extra` (collectives, new flags) is appended.
pub fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = base.to_vec();
    let mut i = 0;
    while i < extra.len() {
        let flag = extra[i];
        let value = extra.get(i + 1).filter(|x| !x.starts_with('-'));
        match (v.iter().position(|a| *a == flag), value) {
            (Some(at), Some(val)) if flag.starts_with('-') => {
                v[at + 1] = val;
                i += 2;
            }
            (_, Some(val)) if flag.starts_with('-') => {
                v.extend_from_slice(&[flag, val]);
                i += 2;
            }
            _ => {
                v.push(flag);
                i += 1;
            }
        }
    }
    v
}

/// A row's label in run.json (`all_reduce 8388608 B out`).
pub fn row_label(r: &std::collections::HashMap<String, String>) -> String {
    format!(
        "{} {} B {}",
        r["collective"],
        r["bytes"],
        if r["in_place"] == "true" { "in" } else { "out" }
    )
}

/// Checks a row's model column against what the run recorded: the
/// alpha-beta-gamma form of its algorithm with alpha
/// (`extra.model_link.alpha_us`), beta from the ceiling ladder
/// (`extra.ceiling.ladder`) and gamma from the reduction ladder
/// (`extra.model_link.reduce`), both at the row's working set.
pub fn assert_model_priced(
    extra: &serde_json::Value,
    r: &std::collections::HashMap<String, String>,
) {
    use parbench::model::ladder::{working_set_bytes, Ladder};
    let ladder = |v: &serde_json::Value| -> Ladder { serde_json::from_value(v.clone()).unwrap() };
    let (ceiling, reduce) = (
        ladder(&extra["ceiling"]["ladder"]),
        ladder(&extra["model_link"]["reduce"]),
    );
    let alpha = extra["model_link"]["alpha_us"].as_f64().unwrap();
    let coll = r["collective"].parse().unwrap();
    let algo = parbench::model::ModelAlgo::of(&r["algo"]);
    let world: usize = r["world"].parse().unwrap();
    let bytes: u64 = r["bytes"].parse().unwrap();
    let ws = working_set_bytes(coll, world, bytes, r["in_place"] == "true");
    let mut link = parbench::model::LinkParams::from_gbps_us(ceiling.at(ws).unwrap(), alpha);
    if let Some(g) = reduce.at(ws) {
        link = link.with_reduce_gbps(g);
    }
    let own = extra["model_link"]["own_transport_model"] == true;
    let priced = if own {
        parbench::model::predict(coll, &algo, world, bytes, &link)
    } else {
        parbench::model::predict_textbook(coll, &algo, world, bytes, &link)
    }
    .unwrap()
        * 1e6;
    let model: f64 = r["model_us"].parse().unwrap();
    assert!(
        (model - priced).abs() <= 1e-9 * priced.max(1e-9),
        "{}: model {model} us, priced from the recorded figures {priced} us",
        row_label(r)
    );
}
