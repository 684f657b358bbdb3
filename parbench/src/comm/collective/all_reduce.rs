//! all_reduce: `count` elements in, the same `count` reduced over all ranks
//! out on every rank. nccl-tests' size is the buffer.

use super::{CostForm, Spec};
use crate::comm::algo::Algorithm;

pub struct AllReduce;

impl Spec for AllReduce {
    fn name(&self) -> &'static str {
        "all_reduce"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "all_reduce_perf"
    }
    fn nccl_func(&self) -> Option<&'static str> {
        Some("AllReduce")
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
}
