//! Ring algorithms: bandwidth-optimal, each rank sends only to `rank + 1` and
//! receives only from `rank - 1`.
//!
//! Structure (p ranks): reduce_scatter and all_gather take p - 1 steps, in
//! each of which every rank sends one block and receives one block;
//! all_reduce is reduce_scatter then all_gather, 2(p - 1) steps of n/p bytes.
//! Messages larger than [`RING_SLICE_BYTES`] per block are cut into slices that
//! run the whole ring one after another, so a slice's blocks stay in cache
//! and large messages stream: a message of n bytes takes
//! `s = ceil(n / (p x RING_SLICE_BYTES))` slices of 2(p - 1) steps each (all_reduce).

use super::{split_two, Blocks, Scratch, RING_SLICE_BYTES};
use crate::comm::copy_bytes;
use crate::comm::{CommError, CommResult, DType, RecvInto, ReduceOp, Transport};
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

/// Ring reduce-scatter that leaves `src` untouched: reduces block `rank` of
/// the p blocks `range(0..p)` of `src` into `out` (the length of block
/// `rank`). The same steps as [`reduce_scatter_blocks`], but each step's
/// partial result lives in one of two halves of `work` (at least twice the
/// largest block), the first step sends straight from `src`, and each step
/// reduces the incoming block with this rank's own block of `src` where it
/// lies ([`RecvInto::ReduceFrom`]): no copy of the input, and a working set
/// that stays in cache.
#[allow(clippy::too_many_arguments)]
pub fn reduce_scatter_blocks_out<T: Transport + ?Sized>(
    t: &mut T,
    src: &[u8],
    range: impl Fn(usize) -> Range<usize>,
    out: &mut [u8],
    work: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> CommResult<()> {
    let (p, r) = (t.world(), t.rank());
    let (next, prev) = neighbours(r, p);
    let half = work.len() / 2;
    let (mut cur, mut nxt) = work.split_at_mut(half);
    let block_of = |j: usize| -> CommResult<&[u8]> {
        src.get(range(j)).ok_or_else(|| {
            CommError::InvalidArgument(format!("block {j} lies outside the send buffer"))
        })
    };
    if p < 2 {
        copy_bytes(out, block_of(r)?);
        return Ok(());
    }
    let mut cur_len = 0;
    for s in 0..p - 1 {
        let send_block = (r + 2 * p - s - 1) % p;
        let recv_block = (r + 2 * p - s - 2) % p;
        let own = block_of(recv_block)?;
        let data: &[u8] = if s == 0 {
            block_of(send_block)?
        } else {
            &cur[..cur_len]
        };
        let acc: &mut [u8] = if s == p - 2 {
            &mut *out
        } else {
            nxt.get_mut(..own.len()).ok_or_else(|| {
                CommError::InvalidArgument("reduce-scatter work area too small".into())
            })?
        };
        if acc.len() != own.len() {
            return Err(CommError::InvalidArgument(format!(
                "output of {} bytes for a block of {}",
                acc.len(),
                own.len()
            )));
        }
        t.exchange(
            next,
            data,
            prev,
            RecvInto::ReduceFrom {
                base: own,
                out: acc,
                dtype,
                op,
            },
            deadline,
        )?;
        cur_len = own.len();
        std::mem::swap(&mut cur, &mut nxt);
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

/// Ring all-reduce into `buf` (whole `dtype` elements), in slices of at most
/// p x [`RING_SLICE_BYTES`]: per slice, reduce-scatter then all-gather over p
/// near-equal blocks (counts that p does not divide give the first blocks
/// one element more). With `src` (out of place, same length as `buf`) the
/// input is read from `src` and left untouched, and `buf`'s contents are
/// ignored; without it `buf` is the input.
pub fn all_reduce<T: Transport + ?Sized>(
    t: &mut T,
    src: Option<&[u8]>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    scratch: &mut Scratch,
    deadline: Instant,
) -> CommResult<()> {
    let p = t.world();
    let elem = dtype.size();
    let count = buf.len() / elem;
    if let Some(src) = src {
        if src.len() != buf.len() {
            return Err(CommError::InvalidArgument(format!(
                "all_reduce send of {} bytes, receive of {}",
                src.len(),
                buf.len()
            )));
        }
        if p < 2 {
            copy_bytes(buf, src);
            return Ok(());
        }
    }
    if p < 2 || count == 0 {
        return Ok(());
    }
    let slice_elems = (p * RING_SLICE_BYTES / elem).max(p);
    let mut first = 0;
    while first < count {
        let n = slice_elems.min(count - first);
        let blocks = Blocks::new(n, p, elem);
        let base = first * elem;
        let range = |j: usize| {
            let r = blocks.range(j);
            base + r.start..base + r.end
        };
        match src {
            Some(src) => {
                let work = scratch.bytes(2 * blocks.range(0).len());
                let out = &mut buf[range(t.rank())];
                reduce_scatter_blocks_out(t, src, range, out, work, dtype, op, deadline)?;
            }
            None => reduce_scatter_blocks(t, buf, range, dtype, op, deadline)?,
        }
        all_gather_blocks(t, buf, range, deadline)?;
        first += n;
    }
    Ok(())
}

/// Runs `step` once per slice of `count` elements per block: slice k covers
/// elements `k x c .. (k + 1) x c` of every block, c = [`RING_SLICE_BYTES`] / elem.
fn per_slice(
    count: usize,
    elem: usize,
    mut step: impl FnMut(&dyn Fn(usize) -> Range<usize>) -> CommResult<()>,
) -> CommResult<()> {
    let chunk = (RING_SLICE_BYTES / elem).max(1);
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

/// Out-of-place ring reduce-scatter with NCCL's layout: `send` holds p
/// blocks of `count` elements (left untouched); `recv` (`count` elements)
/// receives the reduced block `rank`.
#[allow(clippy::too_many_arguments)]
pub fn reduce_scatter_out<T: Transport + ?Sized>(
    t: &mut T,
    send: &[u8],
    recv: &mut [u8],
    count: usize,
    dtype: DType,
    op: ReduceOp,
    scratch: &mut Scratch,
    deadline: Instant,
) -> CommResult<()> {
    let elem = dtype.size();
    let rank = t.rank();
    let chunk = (RING_SLICE_BYTES / elem).max(1);
    let work = scratch.bytes(2 * chunk.min(count) * elem);
    per_slice(count, elem, |range| {
        let mine = range(rank);
        let base = rank * count * elem;
        let out = recv
            .get_mut(mine.start - base..mine.end - base)
            .ok_or_else(|| {
                CommError::InvalidArgument("reduce_scatter receive buffer too small".into())
            })?;
        reduce_scatter_blocks_out(t, send, range, out, work, dtype, op, deadline)
    })
}

/// Ring all-gather with NCCL's layout: `buf` holds p blocks of `count`
/// elements of `elem` bytes. Block `rank` is taken from `own` if given (out
/// of place: copied one slice at a time, just before the slice goes round,
/// so it is in cache when it is sent), else it is already in `buf`;
/// afterwards every block is filled.
pub fn all_gather<T: Transport + ?Sized>(
    t: &mut T,
    own: Option<&[u8]>,
    buf: &mut [u8],
    count: usize,
    elem: usize,
    deadline: Instant,
) -> CommResult<()> {
    let rank = t.rank();
    per_slice(count, elem, |range| {
        if let Some(own) = own {
            let mine = range(rank);
            let base = rank * count * elem;
            let from = mine.start - base..mine.end - base;
            match (buf.get_mut(mine), own.get(from)) {
                (Some(dst), Some(src)) => copy_bytes(dst, src),
                _ => {
                    return Err(CommError::InvalidArgument(
                        "all_gather buffers too small".into(),
                    ))
                }
            }
        }
        all_gather_blocks(t, buf, range, deadline)
    })
}
