//! What a run found, from its rows: one headline per collective (its peak
//! busbw against the wire's ceiling), fits over a stated window, rows
//! above their ceiling, straggler, correctness, noise. Each figure is
//! computed here once; the footer, run.json and the report read it.

use parbench::comm::Collective;
use parbench::measure::noise::ForeignCpu;
use parbench::measure::wire::WireFigures;
use parbench::measure::StragglerVerdict;
use parbench::model::ladder::working_set_bytes;
use parbench::model::{self, AlphaBetaFit};
use parbench::results::CollectiveRow;

/// One collective's peak busbw, and where it was: the largest busbw of its
/// out-of-place rows (in-place ones when only those ran), against the
/// ceiling at that row's working set.
#[derive(Clone, Debug, PartialEq)]
pub struct Headline {
    pub collective: Collective,
    pub busbw_gbps: f64,
    pub bytes: u64,
    pub in_place: bool,
    /// The ceiling at the row's working set, GB/s (0: none measured).
    pub ceiling_gbps: f64,
    /// The published figure for this system, GB/s (GPU runs of all_reduce
    /// that match a row of parbench's published table).
    pub published_gbps: Option<f64>,
}

impl Headline {
    /// The headline of each collective of `rows`, in their order.
    pub fn of(rows: &[CollectiveRow], published_gbps: Option<f64>) -> Vec<Headline> {
        let mut out: Vec<Headline> = Vec::new();
        for c in collectives_of(rows) {
            let Some(r) =
                placement_rows(rows, c).max_by(|a, b| a.busbw_gbps.total_cmp(&b.busbw_gbps))
            else {
                continue;
            };
            out.push(Headline {
                collective: c,
                busbw_gbps: r.busbw_gbps,
                bytes: r.bytes,
                in_place: r.in_place,
                ceiling_gbps: r.ceiling_gbps,
                published_gbps: published_gbps.filter(|_| c == Collective::AllReduce),
            });
        }
        out
    }

    /// "all_reduce: peak busbw 8.6 GB/s at 64 MiB, out of place, 81% of the wire's ceiling".
    pub fn line(&self) -> String {
        let mut line = format!(
            "{}: peak busbw {} GB/s at {}, {}",
            self.collective.name(),
            sig2(self.busbw_gbps),
            parbench::units::bytes(self.bytes as f64),
            if self.in_place {
                "in place"
            } else {
                "out of place"
            },
        );
        if self.ceiling_gbps > 0.0 {
            line.push_str(&format!(
                ", {:.0}% of the wire's ceiling",
                100.0 * self.busbw_gbps / self.ceiling_gbps
            ));
        }
        if let Some(p) = self.published_gbps.filter(|p| *p > 0.0) {
            line.push_str(&format!(
                ", {:.0}% of the published {p:.0} GB/s",
                100.0 * self.busbw_gbps / p
            ));
        }
        line
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "collective": self.collective.name(),
            "busbw_gbps": self.busbw_gbps,
            "bytes": self.bytes,
            "in_place": self.in_place,
            "ceiling_gbps": self.ceiling_gbps,
            "published_gbps": self.published_gbps,
            "line": self.line(),
        })
    }
}

/// A figure with one decimal from 1 up, two below (`8.6`, `0.12`).
fn sig2(x: f64) -> String {
    if x.abs() >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The collectives of `rows`, in the order they first appear.
fn collectives_of(rows: &[CollectiveRow]) -> Vec<Collective> {
    let mut out = Vec::new();
    for c in rows
        .iter()
        .filter_map(|r| r.collective.parse::<Collective>().ok())
    {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// `coll`'s rows of the placement its headline and fits read: out of place,
/// or in place when no out-of-place row ran.
fn placement_rows(
    rows: &[CollectiveRow],
    coll: Collective,
) -> impl Iterator<Item = &CollectiveRow> {
    let of = move |r: &&CollectiveRow| r.collective == coll.name();
    let any_out = rows.iter().filter(of).any(|r| !r.in_place);
    rows.iter()
        .filter(of)
        .filter(move |r| r.in_place != any_out)
}

/// A fit of one (collective, algorithm) over the window: `t = L alpha + F
/// n beta` with the algorithm's textbook L and F, or per call (L = 1, F =
/// the busbw factor) for an algorithm without a form.
#[derive(Clone, Debug)]
pub struct FitLine {
    pub collective: Collective,
    pub algo: String,
    pub in_place: bool,
    /// Sizes in the window (nccl-tests' bytes from the window's start up).
    pub points: usize,
    /// The window's requested start, bytes.
    pub from: u64,
    pub fit: Result<AlphaBetaFit, String>,
    pub per_call: bool,
}

/// The figures after the table, recorded in run.json.
#[derive(Clone, Debug)]
pub struct Summary {
    pub headlines: Vec<Headline>,
    pub fits: Vec<FitLine>,
    /// The rows above their ceiling by more than its noise (their labels).
    pub above_ceiling: Vec<String>,
    pub straggler: Option<StragglerVerdict>,
    pub wrong: u64,
    /// Other processes' CPU time over the whole run, and per collective.
    pub noise: Option<ForeignCpu>,
    pub noise_per_collective: Vec<(Collective, Option<ForeignCpu>)>,
    /// Sockets: segments every rank's kernel retransmitted over the whole run.
    pub link: Option<parbench::comm::LinkStats>,
}

/// How far a row may sit above its ceiling before it is marked: 5% plus
/// the ceiling rung's own noise (best against median sample).
pub fn ceiling_tolerance(r: &CollectiveRow, wire: &WireFigures) -> f64 {
    let ws = r.collective.parse::<Collective>().map_or(r.bytes, |c| {
        working_set_bytes(c, r.world, r.bytes, r.in_place)
    });
    0.05 + wire.ceiling.noise_at(ws)
}

/// Whether a row's busbw beats its ceiling by more than the noise.
pub fn above_ceiling(r: &CollectiveRow, wire: &WireFigures) -> bool {
    r.ceiling_gbps > 0.0 && r.busbw_gbps > r.ceiling_gbps * (1.0 + ceiling_tolerance(r, wire))
}

/// Fits per (collective, algorithm) over each collective's headline
/// placement, rows of `from` bytes and up, of each row's p50.
pub fn fits(rows: &[CollectiveRow], from: u64) -> Vec<FitLine> {
    let mut out = Vec::new();
    for coll in collectives_of(rows) {
        let mut algos: Vec<(String, Vec<&CollectiveRow>)> = Vec::new();
        for r in placement_rows(rows, coll) {
            match algos.iter_mut().find(|(a, _)| *a == r.algo) {
                Some(g) => g.1.push(r),
                None => algos.push((r.algo.clone(), vec![r])),
            }
        }
        // An algorithm that ran only below the window has nothing to fit.
        for (algo, rows) in algos
            .into_iter()
            .filter(|(_, g)| g.iter().any(|r| r.bytes >= from))
        {
            out.push(fit_group(coll, algo, &rows, from));
        }
    }
    out
}

fn fit_group(collective: Collective, algo: String, rows: &[&CollectiveRow], from: u64) -> FitLine {
    let world = rows.first().map_or(1, |r| r.world);
    // The median iteration: one descheduled iteration moves a mean more
    // than any regime does.
    let points: Vec<(u64, f64)> = rows
        .iter()
        .filter(|r| r.bytes >= from && r.bytes > 0 && r.p50_us > 0.0)
        .map(|r| (r.bytes, r.p50_us * 1e-6))
        .collect();
    let model_algo = model::ModelAlgo::of(&algo);
    let unit = model::LinkParams::from_gbps_us(1.0, 1.0);
    let per_call = model::predict(collective, &model_algo, world, 1, &unit).is_none();
    let fit_algo = if per_call {
        model::ModelAlgo::Selector("auto".into())
    } else {
        model_algo
    };
    FitLine {
        collective,
        algo,
        in_place: rows.first().is_some_and(|r| r.in_place),
        points: points.len(),
        from,
        fit: model::fit(collective, &fit_algo, world, &points).map_err(|e| e.to_string()),
        per_call,
    }
}

impl Summary {
    /// The fits as run.json's `extra.fits`, each beside its collective's headline.
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
                        "structure": if f.per_call {
                            "t = alpha + busbw factor x n beta (per call)"
                        } else {
                            "t = L alpha + F n beta"
                        },
                        "peak": self
                            .headlines
                            .iter()
                            .find(|h| h.collective == f.collective)
                            .map(Headline::json),
                    });
                    match &f.fit {
                        Ok(fit) => {
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

    fn row(coll: &str, bytes: u64, in_place: bool, busbw: f64) -> CollectiveRow {
        CollectiveRow {
            collective: coll.into(),
            bytes,
            in_place,
            busbw_gbps: busbw,
            ceiling_gbps: 10.0,
            ..crate::test_rows::row()
        }
    }

    /// The headline is the best out-of-place row, even when an in-place row
    /// is faster: the fits and the report's curves read the same rows.
    #[test]
    fn the_headline_is_the_best_row_of_its_placement() {
        let rows = [
            row("all_reduce", 1 << 20, false, 6.0),
            row("all_reduce", 64 << 20, false, 8.6),
            row("all_reduce", 64 << 20, true, 12.0),
            row("all_gather", 1 << 20, true, 3.0),
        ];
        let h = Headline::of(&rows, None);
        assert_eq!(h.len(), 2);
        assert_eq!(
            h[0].line(),
            "all_reduce: peak busbw 8.6 GB/s at 64 MiB, out of place, 86% of the wire's ceiling"
        );
        assert_eq!(
            (h[1].bytes, h[1].in_place),
            (1 << 20, true),
            "only in place ran"
        );
        let gpu = Headline::of(&rows[..1], Some(12.0));
        assert!(
            gpu[0].line().ends_with("50% of the published 12 GB/s"),
            "{}",
            gpu[0].line()
        );
    }

    #[test]
    fn fits_cover_each_algorithm_in_the_window() {
        let mut rows: Vec<CollectiveRow> = (20..=26)
            .map(|k| {
                let mut r = row("all_reduce", 1 << k, false, 1.0);
                r.algo = "ring".into();
                r.p50_us = 5.0 + (1u64 << k) as f64 / 1e3;
                r
            })
            .collect();
        rows[0].algo = "rd".into();
        rows[0].bytes = 1 << 10;
        let f = fits(&rows, 1 << 20);
        assert_eq!(f.len(), 1, "rd ran only below the window");
        assert_eq!((f[0].algo.as_str(), f[0].points), ("ring", 6));
        assert!(f[0].fit.is_ok(), "{:?}", f[0].fit);
    }
}
