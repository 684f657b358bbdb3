//! A [`super::Communicator`] made of a point-to-point [`super::Transport`] and the algorithms.
//!
//! This layer checks ranks, picks the algorithm and runs the collective's
//! host algorithm (its file in [`super::collective`], which applies NCCL's
//! buffer conventions and finishes `Avg`) with the call's deadline; the
//! algorithms in [`super::algo`] only move bytes.

use super::algo::{self, Algorithm, Scratch};
use super::{
    nbytes, need, Algo, CollArgs, Collective, CommBuffer, CommError, CommResult, Communicator,
    DType, HostBuffer, Io, RecvInto, Transport, VCounts,
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

    /// The bytes of a message of `count` elements to or from `peer`, after
    /// checking the peer and that `buf` (the `what` buffer) holds them.
    fn message(
        &self,
        buf: &HostBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
        what: &str,
    ) -> CommResult<usize> {
        self.check_rank("peer", peer)?;
        let bytes = nbytes(count, 1, dtype)?;
        need(buf, bytes, what)?;
        Ok(bytes)
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

/// One call of a collective's host algorithm (its file's `Spec::host`):
/// the buffers and arguments, the transport, reusable scratch, the call's
/// deadline and the algorithm [`HostComm`] chose for it.
pub struct HostRun<'a, T> {
    pub io: Io<'a, HostBuffer>,
    pub args: CollArgs,
    pub t: &'a mut T,
    pub scratch: &'a mut Scratch,
    pub deadline: Instant,
    pub plan: Algorithm,
}

/// The bytes a call works on, checked: in place the one buffer's first
/// `max(send, recv)` bytes (and no input view); out of place the send
/// buffer's first `send` bytes and the receive buffer's first `recv`.
/// Errors name the buffer (`all_gather`, `all_gather send`, `all_gather recv`).
pub(crate) fn views<'a>(
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

    fn duplicate_host(&mut self) -> CommResult<Option<super::DupComm>> {
        let deadline = Instant::now() + self.timeout;
        let (algo, timeout) = (self.algo, self.timeout);
        Ok(self
            .transport
            .duplicate(deadline)?
            .map(|t| HostComm::new(t, algo, timeout)))
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

    fn collective(
        &mut self,
        coll: Collective,
        io: Io<'_, HostBuffer>,
        args: CollArgs,
    ) -> CommResult<()> {
        if coll.rooted() {
            self.check_rank("root", args.root)?;
        }
        // Every choice depends on the per-rank block's bytes (the file's
        // algorithm checks the count itself).
        let plan = self.plan(coll, args.count.saturating_mul(args.dtype.size()));
        self.call(coll.name(), |t, scratch, deadline| {
            coll.run_host(HostRun {
                io,
                args,
                t,
                scratch,
                deadline,
                plan,
            })
        })
    }

    fn send(
        &mut self,
        buf: &HostBuffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        let bytes = self.message(buf, count, dtype, peer, "send")?;
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
        let bytes = self.message(buf, count, dtype, peer, "recv")?;
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

    fn all_to_all_v(
        &mut self,
        send: &HostBuffer,
        recv: &mut HostBuffer,
        counts: &VCounts,
        dtype: DType,
    ) -> CommResult<()> {
        let world = self.transport.world();
        counts.check(world, dtype, send.len_bytes(), recv.len_bytes())?;
        let (data, into) = (send.bytes(), recv.bytes_mut());
        let elem = dtype.size();
        self.call("all_to_all_v", |t, _, deadline| {
            algo::alltoall::all_to_all_v(t, data, into, counts, elem, deadline)
        })
    }

    fn barrier(&mut self) -> CommResult<()> {
        self.call("barrier", |t, _, deadline| {
            algo::barrier::barrier(t, deadline)
        })
    }
}
