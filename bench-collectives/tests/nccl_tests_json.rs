//! `-J`: nccl-tests' JSON, key for key and type for type, held against a
//! sample of nccl-tests' writer (tests/fixtures/nccl-tests-json, whose
//! README says how it was made); the file named as nccl-tests names it
//! (FILE, else FILE.0, ...; nothing for a name not ending in .json); no
//! secret in it.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every key of `want` is in `got` with the same type, at every depth
/// (arrays through their first elements). parbench's own keys (`parbench`)
/// are extra and allowed.
fn same_keys_and_types(want: &Value, got: &Value, at: &str, missing: &mut Vec<String>) {
    if kind(want) != kind(got) {
        missing.push(format!(
            "{at}: {} in nccl-tests, {} here",
            kind(want),
            kind(got)
        ));
        return;
    }
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => same_keys_and_types(wv, gv, &format!("{at}.{k}"), missing),
                    None => missing.push(format!("{at}.{k}: missing")),
                }
            }
            for k in g.keys() {
                if !w.contains_key(k) && k != "parbench" {
                    missing.push(format!("{at}.{k}: not in nccl-tests' sample"));
                }
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            if let (Some(wf), Some(gf)) = (w.first(), g.first()) {
                same_keys_and_types(wf, gf, &format!("{at}[0]"), missing);
            }
        }
        _ => {}
    }
}

fn fixture() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nccl-tests-json/all_reduce_perf_np2_I1.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

const TOKEN: &str = "tok-34-never-in-a-record";

#[test]
fn json_has_nccl_tests_keys_and_types_and_its_file_naming() {
    let dir = scratch("nccl-json");
    let out = dir.join("out");
    // Not one of parbench's record names (run.json, collectives.csv): -J
    // refuses to stand beside those (issue 33); any other name gets FILE.0.
    let json = dir.join("perf.json");
    // nccl-tests never overwrites: an existing FILE leaves FILE.0 to write.
    std::fs::write(&json, "keep").unwrap();
    let mut args =
        flags("all_reduce --backend local -np 2 -b 8 -e 16 -n 3 -w 1 --format nccl-tests");
    args.extend(["--out", out.to_str().unwrap(), "-J", json.to_str().unwrap()]);
    let o = run(&args, &[("PARBENCH_JOB_TOKEN", TOKEN)]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&json).unwrap(), "keep");
    let written = dir.join("perf.json.0");
    // Named before anything else, as nccl-tests does.
    assert_eq!(
        text.lines().next(),
        Some(format!("# Writing JSON output to {}", written.display()).as_str()),
        "{text}"
    );
    let raw = std::fs::read_to_string(&written).unwrap();
    assert!(!raw.contains(TOKEN), "the job token was written");
    let doc: Value = serde_json::from_str(&raw).unwrap();

    let mut problems = Vec::new();
    same_keys_and_types(&fixture(), &doc, "", &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");

    // Values nccl-tests' readers parse.
    for key in ["start_time", "end_time"] {
        let t = doc[key].as_str().unwrap();
        let b = t.as_bytes();
        assert!(
            t.len() == 19
                && b[4] == b'-'
                && b[7] == b'-'
                && b[10] == b' '
                && b[13] == b':'
                && b[16] == b':'
                && t.chars().filter(char::is_ascii_digit).count() == 14,
            "{key} is not %Y-%m-%d %H:%M:%S: {t}"
        );
    }
    assert_eq!(doc["nccl_version"], 0, "no NCCL ran");
    assert_eq!(doc["config"]["step_factor"], 2);
    assert_eq!(doc["config"]["maximum_bytes"], 16);
    assert_eq!(doc["config"]["validation"], 1);
    for r in doc["results"].as_array().unwrap() {
        for key in ["out_of_place_per_iter", "in_place_per_iter"] {
            let per = &r[key]["per_process_max_times_us"];
            assert_eq!(per.as_array().map(Vec::len), Some(2), "{r}");
            // nccl-tests' times_us is the maximum over process rows.
            let times = r[key]["times_us"].as_array().unwrap();
            for (i, t) in times.iter().enumerate() {
                let max = per
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|row| row[i].as_f64().unwrap())
                    .fold(f64::MIN, f64::max);
                assert!((t.as_f64().unwrap() - max).abs() < 1e-9, "{r}");
            }
        }
    }

    // A second run with FILE and FILE.0 in place writes FILE.1.
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.join("perf.json.1").exists());

    // nccl-tests' analyzer, when this machine has it (NCCL_TESTS_ANALYZE: its path).
    if let Ok(script) = std::env::var("NCCL_TESTS_ANALYZE") {
        let a = std::process::Command::new("python3")
            .arg(&script)
            .arg(&written)
            .arg("--all")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&a.stdout);
        assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
        assert!(!said.contains("No per-process data available"), "{said}");
    }
}

#[test]
fn a_name_not_ending_in_json_gets_nothing() {
    let dir = scratch("nccl-json-name");
    let file = dir.join("run.txt");
    let mut args = flags("all_reduce --backend local -np 2 -b 8 -e 8 -n 1 -w 0");
    args.extend(["--out", dir.to_str().unwrap(), "-J", file.to_str().unwrap()]);
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!file.exists() && !dir.join("run.txt.0").exists());
    assert!(stderr(&o).contains("nothing written"), "{}", stderr(&o));
    assert!(!stdout(&o).contains("Writing JSON output"));
}
