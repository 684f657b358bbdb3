//! all_gather: `count` elements from each rank, all `count x world` out on
//! every rank. nccl-tests' size is the gathered output.

use super::CollOp;
use crate::data::Inputs;
use parbench::comm::{Collective, CommResult, Communicator, DType, Element, Io, ReduceOp};

pub struct AllGather;

impl CollOp for AllGather {
    const COLL: Collective = Collective::AllGather;

    fn expected<T: Element>(
        inp: &Inputs,
        _: ReduceOp,
        _: usize,
        _: usize,
        count: usize,
    ) -> Option<Vec<T>> {
        Some(
            (0..inp.world)
                .flat_map(|r| inp.range::<T>(r, 0, count))
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
        c.all_gather(io, count, dtype)
    }
}
