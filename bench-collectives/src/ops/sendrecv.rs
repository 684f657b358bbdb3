//! sendrecv (nccl-tests' SendRecv): every rank sends `count` elements to the
//! next rank and receives as many from the previous one, at once. The
//! communicator's send_recv takes two buffers, so there is no in-place form.

use parbench::comm::{CommError, Io};

coll_op! {
    SendRecv: SendRecv, in_place = false;
    expected<T>(inp, _, _, rank, count) {
        let from = (rank + inp.world - 1) % inp.world.max(1);
        Some(inp.range(from, 0, count))
    }
    call(c, io, count, dtype, _, _) {
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
