//! Runs one tensor-parallel degree: build the shard, check it, time it, and
//! agree across ranks on what was measured; and samples the wire for the
//! alpha-beta fit that predicts the block's communication.

use super::block::{PhaseClock, TpBlock};
use super::check::{check_block, CheckReport};
use super::{BlockConfig, LayerError, LayerResult, Mode};
use crate::comm::{Collective, CommBuffer, Communicator, DType, Io, ReduceOp};
use crate::compute::Compute;
use std::time::Instant;

/// How many times to run, and whether to check first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Untimed block calls before timing (first-touch, caches, GPU clocks).
    pub warmup: usize,
    /// Timed block calls (at least 1).
    pub iters: usize,
    /// Compare with the unsharded block before timing.
    pub check: bool,
    /// Seed of every weight, input and output gradient.
    pub seed: u64,
}

/// The timing of one block call (forward, or forward + backward in train
/// mode), in microseconds. Every figure is the slowest rank's: the rank with
/// the largest mean total, the one the others wait for at the next
/// collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TpTiming {
    /// Mean time in compute phases (kernels between collectives).
    pub compute_us: f64,
    /// Mean time in collectives once every peer arrived.
    pub comm_us: f64,
    /// Mean time in the barriers before them: waiting for a slower peer's
    /// compute (0 where a collective's time includes it).
    pub wait_us: f64,
    /// Mean of compute + communication + waiting per call.
    pub total_us: f64,
    /// Fastest call of that rank.
    pub total_min_us: f64,
    /// Slowest call of that rank.
    pub total_max_us: f64,
    /// Which rank that is.
    pub slowest_rank: usize,
    /// Mean total over all ranks, to show imbalance beside the slowest.
    pub total_mean_all_us: f64,
}

/// What one tensor-parallel degree measured, the same on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct TpOutcome {
    pub timing: TpTiming,
    /// `None` when the check was skipped.
    pub check: Option<CheckReport>,
}

/// One block call: forward, and backward in train mode.
fn step<C, M>(
    block: &mut TpBlock<C>,
    dev: &C,
    comm: &mut M,
    clock: &mut PhaseClock,
) -> LayerResult<()>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    block.forward(dev, comm, clock)?;
    if block.config().mode == Mode::Train {
        block.backward(dev, comm, clock)?;
    }
    Ok(())
}

/// Runs `cfg`'s block at t = `comm.world()` on this rank: builds its shard,
/// checks it against the unsharded block (if asked), then times
/// `opts.iters` calls after `opts.warmup`, each started together after a
/// barrier. Collective: every rank of `comm` calls it with the same
/// arguments. A failed check is an error naming the tensors.
pub fn run_tp<C, M>(
    dev: &C,
    comm: &mut M,
    cfg: &BlockConfig,
    opts: &RunOptions,
) -> LayerResult<TpOutcome>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let (tp, rank) = (comm.world(), comm.rank());
    let mut block = TpBlock::new(dev, cfg, tp, rank, opts.seed)?;
    let check = if opts.check {
        step(&mut block, dev, comm, &mut PhaseClock::new())?;
        let report = check_block(dev, comm, &block, opts.seed)?;
        Some(report.required(&format!("tp {tp}: the sharded block"))?)
    } else {
        None
    };
    let clocks = timed_calls(comm, opts, |comm, clock| step(&mut block, dev, comm, clock))?;
    let iters = clocks.len();
    let (mut compute, mut wire, mut wait) = (0f64, 0f64, 0f64);
    let (mut min, mut max) = (f64::INFINITY, 0f64);
    for clock in &clocks {
        let c = clock.compute().as_secs_f64();
        let w = clock.comm().as_secs_f64();
        let b = clock.wait().as_secs_f64();
        compute += c;
        wire += w;
        wait += b;
        min = min.min(c + w + b);
        max = max.max(c + w + b);
    }
    let n = iters as f64;
    let mine = [
        compute / n,
        wire / n,
        wait / n,
        (compute + wire + wait) / n,
        min,
        max,
    ];
    let all = all_gather_f64(comm, &mine)?;
    Ok(TpOutcome {
        timing: slowest(&all, mine.len()),
        check,
    })
}

/// `opts.warmup` untimed calls of `call`, then `opts.iters` (at least 1)
/// timed ones, each started after a barrier: each timed call's clock,
/// which times waiting apart ([`PhaseClock::waiting_apart`]).
pub(crate) fn timed_calls<M: Communicator>(
    comm: &mut M,
    opts: &RunOptions,
    mut call: impl FnMut(&mut M, &mut PhaseClock) -> LayerResult<()>,
) -> LayerResult<Vec<PhaseClock>> {
    for _ in 0..opts.warmup {
        comm.barrier()?;
        call(comm, &mut PhaseClock::waiting_apart())?;
    }
    (0..opts.iters.max(1))
        .map(|_| {
            comm.barrier()?;
            let mut clock = PhaseClock::waiting_apart();
            call(comm, &mut clock)?;
            Ok(clock)
        })
        .collect()
}

/// The slowest rank's figures from every rank's
/// `[compute, comm, wait, total, min, max, ...]` (seconds; what follows
/// is the caller's), in microseconds.
pub(crate) fn slowest(all: &[f64], per_rank: usize) -> TpTiming {
    let ranks: Vec<&[f64]> = all.chunks_exact(per_rank).collect();
    let (slow, row) = slowest_row(&ranks, 3).unwrap_or((0, &[0.0; 6][..]));
    let us = |v: f64| v * 1e6;
    let mean_all = ranks.iter().map(|r| r[3]).sum::<f64>() / ranks.len().max(1) as f64;
    TpTiming {
        compute_us: us(row[0]),
        comm_us: us(row[1]),
        wait_us: us(row[2]),
        total_us: us(row[3]),
        total_min_us: us(row[4]),
        total_max_us: us(row[5]),
        slowest_rank: slow,
        total_mean_all_us: us(mean_all),
    }
}

/// The rank whose row has the largest `total` (its index in each row)
/// and that row: the rank the others wait for. `None` without rows.
pub(crate) fn slowest_row<'a>(ranks: &[&'a [f64]], total: usize) -> Option<(usize, &'a [f64])> {
    ranks
        .iter()
        .enumerate()
        .max_by(|a, b| a.1[total].total_cmp(&b.1[total]))
        .map(|(i, r)| (i, *r))
}

/// Every rank's `values`, concatenated in rank order, on every rank.
pub(crate) fn all_gather_f64<M: Communicator>(
    comm: &mut M,
    values: &[f64],
) -> LayerResult<Vec<f64>> {
    if comm.world() == 1 {
        return Ok(values.to_vec());
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let mut send = comm.alloc(bytes.len())?;
    send.write_from_host(&bytes)?;
    let mut recv = comm.alloc(bytes.len() * comm.world())?;
    comm.all_gather(
        Io::OutOfPlace {
            send: &send,
            recv: &mut recv,
        },
        values.len(),
        DType::F64,
    )?;
    comm.sync()?;
    let mut out = vec![0u8; bytes.len() * comm.world()];
    recv.read_to_host(&mut out)?;
    Ok(out
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// One timed size of one collective on the block's wire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WireSample {
    pub collective: Collective,
    /// nccl-tests' size: the all-reduced buffer, the all-gathered output,
    /// the reduce-scattered input, one rank's all-to-all buffer.
    pub bytes: u64,
    /// Mean seconds per call on the slowest rank.
    pub seconds: f64,
}

/// The conditions the fit's samples are timed in.
pub enum SampleConditions<'a> {
    /// The calls back to back after one barrier: the wire alone, its
    /// buffers in cache.
    BackToBack,
    /// Each call alone, as the block makes it: the rank first runs the
    /// given compute (the block's own products before its collective),
    /// writes the send buffer (as that compute writes the collective's
    /// input), then waits for every peer; only the call is timed.
    AfterCompute(&'a mut dyn FnMut() -> LayerResult<()>),
}

/// Times `collective` (all_reduce, all_gather, reduce_scatter, or the MoE
/// block's all_to_all) at each of `sizes` bytes of `dtype` on `comm`, as
/// the block calls it (all-reduce in place, the others out of place), in
/// `conditions`: `warmup` untimed calls, then `iters` timed ones; each
/// size's time is the slowest rank's mean. These are the samples of the
/// alpha-beta fit that predicts the block's communication on the same
/// wire, in the same run. Collective: every rank calls it with the same
/// arguments.
pub fn wire_samples<M: Communicator>(
    comm: &mut M,
    collective: Collective,
    sizes: &[u64],
    dtype: DType,
    (warmup, iters): (usize, usize),
    conditions: &mut SampleConditions<'_>,
) -> LayerResult<Vec<WireSample>> {
    let p = comm.world();
    let unit = (dtype.size() * p) as u64;
    let mut out = Vec::with_capacity(sizes.len());
    for &want in sizes {
        // Whole elements on every rank: round to a multiple of world x size.
        let count = (want / unit).max(1) as usize;
        let total = count * p;
        let bytes = (total * dtype.size()) as u64;
        let (send_len, recv_len) = match collective {
            Collective::AllReduce => (total, total),
            Collective::AllGather => (count, total),
            Collective::ReduceScatter => (total, count),
            Collective::AllToAll => (total, total),
            other => return Err(LayerError::Config(format!("the block uses no {other}"))),
        };
        let input = vec![0u8; send_len * dtype.size()];
        let mut send = comm.alloc(send_len * dtype.size())?;
        let mut recv = comm.alloc(recv_len * dtype.size())?;
        let mut call = |comm: &mut M, send: &mut M::Buffer| -> LayerResult<()> {
            match collective {
                Collective::AllReduce => {
                    comm.all_reduce(Io::InPlace(send), total, dtype, ReduceOp::Sum)?
                }
                Collective::AllGather => {
                    let io = Io::OutOfPlace {
                        send,
                        recv: &mut recv,
                    };
                    comm.all_gather(io, count, dtype)?
                }
                Collective::AllToAll => {
                    let io = Io::OutOfPlace {
                        send,
                        recv: &mut recv,
                    };
                    comm.all_to_all(io, count, dtype)?
                }
                _ => {
                    let io = Io::OutOfPlace {
                        send,
                        recv: &mut recv,
                    };
                    comm.reduce_scatter(io, count, dtype, ReduceOp::Sum)?
                }
            }
            Ok(())
        };
        let mut time_calls = |comm: &mut M, n: usize| -> LayerResult<f64> {
            let mut seconds = 0f64;
            match conditions {
                SampleConditions::BackToBack => {
                    comm.barrier()?;
                    let t0 = Instant::now();
                    for _ in 0..n {
                        call(comm, &mut send)?;
                    }
                    comm.sync()?;
                    seconds = t0.elapsed().as_secs_f64();
                }
                SampleConditions::AfterCompute(compute) => {
                    for _ in 0..n {
                        compute()?;
                        send.write_from_host(&input)?;
                        comm.sync()?;
                        comm.barrier()?;
                        let t0 = Instant::now();
                        call(comm, &mut send)?;
                        comm.sync()?;
                        seconds += t0.elapsed().as_secs_f64();
                    }
                }
            }
            Ok(seconds / n.max(1) as f64)
        };
        if warmup > 0 {
            time_calls(comm, warmup)?;
        }
        let mean = time_calls(comm, iters.max(1))?;
        let all = all_gather_f64(comm, &[mean])?;
        let worst = all.iter().copied().fold(0f64, f64::max);
        out.push(WireSample {
            collective,
            bytes,
            seconds: worst,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slowest_rank_is_the_one_with_the_largest_mean_total() {
        let all = [
            1.0, 0.5, 0.0, 1.5, 1.4, 1.6, //
            1.0, 0.8, 0.2, 2.0, 1.9, 2.2, //
        ]
        .map(|v| v * 1e-6);
        let t = slowest(&all, 6);
        assert_eq!(t.slowest_rank, 1);
        assert!((t.comm_us - 0.8).abs() < 1e-9);
        assert!((t.wait_us - 0.2).abs() < 1e-9);
        assert!((t.total_max_us - 2.2).abs() < 1e-9);
        assert!((t.total_mean_all_us - 1.75).abs() < 1e-9);
    }
}
