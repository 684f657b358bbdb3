//! reduce_scatter: `count x world` elements in, block `rank` of their
//! reduction out on each rank; in place, the result sits at the rank's
//! block. nccl-tests' size is the whole input.

use super::{CostForm, Spec};
use crate::comm::algo::Algorithm;

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
}
