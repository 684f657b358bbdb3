//! `report compare`: regressions beyond threshold and noise, exit codes.

mod common;
use common::*;
use parbench::results::{append_rows, read_rows, CollectiveRow, PipelineRow};
use std::path::Path;

/// Rewrites `dir/collectives.csv` with `edit` applied to each row.
fn edit_collectives(dir: &Path, edit: impl Fn(&mut CollectiveRow)) {
    let path = dir.join("collectives.csv");
    let mut rows: Vec<CollectiveRow> = read_rows(&path).unwrap();
    rows.iter_mut().for_each(edit);
    std::fs::remove_file(&path).unwrap();
    append_rows(dir, &rows).unwrap();
}

/// Scales every time figure of the row and its bandwidths inversely.
fn slow_down(r: &mut CollectiveRow, factor: f64) {
    r.time_us *= factor;
    r.time_min_us *= factor;
    r.time_max_us *= factor;
    r.p50_us *= factor;
    r.p99_us *= factor;
    r.algbw_gbps /= factor;
    r.busbw_gbps /= factor;
}

const TARGET: u64 = 1 << 21;

fn is_target(r: &CollectiveRow) -> bool {
    r.collective == "all_reduce" && r.bytes == TARGET && !r.in_place
}

#[test]
fn identical_runs_pass() {
    let base = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), base.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(": 0 regressions, 0 improvements"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_20_percent_slowdown_is_flagged() {
    let cur = copy_fixture("shm", "slow");
    edit_collectives(&cur, |r| {
        if is_target(r) {
            slow_down(r, 1.2)
        }
    });
    let base = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(
        out.contains(": 2 regressions"),
        "time and busbw of one row: {out}"
    );
    assert!(
        out.contains("all_reduce/float/sum/-1/np2/2097152B/out"),
        "{out}"
    );
    assert!(out.contains("+20.0%"), "{out}");

    let md = report(&[
        "compare",
        "--markdown",
        base.to_str().unwrap(),
        cur.to_str().unwrap(),
    ]);
    assert_eq!(md.status.code(), Some(1));
    let md = stdout(&md);
    assert!(
        md.contains("### Regressions") && md.contains("| suite / key | figure |"),
        "{md}"
    );
}

#[test]
fn a_change_within_the_noise_is_not_flagged() {
    // The fixture's rows spread min..max over -7%..+12% of the mean: a 9%
    // slowdown is above a 5% threshold but inside that noise.
    let cur = copy_fixture("shm", "noisy");
    edit_collectives(&cur, |r| {
        if is_target(r) {
            slow_down(r, 1.09)
        }
    });
    let base = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains(": 0 regressions"), "{}", stdout(&o));

    // The same 9% with a tight spread is a regression.
    edit_collectives(&cur, |r| {
        if is_target(r) {
            r.time_min_us = r.time_us * 0.99;
            r.time_max_us = r.time_us * 1.01;
        }
    });
    let tight_base = copy_fixture("shm", "tight-base");
    edit_collectives(&tight_base, |r| {
        if is_target(r) {
            r.time_min_us = r.time_us * 0.99;
            r.time_max_us = r.time_us * 1.01;
        }
    });
    let o = report(&[
        "compare",
        tight_base.to_str().unwrap(),
        cur.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

#[test]
fn improvements_and_missing_rows_are_listed_not_failed() {
    let cur = copy_fixture("shm", "faster");
    edit_collectives(&cur, |r| {
        if is_target(r) {
            slow_down(r, 0.7)
        }
    });
    // Drop one pipeline row: it shows as only in the baseline.
    let path = cur.join("pipeline.csv");
    let rows: Vec<PipelineRow> = read_rows(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    append_rows(&cur, &rows[1..]).unwrap();
    let base = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("2 improvements"), "{out}");
    assert!(out.contains("1 keys only in the baseline"), "{out}");
    assert!(out.contains("Only in the baseline"), "{out}");
}

#[test]
fn a_worse_bubble_is_a_regression() {
    let cur = copy_fixture("shm", "bubble");
    let path = cur.join("pipeline.csv");
    let mut rows: Vec<PipelineRow> = read_rows(&path).unwrap();
    // 1F1B at M=8: the bubble grows by 10 points at the same step time.
    for r in rows
        .iter_mut()
        .filter(|r| r.schedule == "1f1b" && r.microbatches == 8)
    {
        r.bubble_measured += 0.10;
    }
    std::fs::remove_file(&path).unwrap();
    append_rows(&cur, &rows).unwrap();
    let base = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("bubble_measured"), "{}", stdout(&o));
    assert!(stdout(&o).contains("+10.0 pt"), "{}", stdout(&o));
}

#[test]
fn bad_threshold_exits_2() {
    let base = fixture("shm");
    let o = report(&[
        "compare",
        "--threshold",
        "-1",
        base.to_str().unwrap(),
        base.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn real_records_compare_with_themselves() {
    let d = fixture("real-cpu");
    let o = report(&["compare", d.to_str().unwrap(), d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(": 0 regressions, 0 improvements"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn one_descheduled_iteration_is_not_a_regression() {
    // As seen between two real nights on a shared machine: one iteration of
    // 20 took 6 ms, the mean rose 15x, the median did not move.
    let cur = copy_fixture("shm", "outlier");
    edit_collectives(&cur, |r| {
        if is_target(r) {
            r.time_max_us = r.time_us * 280.0;
            r.time_us *= 15.0;
            r.p99_us = r.time_max_us;
            r.algbw_gbps /= 15.0;
            r.busbw_gbps /= 15.0;
        }
    });
    let base = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains(": 0 regressions"), "{}", stdout(&o));
}
