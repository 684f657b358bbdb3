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
        "%ceil",
        "# ceiling ",
        "# all_reduce, busbw = algbw x 1.00",
        "# all_gather, busbw = algbw x 0.50",
        "# all_reduce: peak busbw ",
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : ",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // Without -v: nccl-tests' columns and %ceil alone, rows within 140
    // characters, a run header of at most three lines.
    assert!(!text.contains("p50") && !text.contains("model"), "{text}");
    assert!(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .all(|l| l.len() <= 140),
        "{text}"
    );
    let header: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("# all_reduce,"))
        .collect();
    assert!((1..=3).contains(&header.len()), "{text}");
    assert!(header.iter().all(|l| l.len() <= 120), "{text}");
    // -v adds the percentiles, the model and the algorithm.
    let vdir = scratch("e2e-verbose");
    let verbose = run(
        &args(&["all_reduce", "-e", "64", "-v"], vdir.to_str().unwrap()),
        &[],
    );
    let vtext = stdout(&verbose);
    for needle in ["p50", "p99", "model", "algo"] {
        assert!(vtext.contains(needle), "-v lacks {needle:?}:\n{vtext}");
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
        "\"headlines\"",
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
    let _ = std::fs::remove_dir_all(&vdir);
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
    assert!(
        stdout(&o).contains("wrong elements summed over ranks and rows"),
        "{}",
        stdout(&o)
    );
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
    assert!(
        text.contains("# WARNING: straggler: rank 1 arrived last"),
        "{text}"
    );
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

/// The ceiling ladder reaches the largest working set of the sweep, every
/// row's ceiling is the ladder at that row's own working set and its model
/// the alpha-beta-gamma form priced there; the run records its ladders,
/// model link, floor, headlines, fits window and noise.
#[test]
fn the_ceiling_ladder_covers_the_sweep_and_each_row_uses_its_working_set() {
    use parbench::comm::Collective;
    use parbench::model::ladder::{working_set_bytes, Ladder};
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
    assert!(text.contains("GB/s per rank by working set"), "{text}");
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let extra = &runs[0]["extra"];
    let ladder: Ladder = serde_json::from_value(extra["ceiling"]["ladder"].clone()).unwrap();
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
        let want = ladder.at(ws).unwrap();
        let got: f64 = r["ceiling_gbps"].parse().unwrap();
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{r:?}: ceiling {got}, ladder {want}"
        );
        assert_model_priced(extra, r);
    }
    assert!(
        ladder.covers(largest),
        "ladder up to {largest} B: {ladder:?}"
    );
    assert!(ladder.rungs.len() >= 3, "{ladder:?}");
    for key in ["copy", "reduce", "ping_pong", "exchange"] {
        assert!(!extra["model_link"][key].is_null(), "model_link.{key}");
    }
    assert!(extra["model_link"]["ping_pong"]["trips"].as_u64().unwrap() >= 50);
    assert!(extra["floor"]["floor_us"].as_f64().unwrap() > 0.0);
    assert!(
        extra["noise"]["fraction"].as_f64().is_some(),
        "noise recorded"
    );
    // One headline per collective, the line the footer printed.
    let headlines = extra["headlines"].as_array().unwrap();
    assert_eq!(headlines.len(), 2, "{extra}");
    for h in headlines {
        let line = h["line"].as_str().unwrap();
        assert!(text.contains(&format!("# {line}\n")), "{line}\n{text}");
        assert_eq!(h["in_place"], false, "{h}");
    }
    let fits = extra["fits"].as_array().unwrap();
    assert!(!fits.is_empty(), "{extra}");
    for f in fits {
        assert_eq!(f["window_from_bytes"], 16384, "{f}");
        // Each fit carries its collective's headline, not a peak of its own.
        let peak = headlines
            .iter()
            .find(|h| h["collective"] == f["collective"])
            .unwrap();
        assert_eq!(&f["peak"], peak, "{f}");
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
    assert!(
        text.contains("bench-collectives: measuring the local wire on 2 ranks"),
        "{text}"
    );
    assert!(
        text.contains("all_reduce float sum: size 1 of 4 (8 B)"),
        "{text}"
    );
    // Each live line is erased before the row after it prints.
    assert!(text.contains("(8 B)\r\x1b[2K"), "{text}");
}
