//! Like against like: a row is judged among the rounds whose run measured
//! its wire in one state (the cores' on shared memory, the loopback's mode
//! through parbench's sockets: bench-collectives' `core_state`).
//!
//! On a VM the host moves the ranks' vCPUs, and bench-collectives records
//! the state each run measured its wire in (`extra.core_state.state`: the
//! 8-byte exchange, the shared-buffer and the copy rate) and leaves out the
//! rows timed in another. But runs differ from each other: on the 2-core
//! EPYC VM three states came and went (exchange 0.20 us with shared
//! buffers at 25 GB/s; 0.42 us at 11 GB/s; 0.17 us at 42 GB/s), and a row
//! moved with them: all_reduce 2 MiB in place read 51-55 us in the first
//! state over ten nights, 214-280 us in the second, 81-83 us in the third.
//! Pooled across states, its rounds spread over 5x, and a night that drew
//! other states than the baseline's looked like a regression. Held within
//! one state, the same row is steady to a few percent.
//!
//! So when both sides have at least [`MIN_ROUNDS`] quiet rounds of a row
//! in one state (two states are one when every figure lies within the
//! run's recorded `same_state_within`), the row is judged on those rounds
//! (the state most of the current rounds share) and across every round;
//! a call from either counts, so that choosing a state never hides what
//! the pooled rounds show. Otherwise, and for rows without a recorded
//! state, it is judged across every round.
//!
//! What it cannot tell apart: a change of the transport that moves the
//! state probe itself (its 8-byte exchange or shared-buffer rate by 1.5x
//! or more) classes tonight's runs with the baseline's rounds of a slow
//! state. The output counts every run by state on both sides
//! ([`census`]), so a night that drew only states the baseline rarely saw
//! shows as one.

use parbench::measure::{CoreState, StateFigures};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// The quiet rounds each side needs in one state for a row to be judged
/// within it. Eleven recorded nights of unchanged code on the EPYC VM,
/// each judged against three others pooled (88 pairs): with 2 (a script
/// modelling the rule), within-state judging called 8 figures on 6 pairs;
/// with 3 (`report compare` itself), 3 figures on 2 pairs, where judging
/// across states only called 1 on 1, while it called 1361 figures on 85
/// pairs of the same nights with every collectives time 25% longer,
/// against 118 on 43.
pub const MIN_ROUNDS: usize = 3;

/// A run's cores' state, and the ratio within which it counts two states as one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunState {
    pub state: CoreState,
    pub within: f64,
}

impl RunState {
    /// The state a bench-collectives run recorded in run.json's `extra`.
    pub fn from_extra(extra: &Map<String, Value>) -> Option<RunState> {
        let cs = extra.get("core_state")?;
        let state: CoreState = serde_json::from_value(cs.get("state")?.clone()).ok()?;
        let within = cs.get("same_state_within")?.as_f64()?;
        (within.is_finite() && within >= 1.0).then_some(RunState { state, within })
    }

    fn same_as(&self, other: &RunState) -> bool {
        self.state
            .same_as(&other.state, self.within.max(other.within))
    }

    /// The state in words.
    pub fn describe(&self) -> String {
        if self.state.judged_by == StateFigures::Transfer {
            return format!(
                "256 KiB exchanges through the sockets {:.2} GB/s",
                self.state.shared_gbps
            );
        }
        format!(
            "8 B exchange {:.2} us, shared buffers {:.0} GB/s, copy {:.0} GB/s",
            self.state.exchange_us, self.state.shared_gbps, self.state.copy_gbps
        )
    }
}

/// The rounds a row is judged on, when one state holds enough of both sides'.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched {
    pub baseline: BTreeSet<String>,
    pub current: BTreeSet<String>,
    /// The state's first current round's.
    pub state: RunState,
}

/// Runs grouped by state, in order of appearance (current runs first),
/// each group named by its first run's state.
struct Class {
    state: RunState,
    baseline: BTreeSet<String>,
    current: BTreeSet<String>,
}

fn classes(
    base: impl IntoIterator<Item = (String, RunState)>,
    cur: impl IntoIterator<Item = (String, RunState)>,
) -> Vec<Class> {
    let mut classes: Vec<Class> = Vec::new();
    let tagged = cur
        .into_iter()
        .map(|r| (true, r))
        .chain(base.into_iter().map(|r| (false, r)));
    for (is_cur, (id, state)) in tagged {
        let at = match classes.iter().position(|c| c.state.same_as(&state)) {
            Some(i) => i,
            None => {
                classes.push(Class {
                    state,
                    baseline: BTreeSet::new(),
                    current: BTreeSet::new(),
                });
                classes.len() - 1
            }
        };
        let c = &mut classes[at];
        if is_cur {
            &mut c.current
        } else {
            &mut c.baseline
        }
        .insert(id);
    }
    classes
}

/// The state most current rounds share among those with [`MIN_ROUNDS`] on
/// both sides (ties: more baseline rounds), or `None`: judge every round.
/// A round without a recorded state leaves its row judged across states.
pub fn matched(
    base: &[(String, Option<RunState>)],
    cur: &[(String, Option<RunState>)],
) -> Option<Matched> {
    let known = |side: &[(String, Option<RunState>)]| -> Option<Vec<(String, RunState)>> {
        side.iter()
            .map(|(id, s)| Some((id.clone(), (*s)?)))
            .collect()
    };
    let (base, cur) = (known(base)?, known(cur)?);
    classes(base, cur)
        .into_iter()
        .filter(|c| c.baseline.len() >= MIN_ROUNDS && c.current.len() >= MIN_ROUNDS)
        .max_by_key(|c| (c.current.len(), c.baseline.len()))
        .map(|c| Matched {
            baseline: c.baseline,
            current: c.current,
            state: c.state,
        })
}

/// Every run with a recorded state, grouped as [`matched`] groups rounds:
/// (state, baseline runs, current runs), the commonest first.
pub fn census(
    base: impl IntoIterator<Item = (String, RunState)>,
    cur: impl IntoIterator<Item = (String, RunState)>,
) -> Vec<(RunState, usize, usize)> {
    let mut out: Vec<(RunState, usize, usize)> = classes(base, cur)
        .into_iter()
        .map(|c| (c.state, c.baseline.len(), c.current.len()))
        .collect();
    out.sort_by_key(|&(_, b, c)| std::cmp::Reverse(b + c));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(exchange_us: f64, shared_gbps: f64) -> Option<RunState> {
        Some(RunState {
            state: CoreState {
                exchange_us,
                shared_gbps,
                copy_gbps: 90.0,
                judged_by: StateFigures::All,
            },
            within: 1.5,
        })
    }

    fn rounds(states: &[Option<RunState>], prefix: &str) -> Vec<(String, Option<RunState>)> {
        states
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("{prefix}{i}"), *s))
            .collect()
    }

    #[test]
    fn the_state_most_current_rounds_share_with_enough_baseline_rounds() {
        let (a, b) = (st(0.20, 25.0), st(0.42, 11.0));
        let base = rounds(&[a, a, a, b, b, b, b], "b");
        let cur = rounds(&[b, b, b, b, a, a, a], "c");
        let m = matched(&base, &cur).unwrap();
        assert_eq!(m.current.len(), 4);
        assert_eq!(
            m.baseline,
            ["b3", "b4", "b5", "b6"].map(String::from).into()
        );
        assert_eq!(m.state, b.unwrap());
        // The current's commonest state has too few baseline rounds: the next.
        let base = rounds(&[a, a, a, b, b], "b");
        let m = matched(&base, &cur).unwrap();
        assert_eq!(m.current, ["c4", "c5", "c6"].map(String::from).into());
    }

    #[test]
    fn too_few_rounds_in_any_state_or_an_unrecorded_one_judge_across_states() {
        let (a, b) = (st(0.20, 25.0), st(0.42, 11.0));
        assert_eq!(
            matched(&rounds(&[a, a, b, b], "b"), &rounds(&[a, a, b, b], "c")),
            None
        );
        assert_eq!(
            matched(&rounds(&[a, a, a], "b"), &rounds(&[a, a, a, None], "c")),
            None
        );
        // Within the ratio is one state.
        let near = st(0.24, 21.0);
        assert!(matched(&rounds(&[a, a, a], "b"), &rounds(&[near, near, near], "c")).is_some());
    }

    #[test]
    fn the_census_counts_runs_by_state_commonest_first() {
        let (a, b) = (st(0.20, 25.0).unwrap(), st(0.42, 11.0).unwrap());
        let ids = |v: [(&str, RunState); 3]| v.map(|(id, s)| (id.to_string(), s));
        let c = census(
            ids([("b0", a), ("b1", b), ("b2", b)]),
            ids([("c0", a), ("c1", b), ("c2", b)]),
        );
        assert_eq!(c, vec![(b, 2, 2), (a, 1, 1)]);
    }

    #[test]
    fn reads_what_bench_collectives_records() {
        let extra = serde_json::json!({"core_state": {
            "state": {"exchange_us": 0.2, "shared_gbps": 25.0, "copy_gbps": 90.0},
            "same_state_within": 1.5}});
        assert_eq!(
            RunState::from_extra(extra.as_object().unwrap()),
            st(0.2, 25.0)
        );
        assert_eq!(RunState::from_extra(&serde_json::Map::new()), None);
    }

    /// A tcp run's state (bench-collectives' socket probe): two runs whose
    /// 256 KiB exchanges agree are one state, whatever their 8 B exchange
    /// and copy read; the loopback's slow mode is another.
    #[test]
    fn a_socket_state_is_read_and_told_apart_by_its_transfer() {
        let run = |exchange_us: f64, shared_gbps: f64, copy_gbps: f64| {
            let extra = serde_json::json!({"core_state": {
                "state": {"exchange_us": exchange_us, "shared_gbps": shared_gbps,
                          "copy_gbps": copy_gbps, "judged_by": "transfer"},
                "same_state_within": 1.5}});
            RunState::from_extra(extra.as_object().unwrap()).unwrap()
        };
        let (a, jitter, slow) = (
            run(7.6, 3.9, 68.0),
            run(16.7, 4.5, 49.0),
            run(7.6, 1.2, 68.0),
        );
        assert!(a.same_as(&jitter));
        assert!(!a.same_as(&slow));
        assert_eq!(
            a.describe(),
            "256 KiB exchanges through the sockets 3.90 GB/s"
        );
    }
}
