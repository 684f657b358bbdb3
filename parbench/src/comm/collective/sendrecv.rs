//! sendrecv (nccl-tests' SendRecv): every rank sends `count` elements to
//! the next rank and receives as many from the previous one, at once.
//! nccl-tests' size is the message one rank sends.

use super::prelude::*;
use crate::comm::buffer::CommBuffer;

pub struct SendRecv;

impl Spec for SendRecv {
    /// NCCL builds it from send/recv.
    fn names(&self) -> Names {
        Names("sendrecv", "sendrecv_perf", None)
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
    fn choose(&self, _algo: Algo, _world: usize, _bytes: usize) -> Algorithm {
        Algorithm::PointToPoint
    }
    /// The previous rank's input.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        Some(x.block(neighbours(x.rank, x.world.max(1)).1, 0))
    }
    /// One exchange with the next and the previous rank. In place (as
    /// nccl-tests runs it, one buffer given to both ncclSend and ncclRecv)
    /// the message leaves from a copy in scratch: the receive overwrites
    /// the buffer it is sent from.
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let bytes = nbytes(run.args.count, 1, run.args.dtype)?;
        let (to, from) = neighbours(run.t.rank(), run.t.world());
        match run.io {
            Io::OutOfPlace { send, recv } => {
                need(send, bytes, "sendrecv send")?;
                need(recv, bytes, "sendrecv recv")?;
                let into = RecvInto::Copy(&mut recv.bytes_mut()[..bytes]);
                run.t
                    .exchange(to, &send.bytes()[..bytes], from, into, run.deadline)
            }
            Io::InPlace(buf) => {
                need(buf, bytes, "sendrecv")?;
                let copy = run.scratch.bytes(bytes);
                copy.copy_from_slice(&buf.bytes()[..bytes]);
                let into = RecvInto::Copy(&mut buf.bytes_mut()[..bytes]);
                run.t.exchange(to, copy, from, into, run.deadline)
            }
        }
    }
}

/// sendrecv as a collective call on any communicator: its own `send_recv`
/// to the next rank from the previous one (NCCL's and MPI's native path).
/// In place, the message leaves from a copy of the buffer (a second
/// buffer of the communicator's own kind), as on the host path.
pub fn over_send_recv<C: Communicator>(
    comm: &mut C,
    io: Io<'_, C::Buffer>,
    args: CollArgs,
) -> CommResult<()> {
    let (to, from) = neighbours(comm.rank(), comm.world());
    match io {
        Io::OutOfPlace { send, recv } => {
            comm.send_recv(send, to, recv, from, args.count, args.dtype)
        }
        Io::InPlace(buf) => {
            let mut copy = comm.alloc(buf.len_bytes())?;
            copy.copy_from(buf)?;
            comm.send_recv(&copy, to, buf, from, args.count, args.dtype)
        }
    }
}

/// The rank `rank` sends to and the one it receives from.
fn neighbours(rank: usize, world: usize) -> (usize, usize) {
    ((rank + 1) % world, (rank + world - 1) % world)
}
