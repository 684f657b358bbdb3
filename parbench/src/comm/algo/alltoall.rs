//! Pairwise-exchange all-to-all.
//!
//! Structure (p ranks): this rank's own block is copied locally, then p - 1
//! steps: at step s (1..p) a rank sends its block for `rank + s` to that rank
//! while receiving the block from `rank - s`, n/p bytes each way.

use crate::comm::alltoallv::step_peers;
use crate::comm::copy_bytes;
use crate::comm::{CommError, CommResult, RecvInto, Transport, VCounts};
use std::time::Instant;

/// All-to-all of blocks of `block` bytes: block j of `send` goes to rank j,
/// block i of `recv` comes from rank i. `send` and `recv` hold p blocks each
/// (distinct buffers: the caller copies an in-place buffer first).
pub fn all_to_all<T: Transport + ?Sized>(
    t: &mut T,
    send: &[u8],
    recv: &mut [u8],
    block: usize,
    deadline: Instant,
) -> CommResult<()> {
    let (p, r) = (t.world(), t.rank());
    let range = |j: usize| j * block..(j + 1) * block;
    let need = p.saturating_mul(block);
    if send.len() < need || recv.len() < need {
        return Err(CommError::InvalidArgument(format!(
            "all_to_all needs {need} bytes per buffer, got {} and {}",
            send.len(),
            recv.len()
        )));
    }
    copy_bytes(&mut recv[range(r)], &send[range(r)]);
    for s in 1..p {
        let to = (r + s) % p;
        let from = (r + p - s) % p;
        let into = RecvInto::Copy(&mut recv[range(from)]);
        t.exchange(to, &send[range(to)], from, into, deadline)?;
    }
    Ok(())
}

/// All-to-all with per-pair counts of `elem`-byte elements (`counts`, whose
/// buffers the caller checked): the same pairwise exchange, each step's two
/// messages of their own lengths; an empty message is not sent (its
/// receiver expects none), so a step may only send or only receive.
pub fn all_to_all_v<T: Transport + ?Sized>(
    t: &mut T,
    send: &[u8],
    recv: &mut [u8],
    counts: &VCounts,
    elem: usize,
    deadline: Instant,
) -> CommResult<()> {
    let (p, r) = (t.world(), t.rank());
    let bytes = |e: std::ops::Range<usize>| e.start * elem..e.end * elem;
    copy_bytes(
        &mut recv[bytes(counts.recv_range(r))],
        &send[bytes(counts.send_range(r))],
    );
    for s in 1..p {
        let (to, from) = step_peers(r, p, s);
        let data = &send[bytes(counts.send_range(to))];
        let into = &mut recv[bytes(counts.recv_range(from))];
        match (data.is_empty(), into.is_empty()) {
            (false, false) => t.exchange(to, data, from, RecvInto::Copy(into), deadline)?,
            (false, true) => t.send(to, data, deadline)?,
            (true, false) => t.recv(from, RecvInto::Copy(into), deadline)?,
            (true, true) => {}
        }
    }
    Ok(())
}
