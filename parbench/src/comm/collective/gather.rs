//! gather (nccl-tests' Gather; unit tests only): `count` elements from each
//! rank, all `count x world` out on the root in rank order (other ranks'
//! output is undefined). It exists to show that a collective is its file
//! and its registry line: nothing else in the library names it, yet every
//! backend runs it (host backends with the algorithm below, NCCL and MPI
//! with it over their point-to-point calls), the conformance suite checks
//! it and the model knows it has no cost form.

use super::{CostForm, Expect, Spec};
use crate::comm::algo::Algorithm;
use crate::comm::host::views;
use crate::comm::{
    nbytes, reference, Algo, CollArgs, CommResult, HostBuffer, HostRun, Io, RecvInto, Transport,
};

pub struct Gather;

impl Spec for Gather {
    fn name(&self) -> &'static str {
        "gather"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "gather_perf"
    }
    /// NCCL builds it from send/recv.
    fn nccl_func(&self) -> Option<&'static str> {
        None
    }
    fn rooted(&self) -> bool {
        true
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
    /// Not modelled.
    fn modelled(&self) -> &'static [Algorithm] {
        &[]
    }
    fn form(&self, _algo: Algorithm) -> Option<CostForm> {
        None
    }
    fn choose(&self, _algo: Algo, _world: usize, _bytes: usize) -> Algorithm {
        Algorithm::PointToPoint
    }
    /// Every rank's input in rank order, on the root.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        (x.rank == x.args.root).then(|| reference::all_gather(&super::slices(&x.blocks(0))))
    }
    /// Every other rank sends its block to the root, which takes them in
    /// rank order.
    fn host<T: Transport>(
        &self,
        run: HostRun<'_, T>,
        io: Io<'_, HostBuffer>,
        args: CollArgs,
    ) -> CommResult<()> {
        let (world, rank, root) = (run.t.world(), run.t.rank(), args.root);
        let block = nbytes(args.count, 1, args.dtype)?;
        let total = nbytes(args.count, world, args.dtype)?;
        let (own, buf) = views(io, "gather", block, total)?;
        let mine = rank * block..(rank + 1) * block;
        if rank != root {
            let data = own.unwrap_or(&buf[mine]);
            return run.t.send(root, data, run.deadline);
        }
        if let Some(own) = own {
            buf[mine].copy_from_slice(own);
        }
        for r in (0..world).filter(|&r| r != root) {
            let into = RecvInto::Copy(&mut buf[r * block..(r + 1) * block]);
            run.t.recv(r, into, run.deadline)?;
        }
        Ok(())
    }
}
