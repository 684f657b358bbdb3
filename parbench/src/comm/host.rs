//! A [`super::Communicator`] made of a point-to-point [`super::Transport`] and the algorithms.
//!
//! This layer checks arguments, applies NCCL's buffer conventions (in place
//! or out of place, see the table in [`super`]), picks the algorithm and
//! finishes `Avg`; the algorithms in [`super::algo`] only move bytes.

use super::algo::{self, Algorithm, Scratch};
use super::{
    finish_avg, nbytes, need, Algo, Collective, CommError, CommResult, Communicator, DType,
    HostBuffer, Io, RecvInto, ReduceOp, Transport,
};
use std::time::{Duration, Instant};

/// The communicator of every CPU backend: a transport plus the algorithms in [`super::algo`].
pub struct HostComm<T: Transport> {
    pub(crate) transport: T,
    pub(crate) algo: Algo,
    pub(crate) timeout: Duration,
    /// Second buffer for the algorithms that need one (kept between calls
    /// so that repeated collectives do not allocate).
    scratch: Scratch,
}

impl<T: Transport> HostComm<T> {
    /// A communicator over `transport`, choosing algorithms by `algo`, giving
    /// up on any wait after `timeout`.
    pub fn new(transport: T, algo: Algo, timeout: Duration) -> Self {
        HostComm {
            transport,
            algo,
            timeout,
            scratch: Scratch::default(),
        }
    }

    /// The algorithm choice this communicator was built with.
    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// The point-to-point transport underneath.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    fn plan(&self, coll: Collective, bytes: usize) -> Algorithm {
        Algorithm::choose(coll, self.algo, self.transport.world(), bytes)
    }

    fn check_rank(&self, what: &str, r: usize) -> CommResult<()> {
        let world = self.transport.world();
        if r >= world {
            return Err(CommError::InvalidArgument(format!(
                "{what} {r} out of range for world {world}"
            )));
        }
        Ok(())
    }

    /// Runs `body` as operation `op` with this call's deadline, and names the
    /// operation and its real elapsed time in timeouts and lost peers.
    fn call<R>(
        &mut self,
        op: &'static str,
        body: impl FnOnce(&mut T, &mut Scratch, Instant) -> CommResult<R>,
    ) -> CommResult<R> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        body(&mut self.transport, &mut self.scratch, deadline).map_err(|e| match e {
            CommError::Timeout { rank, peer, .. } => CommError::Timeout {
                rank,
                peer,
                op,
                after: start.elapsed(),
            },
            CommError::PeerLost {
                rank, peer, detail, ..
            } => CommError::PeerLost {
                rank,
                peer,
                op,
                detail,
            },
            other => other,
        })
    }
}

/// The bytes a call works on, checked: in place the one buffer's first
/// `max(send, recv)` bytes (and no input view); out of place the send
/// buffer's first `send` bytes and the receive buffer's first `recv`.
/// Errors name the buffer (`all_gather`, `all_gather send`, `all_gather recv`).
fn views<'a>(
    io: Io<'a, HostBuffer>,
    op: &str,
    send: usize,
    recv: usize,
) -> CommResult<(Option<&'a [u8]>, &'a mut [u8])> {
    match io {
        Io::InPlace(b) => {
            let bytes = send.max(recv);
            need(b, bytes, op)?;
            Ok((None, &mut b.bytes_mut()[..bytes]))
        }
        Io::OutOfPlace { send: s, recv: r } => {
            need(s, send, format_args!("{op} send"))?;
            need(r, recv, format_args!("{op} recv"))?;
            Ok((Some(&s.bytes()[..send]), &mut r.bytes_mut()[..recv]))
        }
    }
}

impl<T: Transport> Communicator for HostComm<T> {
    type Buffer = HostBuffer;

    fn rank(&self) -> usize {
        self.transport.rank()
    }

    fn world(&self) -> usize {
        self.transport.world()
    }

    fn backend(&self) -> &'static str {
        self.transport.backend()
    }

    fn wire(&self) -> String {
        self.transport.wire()
    }

    fn link_stats(&self) -> Option<super::LinkStats> {
        self.transport.link_stats()
    }

    fn algo_for(&self, coll: Collective, bytes: usize) -> String {
        self.plan(coll, bytes).name().to_string()
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn alloc(&self, bytes: usize) -> CommResult<HostBuffer> {
        Ok(HostBuffer::zeroed(bytes))
    }

    fn all_reduce(
        &mut self,
        io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> CommResult<()> {
        let bytes = nbytes(count, 1, dtype)?;
        let world = self.world();
        let plan = self.plan(Collective::AllReduce, bytes);
        // The ring reads an out-of-place input where it needs it; the other
        // algorithms work in the output buffer, so they start from a copy.
        let (src, buf) = match views(io, "all_reduce", bytes, bytes)? {
            (Some(s), r) if !(plan == Algorithm::Ring && world > 1) => {
                r.copy_from_slice(s);
                (None, r)
            }
            v => v,
        };
        if count == 0 || world == 1 {
            return Ok(());
        }
        self.call("all_reduce", |t, scratch, deadline| match plan {
            Algorithm::RecursiveDoubling => {
                algo::rd::all_reduce(t, buf, dtype, op, scratch, deadline)
            }
            Algorithm::HalvingDoubling => algo::rhd::all_reduce(t, buf, dtype, op, deadline),
            Algorithm::Tree => {
                algo::tree::reduce(t, buf, dtype, op, 0, deadline)?;
                algo::tree::broadcast(t, buf, 0, deadline)
            }
            _ => algo::ring::all_reduce(t, src, buf, dtype, op, scratch, deadline),
        })?;
        if op == ReduceOp::Avg {
            finish_avg(buf, dtype, world);
        }
        Ok(())
    }

    fn all_gather(&mut self, io: Io<'_, HostBuffer>, count: usize, dtype: DType) -> CommResult<()> {
        let (world, rank) = (self.world(), self.rank());
        let c = Collective::AllGather;
        let block = nbytes(count, c.send_blocks(world), dtype)?;
        let total = nbytes(count, c.recv_blocks(world), dtype)?;
        let (own, buf) = views(io, "all_gather", block, total)?;
        if world == 1 {
            if let Some(own) = own {
                buf[rank * block..(rank + 1) * block].copy_from_slice(own);
            }
            return Ok(());
        }
        if count == 0 {
            return Ok(());
        }
        self.call("all_gather", |t, _, deadline| {
            algo::ring::all_gather(t, own, buf, count, dtype.size(), deadline)
        })
    }

    fn reduce_scatter(
        &mut self,
        io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> CommResult<()> {
        let (world, rank) = (self.world(), self.rank());
        let c = Collective::ReduceScatter;
        let block = nbytes(count, c.recv_blocks(world), dtype)?;
        let total = nbytes(count, c.send_blocks(world), dtype)?;
        let mine = rank * block..(rank + 1) * block;
        match io {
            Io::InPlace(b) => {
                need(b, total, "reduce_scatter")?;
                let buf = &mut b.bytes_mut()[..total];
                if count == 0 {
                    return Ok(());
                }
                self.call("reduce_scatter", |t, _, deadline| {
                    algo::ring::reduce_scatter(t, buf, count, dtype, op, deadline)
                })?;
                if op == ReduceOp::Avg {
                    finish_avg(&mut buf[mine], dtype, world);
                }
            }
            Io::OutOfPlace { send, recv } => {
                need(send, total, "reduce_scatter send")?;
                need(recv, block, "reduce_scatter recv")?;
                if count == 0 {
                    return Ok(());
                }
                let (send, out) = (&send.bytes()[..total], &mut recv.bytes_mut()[..block]);
                self.call("reduce_scatter", |t, scratch, deadline| {
                    algo::ring::reduce_scatter_out(
                        t, send, out, count, dtype, op, scratch, deadline,
                    )
                })?;
                if op == ReduceOp::Avg {
                    finish_avg(out, dtype, world);
                }
            }
        }
        Ok(())
    }

    fn broadcast(
        &mut self,
        io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> CommResult<()> {
        self.check_rank("root", root)?;
        let is_root = self.rank() == root;
        let bytes = nbytes(count, 1, dtype)?;
        let buf = match io {
            Io::InPlace(b) => {
                need(b, bytes, "broadcast")?;
                &mut b.bytes_mut()[..bytes]
            }
            Io::OutOfPlace { send, recv } => {
                need(recv, bytes, "broadcast recv")?;
                let r = &mut recv.bytes_mut()[..bytes];
                if is_root {
                    need(send, bytes, "broadcast send")?;
                    r.copy_from_slice(&send.bytes()[..bytes]);
                }
                r
            }
        };
        if count == 0 || self.world() == 1 {
            return Ok(());
        }
        let plan = self.plan(Collective::Broadcast, bytes);
        self.call("broadcast", |t, _, deadline| match plan {
            Algorithm::Chain => algo::tree::chain_broadcast(t, buf, root, deadline),
            _ => algo::tree::broadcast(t, buf, root, deadline),
        })
    }

    fn reduce(
        &mut self,
        io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> CommResult<()> {
        self.check_rank("root", root)?;
        let (world, is_root) = (self.world(), self.rank() == root);
        let bytes = nbytes(count, 1, dtype)?;
        // The root accumulates in its result buffer; the others in scratch,
        // so that their buffers are left as they were.
        let (input, out): (&[u8], Option<&mut [u8]>) = match io {
            Io::InPlace(b) => {
                need(b, bytes, "reduce")?;
                if is_root {
                    (&[], Some(&mut b.bytes_mut()[..bytes]))
                } else {
                    (&b.bytes()[..bytes], None)
                }
            }
            Io::OutOfPlace { send, recv } => {
                need(send, bytes, "reduce send")?;
                if is_root {
                    need(recv, bytes, "reduce recv")?;
                    let r = &mut recv.bytes_mut()[..bytes];
                    r.copy_from_slice(&send.bytes()[..bytes]);
                    (&[], Some(r))
                } else {
                    (&send.bytes()[..bytes], None)
                }
            }
        };
        if count == 0 || world == 1 {
            return Ok(());
        }
        let plan = self.plan(Collective::Reduce, bytes);
        let run = |t: &mut T, acc: &mut [u8], deadline| match plan {
            Algorithm::Chain => algo::tree::chain_reduce(t, acc, dtype, op, root, deadline),
            _ => algo::tree::reduce(t, acc, dtype, op, root, deadline),
        };
        self.call("reduce", |t, scratch, deadline| match out {
            Some(acc) => {
                run(t, acc, deadline)?;
                if op == ReduceOp::Avg {
                    finish_avg(acc, dtype, world);
                }
                Ok(())
            }
            None => {
                let acc = scratch.bytes(bytes);
                acc.copy_from_slice(input);
                run(t, acc, deadline)
            }
        })
    }

    fn all_to_all(&mut self, io: Io<'_, HostBuffer>, count: usize, dtype: DType) -> CommResult<()> {
        let world = self.world();
        let block = nbytes(count, 1, dtype)?;
        let total = nbytes(count, Collective::AllToAll.send_blocks(world), dtype)?;
        match views(io, "all_to_all", total, total)? {
            (None, buf) => {
                if count == 0 || world == 1 {
                    return Ok(());
                }
                self.call("all_to_all", |t, scratch, deadline| {
                    let send = scratch.bytes(total);
                    send.copy_from_slice(buf);
                    algo::alltoall::all_to_all(t, send, buf, block, deadline)
                })
            }
            (Some(send), recv) => {
                if count == 0 {
                    return Ok(());
                }
                self.call("all_to_all", |t, _, deadline| {
                    algo::alltoall::all_to_all(t, send, recv, block, deadline)
                })
            }
        }
    }

    fn send(
        &mut self,
        buf: &HostBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        self.check_rank("peer", peer)?;
        let bytes = nbytes(count, 1, dtype)?;
        need(buf, bytes, "send")?;
        let data = &buf.bytes()[..bytes];
        self.call("send", |t, _, deadline| t.send(peer, data, deadline))
    }

    fn recv(
        &mut self,
        buf: &mut HostBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        self.check_rank("peer", peer)?;
        let bytes = nbytes(count, 1, dtype)?;
        need(buf, bytes, "recv")?;
        let into = RecvInto::Copy(&mut buf.bytes_mut()[..bytes]);
        self.call("recv", |t, _, deadline| t.recv(peer, into, deadline))
    }

    fn send_recv(
        &mut self,
        send: &HostBuffer,
        to: usize,
        recv: &mut HostBuffer,
        from: usize,
        count: usize,
        dtype: DType,
    ) -> CommResult<()> {
        self.check_rank("peer", to)?;
        self.check_rank("peer", from)?;
        let bytes = nbytes(count, 1, dtype)?;
        need(send, bytes, "send_recv send")?;
        need(recv, bytes, "send_recv recv")?;
        let data = &send.bytes()[..bytes];
        let into = RecvInto::Copy(&mut recv.bytes_mut()[..bytes]);
        self.call("send_recv", |t, _, deadline| {
            t.exchange(to, data, from, into, deadline)
        })
    }

    fn barrier(&mut self) -> CommResult<()> {
        self.call("barrier", |t, _, deadline| {
            algo::barrier::barrier(t, deadline)
        })
    }
}
