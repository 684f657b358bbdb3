//! `report plan --against DIR`: each composed run of a recorded folder
//! (`fixtures/composed`: real bench-pipeline runs, see the fixtures'
//! README) costed from its own calibration beside its measurement, the
//! rows written to plan-check.csv and drawn by `report html`; a run
//! without a composed section skipped with a line; no composed run at
//! all one line, exit 2. No timing of this machine is asserted: the
//! fixture's figures are given.

mod common;
#[path = "../../test-support/run_json.rs"]
mod run_json;
use common::*;
use run_json::composed_sections;
use serde_json::Value;

fn mean(c: &Value, key: &str) -> f64 {
    let r = c["measured"]["ranks"].as_array().unwrap();
    r.iter()
        .map(|x| x[key].as_f64().unwrap_or(0.0))
        .sum::<f64>()
        / r.len() as f64
}

/// The terms of `plan --against`, in their order.
const TERMS: [&str; 8] = [
    "compute",
    "tp_comm",
    "bubble",
    "dp_comm",
    "dp_wait",
    "dp_exposed",
    "other",
    "step",
];

/// Rows of plan-check.csv: (layout, term, measured, predicted, ratio).
type Rows = Vec<(String, String, f64, f64, f64)>;

/// `report plan --against d` (it must pass) and the rows it wrote.
fn rows_of(d: &std::path::Path) -> Rows {
    let o = report(&["plan", "--against", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut rd = csv::Reader::from_path(d.join("plan-check.csv")).unwrap();
    rd.deserialize().map(|r| r.unwrap()).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn every_composed_run_gets_its_terms_beside_the_prediction() {
    let d = copy_fixture("composed", "plan-check");
    let o = report(&["plan", "--against", d.to_str().unwrap()]);
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("no composed section, skipped"), "{err}");
    // Short lines: each term's meaning said once, under the tables.
    assert!(out.lines().all(|l| l.chars().count() <= 100), "{out}");
    assert_eq!(
        out.matches("the blocks' compute, per rank per step")
            .count(),
        1,
        "{out}"
    );
    let mut rd = csv::Reader::from_path(d.join("plan-check.csv")).unwrap();
    assert_eq!(
        rd.headers().unwrap().iter().collect::<Vec<_>>(),
        ["layout", "term", "measured_us", "predicted_us", "ratio"]
    );
    let rows: Rows = rd.deserialize().map(|r| r.unwrap()).collect();
    let cs = composed_sections(&d);
    assert_eq!(cs.len(), 2, "a sleep run and a compute run");
    assert_eq!(rows.len(), TERMS.len() * cs.len());
    for (c, rows) in cs.iter().zip(rows.chunks(TERMS.len())) {
        let terms: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        assert_eq!(terms, TERMS);
        let get = |t: &str| rows.iter().find(|r| r.1 == t).unwrap();
        // Measured: the section's own figures.
        assert!(close(get("compute").2, mean(c, "compute_us")));
        assert!(close(get("tp_comm").2, mean(c, "tp_comm_us")));
        assert!(close(get("bubble").2, mean(c, "idle_us")));
        // The fixture's runs predate dp_wait_us: no wait split off.
        assert!(close(get("dp_comm").2, mean(c, "dp_comm_us")));
        assert!(close(get("dp_exposed").2, mean(c, "dp_exposed_us")));
        assert_eq!((get("dp_wait").2, get("dp_wait").3), (0.0, 0.0));
        assert!(close(
            get("step").2,
            c["measured"]["step_us"].as_f64().unwrap()
        ));
        // Predicted: the parts add up to the step; ratios are predicted / measured.
        let parts: f64 = ["compute", "tp_comm", "bubble", "dp_exposed"]
            .iter()
            .map(|t| get(t).3)
            .sum();
        assert!(close(parts, get("step").3), "{rows:?}");
        for r in rows.iter().filter(|r| r.2 > 0.0) {
            assert!(close(r.4, r.3 / r.2), "{r:?}");
        }
        let (m, mb) = (
            c["microbatches"].as_f64().unwrap(),
            c["work"].as_str().unwrap(),
        );
        match mb.strip_prefix("sleep:") {
            // Every (stage, microbatch) sleeps 3 US: F, I and W, or F and B.
            Some(us) => assert!(close(
                get("compute").3,
                3.0 * us.parse::<f64>().unwrap() * m
            )),
            // The rate came from this compute time: it gives it back.
            None => assert!(close(get("compute").3, get("compute").2)),
        }
        // One bucket per rank at 25 MiB: one call at the data group's fit.
        let fit = &c["calibration"]["dp_wire"]["fit"];
        let bytes = c["reduce"]["grad_bytes_per_rank"].as_f64().unwrap();
        let one =
            fit["alpha_us"].as_f64().unwrap() + bytes * fit["beta_us_per_byte"].as_f64().unwrap();
        assert!(
            close(get("dp_comm").3, one),
            "{} vs {one}",
            get("dp_comm").3
        );
        // Not overlapped: all of it exposed.
        assert!(close(get("dp_exposed").3, one));
    }
    assert_eq!(out.matches("parts most: ").count(), 2, "{out}");
    assert_eq!(out.matches("step predicted within").count(), 2, "{out}");
    // Only the compute run's compute is its own measurement costed back.
    assert_eq!(out.matches("agrees by construction").count(), 1, "{out}");
    // report html draws the rows.
    let html = d.join("r.html");
    let o = report(&[
        "html",
        d.to_str().unwrap(),
        "--output-file",
        html.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("plan-check.csv") && page.contains("Parts most: "),
        "no plan-check section"
    );
}

/// A run that recorded each rank's reduction less its wait for the
/// slowest replica (`dp_after_wait_us`, here set by the test to two
/// thirds of each rank's reduction) gets the wait as its own measured
/// term, predicted 0, and the dp_comm term keeps the rest: the wire's
/// share, which the planner predicts. The step and the other terms do
/// not move.
#[test]
fn the_wait_for_the_slowest_replica_is_its_own_term() {
    let base = rows_of(&copy_fixture("composed", "plan-check-nowait"));
    let d = copy_fixture("composed", "plan-check-wait");
    let mut runs: Value =
        serde_json::from_slice(&std::fs::read(d.join("run.json")).unwrap()).unwrap();
    for r in runs.as_array_mut().unwrap() {
        for c in r["extra"]["composed"].as_array_mut().into_iter().flatten() {
            for rank in c["measured"]["ranks"].as_array_mut().unwrap() {
                let dp = rank["dp_comm_us"].as_f64().unwrap();
                rank["dp_after_wait_us"] = Value::from(dp * 2.0 / 3.0);
            }
        }
    }
    std::fs::write(d.join("run.json"), serde_json::to_vec(&runs).unwrap()).unwrap();
    let rows = rows_of(&d);
    let cs = composed_sections(&d);
    assert_eq!(rows.len(), base.len());
    for ((c, rows), before) in cs
        .iter()
        .zip(rows.chunks(TERMS.len()))
        .zip(base.chunks(TERMS.len()))
    {
        let get = |rows: &[(String, String, f64, f64, f64)], t: &str| {
            rows.iter().find(|r| r.1 == t).unwrap().clone()
        };
        let (wait, dp) = (get(rows, "dp_wait"), get(rows, "dp_comm"));
        assert!(close(wait.2, mean(c, "dp_comm_us") / 3.0), "{wait:?}");
        assert_eq!(wait.3, 0.0);
        assert!(close(dp.2, mean(c, "dp_comm_us") * 2.0 / 3.0), "{dp:?}");
        assert!(
            close(dp.3, get(before, "dp_comm").3),
            "the prediction stays the wire's"
        );
        for t in ["compute", "tp_comm", "bubble", "other", "step"] {
            assert_eq!(get(rows, t), get(before, t), "{t}");
        }
    }
}

#[test]
fn a_folder_without_a_composed_run_is_one_line() {
    let d = scratch("plan-check-none");
    let o = report(&["plan", "--against", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("no composed dp x tp x pp run"), "{err}");
    assert!(!d.join("plan-check.csv").exists());
}

/// A section that carries its actions (`schedule_csv`, what bench-pipeline
/// writes, so a CSV schedule is costed too) gives the rows its generator gives.
#[test]
fn a_schedule_given_as_its_actions_is_costed_as_the_generated_one() {
    let generated = rows_of(&copy_fixture("composed", "plan-check-gen"));
    let d = copy_fixture("composed", "plan-check-csv");
    let mut runs: Value =
        serde_json::from_slice(&std::fs::read(d.join("run.json")).unwrap()).unwrap();
    for r in runs.as_array_mut().unwrap() {
        for c in r["extra"]["composed"].as_array_mut().into_iter().flatten() {
            let kind = c["schedule"].as_str().unwrap().parse().unwrap();
            let (pp, m, v) = (
                c["mesh"]["pp"].as_u64().unwrap() as usize,
                c["microbatches"].as_u64().unwrap() as usize,
                c["chunks"].as_u64().unwrap() as usize,
            );
            let s = parbench::schedule::generate(kind, pp, m, v).unwrap();
            c["schedule_csv"] = Value::from(parbench::schedule::to_csv(&s));
            c["schedule"] = Value::from("csv:mine.csv");
        }
    }
    std::fs::write(d.join("run.json"), serde_json::to_vec(&runs).unwrap()).unwrap();
    let given = rows_of(&d);
    assert_eq!(generated.len(), given.len());
    for (a, b) in generated.iter().zip(&given) {
        assert_eq!((&a.1, a.2, a.3), (&b.1, b.2, b.3), "{a:?} {b:?}");
        assert!(b.0.contains("csv:mine.csv"), "{b:?}");
    }
}

/// The same runs recorded as overlapped (`--overlap`) with small buckets:
/// the predicted reduction is the same calls, and only what outlasts the
/// rank's remaining work after each bucket is ready is exposed, so the
/// step is the pipeline's plus that part.
#[test]
fn an_overlapped_run_is_predicted_to_expose_only_what_outlasts_the_backward() {
    let with = |overlap: bool, name: &str| -> Rows {
        let d = copy_fixture("composed", name);
        let mut runs: Value =
            serde_json::from_slice(&std::fs::read(d.join("run.json")).unwrap()).unwrap();
        for r in runs.as_array_mut().unwrap() {
            for c in r["extra"]["composed"].as_array_mut().into_iter().flatten() {
                let grads = c["reduce"]["grad_bytes_per_rank"].as_f64().unwrap();
                c["reduce"]["overlap"] = Value::from(overlap);
                c["reduce"]["bucket_bytes"] = Value::from((grads / 8.0).ceil());
            }
        }
        std::fs::write(d.join("run.json"), serde_json::to_vec(&runs).unwrap()).unwrap();
        rows_of(&d)
    };
    let plain = with(false, "plan-check-plain");
    let overlapped = with(true, "plan-check-overlap");
    assert_eq!(plain.len(), overlapped.len());
    for (p, o) in plain
        .chunks(TERMS.len())
        .zip(overlapped.chunks(TERMS.len()))
    {
        let get = |rows: &[(String, String, f64, f64, f64)], t: &str| {
            rows.iter().find(|r| r.1 == t).unwrap().3
        };
        // The same buckets, the same calls.
        assert!(close(get(p, "dp_comm"), get(o, "dp_comm")), "{o:?}");
        assert!(close(get(p, "dp_exposed"), get(p, "dp_comm")));
        // Half of each stage's buckets are ready a layer before its pass ends.
        assert!(get(o, "dp_exposed") < get(o, "dp_comm"), "{o:?}");
        let parts: f64 = ["compute", "tp_comm", "bubble", "dp_exposed"]
            .iter()
            .map(|t| get(o, t))
            .sum();
        assert!(close(parts, get(o, "step")), "{o:?}");
        assert!(get(o, "step") <= get(p, "step") + 1e-6, "{o:?} {p:?}");
    }
}

/// Sharded runs (ZeRO-1, -2, -3, with prefetch, hybrid; real sleep-mode
/// runs): each gets the two sharded terms besides the others, the
/// per-layer collectives priced where the mode has them, and the step
/// within 25% of the measurement on the recorded figures.
#[test]
fn sharded_runs_are_costed_with_their_per_layer_collectives() {
    let d = copy_fixture("composed-sharded", "plan-check-sharded");
    let rows = rows_of(&d);
    let sections = composed_sections(&d);
    assert_eq!(sections.len(), 5);
    let layouts: Vec<&String> = {
        let mut v: Vec<&String> = rows.iter().map(|r| &r.0).collect();
        v.dedup();
        v
    };
    assert_eq!(layouts.len(), 5, "{layouts:?}");
    for (layout, c) in layouts.iter().zip(&sections) {
        let mine: Vec<_> = rows.iter().filter(|r| &&r.0 == layout).collect();
        let terms: Vec<&str> = mine.iter().map(|r| r.1.as_str()).collect();
        assert_eq!(
            terms,
            [TERMS.as_slice(), &["shard", "optimizer"]].concat(),
            "{layout}"
        );
        let term = |t: &str| mine.iter().find(|r| r.1 == t).unwrap();
        let mode = c["sharded"]["mode"].as_str().unwrap();
        let per_layer = mode == "zero2" || mode == "zero3";
        assert_eq!(term("shard").3 > 0.0, per_layer, "{layout} {mode}");
        assert_eq!(term("shard").2 > 0.0, per_layer, "{layout} {mode}");
        assert!(term("optimizer").2 > 0.0, "{layout}");
        let step = term("step");
        assert!(
            (step.3 - step.2).abs() <= 0.25 * step.2,
            "{layout}: predicted {} us, measured {} us",
            step.3,
            step.2
        );
    }
}
