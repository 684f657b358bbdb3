//! Layers' compute times put on one machine speed before they are judged.
//!
//! A shared machine's compute speed drifts between nights (a VM's
//! neighbours, its clock): on unchanged code bench-layers' TP 2 compute
//! read 2.80-3.10 ms over eleven nights, and a gate on raw times called
//! the slow nights regressions. Every bench-layers run on a CPU backend
//! times a fixed product beside its block (run.json
//! `extra.compute_reference`, [`parbench::measure::ComputeReference`]).
//! Each row's compute time is scaled by the baseline's reference over its
//! own run's, so a slower machine moves both and the judged figure not;
//! a slower block moves only the figure. The communication time is left
//! as measured, and the total and per-token figures move by the compute
//! time's change only.

use crate::load::Source;
use parbench::measure::ComputeReference;
use parbench::results::LayerRow;
use std::collections::BTreeMap;

/// On what basis the layers' compute times were judged.
#[derive(Clone, Debug, PartialEq)]
pub enum ComputeBasis {
    /// Scaled to the baseline's machine speed: the reference's median over
    /// each side's runs, microseconds.
    Scaled {
        kernel: String,
        baseline_us: f64,
        current_us: f64,
    },
    /// As measured, and why.
    Raw(String),
}

impl ComputeBasis {
    /// The line the comparison prints.
    pub fn describe(&self) -> String {
        match self {
            ComputeBasis::Scaled {
                kernel,
                baseline_us,
                current_us,
            } => format!(
                "Layers: compute times judged at the baseline's machine speed: the same-run compute reference ({kernel}) took {baseline_us:.0} us at the baseline and {current_us:.0} us now ({:+.1}%), each run's compute time scaled by the baseline's reference over its own (communication as measured; total and per-token by the compute's change).",
                (current_us / baseline_us - 1.0) * 100.0
            ),
            ComputeBasis::Raw(why) => format!(
                "Layers: compute times judged as measured ({why}): a change of the machine's compute speed reads as a change of the block."
            ),
        }
    }
}

/// Each layers run's reference, by run id: `Err` names the first run of
/// `side` that has none.
fn references(src: &Source, side: &str) -> Result<BTreeMap<String, ComputeReference>, String> {
    let mut out = BTreeMap::new();
    for id in src.layers.iter().map(|r| r.run_id.as_str()) {
        if out.contains_key(id) {
            continue;
        }
        let r = src
            .runs
            .iter()
            .find(|m| m.run_id == id)
            .and_then(|m| m.extra.get("compute_reference"))
            .and_then(ComputeReference::from_json)
            .filter(|r| r.median_us().is_some());
        match r {
            Some(r) => {
                out.insert(id.to_string(), r);
            }
            None => {
                return Err(format!(
                    "the {side}'s run {id} has no compute reference (recorded before runs measured one, or on GPUs)"
                ))
            }
        }
    }
    Ok(out)
}

fn median_of(refs: &BTreeMap<String, ComputeReference>) -> f64 {
    parbench::stats::median_of_finite(refs.values().filter_map(ComputeReference::median_us))
}

/// `row` with its compute time multiplied by `scale`, the total and
/// per-token times moved by the compute time's change.
pub fn scaled(row: &LayerRow, scale: f64) -> LayerRow {
    let compute = row.compute_us * scale;
    let d = compute - row.compute_us;
    let total = row.total_us + d;
    LayerRow {
        compute_us: compute,
        total_us: total,
        total_min_us: row.total_min_us + d,
        total_max_us: row.total_max_us + d,
        per_token_us: row.per_token_us * total / row.total_us,
        ..row.clone()
    }
}

/// Both sides' layers rows on the basis the comparison judges them on:
/// scaled to the baseline's machine speed when every layers run of both
/// sides timed the same reference, else as measured (and why). `None`
/// when a side has no layers rows.
pub fn at_one_speed(
    base: &Source,
    cur: &Source,
) -> Option<(Vec<LayerRow>, Vec<LayerRow>, ComputeBasis)> {
    if base.layers.is_empty() || cur.layers.is_empty() {
        return None;
    }
    let raw = |why: String| {
        Some((
            base.layers.clone(),
            cur.layers.clone(),
            ComputeBasis::Raw(why),
        ))
    };
    let (b, c) = match (references(base, "baseline"), references(cur, "current run")) {
        (Ok(b), Ok(c)) => (b, c),
        (Err(why), _) | (_, Err(why)) => return raw(why),
    };
    let kernels: Vec<&str> = b
        .values()
        .chain(c.values())
        .map(|r| r.kernel.as_str())
        .collect();
    if let Some(other) = kernels.iter().find(|k| **k != kernels[0]) {
        return raw(format!(
            "the runs timed different references: \"{}\" and \"{other}\"",
            kernels[0]
        ));
    }
    let anchor = median_of(&b);
    let at_anchor = |rows: &[LayerRow], refs: &BTreeMap<String, ComputeReference>| {
        rows.iter()
            .map(|r| {
                let own = refs.get(&r.run_id).and_then(ComputeReference::median_us);
                scaled(r, own.map_or(1.0, |us| anchor / us))
            })
            .collect::<Vec<_>>()
    };
    Some((
        at_anchor(&base.layers, &b),
        at_anchor(&cur.layers, &c),
        ComputeBasis::Scaled {
            kernel: kernels[0].to_string(),
            baseline_us: anchor,
            current_us: median_of(&c),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_moves_the_total_by_the_compute_change_only() {
        let fixture =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shm/layers.csv");
        let rows: Vec<LayerRow> = parbench::results::read_rows(&fixture).unwrap();
        let row = LayerRow {
            compute_us: 3000.0,
            comm_us: 500.0,
            total_us: 3600.0,
            total_min_us: 3400.0,
            total_max_us: 4000.0,
            per_token_us: 3600.0 / 128.0,
            ..rows[0].clone()
        };
        let s = scaled(&row, 0.9);
        assert_eq!(s.compute_us, 2700.0);
        assert_eq!(s.comm_us, 500.0);
        assert_eq!(s.total_us, 3300.0);
        assert_eq!((s.total_min_us, s.total_max_us), (3100.0, 3700.0));
        assert!((s.per_token_us - 3300.0 / 128.0).abs() < 1e-9);
    }
}
