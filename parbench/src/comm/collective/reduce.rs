//! reduce: `count` elements reduced over all ranks, out on the root only
//! (other ranks' output is undefined). nccl-tests' size is the buffer.

use super::broadcast::Broadcast;
use super::prelude::*;

pub struct Reduce;

impl Spec for Reduce {
    fn names(&self) -> Names {
        Names("reduce", "reduce_perf", Some("Reduce"))
    }
    fn reduces(&self) -> bool {
        true
    }
    // Broadcast's mirror image: rooted, one block, the same trees and
    // chains chosen the same way; only the cost form adds the reduction.
    fn rooted(&self) -> bool {
        Broadcast.rooted()
    }
    fn busbw_factor(&self, world: usize) -> f64 {
        Broadcast.busbw_factor(world)
    }
    fn modelled(&self) -> &'static [Algorithm] {
        Broadcast.modelled()
    }
    fn form(&self, algo: Algorithm) -> Option<CostForm> {
        super::rooted_form(algo, true)
    }
    fn choose(&self, algo: Algo, world: usize, bytes: usize) -> Algorithm {
        Broadcast.choose(algo, world, bytes)
    }
    /// The reduction of every rank's input, on the root.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        let inputs = x.blocks(0);
        let (dtype, op) = (x.args.dtype, x.args.op);
        (x.rank == x.args.root).then(|| reference::reduce(&super::slices(&inputs), dtype, op))
    }
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, t, plan, deadline) = (run.args, run.t, run.plan, run.deadline);
        let (dtype, op, root) = (a.dtype, a.op, a.root);
        let (world, is_root) = (t.world(), t.rank() == root);
        let bytes = nbytes(a.count, 1, dtype)?;
        // The root accumulates in its result buffer; the others in scratch,
        // so that their buffers are left as they were.
        let (input, out): (&[u8], Option<&mut [u8]>) = match run.io {
            Io::InPlace(b) => {
                need(b, bytes, "reduce")?;
                if is_root {
                    (&[], Some(&mut b.bytes_mut()[..bytes]))
                } else {
                    (&b.bytes()[..bytes], None)
                }
            }
            Io::OutOfPlace { send, recv } => {
                need(send, bytes, "reduce send")?;
                if is_root {
                    need(recv, bytes, "reduce recv")?;
                    let r = &mut recv.bytes_mut()[..bytes];
                    copy_bytes(r, &send.bytes()[..bytes]);
                    (&[], Some(r))
                } else {
                    (&send.bytes()[..bytes], None)
                }
            }
        };
        if a.count == 0 || world == 1 {
            return Ok(());
        }
        let reduce = |t: &mut T, acc: &mut [u8]| match plan {
            Algorithm::Chain => algo::tree::chain_reduce(t, acc, dtype, op, root, deadline),
            _ => algo::tree::reduce(t, acc, dtype, op, root, deadline),
        };
        match out {
            Some(acc) => {
                reduce(t, acc)?;
                if op == ReduceOp::Avg {
                    finish_avg(acc, dtype, world);
                }
                Ok(())
            }
            None => {
                let acc = run.scratch.bytes(bytes);
                copy_bytes(acc, input);
                reduce(t, acc)
            }
        }
    }
}
