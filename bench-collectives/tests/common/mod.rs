//! Running the built binary and reading what it wrote.

#![allow(dead_code)]

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

/// Runs the binary with `args` (and `env`), with a deadline on every wait.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench-collectives"));
    cmd.args(args).env_remove("PARBENCH_SELFTEST_CORRUPT_RANK");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the binary starts")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The CSV's header and rows as maps from column to value.
pub fn read_csv(
    path: &std::path::Path,
) -> (Vec<String>, Vec<std::collections::HashMap<String, String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let rows = lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(str::to_string))
                .collect()
        })
        .collect();
    (header, rows)
}
