//! Runs one layout of the MoE layer's ranks: build the shard, check it,
//! time it, and agree across ranks on what was measured.

use super::super::block::PhaseClock;
use super::super::check::CheckReport;
use super::super::run::{all_gather_f64, slowest_row, timed_calls, RunOptions};
use super::super::LayerError;
use super::super::{LayerResult, Mode};
use super::{check_moe, MoeBlock, MoeConfig, MoeLayout};
use crate::comm::Communicator;
use crate::compute::Compute;

/// The timing of one block call (forward, or forward + backward), in
/// microseconds, the slowest rank's (the largest mean total).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeTiming {
    /// Mean time in compute (products and the host's element-wise work).
    pub compute_us: f64,
    /// Mean time in the expert-parallel all-to-alls (counts and rows),
    /// after every peer arrived.
    pub a2a_us: f64,
    /// Mean time in the expert-tensor groups' exchanges (the all-gather of
    /// the rows and the reduce-scatter of the partial sums, and their
    /// counts), after every peer arrived; 0 at etp 1.
    pub etp_us: f64,
    /// Mean time in the attention's tensor-group exchanges (all-gathers and
    /// reduce-scatters), after every peer arrived; 0 without one or at tp 1.
    pub tp_us: f64,
    /// Mean time in the barriers before them: waiting for the slowest peer.
    pub wait_us: f64,
    /// Mean of compute, every exchange and wait per call.
    pub total_us: f64,
    /// Which rank that is.
    pub slowest_rank: usize,
}

/// What one layout measured, the same on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeOutcome {
    pub timing: MoeTiming,
    /// `None` when the check was skipped.
    pub check: Option<CheckReport>,
    /// Routed token copies each rank's expert shards processed, by rank
    /// (the ranks of an expert-tensor group process the same ones).
    pub rows_per_rank: Vec<usize>,
    /// Token copies each rank sent to other ranks in a dispatch, by rank.
    pub rows_sent_away: Vec<usize>,
}

impl MoeOutcome {
    /// Max over mean of the copies each rank's experts processed (1: balanced).
    pub fn imbalance(&self) -> f64 {
        imbalance(&self.rows_per_rank)
    }
}

/// Max over mean of `loads` (1 when all are equal or all zero).
pub fn imbalance(loads: &[usize]) -> f64 {
    let max = loads.iter().copied().max().unwrap_or(0) as f64;
    let mean = loads.iter().sum::<usize>() as f64 / loads.len().max(1) as f64;
    if mean > 0.0 {
        max / mean
    } else {
        1.0
    }
}

fn step<C, M>(
    block: &mut MoeBlock<C>,
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

/// Runs `cfg`'s block split as `layout` on this rank (`comm.world()` must
/// be `layout.world()`): builds its shard, checks it against the unsharded
/// block (if asked), then times `opts.iters` calls after `opts.warmup`, each
/// started after a barrier. Collective: every rank calls it with the same
/// arguments. A failed check is an error naming the tensors.
pub fn run_ep<C, M>(
    dev: &C,
    comm: &mut M,
    cfg: &MoeConfig,
    layout: MoeLayout,
    opts: &RunOptions,
) -> LayerResult<MoeOutcome>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let rank = comm.rank();
    if comm.world() != layout.world() {
        return Err(LayerError::Config(format!(
            "{layout} needs {} ranks, the communicator has {}",
            layout.world(),
            comm.world()
        )));
    }
    let mut block = MoeBlock::new(dev, cfg, layout, rank, opts.seed)?;
    let check = if opts.check {
        step(&mut block, dev, comm, &mut PhaseClock::new())?;
        let report = check_moe(dev, comm, &block, opts.seed)?;
        Some(report.required(&format!("{layout}: the sharded MoE block"))?)
    } else {
        None
    };
    // Each call's expert-tensor and attention-tensor times; the warm-up's
    // are dropped below.
    let mut group_calls = Vec::new();
    let clocks = timed_calls(comm, opts, |comm, clock| {
        let before = (block.etp_comm(), block.tp_comm());
        step(&mut block, dev, comm, clock)?;
        group_calls.push((
            (block.etp_comm() - before.0).as_secs_f64(),
            (block.tp_comm() - before.1).as_secs_f64(),
        ));
        Ok(())
    })?;
    let timed = &group_calls[group_calls.len() - clocks.len()..];
    let etp: f64 = timed.iter().map(|c| c.0).sum();
    let tp: f64 = timed.iter().map(|c| c.1).sum();
    let iters = clocks.len();
    let secs = |f: fn(&PhaseClock) -> std::time::Duration| -> f64 {
        clocks.iter().map(|c| f(c).as_secs_f64()).sum()
    };
    let (compute, a2a, wait) = (
        secs(PhaseClock::compute),
        secs(PhaseClock::comm),
        secs(PhaseClock::wait),
    );
    let n = iters as f64;
    let mine = [
        compute / n,
        (a2a - etp - tp) / n,
        etp / n,
        tp / n,
        wait / n,
        (compute + a2a + wait) / n,
        block.rows_received() as f64,
        block.rows_sent_away() as f64,
    ];
    let all = all_gather_f64(comm, &mine)?;
    let ranks: Vec<&[f64]> = all.chunks_exact(mine.len()).collect();
    let (slowest_rank, row) = slowest_row(&ranks, 5).unwrap_or((0, &mine[..]));
    Ok(MoeOutcome {
        timing: MoeTiming {
            compute_us: row[0] * 1e6,
            a2a_us: row[1] * 1e6,
            etp_us: row[2] * 1e6,
            tp_us: row[3] * 1e6,
            wait_us: row[4] * 1e6,
            total_us: row[5] * 1e6,
            slowest_rank,
        },
        check,
        rows_per_rank: ranks.iter().map(|r| r[6] as usize).collect(),
        rows_sent_away: ranks.iter().map(|r| r[7] as usize).collect(),
    })
}
