//! Fits of measured times in the calibrated model's structure
//! ([`super::wire`]): `t = L alpha + s x B(n)`, the model's own bytes term
//! scaled, to tell how far the ladders explain a curve's growth with size.

use super::algo::ModelAlgo;
use super::alpha_beta::{terms, AlphaBetaTerms};
use super::busbw::busbw_factor;
use super::fit::{fit_terms, FitError};
use super::row_rungs::RowRungs;
use super::wire::{call_sets, moves, WireModel};
use crate::comm::Collective;

/// A fit of measured times over a window of sizes, in the calibrated
/// model's structure: `t = L alpha + s x B(n)`, with `L` the algorithm's
/// latency steps and `B(n)` the model's bytes-dependent seconds at `n`
/// (per-regime bandwidths from the ladders), solving for `alpha` and the
/// scale `s`. `s = 1` means the ladders explain the times' growth with size
/// exactly; the fitted bandwidth at each size is the model's over `s`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WireFit {
    /// Fitted seconds per latency step.
    pub alpha_s: f64,
    /// Fitted scale of the bytes term (1: as the ladders predict).
    pub scale: f64,
    /// Sizes fitted.
    pub points: usize,
    /// Smallest and largest size fitted, bytes.
    pub window: (u64, u64),
    /// Root mean square and largest relative error of the fit.
    pub rms_rel_err: f64,
    pub max_rel_err: f64,
    /// The fitted bus bandwidth (busbw of a call whose latency is free) at
    /// the window's smallest and largest size, GB/s.
    pub busbw_gbps: (f64, f64),
    /// The same points fitted with one beta (the textbook `t = L alpha + F
    /// n beta`): its rms error, to tell a regime change from noise.
    pub single_beta_rms: Option<f64>,
}

/// [`WireFit`] of `points` (`(bytes, seconds)`) of `coll` with `algo` on
/// `p` ranks, in or out of place, on `wire`.
pub fn fit_on_wire(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    in_place: bool,
    wire: &WireModel,
    points: &[(u64, f64)],
    fix_alpha: bool,
) -> Result<WireFit, FitError> {
    let rows: Vec<(u64, f64, &WireModel)> = points.iter().map(|&(b, s)| (b, s, wire)).collect();
    fit_on_rows(coll, algo, p, in_place, &rows, fix_alpha)
}

/// [`fit_on_wire`] with each point of `bytes` priced by the model with the
/// rungs measured at its row put in (`at_row(bytes)`; `None`: the wire's
/// own ladders), as a run priced its `model` column.
#[allow(clippy::too_many_arguments)]
pub fn fit_on_wire_at_rows<'a>(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    in_place: bool,
    wire: &WireModel,
    points: &[(u64, f64)],
    at_row: impl Fn(u64) -> Option<&'a RowRungs>,
    fix_alpha: bool,
) -> Result<WireFit, FitError> {
    let models: Vec<WireModel> = points
        .iter()
        .map(|&(n, _)| at_row(n).map_or_else(|| wire.clone(), |r| wire.with_rungs(r)))
        .collect();
    let priced: Vec<(u64, f64, &WireModel)> = points
        .iter()
        .zip(&models)
        .map(|(&(n, s), m)| (n, s, m))
        .collect();
    fit_on_rows(coll, algo, p, in_place, &priced, fix_alpha)
}

/// [`fit_on_wire`] with each point priced by its own model (`(bytes,
/// seconds, model)`): a row whose ladders were measured again just before
/// it ([`WireModel::with_rungs`]) is fitted with the model its `model`
/// column came from.
pub fn fit_on_rows(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    in_place: bool,
    points: &[(u64, f64, &WireModel)],
    fix_alpha: bool,
) -> Result<WireFit, FitError> {
    let mut alpha = None;
    let mut rows = Vec::with_capacity(points.len());
    let mut plain = Vec::with_capacity(points.len());
    for &(bytes, seconds, wire) in points {
        let no_model = || FitError::NoModel {
            collective: coll,
            algo: algo.to_string(),
            world: p,
        };
        let m = moves(coll, algo, p, bytes, in_place).ok_or_else(no_model)?;
        let b = wire.bytes_seconds(&m, bytes, &call_sets(coll, algo, p, bytes, in_place));
        if !b.is_finite() {
            return Err(no_model());
        }
        if fix_alpha {
            alpha = Some(wire.alpha_for(&m));
        }
        // bytes_factor x n x beta = s x B(n): per byte, B(n)/n, and beta = s.
        let per_byte = if bytes > 0 { b / bytes as f64 } else { 0.0 };
        rows.push((
            AlphaBetaTerms {
                latency_steps: m.latency_steps,
                bytes_factor: per_byte,
                reduce_factor: 0.0,
            },
            bytes,
            seconds,
        ));
        if let Some(t) = terms(coll, algo, p, bytes) {
            plain.push((t, bytes, seconds));
        }
    }
    let f = match alpha {
        Some(a) => fit_scale(&rows, a)?,
        None => fit_terms(&rows)?,
    };
    let sizes = rows.iter().filter(|r| r.1 > 0).map(|r| r.1);
    let window = (sizes.clone().min().unwrap_or(0), sizes.max().unwrap_or(0));
    let factor = busbw_factor(coll, p);
    let busbw = |n: u64| -> f64 {
        rows.iter().find(|r| r.1 == n).map_or(f64::NAN, |r| {
            factor / (r.0.bytes_factor * f.beta_s_per_byte) / 1e9
        })
    };
    Ok(WireFit {
        alpha_s: f.alpha_s,
        scale: f.beta_s_per_byte,
        points: f.points,
        window,
        rms_rel_err: f.rms_rel_err,
        max_rel_err: f.max_rel_err,
        busbw_gbps: (busbw(window.0), busbw(window.1)),
        single_beta_rms: fit_terms(&plain).ok().map(|p| p.rms_rel_err),
    })
}

/// [`fit_terms`] with alpha fixed: only beta (here the scale) is fitted,
/// by the same relative least squares, at least 0. A sliced ring's latency
/// steps grow with the size as its bytes do, so over sizes of a slice and
/// up alpha and beta cannot be told apart; the measured alpha settles it.
fn fit_scale(
    rows: &[(AlphaBetaTerms, u64, f64)],
    alpha_s: f64,
) -> Result<super::fit::AlphaBetaFit, FitError> {
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.1 > 0 && r.2 > 0.0 && r.2.is_finite())
        .map(|(t, n, secs)| {
            (
                t.latency_steps * alpha_s / secs,
                t.bytes_factor * *n as f64 / secs,
            )
        })
        .collect();
    if pts.len() < 2 {
        return Err(FitError::TooFewPoints {
            points: rows.len(),
            sizes: pts.len(),
        });
    }
    let num: f64 = pts.iter().map(|(a, b)| b * (1.0 - a)).sum();
    let den: f64 = pts.iter().map(|(_, b)| b * b).sum();
    if !(den > 0.0 && num.is_finite()) {
        return Err(FitError::NothingToFit);
    }
    let scale = (num / den).max(0.0);
    let rel: Vec<f64> = pts.iter().map(|(a, b)| a + b * scale - 1.0).collect();
    let l0 = rows
        .iter()
        .filter(|r| r.1 > 0)
        .min_by_key(|r| r.1)
        .map_or(0.0, |r| r.0.latency_steps);
    Ok(super::fit::AlphaBetaFit {
        alpha_s,
        beta_s_per_byte: scale,
        zero_byte_s: l0 * alpha_s,
        points: pts.len(),
        rms_rel_err: (rel.iter().map(|r| r * r).sum::<f64>() / rel.len() as f64).sqrt(),
        max_rel_err: rel.iter().fold(0.0f64, |m, r| m.max(r.abs())),
    })
}
