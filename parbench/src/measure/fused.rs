//! The host transports' receive-and-reduce, by working set: one step of a
//! ring reduce-scatter timed as the ring runs it, through the transport
//! the algorithms use ([`Communicator::host_transport`]).
//!
//! A model that prices a received-and-reduced byte as a receive plus a
//! pass of the reduction kernel counts its memory traffic twice: the host
//! transports fuse the two (the local transport reduces straight out of
//! the sender's buffer, a socket's transport out of the piece it has just
//! read), one pass over each operand. Out of cache that is most of the
//! cost: on the 2-core EPYC VM (32 MiB L3) in-place all_reduce from 16 MiB
//! ran 1.3-2.1x faster than the sum, in every run.

use super::combine::gather_f64;
use super::ladder::{
    best_and_median, less_latency, mean_over_ranks, median_empty_exchange, plan_rung, rungs_of,
    sample_long_enough, BIG_SAMPLES, SAMPLES, SAMPLE_BYTES, WARM_PASSES,
};
use crate::comm::algo::RING_SLICE_BYTES;
use crate::comm::{
    CommError, CommResult, Communicator, DType, HostBuffer, RecvInto, ReduceOp, Transport,
};
use crate::model::wire::Ladder;
use std::ops::Range;
use std::time::Instant;

/// The two reducing receives of the host rings, each a [`Ladder`] by
/// working set, GB/s of reduced bytes per rank, every rank at once.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FusedLadders {
    /// `acc op= received` (`RecvInto::Reduce`: every step of an in-place
    /// ring, and the partial sums of any ring), the received bytes just
    /// written by the sender, `acc` read by the peer since this rank last
    /// wrote it; working set = two buffers of one transfer per rank.
    pub into: Ladder,
    /// `out = base op received` (`RecvInto::ReduceFrom`: the first step of
    /// an out-of-place ring), the received bytes the sender's untouched
    /// input, `base` this rank's, `out` read by the peer since this rank
    /// last wrote it; working set = four buffers of one transfer per rank
    /// (the send buffer's two blocks, the receive buffer's two).
    pub from: Ladder,
}

/// Which reducing receive a ladder times.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Into,
    From,
}

impl Kind {
    /// Buffers of one transfer per rank in a rung's working set.
    fn buffers(self) -> u64 {
        match self {
            Kind::Into => 2,
            Kind::From => 4,
        }
    }

    /// Bytes of one transfer at working set `ws`: whole elements of `elem` bytes, at least one.
    fn transfer(self, ws: u64, elem: u64) -> u64 {
        (ws / self.buffers() / elem).max(1) * elem
    }
}

/// A rung's buffers, each `len` bytes: `Into` uses `x` (acc) and `y`;
/// `From` also `s0`, `s1` (a send buffer's blocks, never rewritten).
struct Buffers {
    x: HostBuffer,
    y: HostBuffer,
    s0: HostBuffer,
    s1: HostBuffer,
}

/// The pieces of a transfer of `len` bytes, as a sliced ring cuts a block:
/// at most [`RING_SLICE_BYTES`], whole elements of `elem` bytes.
fn pieces(len: usize, elem: usize) -> Vec<Range<usize>> {
    let step = (RING_SLICE_BYTES / elem).max(1) * elem;
    (0..len)
        .step_by(step.max(1))
        .map(|a| a..(a + step).min(len))
        .collect()
}

/// One transfer: per piece, the timed reducing receive (step A: send `y`
/// or `s1`, reduce into `x`), then the untimed plain one that puts the
/// lines where the next step A finds them (step B: send `x`, receive into
/// `y`: the peer's `y` is then just written and this rank's `x` just read
/// by the peer). Returns step A's seconds.
#[allow(clippy::too_many_arguments)]
fn transfer(
    t: &mut dyn Transport,
    kind: Kind,
    b: &mut Buffers,
    ranges: &[Range<usize>],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> CommResult<f64> {
    let (p, r) = (t.world(), t.rank());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let mut secs = 0.0;
    for k in ranges {
        let start = Instant::now();
        match kind {
            Kind::Into => {
                let acc = &mut b.x.bytes_mut()[k.clone()];
                let into = RecvInto::Reduce { acc, dtype, op };
                t.exchange(right, &b.y.bytes()[k.clone()], left, into, deadline)?;
            }
            Kind::From => {
                let into = RecvInto::ReduceFrom {
                    base: &b.s0.bytes()[k.clone()],
                    out: &mut b.x.bytes_mut()[k.clone()],
                    dtype,
                    op,
                };
                t.exchange(right, &b.s1.bytes()[k.clone()], left, into, deadline)?;
            }
        }
        secs += start.elapsed().as_secs_f64();
        let into = RecvInto::Copy(&mut b.y.bytes_mut()[k.clone()]);
        t.exchange(right, &b.x.bytes()[k.clone()], left, into, deadline)?;
    }
    Ok(secs)
}

/// Each sample of one rung ([`plan_rung`]; a sample also ends after the
/// fresh ladders' longest sample, rank 0 deciding) as its timed seconds,
/// its reducing receives and its transfers, after [`WARM_PASSES`] untimed
/// transfers.
fn rung_samples<C: Communicator>(
    comm: &mut C,
    kind: Kind,
    len: usize,
    dtype: DType,
    op: ReduceOp,
) -> CommResult<Vec<(f64, usize, usize)>> {
    let backend = comm.backend();
    let no_transport = move || {
        CommError::Unsupported(format!(
            "backend {backend} has no host transport to time its reducing receive on"
        ))
    };
    // Written, not left zeroed: a buffer never written reads the kernel's
    // one zero page, in cache whatever the working set. Zeros stay zeros
    // under the sum (and never turn denormal or infinite as the rounds
    // add them up); the send blocks that `From` reads and never rewrites
    // hold ones.
    let fill = |v: f32, len: usize| {
        let mut h = HostBuffer::zeroed(len);
        for c in h.bytes_mut().chunks_exact_mut(4) {
            c.copy_from_slice(&v.to_ne_bytes());
        }
        h
    };
    let send_len = if kind == Kind::From { len } else { 0 };
    let mut b = Buffers {
        x: fill(0.0, len),
        y: fill(0.0, len),
        s0: fill(1.0, send_len),
        s1: fill(1.0, send_len),
    };
    let ranges = pieces(len, dtype.size());
    let (reps, samples) = plan_rung(len);
    let timeout = comm.timeout();
    let run = |comm: &mut C, b: &mut Buffers| -> CommResult<f64> {
        let deadline = Instant::now() + timeout;
        let t = comm.host_transport().ok_or_else(no_transport)?;
        transfer(t, kind, b, &ranges, dtype, op, deadline)
    };
    for _ in 0..WARM_PASSES {
        run(comm, &mut b)?;
    }
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        comm.barrier()?;
        let start = Instant::now();
        let (mut secs, mut done) = (0.0, 0usize);
        while done < reps {
            secs += run(comm, &mut b)?;
            done += 1;
            // A transfer over a slow link can last longer than a sample.
            let ask = done % 16 == 0 || len as u64 * 16 > SAMPLE_BYTES;
            if ask && sample_long_enough(comm, start)? {
                break;
            }
        }
        out.push((secs, done * ranges.len(), done));
    }
    Ok(out)
}

/// Whether every rank's communicator has a host transport (a collective:
/// every rank must call it).
pub(super) fn every_rank_has_transport<C: Communicator>(comm: &mut C) -> CommResult<bool> {
    let mine = f64::from(u8::from(comm.host_transport().is_some()));
    let all = gather_f64(comm, &[mine])?;
    Ok(all.iter().all(|v| v.first() == Some(&1.0)))
}

/// The [`FusedLadders`] at `sets` (each a rung's working set per rank),
/// reducing `dtype` with `op`: every rank sending to its right neighbour
/// while it reduces what its left one sends, step after step as a ring's
/// follow each other, in pieces of at most a ring's slice block; the
/// time of an 8-byte exchange (the model's alpha) taken off each piece.
/// Best of the samples, mean over ranks. `None` where some rank has no
/// host transport (NCCL, MPI: their reductions are the library's) or
/// there is one rank. Every rank must call it with the same arguments.
pub fn fused_reduce_ladders<C: Communicator>(
    comm: &mut C,
    sets: &[u64],
    dtype: DType,
    op: ReduceOp,
) -> CommResult<Option<FusedLadders>> {
    if comm.world() < 2 || !every_rank_has_transport(comm)? {
        return Ok(None);
    }
    let elem = dtype.size() as u64;
    let mut empty = median_empty_exchange(comm, false)?;
    let first_empty = empty;
    let mut ladder = |kind: Kind| -> CommResult<Vec<(f64, f64)>> {
        let mut figures = Vec::with_capacity(sets.len());
        for &ws in sets {
            let len = kind.transfer(ws, elem) as usize;
            let samples = rung_samples(comm, kind, len, dtype, op)?;
            let after = median_empty_exchange(comm, false)?;
            let e = empty.min(after);
            empty = after;
            let secs = samples
                .into_iter()
                .map(|(raw, steps, transfers)| less_latency(raw, steps, e) / transfers as f64)
                .collect();
            figures.push(best_and_median(secs, len as f64));
        }
        mean_over_ranks(comm, &figures)
    };
    let (into, from) = (ladder(Kind::Into)?, ladder(Kind::From)?);
    // Each rank takes its own empty exchange off its own; the method names rank 0's.
    let empty0 = gather_f64(comm, &[first_empty])?
        .first()
        .and_then(|v| v.first().copied())
        .unwrap_or(first_empty);
    let method = |what: &str, kind: Kind| {
        format!(
            "{what}, {} {}, every rank at once through the host transport, working set = {} buffers of one transfer per rank, in pieces of at most {} KiB less an 8 B exchange ({:.2} us) each, after {WARM_PASSES} untimed passes, best of {SAMPLES} ({BIG_SAMPLES} from {} MiB per transfer), mean per rank",
            dtype.name(),
            op.name(),
            kind.buffers(),
            RING_SLICE_BYTES >> 10,
            empty0 * 1e6,
            SAMPLE_BYTES >> 20
        )
    };
    let rungs =
        |kind: Kind, figures: &[(f64, f64)]| rungs_of(sets, |ws| kind.transfer(ws, elem), figures);
    Ok(Some(FusedLadders {
        into: Ladder {
            method: method(
                "acc op= received (an in-place ring's step): bytes the sender has just written into a buffer the peer has just read",
                Kind::Into,
            ),
            rungs: rungs(Kind::Into, &into),
        },
        from: Ladder {
            method: method(
                "out = base op received (an out-of-place ring's first step): the sender's untouched input into a buffer the peer has just read",
                Kind::From,
            ),
            rungs: rungs(Kind::From, &from),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{local, Algo};
    use std::time::Duration;

    const TIMEOUT: Duration = Duration::from_secs(20);

    fn filled(v: f32, len: usize) -> HostBuffer {
        let mut h = HostBuffer::zeroed(len);
        for c in h.bytes_mut().chunks_exact_mut(4) {
            c.copy_from_slice(&v.to_ne_bytes());
        }
        h
    }

    fn values(h: &HostBuffer) -> Vec<f32> {
        h.bytes()
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_transfer_is_cut_as_a_sliced_ring_cuts_a_block() {
        let len = 5 * RING_SLICE_BYTES / 2 + 12;
        let p = pieces(len, 4);
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].start, p[2].end), (0, len));
        assert!(p.windows(2).all(|w| w[0].end == w[1].start));
        assert!(p
            .iter()
            .all(|r| r.len() <= RING_SLICE_BYTES && r.len() % 4 == 0));
        assert_eq!(pieces(4096, 4), vec![0..4096]);
    }

    #[test]
    fn a_transfer_reduces_what_the_left_neighbour_sends_as_the_ring_does() {
        // 2 pieces per transfer; rank r's own values tell the senders apart.
        let len = RING_SLICE_BYTES + 1024;
        let got = local::run(2, Algo::Auto, TIMEOUT, |c| {
            let (r, peer) = (c.rank() as f32, (1 - c.rank()) as f32);
            let mut out = Vec::new();
            for kind in [Kind::Into, Kind::From] {
                let mut b = Buffers {
                    x: filled(1.0, len),
                    y: filled(10.0 * (r + 1.0), len),
                    s0: filled(r + 1.0, len),
                    s1: filled(100.0 * (r + 1.0), len),
                };
                let ranges = pieces(len, 4);
                let deadline = Instant::now() + TIMEOUT;
                let t = c.host_transport().expect("a host transport");
                let secs = transfer(
                    t,
                    kind,
                    &mut b,
                    &ranges,
                    DType::F32,
                    ReduceOp::Sum,
                    deadline,
                )?;
                assert!(secs > 0.0 && secs.is_finite());
                // Step A: x op= the peer's y (Into), x = s0 + the peer's s1
                // (From); step B: y = the peer's new x.
                let x = match kind {
                    Kind::Into => 1.0 + 10.0 * (peer + 1.0),
                    Kind::From => (r + 1.0) + 100.0 * (peer + 1.0),
                };
                let y = match kind {
                    Kind::Into => 1.0 + 10.0 * (r + 1.0),
                    Kind::From => (peer + 1.0) + 100.0 * (r + 1.0),
                };
                out.push((values(&b.x), x, values(&b.y), y));
            }
            Ok(out)
        });
        for g in got {
            for (x, want_x, y, want_y) in g.unwrap() {
                assert!(x.iter().all(|v| *v == want_x), "x {want_x}");
                assert!(y.iter().all(|v| *v == want_y), "y {want_y}");
            }
        }
    }

    #[test]
    fn the_ladders_cover_their_sets_on_every_rank_and_need_a_peer() {
        let sets = [8 << 10, 256 << 10];
        let got = local::run(2, Algo::Auto, TIMEOUT, |c| {
            fused_reduce_ladders(c, &sets, DType::F32, ReduceOp::Sum)
        });
        let got: Vec<FusedLadders> = got.into_iter().map(|g| g.unwrap().unwrap()).collect();
        assert_eq!(got[0], got[1], "the mean over ranks, on every rank");
        for (l, buffers) in [(&got[0].into, 2), (&got[0].from, 4)] {
            let ws: Vec<u64> = l.rungs.iter().map(|r| r.working_set).collect();
            assert_eq!(ws, sets);
            for r in &l.rungs {
                assert_eq!(r.bytes, r.working_set / buffers);
                assert!(r.gbps.is_finite() && r.gbps > 0.0 && r.median_gbps <= r.gbps);
            }
        }
        let alone = local::run(1, Algo::Auto, TIMEOUT, |c| {
            fused_reduce_ladders(c, &sets, DType::F32, ReduceOp::Sum)
        });
        assert!(alone.into_iter().all(|g| g.unwrap().is_none()));
    }
}
