//! `report plan --against DIR`: for each composed `dp x tp x pp` run in DIR
//! (run.json's `composed` sections, written by `bench-pipeline --dp/--tp`),
//! the planner's cost of that one layout ([`parbench::model::plan::cost_given`])
//! from the figures the same run calibrated (its GEMM rate, its tensor and
//! data groups' fitted wires, its pipeline link), beside the measurement
//! term by term, and the term that parts most. Written to
//! `DIR/plan-check.csv`, which `report html` draws.

use crate::table::Table;
use anyhow::{bail, Context, Result};
use parbench::comm::Collective;
use parbench::model::plan::{
    cost_given, Calibration, CallFit, GivenCost, GivenLayout, GivenShard, Shard,
};
use parbench::schedule::{generate, parse_csv, ScheduleKind};
use serde_json::Value;
use std::path::Path;

/// The file `report plan --against` writes and `report html` reads.
pub const PLAN_CHECK_FILE: &str = "plan-check.csv";

/// One term of one layout: measured beside predicted.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckRow {
    pub layout: String,
    pub term: String,
    pub measured_us: f64,
    pub predicted_us: f64,
    /// predicted / measured.
    pub ratio: f64,
}

/// The terms, in the order they are printed, and what each measures (each
/// per rank: the median over the timed steps, averaged over the ranks).
const TERMS: [(&str, &str); 8] = [
    ("compute", "the blocks' compute, per rank per step"),
    (
        "tp_comm",
        "the tensor-parallel collectives, per rank per step",
    ),
    (
        "bubble",
        "idle in the pipeline: the step less busy time and the exposed reduction",
    ),
    (
        "dp_comm",
        "the data-parallel reduction less its dp_wait, per rank per step",
    ),
    (
        "dp_wait",
        "in the reduction, waiting for the slowest replica (the planner has none)",
    ),
    (
        "dp_exposed",
        "the part of it the step waited for at its end (all of it without --overlap)",
    ),
    (
        "other",
        "sends and the executor between actions (the planner has none)",
    ),
    ("step", "the step"),
];

/// A `--shard` run's terms besides [`TERMS`].
const SHARD_TERMS: [(&str, &str); 2] = [
    (
        "shard",
        "the per-layer all-gathers and reduce-scatters the compute waited for, per rank per step",
    ),
    (
        "optimizer",
        "Adam's update after the step (the planner has none)",
    ),
];

/// The terms of a section, sharded or not.
fn terms(c: &Value) -> Vec<(&'static str, &'static str)> {
    let mut t = TERMS.to_vec();
    if !c["sharded"].is_null() {
        t.extend(SHARD_TERMS);
    }
    t
}

/// Said under a compute-mode run's table: its compute term is not a
/// prediction, so a ratio of 1.00 there is no evidence for the model.
const CALIBRATED_COMPUTE: &str = "note: compute is costed at the GEMM rate this run measured, so it agrees by construction; the other terms are the check";

/// Whether the section's stage compute was a sleep (`--work sleep:US`).
fn is_sleep(c: &Value) -> bool {
    c["work"].as_str().unwrap_or("").starts_with("sleep:")
}

/// The number at `path` in `v`, or a line naming what is missing.
fn num(v: &Value, path: &[&str]) -> Result<f64, String> {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_f64()
        .ok_or_else(|| format!("no number at {}", path.join(".")))
}

fn count(v: &Value, path: &[&str]) -> Result<usize, String> {
    let x = num(v, path)?;
    if x >= 0.0 && x.fract() == 0.0 {
        Ok(x as usize)
    } else {
        Err(format!("{} {x}: not a count", path.join(".")))
    }
}

/// A group's fitted wire in a composed section, `None` for a group of one.
fn call_fit(c: &Value, key: &str) -> Result<Option<CallFit>, String> {
    let w = &c["calibration"][key];
    if w.is_null() {
        return Ok(None);
    }
    let coll: Collective = w["collective"]
        .as_str()
        .ok_or_else(|| format!("{key}: no collective"))?
        .parse()
        .map_err(|e| format!("{key}: {e}"))?;
    if w["fit"].is_null() {
        return Err(format!("{key}: the probe's points gave no fit"));
    }
    Ok(Some(CallFit {
        collective: coll,
        ranks: count(w, &["ranks"])?,
        alpha_s: num(w, &["fit", "alpha_us"])? * 1e-6,
        beta_s_per_byte: num(w, &["fit", "beta_us_per_byte"])? * 1e-6,
    }))
}

/// A `--shard` run's mode and its shard and replica groups' fits; `None`
/// for a run without it.
fn sharded_of(c: &Value) -> Result<Option<GivenShard>, String> {
    let Some(mode) = c["reduce"]["shard"].as_str() else {
        return Ok(None);
    };
    let shard = Shard::by_name(mode).ok_or_else(|| format!("reduce.shard {mode}: not a mode"))?;
    Ok(Some(GivenShard {
        shard,
        group: count(c, &["reduce", "shard_group"])?,
        prefetch: c["reduce"]["prefetch"].as_bool().unwrap_or(false),
        layer_bytes: c["calibration"]["shard_layer_bytes"]
            .as_f64()
            .unwrap_or(0.0),
        gather: call_fit(c, "shard_gather_wire")?,
        scatter: call_fit(c, "shard_scatter_wire")?,
        replicas: call_fit(c, "replica_wire")?,
    }))
}

/// The layout and calibration of one composed section.
fn given_of(c: &Value) -> Result<(GivenLayout, Calibration), String> {
    let name = c["schedule"].as_str().unwrap_or("");
    // The actions the run ran, or (a section without them) its generator.
    let schedule = match c["schedule_csv"].as_str() {
        Some(text) => parse_csv(text, "run.json", name).map_err(|e| e.to_string())?,
        None => {
            let kind: ScheduleKind = name.parse().map_err(|_| {
                format!("schedule '{name}' is not generated and the section has no schedule_csv")
            })?;
            let (pp, m) = (count(c, &["mesh", "pp"])?, count(c, &["microbatches"])?);
            generate(kind, pp, m, count(c, &["chunks"])?).map_err(|e| e.to_string())?
        }
    };
    let sleep = is_sleep(c);
    // Under --work sleep the compute stands for the rate the sleeps imply.
    let rate = if sleep {
        num(c, &["calibration", "gemm", "nominal_flop_per_s"])?
    } else {
        num(c, &["calibration", "gemm", "flop_per_s"])?
    };
    let dist_opt = c["reduce"]["dist_opt"].as_bool().unwrap_or(false);
    let layout = GivenLayout {
        dp: count(c, &["mesh", "dp"])?,
        tp: count(c, &["mesh", "tp"])?,
        schedule,
        layers_per_stage: count(c, &["layers_per_stage"])?,
        block_forward_flops: num(c, &["calibration", "gemm", "block_forward_flops"])?,
        tp_calls_per_pass: count(c, &["calibration", "tp_calls", "per_block_pass"])?,
        tp_call_bytes: num(c, &["calibration", "tp_calls", "bytes"])?,
        grad_bytes: num(c, &["reduce", "grad_bytes_per_rank"])?,
        bucket_bytes: num(c, &["reduce", "bucket_bytes"])?,
        dist_opt,
        overlap: c["reduce"]["overlap"].as_bool().unwrap_or(false),
        sharded: sharded_of(c)?,
    };
    let cal = Calibration {
        flop_per_s: rate,
        tp: call_fit(c, "tp_wire")?,
        dp: call_fit(c, "dp_wire")?,
        message_s: num(c, &["calibration", "pipeline_link", "message_us"])? * 1e-6,
    };
    Ok((layout, cal))
}

/// The measured terms of a composed section, microseconds, in [`TERMS`]' order.
/// The reduction's wait for the slowest replica is its own term: the
/// planner's data-parallel term is the wire's, with every replica in step.
/// `dp_comm` is the ranks' median reduction less its wait
/// (`dp_after_wait_us`), `dp_wait` the rest of the median reduction, so the
/// terms still add up to the step; a section from before these were
/// recorded has no wait. `dp_exposed` is the part of the whole reduction
/// the step waited for at its end.
fn measured(c: &Value) -> Result<Vec<f64>, String> {
    let ranks = c["measured"]["ranks"]
        .as_array()
        .filter(|r| !r.is_empty())
        .ok_or("no ranks measured")?;
    let mean = |k: &str| -> Result<f64, String> {
        let mut s = 0.0;
        for r in ranks {
            s += num(r, &[k])?;
        }
        Ok(s / ranks.len() as f64)
    };
    let (compute, tp, busy) = (mean("compute_us")?, mean("tp_comm_us")?, mean("busy_us")?);
    let dp = mean("dp_comm_us")?;
    let dp_wire = if ranks.iter().all(|r| r["dp_after_wait_us"].is_number()) {
        mean("dp_after_wait_us")?.clamp(0.0, dp)
    } else {
        dp
    };
    // A sharded run's per-layer collectives ran inside the actions.
    let (shard, optimizer) = match c["sharded"]["ranks"].as_array() {
        Some(rs) if !rs.is_empty() => {
            let mean_of = |k: &str| -> Result<f64, String> {
                let mut s = 0.0;
                for r in rs {
                    s += num(r, &[k])?;
                }
                Ok(s / rs.len() as f64)
            };
            (Some(mean_of("exposed_us")?), Some(mean_of("optimizer_us")?))
        }
        _ => (None, None),
    };
    let mut out = vec![
        compute,
        tp,
        mean("idle_us")?,
        dp_wire,
        dp - dp_wire,
        mean("dp_exposed_us")?,
        (busy - compute - tp - shard.unwrap_or(0.0)).max(0.0),
        num(c, &["measured", "step_us"])?,
    ];
    if let (Some(s), Some(o)) = (shard, optimizer) {
        out.extend([s, o]);
    }
    Ok(out)
}

fn predicted(p: &GivenCost) -> [f64; 10] {
    [
        p.compute_s * 1e6,
        p.tp_comm_s * 1e6,
        p.bubble_s * 1e6,
        p.dp_comm_s * 1e6,
        0.0,
        p.dp_exposed_s * 1e6,
        0.0,
        p.step_s * 1e6,
        p.shard_exposed_s * 1e6,
        0.0,
    ]
}

/// A composed section's name in tables: its layout and run.
fn layout_name(run_id: &str, c: &Value) -> String {
    format!(
        "dp{}xtp{}xpp{} {} M{} v{} {} {}",
        c["mesh"]["dp"],
        c["mesh"]["tp"],
        c["mesh"]["pp"],
        c["schedule"].as_str().unwrap_or("?"),
        c["microbatches"],
        c["chunks"],
        c["work"].as_str().unwrap_or("?"),
        run_id
    )
}

/// The rows of one composed section.
pub fn check_rows(run_id: &str, c: &Value) -> Result<Vec<CheckRow>, String> {
    let (layout, cal) = given_of(c)?;
    let cost = cost_given(&layout, &cal)?;
    let name = layout_name(run_id, c);
    let m = measured(c)?;
    let p = predicted(&cost);
    Ok(terms(c)
        .iter()
        .zip(m.iter().zip(p))
        .map(|((term, _), (&measured_us, predicted_us))| CheckRow {
            layout: name.clone(),
            term: term.to_string(),
            measured_us,
            predicted_us,
            ratio: if measured_us > 0.0 {
                predicted_us / measured_us
            } else {
                f64::NAN
            },
        })
        .collect())
}

/// The term (not the step) whose prediction is furthest from its
/// measurement, in microseconds.
pub fn parts_most(rows: &[CheckRow]) -> Option<&CheckRow> {
    rows.iter().filter(|r| r.term != "step").max_by(|a, b| {
        (a.predicted_us - a.measured_us)
            .abs()
            .total_cmp(&(b.predicted_us - b.measured_us).abs())
    })
}

/// A composed run whose ranks computed on fewer cores than ranks: the
/// planner gives each rank its own device, so a collective that waits for
/// a partner off its core is time it does not model. `None` otherwise.
fn shared_cores(c: &Value, cores: usize) -> Option<String> {
    let world = c["mesh"]["world"].as_u64()? as usize;
    let computes = c["work"].as_str()? == "compute";
    (computes && cores > 0 && world > cores).then(|| {
        format!(
            "note: {world} ranks computed on {cores} cores: the planner gives every rank its own device, so a collective's wait for a partner that had no core (in tp_comm and dp_comm) is outside its model"
        )
    })
}

/// A composed section of a run: (run id, section, the host's cores).
type Composed = (String, Value, usize);

/// Every composed section of `dir`'s run.json: (run id, section, the host's cores).
/// The runs without one come second, as the lines that say they were skipped.
fn composed_sections(dir: &Path) -> Result<(Vec<Composed>, Vec<String>)> {
    let runs = parbench::results::read_runs(dir)
        .with_context(|| format!("{}: reading run.json", dir.display()))?;
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for r in runs {
        match r.extra.get("composed").and_then(Value::as_array) {
            Some(list) => out.extend(list.iter().map(|c| (r.run_id.clone(), c.clone(), r.cores))),
            None => skipped.push(format!(
                "report: {} ({}): no composed section, skipped",
                r.run_id, r.suite
            )),
        }
    }
    Ok((out, skipped))
}

/// The flag this command was given, as errors name it.
fn against_flag() -> String {
    format!("--{}", parbench::vocab::against::LONG)
}

pub fn run(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        bail!("{} {}: not a folder", against_flag(), dir.display());
    }
    let (sections, skipped) = composed_sections(dir)?;
    if sections.is_empty() {
        // One line: none of its runs is composed (not one line per run).
        bail!(
            "{} {}: no composed dp x tp x pp run in run.json ({} run(s), none composed; bench-pipeline --dp/--tp writes them)",
            against_flag(),
            dir.display(),
            skipped.len()
        );
    }
    for line in &skipped {
        parbench::launch::eprint_line(line);
    }
    let mut all = Vec::new();
    // Each term's meaning, said once under the tables (a column of it
    // would double their width).
    let mut legend: Vec<(&str, &str)> = Vec::new();
    for (run_id, c, cores) in &sections {
        let rows = match check_rows(run_id, c) {
            Ok(r) => r,
            Err(e) => {
                parbench::launch::eprint_line(&format!(
                    "report: {}: skipped: {e}",
                    layout_name(run_id, c)
                ));
                continue;
            }
        };
        let mut t = Table::new(["term", "measured_us", "predicted_us", "ratio"]);
        for tw in terms(c) {
            if !legend.contains(&tw) {
                legend.push(tw);
            }
        }
        for r in &rows {
            t.row([
                r.term.clone(),
                format!("{:.0}", r.measured_us),
                format!("{:.0}", r.predicted_us),
                if r.ratio.is_finite() {
                    format!("{:.2}", r.ratio)
                } else {
                    "-".into()
                },
            ]);
        }
        parbench::outln!("{}", rows[0].layout);
        parbench::out!("{}", t.text());
        if let Some(step) = rows.iter().find(|r| r.term == "step") {
            parbench::outln!(
                "step predicted within {:.0}% of the measurement",
                100.0 * (step.ratio - 1.0).abs()
            );
        }
        if let Some(w) = parts_most(&rows) {
            parbench::outln!(
                "parts most: {} (measured {:.0} us, predicted {:.0} us, {:+.0} us)",
                w.term,
                w.measured_us,
                w.predicted_us,
                w.predicted_us - w.measured_us
            );
        }
        let note = |text: &str| {
            parbench::out!(
                "{}",
                parbench::term::wrap_hanging(text, "", "  ", parbench::term::WIDTH)
            )
        };
        if !is_sleep(c) {
            note(CALIBRATED_COMPUTE);
        }
        if let Some(n) = shared_cores(c, *cores) {
            note(&n);
        }
        parbench::outln!("");
        all.extend(rows);
    }
    if all.is_empty() {
        bail!(
            "{} {}: no composed run could be costed (each skipped above)",
            against_flag(),
            dir.display()
        );
    }
    parbench::outln!("The terms:");
    for (term, what) in &legend {
        parbench::out!(
            "{}",
            parbench::term::wrap_hanging(
                what,
                &format!("  {term:<12}"),
                &" ".repeat(14),
                parbench::term::WIDTH
            )
        );
    }
    let path = dir.join(PLAN_CHECK_FILE);
    write_rows(&path, &all)?;
    eprintln!("report: wrote {}", path.display());
    Ok(())
}

fn write_rows(path: &Path, rows: &[CheckRow]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    let bytes = w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    parbench::results::write_atomic(path, &bytes)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}

/// `dir`'s plan-check.csv, or none; a file that does not parse is one line.
pub fn read_rows(dir: &Path) -> Result<Vec<CheckRow>> {
    let path = dir.join(PLAN_CHECK_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut rd = csv::Reader::from_path(&path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    rd.deserialize()
        .map(|r| r.with_context(|| format!("{}: not a plan-check file", path.display())))
        .collect()
}
