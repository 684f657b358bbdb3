//! all_to_all: block j of `count` elements goes to rank j; block i of the
//! output comes from rank i. nccl-tests' size is one rank's whole send buffer.

use super::CollOp;
use crate::data::Inputs;
use parbench::comm::{Collective, CommResult, Communicator, DType, Element, Io, ReduceOp};

pub struct AllToAll;

impl CollOp for AllToAll {
    const COLL: Collective = Collective::AllToAll;

    fn expected<T: Element>(
        inp: &Inputs,
        _: ReduceOp,
        _: usize,
        rank: usize,
        count: usize,
    ) -> Option<Vec<T>> {
        Some(
            (0..inp.world)
                .flat_map(|i| inp.range::<T>(i, rank * count, count))
                .collect(),
        )
    }

    fn call<C: Communicator>(
        c: &mut C,
        io: Io<'_, C::Buffer>,
        count: usize,
        dtype: DType,
        _: ReduceOp,
        _: usize,
    ) -> CommResult<()> {
        c.all_to_all(io, count, dtype)
    }
}
