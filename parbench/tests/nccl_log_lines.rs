//! The NCCL tuning-log parser (`comm::nccl_tuning`) on lines NCCL really
//! printed, copied from public bug reports (tests/fixtures/nccl_real_lines.log,
//! each block with its source), so that the first GPU run does not meet a
//! format the parser has never seen. Needs no GPU and no NCCL.

use parbench::comm::nccl_tuning::{label_for, parse_line, parse_log};
use parbench::comm::Collective;

const REAL: &str = include_str!("fixtures/nccl_real_lines.log");

fn log_lines() -> impl Iterator<Item = &'static str> {
    REAL.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
}

#[test]
fn every_line_has_its_source_named_above_it() {
    let mut source: Option<&str> = None;
    let mut lines = 0;
    for l in REAL.lines() {
        if let Some(url) = l.strip_prefix("# source: ") {
            source = Some(url);
        } else if l.trim().is_empty() {
            continue;
        } else if !l.starts_with('#') {
            let url = source.unwrap_or_else(|| panic!("no source above: {l}"));
            assert!(
                url.starts_with("https://github.com/")
                    && (url.contains("/issues/") || url.contains("/pull/")),
                "a public report: {url}"
            );
            lines += 1;
        }
    }
    assert!(lines >= 30, "{lines} lines");
}

#[test]
fn every_tuning_line_in_the_reports_parses() {
    // A line that says "Bytes -> Algo" and does not parse is a format the
    // parser lost: its size would read `unknown` on a GPU.
    for l in log_lines().filter(|l| l.contains(" Bytes -> Algo ")) {
        assert!(parse_line(l).is_some(), "not parsed: {l}");
    }
    for l in log_lines().filter(|l| !l.contains(" Bytes -> Algo ")) {
        assert_eq!(parse_line(l), None, "not a choice: {l}");
    }
}

#[test]
fn the_reports_choices_are_read_as_nccl_means_them() {
    let choices = parse_log(REAL);
    let got: Vec<(u64, String)> = choices.iter().map(|c| (c.bytes, c.label())).collect();
    let want: Vec<(u64, &str)> = vec![
        // NVIDIA/nccl#1453 (NCCL 2.22, 24 H100s).
        (8589934592, "RING/SIMPLE"),
        (4, "TREE/LL"),
        (128, "TREE/LL"),
        (65536, "TREE/LL"),
        (131072, "TREE/LL128"),
        (262144, "TREE/LL128"),
        // NVIDIA/nccl#1595, where a maintainer reads these as RING/SIMPLE.
        (1026048, "RING/SIMPLE"),
        (805306368, "RING/SIMPLE"),
    ];
    let want: Vec<(u64, String)> = want.into_iter().map(|(b, l)| (b, l.to_string())).collect();
    assert_eq!(got, want);
    // 2.20 - 2.22 name no function and no channels.
    assert!(choices.iter().all(|c| c.func.is_empty() && c.channels == 0));
    // What bench-collectives' algo column would say for those all_reduce rows.
    let labels = [
        (262144, 24, "TREE/LL128"),
        (1026048, 8, "RING/SIMPLE"),
        (1 << 20, 8, "unknown"),
    ];
    for (bytes, world, want) in labels {
        let got = label_for(&choices, Collective::AllReduce, bytes, world);
        assert_eq!(got, want, "{bytes} bytes on {world} ranks");
    }
}
