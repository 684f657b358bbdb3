//! The ladders a row's model reads, measured again just before the row
//! (see [`crate::model::row_rungs`] for why).

use super::rungs::{self, DIP_SHARE, RUNG_TRIES};
use super::WireFigures;
use crate::comm::{Collective, CommResult, Communicator, DType, ReduceOp};
use crate::measure::{self, Ladder};
use crate::model::wire::{call_sets, moves, LadderId, RowRungs, WireModel};
use crate::model::ModelAlgo;

/// The smallest row whose model is priced by rungs measured at the row:
/// the Model check's first size. Smaller rows are latency-bound (their
/// model is mostly alpha), and their rungs are mostly the 8 B exchange
/// taken off each sample. With the rungs measured at the row only from
/// 1 MiB, in two of five default local runs on the EPYC VM (2026-12-04)
/// the rows of 64-512 KiB still sat up to 35% off their model, all on one
/// side: the state the pre-sweep ladders saw moved for them too.
pub const MODEL_AT_ROW_FROM: u64 = 64 << 10;

/// Whose methods measure a row's rungs: the wire's, as before the sweep.
#[derive(Clone, Copy, PartialEq)]
enum RowWire {
    /// Shared memory: the copy, reduction, cache-state, fused and far
    /// ladders ([`super::rungs::ladders_in_state`]).
    SharedMemory,
    /// parbench's sockets: the ring-step, stream and far-destination
    /// ladders, and the reducing receives held at the ring step
    /// ([`super::rungs::link_ladders`]).
    Sockets,
}

/// The longest call, as the pre-sweep model prices it, whose row gets its
/// rungs measured at the row, seconds. The rungs' fixed passes (warm-up
/// transfers, whole walks of the receive buffer) move many times a call's
/// bytes: about the row's own cost on memory and loopback, whose longest
/// default row (all_reduce of 64 MiB) the pre-sweep model priced at 7-54
/// ms a call (p50 7-60 ms) over the default local and tcp runs of an
/// evening on the EPYC VM, but through 200 Mbit/s the
/// rungs of one all_reduce row of 16 MiB (0.7 s a call) took about 20 s
/// where the row took 3.5. A link's rate is the link's whatever the caches
/// hold, and the pre-sweep ladders hold it (a 1 Gbit/s shaped link: every
/// row from 64 KiB within 25%, fits within 0.6% rms, in the recorded runs).
pub const MODEL_AT_ROW_LONGEST_CALL_S: f64 = 0.1;

/// What measures a ladder, and the ladders it measures at once.
#[derive(Clone, Copy, PartialEq)]
enum Measurer {
    Copy,
    Reduce,
    Fresh,
    Step,
    Stream,
    Fused,
    Far,
}

/// The order a row's groups are measured in: a socket's reducing
/// receives are held at the ring step, so the step comes first.
const GROUPS: [Measurer; 7] = [
    Measurer::Copy,
    Measurer::Reduce,
    Measurer::Fresh,
    Measurer::Step,
    Measurer::Stream,
    Measurer::Fused,
    Measurer::Far,
];

/// What measures ladder `id` on `wire`; `None` where the wire's model has
/// no such ladder.
fn measurer(wire: RowWire, id: LadderId) -> Option<Measurer> {
    Some(match (wire, id) {
        (_, LadderId::Copy) => Measurer::Copy,
        (_, LadderId::Reduce) => Measurer::Reduce,
        (_, LadderId::ReduceInto | LadderId::ReduceFrom) => Measurer::Fused,
        (_, LadderId::BothFar | LadderId::PullFar | LadderId::ClaimFar) => Measurer::Far,
        (
            RowWire::SharedMemory,
            LadderId::Duplex | LadderId::OneWay | LadderId::Pull | LadderId::Claim | LadderId::Both,
        ) => Measurer::Fresh,
        // A socket's model: duplex is the ring step, one way the stream.
        (RowWire::Sockets, LadderId::Duplex) => Measurer::Step,
        (RowWire::Sockets, LadderId::OneWay) => Measurer::Stream,
        (RowWire::Sockets, _) => return None,
    })
}

impl WireFigures {
    /// Whose methods measure this wire's rows' rungs: parbench's own
    /// transport on shared memory or sockets; `None` elsewhere.
    fn row_wire(&self) -> Option<RowWire> {
        if !self.own_transport {
            None
        } else if self.model.cache_states() {
            Some(RowWire::SharedMemory)
        } else if self.socket {
            Some(RowWire::Sockets)
        } else {
            None
        }
    }

    /// Whether rows of `bytes` get their model's rungs measured at the row:
    /// parbench's own transport on shared memory or sockets, two ranks or
    /// more, from [`MODEL_AT_ROW_FROM`].
    pub fn models_at_row(&self, world: usize, bytes: u64) -> bool {
        self.row_wire().is_some() && world >= 2 && bytes >= MODEL_AT_ROW_FROM
    }

    /// Whether the pre-sweep model puts one call of the row at
    /// [`MODEL_AT_ROW_LONGEST_CALL_S`] or less (a row it cannot price is
    /// not).
    fn call_short_enough(
        &self,
        coll: Collective,
        algo: &ModelAlgo,
        world: usize,
        bytes: u64,
        in_place: bool,
    ) -> bool {
        self.model
            .predict(coll, algo, world, bytes, in_place)
            .is_some_and(|s| s <= MODEL_AT_ROW_LONGEST_CALL_S)
    }

    /// Why this wire's rows from [`MODEL_AT_ROW_FROM`] get their rungs
    /// measured at the row, as the bench's header says it; `None` when no
    /// row of a run of `world` ranks does.
    pub fn model_at_row_why(&self, world: usize) -> Option<&'static str> {
        if !self.models_at_row(world, MODEL_AT_ROW_FROM) {
            return None;
        }
        Some(match self.row_wire()? {
            RowWire::SharedMemory => {
                "the memory's share moves from second to second on a shared machine"
            }
            RowWire::Sockets => {
                "a socket wire's rate moves within one of its states, and a ladder held from where it turned link-bound does not walk the call's buffers"
            }
        })
    }

    /// The rungs of every ladder the row's model reads ([`WireModel::reads`]),
    /// at the working sets it reads them, measured now, with the same
    /// methods as before the sweep; empty where [`Self::models_at_row`] says
    /// no, or for an algorithm without a model. Every rank calls it with the
    /// same arguments (the rungs are means over ranks).
    ///
    /// [`WireModel::reads`]: crate::model::wire::WireModel::reads
    pub fn rungs_at_row<C: Communicator>(
        &self,
        comm: &mut C,
        coll: Collective,
        algo: &ModelAlgo,
        bytes: u64,
        in_place: bool,
    ) -> CommResult<RowRungs> {
        let world = comm.world();
        let Some(wire) = self.row_wire() else {
            return Ok(Vec::new());
        };
        if !self.models_at_row(world, bytes) || algo.is_selector() {
            return Ok(Vec::new());
        }
        let Some(m) = moves(coll, algo, world, bytes, in_place) else {
            return Ok(Vec::new());
        };
        if !self.call_short_enough(coll, algo, world, bytes, in_place) {
            return Ok(Vec::new());
        }
        let at = call_sets(coll, algo, world, bytes, in_place);
        let reads = self.model.reads(&m, bytes, &at);
        let mut out = RowRungs::new();
        for group in GROUPS {
            let mut sets: Vec<u64> = reads
                .iter()
                .filter(|(id, _)| measurer(wire, *id) == Some(group))
                .map(|&(_, ws)| ws)
                .collect();
            if sets.is_empty() {
                continue;
            }
            sets.sort_unstable();
            sets.dedup();
            // The ring step a socket's reducing receives are held at: the
            // row's own where it measured one, else the pre-sweep ladder.
            let step = self.model.with_rungs(&out).duplex;
            // A group measures all its ladders at all its sets: keep the
            // rungs this row reads, each ladder at its own working sets.
            let read_here = |got: RowRungs| -> RowRungs {
                got.into_iter()
                    .filter_map(|(id, mut l)| {
                        l.rungs.retain(|r| reads.contains(&(id, r.working_set)));
                        (!l.rungs.is_empty()).then_some((id, l))
                    })
                    .collect()
            };
            let mut got = read_here(measure_group(comm, wire, group, &sets, &step, &reads)?);
            for _ in 1..RUNG_TRIES {
                let stalled = stalled_sets(&self.model, &got);
                if stalled.is_empty() {
                    break;
                }
                let again = read_here(measure_group(comm, wire, group, &stalled, &step, &reads)?);
                got = better_rungs(got, &again);
            }
            out.extend(got);
        }
        Ok(out)
    }
}

/// The working sets where a rung measured at a row lies below
/// [`DIP_SHARE`] of the pre-sweep ladder there: a stall during its
/// samples (a rung 10x under the pre-sweep one put an all_gather row
/// of 4 MiB at 11.6x its p50 in a default local run on the EPYC VM),
/// measured again as the pre-sweep ladders measure a dip. A slow state
/// that is real comes back each time and stays. The rungs are means
/// over ranks: every rank finds the same sets.
fn stalled_sets(model: &WireModel, got: &RowRungs) -> Vec<u64> {
    let mut sets: Vec<u64> = got
        .iter()
        .flat_map(|(id, l)| {
            let before = model.ladder(*id);
            l.rungs.iter().filter_map(move |r| {
                let b = before.at(r.working_set)?;
                (b > 0.0 && r.gbps < DIP_SHARE * b).then_some(r.working_set)
            })
        })
        .collect();
    sets.sort_unstable();
    sets.dedup();
    sets
}

/// Each of `got`'s ladders with `again`'s rung where that one is better.
fn better_rungs(got: RowRungs, again: &RowRungs) -> RowRungs {
    got.into_iter()
        .map(|(id, l)| match again.iter().find(|(a, _)| *a == id) {
            Some((_, more)) => (id, l.better_rungs(more)),
            None => (id, l),
        })
        .collect()
}

/// The ladders `group` measures, at `sets`, as the wire measured them
/// before the sweep (f32 sums for the reductions; a socket's held at
/// `step`; of the far ladders only those the row `reads`).
fn measure_group<C: Communicator>(
    comm: &mut C,
    wire: RowWire,
    group: Measurer,
    sets: &[u64],
    step: &Ladder,
    reads: &[(LadderId, u64)],
) -> CommResult<RowRungs> {
    let reads_ladder = |id: LadderId| reads.iter().any(|(r, _)| *r == id);
    let far_wanted = measure::FarWanted {
        both: reads_ladder(LadderId::BothFar),
        pull: reads_ladder(LadderId::PullFar),
        claim: reads_ladder(LadderId::ClaimFar),
    };
    Ok(match group {
        Measurer::Copy => vec![(LadderId::Copy, measure::copy_ladder(comm, sets)?)],
        Measurer::Reduce => vec![(
            LadderId::Reduce,
            measure::reduce_ladder(comm, sets, DType::F32, ReduceOp::Sum)?,
        )],
        Measurer::Fresh => {
            let f = measure::fresh_ladders(comm, sets, true)?;
            vec![
                (LadderId::Duplex, f.clean.clone()),
                (LadderId::OneWay, f.clean),
                (LadderId::Pull, f.pull),
                (LadderId::Claim, f.claim),
                (LadderId::Both, f.both),
            ]
        }
        Measurer::Step => vec![(LadderId::Duplex, rungs::step_ladder(comm, sets)?)],
        Measurer::Stream => vec![(LadderId::OneWay, rungs::stream_ladders(comm, sets)?.one_way)],
        Measurer::Fused => {
            let f = rungs::fused_ladders(comm, sets)?;
            let f = match wire {
                RowWire::Sockets => rungs::fused_held_by_step(&f, step),
                RowWire::SharedMemory => f,
            };
            vec![
                (LadderId::ReduceInto, f.into),
                (LadderId::ReduceFrom, f.from),
            ]
        }
        Measurer::Far => match measure::far_ladders_of(comm, sets, far_wanted)? {
            Some(f) => vec![
                (LadderId::BothFar, f.both),
                (LadderId::PullFar, f.pull),
                (LadderId::ClaimFar, f.claim),
            ],
            None => Vec::new(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Rung;

    fn ladder(rungs: &[(u64, f64)]) -> Ladder {
        Ladder {
            method: "test".into(),
            rungs: rungs
                .iter()
                .map(|&(ws, g)| Rung {
                    working_set: ws,
                    bytes: ws / 2,
                    gbps: g,
                    median_gbps: g,
                })
                .collect(),
        }
    }

    /// As recorded in a default local run on the EPYC VM: `pull_far` at
    /// 4 MiB read 1.44 GB/s at the row against 31.3 before the sweep (a
    /// stall), while `claim` at 6 MiB read 41.4 against 39.9. Only the
    /// stalled set is measured again, and the better rung is kept.
    #[test]
    fn a_rung_far_under_the_pre_sweep_one_is_measured_again_and_the_better_kept() {
        let model = WireModel {
            claim: ladder(&[(4 << 20, 45.0), (8 << 20, 35.0)]),
            pull_far: ladder(&[(2 << 20, 33.0), (8 << 20, 30.0)]),
            ..WireModel::default()
        };
        let got: RowRungs = vec![
            (LadderId::Claim, ladder(&[(6 << 20, 41.35)])),
            (LadderId::PullFar, ladder(&[(4 << 20, 1.44)])),
        ];
        assert_eq!(stalled_sets(&model, &got), vec![4 << 20]);
        let again: RowRungs = vec![(LadderId::PullFar, ladder(&[(4 << 20, 29.0)]))];
        let kept = better_rungs(got.clone(), &again);
        assert_eq!(kept[0], got[0]);
        assert_eq!(kept[1].1.rungs[0].gbps, 29.0);
        assert!(stalled_sets(&model, &kept).is_empty());
        // A slower rung within 2/3 of the pre-sweep one is the state's, not a stall.
        let slow: RowRungs = vec![(LadderId::PullFar, ladder(&[(4 << 20, 22.0)]))];
        assert!(stalled_sets(&model, &slow).is_empty());
        // A ladder the model lacks has nothing to compare with.
        let none: RowRungs = vec![(LadderId::BothFar, ladder(&[(4 << 20, 0.1)]))];
        assert!(stalled_sets(&model, &none).is_empty());
    }
}
