//! reduce: `count` elements reduced over all ranks, out on the root only
//! (other ranks' output is undefined and not checked).

use super::CollOp;
use crate::data::Inputs;
use parbench::comm::{Collective, CommResult, Communicator, DType, Element, Io, ReduceOp};

pub struct Reduce;

impl CollOp for Reduce {
    const COLL: Collective = Collective::Reduce;

    fn expected<T: Element>(
        inp: &Inputs,
        op: ReduceOp,
        root: usize,
        rank: usize,
        count: usize,
    ) -> Option<Vec<T>> {
        (rank == root).then(|| inp.reduced(op, 0, count))
    }

    fn call<C: Communicator>(
        c: &mut C,
        io: Io<'_, C::Buffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> CommResult<()> {
        c.reduce(io, count, dtype, op, root)
    }
}
