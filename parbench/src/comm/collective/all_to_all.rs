//! all_to_all: block j of `count` elements goes to rank j; block i of the
//! output comes from rank i. nccl-tests' size is one rank's whole send buffer.

use super::{CostForm, Spec};
use crate::comm::algo::Algorithm;

pub struct AllToAll;

impl Spec for AllToAll {
    fn name(&self) -> &'static str {
        "all_to_all"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "alltoall_perf"
    }
    /// NCCL builds it from send/recv.
    fn nccl_func(&self) -> Option<&'static str> {
        None
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
}
