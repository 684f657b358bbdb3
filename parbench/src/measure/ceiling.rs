//! What the wire can do at best, measured in the same run as the sweep, so
//! that every figure can be read as a fraction of it.
//!
//! - `local` (threads, shared memory): memory-copy bandwidth, every rank
//!   copying at once ([`memcpy_bandwidth`]), since each byte a rank receives
//!   is one copy.
//! - `tcp` and any other backend: one-stream throughput from rank 0 to rank 1
//!   through the communicator's own send/recv ([`stream_throughput`]).
//! - Latency: half a ping-pong round trip of 8 bytes ([`ping_pong_latency`]).
//! - Reduction: bytes per second of `acc op= src` on one core ([`reduce_throughput`]).

use super::combine::gather_f64;
use crate::comm::{
    copy_bytes, reduce_bytes, CommBuffer, CommResult, Communicator, DType, ReduceOp,
};
use std::time::Instant;

/// The wire's ceiling as measured in this run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ceiling {
    /// How it was measured (`memcpy`, `send/recv one stream`, ...).
    pub method: String,
    /// Bytes per transfer of the measurement.
    pub bytes: usize,
    /// Bandwidth, GB/s (1e9 bytes per second).
    pub gbps: f64,
}

/// Single-thread copy bandwidth of `bytes` from one buffer to another, GB/s
/// (bytes copied per second, as iperf counts payload), best of `reps` copies
/// after one untimed copy. Call it on every rank at once to measure what each
/// gets while all copy.
pub fn memcpy_bandwidth(bytes: usize, reps: usize) -> f64 {
    // Non-zero, so that no page is the shared zero page.
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes];
    copy_bytes(&mut dst, &src);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        copy_bytes(&mut dst, std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    gbps(bytes, best)
}

/// Throughput of `dtype` `op` reduction (`acc op= src`) over `bytes` of
/// accumulator on one core, GB/s of accumulator, best of `reps` after one untimed pass.
pub fn reduce_throughput(dtype: DType, op: ReduceOp, bytes: usize, reps: usize) -> f64 {
    let bytes = bytes - bytes % dtype.size();
    let src = vec![0u8; bytes];
    let mut acc = vec![0u8; bytes];
    reduce_bytes(&mut acc, &src, dtype, op);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        reduce_bytes(&mut acc, std::hint::black_box(&src), dtype, op);
        std::hint::black_box(&mut acc);
        best = best.min(t.elapsed().as_secs_f64());
    }
    gbps(bytes, best)
}

/// One-stream throughput from rank 0 to rank 1 through the communicator's
/// send/recv: `msgs` messages of `msg_bytes`, timed on rank 0 from the first
/// send to the receipt of rank 1's one-byte acknowledgement. Every rank must
/// call it; every rank gets rank 0's figure (GB/s), or `None` with one rank.
pub fn stream_throughput<C: Communicator>(
    comm: &mut C,
    msg_bytes: usize,
    msgs: usize,
) -> CommResult<Option<f64>> {
    if comm.world() < 2 {
        return Ok(None);
    }
    let mut buf = comm.alloc(msg_bytes.max(1))?;
    let mut ack = comm.alloc(1)?;
    // One untimed message opens the path (connections, page faults).
    stream_once(comm, &mut buf, &mut ack, msg_bytes, 1)?;
    comm.barrier()?;
    let t = Instant::now();
    stream_once(comm, &mut buf, &mut ack, msg_bytes, msgs.max(1))?;
    let secs = t.elapsed().as_secs_f64();
    let mine = if comm.rank() == 0 {
        gbps(msg_bytes * msgs.max(1), secs)
    } else {
        0.0
    };
    let all = gather_f64(comm, &[mine])?;
    Ok(all.first().and_then(|v| v.first()).copied())
}

fn stream_once<C: Communicator>(
    comm: &mut C,
    buf: &mut C::Buffer,
    ack: &mut C::Buffer,
    msg_bytes: usize,
    msgs: usize,
) -> CommResult<()> {
    match comm.rank() {
        0 => {
            for _ in 0..msgs {
                comm.send(buf, msg_bytes, DType::U8, 1)?;
            }
            comm.recv(ack, 1, DType::U8, 1)?;
        }
        1 => {
            for _ in 0..msgs {
                comm.recv(buf, msg_bytes, DType::U8, 0)?;
            }
            comm.send(ack, 1, DType::U8, 0)?;
        }
        _ => {}
    }
    comm.sync()
}

/// Latency figures of 8-byte messages: the model's alpha and the wire's
/// latency jitter, as rank 0 timed them ([`ping_pong`]: half round trips;
/// [`exchange_latency`]: whole exchanges).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PingPong {
    /// Timed round trips (after the warm-up).
    pub trips: usize,
    /// Untimed round trips first.
    pub warmup: usize,
    /// Median, us: alpha.
    pub median_us: f64,
    /// 10th and 90th percentiles, us.
    pub p10_us: f64,
    pub p90_us: f64,
}

impl PingPong {
    /// Rank 0's figures from its timed `samples` (us) after `warmup`
    /// untimed ones, brought to every rank. Every rank must call it.
    fn of_rank0<C: Communicator>(
        comm: &mut C,
        mut samples: Vec<f64>,
        warmup: usize,
    ) -> CommResult<Option<PingPong>> {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let q = |f: f64| {
            samples
                .get(((n.max(1) - 1) as f64 * f).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let all = gather_f64(comm, &[warmup as f64, q(0.5), q(0.1), q(0.9)])?;
        Ok(all.first().map(|v| PingPong {
            trips: n,
            warmup: v[0] as usize,
            median_us: v[1],
            p10_us: v[2],
            p90_us: v[3],
        }))
    }

    /// The latency jitter: the spread of half round trips between their
    /// 10th and 90th percentiles, us.
    pub fn jitter_us(&self) -> f64 {
        (self.p90_us - self.p10_us).max(0.0)
    }
}

/// One round trip of `count` elements of `dtype` in `buf` between ranks 0
/// and 1 (rank 0 sends first; other ranks do nothing), finished on the
/// device (`sync`) before it returns: on a backend that only queues its
/// calls (nccl) a clock around it times the transfer, not its issue.
pub fn round_trip<C: Communicator>(
    comm: &mut C,
    buf: &mut C::Buffer,
    count: usize,
    dtype: DType,
) -> CommResult<()> {
    match comm.rank() {
        0 => {
            comm.send(buf, count, dtype, 1)?;
            comm.recv(buf, count, dtype, 1)?;
        }
        1 => {
            comm.recv(buf, count, dtype, 0)?;
            comm.send(buf, count, dtype, 0)?;
        }
        _ => {}
    }
    comm.sync()
}

/// Untimed round trips before the timed ones: at least this many, and at
/// least [`PING_WARMUP_SECS`] of them, so that cores asleep (a machine
/// that was idle) are awake when the clock starts.
const PING_WARMUP_TRIPS: usize = 50;
const PING_WARMUP_SECS: f64 = 0.02;

/// Ping-pongs of 8 bytes between ranks 0 and 1: warm-up trips (at least
/// 50 and 20 ms), then `iters` timed ones (at least 50); half round trips'
/// median and percentiles. Every rank must call it; every rank gets rank
/// 0's figures, or `None` with one rank.
pub fn ping_pong<C: Communicator>(comm: &mut C, iters: usize) -> CommResult<Option<PingPong>> {
    if comm.world() < 2 {
        return Ok(None);
    }
    let iters = iters.max(50);
    let mut buf = comm.alloc(8)?;
    let trip = |comm: &mut C, buf: &mut C::Buffer| round_trip(comm, buf, 8, DType::U8);
    comm.barrier()?;
    // Rank 0 decides when the warm-up is over and tells rank 1 with the
    // first byte of the message (1 = one more warm-up trip).
    let start = Instant::now();
    let mut warmup = 0;
    loop {
        let more = comm.rank() != 0
            || warmup < PING_WARMUP_TRIPS
            || start.elapsed().as_secs_f64() < PING_WARMUP_SECS;
        let mut flag = comm.alloc(1)?;
        flag.write_from_host(&[u8::from(more)])?;
        match comm.rank() {
            0 => comm.send(&flag, 1, DType::U8, 1)?,
            1 => comm.recv(&mut flag, 1, DType::U8, 0)?,
            _ => {}
        }
        let mut got = [0u8];
        flag.read_to_host(&mut got)?;
        let go_on = if comm.rank() <= 1 { got[0] == 1 } else { false };
        if !go_on {
            break;
        }
        trip(comm, &mut buf)?;
        warmup += 1;
    }
    let mut trips = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        trip(comm, &mut buf)?;
        trips.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    PingPong::of_rank0(comm, trips, warmup)
}

/// 8-byte exchanges, every rank at once, each sending to its right
/// neighbour while receiving from its left (`send_recv`, the step of a ring
/// or of recursive doubling), back to back: warm-up exchanges (at least 50
/// and 20 ms), then `iters` timed ones (at least 50); the median and
/// percentiles of one exchange as rank 0 timed it. This is the latency a
/// collective's step pays, which on a rendezvous transport is not half a
/// ping-pong: each side waits for the other's data and for the other to
/// have taken its own. Every rank must call it; `None` with one rank.
pub fn exchange_latency<C: Communicator>(
    comm: &mut C,
    iters: usize,
) -> CommResult<Option<PingPong>> {
    let (rank, world) = (comm.rank(), comm.world());
    if world < 2 {
        return Ok(None);
    }
    let iters = iters.max(50);
    let (right, left) = ((rank + 1) % world, (rank + world - 1) % world);
    let send = comm.alloc(8)?;
    let mut recv = comm.alloc(8)?;
    comm.barrier()?;
    // Warm-up in rounds of 50 exchanges until rank 0 has seen at least 20 ms
    // of them. Every rank must run the same count: an exchange a rank makes
    // alone would pair with its peer's next call (the gather) and scramble
    // both, so rank 0's clock decides for everyone after each round.
    let start = Instant::now();
    let mut warmup = 0usize;
    loop {
        for _ in 0..PING_WARMUP_TRIPS {
            comm.send_recv(&send, right, &mut recv, left, 8, DType::U8)?;
        }
        warmup += PING_WARMUP_TRIPS;
        let late = rank == 0 && start.elapsed().as_secs_f64() >= PING_WARMUP_SECS;
        let all = gather_f64(comm, &[f64::from(u8::from(late))])?;
        if all.first().and_then(|v| v.first()) == Some(&1.0) {
            break;
        }
    }
    let most = warmup;
    comm.sync()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        comm.send_recv(&send, right, &mut recv, left, 8, DType::U8)?;
        comm.sync()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    PingPong::of_rank0(comm, times, most)
}

/// Half the round trip of an 8-byte message between ranks 0 and 1, in us:
/// the median of [`ping_pong`]. Every rank must call it; every rank gets
/// rank 0's figure, or `None` with one rank.
pub fn ping_pong_latency<C: Communicator>(comm: &mut C, iters: usize) -> CommResult<Option<f64>> {
    Ok(ping_pong(comm, iters)?.map(|p| p.median_us))
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_and_reduce_rates_are_positive_and_finite() {
        let c = memcpy_bandwidth(1 << 16, 3);
        assert!(c.is_finite() && c > 0.0, "{c}");
        let r = reduce_throughput(DType::F32, ReduceOp::Sum, (1 << 16) + 3, 3);
        assert!(r.is_finite() && r > 0.0, "{r}");
    }
}
