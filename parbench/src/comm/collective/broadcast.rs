//! broadcast: the root's `count` elements out on every rank. nccl-tests'
//! size is the buffer.

use super::{CostForm, Spec};
use crate::comm::algo::Algorithm;

pub struct Broadcast;

impl Spec for Broadcast {
    fn name(&self) -> &'static str {
        "broadcast"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "broadcast_perf"
    }
    fn nccl_func(&self) -> Option<&'static str> {
        Some("Broadcast")
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
}
