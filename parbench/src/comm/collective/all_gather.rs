//! all_gather: `count` elements from each rank, all `count x world` out on
//! every rank in rank order; in place, a rank's input is its block of the
//! output. nccl-tests' size is the gathered output.

use super::{CostForm, Spec};
use crate::comm::algo::Algorithm;

pub struct AllGather;

impl Spec for AllGather {
    fn name(&self) -> &'static str {
        "all_gather"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "all_gather_perf"
    }
    fn nccl_func(&self) -> Option<&'static str> {
        Some("AllGather")
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
}
