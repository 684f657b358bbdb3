//! all_gather: `count` elements from each rank, all `count x world` out on
//! every rank in rank order; in place, a rank's input is its block of the
//! output. nccl-tests' size is the gathered output.

use super::prelude::*;

pub struct AllGather;

impl Spec for AllGather {
    fn names(&self) -> Names {
        Names("all_gather", "all_gather_perf", Some("AllGather"))
    }
    fn recv_blocks(&self, world: usize) -> usize {
        world
    }
    fn in_place_input(&self, count: usize, rank: usize) -> usize {
        rank * count
    }
    fn busbw_factor(&self, world: usize) -> f64 {
        super::others_share(world)
    }
    fn modelled(&self) -> &'static [Algorithm] {
        &[Algorithm::Ring, Algorithm::RecursiveDoubling]
    }
    fn form(&self, algo: Algorithm) -> Option<CostForm> {
        Some(match algo {
            Algorithm::Ring => CostForm::RingPass { reduced: false },
            Algorithm::RecursiveDoubling => CostForm::RecursiveDoublingAllGather,
            _ => return None,
        })
    }
    fn choose(&self, _algo: Algo, _world: usize, _bytes: usize) -> Algorithm {
        Algorithm::Ring
    }
    /// Every rank's input, in rank order.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        Some(reference::all_gather(&super::slices(&x.blocks(0))))
    }
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, t) = (run.args, run.t);
        let (world, rank) = (t.world(), t.rank());
        let block = nbytes(a.count, self.send_blocks(world), a.dtype)?;
        let total = nbytes(a.count, self.recv_blocks(world), a.dtype)?;
        let (own, buf) = views(run.io, "all_gather", block, total)?;
        if world == 1 {
            if let Some(own) = own {
                copy_bytes(&mut buf[rank * block..(rank + 1) * block], own);
            }
            return Ok(());
        }
        if a.count == 0 {
            return Ok(());
        }
        algo::ring::all_gather(t, own, buf, a.count, a.dtype.size(), run.deadline)
    }
}
