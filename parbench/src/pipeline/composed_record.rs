//! What a composed run's world rank 0 gathers ([`ComposedRecord`]) and the
//! figures a binary prints and records from it: each step's time, the
//! sharded collectives' figures, and each rank's breakdown of a step
//! (with how long its data-parallel buckets waited for the last replica,
//! [`dp_wait_us`]).

use super::composed::GradCheck;
use super::tp_stage::{CommSpan, HeldBytes, SpanGroup, StageStepTimes};
use super::{ActionTiming, RankStep, RunRecord};
use crate::comm::mesh::{Coords, MeshShape};
use crate::comm::Collective;
use crate::measure::clock_sync::RankClock;
use crate::model::fit::AlphaBetaFit;
use crate::stats::median;

/// One group's wire as this run probed it: the median time of one call
/// at each size, and the alpha-beta fit of those points (one latency per
/// call, nccl-tests' bus factor on the bytes: [`crate::model::fit`] with
/// the `auto` structure, since the group's algorithm is chosen by size).
#[derive(Clone, Debug, PartialEq)]
pub struct WireProbe {
    pub collective: Collective,
    /// Ranks of the group.
    pub ranks: usize,
    /// (bytes, median seconds of one call).
    pub points: Vec<(u64, f64)>,
    pub fit: Option<AlphaBetaFit>,
}

/// One rank's figures over the timed steps.
#[derive(Clone, Debug, PartialEq)]
pub struct RankFigures {
    pub rank: usize,
    pub coords: Coords,
    pub times: Vec<StageStepTimes>,
    pub spans: Vec<Vec<CommSpan>>,
}

/// One (data, tensor) pipeline's timed steps: in a [`ComposedRecord`], on
/// world rank 0's clock, each step from the world's first work start.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineSteps {
    /// World rank of the pipeline's stage rank 0.
    pub head: usize,
    /// `steps[i][pp_rank]`.
    pub steps: Vec<Vec<RankStep>>,
    /// Per pipeline rank: how far its times may be off the base (its
    /// offset's bound to its head, plus the head's to world rank 0).
    pub uncertainty_us: Vec<f64>,
    /// Each step's first work start in this pipeline, on its head's own
    /// clock (what put it on the world's base).
    pub origins_us: Vec<f64>,
}

/// One rank's sharded data-parallel figures ([`ComposedRecord::sharded`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShardFigures {
    pub rank: usize,
    /// ZeRO-3's per-layer all-gathers, ZeRO-2's and -3's reduce-scatters,
    /// and the part the compute waited for (all of them, unless the
    /// gathers were prefetched on the data group's thread), microseconds
    /// per step.
    pub gather_us: f64,
    pub scatter_us: f64,
    pub exposed_us: f64,
    /// With `--prefetch`: the part of `gather_us` the thread took to take
    /// each gather up once it was free to start (its wake-up).
    pub handover_us: f64,
    /// Adam's update at the step's end.
    pub optimizer_us: f64,
    /// Per-layer sharded collectives in a step.
    pub calls: usize,
    pub held_end: HeldBytes,
    pub held_peak_total: f64,
}

impl ShardFigures {
    /// The per-layer collectives' time the compute did not wait for.
    pub fn hidden_us(&self) -> f64 {
        (self.gather_us + self.scatter_us - self.exposed_us).max(0.0)
    }
}

/// What world rank 0 gathered.
#[derive(Clone, Debug, PartialEq)]
pub struct ComposedRecord {
    pub mesh: MeshShape,
    /// World rank 0's pipeline (data 0, tensor 0): the full record.
    pub record: RunRecord,
    /// Every pipeline, in the order of their first ranks.
    pub pipelines: Vec<PipelineSteps>,
    /// Every world rank, in rank order.
    pub ranks: Vec<RankFigures>,
    /// (data rank, its replica's check).
    pub checks: Vec<(usize, GradCheck)>,
    /// World rank 0's tensor group and data group, probed after the steps.
    pub tp_wire: Option<WireProbe>,
    pub dp_wire: Option<WireProbe>,
    /// World rank 0's shard and replica groups, probed after the steps.
    pub shard_wires: ShardWires,
    /// Every world rank's clock against world rank 0's (estimated before
    /// and after the run; zero offsets on a shared clock).
    pub world_clocks: Vec<RankClock>,
}

/// One rank's breakdown of a step, each figure the median over the timed
/// steps, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankBreakdown {
    pub rank: usize,
    pub coords: Coords,
    /// The blocks' compute and the tensor-parallel collectives.
    pub compute_us: f64,
    pub tp_comm_us: f64,
    /// The actions' time in all (work and sends: compute, tp comm, the
    /// stage's own sends and the executor around them).
    pub busy_us: f64,
    /// Waiting for a pipeline peer that had not sent, and transfers.
    pub wait_us: f64,
    pub transfer_us: f64,
    /// The data-parallel reduction, its part after the rank's last
    /// action, and the part before (in the pipeline's idle time).
    pub dp_comm_us: f64,
    /// The part of `dp_comm_us` spent waiting for the group's slowest
    /// replica to begin each bucket ([`dp_wait_us`]),
    /// and the rest, each the median over the steps on its own (in one
    /// step one replica waits, in the next the other: the median of the
    /// rest is not the median reduction less the median wait).
    pub dp_wait_us: f64,
    pub dp_after_wait_us: f64,
    pub dp_exposed_us: f64,
    pub dp_hidden_us: f64,
    /// The step less busy time and the exposed data-parallel reduction.
    pub idle_us: f64,
}

impl ComposedRecord {
    pub(super) fn pipeline_of(&self, rank: usize) -> Option<&PipelineSteps> {
        let c = self.ranks.get(rank)?.coords;
        self.pipelines.iter().find(|p| {
            self.ranks
                .get(p.head)
                .is_some_and(|h| h.coords.dp == c.dp && h.coords.tp == c.tp)
        })
    }

    /// Each timed step of the whole world: from the first work start on
    /// any rank to the end of the last rank's data-parallel reduction (its
    /// last action's end plus its exposed reduction), on world rank 0's
    /// clock.
    pub fn step_us(&self) -> Vec<f64> {
        let n = self.record.steps.len();
        (0..n)
            .map(|i| {
                self.ranks
                    .iter()
                    .filter_map(|r| {
                        let p = self.pipeline_of(r.rank)?;
                        let last = p.steps.get(i)?.get(r.coords.pp)?.actions.last()?.end_us;
                        let end = r
                            .times
                            .get(i)
                            .map_or(0.0, |t| t.dp_exposed_us + t.optimizer_us);
                        Some(last + end)
                    })
                    .fold(0.0, f64::max)
            })
            .collect()
    }

    /// The median step, and the index of the step closest to it.
    pub fn median_step(&self) -> (f64, usize) {
        let steps = self.step_us();
        let m = median(&mut steps.clone()).unwrap_or(0.0);
        let i = steps
            .iter()
            .enumerate()
            .min_by(|a, b| (a.1 - m).abs().total_cmp(&(b.1 - m).abs()))
            .map_or(0, |(i, _)| i);
        (m, i)
    }

    /// Every rank's sharded data-parallel figures (with `--shard`): the
    /// per-layer collectives and the optimizer, each the median over the
    /// timed steps; what it held at the last step's end and its peak.
    pub fn sharded(&self) -> Vec<ShardFigures> {
        self.ranks
            .iter()
            .map(|r| {
                let med = |f: fn(&StageStepTimes) -> f64| {
                    median(&mut r.times.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
                };
                ShardFigures {
                    rank: r.rank,
                    gather_us: med(|t| t.shard_gather_us),
                    scatter_us: med(|t| t.shard_scatter_us),
                    exposed_us: med(|t| t.shard_exposed_us),
                    handover_us: med(|t| t.shard_handover_us),
                    optimizer_us: med(|t| t.optimizer_us),
                    calls: r.times.last().map_or(0, |t| t.shard_calls),
                    held_end: r.times.last().map(|t| t.held_end).unwrap_or_default(),
                    held_peak_total: r
                        .times
                        .iter()
                        .map(|t| t.held_peak_total)
                        .fold(0.0, f64::max),
                }
            })
            .collect()
    }

    /// Every rank's breakdown: each figure the median over the timed
    /// steps (as the step is), so that one preempted step on a shared
    /// machine does not move it.
    pub fn breakdown(&self) -> Vec<RankBreakdown> {
        let steps = self.step_us();
        let waits = dp_wait_us(self);
        self.ranks
            .iter()
            .zip(&waits)
            .map(|(r, wait)| {
                let mut per: [Vec<f64>; 11] = Default::default();
                for (i, t) in r.times.iter().enumerate() {
                    let acts = self
                        .pipeline_of(r.rank)
                        .and_then(|p| p.steps.get(i)?.get(r.coords.pp))
                        .map(|rs| rs.actions.as_slice())
                        .unwrap_or(&[]);
                    let sum = |f: fn(&ActionTiming) -> f64| acts.iter().map(f).sum::<f64>();
                    let busy = sum(ActionTiming::busy_us);
                    let step = steps.get(i).copied().unwrap_or(0.0);
                    for (v, x) in per.iter_mut().zip([
                        t.compute_us,
                        t.tp_comm_us,
                        busy,
                        sum(ActionTiming::waiting_us),
                        sum(ActionTiming::transfer_us),
                        t.dp_comm_us,
                        t.dp_exposed_us,
                        t.dp_hidden_us(),
                        // Idle: neither in an action nor waiting for
                        // the reduction (its hidden part ran meanwhile).
                        (step - busy - t.dp_exposed_us - t.optimizer_us).max(0.0),
                        wait.get(i).copied().unwrap_or(0.0),
                        t.dp_comm_us - wait.get(i).copied().unwrap_or(0.0),
                    ]) {
                        v.push(x);
                    }
                }
                let [compute, tp, busy, wait, transfer, dp, exposed, hidden, idle, dp_wait, dp_rest] =
                    per.map(|mut v| median(&mut v).unwrap_or(0.0));
                RankBreakdown {
                    rank: r.rank,
                    coords: r.coords,
                    compute_us: compute,
                    tp_comm_us: tp,
                    busy_us: busy,
                    wait_us: wait,
                    transfer_us: transfer,
                    dp_comm_us: dp,
                    dp_wait_us: dp_wait,
                    dp_after_wait_us: dp_rest,
                    dp_exposed_us: exposed,
                    dp_hidden_us: hidden,
                    idle_us: idle,
                }
            })
            .collect()
    }
}

/// The sharded collectives' wires, probed after the steps at the sizes
/// the step used (one layer's weights): the shard group's all-gather and
/// reduce-scatter, and with hybrid sharding the replica group's
/// all-reduce of one share. Empty without `--shard` zero1, zero2 or zero3.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardWires {
    pub gather: Option<WireProbe>,
    pub scatter: Option<WireProbe>,
    pub replicas: Option<WireProbe>,
    /// One layer's weights on one rank, padded to whole shares, bytes.
    pub layer_bytes: f64,
}

/// Per world rank, per timed step: how long its data-parallel buckets
/// waited for the last replica of its data group to begin them, on the
/// world's base. The k-th bucket of a group is one collective: it cannot
/// end before every rank of the group has begun it, so the time from this
/// rank's start of it to the latest start in the group is waiting for the
/// slowest replica (skew between the replicas' backward passes), not the
/// wire; the rest of the bucket's time is the reduction itself. Each wait
/// is at most its bucket's time; ranks whose group's bucket counts differ
/// (not one collective each) count none.
pub(super) fn dp_wait_us(rec: &ComposedRecord) -> Vec<Vec<f64>> {
    // Per rank, per step: (start, duration) of each bucket, in order.
    let buckets: Vec<Vec<Vec<(f64, f64)>>> = rec
        .ranks
        .iter()
        .map(|r| {
            let pipe = rec.pipeline_of(r.rank);
            r.spans
                .iter()
                .enumerate()
                .map(|(i, spans)| {
                    let actions = pipe
                        .and_then(|p| p.steps.get(i)?.get(r.coords.pp))
                        .map(|rs| rs.actions.as_slice())
                        .unwrap_or(&[]);
                    spans
                        .iter()
                        .filter(|s| matches!(s.group, SpanGroup::Dp | SpanGroup::DpThread))
                        .filter_map(|s| {
                            let a = actions.get(s.action)?;
                            Some((a.start_us + s.offset_us, s.dur_us))
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    rec.ranks
        .iter()
        .map(|r| {
            let group: Vec<usize> = rec
                .ranks
                .iter()
                .filter(|o| o.coords.tp == r.coords.tp && o.coords.pp == r.coords.pp)
                .map(|o| o.rank)
                .collect();
            (0..r.spans.len())
                .map(|i| {
                    let of = |rank: usize| buckets.get(rank).and_then(|b| b.get(i));
                    let Some(mine) = of(r.rank) else {
                        return 0.0;
                    };
                    let peers: Vec<&Vec<(f64, f64)>> =
                        group.iter().filter_map(|&g| of(g)).collect();
                    if peers.len() != group.len() || peers.iter().any(|p| p.len() != mine.len()) {
                        return 0.0;
                    }
                    mine.iter()
                        .enumerate()
                        .map(|(k, &(start, dur))| {
                            let last = peers.iter().map(|p| p[k].0).fold(start, f64::max);
                            (last - start).clamp(0.0, dur)
                        })
                        .sum()
                })
                .collect()
        })
        .collect()
}
