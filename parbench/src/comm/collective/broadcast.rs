//! broadcast: the root's `count` elements out on every rank. nccl-tests'
//! size is the buffer.

use super::prelude::*;

pub struct Broadcast;

impl Spec for Broadcast {
    fn names(&self) -> Names {
        Names("broadcast", "broadcast_perf", Some("Broadcast"))
    }
    fn rooted(&self) -> bool {
        true
    }
    fn busbw_factor(&self, _world: usize) -> f64 {
        1.0
    }
    fn modelled(&self) -> &'static [Algorithm] {
        super::TREE_AND_CHAIN
    }
    fn form(&self, algo: Algorithm) -> Option<CostForm> {
        super::rooted_form(algo, false)
    }
    fn choose(&self, algo: Algo, world: usize, bytes: usize) -> Algorithm {
        super::rooted_choice(algo, world, bytes)
    }
    /// Only the root's input is read.
    fn reads_input(&self, rank: usize, root: usize) -> bool {
        rank == root
    }
    /// The root's input.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        Some(x.block(x.args.root, 0))
    }
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, t) = (run.args, run.t);
        let is_root = t.rank() == a.root;
        let bytes = nbytes(a.count, 1, a.dtype)?;
        let buf = match run.io {
            Io::InPlace(b) => {
                need(b, bytes, "broadcast")?;
                &mut b.bytes_mut()[..bytes]
            }
            Io::OutOfPlace { send, recv } => {
                need(recv, bytes, "broadcast recv")?;
                let r = &mut recv.bytes_mut()[..bytes];
                if is_root {
                    need(send, bytes, "broadcast send")?;
                    copy_bytes(r, &send.bytes()[..bytes]);
                }
                r
            }
        };
        if a.count == 0 || t.world() == 1 {
            return Ok(());
        }
        match run.plan {
            Algorithm::Chain => algo::tree::chain_broadcast(t, buf, a.root, run.deadline),
            _ => algo::tree::broadcast(t, buf, a.root, run.deadline),
        }
    }
}
