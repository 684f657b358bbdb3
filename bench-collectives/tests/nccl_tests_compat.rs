//! What nccl-tests users' scripts and tools expect: `--format nccl-tests`
//! read by fixed field positions, `-J` read the way nccl-tests'
//! `tools/analyze_perf_json.py` reads it, `links` naming its pairs, and a
//! closed pipe ending the run quietly.

mod common;
use common::*;
use std::collections::HashMap;
use std::process::Command;

/// A parser written the way nccl-tests users parse its output: skip `#`
/// lines, split on whitespace, take fields by position (awk's $1..$13).
struct NcclTestsLine {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    root: i64,
    oop: [f64; 4],
    ip: [f64; 4],
}

fn parse_nccl_tests(text: &str) -> (Vec<NcclTestsLine>, Option<(u64, String)>, Option<f64>) {
    let mut rows = Vec::new();
    let (mut oob, mut avg) = (None, None);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# Out of bounds values : ") {
            let mut f = rest.split_whitespace();
            oob = Some((
                f.next().unwrap().parse().unwrap(),
                f.next().unwrap().to_string(),
            ));
        }
        if let Some(rest) = line.strip_prefix("# Avg bus bandwidth    : ") {
            avg = Some(rest.trim().parse().unwrap());
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 13, "13 fields: {line:?}");
        let num = |i: usize| {
            f[i].parse::<f64>()
                .unwrap_or_else(|_| panic!("field {i} of {line:?}"))
        };
        rows.push(NcclTestsLine {
            size: f[0].parse().unwrap(),
            count: f[1].parse().unwrap(),
            dtype: f[2].into(),
            redop: f[3].into(),
            root: f[4].parse().unwrap(),
            oop: [num(5), num(6), num(7), num(8)],
            ip: [num(9), num(10), num(11), num(12)],
        });
    }
    (rows, oob, avg)
}

/// The printed figure is the record's, to the two decimals printed.
fn close(printed: f64, record: &str) {
    let r: f64 = record.parse().unwrap();
    assert!(
        (printed - r).abs() <= 0.005 + 1e-9 * r.abs().max(1.0)
            || (printed - r).abs() / r.abs() < 1e-3,
        "{printed} vs {r}"
    );
}

#[test]
fn nccl_tests_format_reads_by_field_position_and_matches_the_records() {
    let dir = scratch("nccl-format");
    let json = dir.join("run.nccl.json");
    let mut args =
        flags("all_reduce --backend local -np 2 -b 8 -e 64K -n 3 -w 1 --format nccl-tests");
    args.extend(["--out", dir.to_str().unwrap(), "-J", json.to_str().unwrap()]);
    let o = run(&args, &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    // Rows and the column headers fit 132 columns (comment lines, as nccl-tests' own, may not).
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') || l.contains("(elements)") || l.contains("#wrong"))
    {
        assert!(line.len() <= 132, "{} chars: {line}", line.len());
    }
    assert!(text.contains("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong"), "{text}");
    let (rows, oob, avg) = parse_nccl_tests(&text);
    let (_, recs) = read_csv(&dir.join("collectives.csv"));
    assert_eq!(
        rows.len() * 2,
        recs.len(),
        "one printed line per out-of-place and in-place record pair"
    );
    let find = |bytes: u64, in_place: bool| -> &HashMap<String, String> {
        recs.iter()
            .find(|r| r["bytes"] == bytes.to_string() && r["in_place"] == in_place.to_string())
            .unwrap_or_else(|| panic!("no record for {bytes} B"))
    };
    let mut busbw = Vec::new();
    for l in &rows {
        assert_eq!(
            (l.dtype.as_str(), l.redop.as_str(), l.root),
            ("float", "sum", -1)
        );
        assert_eq!(l.count * 4, l.size);
        for (fig, in_place) in [(l.oop, false), (l.ip, true)] {
            let r = find(l.size, in_place);
            close(fig[0], &r["time_us"]);
            close(fig[1], &r["algbw_gbps"]);
            close(fig[2], &r["busbw_gbps"]);
            assert_eq!(fig[3], r["wrong"].parse::<f64>().unwrap());
            busbw.push(fig[2]);
        }
    }
    assert_eq!(oob, Some((0, "OK".to_string())));
    // nccl-tests' mean over every printed busbw (of the unrounded figures).
    let mean_records: f64 = recs
        .iter()
        .map(|r| r["busbw_gbps"].parse::<f64>().unwrap())
        .sum::<f64>()
        / recs.len() as f64;
    let avg = avg.expect("an Avg bus bandwidth line");
    assert!(
        (avg - mean_records).abs() <= 1e-5 * mean_records.max(1e-3),
        "{avg} vs {mean_records}"
    );

    // -J, read the way analyze_perf_json.py reads it.
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["version"], 3);
    assert_eq!(doc["config"]["iterations"], 3);
    assert_eq!(doc["config"]["aggregated_iterations"], 1);
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), rows.len());
    for (r, l) in results.iter().zip(&rows) {
        assert_eq!(r["size"], l.size);
        for (key, in_place) in [("out_of_place", false), ("in_place", true)] {
            let rec = find(l.size, in_place);
            let b: f64 = rec["busbw_gbps"].parse().unwrap();
            assert!((r[key]["bus_bw"].as_f64().unwrap() - b).abs() < 1e-9 * b.max(1.0));
            let per = &r[format!("{key}_per_iter")];
            for k in [
                "avg_us", "min_us", "max_us", "p99_us", "cv_pct", "p50_us", "p95_us", "stdev_us",
            ] {
                assert!(per[k].is_number(), "{key}_per_iter.{k}: {per}");
            }
            let times = per["times_us"].as_array().unwrap();
            assert_eq!(times.len(), 3);
            let max = times
                .iter()
                .map(|t| t.as_f64().unwrap())
                .fold(0.0, f64::max);
            assert_eq!(per["max_us"].as_f64().unwrap(), max);
            assert!(per["min_us"].as_f64().unwrap() <= per["avg_us"].as_f64().unwrap());
        }
    }
    assert_eq!(doc["out_of_bounds"]["count"], 0);
    let jb = doc["average_bus_bandwidth"]["bandwidth"].as_f64().unwrap();
    assert!((jb - mean_records).abs() <= 1e-9 * mean_records.max(1.0));
    // nccl-tests' own reader, when this machine has it (set NCCL_TESTS_ANALYZE to its path).
    if let Ok(script) = std::env::var("NCCL_TESTS_ANALYZE") {
        let a = Command::new("python3")
            .arg(&script)
            .arg(&json)
            .arg("--all")
            .output()
            .unwrap();
        assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    }
}

#[test]
fn links_names_every_ordered_pair_in_matrices_and_records() {
    let dir = scratch("links-local");
    let mut args = flags("links --backend local -np 3 -e 64K -n 3 -w 1");
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = run(&args, &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    for title in [
        "# Latency, us",
        "# One-way bandwidth, GB/s",
        "# Both directions at once",
    ] {
        assert!(text.contains(title), "{text}");
    }
    let (_, rows) = read_csv(&dir.join("links.csv"));
    let mut pairs: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r["from"].clone(), r["to"].clone()))
        .collect();
    pairs.sort();
    let want: Vec<(String, String)> = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(pairs, want);
    for r in &rows {
        for k in ["latency_us", "one_way_gbps", "both_ways_gbps"] {
            let v: f64 = r[k].parse().unwrap();
            assert!(v.is_finite() && v > 0.0, "{k} = {v}");
        }
        assert_eq!(r["bytes"], "65536");
    }
    let runs = std::fs::read_to_string(dir.join("run.json")).unwrap();
    assert!(
        runs.contains("\"links\"") && runs.contains("median_one_way_gbps"),
        "{runs}"
    );
}

#[test]
fn flags_a_backend_cannot_honour_are_one_line_and_exit_two() {
    for (args, says) in [
        (&["--backend", "local", "-np", "2", "-m", "4"][..], "-m 4"),
        (
            &["--backend", "local", "-np", "2", "-g", "2"],
            "GPUs per process",
        ),
        (&["--backend", "tcp", "-np", "2", "-G", "2"], "CUDA graphs"),
    ] {
        let o = run(args, &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn links_checks_its_output_folder_before_measuring() {
    // Was: every pair measured (minutes at 64 MiB), then the write failed.
    let dir = scratch("links-out-is-a-file");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("f");
    std::fs::write(&file, "x").unwrap();
    for backend in ["local", "tcp"] {
        let out = file.join("x");
        let args = ["links", "--backend", backend, "-np", "2", "-e", "64K"];
        let o = run(&with(&args, &["--out", out.to_str().unwrap()]), &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{backend}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{backend}: {err}");
        assert!(err.contains("--out"), "{backend}: {err}");
        assert!(
            !stdout(&o).contains("One-way bandwidth"),
            "{backend} measured"
        );
    }
}

/// Runs with standard output closed (as after `| head -1`) and checks
/// that the run ends without a panic.
fn ends_quietly_after_head_1(dir: &str, args: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench-collectives"));
    cmd.args([
        "--backend",
        "local",
        "-np",
        "2",
        "-e",
        "1K",
        "-n",
        "2",
        "-w",
        "1",
        "--out",
        dir,
    ])
    .args(args);
    let out = parbench::term::run_with_closed_stdout(cmd).unwrap();
    parbench::term::ended_quietly(&out).unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

#[test]
fn a_closed_pipe_ends_the_run_quietly() {
    let dir = scratch("closed-pipe");
    let d = dir.to_str().unwrap();
    ends_quietly_after_head_1(d, &[]);
    ends_quietly_after_head_1(d, &["--format", "nccl-tests"]);
    ends_quietly_after_head_1(d, &["links"]);
    // The records survive the closed pipe.
    assert!(dir.join("collectives.csv").exists() && dir.join("links.csv").exists());
}

#[test]
fn nccl_tests_flags_from_users_scripts_run_with_their_meaning() {
    // Azure's and FlagPerf's -g 1 (and -t 1), superbench's -G 0, -T 0,
    // -r -1 (every root), a decimal size, nccl-tests' long options, and
    // a flag given twice (the last wins).
    let dir = scratch("nccl-flags-run");
    let mut args = flags(
        "broadcast reduce --backend local -np 2 -g 1 -t 1 -G 0 -T 0 -r -1 -b 1.5K -n 1 -n 2 -w 0 --maxbytes 1.5K --datatype float --op sum --check 1 --format nccl-tests",
    );
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, recs) = read_csv(&dir.join("collectives.csv"));
    let roots: Vec<(&str, &str)> = recs
        .iter()
        .filter(|r| r["in_place"] == "false")
        .map(|r| (r["collective"].as_str(), r["root"].as_str()))
        .collect();
    assert_eq!(
        roots,
        [
            ("broadcast", "0"),
            ("broadcast", "1"),
            ("reduce", "0"),
            ("reduce", "1")
        ]
    );
    assert!(recs
        .iter()
        .all(|r| r["bytes"] == "1536" && r["iters"] == "2"));
}

#[test]
fn nccl_tests_newer_types_and_mulsum_reduce_exactly_over_tcp() {
    // int8, uint32, uint64, the fp8 pair and mulsum (NCCL's PreMulSum
    // with nccl-tests' scalar) over processes, every row checked bit-exact.
    let dir = scratch("nccl-types-tcp");
    let mut args = flags(
        "all_reduce reduce_scatter reduce --backend tcp -np 3 -r -1 -b 8 -e 4K -f 8 -n 1 -w 0 -d int8,uint32,uint64,f8e4m3,f8e5m2 -o mulsum,prod,avg --format nccl-tests",
    );
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = run(&args, &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    let (rows, oob, _) = parse_nccl_tests(&text);
    assert_eq!(oob, Some((0, "OK".to_string())), "{text}");
    let (_, recs) = read_csv(&dir.join("collectives.csv"));
    assert!(!recs.is_empty() && recs.iter().all(|r| r["wrong"] == "0"));
    for dtype in ["int8", "uint32", "uint64", "f8e4m3", "f8e5m2"] {
        for op in ["mulsum", "prod", "avg"] {
            assert!(
                rows.iter().any(|r| r.dtype == dtype && r.redop == op),
                "{dtype} {op} missing:\n{text}"
            );
        }
    }
}

#[test]
fn run_cycles_zero_runs_until_interrupted() {
    let dir = scratch("nccl-flags-n0");
    let mut args = flags("all_reduce --backend local -np 2 -b 8 -e 16 -n 1 -w 0 -N 0");
    args.extend(["--out", dir.to_str().unwrap()]);
    let child = start(&args);
    // Two sizes a cycle: 12 rows are three cycles.
    let (before, o) = signal_after_rows(child, &dir.join("collectives.csv"), 12, libc::SIGINT);
    assert!(before >= 12);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
}

#[test]
fn nccl_tests_flags_that_cannot_apply_are_refused_in_one_line() {
    for (args, says) in [
        (&["-C", "1"][..], "CPU time"),
        (&["-R", "1"], "register"),
        (&["-S", "1"], "timestamp"),
        (&["-M", "1"], "memory"),
        (&["-u", "1"], "misaligns"),
        (&["-p", "1"], "every thread"),
        (&["-y", "1"], "default stream"),
        (&["-x", "0"], "CTA policy"),
        (&["-D", "1"], "device API"),
        (&["-K", "2"], "first N iterations"),
        (&["-I", "2"], "expected 0 or 1"),
        (&["-t", "2"], "-np 2"),
        (&["-g", "2"], "-g 2"),
        (&["-d", "float8"], "f8e4m3"),
        (&["-o", "premul"], "mulsum"),
        (&["-z", "4"], "-z 4"),
    ] {
        let o = run(
            &with(&["--backend", "local", "-np", "2", "-e", "64"], args),
            &[],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} measured");
    }
}
