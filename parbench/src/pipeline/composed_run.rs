//! One composed `dp x tp x pp` run on one rank of the world, end to end:
//! the mesh, this rank's [`TpStages`], the schedule's steps
//! ([`super::run_stages`]), the gradient check ([`check_composed`]), short
//! probes of the tensor and data groups' wires at the sizes the step uses,
//! and every rank's figures gathered on world rank 0 (each wait held to
//! the communicator's deadline).
//!
//! What world rank 0 gets back ([`ComposedRecord`], in
//! [`super::composed_record`]) is what a binary prints and records: its
//! own pipeline's full record (the common clock of the pipeline issue),
//! every pipeline's steps (all on world rank 0's clock, each step from the
//! world's first work start: [`super::world_base`]), every rank's
//! [`StageStepTimes`] and communication spans, every replica's check; they
//! cross the world in [`super::composed_gather`]'s form.
//!
//! The mesh's groups are host algorithms over the world's point-to-point
//! calls ([`crate::comm::group`]), so the stages compute on host buffers
//! (the CPU) whatever the world's backend.

use super::composed::{check_composed, GradCheck};
use super::composed_gather::{
    decode_check, decode_figures, decode_pipeline, encode_check, encode_figures, encode_pipeline,
};
use super::composed_record::{ComposedRecord, PipelineSteps, RankFigures, ShardWires, WireProbe};
use super::dp_overlap::{overlap_comm, with_overlap};
use super::exec::{recv_f64s, send_f64s};
use super::tp_stage::{CommSpan, StageStepTimes, TpStageConfig, TpStages};
use super::world_base::onto_world_base;
use super::{run_stages, PipelineConfig, PipelineError, RunRecord, Work};
use crate::comm::group::split;
use crate::comm::mesh::{with_mesh, MeshShape, SharedComm};
use crate::comm::{Algo, Collective, Communicator, DType, HostBuffer, Io, ReduceOp};
use crate::compute::Compute;
use crate::layers::layout::ParamSpecs;
use crate::measure::clock_sync::{self, estimate_offsets, host_now_us, TimeBase};
use crate::model::algo::ModelAlgo;
use crate::model::fit::fit;
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
