//! The ladders of a [`WireModel`] by name, and a row's own rungs: what a
//! row's model reads ([`WireModel::reads`]) measured again just before the
//! row and put in place of the pre-sweep rungs ([`WireModel::with_rungs`]).
//!
//! Why: on shared memory a working set that spills from the private caches
//! sits in the last-level cache, whose share the rest of the machine (the
//! other tenants of a virtual machine) leaves to the ranks from one second
//! to the next. Measured on the 2-core EPYC VM (32 MiB L3), in one process,
//! sixteen times in a row: the out-of-place ring's reducing receive at a
//! 16 MiB working set read 5.3-11.7 GB/s, and the all_reduce of 8 MiB
//! timed right after it ran 607-1197 us, slow when the rung was slow.
//! Ladders taken seconds before the sweep do not see the state a row
//! runs in; rungs taken next to the row do. On sockets (loopback) the
//! same: the wire moves between modes, and within one its rungs move
//! 15-30% (an out-of-place all_gather of 16 MiB priced with rungs taken
//! just before it: model/p50 0.90-1.14 over twelve rounds; with the
//! pre-sweep ladders the day's rows of 8-32 MiB sat at 0.61-1.11).

use super::ladder::Ladder;
use super::wire::WireModel;

/// One of a [`WireModel`]'s ladders; its name is its key in a run's
/// `extra.model_link`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LadderId {
    Copy,
    Reduce,
    Duplex,
    OneWay,
    Pull,
    Claim,
    Both,
    ReduceInto,
    ReduceFrom,
    BothFar,
    PullFar,
    ClaimFar,
}

impl LadderId {
    pub const ALL: [LadderId; 12] = [
        LadderId::Copy,
        LadderId::Reduce,
        LadderId::Duplex,
        LadderId::OneWay,
        LadderId::Pull,
        LadderId::Claim,
        LadderId::Both,
        LadderId::ReduceInto,
        LadderId::ReduceFrom,
        LadderId::BothFar,
        LadderId::PullFar,
        LadderId::ClaimFar,
    ];

    /// The ladder's key in `extra.model_link`.
    pub fn name(self) -> &'static str {
        match self {
            LadderId::Copy => "copy",
            LadderId::Reduce => "reduce",
            LadderId::Duplex => "duplex",
            LadderId::OneWay => "one_way",
            LadderId::Pull => "pull",
            LadderId::Claim => "claim",
            LadderId::Both => "both",
            LadderId::ReduceInto => "reduce_into",
            LadderId::ReduceFrom => "reduce_from",
            LadderId::BothFar => "both_far",
            LadderId::PullFar => "pull_far",
            LadderId::ClaimFar => "claim_far",
        }
    }
}

/// Rungs measured at one row, per ladder: each ladder's rungs at the
/// working sets the row's model reads it at.
pub type RowRungs = Vec<(LadderId, Ladder)>;

impl WireModel {
    pub fn ladder(&self, id: LadderId) -> &Ladder {
        match id {
            LadderId::Copy => &self.copy,
            LadderId::Reduce => &self.reduce,
            LadderId::Duplex => &self.duplex,
            LadderId::OneWay => &self.one_way,
            LadderId::Pull => &self.pull,
            LadderId::Claim => &self.claim,
            LadderId::Both => &self.both,
            LadderId::ReduceInto => &self.reduce_into,
            LadderId::ReduceFrom => &self.reduce_from,
            LadderId::BothFar => &self.both_far,
            LadderId::PullFar => &self.pull_far,
            LadderId::ClaimFar => &self.claim_far,
        }
    }

    pub fn ladder_mut(&mut self, id: LadderId) -> &mut Ladder {
        match id {
            LadderId::Copy => &mut self.copy,
            LadderId::Reduce => &mut self.reduce,
            LadderId::Duplex => &mut self.duplex,
            LadderId::OneWay => &mut self.one_way,
            LadderId::Pull => &mut self.pull,
            LadderId::Claim => &mut self.claim,
            LadderId::Both => &mut self.both,
            LadderId::ReduceInto => &mut self.reduce_into,
            LadderId::ReduceFrom => &mut self.reduce_from,
            LadderId::BothFar => &mut self.both_far,
            LadderId::PullFar => &mut self.pull_far,
            LadderId::ClaimFar => &mut self.claim_far,
        }
    }

    /// This model with `rungs` put in at their working sets, in place of
    /// the rungs there ([`Ladder::merged`]): the model of a row whose
    /// ladders were measured again just before it. A ladder the model has
    /// no rung of stays empty (its emptiness decides how a call is priced).
    pub fn with_rungs(&self, rungs: &[(LadderId, Ladder)]) -> WireModel {
        let mut out = self.clone();
        for (id, more) in rungs {
            let l = out.ladder_mut(*id);
            if !l.rungs.is_empty() {
                *l = l.merged(more);
            }
        }
        out
    }
}

/// A bench-collectives record's pre-sweep model (run.json's
/// `extra.model_link`): alpha, the ladders, how its transport reduces.
/// `None` without alpha or the four ladders every wire has; the ladders
/// only some wires have are empty where the record lacks them.
pub fn model_of_record(link: &serde_json::Value) -> Option<WireModel> {
    let ladder = |k: &str| -> Option<Ladder> { serde_json::from_value(link.get(k)?.clone()).ok() };
    let us = |k: &str| link.get(k).and_then(serde_json::Value::as_f64);
    Some(WireModel {
        alpha_s: us("alpha_us")? * 1e-6,
        alpha_exchange_s: us("alpha_exchange_us").unwrap_or(0.0) * 1e-6,
        duplex: ladder("duplex")?,
        one_way: ladder("one_way")?,
        copy: ladder("copy")?,
        reduce: ladder("reduce")?,
        pull: ladder("pull").unwrap_or_default(),
        claim: ladder("claim").unwrap_or_default(),
        both: ladder("both").unwrap_or_default(),
        reduce_into: ladder("reduce_into").unwrap_or_default(),
        reduce_from: ladder("reduce_from").unwrap_or_default(),
        both_far: ladder("both_far").unwrap_or_default(),
        pull_far: ladder("pull_far").unwrap_or_default(),
        claim_far: ladder("claim_far").unwrap_or_default(),
    })
}

/// The rungs of one row of a record's `extra.model_at_row.rows` (its
/// `rungs`, each with its `ladder` name), one ladder per name; entries it
/// cannot read are left out.
pub fn rungs_of_record(row: &serde_json::Value) -> RowRungs {
    let mut rungs: RowRungs = Vec::new();
    for r in row
        .get("rungs")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
    {
        let id: Option<LadderId> = r
            .get("ladder")
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        let rung: Option<super::ladder::Rung> = serde_json::from_value(r.clone()).ok();
        let (Some(id), Some(rung)) = (id, rung) else {
            continue;
        };
        match rungs.iter_mut().find(|(i, _)| *i == id) {
            Some((_, l)) => l.rungs.push(rung),
            None => rungs.push((
                id,
                Ladder {
                    method: "measured just before the row".into(),
                    rungs: vec![rung],
                },
            )),
        }
    }
    rungs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Collective;
    use crate::model::wire::{call_sets, moves, Rung};
    use crate::model::ModelAlgo;

    /// A ladder falling from 40 GB/s at 1 KiB to 4 at 1 GiB (log-log).
    fn falling() -> Ladder {
        let rung = |ws: u64, gbps: f64| Rung {
            working_set: ws,
            bytes: ws / 2,
            gbps,
            median_gbps: gbps,
        };
        Ladder {
            method: "test".into(),
            rungs: vec![rung(1 << 10, 40.0), rung(1 << 30, 4.0)],
        }
    }

    /// Shared memory with every ladder measured (far and fused ones too).
    fn shared_memory() -> WireModel {
        let mut w = WireModel {
            alpha_s: 1e-6,
            alpha_exchange_s: 0.5e-6,
            ..WireModel::default()
        };
        for id in LadderId::ALL {
            *w.ladder_mut(id) = falling();
        }
        w
    }

    fn bytes_term(w: &WireModel, coll: Collective, n: u64, in_place: bool) -> f64 {
        let ring = ModelAlgo::of("ring");
        let m = moves(coll, &ring, 2, n, in_place).unwrap();
        w.bytes_seconds(&m, n, &call_sets(coll, &ring, 2, n, in_place))
    }

    #[test]
    fn a_sliced_out_of_place_all_reduce_reads_its_reducing_receive_and_the_far_pull() {
        let w = shared_memory();
        let ring = ModelAlgo::of("ring");
        let n = 8u64 << 20;
        let m = moves(Collective::AllReduce, &ring, 2, n, false).unwrap();
        let reads = w.reads(&m, n, &call_sets(Collective::AllReduce, &ring, 2, n, false));
        // The reduce-scatter step at the call's working set (send and
        // receive buffers, 2n), the all-gather step at the receive buffer.
        assert_eq!(
            reads,
            [(LadderId::ReduceFrom, 2 * n), (LadderId::PullFar, n)]
        );
    }

    #[test]
    fn rungs_put_in_at_what_a_row_reads_price_that_row_by_them_alone() {
        let w = shared_memory();
        let ring = ModelAlgo::of("ring");
        for (coll, n, in_place) in [
            (Collective::AllReduce, 8u64 << 20, false),
            (Collective::AllReduce, 16 << 20, true),
            (Collective::AllGather, 16 << 20, false),
            (Collective::AllGather, 64 << 10, true),
        ] {
            let m = moves(coll, &ring, 2, n, in_place).unwrap();
            let reads = w.reads(&m, n, &call_sets(coll, &ring, 2, n, in_place));
            assert!(!reads.is_empty(), "{coll:?} {n}");
            // Every rung it reads measured at half the ladder's figure:
            // the bytes term doubles, whatever the parts.
            let half: RowRungs = reads
                .iter()
                .map(|&(id, ws)| {
                    let g = w.ladder(id).at(ws).unwrap() / 2.0;
                    let rung = Rung {
                        working_set: ws,
                        bytes: ws,
                        gbps: g,
                        median_gbps: g,
                    };
                    (
                        id,
                        Ladder {
                            method: "at the row".into(),
                            rungs: vec![rung],
                        },
                    )
                })
                .collect();
            let before = bytes_term(&w, coll, n, in_place);
            let after = bytes_term(&w.with_rungs(&half), coll, n, in_place);
            assert!(
                (after / before - 2.0).abs() < 1e-9,
                "{coll:?} {n} in place {in_place}: {before} -> {after}"
            );
        }
    }

    #[test]
    fn rungs_of_a_ladder_the_model_lacks_leave_it_empty() {
        let mut w = shared_memory();
        w.pull_far = Ladder::default();
        let more = vec![(LadderId::PullFar, falling()), (LadderId::Copy, falling())];
        let got = w.with_rungs(&more);
        assert!(got.pull_far.rungs.is_empty());
        assert_eq!(got.copy, falling());
        for id in LadderId::ALL {
            let name = serde_json::to_value(id).unwrap();
            assert_eq!(name, id.name(), "the record's key is the serde name");
        }
    }
}
