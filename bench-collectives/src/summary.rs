//! What a run found, from its rows: fits, peaks, straggler, correctness.

use parbench::comm::Collective;
use parbench::measure::StragglerVerdict;
use parbench::model::{self, AlphaBetaFit};
use parbench::results::CollectiveRow;

/// One (collective, algorithm) after the sweep.
#[derive(Clone, Debug)]
pub struct FitLine {
    pub collective: Collective,
    pub algo: String,
    /// Sizes fitted.
    pub points: usize,
    /// The fit of the algorithm's own structure, or the per-call fit when
    /// the algorithm has no model (`per_call`), or why none could be made.
    pub fit: Result<AlphaBetaFit, String>,
    pub per_call: bool,
    /// Largest busbw of any row, GB/s, and its size.
    pub peak_busbw_gbps: f64,
    pub peak_bytes: u64,
}

/// The figures printed after the table and recorded in run.json.
#[derive(Clone, Debug)]
pub struct Summary {
    pub fits: Vec<FitLine>,
    pub straggler: Option<StragglerVerdict>,
    pub iterations: u64,
    pub wrong: u64,
    pub checked_rows: usize,
}

/// Fits and peaks per (collective, algorithm), over out-of-place rows (or
/// in-place rows when no out-of-place row ran), in the order rows came.
pub fn fits(rows: &[CollectiveRow]) -> Vec<FitLine> {
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
    groups
        .into_iter()
        .map(|(collective, algo, rows)| {
            let world = rows.first().map_or(1, |r| r.world);
            let points: Vec<(u64, f64)> = rows
                .iter()
                .filter(|r| r.bytes > 0 && r.time_us > 0.0)
                .map(|r| (r.bytes, r.time_us * 1e-6))
                .collect();
            // An algorithm the model has no structure for (nccl's own, ...)
            // gets the per-call fit: one latency per call, busbw bytes.
            let unit = model::LinkParams::from_gbps_us(1.0, 1.0);
            let per_call = model::predict(collective, &algo, world, 1, &unit).is_none();
            let fit_algo = if per_call { "auto" } else { algo.as_str() };
            let fit = model::fit(collective, fit_algo, world, &points).map_err(|e| e.to_string());
            let peak = rows
                .iter()
                .max_by(|a, b| a.busbw_gbps.total_cmp(&b.busbw_gbps));
            FitLine {
                collective,
                algo,
                points: points.len(),
                fit,
                per_call,
                peak_busbw_gbps: peak.map_or(0.0, |r| r.busbw_gbps),
                peak_bytes: peak.map_or(0, |r| r.bytes),
            }
        })
        .collect()
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
                        "sizes": f.points,
                        "per_call_fit": f.per_call,
                        "peak_busbw_gbps": f.peak_busbw_gbps,
                        "peak_bytes": f.peak_bytes,
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
