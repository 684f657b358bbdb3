//! End-to-end runs of the binary on the `local` backend with tiny sizes.

mod common;
use common::*;

fn args<'a>(extra: &[&'a str], out: &'a str) -> Vec<&'a str> {
    let mut v = with(&small_on("local"), extra);
    v.extend_from_slice(&["--out", out]);
    v
}

#[test]
fn prints_the_table_and_writes_exact_rows_then_appends() {
    let dir = scratch("e2e");
    let out = dir.to_str().unwrap();
    let o = run(&args(&["all_reduce", "all_gather", "sendrecv"], out), &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{}\n{}", text, stderr(&o));
    for needle in [
        "out-of-place",
        "in-place",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "p50",
        "p99",
        "%ceil",
        "model",
        "# Wire ceiling:",
        "# all_reduce: busbw = algbw x 1.0000",
        "# all_gather: busbw = algbw x 0.5000",
        "peak busbw",
        "# Straggler: ",
        "# Correctness: 0 wrong elements",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // One table line per size: 8, 64, 512, 4096 bytes.
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 12, "{text}");
    assert!(
        lines[0]
            .split_whitespace()
            .take(5)
            .eq(["8", "2", "float", "sum", "-1"]),
        "{}",
        lines[0]
    );

    let csv = dir.join("collectives.csv");
    let (header, rows) = read_csv(&csv);
    for col in [
        "schema",
        "run_id",
        "backend",
        "wire",
        "algo",
        "collective",
        "dtype",
        "op",
        "world",
        "bytes",
        "count",
        "in_place",
        "time_us",
        "time_min_us",
        "time_max_us",
        "p50_us",
        "p99_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
        "model_us",
        "ceiling_gbps",
    ] {
        assert!(
            header.iter().any(|h| h == col),
            "no column {col} in {header:?}"
        );
    }
    // Every collective in and out of place (sendrecv in place as nccl-tests runs it).
    assert_eq!(rows.len(), 4 * 2 + 4 * 2 + 4 * 2);
    for r in &rows {
        assert_eq!(r["wrong"], "0", "{r:?}");
        assert_eq!(r["backend"], "local");
        assert_eq!(r["world"], "2");
        let t: f64 = r["time_us"].parse().unwrap();
        let ceiling: f64 = r["ceiling_gbps"].parse().unwrap();
        assert!(t > 0.0 && ceiling > 0.0, "{r:?}");
        let (bytes, algbw): (f64, f64) = (
            r["bytes"].parse().unwrap(),
            r["algbw_gbps"].parse().unwrap(),
        );
        assert!(
            (algbw - bytes / t / 1e3).abs() <= 1e-9 * algbw.max(1.0),
            "algbw is bytes / time: {r:?}"
        );
    }
    let ag = rows
        .iter()
        .find(|r| r["collective"] == "all_gather" && r["bytes"] == "64")
        .unwrap();
    assert_eq!(
        ag["count"], "8",
        "per-rank count of a 64-byte float all_gather on 2 ranks"
    );
    let runs = std::fs::read_to_string(dir.join("run.json")).unwrap();
    for key in [
        "\"ceiling\"",
        "\"fits\"",
        "\"model_link\"",
        "\"command_line\"",
        "\"git_revision\"",
    ] {
        assert!(runs.contains(key), "run.json lacks {key}");
    }

    // A second run into the same folder keeps the first's rows and run.
    let o2 = run(&args(&["broadcast", "--outplace-only"], out), &[]);
    assert!(o2.status.success(), "{}", stderr(&o2));
    let (_, rows2) = read_csv(&csv);
    assert_eq!(rows2.len(), rows.len() + 4);
    assert_eq!(rows2[..rows.len()], rows[..]);
    let ids: std::collections::BTreeSet<&String> = rows2.iter().map(|r| &r["run_id"]).collect();
    assert_eq!(ids.len(), 2);
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_element_makes_exit_code_one() {
    // Self-test of the checker: rank 1 flips one byte of every output it checks.
    let dir = scratch("corrupt");
    let out = dir.to_str().unwrap();
    let o = run(
        &args(&["all_reduce", "-e", "64"], out),
        &[("PARBENCH_SELFTEST_CORRUPT_RANK", "1")],
    );
    // nccl-tests' exit code for wrong results.
    assert_eq!(o.status.code(), Some(7), "{}\n{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("WRONG elements"), "{}", stdout(&o));
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    assert!(rows.iter().all(|r| r["wrong"] == "1"), "{rows:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn names_the_injected_straggler() {
    let dir = scratch("straggler");
    let out = dir.to_str().unwrap();
    let o = run(
        &args(
            &["all_reduce", "-e", "64", "-n", "10", "--straggler", "1:2"],
            out,
        ),
        &[],
    );
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    assert!(text.contains("# Straggler: rank 1 arrived last"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_type_and_op_checks_exact() {
    let dir = scratch("types");
    let out = dir.to_str().unwrap();
    let o = run(
        &[
            "all_reduce",
            "reduce_scatter",
            "reduce",
            "--backend",
            "local",
            "-np",
            "3",
            "-b",
            "24",
            "-e",
            "24",
            "-n",
            "1",
            "-w",
            "0",
            "-c",
            "2",
            "-o",
            "all",
            "-d",
            "all",
            "-r",
            "2",
            "--out",
            out,
        ],
        &[],
    );
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    // Every type and operator nccl-tests has: 12 types, 6 operators.
    assert_eq!(rows.len(), 3 * 6 * 12 * 2);
    assert!(rows.iter().all(|r| r["wrong"] == "0"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ceiling ladder reaches the largest working set of the sweep, and
/// every row's ceiling is the ladder at that row's own working set; the
/// run records its ladders, model link, floor, fits window and noise.
#[test]
fn the_ceiling_ladder_covers_the_sweep_and_each_row_uses_its_working_set() {
    use parbench::comm::Collective;
    use parbench::model::wire::{ceiling_for, working_set_bytes, Ladder};
    let dir = scratch("ladder");
    let out = dir.to_str().unwrap();
    let o = run(
        &[
            "--backend",
            "local",
            "-np",
            "2",
            "-b",
            "1K",
            "-e",
            "256K",
            "-f",
            "4",
            "-n",
            "3",
            "-w",
            "1",
            "all_reduce",
            "all_gather",
            "--fit-from",
            "16K",
            "--out",
            out,
        ],
        &[],
    );
    let text = stdout(&o);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    assert!(text.contains("GB/s in cache .."), "{text}");
    assert!(text.contains("# Cores' state (8 B exchange;"), "{text}");
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let extra = &runs[0]["extra"];
    let ladder: Ladder = serde_json::from_value(extra["ceiling"]["ladder"].clone()).unwrap();
    // Shared memory measures each row's ceiling at the row, not after the sweep.
    assert!(extra["ceiling"]["after_sweep"].is_null());
    let state_rows = extra["core_state"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // Shared memory's states are told apart by every figure of the probe.
    assert_eq!(
        extra["core_state"]["state"]["judged_by"], "all",
        "{}",
        extra["core_state"]
    );
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    let mut largest = 0;
    for r in &rows {
        let coll: Collective = r["collective"].parse().unwrap();
        let ws = working_set_bytes(
            coll,
            r["world"].parse().unwrap(),
            r["bytes"].parse().unwrap(),
            r["in_place"] == "true",
        );
        largest = largest.max(ws);
        // On shared memory each row's ceiling is the pre-sweep ladder with
        // the rungs measured again just before the row put in.
        let label = row_label(r);
        // Each row was probed before and after it was timed.
        let state = state_rows
            .iter()
            .find(|x| x["row"] == label.as_str())
            .unwrap_or_else(|| panic!("{label} has no core state: {extra}"));
        assert!(
            state["before"]["exchange_us"]
                .as_f64()
                .is_some_and(|x| x > 0.0)
                && state["after"]["exchange_us"]
                    .as_f64()
                    .is_some_and(|x| x > 0.0),
            "{state}"
        );
        let again = extra["ceiling"]["rows_measured_again"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["row"] == label.as_str())
            .unwrap_or_else(|| panic!("{label} not measured again: {extra}"));
        let here = Ladder {
            method: String::new(),
            rungs: serde_json::from_value(again["rungs"].clone()).unwrap(),
        };
        assert!(!here.rungs.is_empty(), "{label}");
        let at_row = ladder.with_rungs_from(&here);
        let row_ceiling = |l: &Ladder| {
            ceiling_for(
                l,
                coll,
                &parbench::model::ModelAlgo::of(&r["algo"]),
                r["world"].parse().unwrap(),
                r["bytes"].parse().unwrap(),
                r["in_place"] == "true",
            )
            .unwrap()
        };
        let (before, want) = (row_ceiling(&ladder), row_ceiling(&at_row));
        let got: f64 = r["ceiling_gbps"].parse().unwrap();
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{r:?}: ceiling {got}, ladder {want}"
        );
        assert!(
            got >= before * (1.0 - 1e-9),
            "{r:?}: ceiling {got} below the pre-sweep one {before}"
        );
        // From model_at_row's first size, the model column is priced with
        // the rungs measured just before the row, in place of the
        // pre-sweep ones; below it, with the pre-sweep ladders alone.
        assert_model_priced_at_row(extra, r);
    }
    assert!(
        ladder.covers(largest),
        "ladder up to {largest} B: {ladder:?}"
    );
    assert!(ladder.rungs.len() >= 3, "{ladder:?}");
    for key in [
        "duplex",
        "copy",
        "reduce",
        "pull",
        "claim",
        "both",
        "ping_pong",
        "exchange",
    ] {
        assert!(!extra["model_link"][key].is_null(), "model_link.{key}");
    }
    // The transport's reducing receives, at every rung of the wire.
    let rungs = |key: &str| extra["model_link"][key]["rungs"].as_array().unwrap().len();
    for key in ["reduce_into", "reduce_from"] {
        assert_eq!(rungs(key), rungs("both"), "model_link.{key}");
    }
    // The rungs kept out of the cores' state, by working set: rungs of the ladder.
    let off = extra["model_link"]["rungs_off_state_sets"]
        .as_array()
        .unwrap();
    assert_eq!(
        off.len() as u64,
        extra["model_link"]["rungs_off_state"].as_u64().unwrap()
    );
    let sets: Vec<u64> = ladder.rungs.iter().map(|r| r.working_set).collect();
    assert!(
        off.iter().all(|w| sets.contains(&w.as_u64().unwrap())),
        "{off:?}"
    );
    // The rungs measured again for a dip below both neighbours: rungs of the ladder.
    let again = extra["model_link"]["rungs_measured_again_sets"]
        .as_array()
        .unwrap();
    assert!(
        again.iter().all(|w| sets.contains(&w.as_u64().unwrap())),
        "{again:?}"
    );
    assert!(extra["model_link"]["ping_pong"]["trips"].as_u64().unwrap() >= 50);
    assert!(extra["floor"]["floor_us"].as_f64().unwrap() > 0.0);
    assert!(
        extra["noise"]["fraction"].as_f64().is_some(),
        "noise recorded"
    );
    let fits = extra["fits"].as_array().unwrap();
    // Rows timed with the cores elsewhere than where the wire was measured
    // are left out of the fits; a fit needs two rows in its window.
    let in_window_in_state = state_rows
        .iter()
        .filter(|x| x["in_state"] == true && !x["row"].as_str().unwrap().ends_with(" in"))
        .filter(|x| {
            let b: u64 = x["row"]
                .as_str()
                .unwrap()
                .split(' ')
                .nth(1)
                .unwrap()
                .parse()
                .unwrap();
            b >= 16 << 10
        })
        .count();
    assert!(!fits.is_empty() || in_window_in_state < 4, "{extra}");
    for f in fits {
        assert_eq!(f["window_from_bytes"], 16384, "{f}");
    }
    // The ring (16 KiB and up) is fitted in the ladders' structure; an
    // algorithm with one size in the window says why it has no fit.
    // Rows left out (the cores elsewhere) can leave it one size: it says so.
    match fits
        .iter()
        .find(|f| f["algo"] == "ring" && f["sizes"].as_u64() >= Some(2))
    {
        Some(ring) => {
            assert_eq!(
                ring["structure"], "t = L alpha + s x (the ladders' bytes term)",
                "{ring}"
            );
            assert!(ring["rms_rel_err"].as_f64().is_some(), "{ring}");
        }
        None => assert!(
            in_window_in_state < 4
                && fits
                    .iter()
                    .filter(|f| f["algo"] == "ring")
                    .all(|f| f["error"].is_string()),
            "no ring fit: {extra}"
        ),
    }
}

/// On a terminal (util-linux `script` gives the run one), a line says what
/// the silent seconds before the sweep measure, a counter names each row
/// as it starts and is erased before the row prints; off a terminal (the
/// other tests' pipes) none of it is written.
#[test]
fn progress_on_a_terminal_only() {
    let dir = scratch("progress");
    let out = dir.to_str().unwrap();
    let piped = run(&args(&["all_reduce"], out), &[]);
    assert!(piped.status.success(), "{}", stderr(&piped));
    for text in [stdout(&piped), stderr(&piped)] {
        assert!(
            !text.contains('\x1b') && !text.contains("bench-collectives: measuring the"),
            "{text}"
        );
    }
    let line = std::iter::once(env!("CARGO_BIN_EXE_bench-collectives"))
        .chain(args(&["all_reduce"], out))
        .collect::<Vec<_>>()
        .join(" ");
    let tty = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("TERM", "xterm")
        .env_remove("PARBENCH_SELFTEST_CORRUPT_RANK")
        .stdin(std::process::Stdio::null())
        .output();
    let Ok(tty) = tty else {
        eprintln!("SKIP: util-linux `script` is not installed (it gives the run a terminal)");
        return;
    };
    let text = stdout(&tty);
    assert!(tty.status.success(), "{text}");
    // The run before wrote run.json here: the estimate is its time.
    assert!(
        text.contains("bench-collectives: measuring the local wire on 2 ranks before the sweep")
            && text.contains("as the last run on this wire in"),
        "{text}"
    );
    assert!(
        text.contains("all_reduce float sum: size 1 of 4 (8 B)"),
        "{text}"
    );
    // Each live line is erased before the row after it prints.
    assert!(text.contains("(8 B)\r\x1b[2K"), "{text}");
}
