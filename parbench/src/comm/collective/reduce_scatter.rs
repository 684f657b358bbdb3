//! reduce_scatter: `count x world` elements in, block `rank` of their
//! reduction out on each rank; in place, the result sits at the rank's
//! block. nccl-tests' size is the whole input.

use super::{CostForm, Expect, Spec};
use crate::comm::algo::{self, Algorithm};
use crate::comm::{
    finish_avg, nbytes, need, reference, Algo, CollArgs, CommResult, HostBuffer, HostRun, Io,
    ReduceOp, Transport,
};

pub struct ReduceScatter;

impl Spec for ReduceScatter {
    fn name(&self) -> &'static str {
        "reduce_scatter"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "reduce_scatter_perf"
    }
    fn nccl_func(&self) -> Option<&'static str> {
        Some("ReduceScatter")
    }
    fn reduces(&self) -> bool {
        true
    }
    fn send_blocks(&self, world: usize) -> usize {
        world
    }
    fn in_place_output(&self, count: usize, rank: usize) -> usize {
        rank * count
    }
    /// NCCL counts a reduce_scatter by its output, one block.
    fn nccl_bytes(&self, send_bytes: u64, world: usize) -> u64 {
        send_bytes / world.max(1) as u64
    }
    fn busbw_factor(&self, world: usize) -> f64 {
        super::others_share(world)
    }
    fn modelled(&self) -> &'static [Algorithm] {
        &[Algorithm::Ring, Algorithm::HalvingDoubling]
    }
    fn form(&self, algo: Algorithm) -> Option<CostForm> {
        Some(match algo {
            Algorithm::Ring => CostForm::RingPass { reduced: true },
            Algorithm::HalvingDoubling => CostForm::HalvingReduceScatter,
            _ => return None,
        })
    }
    fn choose(&self, _algo: Algo, _world: usize, _bytes: usize) -> Algorithm {
        Algorithm::Ring
    }
    /// Every rank's block `rank`, reduced.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        let blocks = x.blocks(x.rank);
        let block_bytes = x.args.count * x.args.dtype.size();
        let (dtype, op) = (x.args.dtype, x.args.op);
        Some(reference::reduce_scatter(
            &super::slices(&blocks),
            block_bytes,
            dtype,
            op,
            0,
        ))
    }
    fn host<T: Transport>(
        &self,
        run: HostRun<'_, T>,
        io: Io<'_, HostBuffer>,
        args: CollArgs,
    ) -> CommResult<()> {
        let CollArgs {
            count, dtype, op, ..
        } = args;
        let HostRun {
            t,
            scratch,
            deadline,
            ..
        } = run;
        let (world, rank) = (t.world(), t.rank());
        let block = nbytes(count, self.recv_blocks(world), dtype)?;
        let total = nbytes(count, self.send_blocks(world), dtype)?;
        let mine = rank * block..(rank + 1) * block;
        match io {
            Io::InPlace(b) => {
                need(b, total, "reduce_scatter")?;
                let buf = &mut b.bytes_mut()[..total];
                if count == 0 {
                    return Ok(());
                }
                algo::ring::reduce_scatter(t, buf, count, dtype, op, deadline)?;
                if op == ReduceOp::Avg {
                    finish_avg(&mut buf[mine], dtype, world);
                }
            }
            Io::OutOfPlace { send, recv } => {
                need(send, total, "reduce_scatter send")?;
                need(recv, block, "reduce_scatter recv")?;
                if count == 0 {
                    return Ok(());
                }
                let (send, out) = (&send.bytes()[..total], &mut recv.bytes_mut()[..block]);
                algo::ring::reduce_scatter_out(t, send, out, count, dtype, op, scratch, deadline)?;
                if op == ReduceOp::Avg {
                    finish_avg(out, dtype, world);
                }
            }
        }
        Ok(())
    }
}
