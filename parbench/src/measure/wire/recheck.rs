//! A socket wire's ceiling measured again after the sweep, at a few of its
//! rungs, against the ladder measured before it.
//!
//! Shared memory holds each row against its ceiling measured again just
//! before the row, in the cores' state the wire was measured in; sockets
//! hold every row against the ladder measured before the sweep. On the
//! 2-core EPYC VM one default tcp run measured that ladder while loopback
//! ran at 1.95 GB/s and its rows at up to 5.2: 34 rows above their
//! ceiling, 265% at the peak, explained as a shaped link's token bucket
//! (a wire that slow looked link-bound). The same ladder a few seconds
//! later says which figure moved. It waits for the wire's state first, as
//! the rows do; one that ran in another state says so instead of warning:
//! the rows timed in that state are marked already.

use super::{socket_ceiling, socket_ladders, WireFigures};
use crate::comm::{CommResult, Communicator};
use crate::measure::core_state::{same_state, state_probe, wait_for_state, WaitBudget, MOST_WAIT};
use crate::measure::{CoreState, Ladder};
use std::time::Instant;

/// The working sets measured again (those of the ladder's rungs nearest
/// to them, up to the sweep's largest).
const SETS: [u64; 3] = [64 << 10, 1 << 20, 4 << 20];
/// How far after and before may sit apart, either way, before the wire
/// counts as moved (the cores' state's ratio).
pub const MOVED: f64 = 1.5;

/// One working set measured again: GB/s before and after the sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recheck {
    pub working_set: u64,
    pub before_gbps: f64,
    pub after_gbps: f64,
}

impl Recheck {
    /// after / before.
    pub fn ratio(&self) -> f64 {
        self.after_gbps / self.before_gbps
    }

    fn moved(&self) -> bool {
        let r = self.ratio();
        !(r.is_finite() && (1.0 / MOVED..=MOVED).contains(&r))
    }
}

/// The rechecked working sets of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WireRecheck {
    pub rungs: Vec<Recheck>,
    /// Wall time of the measurement, seconds (rank 0's clock).
    pub cost_s: f64,
    /// The state probes before and after the recheck, where the wire's
    /// state is tracked ([`crate::measure::core_state::tracks_state`]), and whether
    /// both found the state the wire was measured in.
    pub probes: Option<(CoreState, CoreState)>,
    pub in_state: bool,
}

impl WireRecheck {
    /// The rung that moved most, when the wire moved: two rungs (or the
    /// only one) beyond [`MOVED`] the same way. One rung alone is the
    /// ladder's own jitter: on tcp loopback, in a run whose model held on
    /// 41 of 44 rows, the 64 KiB rung came out x1.83 while 1 and 4 MiB
    /// read x1.20 and x0.69; the runs whose wire moved moved every rung
    /// (x0.16-0.21, x0.17-0.39) or two of three (x2.12 and x4.64).
    pub fn moved(&self) -> Option<&Recheck> {
        let far = |r: &Recheck| r.ratio().max(1.0 / r.ratio());
        let need = self.rungs.len().min(2);
        [true, false]
            .iter()
            .filter_map(|&faster| {
                let way: Vec<&Recheck> = self
                    .rungs
                    .iter()
                    .filter(|r| r.moved() && (r.ratio() > 1.0) == faster)
                    .collect();
                (way.len() >= need && need > 0)
                    .then(|| way.into_iter().max_by(|a, b| far(a).total_cmp(&far(b))))
                    .flatten()
            })
            .max_by(|a, b| far(a).total_cmp(&far(b)))
    }

    /// run.json's `extra.ceiling.after_sweep`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "moved_beyond": MOVED,
            "moved": self.moved().is_some(),
            "in_state": self.in_state,
            "probes": self.probes,
            "cost_s": self.cost_s,
            "rungs": self.rungs.iter().map(|r| serde_json::json!({
                "working_set": r.working_set,
                "before_gbps": r.before_gbps,
                "after_gbps": r.after_gbps,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The ceiling ladder's rungs nearest to [`SETS`], at most `largest`, each once.
fn sets_of(ceiling: &Ladder, largest: u64) -> Vec<u64> {
    let mut out: Vec<u64> = SETS
        .iter()
        .filter_map(|&want| {
            ceiling
                .rungs
                .iter()
                .map(|r| r.working_set)
                .filter(|&ws| ws <= largest)
                .min_by_key(|&ws| ws.abs_diff(want))
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Measures a socket wire's ceiling again at a few of its rungs, as
/// [`super::measure_wire`] measured it ([`socket_ladders`]); `None` on shared
/// memory (its rows' ceilings are measured at the rows, in the cores'
/// state) and on device backends. Every rank must call it.
pub fn recheck_wire<C: Communicator>(
    comm: &mut C,
    wire: &WireFigures,
    largest: u64,
) -> CommResult<Option<WireRecheck>> {
    if !wire.socket || comm.world() < 2 {
        return Ok(None);
    }
    let sets = sets_of(&wire.ceiling, largest);
    if sets.is_empty() {
        return Ok(None);
    }
    let t = Instant::now();
    let mut budget = WaitBudget(MOST_WAIT);
    let (before, _) = wait_for_state(comm, wire.state.as_ref(), &mut budget)?;
    let (s, step) = socket_ladders(comm, &sets)?;
    let probe_after = state_probe(comm)?;
    let after = socket_ceiling(&s, &step);
    let cost_s = t.elapsed().as_secs_f64();
    let in_state = same_state(wire.state.as_ref(), before.as_ref())
        && same_state(wire.state.as_ref(), probe_after.as_ref());
    let rungs = sets
        .iter()
        .filter_map(|&ws| {
            Some(Recheck {
                working_set: ws,
                before_gbps: wire.ceiling.at(ws)?,
                after_gbps: after.at(ws)?,
            })
        })
        .collect();
    Ok(Some(WireRecheck {
        rungs,
        cost_s,
        probes: before.zip(probe_after),
        in_state,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Rung;

    fn ladder(sets: &[u64]) -> Ladder {
        Ladder {
            method: String::new(),
            rungs: sets
                .iter()
                .map(|&ws| Rung {
                    working_set: ws,
                    bytes: ws / 2,
                    gbps: 1.0,
                    median_gbps: 1.0,
                })
                .collect(),
        }
    }

    #[test]
    fn rechecks_the_rungs_nearest_to_its_sets_within_the_sweep() {
        let l = ladder(&[
            4 << 10,
            64 << 10,
            128 << 10,
            1 << 20,
            2 << 20,
            4 << 20,
            8 << 20,
        ]);
        assert_eq!(sets_of(&l, 64 << 20), vec![64 << 10, 1 << 20, 4 << 20]);
        // A sweep up to 1 MiB of working set checks nothing above it.
        assert_eq!(sets_of(&l, 1 << 20), vec![64 << 10, 1 << 20]);
        assert_eq!(sets_of(&l, 16 << 10), vec![4 << 10]);
    }
}
