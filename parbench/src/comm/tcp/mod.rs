//! Backend `tcp`: one process per rank, one socket per pair of ranks (a full
//! mesh), on one host or across hosts.
//!
//! - Setup ([`connect`]): rank 0 serves the rendezvous store at
//!   `MASTER_ADDR:MASTER_PORT` ([`crate::rendezvous::Store`]); every rank
//!   publishes its data address there, then connects to the ranks above it
//!   with a handshake carrying the job token (see `mesh`).
//! - Frames: an 8-byte little-endian length, then the payload. The receiver
//!   knows the length it expects; any other length is a
//!   [`CommError::Protocol`] naming the sender, and nothing is ever
//!   allocated from a received length.
//! - Progress: sockets are nonblocking. A call moves its send and its
//!   receive together (vectored `sendmsg`/`readv`, header and payload in one
//!   system call), spins for a few microseconds
//!   (`PARBENCH_TCP_SPIN_US`, default 50) and then sleeps in `poll`. A
//!   receive reads straight into the caller's buffer; a reducing receive
//!   reads into a fixed scratch buffer and reduces each piece as it lands.
//!   While a send is blocked, the other peers' sockets are drained into a
//!   per-peer stash, so two ranks that send large messages to each other at
//!   once never deadlock.
//! - Faults: a closed socket is [`CommError::PeerLost`] naming the peer at
//!   once; a silent one is [`CommError::Timeout`] naming it at the deadline.
//!   The rank that sees the fault tells every other peer with an abort
//!   frame (naming the lost rank), so ranks waiting elsewhere fail at once
//!   with an error naming the same rank. A rank past its deadline first
//!   sends a hint (whom it waits for) and listens a tenth longer, so that
//!   in a chain of waits every rank names the one really stuck. After a
//!   fault the transport refuses every further call with the same error.
//! - Messages to itself (sendrecv on one rank) go through an in-order queue.
//! - Congestion control (`PARBENCH_TCP_CONGESTION`): the system's, except
//!   on loopback, where a pacing one reorders segments across cores and
//!   retransmits them (see `peer::LOOPBACK_CONGESTION`): there each
//!   connection uses reno. `system` keeps the system's everywhere, a name
//!   sets that one everywhere (a refusal is a setup error).
//!   [`Transport::link_stats`] reports what each connection uses and how
//!   many segments the kernel retransmitted.

mod fault;
mod mesh;
mod peer;

use crate::comm::{Algo, CommError, CommResult, HostBuffer, HostComm, RecvInto, Transport};
use crate::rendezvous::{pollfd, RankInfo, Store};
use fault::{Failure, Fault};
use peer::{Congestion, Peer, Step};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The communicator of the `tcp` backend.
pub type TcpComm = HostComm<TcpTransport>;

/// Header bit that marks a control frame (never set in a payload length).
const CONTROL: u64 = 1 << 63;
/// Control frame kinds (bits 32..40). Final notices: the named rank was
/// lost / timed out, and the sender has given up.
const ABORT_LOST: u64 = 1;
const ABORT_TIMEOUT: u64 = 2;
/// A hint, not a failure: the sender passed its deadline waiting for the
/// named rank. A rank whose own deadline passes while it waits for the
/// sender blames the named rank instead (a chain of waits ends at the rank
/// that is really stuck).
const SUSPECT: u64 = 3;
/// How long a rank past its deadline listens for such a hint before it
/// blames the rank it waited for: a tenth of the call's time, at most this.
const MAX_GRACE: Duration = Duration::from_secs(2);

fn control(kind: u64, named: usize) -> [u8; 8] {
    (CONTROL | (kind << 32) | (named as u64 & 0xffff_ffff)).to_le_bytes()
}

/// (kind, named rank) of a control header.
fn decode(len: u64) -> (u64, usize) {
    ((len >> 32) & 0xff, (len & 0xffff_ffff) as usize)
}
/// Reducing receives read through this much scratch: small enough to stay
/// in L2 while it is reduced, large enough to amortise a system call.
const SCRATCH_BYTES: usize = 256 * 1024;
/// How long a failing rank keeps trying to finish its half-sent frame, so
/// that its abort notice lands on a frame boundary.
const ABORT_GRACE: Duration = Duration::from_millis(500);

/// Joins the job `info` describes and connects to every other rank; gives
/// up after `timeout` with an error naming the rank that did not answer.
pub fn connect(info: &RankInfo, timeout: Duration) -> CommResult<TcpTransport> {
    TcpTransport::connect(info, timeout)
}

/// [`connect`], wrapped in the algorithms: the `tcp` [`crate::comm::Communicator`].
/// `timeout` is both the setup deadline and the deadline of every later wait.
pub fn comm(info: &RankInfo, algo: Algo, timeout: Duration) -> CommResult<TcpComm> {
    Ok(HostComm::new(connect(info, timeout)?, algo, timeout))
}

/// The point-to-point core of the `tcp` backend (see the module docs).
pub struct TcpTransport {
    rank: usize,
    world: usize,
    /// `peers[r]` is the connection to rank `r`; `None` for this rank.
    peers: Vec<Option<Peer>>,
    /// Scratch for reducing receives, placed in its page like the buffers it
    /// reduces into (see [`HostBuffer`]).
    scratch: HostBuffer,
    /// Reused poll set.
    pollfds: Vec<libc::pollfd>,
    spin: Duration,
    failed: Option<Failure>,
    /// `hints[p] = Some(x)`: rank p said it passed its deadline waiting for
    /// rank x (cleared when a data frame from p arrives).
    hints: Vec<Option<usize>>,
    /// Messages this rank sent to itself (nccl-tests' sendrecv on one rank,
    /// an all-to-all's own block), oldest first.
    to_self: VecDeque<Vec<u8>>,
    /// Rank 0 serves the store for the transport's lifetime; others hold a
    /// client. A duplicate holds none (see [`TcpTransport::store`]).
    store: Option<Store>,
    /// The congestion-control rule the connections were set up with, and
    /// whether every one of them is a loopback connection.
    congestion: Congestion,
    loopback: bool,
    /// How this rank joined and the settings it read: a duplicate connects
    /// the same way.
    info: RankInfo,
    settings: Settings,
    /// Duplicates made so far: the next one's mesh is number this + 1.
    duplicated: usize,
}

/// What the environment sets for the connections (read once, at connect).
#[derive(Clone, Debug)]
struct Settings {
    /// `PARBENCH_TCP_BUF_BYTES`: socket buffer sizes.
    buf: Option<usize>,
    /// `PARBENCH_TCP_SPIN_US`: how long a call spins before it polls.
    spin: Duration,
    congestion: Congestion,
}

/// The smallest `PARBENCH_TCP_BUF_BYTES`: a few kilobytes per socket left
/// ranks waiting on one another's full queues far past `--timeout`.
pub const MIN_TCP_BUF_BYTES: usize = 64 << 10;
/// The largest `PARBENCH_TCP_BUF_BYTES` (the kernel caps it lower still).
pub const MAX_TCP_BUF_BYTES: usize = 1 << 30;
/// The longest `PARBENCH_TCP_SPIN_US`: a second.
pub const MAX_TCP_SPIN_US: u64 = 1_000_000;

impl Settings {
    fn from_env() -> CommResult<Settings> {
        Self::read().map_err(CommError::Setup)
    }

    /// The settings, or one line naming the variable and what it takes.
    fn read() -> Result<Settings, String> {
        let set = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let buf = match set("PARBENCH_TCP_BUF_BYTES") {
            Some(v) => Some(
                v.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|b| (MIN_TCP_BUF_BYTES..=MAX_TCP_BUF_BYTES).contains(b))
                    .ok_or_else(|| {
                        format!(
                            "PARBENCH_TCP_BUF_BYTES={v:?}: a byte count from {MIN_TCP_BUF_BYTES} to {MAX_TCP_BUF_BYTES}"
                        )
                    })?,
            ),
            None => None,
        };
        let spin_us = match set("PARBENCH_TCP_SPIN_US") {
            Some(v) => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&us| us <= MAX_TCP_SPIN_US)
                .ok_or_else(|| {
                    format!(
                        "PARBENCH_TCP_SPIN_US={v:?}: a number of microseconds from 0 to {MAX_TCP_SPIN_US}"
                    )
                })?,
            None => 50,
        };
        Ok(Settings {
            buf,
            spin: Duration::from_micros(spin_us),
            congestion: Congestion::parse(set("PARBENCH_TCP_CONGESTION").as_deref()),
        })
    }
}

/// Checks every variable the tcp backend reads (`PARBENCH_TCP_BUF_BYTES`,
/// `PARBENCH_TCP_SPIN_US`, `PARBENCH_TCP_CONGESTION`, `PARBENCH_IFADDR`)
/// before anything starts: a bad value is one line naming it, for the
/// binaries' exit 2, rather than a setup error in every rank. A named
/// congestion control is tried on a socket of its own (no connection),
/// the one test that says what the kernel will take.
pub fn check_env() -> Result<(), String> {
    let settings = Settings::read()?;
    if let Congestion::Named(name) = &settings.congestion {
        use std::os::fd::AsRawFd;
        let socket = std::net::TcpListener::bind(("127.0.0.1", 0))
            .map_err(|e| format!("PARBENCH_TCP_CONGESTION: no socket to try it on: {e}"))?;
        peer::try_congestion(socket.as_raw_fd(), name)
            .map_err(|e| format!("PARBENCH_TCP_CONGESTION={name:?}: the kernel refused it: {e}"))?;
    }
    mesh::ifaddr_from_env()?;
    Ok(())
}

struct SendOp<'a> {
    peer: usize,
    hdr: [u8; 8],
    data: &'a [u8],
    sent: usize,
}

impl<'a> SendOp<'a> {
    fn new(peer: usize, data: &'a [u8]) -> Self {
        SendOp {
            peer,
            hdr: (data.len() as u64).to_le_bytes(),
            data,
            sent: 0,
        }
    }
    fn done(&self) -> bool {
        self.sent == 8 + self.data.len()
    }
}

struct RecvOp<'a> {
    peer: usize,
    into: RecvInto<'a>,
    hdr: [u8; 8],
    hdr_got: usize,
    checked: bool,
    /// Payload bytes read so far (for a reduce: reduced plus `tail`).
    got: usize,
    /// Reduce only: bytes of a partial element waiting at the start of scratch.
    tail: usize,
}

impl<'a> RecvOp<'a> {
    fn new(peer: usize, into: RecvInto<'a>) -> Self {
        RecvOp {
            peer,
            into,
            hdr: [0; 8],
            hdr_got: 0,
            checked: false,
            got: 0,
            tail: 0,
        }
    }
    fn done(&self) -> bool {
        self.checked && self.got == self.into.len() && self.tail == 0
    }
}

impl TcpTransport {
    /// See [`connect`].
    pub fn connect(info: &RankInfo, timeout: Duration) -> CommResult<TcpTransport> {
        let deadline = Instant::now() + timeout;
        let mut store = Store::join(info, timeout)?;
        let streams = if info.world > 1 {
            mesh::build(info, &mut store, 0, deadline)?
        } else {
            vec![None]
        };
        let settings = Settings::from_env()?;
        Self::over(info, Some(store), streams, settings)
    }

    /// The transport over one connected stream per peer.
    fn over(
        info: &RankInfo,
        store: Option<Store>,
        streams: Vec<Option<std::net::TcpStream>>,
        settings: Settings,
    ) -> CommResult<TcpTransport> {
        let mut peers = Vec::with_capacity(info.world);
        let mut loopback = true;
        for s in streams {
            peers.push(match s {
                Some(s) => {
                    loopback &= s.peer_addr().is_ok_and(|a| a.ip().is_loopback());
                    let p = Peer::new(s, &settings.congestion)
                        .map_err(|e| CommError::Setup(e.to_string()))?;
                    if let Some(b) = settings.buf {
                        p.set_buffers(b)?;
                    }
                    Some(p)
                }
                None => None,
            });
        }
        Ok(TcpTransport {
            rank: info.rank,
            world: info.world,
            peers,
            scratch: HostBuffer::zeroed(SCRATCH_BYTES),
            pollfds: Vec::with_capacity(info.world + 1),
            spin: settings.spin,
            failed: None,
            hints: vec![None; info.world],
            to_self: VecDeque::new(),
            store,
            congestion: settings.congestion.clone(),
            loopback,
            info: info.clone(),
            settings,
            duplicated: 0,
        })
    }

    /// The job's rendezvous store (for small blobs such as the NCCL unique
    /// id); `None` on a duplicate ([`Transport::duplicate`]), which met its
    /// peers through its parent's.
    pub fn store(&mut self) -> Option<&mut Store> {
        self.store.as_mut()
    }

    fn check_peer(&self, peer: usize, op: &'static str) -> CommResult<()> {
        if peer >= self.world {
            return Err(CommError::InvalidArgument(format!(
                "rank {}: {op} with rank {peer} (world {})",
                self.rank, self.world
            )));
        }
        if let Some(f) = &self.failed {
            return Err(self.failure_error(f, op));
        }
        Ok(())
    }

    /// Delivers the oldest message this rank sent itself into `into`.
    fn take_from_self(&mut self, into: RecvInto<'_>, op: &'static str) -> CommResult<()> {
        let Some(msg) = self.to_self.pop_front() else {
            return Err(CommError::InvalidArgument(format!(
                "rank {}: {op} from itself with nothing sent to itself (it would wait forever)",
                self.rank
            )));
        };
        into.deliver(self.rank, self.rank, &msg, "sent itself")
    }

    /// Moves `send` and `recv` until both are done, the deadline passes, or a peer fails.
    fn run(
        &mut self,
        mut send: Option<SendOp<'_>>,
        mut recv: Option<RecvOp<'_>>,
        deadline: Instant,
        op: &'static str,
    ) -> CommResult<()> {
        if let Some(r) = &recv {
            if let Some(dtype) = r.into.reduces() {
                if r.into.len() % dtype.size() != 0 {
                    return Err(CommError::InvalidArgument(format!(
                        "reducing receive of {} bytes is not a whole number of {dtype} elements",
                        r.into.len()
                    )));
                }
            }
        }
        let start = Instant::now();
        let grace = (deadline.saturating_duration_since(start) / 10).min(MAX_GRACE);
        let mut suspected = false;
        let mut idle_since: Option<Instant> = None;
        loop {
            let mut moved = false;
            let mut fault = None;
            if let Some(s) = send.as_mut().filter(|s| !s.done()) {
                match self.advance_send(s) {
                    Ok(m) => moved |= m,
                    Err(f) => fault = Some(f),
                }
            }
            if fault.is_none() {
                if let Some(r) = recv.as_mut().filter(|r| !r.done()) {
                    match self.advance_recv(r) {
                        Ok(m) => moved |= m,
                        Err(f) => fault = Some(f),
                    }
                }
            }
            if let Some(f) = fault {
                return Err(self.fail(f, send.as_mut(), recv.as_ref(), op));
            }
            let send_done = send.as_ref().is_none_or(SendOp::done);
            let recv_done = recv.as_ref().is_none_or(RecvOp::done);
            if send_done && recv_done {
                return Ok(());
            }
            let now = Instant::now();
            // Checked even while bytes move: a peer that trickles past the
            // deadline is as late as a silent one.
            if now >= deadline {
                let waiting_on = match (&recv, &send) {
                    (Some(r), _) if !recv_done => r.peer,
                    (_, Some(s)) => s.peer,
                    _ => self.rank,
                };
                // Say whom we wait for, then listen a little longer: that
                // rank may be waiting for another, and say so (hints from
                // idle peers are read while we wait, final notices end the
                // wait at once).
                if !suspected {
                    suspected = true;
                    self.notify(SUSPECT, waiting_on, send.as_ref());
                }
                if now >= deadline + grace {
                    let f = Failure {
                        peer: self.follow_hints(waiting_on),
                        timeout: true,
                        detail: String::new(),
                        waited: Some(start.elapsed()),
                    };
                    self.abort_all(&f, send.as_mut(), None);
                    let err = self.failure_error(&f, op);
                    self.failed = Some(f);
                    return Err(err);
                }
            }
            if moved {
                idle_since = None;
                continue;
            }
            let idle = *idle_since.get_or_insert(now);
            if now - idle < self.spin {
                // Yield rather than burn: on a dedicated core this returns at
                // once; on an oversubscribed one it lets the peer run.
                std::thread::yield_now();
                continue;
            }
            let sending = send.as_ref().filter(|s| !s.done()).map(|s| s.peer);
            let receiving = recv.as_ref().filter(|r| !r.done()).map(|r| r.peer);
            let until = if now >= deadline {
                deadline + grace
            } else {
                deadline
            };
            if let Err(f) = self.wait(sending, receiving, until) {
                return Err(self.fail(f, send.as_mut(), recv.as_ref(), op));
            }
        }
    }

    fn peer_mut(&mut self, peer: usize) -> &mut Peer {
        match self.peers.get_mut(peer) {
            Some(Some(p)) => p,
            // check_peer ran first: every other rank has a connection.
            _ => unreachable!("rank {peer} has no connection"),
        }
    }

    fn advance_send(&mut self, s: &mut SendOp<'_>) -> Result<bool, Fault> {
        let peer = s.peer;
        let p = self.peer_mut(peer);
        let (a, b): (&[u8], &[u8]) = if s.sent < 8 {
            (&s.hdr[s.sent..], s.data)
        } else {
            (&[], &s.data[s.sent - 8..])
        };
        match p.write_from(a, b) {
            Step::Moved(n) => {
                s.sent += n;
                Ok(true)
            }
            Step::WouldBlock => Ok(false),
            Step::Closed(detail) => Err(Fault::Lost { peer, detail }),
        }
    }

    fn advance_recv(&mut self, r: &mut RecvOp<'_>) -> Result<bool, Fault> {
        let peer = r.peer;
        let expected = r.into.len();
        // Split borrows: the peer and the scratch live in `self`.
        let TcpTransport {
            peers,
            scratch,
            hints,
            ..
        } = self;
        let Some(Some(p)) = peers.get_mut(peer) else {
            unreachable!("rank {peer} has no connection")
        };
        let scratch: &mut [u8] = scratch.bytes_mut();
        let hdr_left = 8 - r.hdr_got;
        let step = match &mut r.into {
            RecvInto::Copy(dst) => {
                let (h, d) = (&mut r.hdr[r.hdr_got..], &mut dst[r.got..]);
                p.read_into(h, d)
            }
            RecvInto::Reduce { .. } | RecvInto::ReduceFrom { .. } => {
                let room = (scratch.len() - r.tail).min(expected - r.got);
                let (h, d) = (&mut r.hdr[r.hdr_got..], &mut scratch[r.tail..r.tail + room]);
                if h.is_empty() && d.is_empty() {
                    Step::WouldBlock
                } else {
                    p.read_into(h, d)
                }
            }
        };
        let n = match step {
            Step::Moved(n) => n,
            Step::WouldBlock => return Ok(false),
            Step::Closed(detail) => return Err(Fault::Lost { peer, detail }),
        };
        let h = n.min(hdr_left);
        r.hdr_got += h;
        let body = n - h;
        if r.hdr_got == 8 && !r.checked {
            let len = u64::from_le_bytes(r.hdr);
            if len & CONTROL != 0 {
                let (kind, named) = decode(len);
                if kind != SUSPECT {
                    return Err(Fault::Remote {
                        from: peer,
                        named,
                        timeout: kind == ABORT_TIMEOUT,
                    });
                }
                // A hint: note it, give back the bytes read past it (the
                // start of the next frame), and read that frame afresh.
                hints[peer] = Some(named);
                let extra = match &r.into {
                    RecvInto::Copy(dst) => &dst[r.got..r.got + body],
                    RecvInto::Reduce { .. } | RecvInto::ReduceFrom { .. } => {
                        &scratch[r.tail..r.tail + body]
                    }
                };
                p.unread(extra);
                r.hdr_got = 0;
                return Ok(true);
            }
            hints[peer] = None;
            if len != expected as u64 {
                return Err(Fault::Protocol {
                    peer,
                    detail: format!("sent a frame of {len} bytes where {expected} were expected"),
                });
            }
            r.checked = true;
        }
        r.got += body;
        if let Some(dtype) = r.into.reduces() {
            let avail = r.tail + body;
            let whole = avail - avail % dtype.size();
            if whole > 0 {
                r.into.absorb(r.got - avail, &scratch[..whole]);
                scratch.copy_within(whole..avail, 0);
            }
            r.tail = avail - whole;
        }
        Ok(true)
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        for p in self.peers.iter().flatten() {
            p.shutdown();
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        "tcp"
    }
    /// `tcp`, or `PARBENCH_WIRE` when the job sets it (scripts/netns.sh sets
    /// `tcp-<rate>`), so runs over a shaped link are their own wire in the
    /// records and the report rather than one more "tcp".
    fn wire(&self) -> String {
        std::env::var("PARBENCH_WIRE")
            .ok()
            .filter(|w| !w.trim().is_empty())
            .unwrap_or_else(|| "tcp".into())
    }

    /// A second full mesh of sockets, met through the job's store under
    /// keys of its own (rank 0's parent transport serves the store); only
    /// a transport that holds the store can make one.
    fn duplicate(&mut self, deadline: Instant) -> CommResult<Option<Box<dyn Transport>>> {
        if let Some(f) = &self.failed {
            return Err(self.failure_error(f, "duplicate"));
        }
        let Some(store) = self.store.as_mut() else {
            return Ok(None);
        };
        self.duplicated += 1;
        let streams = if self.world > 1 {
            mesh::build(&self.info, store, self.duplicated, deadline)?
        } else {
            vec![None]
        };
        let dup = Self::over(&self.info, None, streams, self.settings.clone())?;
        Ok(Some(Box::new(dup)))
    }

    fn link_stats(&self) -> Option<crate::comm::LinkStats> {
        let mut congestion_control: Vec<String> = Vec::new();
        let mut retransmitted_segments = 0;
        for p in self.peers.iter().flatten() {
            let cc = p.congestion().unwrap_or_else(|| "unknown".into());
            if !congestion_control.contains(&cc) {
                congestion_control.push(cc);
            }
            retransmitted_segments += p.retransmits().unwrap_or(0);
        }
        let chosen_by = match &self.congestion {
            Congestion::Auto if self.loopback => format!(
                "{} on loopback, where a pacing one reorders segments across cores (PARBENCH_TCP_CONGESTION=system keeps the system's)",
                peer::LOOPBACK_CONGESTION
            ),
            Congestion::Auto | Congestion::System => "the system's".into(),
            Congestion::Named(n) => format!("PARBENCH_TCP_CONGESTION={n}"),
        };
        Some(crate::comm::LinkStats {
            congestion_control,
            chosen_by,
            retransmitted_segments,
        })
    }

    fn send(&mut self, peer: usize, data: &[u8], deadline: Instant) -> CommResult<()> {
        self.check_peer(peer, "send")?;
        if peer == self.rank {
            self.to_self.push_back(data.to_vec());
            return Ok(());
        }
        self.run(Some(SendOp::new(peer, data)), None, deadline, "send")
    }

    fn recv(&mut self, peer: usize, into: RecvInto<'_>, deadline: Instant) -> CommResult<()> {
        self.check_peer(peer, "recv")?;
        if peer == self.rank {
            return self.take_from_self(into, "recv");
        }
        self.run(None, Some(RecvOp::new(peer, into)), deadline, "recv")
    }

    fn exchange_step(&mut self, step: super::Exchange<'_>, deadline: Instant) -> CommResult<()> {
        let (to, data, from, into) = (step.to, step.data, step.from, step.into);
        self.check_peer(to, "exchange")?;
        self.check_peer(from, "exchange")?;
        let me = self.rank;
        match (to == me, from == me) {
            // Straight across, without a copy through the queue when it is empty.
            (true, true) if self.to_self.is_empty() => into.deliver(me, me, data, "sent itself"),
            (true, true) => {
                self.to_self.push_back(data.to_vec());
                self.take_from_self(into, "exchange")
            }
            (true, false) => {
                self.to_self.push_back(data.to_vec());
                self.run(None, Some(RecvOp::new(from, into)), deadline, "exchange")
            }
            (false, true) => {
                self.take_from_self(into, "exchange")?;
                self.run(Some(SendOp::new(to, data)), None, deadline, "exchange")
            }
            (false, false) => self.run(
                Some(SendOp::new(to, data)),
                Some(RecvOp::new(from, into)),
                deadline,
                "exchange",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_round_trip_and_never_look_like_lengths() {
        for (kind, named) in [(ABORT_LOST, 0), (ABORT_TIMEOUT, 7), (SUSPECT, 65_535)] {
            let h = u64::from_le_bytes(control(kind, named));
            assert!(h & CONTROL != 0);
            assert_eq!(decode(h), (kind, named));
        }
    }

    /// A loopback pair: the default rule gives it the loopback congestion
    /// control, `system` leaves the kernel's, an unknown name is refused
    /// with the variable named, and a fresh connection reports no
    /// retransmitted segment.
    #[test]
    fn loopback_connections_get_the_loopback_congestion_control() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let connect = || {
            let c = std::net::TcpStream::connect(addr).unwrap();
            let (s, _) = l.accept().unwrap();
            (c, s)
        };
        let (c, _s) = connect();
        let p = Peer::new(c, &Congestion::parse(None)).unwrap();
        assert_eq!(p.congestion().as_deref(), Some(peer::LOOPBACK_CONGESTION));
        assert_eq!(p.retransmits(), Some(0));
        let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .ok()
            .map(|s| s.trim().to_string());
        let (c, _s) = connect();
        let p = Peer::new(c, &Congestion::parse(Some("system"))).unwrap();
        if let Some(sys) = system {
            assert_eq!(p.congestion(), Some(sys));
        }
        let (c, _s) = connect();
        let e = Peer::new(c, &Congestion::parse(Some("no-such-cc")))
            .err()
            .expect("an unknown congestion control is refused");
        assert!(e.to_string().contains("PARBENCH_TCP_CONGESTION"), "{e}");
        assert_eq!(
            Congestion::parse(Some(" auto ")),
            Congestion::parse(Some(""))
        );
    }
}
