//! `report model` reproduces the worked example with its defaults.

mod common;
use common::*;

#[test]
fn defaults_reproduce_the_worked_example() {
    let o = report(&["model"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "0.500 MiB (524288 B)",  // batch 32 x hidden 8192 x fp16 per all-reduce
        "1.000 MiB (1048576 B)", // about 2x moved per call
        "0.875 MiB (917504 B)",  // exact ring 2(t-1)/t = 1.75 at t=8
        "2(t-1)/t = 1.75",
        "2 x 80 layers",
        "160.000 MiB", // per token step
        "0.419 ms",    // at 400 GB/s (0.4 ms in round figures)
        "6.711 ms",    // at 25 GB/s
        "16.0x",
        "8 stages need 63 microbatches for 90% busy",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let bubble_row = |m: &str| -> String {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(m) && l.contains('%'))
            .unwrap_or_default()
            .to_string()
    };
    assert!(bubble_row("1").contains("75.0%"), "{out}");
    assert!(bubble_row("4").contains("42.9%"), "{out}");
    assert!(bubble_row("16").contains("15.8%"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.contains(" 160 ") && l.contains(" 160")),
        "160 calls"
    );
}

#[test]
fn flags_change_the_figures() {
    let o = report(&[
        "model", "--tp", "4", "--layers", "40", "--intra", "100,2", "--inter", "10,5", "--stages",
        "8",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("2(t-1)/t = 1.50"), "{out}");
    assert!(out.contains("2 x 40 layers"), "{out}");
    assert!(out.contains("10.0x"), "{out}");
    assert!(out.contains("8 stages (equal"), "{out}");
}

#[test]
fn the_last_releases_spellings_still_run_with_a_notice_each() {
    // A bare bandwidth was --intra's syntax, fp16 its default type's name.
    let old = report(&[
        "model", "--intra", "100", "--inter", "10", "--dtype", "fp16",
    ]);
    let new = report(&[
        "model", "--intra", "100,0", "--inter", "10,0", "--dtype", "half",
    ]);
    assert_eq!(old.status.code(), Some(0), "{}", stderr(&old));
    assert_eq!(stdout(&old), stdout(&new));
    let notices = stderr(&old);
    for want in [
        "--intra 100 is now --intra 100,0",
        "--inter 10 is now --inter 10,0",
        "--dtype fp16 is now --dtype half",
    ] {
        assert!(notices.contains(want), "missing {want:?} in\n{notices}");
    }
    assert_eq!(notices.lines().count(), 3, "{notices}");
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    for args in [
        &["model", "--dtype", "fp7"][..],
        &["model", "--tp", "1"],
        &["model", "--inter", "0,5"],
        &["model", "--intra", "fast"],
        &["model", "--stages", "1"],
        &["model", "--busy", "1.5"],
        &["model", "--microbatch-size", "x"],
    ] {
        let o = report(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!stderr(&o).trim().is_empty());
    }
}

#[test]
fn train_mode_doubles_the_calls() {
    let o = report(&[
        "model",
        "--mode",
        "train",
        "--seq",
        "2048",
        "--microbatch-size",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("collective calls per step (4 x 80 layers)"),
        "{out}"
    );
    assert!(out.contains("320"), "{out}");
    // 1 x 2048 x 8192 x 2 bytes = 32 MiB per call.
    assert!(out.contains("32.000 MiB (33554432 B)"), "{out}");
}

#[test]
fn seq_needs_a_mode_that_uses_it() {
    for args in [
        &["model", "--seq", "128"][..],
        &["model", "--mode", "prefill"],
        &["model", "--mode", "sideways"],
    ] {
        let o = report(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
    }
}

/// `report model | head -1`: a closed standard output ends it quietly.
#[test]
fn a_closed_pipe_ends_quietly() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_report"));
    cmd.arg("model");
    let o = parbench::term::run_with_closed_stdout(cmd).unwrap();
    parbench::term::ended_quietly(&o).unwrap();
}

/// The spelling of the last release still runs, with its notice.
#[test]
fn the_old_batch_spelling_runs_with_a_notice() {
    let o = report(&["model", "--batch", "8"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("--batch is now --microbatch-size"));
    assert!(stdout(&o).contains("b 8 x seq 1"), "{}", stdout(&o));
}
