//! One composed `dp x tp x pp` run on one rank of the world, end to end:
//! the mesh, this rank's [`TpStages`], the schedule's steps
//! ([`super::run_stages`]), the gradient check ([`check_composed`]), short
//! probes of the tensor and data groups' wires at the sizes the step uses,
//! and every rank's figures gathered on world rank 0 (each wait held to
//! the communicator's deadline).
//!
//! What world rank 0 gets back ([`ComposedRecord`]) is what a binary
//! prints and records: its own pipeline's full record (the common clock
//! of the pipeline issue), every pipeline's steps (all on world rank 0's
//! clock, each step from the world's first work start:
//! [`super::world_base`]), every rank's [`StageStepTimes`] and
//! communication spans, every replica's check.
//!
//! The mesh's groups are host algorithms over the world's point-to-point
//! calls ([`crate::comm::group`]), so the stages compute on host buffers
//! (the CPU) whatever the world's backend.

use super::composed::{check_composed, GradCheck};
use super::dp_overlap::{overlap_comm, with_overlap};
use super::exec::{decode_steps, encode_steps, recv_f64s, send_f64s};
use super::tp_stage::{CommSpan, HeldBytes, SpanGroup, StageStepTimes, TpStageConfig, TpStages};
use super::world_base::onto_world_base;
use super::{run_stages, ActionTiming, PipelineConfig, PipelineError, RankStep, RunRecord, Work};
use crate::comm::group::split;
use crate::comm::mesh::{with_mesh, Coords, MeshShape, SharedComm};
use crate::comm::{Algo, Collective, Communicator, DType, HostBuffer, Io, ReduceOp};
use crate::compute::Compute;
use crate::layers::layout::ParamSpecs;
use crate::measure::clock_sync::{self, estimate_offsets, host_now_us, RankClock, TimeBase};
use crate::model::algo::ModelAlgo;
use crate::model::fit::{fit, AlphaBetaFit};
use crate::model::plan::Shard;
use crate::stats::median;

/// Everything one composed run needs; the same on every rank.
#[derive(Clone, Debug)]
pub struct ComposedConfig {
    pub mesh: MeshShape,
    pub stages: TpStageConfig,
    /// The schedule, steps, warm-up and work (`stage_layers` is
    /// `layers_per_stage` for every stage).
    pub pipeline: PipelineConfig,
    /// Run the gradient check (under `--work compute` only).
    pub check: bool,
    /// The groups' collectives' algorithm.
    pub algo: Algo,
    /// Tests only: this world rank's reduced gradients are changed before
    /// the check ([`TpStages::corrupt_for_test`]), which must then fail.
    pub corrupt_grad_rank: Option<usize>,
}

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
    /// replica to begin each bucket ([`super::world_base::dp_wait_us`]),
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
        let waits = super::world_base::dp_wait_us(self);
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

/// Runs the composed step on this rank of `world` (a collective of the
/// whole world). World rank 0 returns the gathered record; the others `None`.
pub fn run_composed<W, C>(
    world: &mut W,
    c: &C,
    cfg: &ComposedConfig,
    base: TimeBase,
) -> Result<Option<ComposedRecord>, PipelineError>
where
    W: Communicator,
    C: Compute<Buf = HostBuffer>,
{
    let rank = world.rank();
    let reduce = cfg.stages.reduce;
    // The overlapped reduction's own communicator, made before the mesh
    // borrows the world.
    let mut dup =
        overlap_comm(world, &cfg.mesh, reduce.thread_flag()).map_err(|e| e.into_comm(rank))?;
    // Every world rank's clock against world rank 0's, before and after
    // the run: the pipelines' heads' offsets put them on one base.
    world.barrier()?;
    let clocks_before = estimate_offsets(world, clock_sync::EXCHANGES)?;
    let mine = with_mesh(world, &cfg.mesh, cfg.algo, |mesh| {
        let coords = mesh.coords;
        let mut body = || -> Result<_, PipelineError> {
            let group = reduce.group_of(cfg.mesh.dp);
            let ran = with_overlap(
                dup.take(),
                &cfg.mesh,
                cfg.algo,
                if group < cfg.mesh.dp { group } else { 0 },
                |reducer| {
                    let run = RankRun { c, cfg, base, rank };
                    if group == cfg.mesh.dp {
                        return run.go(&mut mesh.tp, &mut mesh.dp, None, &mut mesh.pp, reducer);
                    }
                    // Hybrid sharding: the data group split in two, each
                    // link of it in one of them (shard groups hold
                    // consecutive data ranks, replica groups one of each).
                    let d = mesh.dp.rank();
                    let cell = std::sync::Mutex::new(&mut mesh.dp);
                    let (mut h_shard, mut h_across) =
                        (SharedComm::new(&cell)?, SharedComm::new(&cell)?);
                    let colour = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
                    let mut shard = split(
                        &mut h_shard,
                        Some(colour(d / group)),
                        colour(d % group),
                        cfg.algo,
                    )?
                    .ok_or_else(|| PipelineError::Protocol("left out of its shard group".into()))?;
                    let mut across = split(
                        &mut h_across,
                        Some(colour(d % group)),
                        colour(d / group),
                        cfg.algo,
                    )?
                    .ok_or_else(|| {
                        PipelineError::Protocol("left out of its replica group".into())
                    })?;
                    run.go(
                        &mut mesh.tp,
                        &mut shard,
                        Some(&mut across),
                        &mut mesh.pp,
                        reducer,
                    )
                },
            )?;
            let (rec, check, times, spans, shard_wires) = ran;
            let t = mesh.tp.world();
            let tp_n = cfg.stages.block.tokens() * cfg.stages.block.shape.hidden;
            let tp_wire = probe(c, &mut mesh.tp, Collective::AllReduce, &around(tp_n))?;
            let grads: usize = ParamSpecs::new(&cfg.stages.block)
                .all()
                .iter()
                .map(|p| p.local_len(t))
                .sum::<usize>()
                * cfg.stages.layers_per_stage;
            let cap = (cfg.stages.reduce.bucket_bytes / c.dtype().size()).max(1);
            let bucket = grads.min(cap).max(1);
            let coll = if cfg.stages.reduce.dist_opt() {
                Collective::ReduceScatter
            } else {
                Collective::AllReduce
            };
            let dp_wire = probe(c, &mut mesh.dp, coll, &[bucket / 4, bucket / 2, bucket])?;
            Ok((rec, check, times, spans, tp_wire, dp_wire, shard_wires))
        };
        let out = body().map_err(|e| e.into_comm(rank))?;
        Ok((coords, out))
    })?;
    let (coords, (rec, check, times, spans, tp_wire, dp_wire, shard_wires)) = mine;
    world.barrier()?;
    let clocks_after = estimate_offsets(world, clock_sync::EXCHANGES)?;
    let figures = RankFigures {
        rank,
        coords,
        times,
        spans,
    };
    if rank != 0 {
        send_f64s(world, &encode_figures(&figures), 0)?;
        send_f64s(world, &encode_check(check), 0)?;
        send_f64s(world, &encode_pipeline(rec.as_ref()), 0)?;
        return Ok(None);
    }
    let record = rec.ok_or_else(|| {
        PipelineError::Protocol("world rank 0 is not its pipeline's first rank".into())
    })?;
    let mut ranks = vec![figures];
    let mut checks: Vec<(usize, GradCheck)> = check.map(|g| (coords.dp, g)).into_iter().collect();
    let mut pipelines = vec![PipelineSteps {
        head: 0,
        steps: record.steps.clone(),
        uncertainty_us: (0..cfg.mesh.pp).map(|r| record.uncertainty_us(r)).collect(),
        origins_us: record.origins_us.clone(),
    }];
    for from in 1..world.world() {
        let f = decode_figures(from, &cfg.mesh, &recv_f64s(world, from)?)?;
        if let Some(g) = decode_check(from, &recv_f64s(world, from)?)? {
            checks.push((f.coords.dp, g));
        }
        if let Some(p) = decode_pipeline(from, &recv_f64s(world, from)?)? {
            pipelines.push(p);
        }
        ranks.push(f);
    }
    let (Some(before), Some(after)) = (clocks_before, clocks_after) else {
        return Err(PipelineError::Protocol(
            "world rank 0 holds no clock estimates".into(),
        ));
    };
    let world_clocks = clock_sync::rank_clocks(base, &before, &after);
    onto_world_base(&mut pipelines, &world_clocks)?;
    Ok(Some(ComposedRecord {
        mesh: cfg.mesh,
        record,
        pipelines,
        ranks,
        checks,
        tp_wire,
        dp_wire,
        shard_wires,
        world_clocks,
    }))
}

/// One rank's part of the run, whatever its groups' types.
struct RankRun<'a, C> {
    c: &'a C,
    cfg: &'a ComposedConfig,
    base: TimeBase,
    rank: usize,
}

/// What a rank's run gives back: its pipeline's record (on its first
/// rank), its replica's check, its timed steps and their spans.
type RankOut = (
    Option<RunRecord>,
    Option<GradCheck>,
    Vec<StageStepTimes>,
    Vec<Vec<CommSpan>>,
    ShardWires,
);

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

impl<C: Compute<Buf = HostBuffer>> RankRun<'_, C> {
    /// Builds the rank's stages over its tensor group, its shard group
    /// `dp` (and with hybrid sharding its replica group), runs the steps
    /// over `pp` and checks the gradients.
    fn go<T, D, P>(
        &self,
        tp: &mut T,
        dp: &mut D,
        replicas: Option<&mut D>,
        pp: &mut P,
        reducer: Option<&mut super::dp_overlap::Reducer<HostBuffer>>,
    ) -> Result<RankOut, PipelineError>
    where
        T: Communicator<Buffer = HostBuffer>,
        D: Communicator<Buffer = HostBuffer>,
        P: Communicator<Buffer = HostBuffer>,
    {
        let (c, cfg) = (self.c, self.cfg);
        let s = &cfg.pipeline.schedule;
        let work = cfg.pipeline.work;
        let warmup = cfg.pipeline.warmup;
        let mut replicas = replicas;
        let mut stages = TpStages::new(c, &cfg.stages, s, pp.rank(), work, tp, &mut *dp)?;
        if let Some(r) = replicas.as_deref_mut() {
            stages.with_replicas(r)?;
        }
        if let Some(r) = reducer {
            stages.overlap_on(r);
        }
        let rec = run_stages(pp, c, &cfg.pipeline, self.base, &mut stages)?;
        if cfg.corrupt_grad_rank == Some(self.rank) {
            stages.corrupt_for_test();
        }
        let check = if cfg.check && work == Work::Compute {
            check_composed(c, &mut stages, pp, s, &cfg.stages)?
        } else {
            None
        };
        let times = stages.times.get(warmup..).unwrap_or(&[]).to_vec();
        let spans = stages.spans.get(warmup..).unwrap_or(&[]).to_vec();
        let layer_share = stages.layer_share_elems();
        drop(stages);
        let layer_elems = layer_share * dp.world();
        let wires = self.shard_wires(dp, replicas, layer_elems)?;
        Ok((rec, check, times, spans, wires))
    }

    /// The sharded collectives' wires at one layer's size (a collective
    /// of the shard and replica groups).
    fn shard_wires<D: Communicator<Buffer = HostBuffer>>(
        &self,
        dp: &mut D,
        replicas: Option<&mut D>,
        layer_elems: usize,
    ) -> Result<ShardWires, PipelineError> {
        let reduce = &self.cfg.stages.reduce;
        if !matches!(
            reduce.shard,
            Some(Shard::Zero1 | Shard::Zero2 | Shard::Zero3)
        ) {
            return Ok(ShardWires::default());
        }
        let c = self.c;
        let counts = [layer_elems / 4, layer_elems / 2, layer_elems];
        let gather = probe(c, dp, Collective::AllGather, &counts)?;
        let scatter = probe(c, dp, Collective::ReduceScatter, &counts)?;
        let g = dp.world().max(1);
        let replicas = match replicas {
            Some(r) => probe(
                c,
                r,
                Collective::AllReduce,
                &[layer_elems / g / 4, layer_elems / g / 2, layer_elems / g],
            )?,
            None => None,
        };
        Ok(ShardWires {
            gather,
            scatter,
            replicas,
            layer_bytes: (layer_elems * c.dtype().size()) as f64,
        })
    }
}

/// A quarter, one and four times `n` elements: the block's message and
/// two sizes around it, for a fit.
fn around(n: usize) -> [usize; 3] {
    [(n / 4).max(1), n.max(1), n.max(1) * 4]
}

/// Calls of one probed size: the median of these is the point.
const PROBE_CALLS: usize = 7;

/// Times `coll` over `group` at each count of elements (a collective of
/// the group); `None` on a group of one rank, which sends nothing.
fn probe<M, C>(
    c: &C,
    group: &mut M,
    coll: Collective,
    counts: &[usize],
) -> Result<Option<WireProbe>, PipelineError>
where
    M: Communicator,
    C: Compute<Buf = M::Buffer>,
{
    let p = group.world();
    if p < 2 {
        return Ok(None);
    }
    let dtype = DType::F32;
    let mut points = Vec::new();
    for &n in counts {
        // A reduce-scatter needs whole shares of each rank.
        let n = n.div_ceil(p).max(1) * p;
        let mut buf = c.alloc(n)?;
        let mut share = c.alloc(n / p)?;
        let mut once = |g: &mut M| -> Result<f64, PipelineError> {
            let start = host_now_us();
            match coll {
                Collective::ReduceScatter => g.reduce_scatter(
                    Io::OutOfPlace {
                        send: &buf,
                        recv: &mut share,
                    },
                    n / p,
                    dtype,
                    ReduceOp::Sum,
                )?,
                Collective::AllGather => g.all_gather(
                    Io::OutOfPlace {
                        send: &share,
                        recv: &mut buf,
                    },
                    n / p,
                    dtype,
                )?,
                _ => g.all_reduce(Io::InPlace(&mut buf), n, dtype, ReduceOp::Sum)?,
            }
            g.sync()?;
            Ok(host_now_us() - start)
        };
        group.barrier()?;
        once(group)?;
        let mut took = (0..PROBE_CALLS)
            .map(|_| once(group))
            .collect::<Result<Vec<f64>, _>>()?;
        let us = median(&mut took).unwrap_or(0.0);
        // One rank's share for the sharded collectives, the buffer for an all-reduce.
        let bytes = (if matches!(coll, Collective::ReduceScatter | Collective::AllGather) {
            n / p
        } else {
            n
        } * dtype.size()) as u64;
        points.push((bytes, us * 1e-6));
    }
    Ok(Some(WireProbe {
        collective: coll,
        ranks: p,
        fit: fit(coll, &ModelAlgo::Selector("auto".into()), p, &points).ok(),
        points,
    }))
}

const TIMES_FIELDS: usize = 5 + 6 + 4 + 4 + 1;
const SPAN_FIELDS: usize = 4;

fn encode_figures(f: &RankFigures) -> Vec<f64> {
    let mut v = vec![f.times.len() as f64];
    for t in &f.times {
        v.extend([
            t.compute_us,
            t.tp_comm_us,
            t.dp_comm_us,
            t.dp_exposed_us,
            t.buckets as f64,
            t.shard_gather_us,
            t.shard_scatter_us,
            t.shard_exposed_us,
            t.shard_calls as f64,
            t.shard_handover_us,
            t.optimizer_us,
        ]);
        v.extend(held_fields(&t.held_end));
        v.extend(held_fields(&t.held_peak));
        v.push(t.held_peak_total);
    }
    for step in &f.spans {
        v.push(step.len() as f64);
        for s in step {
            v.extend([span_code(s.group), s.action as f64, s.offset_us, s.dur_us]);
        }
    }
    v
}

/// A span's group as a number on the wire, and back.
fn span_code(g: SpanGroup) -> f64 {
    match g {
        SpanGroup::Tp => 0.0,
        SpanGroup::Dp => 1.0,
        SpanGroup::DpThread => 2.0,
        SpanGroup::ShardGather => 3.0,
        SpanGroup::ShardScatter => 4.0,
    }
}

fn held_fields(h: &HeldBytes) -> [f64; 4] {
    [h.params, h.grads, h.optimizer, h.buffers]
}

fn held_of(v: &[f64]) -> HeldBytes {
    HeldBytes {
        params: v[0],
        grads: v[1],
        optimizer: v[2],
        buffers: v[3],
    }
}

fn span_group(code: f64) -> SpanGroup {
    match code {
        c if c > 3.5 => SpanGroup::ShardScatter,
        c if c > 2.5 => SpanGroup::ShardGather,
        c if c > 1.5 => SpanGroup::DpThread,
        c if c > 0.5 => SpanGroup::Dp,
        _ => SpanGroup::Tp,
    }
}

fn malformed(from: usize, what: &str) -> PipelineError {
    PipelineError::Protocol(format!("rank {from} sent a malformed {what}"))
}

/// A count read from a record: a whole number no larger than what is left.
fn count(from: usize, v: Option<&f64>, left: usize, what: &str) -> Result<usize, PipelineError> {
    match v {
        Some(&x) if x >= 0.0 && x.fract() == 0.0 && x <= left as f64 => Ok(x as usize),
        _ => Err(malformed(from, what)),
    }
}

fn decode_figures(from: usize, mesh: &MeshShape, v: &[f64]) -> Result<RankFigures, PipelineError> {
    let n = count(from, v.first(), v.len(), "figures")?;
    let mut at = 1;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = v
            .get(at..at + TIMES_FIELDS)
            .ok_or_else(|| malformed(from, "figures"))?;
        times.push(StageStepTimes {
            compute_us: t[0],
            tp_comm_us: t[1],
            dp_comm_us: t[2],
            dp_exposed_us: t[3],
            buckets: t[4].max(0.0) as usize,
            shard_gather_us: t[5],
            shard_scatter_us: t[6],
            shard_exposed_us: t[7],
            shard_calls: t[8].max(0.0) as usize,
            shard_handover_us: t[9],
            optimizer_us: t[10],
            held_end: held_of(&t[11..15]),
            held_peak: held_of(&t[15..19]),
            held_peak_total: t[19],
        });
        at += TIMES_FIELDS;
    }
    let mut spans = Vec::with_capacity(n);
    for _ in 0..n {
        let k = count(from, v.get(at), v.len(), "spans")?;
        at += 1;
        let raw = v
            .get(at..at + k * SPAN_FIELDS)
            .ok_or_else(|| malformed(from, "spans"))?;
        spans.push(
            raw.chunks_exact(SPAN_FIELDS)
                .map(|s| CommSpan {
                    group: span_group(s[0]),
                    action: s[1].max(0.0) as usize,
                    offset_us: s[2],
                    dur_us: s[3],
                })
                .collect(),
        );
        at += k * SPAN_FIELDS;
    }
    Ok(RankFigures {
        rank: from,
        coords: mesh.coords(from),
        times,
        spans,
    })
}

fn encode_check(c: Option<GradCheck>) -> Vec<f64> {
    match c {
        None => vec![0.0],
        Some(g) => vec![
            1.0,
            g.max_rel_err,
            g.differing as f64,
            g.values as f64,
            g.weights_differing as f64,
            g.weights_compared as f64,
        ],
    }
}

fn decode_check(from: usize, v: &[f64]) -> Result<Option<GradCheck>, PipelineError> {
    match v {
        [flag] if *flag == 0.0 => Ok(None),
        [_, err, differing, values, w_differing, w_compared] => Ok(Some(GradCheck {
            max_rel_err: *err,
            differing: differing.max(0.0) as usize,
            values: values.max(0.0) as usize,
            weights_differing: w_differing.max(0.0) as usize,
            weights_compared: w_compared.max(0.0) as usize,
        })),
        _ => Err(malformed(from, "check")),
    }
}

/// A pipeline's first rank sends its steps: `[1, ranks, uncertainty per
/// rank, steps, each step's origin, then per rank the length and the
/// executor's encoding of its timed steps]`; any other rank `[0]`.
fn encode_pipeline(rec: Option<&RunRecord>) -> Vec<f64> {
    let Some(rec) = rec else {
        return vec![0.0];
    };
    let ranks = rec.steps.first().map_or(0, Vec::len);
    let mut v = vec![1.0, ranks as f64];
    v.extend((0..ranks).map(|r| rec.uncertainty_us(r)));
    v.push(rec.origins_us.len() as f64);
    v.extend(&rec.origins_us);
    for r in 0..ranks {
        let mine: Vec<RankStep> = rec.steps.iter().filter_map(|s| s.get(r).cloned()).collect();
        let enc = encode_steps(&mine);
        v.push(enc.len() as f64);
        v.extend(enc);
    }
    v
}

fn decode_pipeline(from: usize, v: &[f64]) -> Result<Option<PipelineSteps>, PipelineError> {
    if v.first() == Some(&0.0) && v.len() == 1 {
        return Ok(None);
    }
    let bad = || malformed(from, "pipeline record");
    let ranks = count(from, v.get(1), v.len(), "pipeline record")?;
    let unc = v.get(2..2 + ranks).ok_or_else(bad)?.to_vec();
    let mut at = 2 + ranks;
    let n = count(from, v.get(at), v.len(), "pipeline record")?;
    let origins = v.get(at + 1..at + 1 + n).ok_or_else(bad)?.to_vec();
    at += 1 + n;
    // Per rank its steps; then turned round into steps of ranks.
    let mut per_rank = Vec::with_capacity(ranks);
    for _ in 0..ranks {
        let n = count(from, v.get(at), v.len(), "pipeline record")?;
        at += 1;
        per_rank.push(decode_steps(v.get(at..at + n).ok_or_else(bad)?, from)?);
        at += n;
    }
    let steps = per_rank.first().map_or(0, Vec::len);
    if per_rank.iter().any(|r| r.len() != steps) {
        return Err(bad());
    }
    let steps = (0..steps)
        .map(|i| per_rank.iter().map(|r| r[i].clone()).collect())
        .collect();
    Ok(Some(PipelineSteps {
        head: from,
        steps,
        uncertainty_us: unc,
        origins_us: origins,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::mesh::Order;

    #[test]
    fn figures_and_checks_cross_the_wire_unchanged() {
        let mesh = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
        let f = RankFigures {
            rank: 5,
            coords: mesh.coords(5),
            times: vec![StageStepTimes {
                compute_us: 1.5,
                tp_comm_us: 2.0,
                dp_comm_us: 3.0,
                dp_exposed_us: 1.0,
                buckets: 2,
                shard_gather_us: 4.0,
                shard_scatter_us: 5.0,
                shard_exposed_us: 6.0,
                shard_calls: 7,
                shard_handover_us: 7.5,
                optimizer_us: 8.0,
                held_end: HeldBytes {
                    params: 1.0,
                    grads: 2.0,
                    optimizer: 3.0,
                    buffers: 4.0,
                },
                held_peak: HeldBytes::default(),
                held_peak_total: 11.0,
            }],
            spans: vec![vec![CommSpan {
                group: SpanGroup::Dp,
                action: 3,
                offset_us: 10.0,
                dur_us: 4.0,
            }]],
        };
        assert_eq!(decode_figures(5, &mesh, &encode_figures(&f)).unwrap(), f);
        let g = GradCheck {
            max_rel_err: 1e-7,
            differing: 3,
            values: 10,
            weights_differing: 1,
            weights_compared: 4,
        };
        assert_eq!(decode_check(1, &encode_check(Some(g))).unwrap(), Some(g));
        assert_eq!(decode_check(1, &encode_check(None)).unwrap(), None);
        assert!(decode_figures(5, &mesh, &[3.0, 1.0]).is_err());
        let step = |t: f64| RankStep {
            actions: vec![ActionTiming {
                action: crate::schedule::Action::new(0, crate::schedule::ActionKind::F, 1),
                asked_us: t,
                arrived_us: None,
                input_sent_us: Some(t + 1.0),
                start_us: t + 2.0,
                work_end_us: t + 3.0,
                sent_us: None,
                end_us: t + 4.0,
            }],
            peak_activations: 1,
            peak_activation_bytes: 64,
            device_uncertainty_us: 0.0,
        };
        let rec = RunRecord {
            steps: vec![vec![step(0.0), step(10.0)], vec![step(20.0), step(30.0)]],
            grad_max_err: None,
            message_us: 1.0,
            clocks: Vec::new(),
            origins_us: vec![100.0, 200.0],
        };
        let p = decode_pipeline(4, &encode_pipeline(Some(&rec)))
            .unwrap()
            .unwrap();
        assert_eq!((p.head, &p.steps), (4, &rec.steps));
        assert_eq!(p.origins_us, rec.origins_us);
        assert_eq!(decode_pipeline(4, &encode_pipeline(None)).unwrap(), None);
        assert!(decode_pipeline(1, &[1.0, 9.0]).is_err());
    }
}
