//! all_reduce: `count` elements in, the same `count` reduced over all ranks
//! out on every rank. nccl-tests' size is the buffer.

use super::prelude::*;
use crate::comm::algo::{AUTO_RD_MAX_BYTES, AUTO_RHD_MAX_BYTES};

pub struct AllReduce;

impl Spec for AllReduce {
    fn names(&self) -> Names {
        Names("all_reduce", "all_reduce_perf", Some("AllReduce"))
    }
    fn reduces(&self) -> bool {
        true
    }
    /// `2(n-1)/n`: a bandwidth-optimal all_reduce moves each byte out and back.
    fn busbw_factor(&self, world: usize) -> f64 {
        2.0 * super::others_share(world)
    }
    fn modelled(&self) -> &'static [Algorithm] {
        &[
            Algorithm::Ring,
            Algorithm::Tree,
            Algorithm::RecursiveDoubling,
            Algorithm::HalvingDoubling,
        ]
    }
    fn form(&self, algo: Algorithm) -> Option<CostForm> {
        Some(match algo {
            Algorithm::Ring => CostForm::RingAllReduce,
            Algorithm::RecursiveDoubling => CostForm::RecursiveDoublingAllReduce,
            Algorithm::HalvingDoubling => CostForm::HalvingDoublingAllReduce,
            Algorithm::Tree => CostForm::TreeAllReduce,
            _ => return None,
        })
    }
    fn choose(&self, algo: Algo, world: usize, bytes: usize) -> Algorithm {
        match algo {
            Algo::Ring => Algorithm::Ring,
            Algo::Tree => Algorithm::Tree,
            Algo::RecursiveDoubling => Algorithm::RecursiveDoubling,
            Algo::HalvingDoubling => Algorithm::HalvingDoubling,
            Algo::Auto => {
                if bytes <= AUTO_RD_MAX_BYTES {
                    Algorithm::RecursiveDoubling
                } else if world > 2 && bytes <= AUTO_RHD_MAX_BYTES {
                    Algorithm::HalvingDoubling
                } else {
                    Algorithm::Ring
                }
            }
        }
    }
    /// The reduction of every rank's input.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        let inputs = x.blocks(0);
        Some(reference::all_reduce(
            &super::slices(&inputs),
            x.args.dtype,
            x.args.op,
        ))
    }
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, t, plan) = (run.args, run.t, run.plan);
        let bytes = nbytes(a.count, 1, a.dtype)?;
        let world = t.world();
        // The ring reads an out-of-place input where it needs it; the other
        // algorithms work in the output buffer, so they start from a copy.
        let (src, buf) = match views(run.io, "all_reduce", bytes, bytes)? {
            (Some(s), r) if !(plan == Algorithm::Ring && world > 1) => {
                copy_bytes(r, s);
                (None, r)
            }
            v => v,
        };
        if a.count == 0 || world == 1 {
            return Ok(());
        }
        let (dtype, op, deadline) = (a.dtype, a.op, run.deadline);
        match plan {
            Algorithm::RecursiveDoubling => {
                algo::rd::all_reduce(t, buf, dtype, op, run.scratch, deadline)
            }
            Algorithm::HalvingDoubling => algo::rhd::all_reduce(t, buf, dtype, op, deadline),
            Algorithm::Tree => {
                algo::tree::reduce(t, buf, dtype, op, 0, deadline)?;
                algo::tree::broadcast(t, buf, 0, deadline)
            }
            _ => algo::ring::all_reduce(t, src, buf, dtype, op, run.scratch, deadline),
        }?;
        if op == ReduceOp::Avg {
            finish_avg(buf, dtype, world);
        }
        Ok(())
    }
}
