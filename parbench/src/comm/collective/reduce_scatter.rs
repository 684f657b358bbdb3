//! reduce_scatter: `count x world` elements in, block `rank` of their
//! reduction out on each rank; in place, the result sits at the rank's
//! block. nccl-tests' size is the whole input.

use super::prelude::*;

pub struct ReduceScatter;

impl Spec for ReduceScatter {
    fn names(&self) -> Names {
        Names(
            "reduce_scatter",
            "reduce_scatter_perf",
            Some("ReduceScatter"),
        )
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
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, t, deadline) = (run.args, run.t, run.deadline);
        let (count, dtype, op) = (a.count, a.dtype, a.op);
        let (world, rank) = (t.world(), t.rank());
        let block = nbytes(count, self.recv_blocks(world), dtype)?;
        let total = nbytes(count, self.send_blocks(world), dtype)?;
        let mine = rank * block..(rank + 1) * block;
        let out = match run.io {
            Io::InPlace(b) => {
                need(b, total, "reduce_scatter")?;
                let buf = &mut b.bytes_mut()[..total];
                if count == 0 {
                    return Ok(());
                }
                algo::ring::reduce_scatter(t, buf, count, dtype, op, deadline)?;
                &mut buf[mine]
            }
            Io::OutOfPlace { send, recv } => {
                need(send, total, "reduce_scatter send")?;
                need(recv, block, "reduce_scatter recv")?;
                if count == 0 {
                    return Ok(());
                }
                let (send, out) = (&send.bytes()[..total], &mut recv.bytes_mut()[..block]);
                let scratch = run.scratch;
                algo::ring::reduce_scatter_out(t, send, out, count, dtype, op, scratch, deadline)?;
                out
            }
        };
        if op == ReduceOp::Avg {
            finish_avg(out, dtype, world);
        }
        Ok(())
    }
}
