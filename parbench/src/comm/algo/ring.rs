//! Ring algorithms: bandwidth-optimal, each rank sends only to `rank + 1` and
//! receives only from `rank - 1`.
//!
//! Structure (p ranks): reduce_scatter and all_gather take p - 1 steps, in
//! each of which every rank sends one block and receives one block;
//! all_reduce is reduce_scatter then all_gather, 2(p - 1) steps of n/p bytes.
//! Messages larger than [`CHUNK_BYTES`] per block are cut into slices that
//! run the whole ring one after another, so a slice's blocks stay in cache
//! and large messages stream: a message of n bytes takes
//! `s = ceil(n / (p x CHUNK_BYTES))` slices of 2(p - 1) steps each (all_reduce).

use super::{split_two, Blocks, CHUNK_BYTES};
use crate::comm::{CommResult, DType, RecvInto, ReduceOp, Transport};
use std::ops::Range;
use std::time::Instant;

fn neighbours(rank: usize, p: usize) -> (usize, usize) {
    ((rank + 1) % p, (rank + p - 1) % p)
}

/// Ring reduce-scatter over the p blocks `range(0..p)` of `buf`: afterwards
/// block `rank` holds the reduction of every rank's block `rank`.
///
/// Step s (0..p-1): send block (rank - s - 1) mod p to rank + 1, receive
/// block (rank - s - 2) mod p from rank - 1 and reduce it into ours.
pub fn reduce_scatter_blocks<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    range: impl Fn(usize) -> Range<usize>,
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> CommResult<()> {
    let (p, r) = (t.world(), t.rank());
    let (next, prev) = neighbours(r, p);
    for s in 0..p.saturating_sub(1) {
        let send_block = (r + 2 * p - s - 1) % p;
        let recv_block = (r + 2 * p - s - 2) % p;
        let (data, acc) = split_two(buf, range(send_block), range(recv_block))?;
        t.exchange(
            next,
            data,
            prev,
            RecvInto::Reduce { acc, dtype, op },
            deadline,
        )?;
    }
    Ok(())
}

/// Ring all-gather over the p blocks `range(0..p)` of `buf`, where block
/// `rank` already holds this rank's contribution.
///
/// Step s (0..p-1): send block (rank - s) mod p to rank + 1, receive block
/// (rank - s - 1) mod p from rank - 1.
pub fn all_gather_blocks<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    range: impl Fn(usize) -> Range<usize>,
    deadline: Instant,
) -> CommResult<()> {
    let (p, r) = (t.world(), t.rank());
    let (next, prev) = neighbours(r, p);
    for s in 0..p.saturating_sub(1) {
        let send_block = (r + p - s) % p;
        let recv_block = (r + 2 * p - s - 1) % p;
        let (data, dst) = split_two(buf, range(send_block), range(recv_block))?;
        t.exchange(next, data, prev, RecvInto::Copy(dst), deadline)?;
    }
    Ok(())
}

/// Ring all-reduce of the whole of `buf` (whole `dtype` elements), in slices
/// of at most p x [`CHUNK_BYTES`]: per slice, reduce-scatter then all-gather
/// over p near-equal blocks (counts that p does not divide give the first
/// blocks one element more).
pub fn all_reduce<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> CommResult<()> {
    let p = t.world();
    let elem = dtype.size();
    let count = buf.len() / elem;
    if p < 2 || count == 0 {
        return Ok(());
    }
    let slice_elems = (p * CHUNK_BYTES / elem).max(p);
    let mut first = 0;
    while first < count {
        let n = slice_elems.min(count - first);
        let blocks = Blocks::new(n, p, elem);
        let base = first * elem;
        let range = |j: usize| {
            let r = blocks.range(j);
            base + r.start..base + r.end
        };
        reduce_scatter_blocks(t, buf, range, dtype, op, deadline)?;
        all_gather_blocks(t, buf, range, deadline)?;
        first += n;
    }
    Ok(())
}

/// Runs `step` once per slice of `count` elements per block: slice k covers
/// elements `k x c .. (k + 1) x c` of every block, c = [`CHUNK_BYTES`] / elem.
fn per_slice(
    count: usize,
    elem: usize,
    mut step: impl FnMut(&dyn Fn(usize) -> Range<usize>) -> CommResult<()>,
) -> CommResult<()> {
    let chunk = (CHUNK_BYTES / elem).max(1);
    let mut first = 0;
    while first < count {
        let n = chunk.min(count - first);
        let range = move |j: usize| {
            let start = (j * count + first) * elem;
            start..start + n * elem
        };
        step(&range)?;
        first += n;
    }
    Ok(())
}

/// Ring reduce-scatter with NCCL's layout: `buf` holds p blocks of `count`
/// elements; afterwards block `rank` holds the reduced block.
pub fn reduce_scatter<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    count: usize,
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> CommResult<()> {
    per_slice(count, dtype.size(), |range| {
        reduce_scatter_blocks(t, buf, range, dtype, op, deadline)
    })
}

/// Ring all-gather with NCCL's layout: `buf` holds p blocks of `count`
/// elements of `elem` bytes, block `rank` filled; afterwards all are.
pub fn all_gather<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    count: usize,
    elem: usize,
    deadline: Instant,
) -> CommResult<()> {
    per_slice(count, elem, |range| {
        all_gather_blocks(t, buf, range, deadline)
    })
}
