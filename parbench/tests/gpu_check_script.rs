//! scripts/gpu-check.sh on a machine without a GPU (every CI machine): one
//! line saying so and exit 2 within seconds, before it looks for a bundle or
//! the libraries, so that a check started on the wrong machine costs nothing.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn gpu_listed() -> bool {
    Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.starts_with("GPU "))
        })
}

#[test]
fn gpu_check_without_a_gpu_is_one_line_and_exit_2() {
    if gpu_listed() {
        eprintln!("skipped: this machine has a GPU (scripts/gpu-check.sh runs for real here)");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::temp_dir().join(format!("parbench-gpu-check-{}", std::process::id()));
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .arg(&out)
        // A bundle that is there or not must not matter: no GPU comes first.
        .arg(root.join("no-such-bundle"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    // Not a speed check (tests assert none): a script that waits for
    // anything (a bundle, a library, a device) before this line would hang
    // or take minutes, and this bound tells that apart from a slow machine.
    let deadline = Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpu-check.sh still running after {deadline:?} on a machine without a GPU");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let o = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(status.code(), Some(2), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {text}");
    assert!(lines[0].contains("no GPU"), "{text}");
}
