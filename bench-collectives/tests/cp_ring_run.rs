//! The `cp-ring` pattern end to end: exact on local and tcp, each size's
//! three timings and its references recorded, a corrupted byte seen
//! (exit 7).

mod common;
use common::*;
use std::collections::HashMap;

/// One tiny `cp-ring` run on `backend`: its rows, checked exact.
fn ring_rows(backend: &str, np: &str, extra: &str) -> (String, Vec<HashMap<String, String>>) {
    let dir = scratch(&format!("cp-ring-{backend}-{np}-{}", extra.len()));
    let line = format!("cp-ring --backend {backend} -np {np} -b 1K -e 64K -f 8 -n 2 -w 1 {extra}");
    let mut args = flags(&line);
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = run(&args, &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{line}:\n{text}\n{}", stderr(&o));
    let (_, rows) = read_csv(&dir.join("cp-ring.csv"));
    let _ = std::fs::remove_dir_all(&dir);
    (text, rows)
}

fn figure(row: &HashMap<String, String>, column: &str) -> f64 {
    row[column]
        .parse()
        .unwrap_or_else(|e| panic!("{column} = {:?}: {e}", row[column]))
}

#[test]
fn cp_ring_is_exact_on_local_with_every_reference() {
    let (text, rows) = ring_rows("local", "3", "");
    for needle in [
        "# parbench bench-collectives cp-ring: backend local",
        "2 sendrecv steps per pass",
        "compute stand-in per step: auto",
        "hidden = (exchange + compute - overlapped) / exchange",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // Short lines: all but the records' paths and the noise guard's line.
    for l in text.lines() {
        let kept = l.starts_with("# Records:") || l.starts_with("# Noise:");
        assert!(kept || l.chars().count() <= 110, "{l}");
    }
    let sizes: Vec<&str> = rows.iter().map(|r| r["bytes"].as_str()).collect();
    assert_eq!(sizes, ["1024", "8192", "65536"], "{rows:?}");
    for r in &rows {
        assert_eq!(r["wrong"], "0", "{r:?}");
        assert_eq!(r["steps"], "2", "{r:?}");
        assert_eq!(r["stand_in"], "auto", "{r:?}");
        for c in [
            "exchange_us",
            "compute_us",
            "overlapped_us",
            "model_us",
            "ceiling_gbps",
        ] {
            assert!(figure(r, c) > 0.0, "{c}: {r:?}");
        }
        // auto: each step's stand-in is the exchange's step alone.
        let step = figure(r, "exchange_us") / 2.0;
        assert!(
            (figure(r, "compute_step_us") - step).abs() < 1e-6 * step.max(1.0),
            "{r:?}"
        );
        // The hidden share and the lost time agree with the three times.
        let (ex, co, ov) = (
            figure(r, "exchange_us"),
            figure(r, "compute_us"),
            figure(r, "overlapped_us"),
        );
        let want = ((ex + co - ov) / ex).clamp(0.0, 1.0);
        assert!((figure(r, "hidden") - want).abs() < 1e-6, "{r:?}");
        assert!(
            (figure(r, "lost_us") - (ov - ex - co).max(0.0)).abs() < 1e-6,
            "{r:?}"
        );
    }
}

#[test]
fn cp_ring_is_exact_on_tcp_with_a_given_compute() {
    let (text, rows) = ring_rows("tcp", "2", "--compute-us 40");
    assert!(text.contains("compute stand-in per step: 40 us"), "{text}");
    assert_eq!(rows.len(), 3, "{rows:?}");
    for r in &rows {
        assert_eq!(r["wrong"], "0", "{r:?}");
        assert_eq!(r["backend"], "tcp", "{r:?}");
        assert_eq!(r["compute_step_us"], "40.0", "{r:?}");
        assert_eq!(r["stand_in"], "40", "{r:?}");
    }
}

#[test]
fn a_corrupted_byte_makes_exit_code_seven() {
    let dir = scratch("cp-ring-corrupt");
    let mut args = flags("cp-ring --backend local -np 2 -b 64 -e 64 -n 1 -w 0");
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = run(&args, &[("PARBENCH_SELFTEST_CORRUPT_RANK", "1")]);
    assert_eq!(o.status.code(), Some(7), "{}\n{}", stdout(&o), stderr(&o));
    let (_, rows) = read_csv(&dir.join("cp-ring.csv"));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["wrong"], "1", "{rows:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
