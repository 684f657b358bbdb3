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

/// Issue 52: a record that is a symlink leading nowhere, and a timeline
/// that is a FIFO or a folder, are named for what they are, never skipped
/// nor called missing.
#[test]
fn dangling_records_and_timelines_that_are_not_files_are_named() {
    let out = scratch("hostile-52-out").join("r.html");
    let o = out.to_str().unwrap();
    let dangling = copy_fixture("shm", "hostile-dangling");
    std::fs::remove_file(dangling.join("collectives.csv")).unwrap();
    std::os::unix::fs::symlink("gone.csv", dangling.join("collectives.csv")).unwrap();
    let d = dangling.to_str().unwrap();
    refused(
        &report_within(&["html", d, "--output-file", o]),
        "dangling collectives.csv",
        &["collectives.csv", "leads nowhere"],
    );
    let name = "timeline-pipeline-20261129T010200Z-103-gpipe-M1.json";
    for (what, says) in [("fifo", "a FIFO"), ("folder", "a folder")] {
        let dir = copy_fixture("shm", &format!("hostile-timeline-{what}"));
        let t = dir.join(name);
        std::fs::remove_file(&t).unwrap();
        if what == "fifo" {
            mkfifo(&t);
        } else {
            std::fs::create_dir(&t).unwrap();
        }
        let o = report_within(&["html", dir.to_str().unwrap(), "--output-file", o]);
        refused(&o, what, &[says, name]);
        assert!(!stderr(&o).contains("does not exist"), "{}", stderr(&o));
    }
}

/// Issue 52: `--output-file` replaces only a file of its own kind (an
/// earlier report), never a user's other file, and the file it replaces
/// keeps its mode; `report trend` reads each night's compare.md as it
/// reads every record.
#[test]
fn outputs_replace_only_their_own_kind_and_keep_the_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("hostile-52-kind");
    let f = fixture("shm");
    let f = f.to_str().unwrap();
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "notes\n").unwrap();
    let n = notes.to_str().unwrap();
    let plan = words(
        "plan --model gpt3-1.3b --global-batch 64 --gpus 8 --gpus-per-node 8 --compute-tflops 100 --from",
        &[f, "--output-file", n],
    );
    let nights = scratch("hostile-52-nights");
    let night = copy_fixture("shm", "hostile-52-nights/2026-11-29");
    assert!(night.starts_with(&nights));
    for args in [
        vec!["html", f, "--output-file", n],
        vec!["trend", nights.to_str().unwrap(), "--output-file", n],
        plan,
    ] {
        refused(
            &report_within(&args),
            &args.join(" "),
            &["holds other content"],
        );
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "notes\n");
    }
    let page = dir.join("report.html");
    std::fs::write(&page, "<!DOCTYPE html>\n<p>last night's</p>\n").unwrap();
    std::fs::set_permissions(&page, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = report_within(&["html", f, "--output-file", page.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta = std::fs::metadata(&page).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(meta.len() > 1000);
    // A compare.md that is a FIFO or a link to /dev/zero: one line, at once.
    let trend_out = dir.join("trend.html");
    let t = trend_out.to_str().unwrap();
    mkfifo(&night.join("compare.md"));
    let nn = nights.to_str().unwrap();
    refused(
        &report_within(&["trend", nn, "--output-file", t]),
        "fifo",
        &["a FIFO"],
    );
    std::fs::remove_file(night.join("compare.md")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", night.join("compare.md")).unwrap();
    refused(
        &report_within(&["trend", nn, "--output-file", t]),
        "zero",
        &["a device"],
    );
}

/// Issue 52: `report compare --markdown` escapes what it copies from the
/// records (run ids) for Markdown: no raw tag, no broken table.
#[test]
fn compare_markdown_escapes_run_ids() {
    let hostile = "<img src=x onerror=alert(1)>|x";
    let dirs: Vec<_> = ["base", "cur"]
        .iter()
        .map(|side| {
            let d = rounds_folder(&format!("hostile-52-md-{side}"), 1, |_, _| 1.0, |_| 0.5);
            let rename = |file: &str| {
                let p = d.join(file);
                let text = std::fs::read_to_string(&p).unwrap();
                let id = "collectives-20261129T000000Z-0";
                // A JSON string takes it as it is; a CSV field, quoted.
                let new = if file == "run.json" {
                    text.replace(id, hostile)
                } else {
                    text.replace(id, &format!("\"{hostile}\""))
                };
                std::fs::write(&p, new).unwrap();
            };
            rename("collectives.csv");
            rename("run.json");
            d
        })
        .collect();
    let o = report(&[
        "compare",
        dirs[0].to_str().unwrap(),
        dirs[1].to_str().unwrap(),
        "--markdown",
    ]);
    let md = stdout(&o);
    assert!(
        md.contains("onerror"),
        "the noisy run is listed: {md}{}",
        stderr(&o)
    );
    assert!(!md.contains("<img"), "{md}");
    assert!(
        md.contains("&lt;img src=x onerror=alert(1)&gt;\\|x"),
        "{md}"
    );
}

/// Issue 52: `report plan --against DIR` with no composed run: one line,
/// exit 2, naming the flag typed.
#[test]
fn plan_against_without_a_composed_run_is_one_line() {
    let o = report(&["plan", "--against", fixture("shm").to_str().unwrap()]);
    refused(&o, "--against", &["--against", "no composed"]);
    assert!(!stderr(&o).contains("--check"), "{}", stderr(&o));
}
