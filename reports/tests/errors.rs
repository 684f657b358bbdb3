//! Malformed, truncated or missing records: one line naming the file (and
//! line), exit code 2, through every subcommand that reads them.

mod common;
use common::*;
use std::path::Path;

/// Runs html (and compare, which reads no timelines, unless `timeline`) on
/// `dir`; each must exit 2 with one line that contains every string of `want`.
fn refused(dir: &Path, want: &[&str], timeline: bool) {
    let d = dir.to_str().unwrap();
    let tag = dir
        .file_name()
        .map_or("x".into(), |n| n.to_string_lossy().into_owned());
    let out = scratch(&format!("err-out-{tag}")).join("r.html");
    let good = fixture("shm");
    let mut runs = vec![(
        "html",
        report(&["html", d, "--output-file", out.to_str().unwrap()]),
    )];
    if !timeline {
        runs.push((
            "compare as current",
            report(&["compare", good.to_str().unwrap(), d]),
        ));
        runs.push((
            "compare as baseline",
            report(&["compare", d, good.to_str().unwrap()]),
        ));
    }
    for (name, o) in runs {
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{name}: one line: {err}");
        for w in want {
            assert!(err.contains(w), "{name}: {w:?} not in {err}");
        }
    }
    assert!(!out.exists(), "no report written on error");
}

fn assert_refused(dir: &Path, want: &[&str]) {
    refused(dir, want, false)
}

fn cut_last_line_in_half(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let n = lines.len();
    let last = lines[n - 1];
    let mut out = lines[..n - 1].join("\n");
    out.push('\n');
    out.push_str(&last[..last.len() / 2]);
    std::fs::write(path, out).unwrap();
    n
}

#[test]
fn truncated_csv_names_file_and_line() {
    let d = copy_fixture("shm", "trunc");
    let n = cut_last_line_in_half(&d.join("collectives.csv"));
    assert_refused(&d, &[&format!("collectives.csv:{n}:")]);
}

#[test]
fn empty_csv_is_refused() {
    let d = copy_fixture("shm", "emptycsv");
    std::fs::write(d.join("pipeline.csv"), "").unwrap();
    assert_refused(&d, &["pipeline.csv:1:", "empty file"]);
}

#[test]
fn malformed_value_names_file_and_line() {
    let d = copy_fixture("shm", "badval");
    let path = d.join("layers.csv");
    let text =
        std::fs::read_to_string(&path)
            .unwrap()
            .replacen(",forward,false,", ",forward,maybe,", 1);
    std::fs::write(&path, text).unwrap();
    assert_refused(&d, &["layers.csv:2:"]);
}

#[test]
fn other_schema_version_names_file_and_line() {
    let d = copy_fixture("shm", "schema");
    let path = d.join("pipeline.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[3] = lines[3].replacen("1,", "9,", 1);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    assert_refused(&d, &["pipeline.csv:4:", "schema version 9"]);
}

#[test]
fn malformed_run_json_names_file_and_line() {
    let d = copy_fixture("shm", "runjson");
    let path = d.join("run.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    let lines = text[..text.len() / 2].lines().count();
    assert_refused(&d, &["run.json:", &format!(":{lines}:")]);
}

#[test]
fn missing_timeline_names_the_row() {
    let d = copy_fixture("shm", "notimeline");
    std::fs::remove_file(d.join("timeline-pipeline-20261129T010200Z-103-gpipe-M4.json")).unwrap();
    refused(
        &d,
        &[
            "pipeline.csv:4:",
            "timeline-pipeline-20261129T010200Z-103-gpipe-M4.json",
        ],
        true,
    );
}

#[test]
fn malformed_timeline_names_file_and_line() {
    let d = copy_fixture("shm", "badtimeline");
    let path = d.join("timeline-pipeline-20261129T010200Z-103-1f1b-M2.json");
    std::fs::write(
        &path,
        "{\"traceEvents\": [\n  {\"ph\": \"X\", \"name\": \"0F0\",\n  \"ts\": oops}\n]}",
    )
    .unwrap();
    refused(
        &d,
        &["timeline-pipeline-20261129T010200Z-103-1f1b-M2.json:3:"],
        true,
    );
}

#[test]
fn missing_or_empty_folders_are_refused() {
    let missing = scratch("missing").join("nothing-here");
    assert_refused(&missing, &["nothing-here", "no such results folder"]);
    let empty = scratch("empty");
    assert_refused(&empty, &["no records"]);
}

#[test]
fn unwritable_output_is_one_line() {
    let o = report(&[
        "html",
        fixture("shm").to_str().unwrap(),
        "--output-file",
        "/nonexistent-dir/r.html",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent-dir/r.html"),
        "{}",
        stderr(&o)
    );
}

/// Rewrites column `col` of every row of `dir/collectives.csv` to `value`.
fn set_column(dir: &Path, col: &str, value: &str) {
    let path = dir.join("collectives.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let at = header.split(',').position(|c| c == col).unwrap();
    let mut out = format!("{header}\n");
    for l in lines {
        let mut cells: Vec<&str> = l.split(',').collect();
        cells[at] = value;
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    std::fs::write(&path, out).unwrap();
}

#[test]
fn a_garbage_csv_without_a_newline_is_refused() {
    // Was read as a header with no rows: an empty report, exit 0.
    let d = copy_fixture("shm", "garbage");
    let garbage: Vec<u8> = (0..10_000_000u32)
        .map(|i| b"abc;,x9 \"q"[(i.wrapping_mul(2654435761) >> 28) as usize % 10])
        .collect();
    std::fs::write(d.join("collectives.csv"), garbage).unwrap();
    assert_refused(&d, &["collectives.csv"]);
}

#[test]
fn nan_inf_and_negative_figures_name_file_line_and_column() {
    // Was accepted; a run with p50_us=NaN everywhere passed compare.
    for (i, v) in ["NaN", "inf", "-3.5"].into_iter().enumerate() {
        let d = copy_fixture("shm", &format!("bad-figure-{i}"));
        set_column(&d, "p50_us", v);
        assert_refused(&d, &["collectives.csv:2", "p50_us"]);
    }
}

#[test]
fn figures_beyond_any_measurement_name_file_line_and_column() {
    // Were read: 1e300 us printed as 300 digits in compare and html, 1e-300
    // drew axes of hundred-digit ticks.
    for (i, v) in ["1e300", "1e-300"].into_iter().enumerate() {
        let d = copy_fixture("shm", &format!("beyond-figure-{i}"));
        set_column(&d, "p50_us", v);
        assert_refused(&d, &["collectives.csv:2", "p50_us", v]);
    }
}

#[test]
fn non_utf8_text_is_one_line_with_file_and_line() {
    // Was a debug dump: Utf8 { pos: Some(Position {...}) }.
    let d = copy_fixture("shm", "non-utf8");
    let path = d.join("collectives.csv");
    let mut bytes = std::fs::read(&path).unwrap();
    let second = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes.splice(second + 2..second + 2, [0xff, 0xfe]);
    std::fs::write(&path, bytes).unwrap();
    assert_refused(&d, &["collectives.csv:2"]);
    let o = report(&["compare", d.to_str().unwrap(), d.to_str().unwrap()]);
    assert!(!stderr(&o).contains("Position"), "{}", stderr(&o));
}

#[test]
fn a_timeline_outside_the_folder_is_not_opened() {
    // Was followed: ../../../../etc/hostname was read and drawn. Here the
    // file outside is a valid timeline, so only the folder rule refuses it.
    let d = copy_fixture("shm", "timeline-escape");
    let path = d.join("pipeline.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    let first = text
        .lines()
        .nth(1)
        .and_then(|l| l.split(',').find(|c| c.starts_with("timeline-")))
        .unwrap()
        .to_string();
    let outside = d.parent().unwrap().join("escaped-timeline.json");
    std::fs::copy(d.join(&first), &outside).unwrap();
    std::fs::write(&path, text.replace(&first, "../escaped-timeline.json")).unwrap();
    refused(
        &d,
        &[
            "../escaped-timeline.json",
            "not a file name in the results folder",
        ],
        true,
    );
}

#[test]
fn plan_refuses_kv_heads_that_do_not_divide_heads() {
    let o = report(&[
        "plan",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--kv-heads",
        "3",
        "--ffn",
        "256",
        "--vocab",
        "100",
        "--global-batch",
        "8",
        "--gpus",
        "2",
        "--compute-tflops",
        "10",
        "--device-memory",
        "40",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--kv-heads 3") && err.contains("--heads 4"),
        "{err}"
    );
}
