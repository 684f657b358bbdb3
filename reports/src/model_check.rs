//! `report model-check DIR...`: the collective model held against several
//! runs of bench-collectives at once, the criterion a machine whose cores
//! move can be judged by: per wire, the median over runs of the share of
//! rows of 64 KiB and up that the model priced within 25% of their p50
//! (rows timed with the cores elsewhere than the wire's state left out, as
//! each run's own Model check does), the rows that missed in every run (a
//! structural miss, not noise), those that missed in most of them (with
//! the model/p50 they read in each), and each run's fits from 1 MiB with
//! the row each holds furthest from the model. A run its noise guard marked
//! noisy is not judged, and the output says so.

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
/// The fits' window starts here, as bench-collectives' default `fit_from`.
pub const FIT_FROM: u64 = 1 << 20;

/// One run of one wire, judged.
#[derive(Clone, Debug, PartialEq)]
pub struct RunCheck {
    pub run_id: String,
    /// Rows held to the model, and those within [`WITHIN`].
    pub rows: usize,
    pub within: usize,
    /// Labels of the rows that missed.
    pub misses: BTreeSet<String>,
    /// Every row held: its label and model/p50.
    pub held: BTreeMap<String, f64>,
    /// The fits the run recorded.
    pub fits: Vec<FitCheck>,
    /// Rows from [`FIT_FROM`] timed in the wire's state: none, and the
    /// run had nothing to fit.
    pub fit_rows: usize,
}

/// One fit a run recorded, and the row of its window furthest from the
/// model: what to look at first when the fit misses.
#[derive(Clone, Debug, PartialEq)]
pub struct FitCheck {
    /// The collective, and " in place" for an in-place fit.
    pub label: String,
    /// The fit's rms relative error.
    pub rms: f64,
    /// Bytes and model/p50 of the row furthest from its model.
    pub furthest: Option<(u64, f64)>,
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
        !self.fits.is_empty() && self.fits.iter().all(|f| f.rms <= FIT_RMS)
    }
}

/// Rows of a run held to the model: a model figure, 64 KiB and up, timed
/// in the wire's state.
fn judge(
    rows: &[&CollectiveRow],
    elsewhere: &BTreeSet<String>,
) -> (usize, BTreeSet<String>, BTreeMap<String, f64>) {
    let mut held = BTreeMap::new();
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
        let ratio = r.model_us / r.p50_us;
        held.insert(label.clone(), ratio);
        if !priced_well(ratio) {
            misses.insert(label);
        }
    }
    (held.len() - misses.len(), misses, held)
}

/// A fit as a run recorded it: collective, in place, rms, and the
/// smallest size of its window.
type RecordedFit = (String, bool, f64, u64);

/// The fits a run recorded (`extra.fits`; a record without its window's
/// start: [`FIT_FROM`]).
fn fits_of(extra: &serde_json::Map<String, serde_json::Value>) -> Vec<RecordedFit> {
    extra
        .get("fits")
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| {
                    Some((
                        f.get("collective")?.as_str()?.to_string(),
                        f.get("in_place").and_then(serde_json::Value::as_bool) == Some(true),
                        f.get("rms_rel_err")?.as_f64()?,
                        f.get("window_from_bytes")
                            .and_then(serde_json::Value::as_u64)
                            .unwrap_or(FIT_FROM),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The rows a fit of `collective` (in or out of place; `None`: any) held:
/// from `from` bytes, priced, timed in the wire's state.
fn fit_window<'a>(
    rows: &'a [&CollectiveRow],
    elsewhere: &'a BTreeSet<String>,
    collective: Option<(&'a str, bool)>,
    from: u64,
) -> impl Iterator<Item = &'a CollectiveRow> + 'a {
    rows.iter()
        .copied()
        .filter(move |r| {
            collective.is_none_or(|(c, in_place)| r.collective == c && r.in_place == in_place)
        })
        .filter(move |r| r.bytes >= from && r.p50_us > 0.0 && r.model_us > 0.0)
        .filter(|r| !elsewhere.contains(&r.label()))
}

/// Bytes and model/p50 of the row of `window` furthest from its model.
fn furthest<'a>(window: impl Iterator<Item = &'a CollectiveRow>) -> Option<(u64, f64)> {
    window
        .map(|r| (r.bytes, r.model_us / r.p50_us))
        .max_by(|a, b| (a.1 - 1.0).abs().total_cmp(&(b.1 - 1.0).abs()))
}

/// A run's recorded fits, each with the row its window holds furthest
/// from the model.
fn fit_checks(
    extra: &serde_json::Map<String, serde_json::Value>,
    rows: &[&CollectiveRow],
    elsewhere: &BTreeSet<String>,
) -> Vec<FitCheck> {
    fits_of(extra)
        .into_iter()
        .map(|(collective, in_place, rms, from)| FitCheck {
            furthest: furthest(fit_window(
                rows,
                elsewhere,
                Some((collective.as_str(), in_place)),
                from,
            )),
            label: format!("{collective}{}", if in_place { " in place" } else { "" }),
            rms,
        })
        .collect()
}

/// How a run's fits read: each with its rms and furthest row, or why the
/// run has none.
fn fits_text(r: &RunCheck) -> String {
    if r.fits.is_empty() {
        return if r.fit_rows == 0 {
            format!(
                "none (no row from {} timed in the wire's state)",
                units::bytes(FIT_FROM as f64)
            )
        } else {
            "none recorded".to_string()
        };
    }
    r.fits
        .iter()
        .map(|f| {
            let at = f.furthest.map_or(String::new(), |(bytes, ratio)| {
                format!(
                    " (furthest row {}: model x{ratio:.2})",
                    units::bytes(bytes as f64)
                )
            });
            format!("{} {} rms{at}", f.label, units::percent(f.rms))
        })
        .collect::<Vec<_>>()
        .join(", ")
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
                fits: fit_checks(&run.extra, &rows, &info.cores_elsewhere),
                fit_rows: fit_window(&rows, &info.cores_elsewhere, None, FIT_FROM).count(),
            });
        }
    }
    out
}

/// The labels of the rows that missed in at least one of `runs`.
fn missed_anywhere(runs: &[RunCheck]) -> BTreeSet<&String> {
    runs.iter().flat_map(|r| r.misses.iter()).collect()
}

/// The rows that missed in every judged run that held them (at least two runs).
pub fn structural(runs: &[RunCheck]) -> Vec<String> {
    if runs.len() < 2 {
        return Vec::new();
    }
    missed_anywhere(runs)
        .into_iter()
        .filter(|l| {
            runs.iter()
                .all(|r| r.misses.contains(*l) || !r.held.contains_key(*l))
        })
        .filter(|l| runs.iter().filter(|r| r.held.contains_key(*l)).count() >= 2)
        .cloned()
        .collect()
}

/// A row that missed in most of the runs that held it, but not in all:
/// a miss that recurs with the machine's state, where to look next.
#[derive(Clone, Debug, PartialEq)]
pub struct Recurring {
    pub label: String,
    /// Runs that missed it, and runs that held it.
    pub missed: usize,
    pub held: usize,
    /// The lowest and highest model/p50 it read over the runs that held it.
    pub range: (f64, f64),
}

/// The rows that missed in more than half of the judged runs that held
/// them, but not in every one ([`structural`]): at least three runs.
pub fn recurring(runs: &[RunCheck]) -> Vec<Recurring> {
    missed_anywhere(runs)
        .into_iter()
        .filter_map(|l| {
            let ratios: Vec<f64> = runs.iter().filter_map(|r| r.held.get(l).copied()).collect();
            let missed = runs.iter().filter(|r| r.misses.contains(l)).count();
            let held = ratios.len();
            (2 * missed > held && missed < held).then(|| Recurring {
                label: l.clone(),
                missed,
                held,
                range: ratios
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                        (lo.min(x), hi.max(x))
                    }),
            })
        })
        .collect()
}

/// The recurring misses as the summary names them.
fn recurring_text(rows: &[Recurring]) -> String {
    if rows.is_empty() {
        return "none".to_string();
    }
    rows.iter()
        .map(|r| {
            format!(
                "{} ({} of {}, model x{:.2}-{:.2})",
                r.label, r.missed, r.held, r.range.0, r.range.1
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
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
                "  {}: model within {:.0}% on {} of {} rows from {} ({}); fits from {}: {}",
                r.run_id,
                100.0 * WITHIN,
                r.within,
                r.rows,
                units::bytes(FROM_BYTES as f64),
                units::percent(r.share()),
                units::bytes(FIT_FROM as f64),
                fits_text(r)
            );
        }
        let structural = structural(runs);
        let good_fits = runs.iter().filter(|r| r.fits_good()).count();
        let fits_needed = (runs.len() * 3).div_ceil(5);
        parbench::outln!(
            "  median share within {:.0}%: {} (criterion 95%); rows that missed in every run: {}; in most runs: {}; runs with every fit within {:.0}% rms: {} of {} (criterion {})",
            100.0 * WITHIN,
            units::percent(median),
            if structural.is_empty() {
                "none".to_string()
            } else {
                structural.join(", ")
            },
            recurring_text(&recurring(runs)),
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
            held: held
                .iter()
                .map(|s| (s.to_string(), if misses.contains(s) { 0.5 } else { 1.0 }))
                .collect(),
            fits: vec![FitCheck {
                label: "all_reduce".into(),
                rms: 0.05,
                furthest: None,
            }],
            fit_rows: held.len(),
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

    /// A row that misses in most runs, not all, is named with its count
    /// and the model/p50 it read; one missing in half the runs, or in
    /// every run, is not.
    #[test]
    fn a_miss_in_most_runs_is_named_with_its_count_and_range() {
        let mut a = run(&["x", "y", "w"], &["x", "y", "z", "w"]);
        a.held.insert("x".into(), 0.49);
        let b = run(&["x", "y", "w"], &["x", "y", "z", "w"]);
        let mut c = run(&["y", "z", "w"], &["x", "y", "z", "w"]);
        c.held.insert("x".into(), 0.8);
        let d = run(&["z"], &["x", "z"]);
        let runs = [a, b, c, d];
        // x: 2 of 4 (half, not most); y: 3 of 3 (every run: structural);
        // z: 2 of 4; w: 3 of 3. None recurring; y and w structural.
        assert!(recurring(&runs).is_empty());
        assert_eq!(structural(&runs), ["w", "y"]);
        let e = run(&["x"], &["x", "z"]);
        let runs = [runs[0].clone(), runs[1].clone(), runs[2].clone(), e];
        let got = recurring(&runs);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].label.as_str(), got[0].missed, got[0].held),
            ("x", 3, 4)
        );
        assert_eq!(got[0].range, (0.49, 0.8));
        assert_eq!(recurring_text(&got), "x (3 of 4, model x0.49-0.80)");
        assert_eq!(recurring_text(&[]), "none");
    }

    fn priced(collective: &str, bytes: u64, in_place: bool, ratio: f64) -> CollectiveRow {
        CollectiveRow {
            collective: collective.into(),
            in_place,
            p50_us: 100.0,
            model_us: 100.0 * ratio,
            ..CollectiveRow::for_tests("r", bytes)
        }
    }

    /// A fit's furthest row is its own collective's and placement's, from
    /// 1 MiB, in the wire's state, whichever side of the model it lies.
    #[test]
    fn a_fit_names_the_row_of_its_window_furthest_from_the_model() {
        let rows = [
            priced("all_reduce", 512 << 10, false, 0.2),
            priced("all_reduce", 1 << 20, false, 1.1),
            priced("all_reduce", 4 << 20, false, 0.8),
            priced("all_reduce", 8 << 20, false, 0.3),
            priced("all_reduce", 16 << 20, true, 3.0),
            priced("all_gather", 16 << 20, false, 2.0),
        ];
        let refs: Vec<&CollectiveRow> = rows.iter().collect();
        let elsewhere: BTreeSet<String> = [rows[3].label()].into();
        let extra = serde_json::json!({"fits": [
            {"collective": "all_reduce", "in_place": false, "rms_rel_err": 0.14},
            {"collective": "all_reduce", "in_place": true, "rms_rel_err": 0.02, "window_from_bytes": 1048576},
            {"collective": "all_gather", "in_place": false, "rms_rel_err": 0.02, "window_from_bytes": 33554432},
        ]});
        let fits = fit_checks(extra.as_object().unwrap(), &refs, &elsewhere);
        assert_eq!(fits[0].label, "all_reduce");
        assert_eq!(fits[0].furthest, Some((4 << 20, 0.8)));
        assert_eq!(fits[1].label, "all_reduce in place");
        assert_eq!(fits[1].furthest, Some((16 << 20, 3.0)));
        // A window that starts past every row of its collective holds none.
        assert_eq!(fits[2].furthest, None);
        let mut check = run(&[], &["x"]);
        check.fits = fits[..2].to_vec();
        let text = fits_text(&check);
        assert!(
            text.starts_with("all_reduce 14") && text.contains("(furthest row 4 MiB: model x0.80)"),
            "{text}"
        );
        assert_eq!(fit_window(&refs, &elsewhere, None, FIT_FROM).count(), 4);
        check.fits.clear();
        check.fit_rows = 0;
        assert!(
            fits_text(&check).starts_with("none (no row from 1"),
            "{}",
            fits_text(&check)
        );
    }
}
