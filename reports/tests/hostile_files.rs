//! Outputs and inputs a hostile user names (issue 33): `report html -o`
//! and `report plan --output-file` never write through a device, FIFO or symlink
//! nor over a record of another kind, and a record that is a FIFO or a
//! link to /dev/zero is refused in one line without blocking or growing.

mod common;
use common::*;
use std::path::Path;
use std::process::Output;

fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "mkfifo");
}

fn refused(o: &Output, what: &str, want: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err:?}");
    for w in want {
        assert!(err.contains(w), "{what}: {w:?} not in {err:?}");
    }
}

/// Runs `report ARGS` with a deadline: a FIFO must never block it.
fn report_within(args: &[&str]) -> Output {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_report"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("report {args:?} still running after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn outputs_are_regular_files_and_never_replace_a_record() {
    let base = copy_fixture("shm", "hostile-base");
    let b = base.to_str().unwrap();
    let dir = scratch("hostile-outputs");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep").unwrap();
    let link = dir.join("link.html");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let csv = base.join("collectives.csv");
    let rows = std::fs::read(&csv).unwrap();
    let plan = words(
        "plan --model gpt3-1.3b --global-batch 64 --gpus 8 --gpus-per-node 8 --compute-tflops 100 --from",
        &[b, "--output-file"],
    );
    for (out, says) in [
        (Path::new("/dev/full"), "a device"),
        (fifo.as_path(), "a FIFO"),
        (link.as_path(), "a symlink"),
        (csv.as_path(), "one of parbench's records"),
    ] {
        let o = out.to_str().unwrap();
        refused(
            &report_within(&["html", b, "--output-file", o]),
            &format!("html --output-file {o}"),
            &[says],
        );
        let mut args = plan.to_vec();
        args.push(o);
        refused(
            &report_within(&args),
            &format!("plan --output-file {o}"),
            &[says],
        );
    }
    assert!(!Path::new("/dev/full").metadata().unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&csv).unwrap(), rows, "the record kept");

    // A plan may replace the plan it wrote before.
    let json = dir.join("plan.json");
    let mut args = plan.to_vec();
    args.push(json.to_str().unwrap());
    for _ in 0..2 {
        let o = report_within(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
}

#[test]
fn records_that_are_fifos_or_endless_are_refused() {
    let good = fixture("shm");
    let g = good.to_str().unwrap();
    let fifo = copy_fixture("shm", "hostile-fifo");
    std::fs::remove_file(fifo.join("run.json")).unwrap();
    mkfifo(&fifo.join("run.json"));
    let zero = copy_fixture("shm", "hostile-zero");
    std::fs::remove_file(zero.join("collectives.csv")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero.join("collectives.csv")).unwrap();
    for (d, says) in [(&fifo, "a FIFO"), (&zero, "a device")] {
        let d = d.to_str().unwrap();
        refused(&report_within(&["compare", g, d]), d, &[says]);
        let out = scratch("hostile-out").join("r.html");
        refused(
            &report_within(&["html", d, "--output-file", out.to_str().unwrap()]),
            d,
            &[says],
        );
    }
}
