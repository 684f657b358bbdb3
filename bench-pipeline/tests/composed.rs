//! The composed dp x tp x pp step end to end (`--dp --tp --stages`): 8
//! ranks on local threads and on tcp processes with the gradient check
//! passing, its records (pipeline.csv's mesh columns, run.json's
//! `composed` section, a trace with a track per rank named by its mesh
//! coordinate), data parallel alone bit for bit, and the combinations
//! refused in one line before anything runs. Timings are never asserted.

#[path = "../../test-support/binary.rs"]
mod binary;
#[path = "../../test-support/run_json.rs"]
mod run_json;

use parbench::results::{read_rows, PipelineRow};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench-pipeline"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "bench-pipeline-composed-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A small block, two microbatches, one step: 8 ranks in a few seconds.
const SMALL: &str =
    "--hidden 16 --heads 2 --seq 8 --layers-per-stage 1 --microbatches 2 --iters 1 --warmup 0";

/// Runs the binary with `line` and `--out d` (60 s at most); asserts it
/// succeeded; its standard output, rows and run.json's composed sections.
fn run_ok(line: &str, d: &Path) -> (String, Vec<PipelineRow>, Vec<Value>) {
    let mut cmd = bin();
    cmd.args(line.split_whitespace())
        .arg("--out")
        .arg(d)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = binary::finish_within(cmd.spawn().unwrap(), 120);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{line}: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows = read_rows(&d.join("pipeline.csv")).unwrap();
    (out, rows, run_json::composed_sections(d))
}

/// Every replica's check in a composed section: (max rel err, values differing).
fn checks(c: &Value) -> Vec<(f64, u64)> {
    c["check"]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["max_rel_err"].as_f64().unwrap(),
                r["differing"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// What every 8-rank run must hold: one row per schedule with the mesh,
/// both groups' traffic, a check per replica within the tolerance, every
/// rank's breakdown, the calibration, and the trace's tracks.
fn assert_eight_ranks(out: &str, rows: &[PipelineRow], composed: &[Value], d: &Path, check: bool) {
    assert!(out.contains("dp 2 x tp 2 x pp 2"), "{out}");
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!((r.dp, r.tp, r.stages), (2, 2, 2), "{r:?}");
        assert!(r.tp_comm_us > 0.0 && r.dp_comm_us > 0.0, "{r:?}");
        assert!(r.dp_exposed_us <= r.dp_comm_us + 1e-9, "{r:?}");
        assert!(r.step_us > 0.0);
    }
    assert_eq!(composed.len(), rows.len());
    for c in composed {
        assert_eq!(c["mesh"]["world"], 8);
        assert_eq!(
            c["global_batch"].as_u64().unwrap(),
            2 * c["microbatches"].as_u64().unwrap() * c["microbatch_size"].as_u64().unwrap()
        );
        let ranks = c["measured"]["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 8);
        for r in ranks {
            assert!(r["compute_us"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["tp_comm_us"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["dp_comm_us"].as_f64().unwrap() > 0.0, "{r}");
        }
        let cal = &c["calibration"];
        assert!(cal["gemm"]["flop_per_s"].as_f64().unwrap() > 0.0, "{cal}");
        assert_eq!(cal["tp_wire"]["ranks"], 2, "{cal}");
        assert_eq!(
            cal["dp_wire"]["points"].as_array().unwrap().len(),
            3,
            "{cal}"
        );
        assert!(cal["pipeline_link"]["message_us"].as_f64().unwrap() > 0.0);
        let got = checks(c);
        if check {
            assert_eq!(got.len(), 2, "one check per replica: {c}");
            for (err, _) in got {
                assert!(err <= 1e-5, "{c}");
            }
        } else {
            assert!(got.is_empty());
        }
        // The trace: a track per world rank named by its coordinate, and
        // both groups' communication inside.
        let trace: Value = serde_json::from_slice(
            &std::fs::read(d.join(c["timeline"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        let events = trace["traceEvents"].as_array().unwrap();
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        // One track per world rank, and with --overlap one per rank's
        // reduction thread, holding that rank's buckets.
        let overlap = c["reduce"]["overlap"].as_bool().unwrap();
        let threads = names.iter().filter(|n| n.ends_with("dp reduction thread"));
        assert_eq!(names.len(), 8 + threads.count(), "{names:?}");
        assert_eq!(names.len(), if overlap { 16 } else { 8 }, "{names:?}");
        assert!(
            names.iter().any(|n| n.starts_with("rank 7 (d 1, t 1, p 1")),
            "{names:?}"
        );
        let bucket_tracks: Vec<u64> = events
            .iter()
            .filter(|e| e["name"] == "dp bucket")
            .filter_map(|e| e["tid"].as_u64())
            .collect();
        assert!(
            bucket_tracks.iter().all(|&t| (t >= 8) == overlap),
            "{bucket_tracks:?}"
        );
        for slice in ["tp comm", "dp bucket"] {
            assert!(
                events.iter().any(|e| e["name"] == slice),
                "no {slice} slice"
            );
        }
    }
    assert_eq!(out.contains("check: passed"), check, "{out}");
}

#[test]
fn dp2_tp2_pp2_on_local_threads_matches_one_rank() {
    let d = tmp("local");
    let (out, rows, composed) = run_ok(
        &format!("--dp 2 --tp 2 --stages 2 --schedule 1f1b,zb-h1 {SMALL}"),
        &d,
    );
    assert_eight_ranks(&out, &rows, &composed, &d, true);
    assert!(rows.iter().all(|r| r.grad_max_err <= 1e-5), "{rows:?}");
}

#[test]
fn dp2_tp2_pp2_on_tcp_processes_matches_one_rank() {
    let d = tmp("tcp");
    let (out, rows, composed) = run_ok(
        &format!("--dp 2 --tp 2 --stages 2 --schedule 1f1b --backend tcp --overlap --bucket-mib 0.004 {SMALL}"),
        &d,
    );
    assert_eight_ranks(&out, &rows, &composed, &d, true);
    assert!(rows.iter().all(|r| r.backend == "tcp"));
    // 4 KiB buckets split each stage's gradients.
    let buckets = composed[0]["reduce"]["buckets_per_rank"].as_u64().unwrap();
    assert!(buckets > 1, "{buckets}");
}

#[test]
fn dp2_tp2_pp2_in_sleep_mode_keeps_both_groups_traffic() {
    let d = tmp("sleep");
    let (out, rows, composed) = run_ok(
        &format!("--dp 2 --tp 2 --stages 2 --schedule 1f1b --work sleep:500 {SMALL}"),
        &d,
    );
    assert_eight_ranks(&out, &rows, &composed, &d, false);
    assert!(out.contains("check: not run (--work sleep:500"), "{out}");
    let nominal = composed[0]["calibration"]["gemm"]["nominal_flop_per_s"]
        .as_f64()
        .unwrap();
    assert!(nominal > 0.0);
}

/// Data parallel alone with one microbatch per replica: the reduction is
/// a + b, the reference adds the same two microbatches in that order.
#[test]
fn dp2_alone_matches_one_device_bit_for_bit() {
    let d = tmp("dp2");
    let (_, rows, composed) = run_ok(
        "--dp 2 --stages 1 --schedule 1f1b,zb-h1 --hidden 16 --heads 2 --seq 8 --microbatches 1 --iters 1 --warmup 0",
        &d,
    );
    assert_eq!(rows.len(), 2);
    for c in &composed {
        let got = checks(c);
        assert_eq!(got.len(), 2, "{c}");
        assert!(
            got.iter()
                .all(|&(err, differing)| err == 0.0 && differing == 0),
            "{c}"
        );
    }
}

#[test]
fn bad_combinations_are_refused_in_one_line() {
    let refused = |args: &[&str], want: &[&str]| {
        binary::refused_in_one_line(bin(), args, want, "pipeline.csv")
    };
    refused(&["--dp", "0"], &["--dp 0"]);
    refused(&["--overlap"], &["--overlap", "--dp or --tp"]);
    refused(&["--tp", "2", "--overlap"], &["--dp above 1"]);
    refused(&["--tp", "2", "--heads", "3"], &["--tp 2"]);
    refused(
        &["--dp", "2", "--stage-layers", "1,1,1,1"],
        &["--stage-layers"],
    );
    refused(&["--dp", "2", "--order", "tp-tp-pp"], &["--order"]);
    refused(&["--dp", "2", "--bucket-mib", "-1"], &["--bucket-mib"]);
    refused(
        &[
            "--dp",
            "2",
            "--stages",
            "2",
            "--backend",
            "tcp",
            "--nprocs",
            "2",
        ],
        &["--nprocs 2", "= 4"],
    );
    refused(&["--dp", "2", "--backend", "nccl"], &["--backend"]);
    refused(&["--dp", "2", "--shard", "zero9"], &["--shard zero9"]);
    refused(&["--shard", "zero3"], &["--shard", "--dp or --tp"]);
    refused(&["--tp", "2", "--shard", "zero3"], &["--dp above 1"]);
    refused(&["--dp", "4", "--shard-group", "2"], &["--shard-group"]);
    refused(
        &["--dp", "4", "--shard", "zero3", "--shard-group", "3"],
        &["--shard-group 3", "divisor"],
    );
    refused(
        &["--dp", "2", "--shard", "zero2", "--overlap"],
        &["--overlap", "zero2"],
    );
    refused(
        &["--dp", "2", "--shard", "zero3", "--distributed-optimizer"],
        &["--distributed-optimizer", "zero1"],
    );
    refused(
        &["--tp", "2", "--hidden", "1000000", "--seq", "100000"],
        &["--ffn/--seq", "but this machine has"],
    );
}

/// Another rank order, the distributed optimizer's reduce-scatter in
/// small buckets, and a schedule read from a compute-only CSV with split
/// I and W passes run the same step, the check passing.
#[test]
fn another_order_the_reduce_scatter_and_a_csv_schedule_match_one_rank() {
    let d = tmp("csv");
    let csv = d.join("zb.csv");
    std::fs::write(&csv, "0F0,0I0,0F1,0I1,0W0,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n").unwrap();
    let (out, rows, composed) = run_ok(
        &format!(
            "--dp 2 --tp 2 --schedule-csv {} --order pp-dp-tp --distributed-optimizer --bucket-mib 0.002 --hidden 16 --heads 2 --seq 8 --layers-per-stage 1 --iters 1 --warmup 0",
            csv.display()
        ),
        &d,
    );
    assert!(
        out.contains("order pp-dp-tp") && out.contains("reduce-scatter"),
        "{out}"
    );
    assert_eq!(rows.len(), 1);
    let c = &composed[0];
    assert_eq!(c["mesh"]["order"], "pp-dp-tp");
    assert_eq!(c["reduce"]["dist_opt"], true);
    assert_eq!(c["calibration"]["dp_wire"]["collective"], "reduce_scatter");
    let got = checks(c);
    assert_eq!(got.len(), 2, "{c}");
    assert!(got.iter().all(|&(err, _)| err <= 1e-5), "{c}");
}

/// The check can fail: one value of world rank 6's reduced gradients
/// (d 1, t 0, p 1 in Megatron's order) changed after the reduction, by
/// the test-only variable, fails replica 1's check and only its; the run
/// exits 1 naming it, with the rows, run.json and the trace written.
/// Without the variable the same run passes (the test above).
#[test]
fn a_corrupted_gradient_fails_the_check_naming_its_replica() {
    let d = tmp("corrupt");
    let line = format!("--dp 2 --tp 2 --stages 2 --schedule 1f1b {SMALL}");
    let mut cmd = bin();
    cmd.args(line.split_whitespace())
        .arg("--out")
        .arg(&d)
        .env("PARBENCH_TEST_CORRUPT_GRAD", "6")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = binary::finish_within(cmd.spawn().unwrap(), 120);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(out.contains("check: FAILED"), "{out}");
    let failure = err
        .lines()
        .find(|l| l.contains("gradient check failed"))
        .unwrap_or_else(|| panic!("no failure line: {err}"));
    assert!(
        failure.contains("replica 1:") && !failure.contains("replica 0:"),
        "{failure}"
    );
    let rows = read_rows::<PipelineRow>(&d.join("pipeline.csv")).unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].grad_max_err > 1e-5, "{:?}", rows[0]);
    let composed = run_json::composed_sections(&d);
    let got = checks(&composed[0]);
    let bad: Vec<bool> = got.iter().map(|&(e, _)| e > 1e-5).collect();
    let replicas: Vec<u64> = composed[0]["check"]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["d"].as_u64().unwrap())
        .collect();
    for (d_rank, bad) in replicas.iter().zip(&bad) {
        assert_eq!(*bad, *d_rank == 1, "{}", composed[0]["check"]);
    }
    assert!(d.join(composed[0]["timeline"].as_str().unwrap()).exists());
    // A value that names no world rank is one line, exit 2.
    let mut refused = bin();
    refused.env("PARBENCH_TEST_CORRUPT_GRAD", "8");
    binary::refused_in_one_line(
        refused,
        &line.split_whitespace().collect::<Vec<_>>(),
        &["PARBENCH_TEST_CORRUPT_GRAD=8"],
        "pipeline.csv",
    );
}

/// `--shard zero3` with hybrid groups runs, the check passing with the
/// gathered weights compared; run.json's `sharded` section holds each
/// rank's bytes by kind beside the ZeRO paper's split (within 10%), and
/// the trace draws the gathers and scatters on their own track.
#[test]
fn sharded_data_parallel_records_its_memory_and_collectives() {
    let d = tmp("sharded");
    let (out, _, composed) = run_ok(
        &format!("--dp 4 --stages 1 --shard zero3 --shard-group 2 {SMALL}"),
        &d,
    );
    assert!(
        out.contains("shard zero3 hybrid: shard groups of 2, 2 replicas"),
        "{out}"
    );
    assert!(out.contains("check: passed"), "{out}");
    let c = &composed[0];
    for r in c["check"]["replicas"].as_array().unwrap() {
        assert_eq!(r["weights_differing"], 0, "{r}");
        assert!(r["weights_compared"].as_u64().unwrap() > 0, "{r}");
    }
    let sh = &c["sharded"];
    assert_eq!(sh["mode"], "zero3");
    assert_eq!(sh["group"], 2);
    let want = sh["formula_bytes"].as_f64().unwrap();
    let ranks = sh["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    for r in ranks {
        let held = r["held_bytes"]["total"].as_f64().unwrap();
        assert!((held - want).abs() <= 0.1 * want, "{held} vs {want}");
        assert!(r["calls"].as_u64().unwrap() > 0);
    }
    let trace = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("timeline-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .unwrap();
    assert!(trace.contains("sharded data parallel"), "no shard track");
    assert!(trace.contains("shard all-gather") && trace.contains("shard reduce-scatter"));
}
