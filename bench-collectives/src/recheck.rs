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

use crate::core_state::{same_state, state_probe, wait_for_state, WaitBudget, MOST_WAIT};
use crate::wire::{socket_ceiling, socket_ladders, WireFigures};
use parbench::comm::{CommResult, Communicator};
use parbench::measure::{CoreState, Ladder};
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
    /// state is tracked ([`crate::core_state::tracks_state`]), and whether
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

    /// The footer's lines.
    pub fn lines(&self) -> Vec<String> {
        let each: Vec<String> = self
            .rungs
            .iter()
            .map(|r| {
                format!(
                    "{}: {:.2} GB/s, x{:.2}",
                    parbench::units::bytes(r.working_set as f64),
                    r.after_gbps,
                    r.ratio()
                )
            })
            .collect();
        let mut out = vec![format!(
            "# Wire measured again after the sweep (the ceiling's ladders at a few working sets; x = after / before): {}",
            each.join("; ")
        )];
        let moved = self.moved();
        if let (Some(r), false) = (moved, self.in_state) {
            let probes = self.probes.map_or(String::new(), |(b, a)| {
                format!(
                    " (its state probes read {:.2} and {:.2} GB/s)",
                    b.shared_gbps, a.shared_gbps
                )
            });
            out.push(format!(
                "#   the ceiling read x{:.2} at {} after the sweep with the wire in another state than it was measured in{probes}: that state's figure, not a change of the wire's; the rows timed in it are marked ~",
                r.ratio(),
                parbench::units::bytes(r.working_set as f64),
            ));
        } else if let Some(r) = moved {
            out.push(format!(
                "# WARNING: the wire's ceiling moved x{:.2} at {} between the ladder before the sweep ({:.2} GB/s) and after it ({:.2}): the machine's state changed during the run; the ceilings, %ceil and the model come from the ladder before the sweep and are not to be trusted; rerun on a quieter machine",
                r.ratio(),
                parbench::units::bytes(r.working_set as f64),
                r.before_gbps,
                r.after_gbps
            ));
        }
        out
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
/// `wire::measure_wire` measured it ([`socket_ladders`]); `None` on shared
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
    use parbench::measure::Rung;

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

    #[test]
    fn a_wire_that_moved_either_way_beyond_the_ratio_is_warned() {
        let at = |ws: u64, before: f64, after: f64| Recheck {
            working_set: ws,
            before_gbps: before,
            after_gbps: after,
        };
        let recheck = |rungs: Vec<Recheck>| WireRecheck {
            rungs,
            cost_s: 0.0,
            probes: None,
            in_state: true,
        };
        let quiet = recheck(vec![at(64 << 10, 2.0, 2.4), at(1 << 20, 4.0, 3.0)]);
        assert!(quiet.moved().is_none());
        assert_eq!(quiet.lines().len(), 1);
        // One rung's jitter, the others within: not a move.
        let jitter = recheck(vec![
            at(64 << 10, 5.15, 9.43),
            at(1 << 20, 7.57, 9.08),
            at(4 << 20, 9.48, 6.54),
        ]);
        assert!(jitter.moved().is_none());
        // Two rungs beyond, but opposite ways: not one move either.
        let split = recheck(vec![at(64 << 10, 2.0, 4.0), at(1 << 20, 4.0, 2.0)]);
        assert!(split.moved().is_none());
        // t1 of issue 14: loopback at 1.95 GB/s before, rows at 5.
        let moved = recheck(vec![at(64 << 10, 1.2, 2.0), at(1 << 20, 1.95, 5.1)]);
        assert_eq!(moved.moved().map(|r| r.working_set), Some(1 << 20));
        let lines = moved.lines();
        assert!(
            lines[1].starts_with("# WARNING: the wire's ceiling moved x2.62 at 1 MiB"),
            "{lines:?}"
        );
        // A sweep small enough for one rung: that one decides.
        let slower = recheck(vec![at(1 << 20, 6.0, 3.0)]);
        assert!(slower.moved().is_some());
        assert_eq!(moved.json()["moved"], true);
        // The same figures measured again with the wire in another state
        // (the probes saw the loopback's other mode): said, not warned.
        let probe = |shared_gbps: f64| parbench::measure::CoreState {
            exchange_us: 7.6,
            shared_gbps,
            copy_gbps: 70.0,
            judged_by: parbench::measure::StateFigures::Transfer,
        };
        let elsewhere = WireRecheck {
            probes: Some((probe(4.6), probe(4.5))),
            in_state: false,
            ..moved.clone()
        };
        let lines = elsewhere.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(!lines[1].contains("WARNING"), "{lines:?}");
        assert!(lines[1].contains("another state"), "{lines:?}");
        assert!(lines[1].contains("4.60 and 4.50 GB/s"), "{lines:?}");
        assert_eq!(elsewhere.json()["in_state"], false);
    }
}
