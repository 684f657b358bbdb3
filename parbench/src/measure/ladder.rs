//! The wire's ceiling at a ladder of working sets, from inside the caches
//! to past the largest swept size, measured in the same run as the sweep.
//!
//! One copy ceiling measured out of cache is no ceiling for a collective
//! whose buffers stay in cache: there the same copy runs several times
//! faster, and the row would show several hundred percent of "the" ceiling.
//! So each rung of the ladder is one working set (the bytes each rank
//! touches), measured the way the wire moves bytes:
//!
//! - [`copy_ladder`] (shared memory): every rank copies a source into a
//!   destination at once; working set = source + destination.
//! - [`stream_ladder`] (sockets, any communicator): one stream of messages
//!   from rank 0 to rank 1 through send/recv; and, since a ring step sends
//!   and receives at once, the same with every rank sending to its right
//!   neighbour while it receives from its left ([`StreamLadders::duplex`]);
//!   working set = the message buffer.
//! - [`reduce_ladder`]: the reduction kernel `acc op= src`, every rank at
//!   once; working set = accumulator + source (the model's gamma).
//!
//! Each rung keeps the best sample (the ceiling) and the median sample (so
//! its noise shows). [`Ladder::at`] interpolates between rungs, log-log in
//! the working set, and holds the end rungs' figures beyond them.

use super::combine::gather_f64;
use crate::comm::{
    copy_bytes, reduce_bytes, CommResult, Communicator, DType, HostBuffer, ReduceOp,
};
pub use crate::model::ladder::{Ladder, Rung};
use std::time::Instant;

/// Working sets of a ladder: from `smallest` doubling up to the first at
/// least `largest` (both rounded up to a power of two).
pub fn working_sets(smallest: u64, largest: u64) -> Vec<u64> {
    let mut ws = smallest.max(1).next_power_of_two();
    let top = largest.max(ws).next_power_of_two();
    let mut out = Vec::new();
    while ws <= top {
        out.push(ws);
        ws *= 2;
    }
    out
}

/// How much each sample moves: enough bytes that a sample lasts well above
/// the clock's resolution and the barrier's skew, at least two transfers.
const SAMPLE_BYTES: u64 = 4 << 20;
/// Samples per rung (the best is the ceiling, the median its noise).
const SAMPLES: usize = 5;

/// Samples of a rung whose one transfer already moves [`SAMPLE_BYTES`].
const BIG_SAMPLES: usize = 3;

/// Transfers per sample and samples of a rung moving `len` bytes per
/// transfer: [`SAMPLE_BYTES`] per sample (at least two transfers) and
/// [`SAMPLES`] samples; a transfer of [`SAMPLE_BYTES`] or more is long
/// enough alone, so those rungs take one transfer per sample and three
/// samples ([`BIG_SAMPLES`]: they are most of the ladder's time).
fn plan_rung(len: usize) -> (usize, usize) {
    if len as u64 >= SAMPLE_BYTES {
        (1, BIG_SAMPLES)
    } else {
        (
            SAMPLE_BYTES.div_ceil(len.max(1) as u64).max(2) as usize,
            SAMPLES,
        )
    }
}
/// Untimed passes over a rung's buffers before its samples. A buffer just
/// allocated copies 2-3x slower for its first few passes near and above
/// the last-level cache (measured on the 2-core EPYC, 32 MiB L3: a 4 MiB
/// copy on each of two cores ran 11, 26, 30, then 36-45 GB/s), while a
/// sweep's row is timed after its own warm-up: a ceiling or beta taken
/// from the first passes is the machine waking up, not the wire.
const WARM_PASSES: usize = 8;

fn best_and_median(mut secs: Vec<f64>, bytes: f64) -> (f64, f64) {
    secs.retain(|s| s.is_finite() && *s > 0.0);
    if secs.is_empty() {
        return (0.0, 0.0);
    }
    secs.sort_by(f64::total_cmp);
    let best = bytes / secs[0] / 1e9;
    let median = bytes / secs[secs.len() / 2] / 1e9;
    (best, median)
}

/// Means over ranks of each rank's `(best, median)` pairs, one per rung.
fn mean_over_ranks<C: Communicator>(
    comm: &mut C,
    mine: &[(f64, f64)],
) -> CommResult<Vec<(f64, f64)>> {
    let flat: Vec<f64> = mine.iter().flat_map(|&(a, b)| [a, b]).collect();
    let all = gather_f64(comm, &flat)?;
    let n = all.len().max(1) as f64;
    Ok((0..mine.len())
        .map(|i| {
            let sum = |k: usize| all.iter().filter_map(|v| v.get(2 * i + k)).sum::<f64>() / n;
            (sum(0), sum(1))
        })
        .collect())
}

/// Copy bandwidth at each working set (source + destination, halves of
/// it), every rank copying at once, each rank's best of [`SAMPLES`]
/// samples, mean over ranks. Buffers are [`HostBuffer`]s, placed as the
/// collectives' are. Every rank must call it with the same `sets`.
pub fn copy_ladder<C: Communicator>(comm: &mut C, sets: &[u64]) -> CommResult<Ladder> {
    let mut mine = Vec::with_capacity(sets.len());
    for &ws in sets {
        let len = (ws / 2).max(1) as usize;
        let mut src = HostBuffer::zeroed(len);
        src.bytes_mut().fill(0x5a);
        let mut dst = HostBuffer::zeroed(len);
        let (reps, samples) = plan_rung(len);
        // Untimed passes fault the pages in and reach the steady state.
        for _ in 0..WARM_PASSES {
            copy_bytes(dst.bytes_mut(), src.bytes());
        }
        let mut secs = Vec::with_capacity(samples);
        for _ in 0..samples {
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..reps {
                copy_bytes(dst.bytes_mut(), std::hint::black_box(src.bytes()));
                std::hint::black_box(dst.bytes_mut());
            }
            secs.push(t.elapsed().as_secs_f64());
        }
        mine.push(best_and_median(secs, (reps * len) as f64));
    }
    let figures = mean_over_ranks(comm, &mine)?;
    let world = comm.world();
    Ok(Ladder {
        method: format!(
            "memory copy, {world} rank(s) copying at once, working set = source + destination per rank, after {WARM_PASSES} untimed passes, best of {SAMPLES} ({BIG_SAMPLES} from {} MiB per transfer), mean per rank",
            SAMPLE_BYTES >> 20
        ),
        rungs: rungs_of(sets, |ws| ws / 2, &figures),
    })
}

/// Reduction throughput (`acc op= src`, `dtype`) at each working set
/// (accumulator + source), every rank at once, GB/s of accumulator, best of
/// [`SAMPLES`], mean over ranks. Every rank must call it with the same `sets`.
pub fn reduce_ladder<C: Communicator>(
    comm: &mut C,
    sets: &[u64],
    dtype: DType,
    op: ReduceOp,
) -> CommResult<Ladder> {
    let elem = dtype.size() as u64;
    let mut mine = Vec::with_capacity(sets.len());
    for &ws in sets {
        let len = ((ws / 2 / elem).max(1) * elem) as usize;
        let src = HostBuffer::zeroed(len);
        let mut acc = HostBuffer::zeroed(len);
        let (reps, samples) = plan_rung(len);
        for _ in 0..WARM_PASSES {
            reduce_bytes(acc.bytes_mut(), src.bytes(), dtype, op);
        }
        let mut secs = Vec::with_capacity(samples);
        for _ in 0..samples {
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..reps {
                reduce_bytes(
                    acc.bytes_mut(),
                    std::hint::black_box(src.bytes()),
                    dtype,
                    op,
                );
                std::hint::black_box(acc.bytes_mut());
            }
            secs.push(t.elapsed().as_secs_f64());
        }
        mine.push(best_and_median(secs, (reps * len) as f64));
    }
    let figures = mean_over_ranks(comm, &mine)?;
    Ok(Ladder {
        method: format!(
            "{} {} reduction acc op= src, {} rank(s) at once, working set = acc + src per rank, GB/s of acc, after {WARM_PASSES} untimed passes, best of {SAMPLES} ({BIG_SAMPLES} from {} MiB per transfer), mean per rank",
            dtype.name(),
            op.name(),
            comm.world(),
            SAMPLE_BYTES >> 20
        ),
        rungs: rungs_of(sets, |ws| ws / 2, &figures),
    })
}

fn rungs_of(sets: &[u64], bytes: impl Fn(u64) -> u64, figures: &[(f64, f64)]) -> Vec<Rung> {
    sets.iter()
        .zip(figures)
        .map(|(&ws, &(gbps, median_gbps))| Rung {
            working_set: ws,
            bytes: bytes(ws),
            gbps,
            median_gbps,
        })
        .collect()
}

/// The two stream ladders of a communicator's send/recv.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StreamLadders {
    /// One stream rank 0 -> rank 1 (messages of the working set), GB/s as
    /// rank 1 received it.
    pub one_way: Ladder,
    /// Every rank sending to rank + 1 while receiving from rank - 1 (the
    /// step of a ring; messages of half the working set: send + receive
    /// buffer), GB/s per direction, mean over ranks.
    pub duplex: Ladder,
}

/// The share of a sample sent before its clock starts: the receiver times
/// from the arrival of the message that completes it to the last one, so
/// neither the path's start-up latency nor a token bucket's burst (a
/// shaped link lets its burst through at memory speed after an idle gap)
/// counts as bandwidth.
const LEAD_IN: f64 = 0.25;

/// How many messages of `len` bytes one sample moves: at least
/// `min_bytes`, the whole working set, and enough that the timed part
/// (after the lead-in) spans at least two messages.
fn messages(len: usize, min_bytes: u64, working_set: u64) -> usize {
    let bytes = min_bytes.max(working_set).max(1);
    (bytes.div_ceil(len.max(1) as u64) as usize).max(4)
}

/// Messages of `len` bytes covering `area` bytes: that many buffers, so that
/// a stream of them walks through the area as a collective walks through its
/// buffers.
fn buffers<C: Communicator>(comm: &C, len: usize, area: u64) -> CommResult<Vec<C::Buffer>> {
    (0..area.div_ceil(len.max(1) as u64).max(1))
        .map(|_| comm.alloc(len))
        .collect()
}

/// Stream throughput at each working set through the communicator's
/// send/recv: one stream 0 -> 1, and every rank sending to its right
/// neighbour while receiving from its left. Messages are the working set
/// (one way) or its half (both ways) up to `max_message` bytes, walking
/// through an area of that size: a longer message outruns the sockets'
/// buffers, and the kernel then sends the rest of it as acknowledgements
/// arrive, on the core that took the acknowledgement as well as on the
/// sender's. Over loopback the two cores' segments arrive out of order and
/// the sender retransmits them: measured here over one rung's samples, no
/// retransmitted segment with messages of up to 1 MiB, 2 to 14 with 4 MiB
/// ones, 12 to 261 with messages of the working set (8 to 128 MiB), at the
/// same throughput. Each sample moves at least `min_sample_bytes` (and the area)
/// and is timed by the receiver from the end of its lead-in ([`LEAD_IN`])
/// to the last byte; best of `samples`, whose median gives the noise. Every
/// rank must call it with the same arguments.
pub fn stream_ladder<C: Communicator>(
    comm: &mut C,
    sets: &[u64],
    min_sample_bytes: u64,
    max_message: u64,
    samples: usize,
) -> CommResult<StreamLadders> {
    let (rank, world) = (comm.rank(), comm.world());
    let samples = samples.max(1);
    let cap = max_message.max(1);
    let mut one = Vec::with_capacity(sets.len());
    let mut both = Vec::with_capacity(sets.len());
    let (right, left) = ((rank + 1) % world, (rank + world - 1) % world);
    for &ws in sets {
        // One stream: messages of the whole working set, up to the cap.
        let len = ws.clamp(1, cap) as usize;
        let msgs = messages(len, min_sample_bytes, ws);
        let lead = ((msgs as f64 * LEAD_IN).ceil() as usize).clamp(1, msgs - 1);
        let mut bufs = buffers(comm, len, ws)?;
        // Untimed: opens the path, faults the pages in.
        let n = bufs.len();
        one_stream(comm, &mut bufs, len, n, 0)?;
        let mut secs = Vec::with_capacity(samples);
        for _ in 0..samples {
            comm.barrier()?;
            if let Some(s) = one_stream(comm, &mut bufs, len, msgs, lead)? {
                secs.push(s);
            }
        }
        drop(bufs);
        one.push(best_and_median(secs, ((msgs - lead) * len) as f64));
        // Both directions: send and receive areas of half the working set.
        let area = (ws / 2).max(1);
        let len = area.min(cap) as usize;
        let msgs = messages(len, min_sample_bytes, ws);
        let lead = ((msgs as f64 * LEAD_IN).ceil() as usize).clamp(1, msgs - 1);
        let sends = buffers(comm, len, area)?;
        let mut recvs = buffers(comm, len, area)?;
        for (s, r) in sends.iter().zip(recvs.iter_mut()) {
            comm.send_recv(s, right, r, left, len, DType::U8)?;
        }
        let mut secs = Vec::with_capacity(samples);
        for _ in 0..samples {
            comm.barrier()?;
            let mut start = Instant::now();
            for i in 0..msgs {
                if i == lead {
                    comm.sync()?;
                    start = Instant::now();
                }
                let k = i % sends.len();
                comm.send_recv(&sends[k], right, &mut recvs[k], left, len, DType::U8)?;
            }
            comm.sync()?;
            secs.push(start.elapsed().as_secs_f64());
        }
        both.push(best_and_median(secs, ((msgs - lead) * len) as f64));
    }
    // Rank 1 timed the one-way stream: its figures reach every rank.
    let flat: Vec<f64> = one.iter().flat_map(|&(a, b)| [a, b]).collect();
    let all = gather_f64(comm, &flat)?;
    let one: Vec<(f64, f64)> = all
        .get(1)
        .map(|v| v.chunks(2).map(|c| (c[0], c[1])).collect())
        .unwrap_or_else(|| vec![(0.0, 0.0); sets.len()]);
    let both = mean_over_ranks(comm, &both)?;
    let mib = min_sample_bytes as f64 / (1 << 20) as f64;
    let cap_kib = cap >> 10;
    Ok(StreamLadders {
        one_way: Ladder {
            method: format!(
                "one stream rank 0 -> 1 through send/recv, messages of the working set up to {cap_kib} KiB walking through it, >= {mib} MiB per sample, timed by rank 1 after the first quarter, best of {samples}"
            ),
            rungs: rungs_of(sets, |ws| ws.clamp(1, cap), &one),
        },
        duplex: Ladder {
            method: format!(
                "every rank sending to rank+1 while receiving from rank-1 (send_recv), messages of half the working set up to {cap_kib} KiB walking through it, GB/s per direction, timed after the first quarter, best of {samples}, mean per rank"
            ),
            rungs: rungs_of(sets, |ws| (ws / 2).clamp(1, cap), &both),
        },
    })
}

/// `msgs` messages of `len` bytes from rank 0 to rank 1, walking through
/// `bufs`, then a one-byte acknowledgement back; rank 1 returns the seconds
/// from the receipt of message `lead` (0: from the call) to the last one.
/// Other ranks idle.
fn one_stream<C: Communicator>(
    comm: &mut C,
    bufs: &mut [C::Buffer],
    len: usize,
    msgs: usize,
    lead: usize,
) -> CommResult<Option<f64>> {
    let mut secs = None;
    let n = bufs.len().max(1);
    match comm.rank() {
        0 => {
            for i in 0..msgs {
                comm.send(&bufs[i % n], len, DType::U8, 1)?;
            }
            comm.recv(&mut bufs[0], 1, DType::U8, 1)?;
        }
        1 => {
            let mut start = Instant::now();
            for i in 0..msgs {
                comm.recv(&mut bufs[i % n], len, DType::U8, 0)?;
                if i + 1 == lead {
                    comm.sync()?;
                    start = Instant::now();
                }
            }
            comm.sync()?;
            secs = Some(start.elapsed().as_secs_f64());
            comm.send(&bufs[0], 1, DType::U8, 0)?;
        }
        _ => {}
    }
    comm.sync()?;
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{local, Algo};
    use std::time::Duration;

    #[test]
    fn working_sets_double_up_to_the_largest() {
        assert_eq!(
            working_sets(8 << 10, 64 << 10),
            [8 << 10, 16 << 10, 32 << 10, 64 << 10]
        );
        assert_eq!(working_sets(8 << 10, 65 << 10).last(), Some(&(128 << 10)));
        assert_eq!(working_sets(8 << 10, 1), [8 << 10]);
    }

    /// The ladders cover the sets asked for, on every rank alike, with
    /// positive figures (no speed is asserted).
    #[test]
    fn ladders_cover_their_working_sets_on_every_rank() {
        let sets = working_sets(8 << 10, 64 << 10);
        let got = local::run(2, Algo::Auto, Duration::from_secs(20), |c| {
            let copy = copy_ladder(c, &sets)?;
            let red = reduce_ladder(c, &sets, DType::F32, ReduceOp::Sum)?;
            let s = stream_ladder(c, &sets, 64 << 10, 16 << 10, 2)?;
            Ok((copy, red, s))
        });
        let all: Vec<_> = got.into_iter().map(Result::unwrap).collect();
        assert_eq!(all[0], all[1], "every rank gets the same figures");
        let (copy, red, s) = &all[0];
        for l in [copy, red, &s.one_way, &s.duplex] {
            let ws: Vec<u64> = l.rungs.iter().map(|r| r.working_set).collect();
            assert_eq!(ws, sets, "{}", l.method);
            for r in &l.rungs {
                assert!(
                    r.gbps.is_finite() && r.gbps > 0.0 && r.median_gbps <= r.gbps,
                    "{r:?}"
                );
            }
            assert!(l.covers(64 << 10));
        }
        assert_eq!(
            s.duplex.rungs[0].bytes,
            4 << 10,
            "duplex messages are half the working set"
        );
        assert_eq!(
            s.one_way.rungs.last().map(|r| r.bytes),
            Some(16 << 10),
            "messages stop at the cap"
        );
    }
}
