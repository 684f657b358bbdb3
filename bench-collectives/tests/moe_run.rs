//! all_to_all_v's rows and the `moe` pattern end to end: exact on local
//! and tcp, a corrupted byte seen (exit 7), records written.

mod common;
use common::*;

fn moe_rows(dir: &std::path::Path) -> Vec<std::collections::HashMap<String, String>> {
    read_csv(&dir.join("moe.csv")).1
}

#[test]
fn all_to_all_v_rows_are_exact_on_local_and_tcp() {
    for backend in ["local", "tcp"] {
        let dir = scratch(&format!("a2av-{backend}"));
        let line = format!("--backend {backend} -np 3 -b 8 -e 64K -f 8 -n 2 -w 1 alltoallv");
        let mut args = flags(&line);
        args.extend(["--out", dir.to_str().unwrap()]);
        let o = run(&args, &[]);
        assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
        let text = stdout(&o);
        assert!(
            text.contains("# all_to_all_v, busbw = algbw x 0.67"),
            "{text}"
        );
        let (_, rows) = read_csv(&dir.join("collectives.csv"));
        assert!(rows.len() >= 8, "{rows:?}");
        assert!(rows
            .iter()
            .all(|r| r["collective"] == "all_to_all_v" && r["wrong"] == "0"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// One `moe` run on `backend` with `extra` flags: its two rows, checked exact.
fn moe_exact(
    backend: &str,
    np: &str,
    extra: &str,
) -> Vec<std::collections::HashMap<String, String>> {
    let dir = scratch(&format!("moe-{backend}-{}", extra.len()));
    let line =
        format!("moe --backend {backend} -np {np} -n 2 -w 1 --tokens 96 --hidden 256 {extra}");
    let mut args = flags(&line);
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = run(&args, &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{line}:\n{text}\n{}", stderr(&o));
    for needle in [
        "# parbench bench-collectives moe:",
        "  dispatch",
        "  combine",
        "# imbalance:",
    ] {
        assert!(
            text.contains(needle),
            "{line}: missing {needle:?} in\n{text}"
        );
    }
    // Short lines: all but the records' paths and the noise guard's line.
    for l in text.lines() {
        let kept = l.starts_with("# Records:") || l.starts_with("# Noise:");
        assert!(kept || l.chars().count() <= 110, "{l}");
    }
    let rows = moe_rows(&dir);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r["wrong"] == "0"), "{rows:?}");
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

#[test]
fn moe_is_exact_on_local_in_every_form() {
    let rows = moe_exact("local", "4", "--experts 8 --topk 2");
    assert_eq!(
        (rows[0]["phase"].as_str(), rows[1]["phase"].as_str()),
        ("dispatch", "combine")
    );
    // Dedup bf16: a dispatched copy and a combined one are both 2H bytes.
    assert_eq!(rows[0]["bytes"], rows[1]["bytes"]);
    let skewed = moe_exact(
        "local",
        "4",
        "--experts 16 --topk 4 --routing zipf:1.5 --payload fp8 --copies k",
    );
    assert_eq!(skewed[0]["payload"], "fp8");
    // k copies: every rank sends T x k copies of H + 4H/128 bytes.
    assert_eq!(skewed[0]["bytes"], (96 * 4 * (256 + 8)).to_string());
    let imb: f64 = skewed[0]["imbalance"].parse().unwrap();
    assert!(imb > 1.1, "zipf:1.5 over 16 experts is uneven: {imb}");
    let limited = moe_exact(
        "local",
        "4",
        "--experts 16 --topk 4 --node-limit 2 --capacity-factor 1.0 --routing zipf:1",
    );
    let dropped: u64 = limited[0]["dropped"].parse().unwrap();
    assert!(dropped > 0, "{limited:?}");
}

#[test]
fn moe_is_exact_on_tcp() {
    moe_exact("tcp", "3", "--experts 6 --topk 3 --routing zipf:1.2");
}

#[test]
fn a_corrupted_byte_makes_exit_code_seven() {
    let dir = scratch("moe-corrupt");
    let mut args =
        flags("moe --backend local -np 2 -n 1 -w 0 --tokens 16 --hidden 128 --experts 4 --topk 2");
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = run(&args, &[("PARBENCH_SELFTEST_CORRUPT_RANK", "1")]);
    assert_eq!(o.status.code(), Some(7), "{}\n{}", stdout(&o), stderr(&o));
    let rows = moe_rows(&dir);
    assert!(rows.iter().all(|r| r["wrong"] != "0"), "{rows:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
