//! sendrecv (nccl-tests' SendRecv): every rank sends `count` elements to
//! the next rank and receives as many from the previous one, at once.
//! nccl-tests' size is the message one rank sends.

use super::{CostForm, Spec};
use crate::comm::algo::Algorithm;

pub struct SendRecv;

impl Spec for SendRecv {
    fn name(&self) -> &'static str {
        "sendrecv"
    }
    fn nccl_tests_binary(&self) -> &'static str {
        "sendrecv_perf"
    }
    /// NCCL builds it from send/recv.
    fn nccl_func(&self) -> Option<&'static str> {
        None
    }
    fn busbw_factor(&self, _world: usize) -> f64 {
        1.0
    }
    fn modelled(&self) -> &'static [Algorithm] {
        &[Algorithm::PointToPoint]
    }
    /// Whatever algorithm was asked for, one message each way.
    fn form(&self, _algo: Algorithm) -> Option<CostForm> {
        Some(CostForm::SendRecv)
    }
}
