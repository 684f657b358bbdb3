//! broadcast: the root's `count` elements out on every rank.

use super::CollOp;
use crate::data::Inputs;
use parbench::comm::{Collective, CommResult, Communicator, DType, Element, Io, ReduceOp};

pub struct Broadcast;

impl CollOp for Broadcast {
    const COLL: Collective = Collective::Broadcast;

    fn expected<T: Element>(
        inp: &Inputs,
        _: ReduceOp,
        root: usize,
        _: usize,
        count: usize,
    ) -> Option<Vec<T>> {
        Some(inp.range(root, 0, count))
    }

    fn call<C: Communicator>(
        c: &mut C,
        io: Io<'_, C::Buffer>,
        count: usize,
        dtype: DType,
        _: ReduceOp,
        root: usize,
    ) -> CommResult<()> {
        c.broadcast(io, count, dtype, root)
    }
}
