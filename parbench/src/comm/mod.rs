//! Communicators: the collectives and point-to-point transfers every bench
//! runs, over every backend.
//!
//! Layers, each with one job:
//! - [`Transport`]: the point-to-point core of a CPU backend (`local`:
//!   threads and shared memory; `tcp`: processes and sockets).
//! - [`algo`]: each collective algorithm (ring, trees, recursive doubling),
//!   written once over a [`Transport`].
//! - [`HostComm`]: a [`Communicator`] made of a transport and the algorithms.
//! - NCCL (feature `cuda`) and MPI (feature `mpi`) implement [`Communicator`]
//!   with their own calls, and run a collective their library lacks with
//!   its host algorithm over their own point-to-point calls.
//!
//! Buffer conventions follow NCCL's, so that the sweep code and the byte
//! counts are the same on every backend (`count` is always per rank):
//!
//! | collective      | send elements   | recv elements   | in place                                  |
//! |-----------------|-----------------|-----------------|-------------------------------------------|
//! | all_reduce      | count           | count           | one buffer                                |
//! | all_gather      | count           | count x world   | send is recv[rank x count ..]             |
//! | reduce_scatter  | count x world   | count           | result at buf[rank x count ..]            |
//! | broadcast       | count (root)    | count           | one buffer                                |
//! | reduce          | count           | count (root)    | one buffer                                |
//! | all_to_all      | count x world   | count x world   | one buffer; block j goes to rank j        |
//!
//! [`Communicator::all_to_all_v`] takes per-pair counts instead
//! ([`alltoallv::VCounts`]), out of place only.

pub mod algo;
pub mod alltoallv;
mod buffer;
pub mod collective;
pub mod conformance;
mod copy;
mod dtype;
mod error;
mod fp8;
pub mod group;
mod host;
#[cfg(any(feature = "cuda", feature = "mpi"))]
mod library;
pub mod local;
pub mod mesh;
pub mod moe;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod nccl_tuning;
pub mod reference;
pub mod tcp;

pub use alltoallv::VCounts;
pub(crate) use buffer::{nbytes, need};
pub use buffer::{CommBuffer, HostBuffer, HOST_BUFFER_OFFSET};
pub use collective::Collective;
pub use copy::{copy_bytes, COPY_PIECE_BYTES};
pub use dtype::{finish_avg, premultiply, reduce_bytes, reduce_typed, DType, Element, ReduceOp};
pub use error::{CommError, CommResult};
pub use fp8::{F8E4M3, F8E5M2};
pub use host::{HostComm, HostRun};
pub use local::{LocalComm, LocalTransport};

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

pub use crate::limits::DEFAULT_TIMEOUT;

impl Collective {
    // The byte rule of each collective (the module table; each
    // collective's own file in `collective/` says its blocks): every
    // buffer is a whole number of per-rank blocks of `count` elements.

    /// Blocks of `count` elements in each rank's send buffer.
    pub fn send_blocks(self, world: usize) -> usize {
        self.spec().send_blocks(world)
    }

    /// Blocks of `count` elements in each rank's receive buffer (the whole output).
    pub fn recv_blocks(self, world: usize) -> usize {
        self.spec().recv_blocks(world)
    }

    /// Blocks counted by nccl-tests' `size`: the larger buffer's.
    pub fn size_blocks(self, world: usize) -> usize {
        self.send_blocks(world).max(self.recv_blocks(world))
    }

    /// Elements of the send buffer of a call with per-rank `count`.
    pub fn send_elems(self, count: usize, world: usize) -> usize {
        count * self.send_blocks(world)
    }

    /// Elements of the receive buffer of a call with per-rank `count`.
    pub fn recv_elems(self, count: usize, world: usize) -> usize {
        count * self.recv_blocks(world)
    }

    /// Per-rank count of a call whose nccl-tests size is `size_bytes`.
    pub fn count_for(self, size_bytes: u64, elem_bytes: usize, world: usize) -> usize {
        let block = elem_bytes * self.size_blocks(world).max(1);
        usize::try_from(size_bytes / block as u64).unwrap_or(usize::MAX)
    }

    /// nccl-tests' size (bytes) of a call with per-rank `count`.
    pub fn size_of(self, count: usize, elem_bytes: usize, world: usize) -> u64 {
        (count * elem_bytes * self.size_blocks(world)) as u64
    }

    /// Per-rank send bytes (what [`Communicator::algo_for`] takes) of a call
    /// whose nccl-tests size is `size_bytes`.
    pub fn send_bytes(self, size_bytes: u64, world: usize) -> usize {
        let b = size_bytes as usize;
        if self.recv_blocks(world) > self.send_blocks(world) {
            b / self.recv_blocks(world)
        } else {
            b
        }
    }

    /// Where (elements) the input starts in the one buffer of an in-place call.
    pub fn in_place_input(self, count: usize, rank: usize) -> usize {
        self.spec().in_place_input(count, rank)
    }

    /// Where (elements) the output starts in the one buffer of an in-place call.
    pub fn in_place_output(self, count: usize, rank: usize) -> usize {
        self.spec().in_place_output(count, rank)
    }
}

/// `Display` as the value's `name()`: the enums that records and command
/// lines spell by name print that name, and nothing else.
macro_rules! display_by_name {
    ($($t:ty),+) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    )+};
}

display_by_name!(Algo, Collective, DType, ReduceOp, mesh::Axis);

/// Algorithm choice for the CPU backends (`--algo`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Algo {
    /// Chosen per call from the message size and world size.
    Auto,
    /// Ring: bandwidth-optimal, (p-1) or 2(p-1) latency steps.
    Ring,
    /// Binomial tree (broadcast, reduce; all_reduce as reduce + broadcast).
    Tree,
    /// Recursive doubling: lg p steps of whole messages, latency-optimal.
    RecursiveDoubling,
    /// Recursive halving-doubling (Rabenseifner): lg p steps, bandwidth-optimal.
    HalvingDoubling,
}

impl Algo {
    /// Every algorithm a user can name.
    pub const ALL: [Algo; 5] = [
        Algo::Auto,
        Algo::Ring,
        Algo::Tree,
        Algo::RecursiveDoubling,
        Algo::HalvingDoubling,
    ];

    /// The name used on command lines and in records.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Auto => "auto",
            Algo::Ring => "ring",
            Algo::Tree => "tree",
            Algo::RecursiveDoubling => "rd",
            Algo::HalvingDoubling => "rhd",
        }
    }
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Algo::Auto),
            "ring" => Ok(Algo::Ring),
            "tree" => Ok(Algo::Tree),
            "rd" | "recursive_doubling" | "recursive-doubling" => Ok(Algo::RecursiveDoubling),
            "rhd" | "halving_doubling" | "halving-doubling" | "rabenseifner" => {
                Ok(Algo::HalvingDoubling)
            }
            other => Err(format!(
                "unknown algorithm '{other}' (expected auto, ring, tree, rd or rhd)"
            )),
        }
    }
}

/// What a collective call takes besides its buffers. `op` is read by the
/// collectives that reduce, `root` by the rooted ones (others ignore them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollArgs {
    /// Elements per rank (the module table says what a buffer holds).
    pub count: usize,
    pub dtype: DType,
    pub op: ReduceOp,
    pub root: usize,
}

impl CollArgs {
    /// `count` elements of `dtype`, `Sum`, root 0.
    pub fn new(count: usize, dtype: DType) -> Self {
        CollArgs {
            count,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
        }
    }

    /// With the reduction operator `op`.
    pub fn op(self, op: ReduceOp) -> Self {
        CollArgs { op, ..self }
    }

    /// With the root `root`.
    pub fn root(self, root: usize) -> Self {
        CollArgs { root, ..self }
    }
}

/// Input and output of a collective: one buffer (in place) or two.
pub enum Io<'a, B> {
    /// The operation reads and writes one buffer (see the module table for offsets).
    InPlace(&'a mut B),
    /// The operation reads `send` and writes `recv`.
    OutOfPlace { send: &'a B, recv: &'a mut B },
}

/// The per-collective calls of [`Communicator`]: each is the collective
/// entry with its arguments (`count` elements of `dtype`, then the
/// collective's own), so that callers keep their names and no backend
/// implements them.
macro_rules! per_collective {
    ($(
        $(#[$doc:meta])*
        $name:ident($count:ident, $dtype:ident $(, $arg:ident: $ty:ty)*) => $coll:ident, $args:expr;
    )*) => {$(
        $(#[$doc])*
        fn $name(
            &mut self,
            io: Io<'_, Self::Buffer>,
            $count: usize,
            $dtype: DType,
            $($arg: $ty,)*
        ) -> CommResult<()> {
            self.collective(Collective::$coll, io, $args)
        }
    )*};
}

/// Collectives, point-to-point transfers and a barrier among `world()` ranks.
///
/// Every call either completes on every rank or returns an error on every
/// rank within the communicator's timeout; an error that involves another
/// rank names it. Counts follow the module-level table (NCCL's conventions).
/// Calls on device backends are asynchronous on the device: [`Communicator::sync`]
/// waits for them, and is a no-op on host backends.
pub trait Communicator: Send {
    /// Buffer type the collectives read and write.
    type Buffer: CommBuffer;

    /// This rank, in `0..world()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// Name of the backend (`local`, `tcp`, `nccl`, `mpi`).
    fn backend(&self) -> &'static str;
    /// The wire the bytes cross, as recorded (`shm`, `tcp`, `nvlink`, ...).
    fn wire(&self) -> String;
    /// The algorithm this communicator uses for `coll` on `bytes` (per-rank send bytes).
    fn algo_for(&self, coll: Collective, bytes: usize) -> String;

    /// Sets the deadline of every later wait.
    fn set_timeout(&mut self, timeout: Duration);
    /// The deadline of every wait.
    fn timeout(&self) -> Duration;

    /// A zeroed buffer of `bytes` bytes where this backend's collectives run.
    fn alloc(&self, bytes: usize) -> CommResult<Self::Buffer>;

    /// Why this communicator cannot run collectives of `dtype` (those that
    /// reduce when `reduces`), or `None` when it can: every host backend
    /// runs every type; NCCL's 8-bit floats need NCCL 2.24 and compute
    /// capability 9.0, as nccl-tests runs them; MPI has no 16- or 8-bit
    /// float type to reduce.
    fn cannot_run(&self, _dtype: DType, _reduces: bool) -> Option<String> {
        None
    }

    /// Runs collective `coll` (its byte rule and meaning are its file's in
    /// [`collective`]): the one entry every backend implements. Host
    /// backends run the file's host algorithm; NCCL and MPI call their
    /// library where it has the collective, and otherwise run the host
    /// algorithm over their own point-to-point calls
    /// ([`group::run_over_point_to_point`]).
    fn collective(
        &mut self,
        coll: Collective,
        io: Io<'_, Self::Buffer>,
        args: CollArgs,
    ) -> CommResult<()>;

    per_collective! {
        /// Reduces `count` elements across all ranks into every rank.
        all_reduce(count, dtype, op: ReduceOp) => AllReduce, CollArgs::new(count, dtype).op(op);
        /// Gathers `count` elements from each rank into every rank, in rank order.
        all_gather(count, dtype) => AllGather, CollArgs::new(count, dtype);
        /// Reduces `count x world` elements and leaves block `rank` on each rank.
        reduce_scatter(count, dtype, op: ReduceOp) => ReduceScatter, CollArgs::new(count, dtype).op(op);
        /// Copies `count` elements from `root` to every rank.
        broadcast(count, dtype, root: usize) => Broadcast, CollArgs::new(count, dtype).root(root);
        /// Reduces `count` elements across all ranks into `root`.
        reduce(count, dtype, op: ReduceOp, root: usize) => Reduce,
            CollArgs::new(count, dtype).op(op).root(root);
        /// Sends block j of `count` elements to rank j, receiving block i from rank i.
        all_to_all(count, dtype) => AllToAll, CollArgs::new(count, dtype);
    }

    /// Sends `count` elements to `peer`. Returns when `buf` may be reused; it
    /// never waits for the peer to post its receive beyond what the backend
    /// buffers, and two ranks that send to each other at once do not deadlock.
    fn send(
        &mut self,
        buf: &Self::Buffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()>;
    /// Receives `count` elements from `peer`.
    fn recv(
        &mut self,
        buf: &mut Self::Buffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()>;
    /// Sends to `to` and receives from `from` at once (nccl-tests' sendrecv).
    fn send_recv(
        &mut self,
        send: &Self::Buffer,
        to: usize,
        recv: &mut Self::Buffer,
        from: usize,
        count: usize,
        dtype: DType,
    ) -> CommResult<()>;
    /// All-to-all with per-pair counts (`MPI_Alltoallv`): `counts.send()[j]`
    /// elements from `send` (packed in rank order) go to rank j, and
    /// `counts.recv()[i]` from rank i land in `recv` (packed in rank order);
    /// the ranks' counts must agree ([`alltoallv`]). A collective of every
    /// rank. The default runs the host's pairwise exchange over this
    /// communicator's send and recv, staged
    /// ([`group::all_to_all_v_over_point_to_point`]); the host backends, MPI
    /// (`MPI_Alltoallv`) and NCCL (grouped `ncclSend`/`ncclRecv`) run their own.
    fn all_to_all_v(
        &mut self,
        send: &Self::Buffer,
        recv: &mut Self::Buffer,
        counts: &VCounts,
        dtype: DType,
    ) -> CommResult<()>
    where
        Self: Sized,
    {
        group::all_to_all_v_over_point_to_point(self, send, recv, counts, dtype)
    }
    /// Returns when every rank has entered the barrier.
    fn barrier(&mut self) -> CommResult<()>;
    /// Waits for this rank's outstanding device work (no-op on host backends).
    fn sync(&mut self) -> CommResult<()> {
        Ok(())
    }

    /// What the operating system's network stack did on this rank's
    /// connections so far (`None` where there are no sockets).
    fn link_stats(&self) -> Option<LinkStats> {
        None
    }

    /// A clock on the device's stream with room for `points` marks, for
    /// backends whose calls return before the work is done (NCCL: CUDA
    /// events). `None` on host backends, where the host clock is right.
    fn stream_clock(&mut self, points: usize) -> CommResult<Option<Box<dyn StreamClock>>> {
        let _ = points;
        Ok(None)
    }

    /// Records `launches` calls of `op` once, to be replayed as one launch
    /// (a CUDA graph: `--graph N`), removing the host's launch cost. A
    /// backend may call `op` once more first, issuing nothing, to allocate
    /// what the calls need before the capture (NCCL does), so `op` must only
    /// issue calls. Unsupported on host backends.
    fn capture(
        &mut self,
        launches: usize,
        op: &mut dyn FnMut(&mut Self) -> CommResult<()>,
    ) -> CommResult<Box<dyn Replay>>
    where
        Self: Sized,
    {
        let _ = (launches, op);
        Err(CommError::Unsupported(format!(
            "backend {} cannot capture a loop of calls (graphs are for device backends)",
            self.backend()
        )))
    }

    /// The wire's ceiling as the device measures it (device-to-device or
    /// peer copy bandwidth, GB/s, with how it was measured); `None` where
    /// the host measures the wire.
    fn device_ceiling(&mut self) -> CommResult<Option<(String, f64)>> {
        Ok(None)
    }

    /// How many sets of buffers a timed loop of calls of `bytes` bytes a
    /// rank should turn through, so that no call finds its data in the
    /// device's cache from the call before: nccl-tests moves each
    /// iteration to another part of buffers of the run's `largest` size
    /// for that reason. 1 (the same buffers every call) where the host
    /// measures the wire: the model prices the host's caches at the
    /// working set ([`crate::model`]).
    fn cache_free_sets(&self, bytes: u64, largest: u64) -> usize {
        let _ = (bytes, largest);
        1
    }

    /// A second communicator over the same ranks, on host buffers, with
    /// channels of its own ([`Transport::duplicate`]): another thread may
    /// run collectives on it while this one is in use (the data-parallel
    /// reduction overlapped with the backward). A collective of every
    /// rank. `None` where the backend cannot make one: its buffers are
    /// not host memory, or its library is called from one thread only.
    fn duplicate_host(&mut self) -> CommResult<Option<DupComm>> {
        Ok(None)
    }
}

/// Marks recorded on a device's stream between asynchronous calls, read
/// once the work is done (see [`Communicator::stream_clock`]).
pub trait StreamClock {
    /// Records a point after everything issued so far.
    fn mark(&mut self) -> CommResult<()>;
    /// Waits (within the communicator's timeout) for the last point, then
    /// returns the seconds between consecutive points.
    fn intervals(&mut self) -> CommResult<Vec<f64>>;
}

/// A captured loop of calls (see [`Communicator::capture`]).
pub trait Replay {
    /// Issues every captured call once more, as one launch.
    fn replay(&mut self) -> CommResult<()>;
    /// How many calls one replay issues.
    fn launches(&self) -> usize;
}

/// Where a received message goes: copied, or reduced with existing data.
pub enum RecvInto<'a> {
    /// Overwrite these bytes.
    Copy(&'a mut [u8]),
    /// `acc = acc op incoming`, element-wise.
    Reduce {
        acc: &'a mut [u8],
        dtype: DType,
        op: ReduceOp,
    },
    /// `out = base op incoming`, element-wise (`base` as long as `out`): an
    /// out-of-place reduction reads its own operand where it lies, a piece
    /// at a time beside the incoming bytes, instead of copying all of it
    /// into `out` first.
    ReduceFrom {
        base: &'a [u8],
        out: &'a mut [u8],
        dtype: DType,
        op: ReduceOp,
    },
}

impl RecvInto<'_> {
    /// Puts a whole message, already in memory, into this receive, checking
    /// its length as a frame's would be: another length is a
    /// [`CommError::Protocol`] of `rank` naming `peer`, its detail
    /// "`what` N bytes where M were expected".
    pub fn deliver(self, rank: usize, peer: usize, msg: &[u8], what: &str) -> CommResult<()> {
        if msg.len() != self.len() {
            return Err(CommError::Protocol {
                rank,
                peer,
                detail: format!(
                    "{what} {} bytes where {} were expected",
                    msg.len(),
                    self.len()
                ),
            });
        }
        let mut into = self;
        into.absorb(0, msg);
        Ok(())
    }

    /// Number of bytes this receive expects.
    pub fn len(&self) -> usize {
        match self {
            RecvInto::Copy(b) => b.len(),
            RecvInto::Reduce { acc, .. } => acc.len(),
            RecvInto::ReduceFrom { out, .. } => out.len(),
        }
    }

    /// The element type of a reducing receive; `None` for a copy.
    pub fn reduces(&self) -> Option<DType> {
        match self {
            RecvInto::Copy(_) => None,
            RecvInto::Reduce { dtype, .. } | RecvInto::ReduceFrom { dtype, .. } => Some(*dtype),
        }
    }

    /// Takes `piece`, the incoming bytes from offset `at` on: copies it into
    /// place or reduces it. For a reduction `at` and the piece's length are
    /// whole elements. The caller keeps `at + piece.len()` within
    /// [`Self::len`] (transports check a message's length before its bytes).
    pub fn absorb(&mut self, at: usize, piece: &[u8]) {
        let range = at..at + piece.len();
        match self {
            RecvInto::Copy(dst) => copy_bytes(&mut dst[range], piece),
            RecvInto::Reduce { acc, dtype, op } => {
                reduce_bytes(&mut acc[range], piece, *dtype, *op)
            }
            RecvInto::ReduceFrom {
                base,
                out,
                dtype,
                op,
            } => {
                // Pieces that stay in L1 between the copy and the reduction.
                const PIECE: usize = 16 * 1024;
                let (out, base) = (&mut out[range.clone()], &base[range]);
                for start in (0..piece.len()).step_by(PIECE) {
                    let end = (start + PIECE).min(piece.len());
                    out[start..end].copy_from_slice(&base[start..end]);
                    reduce_bytes(&mut out[start..end], &piece[start..end], *dtype, *op);
                }
            }
        }
    }

    /// Whether it expects nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The arguments of one [`Transport::exchange`]: `data` goes to `to` while
/// a message from `from` arrives in `into`.
pub struct Exchange<'a> {
    pub to: usize,
    pub data: &'a [u8],
    pub from: usize,
    pub into: RecvInto<'a>,
}

/// The point-to-point core of a CPU backend. Every algorithm in [`algo`] is
/// written against this trait alone.
///
/// Messages between one pair of ranks arrive in the order they were sent;
/// lengths must match on both sides (the algorithms compute them the same
/// way on every rank). Every call gives up at `deadline` with
/// [`CommError::Timeout`] naming the peer.
pub trait Transport: Send {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// Backend name (`local`, `tcp`).
    fn backend(&self) -> &'static str;
    /// The wire, as recorded.
    fn wire(&self) -> String;
    /// Sends `data` to `peer`; returns when `data` may be reused. Never
    /// deadlocks with a concurrent send from `peer` to this rank.
    fn send(&mut self, peer: usize, data: &[u8], deadline: Instant) -> CommResult<()>;
    /// Receives the next message from `peer` into `into`.
    fn recv(&mut self, peer: usize, into: RecvInto<'_>, deadline: Instant) -> CommResult<()>;
    /// Sends `data` to `to` while receiving from `from`: the step of every
    /// ring and butterfly. Backends overlap the two (in
    /// [`Transport::exchange_step`]).
    fn exchange(
        &mut self,
        to: usize,
        data: &[u8],
        from: usize,
        into: RecvInto<'_>,
        deadline: Instant,
    ) -> CommResult<()> {
        self.exchange_step(
            Exchange {
                to,
                data,
                from,
                into,
            },
            deadline,
        )
    }
    /// [`Transport::exchange`] as each backend writes it: the callers keep
    /// their five arguments, and a backend takes them as one [`Exchange`]
    /// rather than spelling out the long signature again.
    fn exchange_step(&mut self, step: Exchange<'_>, deadline: Instant) -> CommResult<()>;
    /// See [`Communicator::link_stats`].
    fn link_stats(&self) -> Option<LinkStats> {
        None
    }
    /// A second transport over the same ranks with channels of its own
    /// (as `MPI_Comm_dup` makes): its messages never meet this one's, so
    /// another thread may use it while this one is in use. A collective:
    /// every rank calls it, in the same order, before `deadline`. `None`
    /// where the backend cannot make one.
    fn duplicate(&mut self, deadline: Instant) -> CommResult<Option<Box<dyn Transport>>> {
        let _ = deadline;
        Ok(None)
    }
}

/// A duplicated transport ([`Transport::duplicate`]) is a transport.
impl Transport for Box<dyn Transport> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world(&self) -> usize {
        (**self).world()
    }
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn wire(&self) -> String {
        (**self).wire()
    }
    fn send(&mut self, peer: usize, data: &[u8], deadline: Instant) -> CommResult<()> {
        (**self).send(peer, data, deadline)
    }
    fn recv(&mut self, peer: usize, into: RecvInto<'_>, deadline: Instant) -> CommResult<()> {
        (**self).recv(peer, into, deadline)
    }
    fn exchange_step(&mut self, step: Exchange<'_>, deadline: Instant) -> CommResult<()> {
        (**self).exchange_step(step, deadline)
    }
    fn link_stats(&self) -> Option<LinkStats> {
        (**self).link_stats()
    }
    fn duplicate(&mut self, deadline: Instant) -> CommResult<Option<Box<dyn Transport>>> {
        (**self).duplicate(deadline)
    }
}

/// The communicator over a duplicated transport ([`Communicator::duplicate_host`]).
pub type DupComm = HostComm<Box<dyn Transport>>;

/// The state of one rank's socket connections, as the kernel reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LinkStats {
    /// The congestion control of each connection (one entry when all agree).
    pub congestion_control: Vec<String>,
    /// Why that one, in a few words (the transport's rule or the user's choice).
    pub chosen_by: String,
    /// Segments the kernel retransmitted, summed over the connections
    /// (`tcpi_total_retrans`): on loopback or a quiet link, anything but 0
    /// means the figures include loss recovery.
    pub retransmitted_segments: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of receive takes its bytes in pieces as transports deliver
    /// them; a ReduceFrom leaves its base alone and crosses its own 16 KiB
    /// work pieces.
    #[test]
    fn receives_absorb_pieces_at_their_offsets() {
        let n = 40_000; // f32 elements: 160,000 bytes, not a multiple of 16 KiB
        let base: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        let incoming: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 2.0).collect();
        let (base_b, in_b): (&[u8], &[u8]) =
            (bytemuck::cast_slice(&base), bytemuck::cast_slice(&incoming));
        let want_sum: Vec<f32> = base.iter().zip(&incoming).map(|(a, b)| a + b).collect();
        // Pieces of uneven whole-element sizes, as a socket hands them over.
        let cuts = [0, 4, 4096, 20_000, 65_536, 100_004, in_b.len()];
        let deliver = |into: &mut RecvInto<'_>| {
            for w in cuts.windows(2) {
                into.absorb(w[0], &in_b[w[0]..w[1]]);
            }
        };

        let mut out = vec![0f32; n];
        let mut into = RecvInto::ReduceFrom {
            base: base_b,
            out: bytemuck::cast_slice_mut(&mut out),
            dtype: DType::F32,
            op: ReduceOp::Sum,
        };
        assert_eq!((into.len(), into.reduces()), (in_b.len(), Some(DType::F32)));
        deliver(&mut into);
        assert_eq!(out, want_sum);

        let mut acc = base.clone();
        let mut into = RecvInto::Reduce {
            acc: bytemuck::cast_slice_mut(&mut acc),
            dtype: DType::F32,
            op: ReduceOp::Sum,
        };
        deliver(&mut into);
        assert_eq!(acc, want_sum);

        let mut copy = vec![0f32; n];
        let mut into = RecvInto::Copy(bytemuck::cast_slice_mut(&mut copy));
        assert_eq!(into.reduces(), None);
        deliver(&mut into);
        assert_eq!(copy, incoming);
    }
}
