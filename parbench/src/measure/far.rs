//! Receiving into a destination this rank last wrote a whole call ago, by
//! the destination's size: the all-gather steps of sliced rings; and the
//! copy of an out-of-place all-gather's own block into it, slice by slice
//! (`Pattern::OwnBlock`).
//!
//! The cache-state ladders (`pull`, `both`) receive into one buffer again
//! and again, so the destination's lines are still in the receiving core's
//! cache when it writes them. A ring that runs a message as slices writes
//! each destination block once per call: by then a whole call of traffic
//! has passed through the core's cache, the lines are gone from it, and
//! each one is fetched before it is written (and, where the peer read the
//! block this slice, taken from the peer's cache). Timed step by step on
//! the Intel Xeon VM (2 MiB L2 per core), 2 ranks: the all-gather steps of
//! an in-place all_reduce of 2-16 MiB moved 10.2-11.0 GB/s where `both`
//! read 14.6-15.7 and the in-place pattern here 10.7-11.2; out of place
//! 12.0-12.8 GB/s where `pull` near the slice read 15-17, and 14.5 (16
//! MiB) with no reduce-scatter step between them: the step that fills the
//! block beside the destination is part of the pattern, and the
//! out-of-place one here has it (12.1-13.2 GB/s at 2-16 MiB). The same
//! holds in place past the last-level cache: on the EPYC VM (32 MiB L3)
//! the in-place ring's all-gather steps of 16-64 MiB moved 34-21 GB/s
//! where this pattern with a copy as its untimed step read 44-41, so the
//! untimed step is now the ring's reduce-scatter step (docs/model.md).

use super::fused::every_rank_has_transport;
use super::ladder::{
    best_and_median, less_latency, mean_over_ranks, median_empty_exchange, rungs_of,
    sample_long_enough, BIG_SAMPLES, SAMPLES, SAMPLE_BYTES,
};
use crate::comm::algo::RING_SLICE_BYTES;
use crate::comm::{
    copy_bytes, CommError, CommResult, Communicator, DType, HostBuffer, RecvInto, ReduceOp,
    Transport,
};
use crate::model::wire::Ladder;
use std::time::Instant;

/// Untimed walks through a rung's destination before its samples (one
/// from [`SAMPLE_BYTES`] up: those walks are most of the ladder's time).
const WARM_WALKS: usize = 2;

/// The block a rung's destination area is walked in: a ring's slice block,
/// at most half the area.
fn block_of(area: usize) -> usize {
    RING_SLICE_BYTES.min(area / 2).max(1)
}

/// Which sliced ring's all-gather step a ladder times.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pattern {
    /// In place: per pair of destination blocks, the untimed step is the
    /// ring's reduce-scatter step (sends the pair's first block, which the
    /// peer reads, and reduces the peer's into the second); the timed one
    /// sends the second, just reduced, and receives the peer's into the
    /// first.
    InPlace,
    /// Out of place: per pair of destination blocks, the untimed step
    /// sends the source area's block (an input never rewritten) and
    /// receives the peer's into the pair's first block; the timed one
    /// sends that block, just written, and receives into the second, which
    /// nobody read.
    OutOfPlace,
    /// An out-of-place all-gather's own block: per pair of destination
    /// blocks, the timed part copies the source area's next block (an
    /// input never rewritten) into the pair's first block, which the peer
    /// read a walk ago; the untimed step sends that block, just written,
    /// and receives the peer's into the second. What is timed is the copy,
    /// slice by slice as the ring copies it (`comm/algo/ring.rs`).
    OwnBlock,
}

/// A rung's buffers: the destination area and, out of place, a source
/// area as large as the destination (for the own block, half of it: one
/// block per pair).
struct Area {
    dest: HostBuffer,
    src: HostBuffer,
}

/// One walk through the area, block by block, in `pattern`'s steps.
/// Returns the timed seconds and steps.
fn walk(
    t: &mut dyn Transport,
    a: &mut Area,
    block: usize,
    pattern: Pattern,
    deadline: Instant,
) -> CommResult<(f64, usize)> {
    let (p, r) = (t.world(), t.rank());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let (mut secs, mut steps) = (0.0, 0);
    let len = a.dest.bytes().len();
    for start in (0..len).step_by(2 * block) {
        let k = start..(start + block).min(len);
        let n = k.len();
        let second = k.end..(k.end + n).min(len);
        if second.len() != n {
            break;
        }
        let timed = match pattern {
            Pattern::InPlace => {
                let (first, rest) = a.dest.bytes_mut().split_at_mut(k.end);
                let into = RecvInto::Reduce {
                    acc: &mut rest[..n],
                    dtype: DType::F32,
                    op: ReduceOp::Max,
                };
                t.exchange(right, &first[k.clone()], left, into, deadline)?;
                let t0 = Instant::now();
                let (first, rest) = a.dest.bytes_mut().split_at_mut(k.end);
                let into = RecvInto::Copy(&mut first[k]);
                t.exchange(right, &rest[..n], left, into, deadline)?;
                t0.elapsed()
            }
            Pattern::OutOfPlace => {
                let into = RecvInto::Copy(&mut a.dest.bytes_mut()[k.clone()]);
                t.exchange(right, &a.src.bytes()[k.clone()], left, into, deadline)?;
                let t0 = Instant::now();
                let (first, rest) = a.dest.bytes_mut().split_at_mut(k.end);
                let into = RecvInto::Copy(&mut rest[..n]);
                t.exchange(right, &first[k], left, into, deadline)?;
                t0.elapsed()
            }
            Pattern::OwnBlock => {
                let from = start / 2..start / 2 + n;
                let t0 = Instant::now();
                copy_bytes(&mut a.dest.bytes_mut()[k.clone()], &a.src.bytes()[from]);
                let copied = t0.elapsed();
                let (first, rest) = a.dest.bytes_mut().split_at_mut(k.end);
                let into = RecvInto::Copy(&mut rest[..n]);
                t.exchange(right, &first[k], left, into, deadline)?;
                copied
            }
        };
        secs += timed.as_secs_f64();
        steps += 1;
    }
    Ok((secs, steps))
}

/// Each sample of one rung (an area of `area` bytes, a sample walking it
/// until [`SAMPLE_BYTES`] have moved) as its timed seconds, timed steps
/// and received bytes, after [`WARM_WALKS`] untimed walks; [`SAMPLES`]
/// samples ([`BIG_SAMPLES`] from [`SAMPLE_BYTES`] up).
fn rung<C: Communicator>(
    comm: &mut C,
    area: usize,
    pattern: Pattern,
) -> CommResult<Vec<(f64, usize, usize)>> {
    let backend = comm.backend();
    let no_transport = move || {
        CommError::Unsupported(format!(
            "backend {backend} has no host transport to time a far receive on"
        ))
    };
    let block = block_of(area);
    let written = |len: usize, v: u8| {
        let mut h = HostBuffer::zeroed(len);
        h.bytes_mut().fill(v);
        h
    };
    // Written, not left zeroed: a page never written reads the kernel's
    // one zero page, in cache whatever the area.
    let mut a = Area {
        dest: written(area, 0x5a),
        src: written(
            match pattern {
                Pattern::OutOfPlace => area,
                Pattern::OwnBlock => area / 2,
                Pattern::InPlace => 0,
            },
            0x3c,
        ),
    };
    let timeout = comm.timeout();
    let mut one = |comm: &mut C| -> CommResult<(f64, usize)> {
        let deadline = Instant::now() + timeout;
        let t = comm.host_transport().ok_or_else(no_transport)?;
        walk(t, &mut a, block, pattern, deadline)
    };
    let big = area as u64 >= SAMPLE_BYTES;
    for _ in 0..if big { 1 } else { WARM_WALKS } {
        one(comm)?;
    }
    let walks = SAMPLE_BYTES.div_ceil(area as u64).max(1) as usize;
    let samples = if big { BIG_SAMPLES } else { SAMPLES };
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        comm.barrier()?;
        let start = Instant::now();
        let (mut secs, mut steps, mut done) = (0.0, 0, 0);
        while done < walks {
            let (s, n) = one(comm)?;
            secs += s;
            steps += n;
            done += 1;
            if sample_long_enough(comm, start)? {
                break;
            }
        }
        out.push((secs, steps, steps * block));
    }
    Ok(out)
}

/// The two far-destination receives and the own block's copy, each a
/// [`Ladder`] by the destination's bytes per rank (the call's receive
/// buffer), GB/s of received (copied) bytes per rank.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FarLadders {
    /// A sliced in-place ring's all-gather step: into a block the peer has
    /// just read.
    pub both: Ladder,
    /// A sliced out-of-place ring's: into a block nobody read, each after
    /// a step that received the peer's input into the block beside it (the
    /// source area is as large as the destination).
    pub pull: Ladder,
    /// A sliced out-of-place all-gather's copy of its own block into the
    /// receive buffer, whose lines the peer read a call ago
    /// ([`Pattern::OwnBlock`]; measured on shared memory only: a socket's
    /// peer reads the block through the kernel, not from this rank's cache).
    #[serde(default)]
    pub claim: Ladder,
}

/// The [`FarLadders`] at `areas` (each a rung's destination bytes per
/// rank): every rank sending to its right neighbour while it receives from
/// its left, walking its destination area in blocks of at most a slice
/// block, each timed receive after an untimed step as the ring's
/// reduce-scatter leaves the lines ([`Pattern`]). Best of [`SAMPLES`],
/// mean over ranks. `None` with one rank or where some rank has no host
/// transport. Every rank must call it with the same `areas`.
pub fn far_ladders<C: Communicator>(comm: &mut C, areas: &[u64]) -> CommResult<Option<FarLadders>> {
    far_ladders_of(comm, areas, FarWanted::ALL)
}

/// Which of the [`FarLadders`] to measure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FarWanted {
    pub both: bool,
    pub pull: bool,
    pub claim: bool,
}

impl FarWanted {
    /// The two far receives: what a socket's model reads.
    pub const RECEIVES: FarWanted = FarWanted {
        both: true,
        pull: true,
        claim: false,
    };
    /// Every pattern: shared memory's model also reads the own block's copy.
    pub const ALL: FarWanted = FarWanted {
        both: true,
        pull: true,
        claim: true,
    };
}

/// [`far_ladders`], measuring only the ladders `wanted` names (the others
/// left empty): a row that reads one of them pays for that one alone.
pub fn far_ladders_of<C: Communicator>(
    comm: &mut C,
    areas: &[u64],
    wanted: FarWanted,
) -> CommResult<Option<FarLadders>> {
    if comm.world() < 2 || !every_rank_has_transport(comm)? {
        return Ok(None);
    }
    let mut empty = median_empty_exchange(comm, false)?;
    let mut ladder = |pattern: Pattern| -> CommResult<Vec<(f64, f64)>> {
        let mut figures = Vec::with_capacity(areas.len());
        for &area in areas {
            let samples = rung(comm, area.max(4) as usize, pattern)?;
            // The smaller of the empty exchanges timed just before and
            // just after the rung, as the other ladders take it; the own
            // block's timed copies hold no exchange.
            let after = median_empty_exchange(comm, false)?;
            let e = if pattern == Pattern::OwnBlock {
                0.0
            } else {
                empty.min(after)
            };
            empty = after;
            let secs = samples
                .into_iter()
                .map(|(raw, steps, bytes)| less_latency(raw, steps, e) / bytes.max(1) as f64)
                .collect();
            figures.push(best_and_median(secs, 1.0));
        }
        mean_over_ranks(comm, &figures)
    };
    let mut ladder_if = |want: bool, pattern: Pattern| -> CommResult<Option<Vec<(f64, f64)>>> {
        if want {
            ladder(pattern).map(Some)
        } else {
            Ok(None)
        }
    };
    let both = ladder_if(wanted.both, Pattern::InPlace)?;
    let pull = ladder_if(wanted.pull, Pattern::OutOfPlace)?;
    let claim = ladder_if(wanted.claim, Pattern::OwnBlock)?;
    let method = |what: &str, taken_off: &str| {
        format!(
            "{what}, every rank at once through the host transport, walking a destination area of the rung's bytes per rank in blocks of at most {} KiB, {taken_off}, after {WARM_WALKS} untimed walks (1 from {} MiB), best of {SAMPLES} ({BIG_SAMPLES} from {} MiB), mean per rank",
            RING_SLICE_BYTES >> 10,
            SAMPLE_BYTES >> 20,
            SAMPLE_BYTES >> 20
        )
    };
    let (per_exchange, no_exchange) = (
        "less an 8 B exchange per timed block",
        "nothing taken off the timed copies (they hold no exchange)",
    );
    let made = |what: &str, taken_off: &str, figures: Option<Vec<(f64, f64)>>| {
        figures.map_or_else(Ladder::default, |f| Ladder {
            method: method(what, taken_off),
            rungs: rungs_of(areas, |a| a, &f),
        })
    };
    Ok(Some(FarLadders {
        both: made("receiving bytes the sender has just reduced into a block this rank last wrote a walk ago and the peer has just read as its reduction's source, each after the reduce-scatter step that reduces the peer's block into the block beside it (a sliced in-place ring's all-gather step)", per_exchange, both),
        pull: made("receiving bytes the sender has just written into a block this rank last wrote a walk ago, after a step that received the peer's input into the block beside it (a sliced out-of-place ring's all-gather step; a source area as large as the destination)", per_exchange, pull),
        claim: made("copying an input block into a block of the destination the peer read a walk ago, each copy followed by the step that sends that block and receives the peer's into the block beside it (a sliced out-of-place all-gather's own block; a source area half the destination)", no_exchange, claim),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{local, Algo};
    use std::time::Duration;

    const TIMEOUT: Duration = Duration::from_secs(20);

    /// In place a walk leaves in each pair's second block the larger of
    /// this rank's and the left neighbour's (the untimed step reduces with
    /// max), and in the first what the left neighbour left in its second;
    /// out of place the pair's first block holds the left neighbour's input
    /// and the second what the left neighbour received from its own left;
    /// for the own block the pair's first block holds this rank's input
    /// and the second the left neighbour's.
    /// Three ranks, so that no byte comes back to where it started; every
    /// byte of a rank's fill alike, so that max on f32 is max on the byte.
    #[test]
    fn a_walk_receives_into_every_block_what_the_ring_passed_on() {
        let area = 4 * RING_SLICE_BYTES;
        let got = local::run(3, Algo::Auto, TIMEOUT, |c| {
            let r = c.rank() as u8;
            let mut out = Vec::new();
            for pattern in [Pattern::InPlace, Pattern::OutOfPlace, Pattern::OwnBlock] {
                let block = block_of(area);
                let mut a = Area {
                    dest: HostBuffer::zeroed(area),
                    src: HostBuffer::zeroed(area),
                };
                a.dest.bytes_mut().fill(10 + r);
                a.src.bytes_mut().fill(20 + r);
                let t = c.host_transport().expect("a host transport");
                let (secs, steps) = walk(t, &mut a, block, pattern, Instant::now() + TIMEOUT)?;
                assert!(secs > 0.0 && secs.is_finite());
                out.push((pattern, steps, block, a.dest.bytes().to_vec()));
            }
            Ok(out)
        });
        for (rank, g) in got.into_iter().enumerate() {
            let (left, two_left) = (((rank + 2) % 3) as u8, ((rank + 1) % 3) as u8);
            let max = |a: usize, b: u8| (10 + a as u8).max(10 + b);
            for (pattern, steps, block, dest) in g.unwrap() {
                match pattern {
                    Pattern::InPlace => {
                        assert_eq!(steps, 2);
                        for (i, b) in dest.chunks(block).enumerate() {
                            let want = if i % 2 == 0 {
                                max(left as usize, two_left)
                            } else {
                                max(rank, left)
                            };
                            assert!(b.iter().all(|&v| v == want), "rank {rank} block {i}");
                        }
                    }
                    Pattern::OutOfPlace => {
                        assert_eq!(steps, 2);
                        for (i, b) in dest.chunks(block).enumerate() {
                            let want = if i % 2 == 0 { 20 + left } else { 20 + two_left };
                            assert!(b.iter().all(|&v| v == want), "rank {rank} block {i}");
                        }
                    }
                    Pattern::OwnBlock => {
                        // Two copies timed; each pair's first block holds
                        // this rank's input, its second the left
                        // neighbour's, sent from that neighbour's first.
                        assert_eq!(steps, 2);
                        for (i, b) in dest.chunks(block).enumerate() {
                            let want = if i % 2 == 0 {
                                20 + rank as u8
                            } else {
                                20 + left
                            };
                            assert!(b.iter().all(|&v| v == want), "rank {rank} block {i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_ladders_cover_their_areas_on_every_rank_and_need_a_peer() {
        let areas = [64 << 10, 1 << 20];
        let got = local::run(2, Algo::Auto, TIMEOUT, |c| far_ladders(c, &areas));
        let got: Vec<FarLadders> = got.into_iter().map(|g| g.unwrap().unwrap()).collect();
        assert_eq!(got[0], got[1], "the mean over ranks, on every rank");
        for l in [&got[0].both, &got[0].pull, &got[0].claim] {
            let ws: Vec<u64> = l.rungs.iter().map(|r| r.working_set).collect();
            assert_eq!(ws, areas);
            for r in &l.rungs {
                assert!(r.gbps.is_finite() && r.gbps > 0.0 && r.median_gbps <= r.gbps);
            }
        }
        let alone = local::run(1, Algo::Auto, TIMEOUT, |c| far_ladders(c, &areas));
        assert!(alone.into_iter().all(|g| g.unwrap().is_none()));
    }
}
