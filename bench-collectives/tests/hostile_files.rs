//! Files a hostile user plants in or names as outputs (issue 33): nothing
//! is written through a symlink, FIFO or device, no record is replaced by
//! other content, no FIFO blocks a run, and each refusal is one line, exit
//! 2, before anything is measured.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

const SMALL: &str = "--backend local -np 2 -b 8 -e 64 -n 1 -w 0";

fn collectives() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench-collectives"))
}

#[test]
fn symlinks_planted_under_every_predictable_name_are_not_followed() {
    let dir = scratch("planted");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep").unwrap();
    // The shell plants links named with its own pid, then becomes the bench:
    // the names the old writers used for their probe and temporary files.
    let plant = r#"v=$1; o=$2; shift 2
for n in .parbench-probe.$$ .collectives.csv.tmp.$$ .run.json.tmp.$$; do ln -s "$v" "$o/$n"; done
exec "$@""#;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", plant, "sh"])
        .arg(&victim)
        .arg(&out)
        .arg(env!("CARGO_BIN_EXE_bench-collectives"))
        .args(flags(SMALL))
        .arg("--out")
        .arg(&out);
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = finish_within(child, 60);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(data_rows(&out.join("collectives.csv")) > 0);
}

#[test]
fn outputs_that_are_not_regular_files_or_are_records_are_refused_first() {
    let dir = scratch("outputs");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let fifo = dir.join("fifo.json");
    mkfifo(&fifo);
    let victim = dir.join("victim.json");
    std::fs::write(&victim, "keep").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for (j, says) in [
        (fifo.as_path(), "a FIFO"),
        (link.as_path(), "a symlink"),
        (Path::new("/dev/full"), "a device"),
        (Path::new("/sys/kernel/x.json"), "-J /sys/kernel/x.json"),
    ] {
        let j = j.to_str().unwrap();
        let mut args = flags(SMALL);
        args.extend(["-J", j]);
        refused_in_one_line(collectives(), &args, &[says], "collectives.csv");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(!Path::new("/dev/full").metadata().unwrap().is_file());

    // A record of the folder named as -J keeps its rows.
    let first = run(
        &[&flags(SMALL)[..], &["--out", out.to_str().unwrap()]].concat(),
        &[],
    );
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let csv = out.join("collectives.csv");
    let before = std::fs::read(&csv).unwrap();
    let j = csv.to_str().unwrap();
    let mut args = flags(SMALL);
    args.extend(["-J", j, "--out", out.to_str().unwrap()]);
    let o = run(&args, &[]);
    assert_refused(
        &o,
        "-J onto collectives.csv",
        &["one of parbench's records"],
    );
    assert_eq!(std::fs::read(&csv).unwrap(), before, "rows kept");
}

#[test]
fn fifos_and_devices_in_the_results_folder_never_block_the_run() {
    let dir = scratch("fifos");
    for name in [".parbench.lock", "collectives.csv", "run.json"] {
        let out = dir.join(name.trim_start_matches('.'));
        std::fs::create_dir_all(&out).unwrap();
        mkfifo(&out.join(name));
        let mut args = flags(SMALL);
        let o = out.to_str().unwrap().to_string();
        args.extend(["--out", &o]);
        refused_in_one_line(collectives(), &args, &["a FIFO", name], "nothing.csv");
    }
    let out = dir.join("zero");
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink("/dev/zero", out.join("run.json")).unwrap();
    let o = out.to_str().unwrap().to_string();
    let mut args = flags(SMALL);
    args.extend(["--out", &o]);
    refused_in_one_line(
        collectives(),
        &args,
        &["run.json", "symlink"],
        "collectives.csv",
    );
}

#[test]
fn an_out_that_is_not_a_folder_says_so() {
    let dir = scratch("notafolder");
    let file = dir.join("file.txt");
    std::fs::write(&file, "keep").unwrap();
    for out in [Path::new("/dev/full"), file.as_path()] {
        let mut args = flags(SMALL);
        args.extend(["--out", out.to_str().unwrap()]);
        let o = run(&args, &[]);
        assert_refused(&o, &format!("--out {}", out.display()), &["not a folder"]);
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}
