//! `report model-check DIR...`: the collective model held against several
//! runs of bench-collectives at once, the criterion a machine whose cores
//! move can be judged by: per wire, the median over runs of the share of
//! rows of 64 KiB and up that the model priced within 25% of their p50
//! (rows timed with the cores elsewhere than the wire's state left out, as
//! each run's own Model check does), the rows that missed in every run (a
//! structural miss, not noise), and each run's fits from 1 MiB. A run its
//! noise guard marked noisy is not judged, and the output says so.

use crate::compare::run_infos;
use crate::load::{load_sources, Source};
use crate::units;
use anyhow::{bail, Result};
use parbench::results::CollectiveRow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;

use parbench::model::priced::{priced_well, FROM_BYTES, WITHIN};
/// A fit is good within this rms relative error.
pub const FIT_RMS: f64 = 0.10;

/// One run of one wire, judged.
#[derive(Clone, Debug, PartialEq)]
pub struct RunCheck {
    pub run_id: String,
    /// Rows held to the model, and those within [`WITHIN`].
    pub rows: usize,
    pub within: usize,
    /// Labels of the rows that missed.
    pub misses: BTreeSet<String>,
    /// Labels of every row held.
    pub held: BTreeSet<String>,
    /// Each fit's rms relative error (collective, rms).
    pub fits: Vec<(String, f64)>,
}

impl RunCheck {
    pub fn share(&self) -> f64 {
        if self.rows == 0 {
            f64::NAN
        } else {
            self.within as f64 / self.rows as f64
        }
    }

    /// Whether every fit of the run is within [`FIT_RMS`].
    pub fn fits_good(&self) -> bool {
        !self.fits.is_empty() && self.fits.iter().all(|(_, r)| *r <= FIT_RMS)
    }
}

/// Rows of a run held to the model: a model figure, 64 KiB and up, timed
/// in the wire's state.
fn judge(
    rows: &[&CollectiveRow],
    elsewhere: &BTreeSet<String>,
) -> (usize, BTreeSet<String>, BTreeSet<String>) {
    let mut held = BTreeSet::new();
    let mut misses = BTreeSet::new();
    for r in rows {
        let priced = r.p50_us > 0.0 && r.model_us > 0.0;
        if r.bytes < FROM_BYTES || !priced {
            continue;
        }
        let label = r.label();
        if elsewhere.contains(&label) {
            continue;
        }
        held.insert(label.clone());
        if !priced_well(r.model_us / r.p50_us) {
            misses.insert(label);
        }
    }
    (held.len() - misses.len(), misses, held)
}

/// The fits a run recorded (`extra.fits`: collective and rms).
fn fits_of(extra: &serde_json::Map<String, serde_json::Value>) -> Vec<(String, f64)> {
    extra
        .get("fits")
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| {
                    Some((
                        format!(
                            "{}{}",
                            f.get("collective")?.as_str()?,
                            if f.get("in_place").and_then(serde_json::Value::as_bool) == Some(true)
                            {
                                " in place"
                            } else {
                                ""
                            }
                        ),
                        f.get("rms_rel_err")?.as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every run of the folders, by wire: judged, or noisy (not judged).
pub fn checks(sources: &[Source]) -> BTreeMap<String, (Vec<RunCheck>, Vec<String>)> {
    let mut out: BTreeMap<String, (Vec<RunCheck>, Vec<String>)> = BTreeMap::new();
    for s in sources {
        let infos = run_infos(s);
        for run in &s.runs {
            let rows: Vec<&CollectiveRow> = s
                .collectives
                .iter()
                .filter(|r| r.run_id == run.run_id)
                .collect();
            let Some(first) = rows.first() else {
                continue;
            };
            let wire = format!("{}/{}", first.backend, first.wire);
            let entry = out.entry(wire).or_default();
            let info = infos.get(&run.run_id).cloned().unwrap_or_default();
            if info.noisy() {
                entry.1.push(format!(
                    "{} ({} of the machine taken by other processes)",
                    run.run_id,
                    units::percent(info.foreign.unwrap_or(f64::NAN))
                ));
                continue;
            }
            let (within, misses, held) = judge(&rows, &info.cores_elsewhere);
            entry.0.push(RunCheck {
                run_id: run.run_id.clone(),
                rows: held.len(),
                within,
                misses,
                held,
                fits: fits_of(&run.extra),
            });
        }
    }
    out
}

/// The rows that missed in every judged run that held them (at least two runs).
pub fn structural(runs: &[RunCheck]) -> Vec<String> {
    if runs.len() < 2 {
        return Vec::new();
    }
    let mut labels: BTreeSet<&String> = BTreeSet::new();
    for r in runs {
        labels.extend(r.misses.iter());
    }
    labels
        .into_iter()
        .filter(|l| {
            runs.iter()
                .all(|r| r.misses.contains(*l) || !r.held.contains(*l))
        })
        .filter(|l| runs.iter().filter(|r| r.held.contains(*l)).count() >= 2)
        .cloned()
        .collect()
}

/// Runs `report model-check`: exit 0 when every wire meets the criterion
/// (median share 95%+, no structural miss, fits within 10% rms in 3 of 5
/// runs or the same share), 1 when one does not, 3 when no run could be judged.
pub fn run(dirs: &[PathBuf]) -> Result<ExitCode> {
    let sources = load_sources(dirs, false)?;
    let all = checks(&sources);
    if all.is_empty() {
        bail!("no bench-collectives runs in these folders");
    }
    let mut met = true;
    let mut judged_any = false;
    for (wire, (runs, noisy)) in &all {
        parbench::outln!(
            "{wire}: {} runs judged, {} noisy (not judged)",
            runs.len(),
            noisy.len()
        );
        for n in noisy {
            parbench::outln!("  noisy, not judged: {n}");
        }
        if runs.is_empty() {
            continue;
        }
        judged_any = true;
        let mut shares: Vec<f64> = runs
            .iter()
            .map(RunCheck::share)
            .filter(|s| s.is_finite())
            .collect();
        let median = parbench::stats::median(&mut shares).unwrap_or(f64::NAN);
        for r in runs {
            parbench::outln!(
                "  {}: model within {:.0}% on {} of {} rows from {} ({}); fits from 1 MiB: {}",
                r.run_id,
                100.0 * WITHIN,
                r.within,
                r.rows,
                units::bytes(FROM_BYTES as f64),
                units::percent(r.share()),
                if r.fits.is_empty() {
                    "none recorded".to_string()
                } else {
                    r.fits
                        .iter()
                        .map(|(c, rms)| format!("{c} {} rms", units::percent(*rms)))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            );
        }
        let structural = structural(runs);
        let good_fits = runs.iter().filter(|r| r.fits_good()).count();
        let fits_needed = (runs.len() * 3).div_ceil(5);
        parbench::outln!(
            "  median share within {:.0}%: {} (criterion 95%); rows that missed in every run: {}; runs with every fit within {:.0}% rms: {} of {} (criterion {})",
            100.0 * WITHIN,
            units::percent(median),
            if structural.is_empty() {
                "none".to_string()
            } else {
                structural.join(", ")
            },
            100.0 * FIT_RMS,
            good_fits,
            runs.len(),
            fits_needed
        );
        let ok = median >= 0.95 && structural.is_empty() && good_fits >= fits_needed;
        parbench::outln!("  {}", if ok { "MET" } else { "NOT MET" });
        met &= ok;
    }
    Ok(if !judged_any {
        ExitCode::from(3)
    } else if met {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(misses: &[&str], held: &[&str]) -> RunCheck {
        RunCheck {
            run_id: "r".into(),
            rows: held.len(),
            within: held.len() - misses.len(),
            misses: misses.iter().map(|s| s.to_string()).collect(),
            held: held.iter().map(|s| s.to_string()).collect(),
            fits: vec![("all_reduce".into(), 0.05)],
        }
    }

    #[test]
    fn a_miss_in_every_run_is_structural_and_one_run_is_not_enough() {
        let a = run(&["x", "y"], &["x", "y", "z"]);
        let b = run(&["x"], &["x", "y", "z"]);
        let c = run(&["x", "z"], &["x", "y", "z"]);
        assert_eq!(structural(&[a.clone(), b.clone(), c]), ["x"]);
        assert!(structural(&[a]).is_empty());
        assert!((b.share() - 2.0 / 3.0).abs() < 1e-12);
        assert!(b.fits_good());
    }
}
