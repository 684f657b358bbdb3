//! What a run found, from its rows: fits over a stated window, peaks, rows
//! above their ceiling, straggler, correctness, noise.

use crate::core_state::StatesSummary;
use crate::model_check::ModelCheck;
use parbench::comm::Collective;
use parbench::launch::flags::Backend;
use parbench::measure::noise::ForeignCpu;
use parbench::measure::wire::recheck::WireRecheck;
use parbench::measure::wire::{link_bound, WireFigures};
use parbench::measure::StragglerVerdict;
use parbench::model::wire::{fit_on_wire_at_rows, working_set_bytes, RowRungs, WireFit};
use parbench::model::{self, AlphaBetaFit};
use parbench::results::CollectiveRow;

/// Above this rms or largest relative error a fit is called poor, in words.
pub const POOR_FIT: f64 = 0.20;

/// A fit of one (collective, algorithm, placement) over the window.
#[derive(Clone, Debug)]
pub enum Fitted {
    /// In the calibrated model's structure (parbench's own transports):
    /// alpha and the scale of the ladders' bytes term.
    Wire(WireFit),
    /// The textbook `t = L alpha + F n beta` (a library's algorithms, or a
    /// device wire): `per_call` when the algorithm has no structure here
    /// and the fit is per call (L = 1, F = the busbw factor).
    Plain { fit: AlphaBetaFit, per_call: bool },
}

impl Fitted {
    /// (rms, max) relative error.
    pub fn errors(&self) -> (f64, f64) {
        match self {
            Fitted::Wire(w) => (w.rms_rel_err, w.max_rel_err),
            Fitted::Plain { fit, .. } => (fit.rms_rel_err, fit.max_rel_err),
        }
    }
}

/// One (collective, algorithm) after the sweep.
#[derive(Clone, Debug)]
pub struct FitLine {
    pub collective: Collective,
    pub algo: String,
    /// The placement fitted (out of place, unless only in place ran).
    pub in_place: bool,
    /// Sizes in the window (nccl-tests' bytes from the window's start up).
    pub points: usize,
    /// The window's requested start, bytes.
    pub from: u64,
    pub fit: Result<Fitted, String>,
    /// Why the fit is poor, in words, when its error passes [`POOR_FIT`];
    /// or what one beta would miss when the window crosses cache regimes.
    pub words: Option<String>,
    /// Largest busbw of any row, GB/s, and its size (every size, not only the window's).
    pub peak_busbw_gbps: f64,
    pub peak_bytes: u64,
}

/// The figures printed after the table and recorded in run.json.
#[derive(Clone, Debug)]
pub struct Summary {
    pub fits: Vec<FitLine>,
    /// Rows above their ceiling by more than the noise, each with why.
    pub above_ceiling: Vec<(String, String)>,
    pub straggler: Option<StragglerVerdict>,
    pub iterations: u64,
    pub wrong: u64,
    pub checked_rows: usize,
    /// Other processes' CPU time over the whole run, and per collective.
    pub noise: Option<ForeignCpu>,
    pub noise_per_collective: Vec<(Collective, Option<ForeignCpu>)>,
    /// Sockets: segments every rank's kernel retransmitted over the whole run.
    pub link: Option<parbench::comm::LinkStats>,
    /// How far the ceilings measured at the rows sat from the pre-sweep one.
    pub ceiling_drift: Option<CeilingDrift>,
    /// The cores' state row by row (`None` where it is not tracked).
    pub states: Option<StatesSummary>,
    /// A socket wire's ceiling measured again after the sweep.
    pub recheck: Option<WireRecheck>,
    /// The model column against the rows timed in the wire's state.
    pub model_check: Option<ModelCheck>,
}

/// The ceiling measured again at each row against the pre-sweep ladder at
/// the row's working set: its ratio's range over the rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CeilingDrift {
    pub rows: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    /// Rows of [`DRIFT_FROM`] and up, and of them those that moved by more
    /// than [`DRIFT_WARN`] either way.
    pub judged: usize,
    pub moved_rows: usize,
}

/// A ratio beyond which a row's copy rate is said to have moved (either
/// way) from the pre-sweep ladder.
pub const DRIFT_WARN: f64 = 1.5;
/// The share of rows of [`DRIFT_FROM`] bytes of working set and up that must
/// have moved for the footer to warn. One row at a cache boundary moves by
/// x2 in a run whose model agrees elsewhere (measured: 0-5 of 45 such rows
/// moved in runs whose model was within 25% on 32-34 of 44 rows), so a
/// warning on any one row would be raised on nearly every run.
pub const DRIFT_WARN_SHARE: f64 = 0.25;
/// Rows whose working set is this small are left out of the warning: the
/// model is judged from 64 KiB up, and the first rungs of a run are taken
/// while the machine is still waking up.
pub const DRIFT_FROM: u64 = 64 << 10;

impl CeilingDrift {
    /// The range of the rows' ratios (here / before), each with its working
    /// set; `None` for none.
    pub fn of(rows: &[(u64, f64)]) -> Option<CeilingDrift> {
        let rows: Vec<(u64, f64)> = rows
            .iter()
            .copied()
            .filter(|(_, r)| r.is_finite() && *r > 0.0)
            .collect();
        let mut v: Vec<f64> = rows.iter().map(|&(_, r)| r).collect();
        let median = parbench::stats::median(&mut v)?;
        let judged: Vec<f64> = rows
            .iter()
            .filter(|&&(ws, _)| ws >= DRIFT_FROM)
            .map(|&(_, r)| r)
            .collect();
        Some(CeilingDrift {
            rows: v.len(),
            min: v[0],
            median,
            max: v[v.len() - 1],
            judged: judged.len(),
            moved_rows: judged
                .iter()
                .filter(|&&r| !(1.0 / DRIFT_WARN..=DRIFT_WARN).contains(&r))
                .count(),
        })
    }

    /// Whether more than [`DRIFT_WARN_SHARE`] of the judged rows moved.
    pub fn moved(&self) -> bool {
        self.judged > 0 && self.moved_rows as f64 > DRIFT_WARN_SHARE * self.judged as f64
    }

    /// The summary's line.
    pub fn line(&self) -> String {
        let mut line = format!(
            "# Ceiling measured again at each row (shared memory): x{:.2}..x{:.2} (median x{:.2}) of the pre-sweep ladder at the row's working set, over {} rows; beyond x{DRIFT_WARN} either way: {} of the {} rows from {}",
            self.min,
            self.max,
            self.median,
            self.rows,
            self.moved_rows,
            self.judged,
            parbench::units::bytes(DRIFT_FROM as f64)
        );
        if self.moved() {
            line.push_str(&format!(
                "; WARNING: more than {:.0}% of them moved, so the machine's memory speed changed during the run and the model (priced from the ladders measured before the sweep) can miss such rows by as much: rerun on a quieter machine before trusting the model column",
                100.0 * DRIFT_WARN_SHARE
            ));
        }
        line
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"rows": self.rows, "min": self.min, "median": self.median, "max": self.max, "judged_from_working_set": DRIFT_FROM, "judged": self.judged, "moved_rows": self.moved_rows, "moved": self.moved(), "moved_beyond": DRIFT_WARN, "warn_share": DRIFT_WARN_SHARE})
    }
}

/// Fits and peaks per (collective, algorithm), over out-of-place rows (or
/// in-place rows when no out-of-place row ran) of `from` bytes and up, in
/// the order rows came; a row whose model's rungs were measured at the row
/// (`at_rows`: by row label) is fitted with that row's model.
pub fn fits(
    rows: &[CollectiveRow],
    wire: &WireFigures,
    from: u64,
    at_rows: &[(String, RowRungs)],
) -> Vec<FitLine> {
    let any_out = rows.iter().any(|r| !r.in_place);
    let mut groups: Vec<(Collective, String, Vec<&CollectiveRow>)> = Vec::new();
    for r in rows.iter().filter(|r| r.in_place != any_out) {
        let Ok(c) = r.collective.parse::<Collective>() else {
            continue;
        };
        match groups
            .iter_mut()
            .find(|(gc, ga, _)| *gc == c && *ga == r.algo)
        {
            Some(g) => g.2.push(r),
            None => groups.push((c, r.algo.clone(), vec![r])),
        }
    }
    // An algorithm that ran only below the window (recursive doubling at
    // small sizes) has nothing to fit.
    groups
        .into_iter()
        .filter(|(_, _, rows)| rows.iter().any(|r| r.bytes >= from))
        .map(|(collective, algo, rows)| {
            fit_group(collective, algo, !any_out, &rows, (wire, at_rows), from)
        })
        .collect()
}

fn fit_group(
    collective: Collective,
    algo: String,
    in_place: bool,
    rows: &[&CollectiveRow],
    (wire, at_rows): (&WireFigures, &[(String, RowRungs)]),
    from: u64,
) -> FitLine {
    let world = rows.first().map_or(1, |r| r.world);
    let window: Vec<&&CollectiveRow> = rows
        .iter()
        .filter(|r| r.bytes >= from && r.bytes > 0 && r.p50_us > 0.0)
        .collect();
    // The median iteration: one descheduled iteration moves a mean of 20 by
    // more than any regime does.
    let points: Vec<(u64, f64)> = window.iter().map(|r| (r.bytes, r.p50_us * 1e-6)).collect();
    let model_algo = model::ModelAlgo::of(&algo);
    let fit = if wire.own_transport && !model_algo.is_selector() {
        let at_row = |bytes: u64| {
            let label = parbench::results::row_label(collective.name(), bytes, in_place);
            at_rows.iter().find(|(l, _)| *l == label).map(|(_, r)| r)
        };
        fit_on_wire_at_rows(
            collective,
            &model_algo,
            world,
            in_place,
            &wire.model,
            &points,
            at_row,
            true,
        )
        .map(Fitted::Wire)
        .map_err(|e| e.to_string())
    } else {
        let unit = model::LinkParams::from_gbps_us(1.0, 1.0);
        let per_call = model::predict(collective, &model_algo, world, 1, &unit).is_none();
        let fit_algo = if per_call {
            model::ModelAlgo::Selector("auto".into())
        } else {
            model_algo
        };
        model::fit(collective, &fit_algo, world, &points)
            .map(|fit| Fitted::Plain { fit, per_call })
            .map_err(|e| e.to_string())
    };
    let words = fit
        .as_ref()
        .ok()
        .and_then(|f| fit_words(f, &window, wire, collective, in_place));
    let peak = rows
        .iter()
        .max_by(|a, b| a.busbw_gbps.total_cmp(&b.busbw_gbps));
    FitLine {
        collective,
        algo,
        in_place,
        points: points.len(),
        from,
        fit,
        words,
        peak_busbw_gbps: peak.map_or(0.0, |r| r.busbw_gbps),
        peak_bytes: peak.map_or(0, |r| r.bytes),
    }
}

/// The ceiling ladder's fall across the window: (at the first size, at the last).
fn ladder_span(
    wire: &WireFigures,
    coll: Collective,
    world: usize,
    in_place: bool,
    rows: &[&&CollectiveRow],
) -> Option<(f64, f64)> {
    let at = |r: &CollectiveRow| {
        wire.ceiling
            .at(working_set_bytes(coll, world, r.bytes, in_place))
    };
    Some((at(rows.first()?)?, at(rows.last()?)?))
}

/// Words for a fit whose error passes [`POOR_FIT`], naming the likely cause;
/// or, for a good fit in the ladders' structure, what one beta would miss.
pub fn fit_words(
    f: &Fitted,
    rows: &[&&CollectiveRow],
    wire: &WireFigures,
    coll: Collective,
    in_place: bool,
) -> Option<String> {
    let (rms, max) = f.errors();
    let world = rows.first().map_or(1, |r| r.world);
    let span = ladder_span(wire, coll, world, in_place, rows);
    let crosses = span.filter(|(a, b)| a.max(*b) > 1.5 * a.min(*b));
    if rms <= POOR_FIT && max <= POOR_FIT {
        return match (f, crosses) {
            (Fitted::Wire(w), Some((a, b))) if w.single_beta_rms.unwrap_or(0.0) > POOR_FIT => Some(format!(
                "the window crosses cache regimes (ceiling {a:.2} -> {b:.2} GB/s): one beta over it would err {:.0}% rms; the ladders' per-regime bandwidths explain it",
                100.0 * w.single_beta_rms.unwrap_or(0.0)
            )),
            _ => None,
        };
    }
    let mut spreads: Vec<f64> = rows
        .iter()
        .map(|r| (r.p99_us - r.p50_us) / r.p50_us)
        .filter(|x| x.is_finite())
        .collect();
    spreads.sort_by(f64::total_cmp);
    let spread = spreads.get(spreads.len() / 2).copied().unwrap_or(0.0);
    let noisy = wire.noise.as_ref().is_some_and(ForeignCpu::noisy);
    let poor = format!(
        "POOR FIT ({:.0}% rms, {:.0}% max)",
        100.0 * rms,
        100.0 * max
    );
    let cause = if noisy || spread > 0.25 {
        format!(
            "noise: the rows' median p99 sits {:.0}% above their p50{}",
            100.0 * spread,
            if noisy {
                ", and other processes took more than 10% of the machine"
            } else {
                ""
            }
        )
    } else if let (Fitted::Plain { .. }, Some((a, b))) = (f, crosses) {
        format!("a cache regime change inside the window (ceiling {a:.2} -> {b:.2} GB/s) that one beta cannot follow")
    } else {
        let kink = rows
            .windows(2)
            .map(|w| (w[1].p50_us / w[1].bytes as f64) / (w[0].p50_us / w[0].bytes as f64))
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .and_then(|(i, _)| rows.get(i + 1).map(|r| r.bytes));
        format!(
            "a change of regime the ladders do not see (a protocol or algorithm switch; the time per byte jumps most at {} B)",
            kink.unwrap_or(0)
        )
    };
    Some(format!("{poor}: likely cause: {cause}"))
}

/// Why a row beats its ceiling, in one line. `in_state`: the row was timed
/// with the cores where the wire was measured ([`parbench::measure::core_state`]).
pub fn above_ceiling_cause(
    r: &CollectiveRow,
    wire: &WireFigures,
    recheck: Option<&WireRecheck>,
    in_state: bool,
) -> String {
    // A row timed in another state of the cores (or of the sockets) than
    // the ladders' ran on another machine, in effect (on the EPYC VM an
    // in-place all_gather of 32 MiB so timed took 574 us where its runs in
    // the wire's state take 1100-1600; tcp rows of the loopback's fast mode
    // ran 3-4x above a ceiling measured in its slow one).
    if !in_state {
        let what = if wire.socket {
            "the sockets in another mode"
        } else {
            "the cores in another state"
        };
        return format!("timed with {what} than the one its ceiling was measured in (model marked ~): the machine ran faster during the row than during the ladder");
    }
    // A wire that moved during the run, measured again in its own state,
    // explains every row, and makes a slow ladder look like a shaped link.
    if let Some(m) = recheck.filter(|c| c.in_state).and_then(|c| c.moved()) {
        return format!(
            "the wire's ceiling moved x{:.2} between before and after the sweep (at {} of working set): the rows ran in another state of the machine than the ladder",
            m.ratio(),
            parbench::units::bytes(m.working_set as f64)
        );
    }
    let coll = r.collective.parse::<Collective>().ok();
    let ws = coll.map_or(r.bytes, |c| {
        working_set_bytes(c, r.world, r.bytes, r.in_place)
    });
    // A shaped link first (scripts/netns.sh names its wire tcp-RATE unless
    // PARBENCH_WIRE names it, so the ladders say it too): its token bucket,
    // not a cache, explains a small message beating it.
    let shaped = r.wire.starts_with("tcp-")
        || (Backend::named(&r.backend).is_some_and(Backend::over_sockets)
            && link_bound(&wire.ceiling, &wire.model.copy));
    if shaped && r.bytes < (1 << 20) {
        return "a shaped link's token bucket refills while the link idles and lets a message under its burst through at memory speed".into();
    }
    let c = &wire.ceiling;
    let (half, double) = (c.at(ws / 2), c.at(ws.saturating_mul(2)));
    if let (Some(a), Some(b)) = (half, double) {
        if a > 1.5 * b {
            return format!(
                "its working set ({ws} B per rank) sits at a cache boundary (ceiling {a:.2} GB/s at half of it, {b:.2} at twice): part of its buffers stay in cache between iterations"
            );
        }
    }
    "not explained by the ladder: a bug to report (the figure or the ceiling is wrong)".into()
}

impl Summary {
    /// The fits as run.json's `extra.fits`.
    pub fn fits_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.fits
                .iter()
                .map(|f| {
                    let mut m = serde_json::json!({
                        "collective": f.collective.name(),
                        "algo": f.algo,
                        "in_place": f.in_place,
                        "window_from_bytes": f.from,
                        "sizes": f.points,
                        "peak_busbw_gbps": f.peak_busbw_gbps,
                        "peak_bytes": f.peak_bytes,
                        "words": f.words,
                    });
                    match &f.fit {
                        Ok(Fitted::Wire(w)) => {
                            m["structure"] = "t = L alpha + s x (the ladders' bytes term)".into();
                            m["alpha"] = "measured before the sweep, not fitted".into();
                            m["alpha_us"] = (w.alpha_s * 1e6).into();
                            m["scale"] = w.scale.into();
                            m["window"] = serde_json::json!([w.window.0, w.window.1]);
                            m["busbw_gbps_at_window"] =
                                serde_json::json!([w.busbw_gbps.0, w.busbw_gbps.1]);
                            m["rms_rel_err"] = w.rms_rel_err.into();
                            m["max_rel_err"] = w.max_rel_err.into();
                            m["single_beta_rms_rel_err"] = w.single_beta_rms.into();
                        }
                        Ok(Fitted::Plain { fit, per_call }) => {
                            m["structure"] = if *per_call {
                                "t = alpha + busbw factor x n beta (per call)"
                            } else {
                                "t = L alpha + F n beta"
                            }
                            .into();
                            m["per_call_fit"] = (*per_call).into();
                            m["alpha_us"] = fit.alpha_us().into();
                            m["t0_us"] = (fit.zero_byte_s * 1e6).into();
                            m["beta_gbps"] = fit.bandwidth_gbps().into();
                            m["rms_rel_err"] = fit.rms_rel_err.into();
                            m["max_rel_err"] = fit.max_rel_err.into();
                        }
                        Err(e) => m["error"] = e.clone().into(),
                    }
                    m
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parbench::measure::wire::recheck::Recheck;
    use parbench::model::wire::{Ladder, WireModel};

    fn wire_with_ceiling(rungs: &[(u64, f64)]) -> WireFigures {
        WireFigures {
            ceiling: Ladder::exact("copy", rungs),
            model: WireModel::default(),
            own_transport: true,
            ping: None,
            exchange: None,
            clock_us: 0.02,
            cost_s: 0.0,
            noise: None,
            cpus: Vec::new(),
            placement_why: String::new(),
            link: None,
            state: None,
            rungs_off_state: Vec::new(),
            rungs_dipped: Vec::new(),
            socket: false,
        }
    }

    #[test]
    fn a_row_above_its_ceiling_is_explained_by_the_cores_state_first() {
        let mut r = crate::test_rows::row();
        (r.collective, r.bytes, r.in_place) = ("all_gather".into(), 32 << 20, true);
        // A cliff around the row's 32 MiB working set.
        let cliff = wire_with_ceiling(&[(16 << 20, 42.0), (64 << 20, 12.0)]);
        let flat = wire_with_ceiling(&[(16 << 20, 20.0), (64 << 20, 20.0)]);
        let other_state = above_ceiling_cause(&r, &cliff, None, false);
        assert!(other_state.contains("another state"), "{other_state}");
        let boundary = above_ceiling_cause(&r, &cliff, None, true);
        assert!(boundary.contains("cache boundary"), "{boundary}");
        let unexplained = above_ceiling_cause(&r, &flat, None, true);
        assert!(unexplained.contains("a bug to report"), "{unexplained}");
        // Sockets: the row's mode first; a recheck that moved explains the
        // rows only when it ran in the wire's state itself.
        let sockets = WireFigures {
            socket: true,
            ..flat.clone()
        };
        let mode = above_ceiling_cause(&r, &sockets, None, false);
        assert!(mode.contains("sockets in another mode"), "{mode}");
        let moved = WireRecheck {
            rungs: vec![Recheck {
                working_set: 1 << 20,
                before_gbps: 1.95,
                after_gbps: 7.05,
            }],
            cost_s: 0.0,
            probes: None,
            in_state: true,
        };
        let by_move = above_ceiling_cause(&r, &sockets, Some(&moved), true);
        assert!(by_move.contains("ceiling moved x3.62"), "{by_move}");
        let elsewhere = WireRecheck {
            in_state: false,
            ..moved
        };
        let not_by_move = above_ceiling_cause(&r, &sockets, Some(&elsewhere), true);
        assert!(!not_by_move.contains("ceiling moved"), "{not_by_move}");
    }

    #[test]
    fn the_drift_line_warns_only_when_many_rows_moved_either_way() {
        const BIG: u64 = DRIFT_FROM;
        assert_eq!(CeilingDrift::of(&[]), None);
        let d = CeilingDrift::of(&[(BIG, 1.1), (BIG, 0.9), (BIG, 1.0), (BIG, f64::NAN)]).unwrap();
        assert_eq!((d.rows, d.min, d.max, d.judged), (3, 0.9, 1.1, 3));
        assert!(!d.moved() && !d.line().contains("WARNING"), "{}", d.line());
        // One row of four at a cache boundary: said, not warned.
        let one = CeilingDrift::of(&[(BIG, 2.0), (BIG, 1.0), (BIG, 1.0), (BIG, 1.0)]).unwrap();
        assert_eq!(one.moved_rows, 1);
        assert!(!one.moved(), "{}", one.line());
        for moved in [2.0, 0.5] {
            let d = CeilingDrift::of(&[(BIG, moved), (BIG, moved), (BIG, 1.0)]).unwrap();
            assert!(d.moved() && d.line().contains("WARNING"), "{}", d.line());
        }
        // Small working sets are shown in the range, never judged.
        let small = CeilingDrift::of(&[(4 << 10, 3.0), (4 << 10, 3.0), (BIG, 1.0)]).unwrap();
        assert_eq!((small.max, small.judged, small.moved()), (3.0, 1, false));
    }
}
