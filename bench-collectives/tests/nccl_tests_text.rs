//! `--format nccl-tests`, byte for byte: every line of each block is
//! recomputed here with nccl-tests' own printf formats (v2.19.6,
//! src/util.cu and src/common.cu), through the C library's `snprintf`,
//! from the records the run wrote (`collectives.csv`) and the flags it was
//! given, then compared with what the binary printed. One run per set of
//! flags, together covering every collective, dtype and operator, `-c 0`,
//! `-c 2`, `-N 2`, `-i`, `-f 4`, `-f 1`, a root, both placements, the tcp
//! backend's ranks in other processes, and `NCCL_TESTS_MIN_BW`.

mod common;
use common::*;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::raw::{c_char, c_int};

/// `snprintf` into a buffer of `cap` bytes: what C writes, and the length
/// it would have written.
fn c_fmt(cap: usize, f: impl FnOnce(*mut c_char, usize) -> c_int) -> (String, usize) {
    let mut buf = vec![0u8; cap.max(1)];
    let n = f(buf.as_mut_ptr().cast(), buf.len());
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    (
        String::from_utf8_lossy(&buf[..end]).into_owned(),
        n as usize,
    )
}

fn cs(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// nccl-tests' getFloatStr: `%*.2f`, `%*.1f`, `%*.0f`, then an exponent.
fn get_float_str(value: f64, width: usize) -> String {
    let w = width as c_int;
    for fmt in ["%*.2f", "%*.1f", "%*.0f"] {
        let f = cs(fmt);
        let (s, n) = c_fmt(width + 1, |b, l| unsafe {
            libc::snprintf(b, l, f.as_ptr(), w, value)
        });
        if n <= width {
            return s;
        }
    }
    let f = cs(if width >= 7 { "%*.1e" } else { "%*.0e" });
    c_fmt(width + 1, |b, l| unsafe {
        libc::snprintf(b, l, f.as_ptr(), w, value)
    })
    .0
}

/// writeBenchmarkLinePreamble: `%12li  %12li  %8s  %6s  %6s` with the root
/// as `%6i` text.
fn preamble(size: i64, count: i64, dtype: &str, op: &str, root: c_int) -> String {
    let rf = cs("%6i");
    let (root, _) = c_fmt(100, |b, l| unsafe {
        libc::snprintf(b, l, rf.as_ptr(), root)
    });
    let (f, t, o, r) = (
        cs("%12li  %12li  %8s  %6s  %6s"),
        cs(dtype),
        cs(op),
        cs(&root),
    );
    c_fmt(512, |b, l| unsafe {
        libc::snprintf(
            b,
            l,
            f.as_ptr(),
            size as libc::c_long,
            count as libc::c_long,
            t.as_ptr(),
            o.as_ptr(),
            r.as_ptr(),
        )
    })
    .0
}

/// writeBenchmarkLineBody.
fn body(time: f64, algbw: f64, busbw: f64, checked: bool, wrong: i64) -> String {
    let (t, a, bb) = (
        cs(&get_float_str(time, 7)),
        cs(&get_float_str(algbw, 6)),
        cs(&get_float_str(busbw, 6)),
    );
    if checked {
        let f = cs("  %7s  %6s  %6s  %6g");
        c_fmt(256, |b, l| unsafe {
            libc::snprintf(
                b,
                l,
                f.as_ptr(),
                t.as_ptr(),
                a.as_ptr(),
                bb.as_ptr(),
                wrong as f64,
            )
        })
        .0
    } else {
        let f = cs("  %7s  %6s  %6s    N/A");
        c_fmt(256, |b, l| unsafe {
            libc::snprintf(b, l, f.as_ptr(), t.as_ptr(), a.as_ptr(), bb.as_ptr())
        })
        .0
    }
}

/// `fmt`, a format of `%Ns` columns (and nccl-tests' `%*s`, its timestamp
/// column, empty here), filled with `words`: `snprintf` runs once per
/// conversion, since a variadic C call takes a list fixed at compile time
/// and the headers' column counts differ.
fn c_fmt_words(fmt: &str, words: &[&str]) -> String {
    let starts: Vec<usize> = fmt.match_indices('%').map(|(i, _)| i).collect();
    let mut out = fmt[..starts.first().map_or(fmt.len(), |&i| i)].to_string();
    let mut words = words.iter();
    for (k, &at) in starts.iter().enumerate() {
        let piece = cs(&fmt[at..starts.get(k + 1).map_or(fmt.len(), |&i| i)]);
        let e = cs("");
        let (s, _) = if fmt[at..].starts_with("%*s") {
            c_fmt(512, |b, l| unsafe {
                libc::snprintf(b, l, piece.as_ptr(), 0 as c_int, e.as_ptr())
            })
        } else {
            let w = cs(words.next().expect("a word for each column"));
            c_fmt(512, |b, l| unsafe {
                libc::snprintf(b, l, piece.as_ptr(), w.as_ptr())
            })
        };
        out.push_str(&s);
    }
    assert!(words.next().is_none(), "more words than columns in {fmt}");
    out
}

/// writeResultHeader's three lines (no timestamp columns; the
/// per-iteration ones with `-I 1`).
fn result_header(per_iter: bool) -> Vec<String> {
    let (title, columns) = if per_iter {
        (
            "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                in-place (+ per-iteration)",
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s %*s",
        )
    } else {
        (
            "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ",
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s",
        )
    };
    // The preamble's columns, then each placement's (out of place, in
    // place), each followed by its per-iteration ones with `-I 1`.
    let line = |preamble: [&str; 5], placement: [&str; 4], iters: [&str; 4]| {
        let mut words = preamble.to_vec();
        for _ in 0..2 {
            words.extend(placement);
            if per_iter {
                words.extend(iters);
            }
        }
        c_fmt_words(columns, &words)
    };
    vec![
        "#".into(),
        c_fmt_words(title, &[""; 5]),
        line(
            ["size", "count", "type", "redop", "root"],
            ["time", "algbw", "busbw", "#wrong"],
            ["i_min", "i_max", "i_p99", "i_cv%"],
        ),
        line(
            ["(B)", "(elements)", "", "", ""],
            ["(us)", "(GB/s)", "(GB/s)", ""],
            ["(us)", "(us)", "(us)", "(%)"],
        ),
    ]
}

/// writePerIterReport's columns, from the `-J` file's statistics.
fn per_iter_body(per: &serde_json::Value) -> String {
    let v = |k: &str| get_float_str(per[k].as_f64().unwrap(), 7);
    let words = [v("min_us"), v("max_us"), v("p99_us"), v("cv_pct")];
    c_fmt_words(
        "  %7s  %7s  %7s  %7s",
        &words.each_ref().map(String::as_str),
    )
}

/// writeResultFooter, finalizeFooter and writeErrors' blank line.
fn footer(errors: c_int, avg: f64, min_bw: Option<f64>, program: &str) -> Vec<String> {
    let (f1, f2) = (cs("# %-20s : %d %s"), cs("# %-20s : %g %s"));
    let (oob, abb) = (cs("Out of bounds values"), cs("Avg bus bandwidth"));
    let verdict1 = cs(if errors != 0 { "FAILED" } else { "OK" });
    let verdict2 = cs(match min_bw {
        None => "",
        Some(m) if avg < m * 0.9 => "FAILED",
        Some(_) => "OK",
    });
    vec![
        c_fmt(256, |b, l| unsafe {
            libc::snprintf(b, l, f1.as_ptr(), oob.as_ptr(), errors, verdict1.as_ptr())
        })
        .0,
        c_fmt(256, |b, l| unsafe {
            libc::snprintf(b, l, f2.as_ptr(), abb.as_ptr(), avg, verdict2.as_ptr())
        })
        .0,
        "#".into(),
        format!("# Collective test concluded: {program}"),
        "#".into(),
        String::new(),
    ]
}

/// writeDeviceReport's nThread line.
fn nthread_line(
    nthread: c_int,
    min: u64,
    max: u64,
    step: (u64, &str),
    counts: [c_int; 3],
) -> String {
    let f = cs("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d validation: %d graph: %d unalign: %d");
    let unit = cs(step.1);
    c_fmt(512, |b, l| unsafe {
        libc::snprintf(
            b,
            l,
            f.as_ptr(),
            nthread,
            1 as c_int,
            min as libc::c_long,
            max as libc::c_long,
            step.0 as libc::c_long,
            unit.as_ptr(),
            counts[0],
            counts[1],
            1 as c_int,
            counts[2],
            0 as c_int,
            0 as c_int,
        )
    })
    .0
}

/// One run and what nccl-tests would print for its records.
struct Case {
    name: &'static str,
    backend: &'static str,
    ranks: usize,
    flags: &'static str,
    min_bw: Option<&'static str>,
    /// minBytes, maxBytes, step as nccl-tests' header names them.
    sizes: (u64, u64, (u64, &'static str)),
    /// warm-up, iterations, check.
    counts: [c_int; 3],
    exit: i32,
    /// PARBENCH_SELFTEST_CORRUPT_RANK and how many ranks it names: each
    /// of them finds a wrong element in every checked placement that has
    /// one, and nccl-tests counts each such rank once per placement.
    corrupt: Option<(&'static str, c_int)>,
}

fn program(coll: &str) -> String {
    match coll {
        "all_to_all" => "alltoall_perf".into(),
        "all_to_all_v" => "alltoallv_perf".into(),
        c => format!("{c}_perf"),
    }
}

/// Runs the case, compares its text with nccl-tests' formats of its
/// records, and gives the records back.
fn check_case(c: &Case) -> Vec<HashMap<String, String>> {
    let dir = scratch(&format!("nccl-text-{}", c.name));
    let np = c.ranks.to_string();
    let mut args = vec!["--backend", c.backend, "-np", &np, "--format", "nccl-tests"];
    args.extend(flags(c.flags));
    args.extend(["--out", dir.to_str().unwrap()]);
    let per_iter = c.flags.contains("-I 1");
    let json = dir.join("run.json-J.json");
    if per_iter {
        args.extend(["-J", json.to_str().unwrap()]);
    }
    let mut env: Vec<(&str, &str)> = c.min_bw.iter().map(|v| ("NCCL_TESTS_MIN_BW", *v)).collect();
    if let Some((ranks, _)) = c.corrupt {
        env.push(("PARBENCH_SELFTEST_CORRUPT_RANK", ranks));
    }
    let o = run(&args, &env);
    let text = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(c.exit),
        "{}: {text}\n{}",
        c.name,
        stderr(&o)
    );
    let (_, recs) = read_csv(&dir.join("collectives.csv"));
    let min_bw = c.min_bw.map(|v| v.parse::<f64>().unwrap());
    let checked = c.counts[2] > 0;
    let nthread = if c.backend == "local" { c.ranks } else { 1 } as c_int;
    let results: Vec<serde_json::Value> = if per_iter {
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        doc["results"].as_array().unwrap().clone()
    } else {
        Vec::new()
    };
    let mut result = results.iter();

    // Expected output, block by block, from the records in their order.
    let mut want: Vec<String> = Vec::new();
    if per_iter {
        // nccl-tests names its -J file before anything else.
        want.push(format!("# Writing JSON output to {}", json.display()));
    }
    let mut i = 0;
    while i < recs.len() {
        let coll = recs[i]["collective"].clone();
        want.push("# nccl-tests version 2.19.6 nccl-headers=0 nccl-library=0".into());
        want.push(format!("# Collective test starting: {}", program(&coll)));
        want.push(nthread_line(
            nthread, c.sizes.0, c.sizes.1, c.sizes.2, c.counts,
        ));
        if per_iter {
            // nccl-tests says "CUDA event timing"; parbench's CPU backends
            // time with the host's clock and say so.
            want.push(
                "# Per-Iteration Report: host clock timing; i_* uses max over process rows ".into(),
            );
        }
        want.push("#".into());
        want.push("# Using devices".into());
        want.push("RANKS".into());
        want.extend(result_header(per_iter));
        let (mut errors, mut sum, mut n) = (0, 0.0, 0usize);
        while i < recs.len() && recs[i]["collective"] == coll {
            let (r, ip) = (&recs[i], &recs[i + 1]);
            assert_eq!(
                (r["in_place"].as_str(), ip["in_place"].as_str()),
                ("false", "true")
            );
            let num = |m: &HashMap<String, String>, k: &str| m[k].parse::<f64>().unwrap();
            let mut line = preamble(
                r["bytes"].parse().unwrap(),
                r["count"].parse().unwrap(),
                &r["dtype"],
                &r["op"],
                r["root"].parse().unwrap(),
            );
            let res = if per_iter { result.next() } else { None };
            for (m, key) in [(r, "out_of_place_per_iter"), (ip, "in_place_per_iter")] {
                let wrong: i64 = m["wrong"].parse().unwrap();
                line.push_str(&body(
                    num(m, "time_us"),
                    num(m, "algbw_gbps"),
                    num(m, "busbw_gbps"),
                    checked,
                    wrong,
                ));
                if let Some(res) = res {
                    assert_eq!(res["size"].to_string(), r["bytes"]);
                    line.push_str(&per_iter_body(&res[key]));
                }
                errors += if wrong > 0 {
                    c.corrupt.map_or(1, |(_, k)| k)
                } else {
                    0
                };
                sum += num(m, "busbw_gbps");
                n += 1;
            }
            want.push(line);
            i += 2;
        }
        want.extend(footer(errors, sum / n as f64, min_bw, &program(&coll)));
    }

    // The printed lines, up to parbench's own after the last block.
    let got: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("# parbench "))
        .collect();
    let mut g = got.iter();
    for w in &want {
        if w == "RANKS" {
            // One line per rank: its pid and host are the run's own.
            for rank in 0..c.ranks {
                let line = g
                    .next()
                    .unwrap_or_else(|| panic!("{}: ran out at rank {rank}", c.name));
                let f: Vec<&str> = line.split_whitespace().collect();
                let (pid, host, wire) = (f[6].parse::<c_int>().unwrap(), f[8], f[12..].join(" "));
                let fmt =
                    cs("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s");
                let (h, w) = (cs(host), cs(&wire));
                let exp = c_fmt(512, |b, l| unsafe {
                    libc::snprintf(
                        b,
                        l,
                        fmt.as_ptr(),
                        rank as c_int,
                        0 as c_int,
                        pid,
                        h.as_ptr(),
                        rank as c_int,
                        0 as c_int,
                        0 as c_int,
                        0 as c_int,
                        w.as_ptr(),
                    )
                })
                .0;
                assert_eq!(*line, exp, "{}", c.name);
            }
            continue;
        }
        let line = g
            .next()
            .unwrap_or_else(|| panic!("{}: ran out before {w:?}\n{text}", c.name));
        assert_eq!(line, w, "{}:\n{text}", c.name);
    }
    assert_eq!(
        g.next(),
        None,
        "{}: lines past the last block\n{text}",
        c.name
    );
    assert!(text.contains("# parbench bench-collectives"), "{text}");
    recs
}

#[test]
fn every_collective_dtype_and_operator_prints_as_nccl_tests_would() {
    let recs = check_case(&Case {
        name: "all",
        backend: "local",
        ranks: 3,
        flags: "all -d all -o all -b 8 -e 64 -n 1 -w 0",
        min_bw: None,
        sizes: (8, 64, (2, "factor")),
        counts: [0, 1, 1],
        exit: 0,
        corrupt: None,
    });
    // Every type and operator of nccl-tests, in its order (`test_types`,
    // `test_opnames`), each a block of sizes: what the comparison covered.
    const TYPES: [&str; 12] = [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
        "bfloat16", "f8e4m3", "f8e5m2",
    ];
    const OPS: [&str; 6] = ["sum", "prod", "max", "min", "avg", "mulsum"];
    let mut seen: Vec<(String, String)> = Vec::new();
    for r in recs.iter().filter(|r| r["collective"] == "all_reduce") {
        let key = (r["dtype"].clone(), r["op"].clone());
        if seen.last() != Some(&key) {
            seen.push(key);
        }
    }
    let want: Vec<(String, String)> = TYPES
        .iter()
        .flat_map(|t| OPS.iter().map(move |o| (t.to_string(), o.to_string())))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn no_check_cycles_and_byte_steps_print_as_nccl_tests_would() {
    // -c 0: N/A one column narrower; -N 2: one table, the sizes twice, one
    // footer; -i: steps in bytes; sendrecv once per operator, in place too.
    check_case(&Case {
        name: "c0-n2-i",
        backend: "local",
        ranks: 2,
        flags: "all_reduce all_gather reduce_scatter sendrecv -o sum,mulsum -d float,f8e5m2 -c 0 -N 2 -i 24 -b 8 -e 64 -n 1 -w 0",
        min_bw: Some("0.000001"),
        sizes: (8, 64, (24, "bytes")),
        counts: [0, 1, 0],
        exit: 0,
        corrupt: None,
    });
    // -f 1 steps by nccl-tests' default 1 MiB.
    check_case(&Case {
        name: "f1",
        backend: "local",
        ranks: 2,
        flags: "all_reduce -f 1 -b 1K -e 1025K -n 1 -w 0",
        min_bw: None,
        sizes: (1024, 1025 * 1024, (1 << 20, "bytes")),
        counts: [0, 1, 1],
        exit: 0,
        corrupt: None,
    });
}

#[test]
fn wrong_elements_on_two_ranks_print_as_nccl_tests_would() {
    // Out of bounds: each rank that found a wrong element counts once per
    // placement (nccl-tests' errors[0], summed over ranks), and exit 7.
    check_case(&Case {
        name: "corrupt",
        backend: "local",
        ranks: 3,
        flags: "all_reduce all_gather -b 64 -e 256 -n 1 -w 0",
        min_bw: None,
        sizes: (64, 256, (2, "factor")),
        counts: [0, 1, 1],
        exit: 7,
        corrupt: Some(("0,2", 2)),
    });
}

#[test]
fn per_iteration_columns_print_as_nccl_tests_would() {
    // -I 1: nccl-tests' i_min i_max i_p99 i_cv% after each placement.
    check_case(&Case {
        name: "per-iter",
        backend: "local",
        ranks: 2,
        flags: "all_reduce all_gather -I 1 -b 8 -e 64 -n 5 -w 1",
        min_bw: None,
        sizes: (8, 64, (2, "factor")),
        counts: [1, 5, 1],
        exit: 0,
        corrupt: None,
    });
}

#[test]
fn factors_roots_and_repeated_checks_print_as_nccl_tests_would() {
    check_case(&Case {
        name: "f4-root",
        backend: "local",
        ranks: 2,
        flags: "broadcast reduce all_to_all -f 4 -b 16 -e 1K -c 2 -d half,int64,uint32,f8e4m3 -o prod,mulsum -r 1 -n 2 -w 1",
        min_bw: None,
        sizes: (16, 1024, (4, "factor")),
        counts: [1, 2, 2],
        exit: 0,
        corrupt: None,
    });
}

#[test]
fn ranks_in_other_processes_and_a_failed_min_bw_print_as_nccl_tests_would() {
    // Below 90% of NCCL_TESTS_MIN_BW: FAILED on the average line and
    // nccl-tests' exit code 7.
    check_case(&Case {
        name: "tcp-minbw",
        backend: "tcp",
        ranks: 2,
        flags: "all_reduce sendrecv -b 8 -e 64 -n 1 -w 0 -d int8,uint64 -o mulsum",
        min_bw: Some("1000000"),
        sizes: (8, 64, (2, "factor")),
        counts: [0, 1, 1],
        exit: 7,
        corrupt: None,
    });
}

#[test]
fn per_rank_counts_round_down_to_16_bytes() {
    // nccl-tests: count = (size / ranks / elem) rounded down to 16 bytes,
    // size = count x ranks x elem, for all_gather, reduce_scatter and alltoall.
    let dir = scratch("nccl-text-counts");
    let mut args = flags("--backend local -np 3 -b 8 -e 256 -n 1 -w 0 -d int64,uint8 all_gather reduce_scatter all_to_all");
    args.extend(["--format", "nccl-tests", "--out", dir.to_str().unwrap()]);
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, recs) = read_csv(&dir.join("collectives.csv"));
    for r in &recs {
        let elem: u64 = if r["dtype"] == "int64" { 8 } else { 1 };
        let count: u64 = r["count"].parse().unwrap();
        assert_eq!(count * elem % 16, 0, "{r:?}");
        assert_eq!(
            r["bytes"].parse::<u64>().unwrap(),
            count * 3 * elem,
            "{r:?}"
        );
    }
    // 256 B of uint8 on 3 ranks: 85 per rank, 80 after rounding, 240 B.
    assert!(recs
        .iter()
        .any(|r| r["dtype"] == "uint8" && r["count"] == "80" && r["bytes"] == "240"));
}
