//! `report compare`: regressions beyond threshold and noise, exit codes.

mod common;
use common::*;
use parbench::results::{append_rows, read_rows, CollectiveRow, PipelineRow};
use std::path::{Path, PathBuf};

/// Rewrites `dir/collectives.csv` with `edit` applied to each row.
fn edit_collectives(dir: &Path, edit: impl Fn(&mut CollectiveRow)) {
    let path = dir.join("collectives.csv");
    let mut rows: Vec<CollectiveRow> = read_rows(&path).unwrap();
    rows.iter_mut().for_each(edit);
    std::fs::remove_file(&path).unwrap();
    append_rows(dir, &rows).unwrap();
}

const TARGET: u64 = 1 << 21;

fn is_target(r: &CollectiveRow) -> bool {
    r.collective == "all_reduce" && r.bytes == TARGET && !r.in_place
}

/// The fixture folder `name` compared with itself: exit 0, nothing flagged.
fn compares_with_itself(name: &str) {
    let d = fixture(name);
    let o = report(&["compare", d.to_str().unwrap(), d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(": 0 regressions, 0 improvements"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn identical_runs_pass() {
    compares_with_itself("shm");
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
    assert!(
        out.contains("One round on a side for ")
            && out.contains("run-to-run noise was not measured"),
        "a single round says what it cannot tell: {out}"
    );

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
    // One round each: the noise is the row's spread below its median. At
    // 10% below, a 9% slowdown is above a 5% threshold but inside it.
    let cur = copy_fixture("shm", "noisy");
    let base = copy_fixture("shm", "noisy-base");
    for d in [&cur, &base] {
        edit_collectives(d, |r| {
            if is_target(r) {
                r.time_min_us = r.p50_us * 0.90;
            }
        });
    }
    edit_collectives(&cur, |r| {
        if is_target(r) {
            slow_down(r, 1.09)
        }
    });
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains(": 0 regressions"), "{}", stdout(&o));

    // The same 9% with a tight spread is a regression.
    for d in [&cur, &base] {
        edit_collectives(d, |r| {
            if is_target(r) {
                r.time_min_us = r.p50_us * 0.99;
            }
        });
    }
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

/// Deterministic noise in [-amp, amp] from (round, row, seed).
fn jitter(i: usize, j: usize, seed: u64, amp: f64) -> f64 {
    let mut x = (i as u64 * 1_000_003 + j as u64 * 7919 + seed).wrapping_mul(6364136223846793005);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let u = (x >> 11) as f64 / (1u64 << 53) as f64;
    1.0 + amp * (2.0 * u - 1.0)
}

#[test]
fn rounds_with_injected_noise_are_not_called_a_10_percent_change_is() {
    let quiet = |_| 0.0;
    // Every row of every round moves by up to +-4% at random, both nights.
    let base = rounds_folder("r-base", 3, |i, j| jitter(i, j, 1, 0.04), quiet);
    let same = rounds_folder("r-same", 3, |i, j| jitter(i, j, 2, 0.04), quiet);
    let o = report(&["compare", base.to_str().unwrap(), same.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("rounds 3 against 3"), "{}", stdout(&o));
    assert!(stdout(&o).contains(": 0 regressions"), "{}", stdout(&o));

    // The same noise, and all_reduce at 2 MiB 10% slower in every round.
    let slow = rounds_folder(
        "r-slow",
        3,
        |i, j| {
            let target = j == 18 || j == 19; // all_reduce 2 MiB, out and in place
            jitter(i, j, 3, 0.02) * if target { 1.10 } else { 1.0 }
        },
        quiet,
    );
    let base_tight = rounds_folder("r-base-tight", 3, |i, j| jitter(i, j, 4, 0.02), quiet);
    let o = report(&[
        "compare",
        base_tight.to_str().unwrap(),
        slow.to_str().unwrap(),
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("2097152B/out") && out.contains("p50_us"),
        "{out}"
    );
    assert!(
        out.contains(": 4 regressions"),
        "two rows, two figures each: {out}"
    );
}

/// `dir`'s runs renamed as another night's (run ids are unique per run).
fn as_night(dir: &Path, night: u32) -> PathBuf {
    for file in ["collectives.csv", "run.json"] {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("20261129T", &format!("202612{night:02}T")),
        )
        .unwrap();
    }
    dir.to_path_buf()
}

/// A baseline of several nights pools their rounds: a night 10% slower
/// than one baseline night, but inside the spread the nights showed, is
/// not called; beyond every night it is.
#[test]
fn a_baseline_of_several_nights_holds_a_night_against_their_spread() {
    let quiet = |_| 0.0;
    let night = |name: &str, n: u32, factor: f64| {
        let dir = rounds_folder(
            name,
            3,
            |i, j| jitter(i, j, u64::from(n), 0.01) * factor,
            quiet,
        );
        as_night(&dir, n)
    };
    let first = night("nights-1", 1, 1.0);
    let second = night("nights-2", 2, 1.12);
    let tonight = night("nights-3", 3, 1.10);
    let (code, out) = compare_code(&first, &tonight);
    assert_eq!(
        code,
        Some(1),
        "against one night, 10% slower is called: {out}"
    );

    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let o = report(&["compare", &arg(&first), &arg(&second), &arg(&tonight)]);
    let out = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let flat = out.replace('\n', " ");
    assert!(flat.contains("2 baseline folders pooled"), "{out}");
    assert!(flat.contains("rounds 3 against 6"), "{out}");
    assert!(out.contains(": 0 regressions"), "{out}");

    let slower = night("nights-4", 4, 1.30);
    let o = report(&["compare", &arg(&first), &arg(&second), &arg(&slower)]);
    let out = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(1), "beyond both nights: {out}");
    assert!(
        out.contains("2097152B/out") && out.contains("p50_us"),
        "{out}"
    );
}

/// The nightly gate on a shaped link (`tcp-1gbit`: a token bucket holds
/// still where a VM's caches do not): three nights of unchanged code pooled
/// as the baseline pass a fourth unchanged night; a night whose link is 10%
/// slower (every time x1.10) fails it.
#[test]
fn a_shaped_link_10_percent_slower_fails_the_gate_and_unchanged_nights_pass() {
    let quiet = |_| 0.0;
    let night = |name: &str, n: u32, factor: f64| {
        let dir = rounds_folder(
            name,
            7,
            |i, j| jitter(i, j, u64::from(n), 0.02) * factor,
            quiet,
        );
        edit_collectives(&dir, |r| {
            r.backend = "tcp".into();
            r.wire = "tcp-1gbit".into();
        });
        as_night(&dir, n)
    };
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let base: Vec<String> = (1..=3)
        .map(|n| arg(&night(&format!("link-{n}"), n, 1.0)))
        .collect();
    let judge = |tonight: &Path| {
        let mut args = vec!["compare".to_string()];
        args.extend(base.iter().cloned());
        args.push(arg(tonight));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = report(&args);
        (o.status.code(), stdout(&o) + &stderr(&o))
    };
    let (code, out) = judge(&night("link-4", 4, 1.0));
    assert_eq!(code, Some(0), "an unchanged night: {out}");
    assert!(out.contains(": 0 regressions"), "{out}");
    let (code, out) = judge(&night("link-5", 5, 1.10));
    assert_eq!(code, Some(1), "a link 10% slower: {out}");
    assert!(out.contains("tcp-1gbit") && out.contains("p50_us"), "{out}");
}

#[test]
fn changes_below_the_floor_are_never_called() {
    // The floor (0.05 us here) against a sub-microsecond row: +50% of 0.02 us is 0.01 us.
    let base = rounds_folder(
        "f-base",
        1,
        |_, j| if j == 0 { 0.0113 } else { 1.0 },
        |_| 0.0,
    );
    let cur = rounds_folder("f-cur", 1, |_, j| if j == 0 { 0.017 } else { 1.0 }, |_| 0.0);
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // With a floor of 1 ns the same change is called: the floor decided.
    for d in [&base, &cur] {
        let p = d.join("run.json");
        let t = std::fs::read_to_string(&p)
            .unwrap()
            .replace("0.05", "0.001");
        std::fs::write(&p, t).unwrap();
    }
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

#[test]
fn a_noisy_run_is_not_judged_and_exits_3() {
    let base = rounds_folder("n-base", 1, |_, _| 1.0, |_| 0.0);
    let cur = rounds_folder("n-cur", 1, |_, _| 1.3, |_| 0.25);
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(out.contains("noisy: not judged"), "{out}");
    assert!(out.contains(": 0 regressions"), "{out}");
    // A quiet run whose all_reduce table alone was noisy: those rows are
    // not judged, the others are.
    let cur = rounds_folder("n-table", 1, |_, _| 1.3, |_| 0.0);
    let p = cur.join("run.json");
    let mut runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    runs[0]["extra"]["noise_per_collective"] = serde_json::json!({"all_reduce": {"fraction": 0.2}});
    std::fs::write(&p, runs.to_string()).unwrap();
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "all_gather still judged: {out}");
    assert!(
        out.contains("(all_reduce table)") && out.contains("noisy: not judged"),
        "{out}"
    );
    assert!(
        !out.contains("all_reduce/float/sum/-1/np2/2097152B/out  "),
        "{out}"
    );
    // One noisy round of three is left out; the quiet ones are judged.
    let cur = rounds_folder("n-cur3", 3, |_, _| 1.0, |i| if i == 1 { 0.5 } else { 0.0 });
    let base3 = rounds_folder("n-base3", 3, |_, _| 1.0, |_| 0.0);
    let o = report(&["compare", base3.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("Noisy runs left out"), "{}", stdout(&o));
    // One count, one meaning: the summary says the noisy runs' rounds were
    // left out and no figure went unjudged for it.
    assert!(
        stdout(&o).contains("0 noisy: not judged")
            && stdout(&o)
                .contains("1 noisy runs' rounds left out, every figure judged on the other rounds"),
        "{}",
        stdout(&o)
    );
    assert!(
        !stdout(&o).contains("One round on a side"),
        "three rounds a side: {}",
        stdout(&o)
    );
}

#[test]
fn a_compare_that_matches_nothing_exits_2_saying_why() {
    let base = fixture("shm");
    let cur = copy_fixture("shm", "renamed");
    edit_collectives(&cur, |r| r.wire = "tcp-1gbit".into());
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("nothing compared") && err.contains("wire") && err.contains("tcp-1gbit"),
        "{err}"
    );
    // Folders that share no suite at all.
    let layers_only = scratch("layers-only");
    std::fs::copy(
        fixture("shm").join("layers.csv"),
        layers_only.join("layers.csv"),
    )
    .unwrap();
    let coll_only = scratch("coll-only");
    std::fs::copy(
        fixture("shm").join("collectives.csv"),
        coll_only.join("collectives.csv"),
    )
    .unwrap();
    let o = report(&[
        "compare",
        coll_only.to_str().unwrap(),
        layers_only.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("share no suite"), "{}", stderr(&o));
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
    // 1e300 was taken, and printed as a 300-digit percentage.
    for bad in ["-1", "1e300"] {
        let o = report(&[
            "compare",
            "--threshold",
            bad,
            base.to_str().unwrap(),
            base.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(
            stderr(&o).contains(&format!("--threshold {bad}: a fraction from 0 to 100")),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn real_records_compare_with_themselves() {
    compares_with_itself("real-cpu");
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

#[test]
fn a_figure_that_cannot_be_judged_is_never_a_pass() {
    // Was: a change with no finite value (a ratio to a zero baseline)
    // counted as unchanged and the gate passed with exit 0.
    let base = copy_fixture("shm", "cmp-zero-base");
    edit_collectives(&base, |r| {
        if is_target(r) {
            r.p50_us = 0.0;
            r.time_us = 0.0;
            r.time_min_us = 0.0;
            r.time_max_us = 0.0;
            r.p99_us = 0.0;
        }
    });
    let cur = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}{err}", stdout(&o));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cannot be judged"), "{err}");
}

#[test]
fn a_current_run_cut_short_is_never_a_pass() {
    let cur = copy_fixture("shm", "cmp-cut-short");
    let path = cur.join("run.json");
    let mut runs: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    runs[0]["cut_short"] = "interrupted by SIGINT".into();
    std::fs::write(&path, serde_json::to_vec_pretty(&runs).unwrap()).unwrap();
    let base = fixture("shm");
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}{err}", stdout(&o));
    assert!(err.contains("cut short") && err.contains("SIGINT"), "{err}");
}

/// A folder of `rounds` bench-layers runs of the shm fixture's layers rows:
/// run i's compute times are the fixture's times `compute(i, row)`, its
/// communication as recorded, and its run.json entry records a compute
/// reference of `reference_us(i)` (none when `None`).
fn layer_rounds(
    name: &str,
    rounds: usize,
    compute: impl Fn(usize, usize) -> f64,
    reference_us: impl Fn(usize) -> Option<f64>,
) -> std::path::PathBuf {
    use parbench::results::LayerRow;
    let dir = scratch(name);
    let src: Vec<LayerRow> = read_rows(&fixture("shm").join("layers.csv")).unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("shm").join("run.json")).unwrap())
            .unwrap();
    let layers_meta = meta
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["suite"] == "layers")
        .unwrap();
    let (mut runs, mut rows) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let id = format!("layers-20261130T0{i}0000Z-{i}");
        for (j, r) in src.iter().enumerate() {
            let f = compute(i, j);
            let d = r.compute_us * (f - 1.0);
            rows.push(LayerRow {
                run_id: id.clone(),
                compute_us: r.compute_us * f,
                total_us: r.total_us + d,
                total_min_us: r.total_min_us + d,
                total_max_us: r.total_max_us + d,
                per_token_us: r.per_token_us * (r.total_us + d) / r.total_us,
                ..r.clone()
            });
        }
        let mut m = layers_meta.clone();
        m["run_id"] = id.into();
        m["extra"]["floor"] = serde_json::json!({"floor_us": 0.05});
        if let Some(us) = reference_us(i) {
            m["extra"]["compute_reference"] = serde_json::json!({
                "kernel": "gemm crate f32 512x512x512, avx2+fma, one product per CPU on 2 CPU(s) at once",
                "threads": 2,
                "samples_us": [us * 0.99, us, us * 1.01],
            });
        }
        runs.push(m);
    }
    write_folder(&dir, &rows, &runs);
    dir
}

/// The first signed percentage in `text` ("+10.7%" -> 10.7).
fn first_percent(text: &str) -> f64 {
    text.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .find_map(|w| {
            w.strip_prefix('+')
                .and_then(|w| w.strip_suffix('%'))?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no percentage in {text}"))
}

fn compare_code(base: &Path, cur: &Path) -> (Option<i32>, String) {
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    (o.status.code(), stdout(&o) + &stderr(&o))
}

#[test]
fn a_slower_machine_is_not_a_slower_block() {
    let tight = |i, j| jitter(i, j, 5, 0.01);
    let base = layer_rounds("l-base", 5, tight, |i| Some(3000.0 * jitter(i, 0, 6, 0.01)));
    // The machine 10% slower: the reference and every compute time with it.
    let drift = layer_rounds(
        "l-drift",
        5,
        |i, j| 1.10 * jitter(i, j, 7, 0.01),
        |i| Some(3300.0 * jitter(i, 0, 8, 0.01)),
    );
    let (code, out) = compare_code(&base, &drift);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(": 0 regressions"), "{out}");
    // The basis is one paragraph, wrapped at 120 columns.
    let flat = out.replace('\n', " ");
    let basis = flat
        .split("compute times judged at the baseline's machine speed")
        .nth(1)
        .unwrap_or_else(|| panic!("no basis line: {out}"));
    let drift = first_percent(basis.split("took").nth(1).unwrap_or(""));
    assert!((9.0..12.0).contains(&drift), "{basis}");

    // The same times with no reference on the current side: judged as
    // measured, the drift is called.
    let unreferenced = layer_rounds(
        "l-drift-raw",
        5,
        |i, j| 1.10 * jitter(i, j, 7, 0.01),
        |_| None,
    );
    let (code, out) = compare_code(&base, &unreferenced);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.replace('\n', " ")
            .contains("compute times judged as measured (the current run's run layers-"),
        "{out}"
    );
}

#[test]
fn a_slower_block_is_called_on_a_steady_or_a_slower_machine() {
    let base = layer_rounds(
        "lb-base",
        5,
        |i, j| jitter(i, j, 5, 0.01),
        |i| Some(3000.0 * jitter(i, 0, 6, 0.01)),
    );
    // The block 10% slower, the machine as fast.
    let slow = layer_rounds(
        "lb-slow",
        5,
        |i, j| 1.10 * jitter(i, j, 9, 0.01),
        |i| Some(3000.0 * jitter(i, 0, 10, 0.01)),
    );
    let (code, out) = compare_code(&base, &slow);
    assert_eq!(code, Some(1), "{out}");
    for tp in ["tp1", "tp2"] {
        let line = out
            .lines()
            .find(|l| l.contains(tp) && l.contains("compute_us"))
            .unwrap_or_else(|| panic!("no {tp} compute_us regression: {out}"));
        assert!((8.0..12.0).contains(&first_percent(line)), "{line}");
    }
    // The block 10% slower on a machine 10% slower: 21% as measured, 10%
    // once the machine's share is taken out, and still called.
    let both = layer_rounds(
        "lb-both",
        5,
        |i, j| 1.21 * jitter(i, j, 11, 0.01),
        |i| Some(3300.0 * jitter(i, 0, 12, 0.01)),
    );
    let (code, out) = compare_code(&base, &both);
    assert_eq!(code, Some(1), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("tp1") && l.contains("compute_us"))
        .unwrap_or_else(|| panic!("no tp1 compute_us regression: {out}"));
    assert!(
        line.contains("+10.") || line.contains("+9.") || line.contains("+11."),
        "{line}"
    );
}

#[test]
fn one_quiet_round_left_of_several_is_not_judged() {
    let quiet = |_| 0.0;
    let base = rounds_folder("q-base", 3, |i, j| jitter(i, j, 13, 0.02), quiet);
    // Two of the three current rounds noisy, and the one left 20% slower
    // at every size: its noise is not measured, so nothing is called.
    let cur = rounds_folder(
        "q-cur",
        3,
        |i, j| jitter(i, j, 14, 0.02) * if i == 2 { 1.2 } else { 1.0 },
        |i| if i < 2 { 0.3 } else { 0.0 },
    );
    let (code, out) = compare_code(&base, &cur);
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains(": 0 regressions"), "{out}");
    assert!(out.contains("all but one of the rounds it ran"), "{out}");
    // With two quiet rounds left, both slower, the change is called.
    let cur2 = rounds_folder(
        "q-cur2",
        3,
        |i, j| jitter(i, j, 14, 0.02) * if i >= 1 { 1.2 } else { 1.0 },
        |i| if i < 1 { 0.3 } else { 0.0 },
    );
    let (code, out) = compare_code(&base, &cur2);
    assert_eq!(code, Some(1), "{out}");
}

/// Every line of `out` at most 120 characters, naming the first longer one.
fn assert_short_lines(out: &str) {
    if let Some(l) = out.lines().find(|l| l.chars().count() > 120) {
        panic!("a line of {} characters: {l}\n{out}", l.chars().count());
    }
}

/// Issue 53: the first line is the verdict (it read "rounds  against )"
/// when no figure had a quiet round), and no line of the default output is
/// wider than 120 (the summary line was 503).
#[test]
fn the_first_line_is_the_verdict_and_every_line_fits_120_columns() {
    let base = fixture("shm");
    let slow = copy_fixture("shm", "slow-lines");
    edit_collectives(&slow, |r| {
        if is_target(r) {
            slow_down(r, 1.2)
        }
    });
    let quiet_base = rounds_folder("w-base", 1, |_, _| 1.0, |_| 0.0);
    let noisy = rounds_folder("w-noisy", 1, |_, _| 1.3, |_| 0.25);
    for (b, c, code) in [(&base, &slow, 1), (&quiet_base, &noisy, 3)] {
        for verbose in [false, true] {
            let mut args = vec!["compare", b.to_str().unwrap(), c.to_str().unwrap()];
            if verbose {
                args.push("-v");
            }
            let o = report(&args);
            let out = stdout(&o);
            assert_eq!(o.status.code(), Some(code), "{out}{}", stderr(&o));
            let first = out.lines().next().unwrap();
            assert!(
                first.contains(" figures compared: ") && first.contains(" regressions, "),
                "{first}"
            );
            let second = out.lines().nth(1).unwrap();
            assert!(second.contains("quiet rounds "), "{second}");
            assert!(
                !out.contains(" against )") && !out.contains("rounds  against"),
                "{out}"
            );
            // -v adds the tables' detail columns (worse by, rounds, floor).
            if !verbose {
                assert_short_lines(&out);
            }
            // The rule in full only with -v.
            assert_eq!(out.contains("every current round worse"), verbose, "{out}");
        }
    }
}

/// Issue 53: on a shared runner every run is noisy; `--noise-limit`
/// raises the share of the machine a judged run may lose, so a run that
/// was "noisy: not judged" gets a verdict. A limit outside 0..1 is bad input.
#[test]
fn a_noise_limit_turns_a_noisy_run_into_a_judged_one() {
    let base = rounds_folder("l-base", 1, |_, _| 1.0, |_| 0.0);
    let cur = rounds_folder("l-cur", 1, |_, _| 1.3, |_| 0.25);
    let (b, c) = (base.to_str().unwrap(), cur.to_str().unwrap());
    let o = report(&["compare", b, c]);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("--noise-limit to judge them"),
        "{}",
        stdout(&o)
    );
    let o = report(&["compare", "--noise-limit", "0.3", b, c]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "30% slower, judged: {out}");
    assert!(
        out.contains(" 0 noisy: not judged") && out.contains("noise limit 30.0%"),
        "{out}"
    );
    assert!(!out.contains("Noisy runs left out"), "{out}");
    // Below the run's 25%, it stays unjudged.
    let o = report(&["compare", "--noise-limit", "0.2", b, c]);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    for bad in ["1.5", "-0.1", "NaN"] {
        let o = report(&["compare", "--noise-limit", bad, b, c]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = stderr(&o);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--noise-limit"), "{err}");
    }
}

/// A folder of one quiet round of the real-cp fixture's layers_cp.csv,
/// cp-ring.csv and moe.csv rows, each row's own spread made tight (1%),
/// then `edit_*`.
fn cp_folder(
    name: &str,
    edit_cp: impl Fn(&mut parbench::results::CpRow),
    edit_ring: impl Fn(&mut parbench::results::CpRingRow),
) -> PathBuf {
    cp_moe_folder(name, edit_cp, edit_ring, |_| {})
}

/// [`cp_folder`] with the fixture's moe.csv rows too, then `edit_moe`.
fn cp_moe_folder(
    name: &str,
    edit_cp: impl Fn(&mut parbench::results::CpRow),
    edit_ring: impl Fn(&mut parbench::results::CpRingRow),
    edit_moe: impl Fn(&mut parbench::results::MoeRow),
) -> PathBuf {
    use parbench::results::{CpRingRow, CpRow, MoeRow};
    let dir = scratch(name);
    let src = fixture("real-cp");
    let mut cp: Vec<CpRow> = read_rows(&src.join("layers_cp.csv")).unwrap();
    for r in &mut cp {
        r.total_min_us = r.total_us * 0.99;
        edit_cp(r);
    }
    let mut ring: Vec<CpRingRow> = read_rows(&src.join("cp-ring.csv")).unwrap();
    for r in &mut ring {
        r.overlapped_p50_us = r.overlapped_us * 0.99;
        edit_ring(r);
    }
    let mut moe: Vec<MoeRow> = read_rows(&src.join("moe.csv")).unwrap();
    for r in &mut moe {
        r.p50_us = r.time_us * 0.99;
        edit_moe(r);
    }
    append_rows(&dir, &moe).unwrap();
    let runs: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(src.join("run.json")).unwrap()).unwrap();
    let quiet: Vec<serde_json::Value> = runs
        .into_iter()
        .map(|mut m| {
            m["extra"]["noise"]["fraction"] = 0.0.into();
            m["extra"]["noise"]["foreign_s"] = 0.0.into();
            m
        })
        .collect();
    append_rows(&dir, &cp).unwrap();
    write_folder(&dir, &ring, &quiet);
    dir
}

#[test]
fn context_parallel_rows_compare_with_themselves() {
    let base = cp_folder("cp-same-base", |_| {}, |_| {});
    let cur = cp_folder("cp-same", |_| {}, |_| {});
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains(": 0 regressions, 0 improvements"), "{out}");
    assert_short_lines(&out);
}

#[test]
fn a_slower_cp_attention_row_is_flagged() {
    let base = cp_folder("cp-slow-base", |_| {}, |_| {});
    let cur = cp_folder(
        "cp-slow",
        |r| {
            if r.cp == 2 {
                r.total_us *= 1.2;
                r.total_min_us *= 1.2;
            }
        },
        |_| {},
    );
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(out.contains(": 1 regression"), "{out}");
    assert!(
        out.contains("layers_cp local/shm/p2p/forward/causal/h2d16s32b1/tp1cp2")
            && out.contains("total_us")
            && out.contains("+20.0%"),
        "{out}"
    );
    assert_short_lines(&out);
}

#[test]
fn a_cp_ring_size_that_hides_less_is_flagged() {
    let base = cp_folder("ring-base", |_| {}, |_| {});
    // At 16 KiB the overlapped pass 20% longer: the share hidden drops with it.
    let cur = cp_folder(
        "ring-worse",
        |_| {},
        |r| {
            if r.bytes == 16384 {
                r.overlapped_us *= 1.2;
                r.overlapped_p50_us *= 1.2;
                r.hidden =
                    ((r.exchange_us + r.compute_us - r.overlapped_us) / r.exchange_us).max(0.0);
            }
        },
    );
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(out.contains(": 2 regressions"), "{out}");
    for want in [
        "cp-ring local/shm/np2/16384/cauto",
        "overlapped_us",
        "hidden",
        " pt",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert_short_lines(&out);
}

#[test]
fn a_slower_moe_dispatch_is_flagged() {
    let base = cp_folder("moe-base", |_| {}, |_| {});
    let cur = cp_moe_folder(
        "moe-slow",
        |_| {},
        |_| {},
        |r| {
            if r.phase == "dispatch" {
                r.time_us *= 1.2;
                r.p50_us *= 1.2;
            }
        },
    );
    let o = report(&["compare", base.to_str().unwrap(), cur.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(out.contains(": 1 regression"), "{out}");
    assert!(
        out.contains("moe local/shm/np2/dispatch/T64/H64/E4/k2/uniform"),
        "{out}"
    );
    assert_short_lines(&out);
}

/// A change no measurement makes (a baseline time of 1e-29 us, the least a
/// record holds, against a real one) is shown in exponent form, in a line
/// of the table's width, not in 30 digits more.
#[test]
fn a_change_beyond_any_measurement_keeps_the_table_narrow() {
    let tiny = copy_fixture("shm", "tiny-time");
    edit_collectives(&tiny, |r| {
        if is_target(r) {
            r.p50_us = 1e-29;
        }
    });
    let real = fixture("shm");
    let o = report(&["compare", tiny.to_str().unwrap(), real.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(out.contains("+2.33e33%"), "{out}");
    assert_short_lines(&out);
}
