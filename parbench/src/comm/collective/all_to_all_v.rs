//! all_to_all_v: all_to_all with per-pair counts (`MPI_Alltoallv`; NCCL
//! has no call, so NCCL runs grouped send/recv, as nccl-tests' alltoall
//! does). Rank i sends rank j [`pair_count`] elements, packed in rank
//! order ([`crate::comm::VCounts`]).
//!
//! The counts vary from pair to pair (half to one and a half times
//! `count`, from the seeded generator) but each rank sends and receives
//! `count x world` elements in all and keeps `count` for itself, so the
//! buffers, nccl-tests' size and its alltoall bus-bandwidth factor
//! ((n-1)/n) are all_to_all's exactly: the rows compare with it.

use super::all_to_all::{buffers, AllToAll};
use super::prelude::*;
use crate::comm::VCounts;
use crate::seed::splitmix64;

pub struct AllToAllV;

/// The seed of the per-pair counts: every rank and backend, and the
/// check, derive the same matrix from it.
const COUNTS_SEED: u64 = 0x000A_1170_A11F;

/// Elements rank `from` sends rank `to` in a call of per-rank `count` on
/// `world` ranks: `count + d(s)` with `s = (to - from) mod world` and
/// `d(s) = v(s) - v(world - s)`, `v` seeded in `0..=count/2`, so that
/// every row and column of the matrix sums to `count x world`, and
/// `d(0) = 0`.
pub fn pair_count(count: usize, world: usize, from: usize, to: usize) -> usize {
    let s = (to + world - from) % world.max(1);
    let v = |s: usize| {
        let h = splitmix64(COUNTS_SEED ^ splitmix64(((world as u64) << 40) ^ s as u64));
        (h % (count as u64 / 2 + 1)) as usize
    };
    if s == 0 || 2 * s == world {
        count
    } else {
        count + v(s) - v(world - s)
    }
}

/// Rank `rank`'s counts of a call of per-rank `count` on `world` ranks.
pub fn counts(count: usize, world: usize, rank: usize) -> CommResult<VCounts> {
    VCounts::of_matrix(world, rank, |i, j| pair_count(count, world, i, j))
}

/// Everything but its name, counts and meaning is all_to_all's: the same
/// buffers, factor, algorithm and cost form (the same bytes per rank).
impl Spec for AllToAllV {
    /// nccl-tests has no alltoallv: `--format nccl-tests` prints its block
    /// in alltoall's format, named `alltoallv_perf`.
    fn names(&self) -> Names {
        Names("all_to_all_v", "alltoallv_perf", None)
    }
    fn send_blocks(&self, world: usize) -> usize {
        AllToAll.send_blocks(world)
    }
    fn recv_blocks(&self, world: usize) -> usize {
        AllToAll.recv_blocks(world)
    }
    fn busbw_factor(&self, world: usize) -> f64 {
        AllToAll.busbw_factor(world)
    }
    fn modelled(&self) -> &'static [Algorithm] {
        AllToAll.modelled()
    }
    fn form(&self, algo: Algorithm) -> Option<CostForm> {
        AllToAll.form(algo)
    }
    fn choose(&self, algo: Algo, world: usize, bytes: usize) -> Algorithm {
        AllToAll.choose(algo, world, bytes)
    }
    /// Its counts depend on `count`: a call over a slice of every block
    /// is not a slice of the call.
    fn sliceable(&self) -> bool {
        false
    }
    /// From each rank i, in rank order, the block rank i packed for this rank.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for i in 0..x.world {
            let theirs = counts(x.args.count, x.world, i).ok()?;
            let r = theirs.send_range(x.rank);
            out.extend((x.input)(i, r.start, r.len()));
        }
        Some(out)
    }
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, deadline) = (run.args, run.deadline);
        let (world, rank) = (run.t.world(), run.t.rank());
        let total = nbytes(a.count, self.send_blocks(world), a.dtype)?;
        let Some((t, send, recv)) = buffers(run, "all_to_all_v", total)? else {
            return Ok(());
        };
        let counts = counts(a.count, world, rank)?;
        algo::alltoall::all_to_all_v(t, send, recv, &counts, a.dtype.size(), deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_and_column_sums_to_all_to_all_s() {
        for world in 1..=9 {
            for count in [0, 1, 2, 7, 1000, 262_144] {
                let m = |i, j| pair_count(count, world, i, j);
                for k in 0..world {
                    let row: usize = (0..world).map(|j| m(k, j)).sum();
                    let col: usize = (0..world).map(|i| m(i, k)).sum();
                    assert_eq!((row, col), (count * world, count * world));
                    assert_eq!(m(k, k), count);
                }
                let (lo, hi) = (0..world * world)
                    .map(|n| m(n / world, n % world))
                    .fold((usize::MAX, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
                assert!(lo >= count / 2 && hi <= count + count / 2, "{lo} {hi}");
                if world > 2 && count >= 1000 {
                    assert!(lo < hi, "the pairs vary on {world} ranks");
                }
            }
        }
    }
}
