//! A bandwidth at a ladder of working sets: the ceiling a row is held
//! against and the beta and gamma the alpha-beta model prices it with.
//!
//! A CPU's memory is not one wire: a copy whose buffers stay in L1 runs
//! several times faster than one out of the last-level cache, so each
//! figure is measured at working sets from inside the caches to past the
//! largest swept size (`crate::measure::ladder`) and read at a row's own
//! ([`working_set_bytes`]).

use crate::comm::Collective;

/// Bytes each rank's buffers hold in one call of `coll` on `p` ranks with
/// nccl-tests' size `n_bytes`: out of place the send and the receive
/// buffer, in place the one buffer (all_reduce: `2n` and `n`; all_gather,
/// `n` the gathered output: `n + n/p` and `n`). The algorithms' scratch is
/// left out.
pub fn working_set_bytes(coll: Collective, p: usize, n_bytes: u64, in_place: bool) -> u64 {
    if in_place {
        return n_bytes;
    }
    let p = p.max(1);
    let (send, recv) = (coll.send_blocks(p) as u64, coll.recv_blocks(p) as u64);
    n_bytes + n_bytes * send.min(recv) / send.max(recv).max(1)
}

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
    /// A ladder of exact figures `(working set, GB/s)`, each rung moving
    /// half its working set per transfer (a copy's source and
    /// destination) with no spread between its samples: a figure known
    /// from elsewhere, or a test's wire.
    pub fn exact(method: impl Into<String>, rates: &[(u64, f64)]) -> Self {
        Ladder {
            method: method.into(),
            rungs: rates
                .iter()
                .map(|&(working_set, gbps)| Rung {
                    working_set,
                    bytes: working_set / 2,
                    gbps,
                    median_gbps: gbps,
                })
                .collect(),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ladder_interpolates_log_log_and_holds_its_ends() {
        let l = Ladder::exact("copy", &[(1 << 10, 100.0), (1 << 20, 10.0)]);
        assert_eq!(l.at(1), Some(100.0));
        assert_eq!(l.at(1 << 30), Some(10.0));
        let mid = l.at(32 << 10).unwrap();
        assert!(
            (mid - 100.0f64.sqrt() * 10.0f64.sqrt()).abs() < 1e-9,
            "{mid}"
        );
        assert_eq!(Ladder::default().at(1), None);
    }

    #[test]
    fn working_sets_follow_the_byte_rule() {
        let n = 1 << 20;
        assert_eq!(working_set_bytes(Collective::AllReduce, 4, n, false), 2 * n);
        assert_eq!(working_set_bytes(Collective::AllReduce, 4, n, true), n);
        assert_eq!(
            working_set_bytes(Collective::AllGather, 4, n, false),
            n + n / 4
        );
    }
}
