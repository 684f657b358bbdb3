//! Rooted algorithms: binomial trees (latency-optimal) and a pipelined chain
//! broadcast (bandwidth-optimal for large messages).
//!
//! Ranks are renumbered relative to the root, `v = (rank - root) mod p`.
//! - Binomial broadcast: ceil(lg p) steps of n bytes; a rank receives from
//!   `v - 2^b` (b = its lowest set bit), then sends to `v + 2^j` for each
//!   j < b (j < ceil(lg p) for the root), largest first.
//! - Binomial reduce: the mirror image: ceil(lg p) steps of n bytes
//!   (each with a reduction); a rank reduces its children's buffers in
//!   order of increasing distance, then sends to `v - 2^b`.
//! - Chain broadcast: the message is cut into c = ceil(n / CHUNK_BYTES)
//!   chunks that flow down the chain 0 -> 1 -> ... -> p-1 (relative ranks),
//!   each rank forwarding chunk i - 1 while receiving chunk i: c + p - 2
//!   steps of CHUNK_BYTES.
//! - Chain reduce: the mirror image, partial results flowing from relative
//!   rank p-1 down to the root: c + p - 2 steps of CHUNK_BYTES, each with
//!   a reduction.

use super::{pull, push, split_two, CHUNK_BYTES};
use crate::comm::{CommResult, DType, RecvInto, ReduceOp, Transport};
use std::ops::Range;
use std::time::Instant;

/// This rank as the trees count it: the world `p`, the rank `v` relative to
/// `root`, and the map from relative ranks back to real ones.
fn relative<T: Transport + ?Sized>(t: &T, root: usize) -> (usize, usize, impl Fn(usize) -> usize) {
    let (p, r) = (t.world(), t.rank());
    (p, (r + p - root) % p, move |v: usize| (v + root) % p)
}

/// How far below relative rank `v` its binomial parent is: `v`'s lowest set
/// bit, and for the root, which has none, the first power of two not below
/// `p`. The children are `v + 2^j` for each `2^j` below it, within `p`.
fn parent_distance(v: usize, p: usize) -> usize {
    if v == 0 {
        p.next_power_of_two()
    } else {
        1 << v.trailing_zeros()
    }
}

/// A chain's view of this rank: the world `p`, the rank `v` relative to
/// the root, the ranks after and before it (`next`, `prev`), and the
/// message's `chunks` and each one's byte range.
struct Chain<F> {
    p: usize,
    v: usize,
    next: usize,
    prev: usize,
    chunks: usize,
    chunk: F,
}

impl Chain<()> {
    /// The chain of `bytes` from `root`; `None` where there is nothing to
    /// move (one rank, or an empty message).
    fn of<T: Transport + ?Sized>(
        t: &T,
        root: usize,
        bytes: usize,
    ) -> Option<Chain<impl Fn(usize) -> Range<usize>>> {
        let (p, v, _) = relative(t, root);
        if p < 2 || bytes == 0 {
            return None;
        }
        let r = t.rank();
        Some(Chain {
            p,
            v,
            next: (r + 1) % p,
            prev: (r + p - 1) % p,
            chunks: bytes.div_ceil(CHUNK_BYTES),
            chunk: move |i: usize| i * CHUNK_BYTES..((i + 1) * CHUNK_BYTES).min(bytes),
        })
    }
}

/// Binomial-tree broadcast of `buf` from `root`.
pub fn broadcast<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    root: usize,
    deadline: Instant,
) -> CommResult<()> {
    let (p, v, real) = relative(t, root);
    let up = parent_distance(v, p);
    if up < p {
        pull(t, real(v - up), RecvInto::Copy(buf), deadline)?;
    }
    let mut mask = up >> 1;
    while mask > 0 {
        if v + mask < p {
            push(t, real(v + mask), buf, deadline)?;
        }
        mask >>= 1;
    }
    Ok(())
}

/// Binomial-tree reduce of every rank's `buf` into `root`'s `buf`. Every
/// rank's `buf` is its accumulator (the caller gives non-roots a copy).
pub fn reduce<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
    deadline: Instant,
) -> CommResult<()> {
    let (p, v, real) = relative(t, root);
    let up = parent_distance(v, p);
    let mut mask = 1;
    while mask < up {
        let child = v | mask;
        if child < p {
            let into = RecvInto::Reduce {
                acc: &mut *buf,
                dtype,
                op,
            };
            pull(t, real(child), into, deadline)?;
        }
        mask <<= 1;
    }
    if up < p {
        push(t, real(v - up), buf, deadline)?;
    }
    Ok(())
}

/// Pipelined chain broadcast of `buf` from `root` in chunks of
/// [`CHUNK_BYTES`]. The first rank after the root acknowledges each chunk
/// with an empty message, so that the root, which has nothing to receive,
/// can still hand each chunk over by rendezvous.
pub fn chain_broadcast<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    root: usize,
    deadline: Instant,
) -> CommResult<()> {
    let Some(Chain {
        p,
        v,
        next,
        prev,
        chunks,
        chunk,
    }) = Chain::of(t, root, buf.len())
    else {
        return Ok(());
    };
    if v == 0 {
        return send_acknowledged(t, next, buf, deadline);
    }
    let has_next = v + 1 < p;
    for i in 0..=chunks {
        let sends = i >= 1 && has_next;
        let recvs = i < chunks;
        match (sends, recvs) {
            (true, true) => {
                let (data, dst) = split_two(buf, chunk(i - 1), chunk(i))?;
                t.exchange(next, data, prev, RecvInto::Copy(dst), deadline)?;
            }
            (false, true) => t.recv(prev, RecvInto::Copy(&mut buf[chunk(i)]), deadline)?,
            (true, false) => t.send(next, &buf[chunk(i - 1)], deadline)?,
            (false, false) => {}
        }
        if recvs && v == 1 {
            t.send(prev, &[], deadline)?;
        }
    }
    Ok(())
}

/// The end of a chain with nothing to receive: sends each chunk of `buf` to
/// `to` and waits for `to`'s empty acknowledgement before the next, so
/// that every hand-over is a rendezvous.
fn send_acknowledged<T: Transport + ?Sized>(
    t: &mut T,
    to: usize,
    buf: &[u8],
    deadline: Instant,
) -> CommResult<()> {
    for part in buf.chunks(CHUNK_BYTES) {
        t.exchange(to, part, to, RecvInto::Copy(&mut []), deadline)?;
    }
    Ok(())
}

/// Pipelined chain reduce of every rank's `buf` into `root`'s, in chunks of
/// [`CHUNK_BYTES`]: the mirror image of [`chain_broadcast`]. Partial sums
/// flow from relative rank p-1 down to the root; each rank reduces chunk i
/// from its successor into its own while passing its finished chunk i - 1
/// on (c + p - 2 steps of CHUNK_BYTES, each with a reduction). The
/// next-to-last rank acknowledges each chunk to the last, which has nothing
/// to receive, so that every hand-over is a rendezvous. Every rank's `buf`
/// is its accumulator (the caller gives non-roots a copy).
pub fn chain_reduce<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
    deadline: Instant,
) -> CommResult<()> {
    let Some(Chain {
        p,
        v,
        // Toward the root, and away from it.
        prev: down,
        next: up,
        chunks,
        chunk,
    }) = Chain::of(t, root, buf.len())
    else {
        return Ok(());
    };
    if v == p - 1 {
        return send_acknowledged(t, down, buf, deadline);
    }
    let sends = v > 0;
    for i in 0..=chunks {
        let send_now = sends && i >= 1;
        let recv_now = i < chunks;
        match (send_now, recv_now) {
            (true, true) => {
                let (data, acc) = split_two(buf, chunk(i - 1), chunk(i))?;
                t.exchange(
                    down,
                    data,
                    up,
                    RecvInto::Reduce { acc, dtype, op },
                    deadline,
                )?;
            }
            (false, true) => {
                let acc = &mut buf[chunk(i)];
                t.recv(up, RecvInto::Reduce { acc, dtype, op }, deadline)?
            }
            (true, false) => t.send(down, &buf[chunk(i - 1)], deadline)?,
            (false, false) => {}
        }
        if recv_now && v == p - 2 {
            t.send(up, &[], deadline)?;
        }
    }
    Ok(())
}
