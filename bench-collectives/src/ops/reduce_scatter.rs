//! reduce_scatter: `count x world` elements in, block `rank` of the
//! reduction out. nccl-tests' size is the whole input.

use super::CollOp;
use crate::data::Inputs;
use parbench::comm::{Collective, CommResult, Communicator, DType, Element, Io, ReduceOp};

pub struct ReduceScatter;

impl CollOp for ReduceScatter {
    const COLL: Collective = Collective::ReduceScatter;

    fn expected<T: Element>(
        inp: &Inputs,
        op: ReduceOp,
        _: usize,
        rank: usize,
        count: usize,
    ) -> Option<Vec<T>> {
        Some(inp.reduced(op, rank * count, count))
    }

    fn call<C: Communicator>(
        c: &mut C,
        io: Io<'_, C::Buffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        _: usize,
    ) -> CommResult<()> {
        c.reduce_scatter(io, count, dtype, op)
    }
}
