//! The binary end to end: bad flags exit 2 with one line; a tiny sweep
//! writes layers.csv with exactly the columns docs/records.md documents.

#[path = "../../test-support/binary.rs"]
mod binary;

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench-layers"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bench-layers-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs a tiny sweep with `args` into `out_dir`, asserts it succeeded, and
/// returns its standard output.
fn run_ok(args: &[&str], out_dir: &Path) -> String {
    let out = bin()
        .args(TINY)
        .args(args)
        .arg("--out")
        .arg(out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Small enough for a debug build on two cores.
const TINY: [&str; 12] = [
    "--hidden", "32", "--heads", "4", "--ffn", "64", "--seq", "8", "--iters", "2", "--warmup", "1",
];

#[test]
fn bad_flags_exit_2_with_one_line() {
    for args in [
        &["--tp", "3", "--heads", "4"][..],
        &["--mode", "sideways"][..],
        &["--mode", "decode", "--mode", "train"][..],
        &["--preset", "nope"][..],
        &["--link", "fast"][..],
        &["--no-such-flag"][..],
        &["--tp", "0"][..],
        &["--experts", "6", "--ep", "4"][..],
        &["--experts", "8", "--topk", "9"][..],
        &["--topk", "2"][..],
        &["--experts", "8", "--tp", "3"][..],
        &["--etp", "2"][..],
        &["--experts", "8", "--expert-ffn", "48", "--etp", "5"][..],
        &["--experts", "8", "--ep", "4", "--etp", "4", "--seq", "8"][..],
    ] {
        let out = bin().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.trim().is_empty(), "{args:?}: no message");
        if !args.contains(&"--no-such-flag") {
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        }
    }
}

/// `--dtype fp8` on the CPU backends: refused by name before anything is
/// measured (nothing written), in each spelling.
#[test]
fn fp8_on_the_cpu_is_one_line_exit_2() {
    let out_dir = std::env::temp_dir().join(format!("parbench-layers-fp8-{}", std::process::id()));
    for args in [
        &["--dtype", "fp8"][..],
        &["--dtype", "f8e4m3", "--backend", "local"][..],
        &["--dtype", "FP8", "--backend", "tcp", "-np", "2"][..],
    ] {
        let out = bin()
            .args(args)
            .arg("--out")
            .arg(&out_dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("fp8 GEMMs need a GPU of sm_89 or newer"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?} printed a table");
    }
    assert!(
        !out_dir.exists(),
        "a refused run wrote {}",
        out_dir.display()
    );
}

/// The column names of docs/records.md's layers.csv table (up to the next heading).
fn documented_columns() -> Vec<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/records.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let section = text.split("### layers.csv").nth(1).unwrap();
    let table = section.split("\n#").next().unwrap();
    table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn a_tiny_sweep_writes_the_documented_columns() {
    let out_dir = scratch("e2e");
    let args = ["--mode", "train", "--sequence-parallel", "--tp", "1,2"];
    let stdout = run_ok(&args, &out_dir);
    let (header, rows) = binary::read_csv(&out_dir.join("layers.csv"));
    assert_eq!(header, documented_columns());
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["tp"], "2");
    assert_eq!(rows[1]["calls_per_block"], "8");
    assert_eq!(rows[1]["bytes_per_call"], (8 * 32 * 4).to_string());
    let err: f64 = rows[1]["check_max_err"].parse().unwrap();
    assert!(err < 1e-4, "{err}");
    let speedup: f64 = rows[0]["speedup"].parse().unwrap();
    assert_eq!(speedup, 1.0);
    // The wait before the collectives is timed apart from them, and the
    // three parts make the total.
    for r in &rows {
        let f = |c: &str| -> f64 { r[c].parse().unwrap() };
        let parts = f("compute_us") + f("comm_us") + f("wait_us");
        assert!(f("wait_us") >= 0.0, "{r:?}");
        assert!(
            (parts - f("total_us")).abs() <= 1e-6 * f("total_us"),
            "{r:?}"
        );
    }
    assert_eq!(
        rows[0]["wait_us"].parse::<f64>().unwrap(),
        0.0,
        "no collective at tp 1"
    );
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("run.json")).unwrap()).unwrap();
    // The machine's compute speed, timed when the run began and after each
    // of its two degrees.
    let reference = &runs[0]["extra"]["compute_reference"];
    let samples = reference["samples_us"].as_array().unwrap();
    assert_eq!(samples.len(), 3, "{reference}");
    assert!(
        samples.iter().all(|s| s.as_f64().unwrap() > 0.0),
        "{reference}"
    );
    assert!(reference["kernel"]
        .as_str()
        .unwrap()
        .contains("512x512x512"));
    assert!(stdout.contains("compute_us"));
    assert!(
        stdout.contains("# compute reference: gemm crate f32"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn tcp_spawns_each_degree_and_collects_its_row() {
    let out_dir = scratch("tcp");
    run_ok(
        &[
            "--backend",
            "tcp",
            "--tp",
            "1,2",
            "--mode",
            "decode",
            "--microbatch-size",
            "2",
        ],
        &out_dir,
    );
    let csv = std::fs::read_to_string(out_dir.join("layers.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    assert!(
        lines[2].contains(",tcp,") && lines[2].contains(",true,"),
        "{}",
        lines[2]
    );
    let runs = std::fs::read_to_string(out_dir.join("run.json")).unwrap();
    assert_eq!(
        runs.matches("\"run_id\"").count(),
        1,
        "one run recorded by the launcher: {runs}"
    );
    assert!(runs.contains("\"compute_reference\""), "{runs}");
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// `--cp` on tcp: each degree's ranks are processes, the ring's transfers
/// cross sockets, and the output (in train its gradients too) matches the
/// unsharded attention.
#[test]
fn cp_on_tcp_matches_the_unsharded_attention() {
    for (method, mode) in [("p2p", "train"), ("a2a", "prefill")] {
        let out_dir = scratch(&format!("cp-tcp-{method}"));
        let args = [
            "--backend",
            "tcp",
            "--cp",
            "1,2",
            "--cp-comm-type",
            method,
            "--mode",
            mode,
        ];
        let stdout = run_ok(&args, &out_dir);
        assert!(stdout.contains("cp attention"), "{stdout}");
        let (_, rows) = binary::read_csv(&out_dir.join("layers_cp.csv"));
        assert_eq!(rows.len(), 2);
        let r = &rows[1];
        assert_eq!((r["cp"].as_str(), r["backend"].as_str()), ("2", "tcp"));
        assert_eq!(r["method"], method);
        let want = if mode == "train" { "train" } else { "forward" };
        assert_eq!((r["mode"].as_str(), r["tp"].as_str()), (want, "1"));
        assert_eq!(
            r["overlapped"],
            if method == "p2p" { "true" } else { "false" }
        );
        let err: f64 = r["check_max_err"].parse().unwrap();
        assert!(err < 1e-4, "{err}");
        let _ = std::fs::remove_dir_all(&out_dir);
    }
}

/// `--cp 2 --tp 2 --mode train` on local threads: each degree on tp x cp
/// ranks, the gradients checked, the row saying tp 2.
#[test]
fn cp_with_tp_trains_on_tp_times_cp_ranks() {
    let out_dir = scratch("cp-tp");
    let args = [
        "--backend",
        "local",
        "--cp",
        "1,2",
        "--tp",
        "2",
        "--cp-comm-type",
        "all_gather",
        "--mode",
        "train",
        "--attn-mask",
        "none",
    ];
    let stdout = run_ok(&args, &out_dir);
    assert!(stdout.contains("heads over tp 2"), "{stdout}");
    assert!(stdout.contains("forward + backward"), "{stdout}");
    let (_, rows) = binary::read_csv(&out_dir.join("layers_cp.csv"));
    assert_eq!(rows.len(), 2);
    for (r, cp) in rows.iter().zip(["1", "2"]) {
        assert_eq!((r["cp"].as_str(), r["tp"].as_str()), (cp, "2"));
        assert_eq!(
            (r["mode"].as_str(), r["causal"].as_str()),
            ("train", "false")
        );
        let err: f64 = r["check_max_err"].parse().unwrap();
        assert!(err < 1e-4, "{err}");
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// The MoE block at EP 1, 2 and 4 (train, a shared expert) on local
/// threads and at EP 1 and 2 on tcp processes: a row per degree, checked,
/// kept in run.json.
#[test]
fn moe_sweeps_each_expert_parallel_degree_on_local_and_tcp() {
    for (backend, eps, n) in [("local", "1,2,4", 3), ("tcp", "1,2", 2)] {
        let out_dir = scratch(&format!("moe-{backend}"));
        let stdout = run_ok(
            &[
                "--backend",
                backend,
                "--experts",
                "4",
                "--topk",
                "2",
                "--shared-experts",
                "1",
                "--expert-ffn",
                "32",
                "--mode",
                "train",
                "--ep",
                eps,
            ],
            &out_dir,
        );
        assert!(stdout.contains(&format!("{backend} train MoE")), "{stdout}");
        let held = stdout.matches("check held within 1e-4").count();
        assert_eq!(held, n, "{stdout}");
        let runs = std::fs::read_to_string(out_dir.join("run.json")).unwrap();
        assert!(runs.contains("\"moe_rows\""), "{runs}");
        assert_eq!(runs.matches("\"a2a_us\"").count(), n, "{runs}");
        let _ = std::fs::remove_dir_all(&out_dir);
    }
}

/// Expert tensor parallelism beside expert parallelism, and the attention
/// before the MoE layer tensor-parallel over the same ranks: EP 2 x ETP 2
/// with TP 4 on local threads, EP 1 x ETP 2 and EP 2 with TP 2 on tcp
/// processes (train, a shared expert), each checked and kept in run.json.
#[test]
fn moe_runs_expert_and_attention_tensor_parallel_layouts_on_local_and_tcp() {
    for (backend, layout, name) in [
        (
            "local",
            &["--ep", "2", "--etp", "2", "--tp", "4"][..],
            "ep 2 etp 2 tp 4",
        ),
        ("tcp", &["--ep", "1", "--etp", "2"][..], "ep 1 etp 2"),
        ("tcp", &["--ep", "2", "--tp", "2"][..], "ep 2 etp 1 tp 2"),
    ] {
        let out_dir = scratch(&format!("moe-etp-{backend}-{}", layout.len()));
        let mut args = vec![
            "--backend",
            backend,
            "--experts",
            "4",
            "--shared-experts",
            "1",
            "--expert-ffn",
            "32",
            "--mode",
            "train",
        ];
        args.extend_from_slice(layout);
        let stdout = run_ok(&args, &out_dir);
        assert!(
            stdout.contains(&format!("# {name}: check held within 1e-4")),
            "{stdout}"
        );
        let runs = std::fs::read_to_string(out_dir.join("run.json")).unwrap();
        assert!(
            runs.contains("\"etp_us\"") && runs.contains("\"tp_us\""),
            "{runs}"
        );
        let _ = std::fs::remove_dir_all(&out_dir);
    }
}

#[test]
fn cp_values_that_do_not_split_are_one_line_exit_2() {
    refused_in_one_line(&["--cp", "4", "--seq", "12"], &["--cp 4", "seq 12"]);
    refused_in_one_line(
        &[
            "--cp",
            "4",
            "--heads",
            "6",
            "--hidden",
            "96",
            "--cp-comm-type",
            "a2a",
        ],
        &["--cp 4", "heads 6"],
    );
    refused_in_one_line(&["--cp", "2", "--cp-comm-type", "ring"], &["ring"]);
    refused_in_one_line(&["--cp", "2", "--tp", "3"], &["--tp 3 --cp 2", "heads"]);
    refused_in_one_line(&["--cp", "2", "--tp", "1,2"], &["--tp", "one degree"]);
    refused_in_one_line(&["--cp", "2", "--mode", "decode"], &["--mode decode"]);
    refused_in_one_line(
        &["--cp", "2", "--attn-mask", "window"],
        &["--attn-mask window"],
    );
    refused_in_one_line(&["--cp", "2", "--experts", "4"], &["--cp", "--experts"]);
}

/// Exit 2 within 30 s, one line containing every string of `want`, no
/// layers.csv.
fn refused_in_one_line(args: &[&str], want: &[&str]) {
    let mut cmd = bin();
    cmd.args(["--backend", "local"]);
    binary::refused_in_one_line(cmd, args, want, "layers.csv");
}

#[test]
fn hostile_input_is_refused_before_anything_runs() {
    // Was an abort (memory allocation failed).
    refused_in_one_line(
        &["--hidden", "100000000", "--ffn", "400000000"],
        &["--hidden", "MemAvailable"],
    );
    // Was found only after the whole sweep, the OS error printed twice.
    let d = scratch("out-is-a-file");
    std::fs::create_dir_all(&d).unwrap();
    let file = d.join("f");
    std::fs::write(&file, "x").unwrap();
    for (out, says) in [
        ("/proc/x", "os error"),
        (file.to_str().unwrap(), "not a folder"),
    ] {
        let mut v: Vec<&str> = TINY.to_vec();
        v.extend_from_slice(&["--out", out]);
        refused_in_one_line(&v, &["--out", says]);
    }
    // One rule per flag: zero, negative, twice.
    refused_in_one_line(&["--timeout", "-1"], &["--timeout -1"]);
    refused_in_one_line(&["--hidden", "-3"], &["--hidden", "-3"]);
    refused_in_one_line(&["--iters", "2", "--iters", "3"], &["--iters", "multiple"]);
    refused_in_one_line(&["--nprocs", "0"], &["--nprocs 0"]);
    refused_in_one_line(&["--iters", "0"], &["--iters 0"]);
    // Was: accepted, and run until killed.
    refused_in_one_line(&["-n", "99999999999"], &["99999999999", "at most 1000000"]);
    refused_in_one_line(&["-w", "99999999999"], &["99999999999", "at most 1000000"]);
}

#[test]
fn sigint_keeps_the_degrees_already_measured() {
    // Was: rows were written only after the last degree.
    let dir = scratch("sigint");
    let mut v: Vec<&str> = vec!["--backend", "local", "--nprocs", "2"];
    v.extend_from_slice(&TINY[..8]);
    // Long enough that the signal lands while the second degree runs: the
    // repeated degrees run once each, and at 400 iterations the two took
    // 30 ms on the Intel Xeon VM, less than the poll and the signal (the
    // run ended first in 2 of 16 tries).
    v.extend_from_slice(&["--iters", "10000", "--warmup", "0", "--no-check"]);
    let tps = "1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2";
    v.extend_from_slice(&["--tp", tps, "--out", dir.to_str().unwrap()]);
    let child = bin()
        .args(&v)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let layers_csv = dir.join("layers.csv");
    let (before, o) = binary::signal_after_rows(child, &layers_csv, 1, libc::SIGINT);
    // Was: the table was printed only after the last degree, so a signal
    // left stdout (a file, a pipe) without it.
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("# tp  compute_us"), "no table: {out}");
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let after = binary::data_rows(&layers_csv);
    assert!(after >= before && after < 20, "{before} rows, then {after}");
    let json = std::fs::read_to_string(dir.join("run.json")).unwrap();
    assert!(json.contains("interrupted by SIGINT"), "{json}");
}

#[test]
fn n_is_iterations_and_a_closed_pipe_ends_quietly() {
    let dir = scratch("n-iters");
    let mut cmd = bin();
    cmd.args([
        "--hidden", "32", "--heads", "4", "--ffn", "64", "--seq", "8", "-n", "3", "-w", "1",
        "--tp", "1,2", "-np", "2", "--out",
    ])
    .arg(&dir);
    let out = parbench::term::run_with_closed_stdout(cmd).unwrap();
    parbench::term::ended_quietly(&out).unwrap();
    // -n 3 ran 3 timed iterations per degree (the records say so).
    let csv = std::fs::read_to_string(dir.join("layers.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = header.iter().position(|h| *h == "iters").unwrap();
    let rows: Vec<&str> = lines.collect();
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!(r.split(',').nth(at), Some("3"), "{r}");
    }
}

/// A link far from the wire's (`--link`, slower or faster by orders of
/// magnitude) prices the block's collectives far from what they took: the
/// model is held to the measurement and a WARNING names the degree; in a
/// noisy run one line says the model was not held instead.
#[test]
fn a_far_off_link_is_warned_about() {
    for link in ["0.001,5000", "1000000,0.0001"] {
        let out_dir = scratch(&format!("far-link-{}", link.len()));
        let stdout = run_ok(&["--tp", "1,2", "--link", link], &out_dir);
        // A long comment continues on "#   " lines: each joined to its first.
        let stdout = stdout.replace("\n#   ", " ");
        let warned = stdout
            .lines()
            .any(|l| l.starts_with("# tp 2: WARNING: the model's communication"));
        let noisy = stdout
            .lines()
            .any(|l| l.starts_with("# WARNING: a noisy run") && l.contains("not held"));
        assert!(warned != noisy, "--link {link}: one of the two:\n{stdout}");
        assert!(
            stdout.contains("given with --link"),
            "--link {link}: the link's source:\n{stdout}"
        );
        let _ = std::fs::remove_dir_all(&out_dir);
    }
}
