//! The rows a sweep will time, as the wire's ladders see them: the working
//! sets their rungs must reach, and those between two rungs far apart.

use crate::comm::{Collective, Communicator, DType};
use crate::measure::Ladder;
use crate::model::wire::{working_set_bytes, working_sets_of};
use crate::model::ModelAlgo;

/// What the wire's ladders need of a sweep: the rows it will time.
#[derive(Clone, Copy, Debug)]
pub struct SweepRows<'a> {
    pub collectives: &'a [Collective],
    pub dtypes: &'a [DType],
    /// Sizes in bytes, nccl-tests' meaning, ascending.
    pub sizes: &'a [u64],
}

/// The per-rank count of a row of nccl-tests' size `size`: what the byte
/// rule gives, and for a collective whose buffers hold a block per rank
/// (all_gather, reduce_scatter, all_to_all), rounded down to a whole
/// number of 16 bytes, as nccl-tests sizes those blocks.
pub fn row_count(coll: Collective, size: u64, dtype: DType, world: usize) -> usize {
    let count = coll.count_for(size, dtype.size(), world);
    if coll.size_blocks(world) > 1 {
        let per_16 = (16 / dtype.size()).max(1);
        count - count % per_16
    } else {
        count
    }
}

/// The largest working set any row of the sweep touches, bytes per rank.
pub fn largest_set(rows: &SweepRows<'_>, world: usize) -> u64 {
    let top = rows.sizes.last().copied().unwrap_or(0);
    rows.collectives
        .iter()
        .flat_map(|&c| [false, true].map(|ip| working_set_bytes(c, world, top, ip)))
        .max()
        .unwrap_or(top)
}

/// The working sets (the call's and its ring slice's, per rank) of every
/// row of `rows`, sorted, each once.
pub(super) fn row_working_sets<C: Communicator>(comm: &C, rows: &SweepRows<'_>) -> Vec<u64> {
    let world = comm.world();
    let mut out = Vec::new();
    for &coll in rows.collectives {
        for &dtype in rows.dtypes {
            for &size in rows.sizes {
                let count = row_count(coll, size, dtype, world);
                let bytes = coll.size_of(count, dtype.size(), world);
                let algo = ModelAlgo::of(
                    &comm.algo_for(coll, coll.send_elems(count, world) * dtype.size()),
                );
                for in_place in [false, true] {
                    let (ws, slice) = working_sets_of(coll, &algo, world, bytes, in_place);
                    out.extend([ws, slice]);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// How far apart two neighbouring rungs of a ladder may lie before a row's
/// working set between them is measured as a rung of its own.
const STEEP: f64 = 1.5;
/// Rungs added between the doubling ones at most.
const MOST_ADDED_RUNGS: usize = 16;

/// The rows' working sets that lie between two neighbouring rungs of any
/// of `ladders` whose figures are more than [`STEEP`]x apart: where the
/// memory system changes regime (a peer's private cache spilling into the
/// shared one, the shared one into memory) between two doublings, and a
/// rung interpolated in between can be 2-3x off (the EPYC VM's claim
/// ladder: 13 GB/s at 1 MiB, 42 at 2 MiB, while an out-of-place
/// all_gather of 1 MiB, working set 1.5 MiB, ran as the 1 MiB rung).
/// Those are measured too, the largest steps first, at most
/// [`MOST_ADDED_RUNGS`].
pub(super) fn steep_sets(ladders: &[&Ladder], rows: &[u64]) -> Vec<u64> {
    let mut wanted: Vec<(f64, u64)> = Vec::new();
    for &ws in rows {
        let step = ladders
            .iter()
            .filter_map(|l| {
                let hi = l.rungs.iter().position(|r| r.working_set >= ws)?;
                let (a, b) = (l.rungs.get(hi.checked_sub(1)?)?, &l.rungs[hi]);
                (b.working_set != ws && a.gbps > 0.0 && b.gbps > 0.0)
                    .then(|| (a.gbps / b.gbps).max(b.gbps / a.gbps))
            })
            .fold(0.0, f64::max);
        if step > STEEP {
            wanted.push((step, ws));
        }
    }
    wanted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut sets: Vec<u64> = wanted
        .into_iter()
        .take(MOST_ADDED_RUNGS)
        .map(|(_, ws)| ws)
        .collect();
    sets.sort_unstable();
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_sets_between_rungs_far_apart_are_measured_too() {
        let l = |rungs: &[(u64, f64)]| Ladder::exact("", rungs);
        // claim: a step of 3x between 1 and 2 MiB, a gentle one between 2
        // and 4; copy flat.
        let claim = l(&[(1 << 20, 13.0), (2 << 20, 40.0), (4 << 20, 45.0)]);
        let copy = l(&[(1 << 20, 50.0), (2 << 20, 48.0), (4 << 20, 47.0)]);
        let rows = [1 << 20, 3 << 19, 3 << 20, 4 << 20];
        // 1.5 MiB lies in the step; 1 and 4 MiB are rungs; 3 MiB in a gentle stretch.
        assert_eq!(steep_sets(&[&copy, &claim], &rows), vec![3 << 19]);
        assert!(steep_sets(&[&copy], &rows).is_empty());
        // Beyond the ends nothing is between two rungs.
        assert!(steep_sets(&[&claim], &[1 << 10, 1 << 30]).is_empty());
    }
}
