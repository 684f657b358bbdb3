//! The binary end to end: refusals before anything runs, and small real runs
//! whose records hold matching gradients. Timings are never asserted.

#[path = "../../test-support/binary.rs"]
mod binary;

use parbench::results::{read_rows, read_runs, PipelineRow};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench-pipeline"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bench-pipeline-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

/// A small model, one step, no warm-up: a run in a moment.
const SMALL_STEP: &str = "--hidden 16 --microbatch-size 4 --iters 1 --warmup 0";

/// Runs the binary with the words of `line`, then `extra`, then `--out d`;
/// asserts it succeeded; returns its output and the rows it recorded.
fn run_ok(line: &str, extra: &[&str], d: &Path) -> (Output, Vec<PipelineRow>) {
    let mut args: Vec<&str> = line.split_whitespace().collect();
    args.extend(extra);
    args.extend(["--out", d.to_str().unwrap()]);
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, read_rows(&d.join("pipeline.csv")).unwrap())
}

/// Runs the schedule `text` (written to `d/bad.csv`) with `--out d`; its
/// exit code and standard error.
fn run_schedule(d: &Path, text: &str) -> (Option<i32>, String) {
    let csv = d.join("bad.csv");
    std::fs::write(&csv, text).unwrap();
    let out = run(&[
        "--schedule-csv",
        csv.to_str().unwrap(),
        "--out",
        d.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), err)
}

#[test]
fn a_deadlocking_csv_schedule_is_refused_with_its_grid() {
    let d = tmp("deadlock");
    let (code, err) = run_schedule(&d, "0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n");
    assert_eq!(code, Some(2));
    assert!(err.contains("deadlocks"), "{err}");
    assert!(err.contains("[0B0]") && err.contains("[1F1]"), "{err}");
    assert!(!d.join("pipeline.csv").exists());
}

#[test]
fn an_invalid_csv_schedule_is_refused_with_the_action_marked() {
    let d = tmp("invalid");
    let (code, err) = run_schedule(&d, "0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("1B0 runs before 1F0") && err.contains("[1B0]"),
        "{err}"
    );
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    for args in [
        &["--schedule", "pipedream"][..],
        &["--microbatches", "4,x"],
        &["--slow-rank", "1"],
        &["--schedule", "interleaved", "--microbatches", "6"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn every_schedule_runs_and_records_matching_gradients() {
    let d = tmp("sweep");
    let line = format!("--stages 2 --microbatches 2,4 {SMALL_STEP}");
    let (out, rows) = run_ok(&line, &[], &d);
    assert_eq!(rows.len(), 8);
    for r in &rows {
        assert!(r.grad_max_err < 1e-5, "{}: {}", r.schedule, r.grad_max_err);
        assert!(r.bubble_measured >= 0.0 && r.bubble_measured < 1.0);
        assert!(r.bubble_formula.is_finite());
        assert_eq!(
            r.peak_activations, r.expected_peak_activations,
            "{}",
            r.schedule
        );
        check_time_split(&d, r);
    }
    let runs = read_runs(&d).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].suite, "pipeline");
    check_time_base(&runs[0], "shared", 8);
    // The table, one row a run; the per-rank detail only under -v.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(table.len(), 1 + 8, "{stdout}");
    assert!(table[0].starts_with("schedule "), "{stdout}");
    assert!(!stdout.contains("rank1: "), "{stdout}");
}

#[test]
fn verbose_puts_each_ranks_detail_under_its_row() {
    let d = tmp("verbose");
    let line = format!("-v --stages 2 --microbatches 2 --schedule 1f1b {SMALL_STEP}");
    let (out, rows) = run_ok(&line, &[], &d);
    assert_eq!(rows.len(), 1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let row = lines.iter().position(|l| l.starts_with("1f1b ")).unwrap();
    let detail = &lines[row + 1..];
    for what in [
        "    rank0: busy",
        "    rank1: busy",
        "    clocks: ",
        "    pace: ",
    ] {
        assert!(
            detail.iter().any(|l| l.starts_with(what)),
            "{what}: {stdout}"
        );
    }
}

/// With more compute ranks than cores (one core, two ranks) the header
/// says so once, and no run repeats it as a warning.
#[test]
fn too_few_cores_is_said_once_in_the_header() {
    let d = tmp("crowded");
    let line = format!("--stages 2 --microbatches 2,4 --schedule gpipe,1f1b {SMALL_STEP}");
    let out = Command::new("taskset")
        .args(["-c", "0"])
        .arg(env!("CARGO_BIN_EXE_bench-pipeline"))
        .args(line.split_whitespace())
        .args(["--out", d.to_str().unwrap()])
        .output()
        .expect("taskset (util-linux) runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let said: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("compute ranks on 1 cores"))
        .collect();
    assert_eq!(said.len(), 1, "{stdout}");
    assert!(said[0].starts_with("# "), "{stdout}");
    let header_end = stdout
        .lines()
        .position(|l| l.starts_with("schedule "))
        .unwrap();
    let at = stdout
        .lines()
        .position(|l| l.contains("compute ranks on"))
        .unwrap();
    assert!(at < header_end, "{stdout}");
    assert!(!stdout.contains("    WARNING"), "{stdout}");
    assert_eq!(
        read_rows::<PipelineRow>(&d.join("pipeline.csv"))
            .unwrap()
            .len(),
        4
    );
}

#[test]
fn a_csv_schedule_runs_under_sleep_work() {
    let d = tmp("csv");
    let csv = d.join("mine.csv");
    std::fs::write(&csv, "0F0,0F1,,0B0,0B1\n1F0,1B0,1F1,1B1\n").unwrap();
    let line = "--work sleep:200 --iters 2 --warmup 1";
    let (_, rows) = run_ok(line, &["--schedule-csv", csv.to_str().unwrap()], &d);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].schedule, "csv:mine.csv");
    assert!(rows[0].grad_max_err.is_nan() && rows[0].bubble_formula.is_nan());
}

#[test]
fn tcp_ranks_as_processes_match_the_gradients_too() {
    let d = tmp("tcp");
    let line =
        format!("-v --backend tcp --stages 2 --microbatches 2 --schedule 1f1b,zb-h1 {SMALL_STEP}");
    let (out, rows) = run_ok(&line, &[], &d);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r.backend, "tcp");
        assert!(r.grad_max_err < 1e-5, "{}: {}", r.schedule, r.grad_max_err);
        check_time_split(&d, r);
        // Processes estimate their offsets: a bound above zero, below a second.
        assert!(
            r.clock_uncertainty_us > 0.0 && r.clock_uncertainty_us < 1e6,
            "{}",
            r.clock_uncertainty_us
        );
    }
    let runs = read_runs(&d).unwrap();
    check_time_base(&runs[0], "ping-pong", 2);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("offsets to rank 0 estimated and applied"),
        "{stdout}"
    );
}

/// A row's waiting and transfer, and its trace: waits and transfers as
/// slices of their own, a flow from each send to its receive, the clocks
/// in the metadata.
fn check_time_split(d: &std::path::Path, r: &PipelineRow) {
    assert!(r.wait_us >= 0.0 && r.transfer_us >= 0.0, "{}", r.schedule);
    // Both are parts of the idle time (per rank there, summed here).
    let idle = r.idle_us * r.stages as f64;
    assert!(
        r.wait_us + r.transfer_us <= idle * (1.0 + 1e-9),
        "{}",
        r.schedule
    );
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join(&r.timeline)).unwrap()).unwrap();
    let ev = trace["traceEvents"].as_array().unwrap();
    let count = |ph: &str| ev.iter().filter(|e| e["ph"] == ph).count();
    // One flow per message: every send has its receive.
    assert!(count("s") > 0 && count("s") == count("f"), "{}", r.schedule);
    // Each action's waiting and transfer (its args) has its own slice when
    // it lasts a microsecond or more.
    let mut received = 0.0;
    for a in ev
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["wait_us"].is_f64())
    {
        let name = a["name"].as_str().unwrap();
        received += a["args"]["recv_us"].as_f64().unwrap();
        for part in ["wait", "transfer"] {
            if a["args"][format!("{part}_us")].as_f64().unwrap() >= 1.0 {
                let slice = format!("{part} {name}");
                assert!(
                    ev.iter().any(|e| e["name"] == slice.as_str()),
                    "{}: no slice {slice}",
                    r.schedule
                );
            }
        }
    }
    assert!(received > 0.0, "{}: nothing was ever received", r.schedule);
    let clock = trace["otherData"]["clock"].as_array().unwrap();
    assert_eq!(clock.len(), r.stages);
}

/// run.json records how the ranks shared a clock, and each run's offsets.
fn check_time_base(meta: &parbench::results::RunMeta, base: &str, runs: usize) {
    let tb = &meta.extra["time_base"];
    assert!(tb["base"].as_str().unwrap().contains(base), "{tb}");
    let recorded = tb["runs"].as_array().unwrap();
    assert_eq!(recorded.len(), runs);
    for run in recorded {
        for rank in run["ranks"].as_array().unwrap() {
            assert!(rank["offset_us"].as_f64().unwrap().is_finite());
            assert!(rank["uncertainty_us"].as_f64().unwrap() >= 0.0);
        }
    }
}

/// Exit 2 within 30 s, one line containing every string of `want`, no
/// pipeline.csv.
fn refused_in_one_line(args: &[&str], want: &[&str]) {
    binary::refused_in_one_line(bin(), args, want, "pipeline.csv");
}

#[test]
fn counts_past_their_stated_limits_are_refused() {
    // Was unbounded; 100000 stages ran 30 s with no output.
    refused_in_one_line(&["--microbatches", "10000000"], &["10000000", "at most"]);
    refused_in_one_line(&["--stages", "100000"], &["100000", "at most"]);
    // Was: an allocator's abort (rc 134), and a capacity-overflow panic.
    for n in ["99999999999", "18446744073709551615"] {
        refused_in_one_line(&["--iters", n], &[n, "at most 1000000"]);
        refused_in_one_line(&["--warmup", n], &[n, "at most 1000000"]);
        refused_in_one_line(
            &["--backend", "tcp", "-np", "2", "--iters", n],
            &[n, "at most"],
        );
    }
}

#[test]
fn a_sleep_past_the_timeout_is_refused_on_every_backend() {
    // Was a hang on local: a stuck stage was not ended by --timeout.
    for backend in ["local", "tcp"] {
        refused_in_one_line(
            &[
                "--backend",
                backend,
                "--work",
                "sleep:999999999999999",
                "--timeout",
                "5",
            ],
            &["--work sleep:999999999999999", "--timeout 5"],
        );
    }
}

#[test]
fn schedule_csv_indices_past_the_limits_name_file_line_and_cell() {
    // Was: a panic (index out of bounds), a 64 GB allocation and abort,
    // and "no stages or no microbatches".
    let d = tmp("csv-limits");
    for (i, text, cell) in [
        (1, "0F0,0B0\n18446744073709551615F0\n", "line 2, cell 1"),
        (2, "4000000000F0,4000000000B0\n", "line 1, cell 1"),
        (3, "0F0,0F18446744073709551615\n", "line 1, cell 2"),
    ] {
        let csv = d.join(format!("s{i}.csv"));
        std::fs::write(&csv, text).unwrap();
        let name = csv.to_str().unwrap();
        refused_in_one_line(&["--schedule-csv", name], &[name, cell, "at most"]);
    }
    // Was: a legal 10,000-row chain asked for 25.6 GB.
    let chain = d.join("chain.csv");
    let rows: Vec<String> = (0..10_000).map(|s| format!("{s}F0,{s}B0")).collect();
    std::fs::write(&chain, rows.join("\n")).unwrap();
    let name = chain.to_str().unwrap();
    refused_in_one_line(
        &["--schedule-csv", name],
        &[name, "line 257", "at most 256"],
    );
}

#[test]
fn schedule_files_are_regular_and_bounded_before_they_are_read() {
    // Was: /dev/zero grew to 3 GB in 6 s; a FIFO blocked; a 50 MB file was
    // read whole before it was refused.
    let d = tmp("csv-files");
    let fifo = d.join("fifo.csv");
    binary::mkfifo(&fifo);
    let big = d.join("big.csv");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(50 << 20)
        .unwrap();
    for (name, says) in [
        ("/dev/zero", "a device"),
        ("/dev/urandom", "a device"),
        (fifo.to_str().unwrap(), "a FIFO"),
        (big.to_str().unwrap(), "larger than the 16.0 MiB"),
    ] {
        refused_in_one_line(&["--schedule-csv", name], &[name, says]);
    }
}

#[test]
fn echoed_cells_and_arguments_are_escaped_and_cut() {
    // Was: a cell's escape sequences and NUL echoed raw in "invalid action
    // '...'", and a 100 KB argument echoed as one 100 KB line.
    let d = tmp("csv-escapes");
    let csv = d.join("esc.csv");
    std::fs::write(&csv, b"0F0,\x1b[2J\x1b]0;pwned\x07\0\n").unwrap();
    let o = run(&[
        "--schedule-csv",
        csv.to_str().unwrap(),
        "--out",
        d.to_str().unwrap(),
    ]);
    binary::assert_refused(&o, "escape cell", &["invalid action", "\\u{1b}[2J"]);
    assert!(
        !o.stderr.iter().any(|&b| b < 0x20 && b != b'\n'),
        "{:?}",
        o.stderr
    );
    let long = "7".repeat(100_000);
    let o = run(&["--stages", &long]);
    binary::assert_refused(&o, "100 KB argument", &["more characters"]);
    assert!(o.stderr.len() < 1000, "{} bytes", o.stderr.len());
}

#[test]
fn one_rule_per_flag() {
    // Was: --threads 0 silently became 1 (--timeout 0 is the longest now, as in nccl-tests).
    refused_in_one_line(&["--timeout", "-1"], &["--timeout -1"]);
    refused_in_one_line(&["--threads", "0"], &["--threads 0"]);
    // Was "unexpected argument '-2' found", without the flag.
    refused_in_one_line(&["--stages", "-2"], &["--stages", "-2"]);
    refused_in_one_line(
        &["--stages", "2", "--stages", "3"],
        &["--stages", "multiple"],
    );
    refused_in_one_line(&["--out", "/proc/x"], &["--out /proc/x", "os error"]);
}

#[test]
fn sigint_keeps_the_schedules_already_measured() {
    // Rows are appended as each schedule and microbatch count ends; a
    // signal records the run as cut short and loses none of them.
    let d = tmp("sigint");
    let child = bin()
        .args([
            "--backend",
            "local",
            "--work",
            "sleep:2000",
            "--microbatches",
            "1,2,4,8,16,32",
            "--iters",
            "3",
            "--warmup",
            "0",
            "--out",
            d.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (before, o) = binary::signal_after_rows(child, &d.join("pipeline.csv"), 1, libc::SIGINT);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    let kept: Vec<PipelineRow> = read_rows(&d.join("pipeline.csv")).unwrap();
    // 3 schedules x 6 microbatch counts would be 18 rows (and more).
    assert!(
        kept.len() >= before && kept.len() < 18,
        "{before} then {}",
        kept.len()
    );
    let runs = read_runs(&d).unwrap();
    assert!(
        runs.last()
            .and_then(|r| r.cut_short.as_deref())
            .is_some_and(|w| w.contains("SIGINT")),
        "{err}"
    );
}

#[test]
fn n_w_np_mean_iterations_warm_up_ranks_and_a_closed_pipe_ends_quietly() {
    let dir = tmp("n-w-np");
    let mut cmd = bin();
    cmd.args([
        "--schedule",
        "gpipe",
        "--microbatches",
        "2",
        "--stages",
        "2",
        "--work",
        "sleep:50",
        "-n",
        "3",
        "-w",
        "1",
        "--out",
    ])
    .arg(&dir);
    let out = parbench::term::run_with_closed_stdout(cmd).unwrap();
    parbench::term::ended_quietly(&out).unwrap();
    let csv = std::fs::read_to_string(dir.join("pipeline.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = header
        .iter()
        .position(|h| *h == "steps")
        .expect("a steps column");
    for r in lines {
        assert_eq!(r.split(',').nth(at), Some("3"), "{r}");
    }
}

#[test]
fn a_full_disk_is_an_error_of_the_records_said_once() {
    // Issue 52: "rank 0: setup failed: ...: No space left on device (os
    // error 28): No space left on device (os error 28)". Needs a small
    // tmpfs (root); skips without one.
    let d = tmp("full");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=12k", "tmpfs"])
        .arg(&d)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a small tmpfs here (needs root)");
        return;
    }
    let out = d.join("out");
    let mut args: Vec<&str> = "--backend local --stages 2 --microbatches 4"
        .split_whitespace()
        .chain(SMALL_STEP.split_whitespace())
        .collect();
    args.extend(["--out", out.to_str().unwrap()]);
    let o = run(&args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let runs = read_runs(&out);
    let _ = Command::new("umount").arg(&d).status();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("No space left").count(), 1, "once: {err}");
    assert!(!err.contains("setup failed"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_eq!(runs.unwrap().len(), 1, "run.json kept");
}

#[test]
fn rank_0_killed_outright_is_recorded_by_its_launcher() {
    // Issue 52: a rank 0 killed by SIGKILL could not record its end, and
    // run.json kept "not recorded as ended"; the launcher saw it die.
    let d = tmp("rank0-sigkill");
    let child = bin()
        .args(["--backend", "tcp", "-np", "2", "--stages", "2"])
        .args(["--work", "sleep:2000", "--microbatches", "8"])
        .args(["--iters", "1000", "--warmup", "0", "--timeout", "30"])
        .args(["--out", d.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ranks = binary::ranks_of(child.id(), 2, 30);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while read_runs(&d).map_or(true, |r| r.is_empty()) {
        assert!(std::time::Instant::now() < deadline, "no run begun");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let rank0 = ranks.iter().find(|(r, _)| *r == 0).unwrap().1;
    // SAFETY: kill(2) of a rank of the job this test started.
    unsafe { libc::kill(rank0, libc::SIGKILL) };
    let o = binary::finish_within(child, 60);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    let runs = read_runs(&d).unwrap();
    assert_eq!(runs.len(), 1, "one run, under the launcher's id: {runs:?}");
    let why = runs[0].cut_short.clone().unwrap_or_default();
    assert!(
        why.contains("rank 0 was killed by signal 9 (SIGKILL)") && why.contains("launcher"),
        "{why}\n{err}"
    );
}
