//! docs/report.md against the code: every row of its validation tables
//! ("Against published runs"), every band it quotes, its MoE presets'
//! parameter counts and its tables of costed MoE layouts and DeepEP
//! dispatches must print what the code computes today, so a change of
//! the model that moves a figure fails here until the docs follow. Rows
//! are matched by name, exactly (a validation row may only add
//! " (kept aside)", as `report plan --validation` prints it).

mod common;
use common::*;
use parbench::model::plan::Costed;
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
    let code = code_rows(&validation_bands("docs-validation"));
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
    let bands = validation_bands("docs-bands");
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

/// The layout `report plan LINE --output-file` costs for its `--layout`.
fn costed(name: &str, line: &str) -> Costed {
    let json = scratch(&format!("docs-{name}")).join("plan.json");
    let o = report(&words(line, &["--output-file", json.to_str().unwrap()]));
    assert_eq!(o.status.code(), Some(0), "{line}: {}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    serde_json::from_value(v["top"][0].clone()).unwrap()
}

/// Whether `token` (a figure as the docs print it, "+7", "23.4") is
/// `value` rounded to the digits printed.
fn rounds(token: &str, value: f64) -> bool {
    let d = token.split_once('.').map_or(0, |(_, f)| f.len());
    let shown = if token.starts_with('+') {
        format!("{value:+.d$}")
    } else {
        format!("{value:.d$}")
    };
    shown == token
}

/// The figures of a cell: "17.1 s (51%)" gives ["17.1", "51"].
fn figures(cell: &str) -> Vec<&str> {
    cell.split(|c: char| c.is_whitespace() || "()%/".contains(c))
        .filter(|w| w.parse::<f64>().is_ok())
        .collect()
}

/// A time cell's figure in its unit ("82 ms", "2.37 s").
fn in_unit(cell: &str, seconds: f64) -> f64 {
    if cell.contains(" ms") {
        seconds * 1e3
    } else {
        seconds
    }
}

/// Checks the rows of the table under `header`: each row's first cell
/// names one of `rows`, whose figures (per cell after the first) the
/// row must print, rounded as it prints them.
fn check_table(
    doc: &str,
    header: &str,
    rows: &[(String, Vec<Vec<f64>>)],
    problems: &mut Vec<String>,
) {
    let mut seen = vec![false; rows.len()];
    let mut lines = doc.lines().enumerate().skip_while(|(_, l)| *l != header);
    if lines.next().is_none() {
        problems.push(format!("docs/report.md: no table {header:?}"));
        return;
    }
    for (i, line) in lines.skip(1).take_while(|(_, l)| l.starts_with('|')) {
        let c = cells(line);
        let at = format!("docs/report.md:{}", i + 1);
        let Some(k) = rows.iter().position(|(name, _)| name == c[0]) else {
            problems.push(format!(
                "{at}: row {:?} is costed by no command of this test",
                c[0]
            ));
            continue;
        };
        seen[k] = true;
        for (cell, want) in c[1..].iter().zip(&rows[k].1) {
            let got = figures(cell);
            if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| !rounds(g, *w)) {
                let want: Vec<String> = want.iter().map(|w| format!("{w:.3}")).collect();
                problems.push(format!(
                    "{at}: {}: {cell:?} in the docs, {} by the code",
                    c[0],
                    want.join(", ")
                ));
            }
        }
    }
    for ((name, _), s) in rows.iter().zip(seen) {
        if !s {
            problems.push(format!("docs/report.md: {header}: no row {name:?}"));
        }
    }
}

/// "Megatron-Core's published MoE layouts": each row as its command
/// costs it (step, model TFLOP/s and MFU, exposed all-to-all and its
/// share, memory).
#[test]
fn moe_layouts_table_is_the_codes() {
    let doc = docs();
    let header = "| layout | step | TFLOP/s a GPU (MFU) | all-to-all exposed | memory |";
    let h100 = "--device h100-sxm5-80gb --stack megatron-core";
    let deepep = "--moe-dispatcher deepep";
    let runs = [
        ("Mixtral 8x7B, 64 H100, dp=16 tp=1 pp=4 v=8 ep=8", 64, "--model mixtral-8x7b --gpus 64 --global-batch 256 --layout dp=16,tp=1,pp=4,vpp=8,ep=8", ""),
        ("Mixtral 8x22B, 128 H100, dp=4 tp=4 pp=8 v=7 ep=2", 128, "--model mixtral-8x22b --gpus 128 --global-batch 256 --layout dp=4,tp=4,pp=8,vpp=7,ep=2", ""),
        ("DeepSeek-V3, 1024 H100, dp=64 tp=2 pp=8 v=4 ep=64 etp=1", 1024, "--model deepseek-v3 --gpus 1024 --global-batch 8192 --layout dp=64,tp=2,pp=8,vpp=4,ep=64,etp=1,first=1,last=0", ""),
        ("DeepSeek-V3, the same, `--moe-dispatcher deepep`", 1024, "--model deepseek-v3 --gpus 1024 --global-batch 8192 --layout dp=64,tp=2,pp=8,vpp=4,ep=64,etp=1,first=1,last=0", deepep),
        ("Qwen3-235B-A22B, 256 H100, dp=16 tp=2 pp=8 v=4 ep=32 etp=1", 256, "--model qwen3-235b-a22b --gpus 256 --global-batch 2048 --layout dp=16,tp=2,pp=8,vpp=4,ep=32,etp=1", ""),
        ("Qwen3-235B-A22B, the same, `--moe-dispatcher deepep` (the validation row without its recomputation)", 256, "--model qwen3-235b-a22b --gpus 256 --global-batch 2048 --layout dp=16,tp=2,pp=8,vpp=4,ep=32,etp=1", deepep),
    ];
    let mut rows = Vec::new();
    let line = |cell: &str| {
        doc.lines()
            .find(|l| l.starts_with(&format!("| {cell} |")))
            .map(|l| cells(l).into_iter().map(String::from).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    for (i, (name, gpus, flags, dispatcher)) in runs.iter().enumerate() {
        let c = costed(
            &format!("moe-layout-{i}"),
            &format!("plan {flags} {h100} {dispatcher}"),
        );
        // The time cells' units are the docs' (ms or s), read from its row.
        let docs_row = line(name);
        let cell = |k: usize| docs_row.get(k).cloned().unwrap_or_default();
        let tflops = c.model_flops / c.step_s / *gpus as f64 / 1e12;
        rows.push((
            name.to_string(),
            vec![
                vec![in_unit(&cell(1), c.step_s)],
                vec![tflops, c.mfu.unwrap() * 100.0],
                vec![
                    in_unit(&cell(3), c.ep_comm_s),
                    c.ep_comm_s / c.step_s * 100.0,
                ],
                vec![c.memory.total() / (1u64 << 30) as f64],
            ],
        ));
    }
    let mut problems = Vec::new();
    check_table(&doc, header, &rows, &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// "DeepEP's normal kernels on the H800": each EP's predicted dispatch
/// bandwidth (DeepEP's count) and its error against the published
/// dispatch and combine figures.
#[test]
fn deepep_table_is_the_codes() {
    let doc = docs();
    let header = "| EP | link | published dispatch / combine | predicted | error | the model's busier link |";
    let published = [
        (8, 153.0, 158.0),
        (16, 43.0, 43.0),
        (32, 58.0, 57.0),
        (64, 51.0, 50.0),
    ];
    let mut rows = Vec::new();
    for (ep, dispatch, combine) in published {
        let c = costed(&format!("deepep-{ep}"), &format!("plan --model deepseek-v3 --device h800 --moe-dispatcher deepep --gpus {ep} --global-batch {ep} --device-memory 10000 --layout dp={ep},tp=1,pp=1,ep={ep}"));
        let gbps = c.ep_dispatch.unwrap().bottleneck_gbps;
        rows.push((
            ep.to_string(),
            vec![
                vec![],
                vec![dispatch, combine],
                vec![gbps],
                vec![
                    (gbps / dispatch - 1.0) * 100.0,
                    (gbps / combine - 1.0) * 100.0,
                ],
            ],
        ));
    }
    let mut problems = Vec::new();
    check_table(&doc, header, &rows, &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
