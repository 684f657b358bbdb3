//! all_reduce: `count` elements in, the same `count` reduced over all ranks out.

use super::CollOp;
use crate::data::Inputs;
use parbench::comm::{Collective, CommResult, Communicator, DType, Element, Io, ReduceOp};

pub struct AllReduce;

impl CollOp for AllReduce {
    const COLL: Collective = Collective::AllReduce;

    fn expected<T: Element>(
        inp: &Inputs,
        op: ReduceOp,
        _: usize,
        _: usize,
        count: usize,
    ) -> Option<Vec<T>> {
        Some(inp.reduced(op, 0, count))
    }

    fn call<C: Communicator>(
        c: &mut C,
        io: Io<'_, C::Buffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        _: usize,
    ) -> CommResult<()> {
        c.all_reduce(io, count, dtype, op)
    }
}
