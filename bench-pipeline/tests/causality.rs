//! Every timeline bench-pipeline writes is causal: no action's work starts
//! before the work that produced its input ended, beyond the clock
//! uncertainty the trace records for the two ranks. On local threads and on
//! tcp processes, for every generated schedule and a CSV schedule, with
//! real compute and with sleeping actions. Sizes are tiny: the runs take a
//! few seconds together.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "bench-pipeline-causal-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A 3-rank schedule in PyTorch's compute-only CSV: idle cells, whole
/// backwards on stages 0 and 1, stage 2's backward split into I and W.
const CSV: &str = "0F0,0F1,0F2,,0B0,,0B1,0B2\n\
1F0,1F1,1B0,1F2,1B1,1B2\n\
2F0,2I0,2F1,2I1,2W0,2F2,2I2,2W1,2W2\n";

/// Runs bench-pipeline with `extra` on `backend` and `work` into a fresh folder.
fn run(name: &str, backend: &str, work: &str, extra: &[&str]) -> PathBuf {
    let d = tmp(name);
    let out = Command::new(env!("CARGO_BIN_EXE_bench-pipeline"))
        .args([
            "--backend",
            backend,
            "--work",
            work,
            "--hidden",
            "16",
            "--microbatch-size",
            "4",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--timeout",
            "30",
            "--out",
        ])
        .arg(&d)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

/// An action named `2F0`: (stage, kind letter, microbatch).
fn parse_action(name: &str) -> Option<(usize, char, usize)> {
    let k = name.find(|c: char| !c.is_ascii_digit())?;
    let kind = name[k..].chars().next()?;
    if !"FBIW".contains(kind) || k == 0 {
        return None;
    }
    Some((name[..k].parse().ok()?, kind, name[k + 1..].parse().ok()?))
}

/// What a trace says each action did: its rank, work start and work end.
struct Work {
    rank: usize,
    start: f64,
    end: f64,
}

/// The acausal dependent actions of one trace (descriptions), and how many
/// dependent actions it holds (inputs from another rank).
fn check_trace(path: &Path) -> (Vec<String>, usize) {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut work: HashMap<(usize, char, usize), Work> = HashMap::new();
    for e in v["traceEvents"].as_array().unwrap() {
        if e["ph"] != "X" {
            continue;
        }
        let Some(a) = e["name"].as_str().and_then(parse_action) else {
            continue;
        };
        let start = e["ts"].as_f64().unwrap();
        let w = e["args"]["work_us"].as_f64().unwrap();
        work.insert(
            a,
            Work {
                rank: e["tid"].as_u64().unwrap() as usize,
                start,
                end: start + w,
            },
        );
    }
    // The clock uncertainty of each rank, as the trace records it (none: exact).
    let unc = |rank: usize| -> f64 {
        v["otherData"]["clock"]
            .as_array()
            .and_then(|c| c.get(rank))
            .and_then(|c| c["applied_uncertainty_us"].as_f64())
            .unwrap_or(0.0)
    };
    let last_stage = work.keys().map(|a| a.0).max().unwrap();
    let mut bad = Vec::new();
    let mut dependent = 0;
    for (&(stage, kind, mb), w) in &work {
        let producers: Vec<(usize, char, usize)> = match kind {
            'F' if stage > 0 => vec![(stage - 1, 'F', mb)],
            'B' | 'I' if stage < last_stage => vec![(stage + 1, 'B', mb), (stage + 1, 'I', mb)],
            _ => continue,
        };
        let p = producers
            .iter()
            .find_map(|p| work.get(p))
            .unwrap_or_else(|| panic!("{}: no producer of {stage}{kind}{mb}", path.display()));
        if p.rank == w.rank {
            continue;
        }
        dependent += 1;
        let slack = unc(w.rank) + unc(p.rank);
        if w.start < p.end - slack {
            bad.push(format!(
                "{stage}{kind}{mb} (rank {}) starts at {:.1} us, {:.1} us before its producer on rank {} ends (uncertainty {slack:.1} us)",
                w.rank,
                w.start,
                p.end - w.start,
                p.rank
            ));
        }
    }
    (bad, dependent)
}

/// Checks every timeline in `dir`; returns how many traces it read.
fn check_dir(dir: &Path, what: &str) -> usize {
    let mut traces = 0;
    let mut failures = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("timeline-") && name.ends_with(".json")) {
            continue;
        }
        traces += 1;
        let (bad, dependent) = check_trace(&path);
        assert!(dependent > 0, "{name}: no dependent actions");
        if !bad.is_empty() {
            failures.push(format!(
                "{name}: {} of {dependent} dependent actions acausal:\n  {}",
                bad.len(),
                bad.join("\n  ")
            ));
        }
    }
    assert!(failures.is_empty(), "{what}:\n{}", failures.join("\n"));
    traces
}

/// Every row of `dir`'s pipeline.csv has its gradients within 1e-5 of one
/// rank running the whole model; there are `rows` of them.
fn assert_gradients_match(dir: &Path, rows: usize) {
    let text = std::fs::read_to_string(dir.join("pipeline.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (schedule, err) = (col("schedule"), col("grad_max_err"));
    let mut seen = 0;
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let e: f64 = cells[err].parse().unwrap();
        assert!(e <= 1e-5, "{}: gradient error {e}", cells[schedule]);
        seen += 1;
    }
    assert_eq!(seen, rows, "{}", dir.display());
}

fn every_schedule(backend: &str, work: &str) {
    let name = format!("{backend}-{}", work.replace(':', "_"));
    let d = run(
        &name,
        backend,
        work,
        // Six microbatches on three ranks: a shape every schedule takes
        // (DualPipeV needs M >= 2R, interleaved M a multiple of R).
        &["--schedule", "all", "--stages", "3", "--microbatches", "6"],
    );
    // The registry's eight schedules, PyTorch's seven and ZB-H1.
    assert_eq!(check_dir(&d, &name), 8, "{name}: one trace per schedule");
    if work == "compute" {
        assert_gradients_match(&d, 8);
    }
    let csv = d.join("mine.csv");
    std::fs::write(&csv, CSV).unwrap();
    let d = run(
        &format!("{name}-csv"),
        backend,
        work,
        &["--schedule-csv", csv.to_str().unwrap()],
    );
    assert_eq!(check_dir(&d, &format!("{name} csv")), 1);
}

#[test]
fn local_threads_compute_timelines_are_causal() {
    every_schedule("local", "compute");
}

#[test]
fn local_threads_sleep_timelines_are_causal() {
    every_schedule("local", "sleep:200");
}

#[test]
fn tcp_processes_compute_timelines_are_causal() {
    every_schedule("tcp", "compute");
}

#[test]
fn tcp_processes_sleep_timelines_are_causal() {
    every_schedule("tcp", "sleep:200");
}
