//! The calibrated model of parbench's own CPU transports: link parameters
//! per cache regime, from ladders of working sets measured in the same run,
//! and what each algorithm really moves on a rank.
//!
//! The textbook alpha-beta forms ([`super::alpha_beta`]) charge every byte
//! one `beta`, whatever its size. A CPU's memory is not one wire: a copy
//! whose buffers stay in L1 runs several times faster than one out of the
//! last-level cache, so a beta measured out of cache overpredicts every
//! in-cache size (by up to 60x on this project's machines) and one measured
//! in cache underpredicts the large ones. Here each bandwidth is a
//! [`Ladder`]: GB/s at a set of working sets (the bytes each rank touches),
//! interpolated at the row's own working set ([`working_set_bytes`]).
//!
//! What a rank does per byte of `n` ([`Moves`]), beyond the textbook terms:
//!
//! - received bytes cost `beta` of the transfer ladder: for ring, recursive
//!   and pairwise steps (every rank sends while it receives) the duplex
//!   figure, for tree and chain steps the one-way figure;
//! - reduced bytes cost `beta + gamma`, or `gamma` alone where the
//!   transport reduces straight out of the sender's memory
//!   ([`WireModel::fused_reduce`]: `local`'s rendezvous reads the posted
//!   bytes in place, so the receive and the reduction are one pass);
//! - local copies the algorithms make (out-of-place all_gather copies its
//!   own block in, recursive doubling copies the running result before each
//!   step, out-of-place non-ring all_reduce, broadcast and reduce copy the
//!   input first, in-place all_to_all copies the buffer) cost the memory
//!   copy ladder's `beta`.
//!
//! Every coefficient is measured before the sweep: nothing here is fitted
//! to the sweep's own times. [`fit_on_wire`] is the fit that does that.

use super::alpha_beta::{terms, AlphaBetaTerms};
use super::busbw::busbw_factor;
use super::fit::{fit_terms, FitError};
use crate::comm::Collective;

/// One working set of a [`Ladder`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rung {
    /// Bytes each rank touches per transfer (source + destination of a
    /// copy; the message buffer of a stream).
    pub working_set: u64,
    /// Bytes moved per transfer (a copy's length, a message's length).
    pub bytes: u64,
    /// Best sample, GB/s per rank (1e9 B/s), mean over the ranks measured.
    pub gbps: f64,
    /// Median sample, GB/s: `1 - median / best` is the rung's noise.
    pub median_gbps: f64,
}

impl Rung {
    /// Relative spread of the rung's samples: `1 - median / best` (0 when unknown).
    pub fn noise(&self) -> f64 {
        let n = 1.0 - self.median_gbps / self.gbps;
        if n.is_finite() && n > 0.0 {
            n
        } else {
            0.0
        }
    }
}

/// Bandwidth at a ladder of working sets, by increasing working set, and
/// how it was measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ladder {
    /// How each rung was measured, in words.
    pub method: String,
    pub rungs: Vec<Rung>,
}

impl Ladder {
    /// Bandwidth at `working_set` bytes per rank, GB/s: log-log
    /// interpolation between the two rungs around it, the end rung's figure
    /// beyond the ends; `None` for an empty ladder.
    pub fn at(&self, working_set: u64) -> Option<f64> {
        self.interpolate(working_set, |r| r.gbps)
    }

    /// The noise (see [`Rung::noise`]) at `working_set`, interpolated as [`Self::at`].
    pub fn noise_at(&self, working_set: u64) -> f64 {
        self.interpolate(working_set, Rung::noise).unwrap_or(0.0)
    }

    fn interpolate(&self, working_set: u64, f: impl Fn(&Rung) -> f64) -> Option<f64> {
        let rungs: Vec<&Rung> = self
            .rungs
            .iter()
            .filter(|r| r.gbps.is_finite() && r.gbps > 0.0 && r.working_set > 0)
            .collect();
        let (first, last) = (rungs.first()?, rungs.last()?);
        let ws = working_set.max(1);
        if ws <= first.working_set {
            return Some(f(first));
        }
        if ws >= last.working_set {
            return Some(f(last));
        }
        let hi = rungs.iter().position(|r| r.working_set >= ws)?;
        let (a, b) = (rungs[hi - 1], rungs[hi]);
        let t = ((ws as f64).ln() - (a.working_set as f64).ln())
            / ((b.working_set as f64).ln() - (a.working_set as f64).ln());
        let (fa, fb) = (f(a), f(b));
        Some(if fa > 0.0 && fb > 0.0 {
            (fa.ln() + t * (fb.ln() - fa.ln())).exp()
        } else {
            fa + t * (fb - fa)
        })
    }

    /// The fastest rung, GB/s (in cache).
    pub fn peak_gbps(&self) -> Option<f64> {
        self.rungs.iter().map(|r| r.gbps).reduce(f64::max)
    }

    /// The slowest rung, GB/s (out of cache, when the ladder reaches it).
    pub fn floor_gbps(&self) -> Option<f64> {
        self.rungs.iter().map(|r| r.gbps).reduce(f64::min)
    }

    /// Whether the ladder reaches `working_set` (its last rung is at least that large).
    pub fn covers(&self, working_set: u64) -> bool {
        self.rungs
            .last()
            .is_some_and(|r| r.working_set >= working_set)
    }

    /// The rung-wise larger of two ladders over the same working sets (one
    /// stream, and both directions at once: the best either gives).
    pub fn best_of(&self, other: &Ladder) -> Ladder {
        let rungs = self
            .rungs
            .iter()
            .map(
                |r| match other.rungs.iter().find(|o| o.working_set == r.working_set) {
                    Some(o) if o.gbps > r.gbps => o.clone(),
                    _ => r.clone(),
                },
            )
            .collect();
        Ladder {
            method: format!("the better of ({}) and ({})", self.method, other.method),
            rungs,
        }
    }
}

/// Bytes each rank's buffers hold in one call of `coll` on `p` ranks with
/// nccl-tests' size `n_bytes`: out of place the send and the receive
/// buffer, in place the one buffer. all_reduce, broadcast, reduce,
/// all_to_all, sendrecv: `2n` out of place, `n` in place; all_gather (`n`
/// the gathered output): `n + n/p` and `n`; reduce_scatter (`n` the whole
/// input): `n + n/p` and `n`. The algorithms' scratch (at most two ring
/// blocks of 512 KiB, or one buffer for recursive doubling) is left out.
pub fn working_set_bytes(coll: Collective, p: usize, n_bytes: u64, in_place: bool) -> u64 {
    if in_place {
        return n_bytes;
    }
    match coll {
        Collective::AllGather | Collective::ReduceScatter => n_bytes + n_bytes / p.max(1) as u64,
        _ => 2 * n_bytes,
    }
}

/// What one rank does on the critical path per byte of `n`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Moves {
    /// Messages on the critical path (each costs `alpha`).
    pub latency_steps: f64,
    /// Bytes received into place (copied), per byte of `n`.
    pub received: f64,
    /// Of which read from a buffer the sender did not write during the call
    /// (an input left as it was: the first hop of a ring, a sendrecv).
    pub received_input: f64,
    /// Bytes received and reduced, per byte of `n`.
    pub reduced: f64,
    /// Of which read from an input the sender did not write during the call.
    pub reduced_input: f64,
    /// Bytes copied within the rank (not over the wire), per byte of `n`.
    pub local_copy: f64,
    /// Whether the steps are exchanges (every rank sends while receiving:
    /// ring, recursive, pairwise, sendrecv) rather than one-way (trees, chains).
    pub duplex: bool,
}

/// [`Moves`] of `coll` run with `algo` (a name [`terms`] knows; not a
/// selector) on `p` ranks, `n_bytes`, in or out of place, as parbench's CPU
/// algorithms run it (`comm/host.rs`, `comm/algo/`).
pub fn moves(
    coll: Collective,
    algo: &str,
    p: usize,
    n_bytes: u64,
    in_place: bool,
) -> Option<Moves> {
    let t: AlphaBetaTerms = terms(coll, algo, p, n_bytes)?;
    let algo = algo.to_ascii_lowercase();
    let pf = p.max(1) as f64;
    let out = !in_place;
    let local_copy = match (coll, algo.as_str()) {
        _ if p <= 1 || n_bytes == 0 => 0.0,
        // Recursive doubling copies the running result before each step
        // (a rank cannot reduce into bytes its partner is reading).
        (Collective::AllReduce, "rd") => t.latency_steps + if out { 1.0 } else { 0.0 },
        // Out of place, only the ring reads the send buffer where it lies.
        (Collective::AllReduce, "ring") => 0.0,
        (Collective::AllReduce, _) => {
            if out {
                1.0
            } else {
                0.0
            }
        }
        (Collective::AllGather, _) => {
            if out {
                1.0 / pf
            } else {
                0.0
            }
        }
        // The root copies send into receive out of place; a reduce's
        // non-root ranks accumulate in scratch, a copy of their input.
        (Collective::Broadcast, _) => {
            if out {
                1.0
            } else {
                0.0
            }
        }
        (Collective::Reduce, _) => 1.0,
        (Collective::AllToAll, _) => {
            if out {
                1.0 / pf
            } else {
                1.0
            }
        }
        _ => 0.0,
    };
    let duplex = !matches!(algo.as_str(), "tree" | "chain")
        && !matches!(coll, Collective::Broadcast | Collective::Reduce);
    let received = (t.bytes_factor - t.reduce_factor).max(0.0);
    let reduced = t.reduce_factor;
    // The first hop of a ring reads the sender's input where it lies; later
    // hops carry what the sender received or reduced during the call. An
    // out-of-place all_gather sends its own block from the receive buffer,
    // copied in just before; in place, an all_reduce's input is the last
    // call's output, written by then.
    let first_hop = if n_bytes == 0 || p <= 1 {
        0.0
    } else {
        1.0 / pf
    };
    let (received_input, reduced_input) = match (coll, algo.as_str()) {
        (Collective::AllReduce, "ring") if out => (0.0, first_hop.min(reduced)),
        (Collective::ReduceScatter, "ring") => (0.0, first_hop.min(reduced)),
        (Collective::AllGather, "ring") if in_place => (first_hop.min(received), 0.0),
        (Collective::AllToAll, _) if out => (received, 0.0),
        (Collective::SendRecv, _) => (received, 0.0),
        (Collective::Broadcast, "tree") if in_place => ((1.0f64).min(received), 0.0),
        _ => (0.0, 0.0),
    };
    Some(Moves {
        latency_steps: t.latency_steps,
        received,
        received_input,
        reduced,
        reduced_input,
        local_copy,
        duplex,
    })
}

/// A wire measured before the sweep: its latency, its transfer, copy and
/// reduction bandwidths per working set, and how its transport reduces.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WireModel {
    /// Seconds per one-way message (tree and chain steps): the median of
    /// timed ping-pong half round trips.
    pub alpha_s: f64,
    /// Seconds per exchange step (every rank sends while it receives: ring,
    /// recursive, pairwise, sendrecv): the median of timed 8-byte
    /// exchanges. 0: as `alpha_s`.
    #[serde(default)]
    pub alpha_exchange_s: f64,
    /// GB/s of a received byte when every rank sends while it receives.
    pub duplex: Ladder,
    /// GB/s of a received byte the sender wrote during the call (a
    /// forwarded or reduced block), every rank exchanging at once. On
    /// shared memory the receiver pulls lines another core holds modified:
    /// slower than `duplex`, whose bytes (an input left as it was) sit in
    /// the receiver's own cache from the call before. Empty: as `duplex`.
    #[serde(default)]
    pub fresh: Ladder,
    /// GB/s of a received byte on a one-way path (one stream).
    pub one_way: Ladder,
    /// GB/s of a memory copy within a rank, every rank at once.
    pub copy: Ladder,
    /// GB/s of accumulator of the reduction kernel `acc op= src`.
    pub reduce: Ladder,
    /// A reduced receive reads the sender's bytes in place and reduces them
    /// in the same pass (`local`): it costs gamma alone.
    pub fused_reduce: bool,
}

/// Seconds per byte of a ladder at a working set (infinite when unknown).
fn secs_per_byte(l: &Ladder, ws: u64) -> f64 {
    match l.at(ws) {
        Some(g) if g > 0.0 => 1.0 / (g * 1e9),
        _ => f64::INFINITY,
    }
}

impl WireModel {
    /// The bytes-dependent part of a call's cost, seconds: what `m` costs
    /// on this wire at working set `ws` for `n_bytes`.
    pub fn bytes_seconds(&self, m: &Moves, n_bytes: u64, ws: u64) -> f64 {
        let n = n_bytes as f64;
        let beta = secs_per_byte(
            if m.duplex {
                &self.duplex
            } else {
                &self.one_way
            },
            ws,
        );
        let copy = secs_per_byte(&self.copy, ws);
        let gamma = secs_per_byte(&self.reduce, ws);
        let part = |bytes: f64, s: f64| if bytes > 0.0 { bytes * n * s } else { 0.0 };
        let reduced = if self.fused_reduce {
            gamma
        } else {
            beta + gamma
        };
        part(m.received, beta) + part(m.reduced, reduced) + part(m.local_copy, copy)
    }

    /// Predicted seconds of one `coll` with `algo` on `p` ranks, `n_bytes`
    /// (nccl-tests' size), in or out of place: `L alpha` plus
    /// [`Self::bytes_seconds`] at the call's [`working_set_bytes`]. `None`
    /// for a selector or an algorithm without a model, or when a ladder the
    /// call needs is empty.
    pub fn predict(
        &self,
        coll: Collective,
        algo: &str,
        p: usize,
        n_bytes: u64,
        in_place: bool,
    ) -> Option<f64> {
        let m = moves(coll, algo, p, n_bytes, in_place)?;
        let ws = working_set_bytes(coll, p, n_bytes, in_place);
        let t = m.latency_steps * self.alpha_for(&m) + self.bytes_seconds(&m, n_bytes, ws);
        t.is_finite().then_some(t)
    }

    /// The latency of one of `m`'s steps: an exchange's, or a one-way message's.
    pub fn alpha_for(&self, m: &Moves) -> f64 {
        if m.duplex && self.alpha_exchange_s > 0.0 {
            self.alpha_exchange_s
        } else {
            self.alpha_s
        }
    }
}

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
    algo: &str,
    p: usize,
    in_place: bool,
    wire: &WireModel,
    points: &[(u64, f64)],
) -> Result<WireFit, FitError> {
    let mut rows = Vec::with_capacity(points.len());
    let mut plain = Vec::with_capacity(points.len());
    for &(bytes, seconds) in points {
        let no_model = || FitError::NoModel {
            collective: coll,
            algo: algo.to_string(),
            world: p,
        };
        let m = moves(coll, algo, p, bytes, in_place).ok_or_else(no_model)?;
        let ws = working_set_bytes(coll, p, bytes, in_place);
        let b = wire.bytes_seconds(&m, bytes, ws);
        if !b.is_finite() {
            return Err(no_model());
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
    let f = fit_terms(&rows)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(ws: u64, gbps: f64) -> Rung {
        Rung {
            working_set: ws,
            bytes: ws / 2,
            gbps,
            median_gbps: gbps * 0.9,
        }
    }

    fn ladder(rungs: &[(u64, f64)]) -> Ladder {
        Ladder {
            method: "test".into(),
            rungs: rungs.iter().map(|&(w, g)| rung(w, g)).collect(),
        }
    }

    #[test]
    fn interpolates_log_log_and_holds_the_ends() {
        let l = ladder(&[(1 << 10, 40.0), (4 << 10, 10.0)]);
        assert_eq!(l.at(1), Some(40.0));
        assert_eq!(l.at(1 << 20), Some(10.0));
        // Halfway in log space: the geometric mean.
        let mid = l.at(2 << 10).unwrap();
        assert!((mid - 20.0).abs() < 1e-9, "{mid}");
        assert!((l.noise_at(2 << 10) - 0.1).abs() < 1e-9);
        assert_eq!(Ladder::default().at(5), None);
        assert!(l.covers(4 << 10) && !l.covers(5 << 10));
        assert_eq!((l.peak_gbps(), l.floor_gbps()), (Some(40.0), Some(10.0)));
        let a = ladder(&[(1, 1.0), (2, 5.0)]);
        let b = ladder(&[(1, 2.0), (2, 4.0)]);
        let g: Vec<f64> = a.best_of(&b).rungs.iter().map(|r| r.gbps).collect();
        assert_eq!(g, [2.0, 5.0]);
    }

    #[test]
    fn working_sets_per_collective() {
        let n = 1 << 20;
        assert_eq!(working_set_bytes(Collective::AllReduce, 2, n, false), 2 * n);
        assert_eq!(working_set_bytes(Collective::AllReduce, 2, n, true), n);
        assert_eq!(
            working_set_bytes(Collective::AllGather, 4, n, false),
            n + n / 4
        );
        assert_eq!(
            working_set_bytes(Collective::ReduceScatter, 2, n, false),
            n + n / 2
        );
        assert_eq!(working_set_bytes(Collective::SendRecv, 2, n, false), 2 * n);
    }

    #[test]
    fn moves_follow_the_algorithms() {
        // Ring all_reduce on 2 ranks: half received by copy, half reduced.
        let m = moves(Collective::AllReduce, "ring", 2, 1 << 20, false).unwrap();
        assert_eq!(
            (m.received, m.reduced, m.local_copy, m.duplex),
            (0.5, 0.5, 0.0, true)
        );
        // Out-of-place all_gather copies its own block in first.
        let m = moves(Collective::AllGather, "ring", 4, 1 << 20, false).unwrap();
        assert_eq!((m.received, m.local_copy), (0.75, 0.25));
        assert_eq!(
            moves(Collective::AllGather, "ring", 4, 1 << 20, true)
                .unwrap()
                .local_copy,
            0.0
        );
        // Recursive doubling on 2 ranks: one step, reduced, one copy of the result.
        let m = moves(Collective::AllReduce, "rd", 2, 1024, true).unwrap();
        assert_eq!((m.received, m.reduced, m.local_copy), (0.0, 1.0, 1.0));
        let m = moves(Collective::Broadcast, "tree", 2, 1024, false).unwrap();
        assert!(!m.duplex && m.local_copy == 1.0);
        assert_eq!(moves(Collective::AllReduce, "auto", 2, 8, true), None);
    }

    #[test]
    fn fused_reduction_costs_gamma_alone() {
        let flat = |g| ladder(&[(1, g), (1 << 40, g)]);
        let mut wire = WireModel {
            alpha_s: 1e-6,
            alpha_exchange_s: 0.0,
            fresh: Ladder::default(),
            duplex: flat(10.0),
            one_way: flat(10.0),
            copy: flat(10.0),
            reduce: flat(5.0),
            fused_reduce: true,
        };
        let n = 1u64 << 20;
        // 2 ranks, one slice: 2 alpha + n/2 at 10 GB/s (copy) + n/2 at 5 GB/s (reduce).
        let want = 2e-6 + 0.5 * n as f64 / 10e9 + 0.5 * n as f64 / 5e9;
        let t = wire
            .predict(Collective::AllReduce, "ring", 2, n, false)
            .unwrap();
        assert!((t - want).abs() < 1e-12, "{t} {want}");
        wire.fused_reduce = false;
        let t = wire
            .predict(Collective::AllReduce, "ring", 2, n, false)
            .unwrap();
        assert!((t - want - 0.5 * n as f64 / 10e9).abs() < 1e-12);
        assert_eq!(
            WireModel::default().predict(Collective::AllReduce, "ring", 2, n, false),
            None
        );
    }

    #[test]
    fn a_wire_fit_recovers_alpha_and_a_scale_across_regimes() {
        // A wire 4x slower out of cache: one beta cannot fit it, the ladder can.
        let l = ladder(&[(1 << 20, 40.0), (8 << 20, 10.0)]);
        let wire = WireModel {
            alpha_s: 2e-6,
            alpha_exchange_s: 0.0,
            fresh: l.clone(),
            duplex: l.clone(),
            one_way: l.clone(),
            copy: l.clone(),
            reduce: l,
            fused_reduce: true,
        };
        let pts: Vec<(u64, f64)> = (18..=26)
            .map(|k| {
                let n = 1u64 << k;
                let m = moves(Collective::AllGather, "ring", 2, n, true).unwrap();
                let ws = working_set_bytes(Collective::AllGather, 2, n, true);
                // Measured: 1.25x the model's bytes term, alpha 3 us.
                (
                    n,
                    m.latency_steps * 3e-6 + 1.25 * wire.bytes_seconds(&m, n, ws),
                )
            })
            .collect();
        let f = fit_on_wire(Collective::AllGather, "ring", 2, true, &wire, &pts).unwrap();
        assert!(
            (f.alpha_s - 3e-6).abs() < 1e-12 && (f.scale - 1.25).abs() < 1e-9,
            "{f:?}"
        );
        assert!(
            f.rms_rel_err < 1e-9 && f.single_beta_rms.unwrap() > 0.1,
            "{f:?}"
        );
        assert_eq!(f.window, (1 << 18, 1 << 26));
        // Busbw in cache: 40 GB/s / 1.25 at the smallest size.
        assert!((f.busbw_gbps.0 - 32.0).abs() < 1e-6, "{f:?}");
    }
}
