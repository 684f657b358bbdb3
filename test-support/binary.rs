//! Shared by the binaries' integration tests (bench-collectives,
//! bench-layers, bench-pipeline), which include this file with
//! `#[path = "../../test-support/binary.rs"] mod binary;`: running a built
//! binary with a deadline on every wait, its one-line refusals, the CSV it
//! wrote, and a signal in the middle of a run.
//!
//! Included, not a crate or a library feature: it is test code only, it
//! needs nothing but std and libc (every including crate has both), and
//! each test binary compiles just the helpers it calls.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Waits for `child` at most `secs` seconds (then kills it and fails the
/// test): no test may hang.
pub fn finish_within(mut child: Child, secs: u64) -> Output {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().expect("output");
            panic!(
                "still running after {secs} s: {}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Asserts a refusal: exit 2 and one line on stderr that contains every
/// string of `want`. `what` names the case in a failure.
pub fn assert_refused(o: &Output, what: &str, want: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err:?}");
    for w in want {
        assert!(err.contains(w), "{what}: {w:?} not in {err:?}");
    }
}

/// Runs `cmd` with `args` (and `--out` a fresh folder unless `args` name
/// one) and asserts a refusal: exit 2 within 30 s, one line on stderr
/// containing every string of `want`, and no `csv` in the folder (nothing
/// was measured).
pub fn refused_in_one_line(mut cmd: Command, args: &[&str], want: &[&str], csv: &str) {
    // One folder per call: the tests run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("refused-{csv}-{n}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    cmd.args(args);
    if !args.contains(&"--out") {
        cmd.arg("--out").arg(&dir);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let o = finish_within(child, 30);
    assert_refused(&o, &format!("{args:?}"), want);
    assert!(!dir.join(csv).exists(), "{args:?} measured");
}

/// Asserts the refusal of `--backend nccl` on a machine without a CUDA
/// driver or NCCL: exit 2, one line on stderr naming the missing library
/// and LD_LIBRARY_PATH, nothing on stdout. `what` names the case.
pub fn assert_nccl_missing(o: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: one line: {stderr}");
    assert!(
        stderr.contains("libcuda") || stderr.contains("libnccl"),
        "{stderr}"
    );
    assert!(stderr.contains("LD_LIBRARY_PATH"), "{stderr}");
    assert!(
        o.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// The CSV's header and rows as maps from column to value.
pub fn read_csv(path: &Path) -> (Vec<String>, Vec<HashMap<String, String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let rows = lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(str::to_string))
                .collect()
        })
        .collect();
    (header, rows)
}

/// Data rows in the CSV `file` so far (0 while there is no file).
pub fn data_rows(file: &Path) -> usize {
    std::fs::read_to_string(file)
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

/// Waits (120 s at most) until `csv` holds `rows` data rows while `child`
/// runs, sends it `signal`, and waits (30 s at most) for it to end.
/// Returns the rows counted before the signal and the child's output.
pub fn signal_after_rows(
    mut child: Child,
    csv: &Path,
    rows: usize,
    signal: i32,
) -> (usize, Output) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while data_rows(csv) < rows {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("no {rows} rows within 120 s, or the run ended first");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = data_rows(csv);
    // SAFETY: kill(2) of the child this test started.
    unsafe { libc::kill(child.id() as i32, signal) };
    (before, finish_within(child, 30))
}

/// The rank (`RANK`) of each child process of `pid`, once `n` of them
/// have started (within `secs` seconds): (rank, pid).
pub fn ranks_of(pid: u32, n: usize, secs: u64) -> Vec<(usize, i32)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let kids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        // A child shows its own environment once it has exec'd.
        let ranks: Vec<(usize, i32)> = kids
            .iter()
            .filter_map(|&k| {
                let env = std::fs::read(format!("/proc/{k}/environ")).ok()?;
                let rank = env
                    .split(|&b| b == 0)
                    .find_map(|v| v.strip_prefix(b"RANK="))?;
                Some((std::str::from_utf8(rank).ok()?.parse().ok()?, k))
            })
            .collect();
        if ranks.len() >= n {
            return ranks;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {n} ranks started",
            ranks.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Makes a FIFO at `path` (what a hostile user plants in place of a file).
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string for the call's duration.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}
