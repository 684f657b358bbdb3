//! reduce: `count` elements reduced over all ranks, out on the root only
//! (other ranks' output is undefined). nccl-tests' size is the buffer.

use super::{CostForm, Spec};
use crate::comm::algo::Algorithm;

pub struct Reduce;

impl Spec for Reduce {
    fn name(&self) -> &'static str {
        "reduce"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "reduce_perf"
    }
    fn nccl_func(&self) -> Option<&'static str> {
        Some("Reduce")
    }
    fn reduces(&self) -> bool {
        true
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
        super::rooted_form(algo, true)
    }
}
