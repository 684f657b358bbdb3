//! End-to-end runs of the binary on the `tcp` backend: `-np 2` spawns two
//! rank processes on loopback.

mod common;
use common::*;

const SMALL: &[&str] = &[
    "--backend",
    "tcp",
    "-np",
    "2",
    "-b",
    "8",
    "-e",
    "4K",
    "-f",
    "8",
    "-n",
    "5",
    "-w",
    "1",
];

#[test]
fn two_processes_sweep_exactly_and_rank_zero_records() {
    let dir = scratch("tcp");
    let out = dir.to_str().unwrap();
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&[
        "all_reduce",
        "all_gather",
        "broadcast",
        "-r",
        "1",
        "--out",
        out,
    ]);
    let o = run(&args, &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    assert!(text.contains("backend tcp, wire tcp"), "{text}");
    assert!(
        text.contains("# Wire ceiling:") && text.contains("one stream rank 0 -> 1"),
        "{text}"
    );
    assert!(text.contains("# Correctness: 0 wrong elements"), "{text}");
    // Only rank 0 prints the table.
    assert_eq!(text.matches("# all_reduce: busbw").count(), 1, "{text}");
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    assert_eq!(rows.len(), 3 * 4 * 2);
    for r in &rows {
        assert_eq!(
            (
                r["backend"].as_str(),
                r["world"].as_str(),
                r["wrong"].as_str()
            ),
            ("tcp", "2", "0"),
            "{r:?}"
        );
    }
    assert!(rows
        .iter()
        .filter(|r| r["collective"] == "broadcast")
        .all(|r| r["root"] == "1"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_element_on_another_process_makes_exit_code_one() {
    let dir = scratch("tcp-corrupt");
    let out = dir.to_str().unwrap();
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["all_reduce", "-e", "64", "--out", out]);
    let o = run(&args, &[("PARBENCH_SELFTEST_CORRUPT_RANK", "1")]);
    assert_eq!(o.status.code(), Some(1), "{}\n{}", stdout(&o), stderr(&o));
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["wrong"] == "1"),
        "{rows:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
