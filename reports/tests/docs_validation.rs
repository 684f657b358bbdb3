//! docs/report.md against the code: every row of its validation tables
//! ("Against published runs"), every band it quotes and its presets'
//! parameter table must print what the code computes today, so a change
//! of the model that moves a figure fails here until the docs follow.
//! Rows are matched by name, exactly (a docs row may only add
//! " (kept aside)", as `report plan --validation` prints it).

mod common;
use common::*;
use parbench::model::Preset;
use serde_json::Value;
use std::path::Path;

/// The header of every validation table in the docs.
const HEADER: &str =
    "| run | published | predicted | error | costed as | memory (planner's count) |";

/// How `report plan --validation` marks a row kept aside.
const KEPT_ASIDE: &str = " (kept aside)";

fn docs() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The bands as `report plan --validation --output-file` writes them.
fn bands() -> Vec<Value> {
    let json = scratch("docs-validation").join("validation.json");
    let o = report(&[
        "plan",
        "--validation",
        "--output-file",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

/// A figure as the docs print it: TFLOP/s to 0.1, tokens/s to 1, seconds
/// to 0.01 with " s" (the unit is the published figure's).
fn figure(unit: &str, x: f64) -> String {
    match unit {
        "model_tflops" | "hardware_tflops" => format!("{x:.1}"),
        "tokens_per_gpu_s" => format!("{x:.0}"),
        "step_seconds" => format!("{x:.2} s"),
        other => panic!("unknown published unit {other}"),
    }
}

/// One row of the code, each cell as the docs must print it.
struct CodeRow {
    name: String,
    kept_aside: bool,
    /// published, predicted, error, costed as, memory.
    cells: [(&'static str, String); 5],
}

fn code_rows(bands: &[Value]) -> Vec<CodeRow> {
    let mut rows = Vec::new();
    for b in bands {
        for r in b["rows"].as_array().unwrap() {
            let (unit, published) = r["published"].as_object().unwrap().iter().next().unwrap();
            let published = published.as_f64().unwrap();
            let predicted = r["predicted"].as_f64().unwrap();
            rows.push(CodeRow {
                name: r["name"].as_str().unwrap().to_string(),
                kept_aside: r["kept_aside"].as_bool().unwrap(),
                cells: [
                    ("published", figure(unit, published)),
                    ("predicted", figure(unit, predicted)),
                    (
                        "error",
                        format!("{:+.1}%", r["error"].as_f64().unwrap() * 100.0),
                    ),
                    ("costed as", r["costed"].as_str().unwrap().to_string()),
                    (
                        "memory",
                        format!(
                            "{:.1} GiB",
                            r["memory_bytes"].as_f64().unwrap() / (1u64 << 30) as f64
                        ),
                    ),
                ],
            });
        }
    }
    rows
}

/// A table row's cells, trimmed.
fn cells(line: &str) -> Vec<&str> {
    line.trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .split('|')
        .map(str::trim)
        .collect()
}

/// The rows of every validation table: (line number, cells).
fn docs_rows(doc: &str) -> Vec<(usize, Vec<&str>)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for (i, line) in doc.lines().enumerate() {
        if line == HEADER {
            in_table = true;
        } else if !line.starts_with('|') {
            in_table = false;
        } else if in_table && !line.starts_with("|---") {
            rows.push((i + 1, cells(line)));
        }
    }
    rows
}

#[test]
fn validation_tables_print_what_the_code_computes() {
    let doc = docs();
    let code = code_rows(&bands());
    let mut problems = Vec::new();
    let mut seen = vec![0; code.len()];
    for (line, cells) in docs_rows(&doc) {
        let at = format!("docs/report.md:{line}");
        if cells.len() != 6 {
            problems.push(format!("{at}: {} cells, not 6", cells.len()));
            continue;
        }
        let (name, kept) = match cells[0].strip_suffix(KEPT_ASIDE) {
            Some(n) => (n, true),
            None => (cells[0], false),
        };
        let Some(i) = code.iter().position(|r| r.name == name) else {
            problems.push(format!(
                "{at}: row {name:?} is not a row of the validation table (validation.rs)"
            ));
            continue;
        };
        seen[i] += 1;
        let r = &code[i];
        if kept != r.kept_aside {
            problems.push(format!(
                "{at}: {name}: kept aside is {} in the code, {kept} in the docs",
                r.kept_aside
            ));
        }
        for ((what, want), got) in r.cells.iter().zip(&cells[1..]) {
            // The published cell may carry a note after the figure.
            let ok = if *what == "published" {
                got == want || got.starts_with(&format!("{want} ("))
            } else {
                got == want
            };
            if !ok {
                problems.push(format!(
                    "{at}: {name}: {what} is {want:?} by the code, {got:?} in the docs"
                ));
            }
        }
    }
    for (r, n) in code.iter().zip(&seen) {
        if *n != 1 {
            problems.push(format!(
                "docs/report.md: row {:?} of the code is in the validation tables {n} times, not once",
                r.name
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/report.md is stale against `report plan --validation` ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Every quoted band (`band: ...` or `Band: `...``, possibly across a
/// line break), as the code's band line prints it.
#[test]
fn quoted_bands_are_the_codes() {
    let doc = docs().split_whitespace().collect::<Vec<_>>().join(" ");
    let bands = bands();
    let expected: Vec<(String, String)> = bands
        .iter()
        .map(|b| {
            let stack = b["stack"].as_str().unwrap().to_string();
            let line = format!(
                "{stack} on {}: {:+.0}% mean, {:.0}% worst over {} published runs",
                b["devices"].as_str().unwrap(),
                b["mean"].as_f64().unwrap() * 100.0,
                b["worst"].as_f64().unwrap() * 100.0,
                b["rows"].as_array().unwrap().len()
            );
            (stack, line)
        })
        .collect();
    let mut problems = Vec::new();
    let mut quoted = vec![false; expected.len()];
    let end = " published runs`";
    let mut rest = doc.as_str();
    while let Some(at) = rest.find(end) {
        let before = &rest[..at + end.len() - 1];
        rest = &rest[at + end.len()..];
        let Some(open) = before.rfind('`') else {
            continue;
        };
        let text = &before[open + 1..];
        let text = text.strip_prefix("band: ").unwrap_or(text);
        let stack = text.split_once(" on ").map_or(text, |(s, _)| s);
        match expected.iter().position(|(s, _)| s == stack) {
            Some(i) => {
                quoted[i] = true;
                if text != expected[i].1 {
                    problems.push(format!(
                        "band {stack}: {:?} by the code, {text:?} in the docs",
                        expected[i].1
                    ));
                }
            }
            None => problems.push(format!("band {text:?}: no such band in the code")),
        }
    }
    for ((stack, line), q) in expected.iter().zip(&quoted) {
        if !q {
            problems.push(format!(
                "band {stack} is quoted nowhere in docs/report.md (Band: `{line}`)"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/report.md quotes stale bands ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// "The presets' parameters": each MoE preset's total and active counts
/// from its config, in billions to 0.01.
#[test]
fn presets_parameter_table_is_the_codes() {
    let doc = docs();
    let header = "| preset | from its config | total | published | active | published |";
    let mut lines = doc.lines().enumerate().skip_while(|(_, l)| *l != header);
    assert!(
        lines.next().is_some(),
        "docs/report.md: no table {header:?}"
    );
    let mut problems = Vec::new();
    let mut listed = Vec::new();
    for (i, line) in lines.skip(1).take_while(|(_, l)| l.starts_with('|')) {
        let c = cells(line);
        let name = c[0].trim_matches('`');
        let Some((all, act)) = Preset::by_name(name).and_then(|p| p.moe_params()) else {
            problems.push(format!(
                "docs/report.md:{}: {name:?} is no MoE preset",
                i + 1
            ));
            continue;
        };
        listed.push(name.to_string());
        for (what, got, n) in [("total", c[2], all), ("active", c[4], act)] {
            let want = format!("{:.2}B", n as f64 / 1e9);
            if got != want {
                problems.push(format!(
                    "docs/report.md:{}: {name}: {what} is {want} by the code, {got} in the docs",
                    i + 1
                ));
            }
        }
    }
    for p in Preset::all().iter().filter(|p| p.moe.is_some()) {
        if !listed.iter().any(|n| n == p.name) {
            problems.push(format!(
                "docs/report.md: MoE preset {} has no row in the presets' parameters",
                p.name
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
