//! all_to_all: block j of `count` elements goes to rank j; block i of the
//! output comes from rank i. nccl-tests' size is one rank's whole send buffer.

use super::prelude::*;

pub struct AllToAll;

impl Spec for AllToAll {
    /// NCCL builds it from send/recv.
    fn names(&self) -> Names {
        Names("all_to_all", "alltoall_perf", None)
    }
    fn send_blocks(&self, world: usize) -> usize {
        world
    }
    fn recv_blocks(&self, world: usize) -> usize {
        world
    }
    fn busbw_factor(&self, world: usize) -> f64 {
        super::others_share(world)
    }
    fn modelled(&self) -> &'static [Algorithm] {
        &[Algorithm::Pairwise]
    }
    fn form(&self, algo: Algorithm) -> Option<CostForm> {
        match algo {
            Algorithm::Pairwise | Algorithm::Ring => Some(CostForm::Pairwise),
            _ => None,
        }
    }
    fn choose(&self, _algo: Algo, _world: usize, _bytes: usize) -> Algorithm {
        Algorithm::Pairwise
    }
    /// Block `rank` of every rank's input, in rank order.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        let blocks = x.blocks(x.rank);
        let block_bytes = x.args.count * x.args.dtype.size();
        Some(reference::all_to_all(
            &super::slices(&blocks),
            block_bytes,
            0,
        ))
    }
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, deadline) = (run.args, run.deadline);
        let block = nbytes(a.count, 1, a.dtype)?;
        let world = run.t.world();
        let total = nbytes(a.count, self.send_blocks(world), a.dtype)?;
        let Some((t, send, recv)) = buffers(run, "all_to_all", total)? else {
            return Ok(());
        };
        algo::alltoall::all_to_all(t, send, recv, block, deadline)
    }
}

/// The transport and the (send, receive) bytes of an all-to-all call of
/// `total` bytes per buffer, checked and named `what`; in place, the send
/// side is a copy in scratch. `None` when nothing moves.
#[allow(clippy::type_complexity)]
pub(super) fn buffers<'a, T: Transport>(
    run: HostRun<'a, T>,
    what: &str,
    total: usize,
) -> CommResult<Option<(&'a mut T, &'a [u8], &'a mut [u8])>> {
    let (count, world) = (run.args.count, run.t.world());
    let scratch = run.scratch;
    Ok(match views(run.io, what, total, total)? {
        (None, buf) if count > 0 && world > 1 => {
            let send = scratch.bytes(total);
            copy_bytes(send, buf);
            Some((run.t, &*send, buf))
        }
        (Some(send), recv) if count > 0 => Some((run.t, send, recv)),
        _ => None,
    })
}
