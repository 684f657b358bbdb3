//! Sub-groups: a communicator over a subset of a communicator's ranks, as
//! NCCL's `ncclCommSplit` and MPI's `MPI_Comm_split` make them. Every rank
//! of the parent calls [`split`] with a colour (or `None` to stay out) and
//! a key; the ranks of one colour form a group, ordered by key, then by
//! parent rank. A dp x tp x pp mesh is three splits of the world.
//!
//! One construction serves every backend: the group's point-to-point
//! transport is the parent's `send`, `recv` and `send_recv` addressed to
//! the members' parent ranks ([`Subset`]), and the group's collectives are
//! the host algorithms of [`super::algo`] over it ([`HostComm`]). On local,
//! tcp and mpi that is the parent's own wire; on nccl each message is
//! staged through a device buffer of the parent's (correct, with a host
//! copy per message: it is not NCCL's own split communicator).
//!
//! The group borrows its parent mutably: while it lives, the parent is not
//! used, so the messages of one pair of ranks stay in order. Errors name
//! the peers' parent ranks (the ranks the user sees in the job).

use super::{
    nbytes, Algo, CollArgs, Collective, CommBuffer, CommError, CommResult, Communicator, DType,
    Exchange, HostBuffer, HostComm, Io, LinkStats, RecvInto, Transport, VCounts,
};
use std::time::{Duration, Instant};

/// One rank's place in its group: the members' parent ranks, in group
/// order, and this rank's index among them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Members {
    /// Parent rank of each group rank.
    pub ranks: Vec<usize>,
    /// This rank's group rank.
    pub me: usize,
}

impl Members {
    /// The group of parent rank `rank` given every parent rank's
    /// `(colour, key)`, or `None` when its colour is `None`.
    pub fn of(choices: &[(Option<u32>, u32)], rank: usize) -> Option<Members> {
        let colour = choices.get(rank)?.0?;
        let mut ranks: Vec<usize> = (0..choices.len())
            .filter(|&r| choices[r].0 == Some(colour))
            .collect();
        ranks.sort_by_key(|&r| (choices[r].1, r));
        let me = ranks.iter().position(|&r| r == rank)?;
        Some(Members { ranks, me })
    }
}

/// A communicator over a group of a parent's ranks.
pub type Group<'a, C> = HostComm<Subset<'a, C>>;

/// Splits `parent` into groups by colour (a collective: every rank of the
/// parent calls it). Returns this rank's group, or `None` when `colour`
/// is `None`. The group's collectives choose their algorithms by `algo`
/// and wait as long as the parent's timeout.
pub fn split<C: Communicator>(
    parent: &mut C,
    colour: Option<u32>,
    key: u32,
    algo: Algo,
) -> CommResult<Option<Group<'_, C>>> {
    let choices = exchange_choices(parent, colour, key)?;
    let Some(members) = Members::of(&choices, parent.rank()) else {
        return Ok(None);
    };
    Ok(Some(group_of(parent, members, algo)))
}

/// The group of `members` over `parent`, waiting as long as the parent.
fn group_of<C: Communicator>(parent: &mut C, members: Members, algo: Algo) -> Group<'_, C> {
    let timeout = parent.timeout();
    let subset = Subset {
        parent,
        members,
        parent_timeout: timeout,
        send_stage: None,
        recv_stage: None,
    };
    HostComm::new(subset, algo, timeout)
}

/// Runs `coll` on `comm` with the collective's host algorithm (its file's
/// `Spec::host`, chosen by `auto`) over `comm`'s own point-to-point calls:
/// a [`Subset`] of every rank, the buffers staged through host memory. How
/// NCCL and MPI run a collective their library has no call for; every
/// rank calls it. Errors are the host algorithm's (naming the buffer).
pub fn run_over_point_to_point<C: Communicator>(
    comm: &mut C,
    coll: Collective,
    io: Io<'_, C::Buffer>,
    args: CollArgs,
) -> CommResult<()> {
    let world = comm.world();
    let send_bytes = nbytes(args.count, coll.send_blocks(world), args.dtype)?;
    let recv_bytes = nbytes(args.count, coll.recv_blocks(world), args.dtype)?;
    let members = Members {
        ranks: (0..world).collect(),
        me: comm.rank(),
    };
    // Device work on the buffers finishes before their bytes are read.
    comm.sync()?;
    match io {
        Io::InPlace(b) => {
            let mut host = to_host(b, send_bytes.max(recv_bytes))?;
            group_of(comm, members, Algo::Auto).collective(coll, Io::InPlace(&mut host), args)?;
            b.write_from_host(host.bytes())
        }
        Io::OutOfPlace { send, recv } => {
            let send = to_host(send, send_bytes)?;
            let mut host = to_host(recv, recv_bytes)?;
            let io = Io::OutOfPlace {
                send: &send,
                recv: &mut host,
            };
            group_of(comm, members, Algo::Auto).collective(coll, io, args)?;
            recv.write_from_host(host.bytes())
        }
    }
}

/// [`Communicator::all_to_all_v`] with the host's pairwise exchange over
/// `comm`'s own point-to-point calls, staged through host memory as
/// [`run_over_point_to_point`] stages a collective: what a communicator
/// without a call of its own runs. Every rank calls it.
pub fn all_to_all_v_over_point_to_point<C: Communicator>(
    comm: &mut C,
    send: &C::Buffer,
    recv: &mut C::Buffer,
    counts: &VCounts,
    dtype: DType,
) -> CommResult<()> {
    let world = comm.world();
    counts.check(world, dtype, send.len_bytes(), recv.len_bytes())?;
    let members = Members {
        ranks: (0..world).collect(),
        me: comm.rank(),
    };
    // Device work on the buffers finishes before their bytes are read.
    comm.sync()?;
    let host_send = to_host(send, counts.send_total() * dtype.size())?;
    let mut host_recv = to_host(recv, counts.recv_total() * dtype.size())?;
    group_of(comm, members, Algo::Auto).all_to_all_v(&host_send, &mut host_recv, counts, dtype)?;
    recv.write_from_host(host_recv.bytes())
}

/// A host copy of `b`'s first `bytes` bytes (fewer when `b` is shorter:
/// the host algorithm then rejects it with its own message), so that the
/// bytes the call does not write go back as they were.
fn to_host<B: CommBuffer>(b: &B, bytes: usize) -> CommResult<HostBuffer> {
    let mut host = HostBuffer::zeroed(bytes.min(b.len_bytes()));
    b.read_to_host(host.bytes_mut())?;
    Ok(host)
}

/// Every parent rank's `(colour, key)`, by an all-gather over the parent.
fn exchange_choices<C: Communicator>(
    parent: &mut C,
    colour: Option<u32>,
    key: u32,
) -> CommResult<Vec<(Option<u32>, u32)>> {
    // Colour 0 on the wire is "none"; colour c travels as c + 1.
    let mine = [colour.map_or(0, |c| c as i64 + 1), key as i64];
    let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut send = parent.alloc(16)?;
    send.write_from_host(&bytes)?;
    let world = parent.world();
    let mut recv = parent.alloc(16 * world)?;
    parent.all_gather(
        Io::OutOfPlace {
            send: &send,
            recv: &mut recv,
        },
        2,
        DType::I64,
    )?;
    parent.sync()?;
    let mut all = vec![0u8; 16 * world];
    recv.read_to_host(&mut all)?;
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&all[at..at + 8]);
        i64::from_le_bytes(b)
    };
    (0..world)
        .map(|r| {
            let (c, k) = (word(16 * r), word(16 * r + 8));
            let colour = match c {
                0 => None,
                c => Some(u32::try_from(c - 1).map_err(|_| bad_choice(r))?),
            };
            Ok((colour, u32::try_from(k).map_err(|_| bad_choice(r))?))
        })
        .collect()
}

fn bad_choice(rank: usize) -> CommError {
    CommError::Protocol {
        rank,
        peer: rank,
        detail: "a colour or key out of range in the split".into(),
    }
}

/// The transport of a group: the parent's point-to-point calls, to the
/// members' parent ranks.
pub struct Subset<'a, C: Communicator> {
    parent: &'a mut C,
    members: Members,
    /// Restored when the group ends (each call sets the parent's timeout
    /// to what is left of the group call's deadline).
    parent_timeout: Duration,
    /// Staging buffers of the parent's kind, kept between messages.
    send_stage: Option<C::Buffer>,
    recv_stage: Option<C::Buffer>,
}

impl<C: Communicator> Subset<'_, C> {
    /// The members' parent ranks, in group order.
    pub fn members(&self) -> &Members {
        &self.members
    }

    fn parent_rank(&self, peer: usize) -> CommResult<usize> {
        self.members.ranks.get(peer).copied().ok_or_else(|| {
            CommError::InvalidArgument(format!(
                "group rank {peer} out of range for a group of {}",
                self.members.ranks.len()
            ))
        })
    }

    /// Gives the parent what is left until `deadline` (at least a
    /// millisecond, so that a wait past it still fails as a timeout).
    fn until(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        self.parent.set_timeout(left.max(Duration::from_millis(1)));
    }

    /// The staging buffer `which` with at least `bytes` bytes.
    fn stage(parent: &C, slot: &mut Option<C::Buffer>, bytes: usize) -> CommResult<()> {
        if slot.as_ref().is_none_or(|b| b.len_bytes() < bytes) {
            *slot = Some(parent.alloc(bytes.max(8))?);
        }
        Ok(())
    }

    fn fill_send(&mut self, data: &[u8]) -> CommResult<()> {
        Self::stage(self.parent, &mut self.send_stage, data.len())?;
        let buf = self.send_stage.as_mut().expect("staged above");
        // The buffer may be longer: the message is its first bytes.
        if !data.is_empty() {
            buf.write_from_host(data)?;
        }
        Ok(())
    }

    fn drain_recv(&mut self, mut into: RecvInto<'_>) -> CommResult<()> {
        let n = into.len();
        if n == 0 {
            return Ok(());
        }
        let buf = self.recv_stage.as_ref().expect("staged before the receive");
        let mut piece = vec![0u8; n];
        buf.read_to_host(&mut piece)?;
        into.absorb(0, &piece);
        Ok(())
    }
}

impl<C: Communicator> Drop for Subset<'_, C> {
    fn drop(&mut self) {
        self.parent.set_timeout(self.parent_timeout);
    }
}

impl<C: Communicator> Transport for Subset<'_, C> {
    fn rank(&self) -> usize {
        self.members.me
    }

    fn world(&self) -> usize {
        self.members.ranks.len()
    }

    fn backend(&self) -> &'static str {
        self.parent.backend()
    }

    fn wire(&self) -> String {
        self.parent.wire()
    }

    fn send(&mut self, peer: usize, data: &[u8], deadline: Instant) -> CommResult<()> {
        let to = self.parent_rank(peer)?;
        self.until(deadline);
        self.fill_send(data)?;
        let buf = self.send_stage.as_ref().expect("staged above");
        self.parent.send(buf, data.len(), DType::U8, to)?;
        self.parent.sync()
    }

    fn recv(&mut self, peer: usize, into: RecvInto<'_>, deadline: Instant) -> CommResult<()> {
        let from = self.parent_rank(peer)?;
        self.until(deadline);
        let n = into.len();
        Self::stage(self.parent, &mut self.recv_stage, n)?;
        let buf = self.recv_stage.as_mut().expect("staged above");
        self.parent.recv(buf, n, DType::U8, from)?;
        self.parent.sync()?;
        self.drain_recv(into)
    }

    fn exchange_step(&mut self, step: Exchange<'_>, deadline: Instant) -> CommResult<()> {
        let (to, data, from, into) = (step.to, step.data, step.from, step.into);
        let (to, from) = (self.parent_rank(to)?, self.parent_rank(from)?);
        self.until(deadline);
        // One count for both directions (the parent's send_recv): the
        // algorithms send and receive blocks of one length, and when they
        // differ the two halves go as a send and a receive.
        if data.len() != into.len() {
            self.fill_send(data)?;
            let buf = self.send_stage.as_ref().expect("staged above");
            self.parent.send(buf, data.len(), DType::U8, to)?;
            let n = into.len();
            Self::stage(self.parent, &mut self.recv_stage, n)?;
            let rbuf = self.recv_stage.as_mut().expect("staged above");
            self.parent.recv(rbuf, n, DType::U8, from)?;
            self.parent.sync()?;
            return self.drain_recv(into);
        }
        self.fill_send(data)?;
        Self::stage(self.parent, &mut self.recv_stage, into.len())?;
        let sbuf = self.send_stage.as_ref().expect("staged above");
        let rbuf = self.recv_stage.as_mut().expect("staged above");
        self.parent
            .send_recv(sbuf, to, rbuf, from, data.len(), DType::U8)?;
        self.parent.sync()?;
        self.drain_recv(into)
    }

    fn link_stats(&self) -> Option<LinkStats> {
        self.parent.link_stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_by_colour_then_key_then_rank() {
        let choices = [
            (Some(0), 0),
            (Some(1), 0),
            (Some(0), 0),
            (None, 0),
            (Some(1), 0),
        ];
        assert_eq!(
            Members::of(&choices, 2),
            Some(Members {
                ranks: vec![0, 2],
                me: 1
            })
        );
        assert_eq!(
            Members::of(&choices, 4),
            Some(Members {
                ranks: vec![1, 4],
                me: 1
            })
        );
        assert_eq!(Members::of(&choices, 3), None);
        // A key reorders the group.
        let keyed = [(Some(0), 5), (Some(0), 1), (Some(0), 3)];
        assert_eq!(Members::of(&keyed, 0).unwrap().ranks, vec![1, 2, 0]);
    }
}
