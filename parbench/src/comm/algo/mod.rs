//! Collective algorithms, each written once over a [`Transport`] and used by
//! every CPU backend.
//!
//! Every function works on byte slices holding whole elements of `dtype`
//! and computes every message length the same way on every rank, as the
//! [`Transport`] contract requires. The step structure of each one (what the
//! alpha-beta formulas in `parbench::model` count) is documented on it and
//! in `docs/comm.md`.
//!
//! Reductions run as `acc = acc op incoming`; `Avg` reduces as a sum here and
//! the caller divides by the world at the end (NCCL's semantics).

pub mod alltoall;
pub mod barrier;
pub mod rd;
pub mod rhd;
pub mod ring;
pub mod tree;

use super::{Algo, Collective, CommError, CommResult, HostBuffer, RecvInto, Transport};
use std::ops::Range;
use std::time::Instant;

/// Bytes per chunk at which the chain broadcast and reduce cut a message,
/// so that the ranks down the chain work on different chunks at once.
pub const CHUNK_BYTES: usize = 128 * 1024;

/// Bytes per block at which the ring algorithms cut large messages into
/// slices that run the ring one after another, so that a step's working set
/// (one block sent, one received and reduced) stays in the caches.
///
/// Larger than [`CHUNK_BYTES`]: every ring step is a lockstep exchange, so a
/// slice pays the wire's latency 2(p - 1) times, and on `tcp` the kernel's
/// socket path costs per exchange too. Measured on this project's 2-core
/// machines, 2 ranks, 64 MiB all_reduce, medians of 5 interleaved runs:
/// `tcp` took 46 ms with 128 KiB slices and 36 ms with 512 KiB; `local`
/// 13.9 ms and 12.9 ms (its 4 MiB all_reduce 338 us and 312 us).
pub const RING_SLICE_BYTES: usize = 512 * 1024;

/// Reusable scratch memory, page aligned like the buffers it works with (see
/// [`HostBuffer`]), so that algorithms that need a second buffer allocate
/// only when a message grows.
#[derive(Default)]
pub struct Scratch {
    buf: HostBuffer,
    /// The scaled copy of an out-of-place input that `MulSum` reduces
    /// (`comm::collective::premul`), kept apart from `buf`, which the
    /// algorithm uses during the same call.
    pub(crate) premul: HostBuffer,
}

impl Scratch {
    /// `bytes` bytes of scratch (contents unspecified).
    pub fn bytes(&mut self, bytes: usize) -> &mut [u8] {
        if self.buf.bytes().len() < bytes {
            self.buf = HostBuffer::zeroed(bytes);
        }
        &mut self.buf.bytes_mut()[..bytes]
    }
}

/// How `count` elements split into `parts` blocks as evenly as possible: the
/// first `count % parts` blocks get one element more. With `count` a multiple
/// of `parts` (reduce_scatter and all_gather) every block has `count / parts`.
#[derive(Clone, Copy, Debug)]
pub struct Blocks {
    base: usize,
    rem: usize,
    elem: usize,
}

impl Blocks {
    /// Blocks of `count` elements of `elem` bytes over `parts` (>= 1) parts.
    pub fn new(count: usize, parts: usize, elem: usize) -> Self {
        let parts = parts.max(1);
        Blocks {
            base: count / parts,
            rem: count % parts,
            elem,
        }
    }

    /// Byte offset where block `j` starts (`j` may be `parts`, the end).
    pub fn start(&self, j: usize) -> usize {
        (j * self.base + j.min(self.rem)) * self.elem
    }

    /// Byte range of block `j`.
    pub fn range(&self, j: usize) -> Range<usize> {
        self.start(j)..self.start(j + 1)
    }

    /// Byte range of blocks `first..first + n`.
    pub fn span(&self, first: usize, n: usize) -> Range<usize> {
        self.start(first)..self.start(first + n)
    }
}

/// A shared view of range `src` and a mutable view of range `dst` of one
/// buffer, for a step that sends one part while receiving into another.
pub fn split_two(
    buf: &mut [u8],
    src: Range<usize>,
    dst: Range<usize>,
) -> CommResult<(&[u8], &mut [u8])> {
    let bad = || {
        CommError::InvalidArgument(format!(
            "send range {src:?} and receive range {dst:?} overlap or leave a buffer of {} bytes",
            buf.len()
        ))
    };
    if src.start > src.end || dst.start > dst.end || src.end.max(dst.end) > buf.len() {
        return Err(bad());
    }
    if src.end <= dst.start {
        let (lo, hi) = buf.split_at_mut(dst.start);
        Ok((&lo[src.clone()], &mut hi[..dst.end - dst.start]))
    } else if dst.end <= src.start {
        let (lo, hi) = buf.split_at_mut(src.start);
        Ok((&hi[..src.end - src.start], &mut lo[dst.clone()]))
    } else {
        Err(bad())
    }
}

/// Sends `data` to `peer`, which takes it with [`pull`]; returns once the
/// peer has it. Built on `exchange` so that the shared-memory transport hands
/// the bytes over with a single copy.
pub fn push<T: Transport + ?Sized>(
    t: &mut T,
    peer: usize,
    data: &[u8],
    deadline: Instant,
) -> CommResult<()> {
    t.exchange(peer, data, peer, RecvInto::Copy(&mut []), deadline)
}

/// Receives what `peer` sends with [`push`].
pub fn pull<T: Transport + ?Sized>(
    t: &mut T,
    peer: usize,
    into: RecvInto<'_>,
    deadline: Instant,
) -> CommResult<()> {
    t.exchange(peer, &[], peer, into, deadline)
}

/// Largest power of two not above `p` (`p >= 1`).
pub fn pow2_floor(p: usize) -> usize {
    if p == 0 {
        1
    } else {
        1 << (usize::BITS - 1 - p.leading_zeros())
    }
}

/// Smallest `k` with `2^k >= p`.
pub fn ceil_log2(p: usize) -> u32 {
    p.max(1).next_power_of_two().trailing_zeros()
}

/// Largest all_reduce (bytes per rank) that `auto` runs with recursive
/// doubling: below it the lg p steps of whole messages beat the ring's
/// 2(p - 1) steps.
pub const AUTO_RD_MAX_BYTES: usize = 16 * 1024;

/// Largest all_reduce that `auto` runs with halving-doubling on more than two
/// ranks (same bytes as the ring in fewer steps, but whole-window messages
/// that stop fitting in cache above this).
pub const AUTO_RHD_MAX_BYTES: usize = 1024 * 1024;

/// Smallest broadcast or reduce that `auto` pipelines along a chain (with
/// three or more ranks); below it the binomial tree's ceil(lg p) steps win.
pub const AUTO_CHAIN_MIN_BYTES: usize = 256 * 1024;

/// The concrete algorithm a collective runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// [`ring`]: reduce-scatter / all-gather rings, sliced.
    Ring,
    /// [`tree`]: binomial trees (all_reduce = reduce to 0 + broadcast from 0).
    Tree,
    /// [`rd`]: recursive doubling.
    RecursiveDoubling,
    /// [`rhd`]: recursive halving-doubling (Rabenseifner).
    HalvingDoubling,
    /// [`tree::chain_broadcast`], [`tree::chain_reduce`]: pipelined chain.
    Chain,
    /// [`alltoall`]: pairwise exchange.
    Pairwise,
    /// A single point-to-point transfer.
    PointToPoint,
}

impl Algorithm {
    /// The name recorded with each measurement.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::RecursiveDoubling => "rd",
            Algorithm::HalvingDoubling => "rhd",
            Algorithm::Chain => "chain",
            Algorithm::Pairwise => "pairwise",
            Algorithm::PointToPoint => "p2p",
        }
    }

    /// What runs for `coll` of `bytes` per-rank send bytes on `world` ranks
    /// when the user asked for `algo`: the collective's own choice (its
    /// file's `Spec::choose`).
    pub fn choose(coll: Collective, algo: Algo, world: usize, bytes: usize) -> Algorithm {
        coll.spec().choose(algo, world, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_count_in_order() {
        for count in [0usize, 1, 7, 8, 13] {
            for parts in 1..=8 {
                let b = Blocks::new(count, parts, 4);
                assert_eq!(b.start(0), 0);
                assert_eq!(b.start(parts), count * 4);
                for j in 0..parts {
                    let len = b.range(j).len() / 4;
                    assert!(len == count / parts || len == count / parts + 1);
                }
            }
        }
    }

    #[test]
    fn split_two_rejects_overlap() {
        let mut buf = vec![0u8; 10];
        assert!(split_two(&mut buf, 0..4, 4..8).is_ok());
        assert!(split_two(&mut buf, 6..8, 0..6).is_ok());
        assert!(split_two(&mut buf, 0..5, 4..8).is_err());
        assert!(split_two(&mut buf, 0..5, 8..11).is_err());
        let (s, d) = split_two(&mut buf, 3..3, 3..3).unwrap();
        assert!(s.is_empty() && d.is_empty());
    }

    #[test]
    fn powers_of_two() {
        assert_eq!(pow2_floor(1), 1);
        assert_eq!(pow2_floor(6), 4);
        assert_eq!(pow2_floor(8), 8);
        assert_eq!(ceil_log2(1), 0);
        assert_eq!(ceil_log2(5), 3);
        assert_eq!(ceil_log2(8), 3);
    }
}
