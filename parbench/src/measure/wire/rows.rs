//! The rows a sweep will time, as the wire's ladders see them: the
//! largest working set their rungs must reach.

use crate::comm::{Collective, DType};
use crate::model::ladder::working_set_bytes;

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
