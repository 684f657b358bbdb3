//! sendrecv (nccl-tests' SendRecv): every rank sends `count` elements to the
//! next rank and receives as many from the previous one, at once. The
//! communicator's send_recv takes two buffers, so there is no in-place form.

use super::CollOp;
use crate::data::Inputs;
use parbench::comm::{
    Collective, CommError, CommResult, Communicator, DType, Element, Io, ReduceOp,
};

pub struct SendRecv;

impl CollOp for SendRecv {
    const COLL: Collective = Collective::SendRecv;
    const IN_PLACE: bool = false;

    fn expected<T: Element>(
        inp: &Inputs,
        _: ReduceOp,
        _: usize,
        rank: usize,
        count: usize,
    ) -> Option<Vec<T>> {
        let from = (rank + inp.world - 1) % inp.world.max(1);
        Some(inp.range(from, 0, count))
    }

    fn call<C: Communicator>(
        c: &mut C,
        io: Io<'_, C::Buffer>,
        count: usize,
        dtype: DType,
        _: ReduceOp,
        _: usize,
    ) -> CommResult<()> {
        let (rank, world) = (c.rank(), c.world());
        match io {
            Io::OutOfPlace { send, recv } => c.send_recv(
                send,
                (rank + 1) % world,
                recv,
                (rank + world - 1) % world,
                count,
                dtype,
            ),
            Io::InPlace(_) => Err(CommError::Unsupported(
                "sendrecv has no in-place form".into(),
            )),
        }
    }
}
