//! Least-squares alpha-beta fit of measured times.
//!
//! Given measured `(bytes, seconds)` points of one collective and algorithm
//! on `p` ranks, find the link that explains them:
//! `t = L alpha + B n beta`, with `L` and `B` the algorithm's
//! [`AlphaBetaTerms`] (the reduction term `gamma` is folded into `beta`:
//! a fitted bandwidth of a reducing collective includes the reduction's
//! cost, since transfer and reduction both scale with `n` and cannot be
//! told apart from times alone).
//!
//! Zero-byte points are left out: an empty collective sends no message (NCCL
//! and parbench return at once), so its time is the harness's, not the
//! algorithm's.
//!
//! The fit minimises the sum of squared *relative* residuals
//! `sum ((predicted - measured) / measured)^2`, because a sweep spans
//! six or more decades of time: plain least squares would let the largest
//! sizes decide everything and leave alpha meaningless. alpha and beta are
//! constrained to be `>= 0` (a two-variable non-negative least squares,
//! solved exactly: the unconstrained optimum when feasible, else the best
//! fit on either axis), so a fit never reports a negative latency or
//! bandwidth.

use super::algo::ModelAlgo;
use super::alpha_beta::{terms, AlphaBetaTerms, LinkParams};
use super::busbw::busbw_factor;
use crate::comm::Collective;

/// Why a fit could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// Fewer than two distinct non-zero sizes.
    #[error("an alpha-beta fit needs at least two distinct non-zero message sizes (got {sizes} among {points} points)")]
    TooFewPoints { points: usize, sizes: usize },
    /// A time that is not a positive finite number.
    #[error("point {index} ({bytes} B) has time {seconds} s: times must be positive and finite")]
    BadPoint {
        index: usize,
        bytes: u64,
        seconds: f64,
    },
    /// The collective and algorithm have no cost model.
    #[error("no alpha-beta model for {collective} with algorithm '{algo}' on {world} ranks")]
    NoModel {
        collective: Collective,
        algo: String,
        world: usize,
    },
    /// A structure with a negative or non-finite coefficient (from a caller
    /// of [`fit_terms`]), or sums that overflow.
    #[error("point {index}: the cost structure is not usable (negative or not finite)")]
    BadStructure { index: usize },
    /// The structure has no latency and no bandwidth term (one rank: no
    /// communication to explain).
    #[error("nothing to fit: the algorithm sends no message (one rank?)")]
    NothingToFit,
}

/// The result of a fit: the link's parameters and how well they explain
/// the points.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AlphaBetaFit {
    /// Fitted seconds per message (per latency step of the algorithm).
    pub alpha_s: f64,
    /// Fitted seconds per byte on the critical path (reduction folded in);
    /// 0 when the times do not grow with size.
    pub beta_s_per_byte: f64,
    /// The latency term `L alpha` at the smallest fitted size, seconds: the
    /// time of a call whose bytes cost nothing (the intercept).
    pub zero_byte_s: f64,
    /// Points used (zero-byte points are not).
    pub points: usize,
    /// Root mean square of `(predicted - measured) / measured`.
    pub rms_rel_err: f64,
    /// Largest `|predicted - measured| / measured`.
    pub max_rel_err: f64,
}

impl AlphaBetaFit {
    /// Fitted latency per message, microseconds.
    pub fn alpha_us(&self) -> f64 {
        self.alpha_s * 1e6
    }

    /// Fitted bandwidth in GB/s (1e9 B/s), or `None` when the fit found no
    /// size-dependent term (beta = 0: the sizes were too small to see it).
    ///
    /// For an algorithm fit this is the per-link bandwidth, comparable with
    /// busbw; for `auto` (see [`fit`]) it is the asymptotic busbw itself.
    pub fn bandwidth_gbps(&self) -> Option<f64> {
        (self.beta_s_per_byte > 0.0).then(|| 1.0 / (self.beta_s_per_byte * 1e9))
    }

    /// The fitted link, for [`super::alpha_beta::predict`] (gamma 0: folded into beta).
    pub fn link(&self) -> LinkParams {
        LinkParams {
            alpha_s: self.alpha_s,
            beta_s_per_byte: self.beta_s_per_byte,
            gamma_s_per_byte: 0.0,
        }
    }
}

/// The structure a fit of `auto` uses: one latency per call and the
/// nccl-tests busbw factor on the bytes (Hockney's `t = t0 + n/bw` in
/// bus-bandwidth units). `auto` switches algorithm with size, so no single
/// algorithm's structure holds; this one still gives the two numbers a
/// user wants, the small-message time and the large-message busbw.
pub fn per_call_terms(coll: Collective, p: usize) -> AlphaBetaTerms {
    AlphaBetaTerms {
        latency_steps: 1.0,
        bytes_factor: busbw_factor(coll, p),
        reduce_factor: 0.0,
    }
}

/// Fit the points `(bytes, seconds)` of `coll` run with `algo` on `p`
/// ranks. `algo` is one of parbench's algorithms (as they run, see
/// [`terms`]), or a selector such as `auto` or `nccl`
/// ([`ModelAlgo::Selector`]), fitted with [`per_call_terms`].
pub fn fit(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    points: &[(u64, f64)],
) -> Result<AlphaBetaFit, FitError> {
    let auto = algo.is_selector();
    let mut rows = Vec::with_capacity(points.len());
    for &(bytes, seconds) in points {
        let t = if auto && p > 0 {
            Some(per_call_terms(coll, p))
        } else {
            terms(coll, algo, p, bytes)
        };
        let t = t.ok_or_else(|| FitError::NoModel {
            collective: coll,
            algo: algo.to_string(),
            world: p,
        })?;
        rows.push((t, bytes, seconds));
    }
    fit_terms(&rows)
}

/// Fit points that each carry their own structure `(terms, bytes, seconds)`:
/// the general form behind [`fit`], for structures that depend on the size
/// (a chunked chain) or that the caller builds.
pub fn fit_terms(rows: &[(AlphaBetaTerms, u64, f64)]) -> Result<AlphaBetaFit, FitError> {
    let all = rows.len();
    for (index, &(_, bytes, seconds)) in rows.iter().enumerate() {
        if bytes > 0 && !(seconds.is_finite() && seconds > 0.0) {
            return Err(FitError::BadPoint {
                index,
                bytes,
                seconds,
            });
        }
    }
    for (index, (t, _, _)) in rows.iter().enumerate() {
        let usable = |x: f64| x.is_finite() && x >= 0.0;
        if !(usable(t.latency_steps) && usable(t.bytes_factor)) {
            return Err(FitError::BadStructure { index });
        }
    }
    let rows: Vec<&(AlphaBetaTerms, u64, f64)> = rows.iter().filter(|r| r.1 > 0).collect();
    let mut sizes: Vec<u64> = rows.iter().map(|r| r.1).collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.len() < 2 {
        return Err(FitError::TooFewPoints {
            points: all,
            sizes: sizes.len(),
        });
    }
    // Relative residuals: divide each row by its measured time, so the
    // target is 1 and the regressors are a = L/t, b = B n / t.
    let ab: Vec<(f64, f64)> = rows
        .iter()
        .map(|(t, bytes, s)| (t.latency_steps / s, t.bytes_factor * *bytes as f64 / s))
        .collect();
    let saa: f64 = ab.iter().map(|(a, _)| a * a).sum();
    let sbb: f64 = ab.iter().map(|(_, b)| b * b).sum();
    let sab: f64 = ab.iter().map(|(a, b)| a * b).sum();
    let sa: f64 = ab.iter().map(|(a, _)| a).sum();
    let sb: f64 = ab.iter().map(|(_, b)| b).sum();
    if ![saa, sbb, sab, sa, sb].iter().all(|x| x.is_finite()) {
        return Err(FitError::BadStructure { index: 0 });
    }
    if saa == 0.0 && sbb == 0.0 {
        return Err(FitError::NothingToFit);
    }
    let objective = |alpha: f64, beta: f64| -> f64 {
        ab.iter()
            .map(|(a, b)| {
                let r = a * alpha + b * beta - 1.0;
                r * r
            })
            .sum()
    };

    let mut candidates: Vec<(f64, f64)> = Vec::with_capacity(3);
    // Interior: solve the normal equations in column-scaled variables,
    // which keeps the 2x2 system well conditioned whatever the units.
    if saa > 0.0 && sbb > 0.0 {
        let (na, nb) = (saa.sqrt(), sbb.sqrt());
        let c = sab / (na * nb);
        let det = 1.0 - c * c;
        if det > 1e-12 {
            let (ya, yb) = (sa / na, sb / nb);
            let x = (ya - c * yb) / det;
            let y = (yb - c * ya) / det;
            let (alpha, beta) = (x / na, y / nb);
            if alpha >= 0.0 && beta >= 0.0 {
                candidates.push((alpha, beta));
            }
        }
    }
    // On the axes: latency only, or bandwidth only (never negative, as
    // every a, b >= 0).
    if saa > 0.0 {
        candidates.push((sa / saa, 0.0));
    }
    if sbb > 0.0 {
        candidates.push((0.0, sb / sbb));
    }
    let (alpha, beta) = candidates
        .into_iter()
        .map(|(al, be)| (objective(al, be), al, be))
        .min_by(|x, y| x.0.total_cmp(&y.0))
        .map(|(_, al, be)| (al, be))
        .ok_or(FitError::NothingToFit)?;

    let rel: Vec<f64> = ab.iter().map(|(a, b)| a * alpha + b * beta - 1.0).collect();
    let rms_rel_err = (rel.iter().map(|r| r * r).sum::<f64>() / rel.len() as f64).sqrt();
    let max_rel_err = rel.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    // The intercept: the latency count of the smallest fitted size.
    let l0 = rows
        .iter()
        .min_by_key(|r| r.1)
        .map_or(0.0, |r| r.0.latency_steps);
    Ok(AlphaBetaFit {
        alpha_s: alpha,
        beta_s_per_byte: beta,
        zero_byte_s: l0 * alpha,
        points: rows.len(),
        rms_rel_err,
        max_rel_err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::alpha_beta::predict;

    fn sizes() -> Vec<u64> {
        (0..=30).step_by(2).map(|k| 1u64 << k).collect()
    }

    fn synth(coll: Collective, algo: &ModelAlgo, p: usize, link: &LinkParams) -> Vec<(u64, f64)> {
        sizes()
            .into_iter()
            .map(|n| (n, predict(coll, algo, p, n, link).unwrap()))
            .collect()
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs()
    }

    #[test]
    fn recovers_exact_parameters() {
        let link = LinkParams::from_gbps_us(46.0, 3.5);
        for (coll, algo, p) in [
            (Collective::AllReduce, "ring", 8),
            (Collective::AllReduce, "rhd", 6),
            (Collective::AllReduce, "rd", 4),
            (Collective::AllGather, "ring", 3),
            (Collective::Broadcast, "tree", 5),
            (Collective::Broadcast, "chain", 4),
            (Collective::AllToAll, "pairwise", 8),
            (Collective::SendRecv, "p2p", 2),
            (Collective::ReduceScatter, "ring", 4),
        ] {
            let algo = &ModelAlgo::of(algo);
            let f = fit(coll, algo, p, &synth(coll, algo, p, &link)).unwrap();
            assert!(rel(f.alpha_us(), 3.5) < 1e-6, "{coll} {algo}: {f:?}");
            assert!(
                rel(f.bandwidth_gbps().unwrap(), 46.0) < 1e-6,
                "{coll} {algo}"
            );
            assert!(f.max_rel_err < 1e-9 && f.rms_rel_err < 1e-9);
        }
    }

    #[test]
    fn auto_fit_gives_call_latency_and_busbw() {
        // Times of a ring all_reduce: 14 alpha + 1.75 n beta. The per-call
        // structure recovers 14 alpha as the latency and 1/beta as busbw.
        let link = LinkParams::from_gbps_us(100.0, 2.0);
        let ring = crate::model::alpha_beta::ring_all_reduce(8);
        let pts: Vec<(u64, f64)> = sizes()
            .into_iter()
            .map(|n| (n, ring.seconds(n as f64, &link)))
            .collect();
        let f = fit(Collective::AllReduce, &"auto".into(), 8, &pts).unwrap();
        assert!(rel(f.alpha_us(), 28.0) < 1e-6, "{f:?}");
        assert!(rel(f.bandwidth_gbps().unwrap(), 100.0) < 1e-6);
        assert!(rel(f.zero_byte_s, 28e-6) < 1e-6);
    }

    #[test]
    fn noisy_data_stays_close() {
        // +-5% deterministic noise (a small LCG): parameters within 10%.
        let link = LinkParams::from_gbps_us(25.0, 10.0);
        let mut state: u64 = 0x9E3779B97F4A7C15;
        let pts: Vec<(u64, f64)> = synth(Collective::AllReduce, &"ring".into(), 4, &link)
            .into_iter()
            .map(|(n, t)| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (state >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
                (n, t * (1.0 + 0.1 * (u - 0.5)))
            })
            .collect();
        let f = fit(Collective::AllReduce, &"ring".into(), 4, &pts).unwrap();
        assert!(rel(f.alpha_us(), 10.0) < 0.1, "{f:?}");
        assert!(rel(f.bandwidth_gbps().unwrap(), 25.0) < 0.1, "{f:?}");
        assert!(f.max_rel_err <= 0.1 && f.rms_rel_err > 0.0);
    }

    #[test]
    fn zero_byte_points_are_left_out_and_two_sizes_suffice() {
        let link = LinkParams::from_gbps_us(10.0, 1.0);
        let t1 = predict(Collective::AllReduce, &"ring".into(), 2, 8, &link).unwrap();
        let t2 = predict(Collective::AllReduce, &"ring".into(), 2, 1 << 20, &link).unwrap();
        // A zero-byte point timed at 50 us of harness overhead changes nothing.
        let pts = [(0, 50e-6), (8, t1), (1 << 20, t2)];
        let f = fit(Collective::AllReduce, &"ring".into(), 2, &pts).unwrap();
        assert!(rel(f.alpha_us(), 1.0) < 1e-9, "{f:?}");
        assert!(rel(f.bandwidth_gbps().unwrap(), 10.0) < 1e-9);
        assert_eq!(f.points, 2);
        assert!(f.max_rel_err < 1e-9);
        // A zero-byte point timed at 0 (below the clock) is no error either.
        let pts = [(0, 0.0), (8, t1), (1 << 20, t2)];
        assert!(fit(Collective::AllReduce, &"ring".into(), 2, &pts).is_ok());
        // Zero-byte points alone are no fit.
        assert!(matches!(
            fit(
                Collective::AllReduce,
                &"ring".into(),
                2,
                &[(0, 1e-6), (0, 2e-6), (8, t1)]
            ),
            Err(FitError::TooFewPoints {
                points: 3,
                sizes: 1
            })
        ));
    }

    #[test]
    fn constraints_hold_when_data_disagree() {
        // Times that fall with size would need beta < 0: beta is clamped to
        // 0 and the bandwidth reported as absent, never negative.
        let pts = [(1024, 2e-5), (1 << 20, 1e-5)];
        let f = fit(Collective::AllReduce, &"ring".into(), 2, &pts).unwrap();
        assert!(f.alpha_s > 0.0 && f.beta_s_per_byte == 0.0);
        assert_eq!(f.bandwidth_gbps(), None);
        // Times that grow faster than linearly would want alpha < 0:
        // alpha is clamped to 0.
        let pts = [(1000, 1e-6), (1_000_000, 2e-3)];
        let f = fit(Collective::SendRecv, &"p2p".into(), 2, &pts).unwrap();
        assert!(f.alpha_s == 0.0 && f.beta_s_per_byte > 0.0, "{f:?}");
    }

    #[test]
    fn degenerate_inputs_are_errors() {
        let c = Collective::AllReduce;
        assert!(matches!(
            fit(c, &"ring".into(), 8, &[]),
            Err(FitError::TooFewPoints { .. })
        ));
        assert!(matches!(
            fit(c, &"ring".into(), 8, &[(8, 1e-5)]),
            Err(FitError::TooFewPoints { .. })
        ));
        assert!(matches!(
            fit(c, &"ring".into(), 8, &[(8, 1e-5), (8, 2e-5)]),
            Err(FitError::TooFewPoints { sizes: 1, .. })
        ));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                fit(c, &"ring".into(), 8, &[(8, 1e-5), (16, bad)]),
                Err(FitError::BadPoint { index: 1, .. })
            ));
        }
        let neg = AlphaBetaTerms {
            latency_steps: -1.0,
            bytes_factor: 1.0,
            reduce_factor: 0.0,
        };
        let ok = per_call_terms(c, 8);
        assert!(matches!(
            fit_terms(&[(ok, 8, 1e-5), (neg, 16, 2e-5)]),
            Err(FitError::BadStructure { index: 1 })
        ));
        assert!(matches!(
            fit_terms(&[(ok, 8, 1e-300), (ok, 16, 1e-300)]),
            Err(FitError::BadStructure { .. })
        ));
        assert!(matches!(
            fit(c, &"bogus".into(), 8, &[(8, 1e-5), (16, 2e-5)]),
            Err(FitError::NoModel { .. })
        ));
        assert!(matches!(
            fit(c, &"ring".into(), 1, &[(8, 1e-5), (16, 2e-5)]),
            Err(FitError::NothingToFit)
        ));
        assert!(matches!(
            fit(c, &"auto".into(), 0, &[(8, 1e-5), (16, 2e-5)]),
            Err(FitError::NoModel { .. })
        ));
    }
}
