//! The ladders a row's model reads, measured again just before the row
//! (see [`crate::model::row_rungs`] for why).

use super::WireFigures;
use crate::comm::{Collective, CommResult, Communicator, DType, ReduceOp};
use crate::measure;
use crate::model::wire::{call_sets, moves, LadderId, RowRungs};
use crate::model::ModelAlgo;

/// The smallest row whose model is priced by rungs measured at the row:
/// the Model check's first size. Smaller rows are latency-bound (their
/// model is mostly alpha), and their rungs are mostly the 8 B exchange
/// taken off each sample. With the rungs measured at the row only from
/// 1 MiB, in two of five default local runs on the EPYC VM (2026-12-04)
/// the rows of 64-512 KiB still sat up to 35% off their model, all on one
/// side: the state the pre-sweep ladders saw moved for them too.
pub const MODEL_AT_ROW_FROM: u64 = 64 << 10;

/// What measures a ladder, and the ladders it measures at once.
#[derive(Clone, Copy, PartialEq)]
enum Measurer {
    Copy,
    Reduce,
    Fresh,
    Fused,
    Far,
}

fn measurer(id: LadderId) -> Measurer {
    match id {
        LadderId::Copy => Measurer::Copy,
        LadderId::Reduce => Measurer::Reduce,
        LadderId::Duplex | LadderId::OneWay | LadderId::Pull | LadderId::Claim | LadderId::Both => {
            Measurer::Fresh
        }
        LadderId::ReduceInto | LadderId::ReduceFrom => Measurer::Fused,
        LadderId::BothFar | LadderId::PullFar => Measurer::Far,
    }
}

impl WireFigures {
    /// Whether rows of `bytes` get their model's rungs measured at the row:
    /// parbench's own transport on shared memory ([`Self::ceilings_per_row`]),
    /// two ranks or more, from [`MODEL_AT_ROW_FROM`].
    pub fn models_at_row(&self, world: usize, bytes: u64) -> bool {
        self.ceilings_per_row() && world >= 2 && bytes >= MODEL_AT_ROW_FROM
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
        if !self.models_at_row(world, bytes) || algo.is_selector() {
            return Ok(Vec::new());
        }
        let Some(m) = moves(coll, algo, world, bytes, in_place) else {
            return Ok(Vec::new());
        };
        let at = call_sets(coll, algo, world, bytes, in_place);
        let reads = self.model.reads(&m, bytes, &at);
        let mut out = RowRungs::new();
        for group in [
            Measurer::Copy,
            Measurer::Reduce,
            Measurer::Fresh,
            Measurer::Fused,
            Measurer::Far,
        ] {
            let mut sets: Vec<u64> = reads
                .iter()
                .filter(|(id, _)| measurer(*id) == group)
                .map(|&(_, ws)| ws)
                .collect();
            if sets.is_empty() {
                continue;
            }
            sets.sort_unstable();
            sets.dedup();
            // A group measures all its ladders at all its sets: keep the
            // rungs this row reads, each ladder at its own working sets.
            for (id, mut l) in measure_group(comm, group, &sets)? {
                l.rungs.retain(|r| reads.contains(&(id, r.working_set)));
                if !l.rungs.is_empty() {
                    out.push((id, l));
                }
            }
        }
        Ok(out)
    }
}

/// The ladders `group` measures, at `sets`, as the wire measured them
/// before the sweep (f32 sums for the reductions).
fn measure_group<C: Communicator>(
    comm: &mut C,
    group: Measurer,
    sets: &[u64],
) -> CommResult<RowRungs> {
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
        Measurer::Fused => {
            match measure::fused_reduce_ladders(comm, sets, DType::F32, ReduceOp::Sum)? {
                Some(f) => vec![
                    (LadderId::ReduceInto, f.into),
                    (LadderId::ReduceFrom, f.from),
                ],
                None => Vec::new(),
            }
        }
        Measurer::Far => match measure::far_ladders(comm, sets)? {
            Some(f) => vec![(LadderId::BothFar, f.both), (LadderId::PullFar, f.pull)],
            None => Vec::new(),
        },
    })
}
