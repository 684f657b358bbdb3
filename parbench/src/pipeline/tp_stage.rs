//! Pipeline stages made of Megatron transformer blocks, each block split
//! over the stage's tensor-parallel group, with the data-parallel
//! reduction of the stage's gradients after the step: the composed
//! `dp x tp x pp` step, one rank's part of it.
//!
//! - The model: `P x L` blocks ([`crate::layers::TpBlock`]); stage `s`
//!   holds blocks `s L .. (s + 1) L`, block `l`'s weights seeded from
//!   `(seed, l)`, so that one rank can build the whole model as the
//!   reference ([`reference_grads`]).
//! - The batch: the global batch of `D x M` microbatches of `b`
//!   sequences (`B = D M b`); data rank `d` runs microbatches
//!   `d M .. (d + 1) M`, each seeded by its global index. The loss is the
//!   mean over the global batch: each rank's loss gradient is scaled by
//!   `1 / M` (the mean over its microbatches, as Megatron divides the
//!   loss) and the data-parallel reduction averages (`ReduceOp::Avg`, as
//!   DDP divides by the group's size).
//! - The reduction: each stage's gradients in buckets of at most
//!   `bucket_bytes`, in reverse layer order (the order a backward makes
//!   them final, as DDP's buckets); all-reduce, or with the distributed
//!   optimizer reduce-scatter (each data rank keeps its share of each
//!   bucket). With `overlap` a stage's buckets start right after the
//!   action that made its gradients final (its last weight-gradient
//!   pass), between that rank's actions; otherwise after the rank's last
//!   action. The reduction runs in the rank's own thread, so an
//!   overlapped bucket fills time the rank would spend waiting on the
//!   pipeline, not time it computes.

use super::stage::StageWork;
use super::{PipelineError, Work};
use crate::comm::{Communicator, DType, Io, ReduceOp};
use crate::compute::Compute;
use crate::layers::layout::{DataSpecs, ParamSpecs};
use crate::layers::{BlockConfig, BlockState, Mode, PhaseClock, TpBlock};
use crate::measure::clock_sync::host_now_us;
use crate::schedule::{Action, ActionKind, Schedule};
use crate::seed::splitmix64;
use std::collections::HashMap;
use std::time::Duration;

/// How the data-parallel group reduces the gradients after the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DpReduce {
    /// Most bytes in one bucket (DDP's `bucket_cap_mb`, 25 MiB by default).
    pub bucket_bytes: usize,
    /// Start a stage's buckets as soon as its gradients are final.
    pub overlap: bool,
    /// Reduce-scatter instead of all-reduce: each data rank keeps its
    /// share of each bucket (the distributed optimizer's, ZeRO-1).
    pub dist_opt: bool,
}

impl Default for DpReduce {
    fn default() -> Self {
        DpReduce {
            bucket_bytes: 25 << 20,
            overlap: false,
            dist_opt: false,
        }
    }
}

/// The composed model: blocks, stages, batch and reduction.
#[derive(Clone, Debug)]
pub struct TpStageConfig {
    /// One block; `shape.batch` is the microbatch's sequences `b`. Train
    /// mode, prefill.
    pub block: BlockConfig,
    /// Blocks per stage `L`.
    pub layers_per_stage: usize,
    /// Seed of weights, inputs and loss gradients.
    pub seed: u64,
    /// Data-parallel degree `D` (the global batch is `D M` microbatches).
    pub dp: usize,
    pub reduce: DpReduce,
}

impl TpStageConfig {
    /// Checks the sizes for `tp` ranks; one line naming what is wrong.
    pub fn validate(&self, tp: usize) -> Result<(), PipelineError> {
        let invalid = |m: String| Err(PipelineError::Invalid(m));
        if self.block.mode != Mode::Train || self.block.decode {
            return invalid("a pipeline stage trains a prefill block".into());
        }
        if self.layers_per_stage == 0 || self.dp == 0 {
            return invalid("a stage needs at least one block and one data rank".into());
        }
        if self.reduce.bucket_bytes == 0 {
            return invalid("the bucket size must be positive".into());
        }
        self.block
            .validate(tp)
            .map_err(|e| PipelineError::Invalid(e.to_string()))
    }
}

const TAG_X: u64 = 0x5854_4147;
const TAG_DY: u64 = 0x4459_5441;

/// Seed of block `layer` of the whole model.
pub fn layer_seed(seed: u64, layer: usize) -> u64 {
    splitmix64(seed ^ splitmix64(layer as u64 + 1))
}

/// Seed of global microbatch `g`'s input (`tag` X) or loss gradient (DY).
fn data_seed(seed: u64, tag: u64, g: usize) -> u64 {
    splitmix64(seed ^ tag ^ splitmix64(g as u64).rotate_left(17))
}

/// Microbatch `g`'s input (or loss gradient scaled by `scale`): rank
/// `rank` of `tp`'s rows.
fn seeded_act<C: Compute>(
    c: &C,
    cfg: &TpStageConfig,
    tp: usize,
    rank: usize,
    g: usize,
    gradient: Option<f32>,
) -> Result<C::Buf, PipelineError> {
    let ds = DataSpecs::new(&cfg.block, tp);
    let mut v = match gradient {
        None => ds.x.shard_values(data_seed(cfg.seed, TAG_X, g), tp, rank),
        Some(_) => ds.dy.shard_values(data_seed(cfg.seed, TAG_DY, g), tp, rank),
    };
    if let Some(scale) = gradient {
        for x in &mut v {
            *x *= scale;
        }
    }
    let mut b = c.alloc(v.len())?;
    c.upload(&v, &mut b)?;
    Ok(b)
}

/// One step's times on one rank, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageStepTimes {
    /// The blocks' compute (host time between collectives).
    pub compute_us: f64,
    /// The tensor-parallel collectives.
    pub tp_comm_us: f64,
    /// Every data-parallel bucket's reduction.
    pub dp_comm_us: f64,
    /// The part of `dp_comm_us` after the rank's last action's work
    /// (nothing of the pipeline left to hide it).
    pub dp_exposed_us: f64,
    /// Buckets reduced.
    pub buckets: usize,
}

impl StageStepTimes {
    /// Adds what `clock` counted (one pass).
    fn charge(&mut self, clock: &PhaseClock) {
        self.compute_us += clock.compute().as_secs_f64() * 1e6;
        self.tp_comm_us += clock.comm().as_secs_f64() * 1e6;
    }

    /// The part of the data-parallel reduction before the rank's last
    /// action ended: overlapped with the pipeline.
    pub fn dp_hidden_us(&self) -> f64 {
        (self.dp_comm_us - self.dp_exposed_us).max(0.0)
    }
}

/// Which group a communication span ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanGroup {
    /// A tensor-parallel collective inside a pass.
    Tp,
    /// A data-parallel bucket's reduction.
    Dp,
}

/// One communication phase of one step on one rank, placed against the
/// action it ran in (or after, for a bucket): its start counted from that
/// action's work start on the rank's own clock, so that a trace can put it
/// on whatever base the action's times are moved to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommSpan {
    pub group: SpanGroup,
    /// The action's place in the rank's list for the step.
    pub action: usize,
    pub offset_us: f64,
    pub dur_us: f64,
}

/// This rank's stages of the composed model, over its tensor group `tp`
/// and data group `dp` (the pipeline group is the executor's).
pub struct TpStages<'g, C: Compute, T, D> {
    cfg: TpStageConfig,
    dtype: DType,
    /// Stage -> its blocks, first to last.
    blocks: HashMap<usize, Vec<TpBlock<C>>>,
    tp: &'g mut T,
    dp: &'g mut D,
    /// Microbatches per data rank.
    microbatches: usize,
    /// Actions this rank runs per step, and how many ran in this step.
    actions: usize,
    done: usize,
    /// Per stage: weight-gradient passes run this step.
    weight_passes: HashMap<usize, usize>,
    /// Stages whose buckets were reduced this step.
    reduced: Vec<usize>,
    /// Per (stage, bucket): this rank's share after a reduce-scatter,
    /// and its elements.
    shares: HashMap<(usize, usize), (C::Buf, usize)>,
    /// Under `--work sleep`: one state per stage for the collectives.
    scratch: HashMap<usize, BlockState<C::Buf>>,
    step: StageStepTimes,
    /// Every step's times (warm-up steps first).
    pub times: Vec<StageStepTimes>,
    /// Host time the current action's work began: spans are placed from
    /// it, as the executor's record places the action.
    action_start_us: f64,
    /// The current action has begun a pass (a `B` runs two, the input-
    /// and the weight-gradient pass: its start is the first one's).
    in_action: bool,
    /// Tests only: [`Self::whole_grads`] changes one value.
    corrupt: bool,
    step_spans: Vec<CommSpan>,
    /// Every step's communication spans (warm-up steps first).
    pub spans: Vec<Vec<CommSpan>>,
}

/// One parameter gradient's place in a bucket.
struct Slot {
    layer: usize,
    param: usize,
    offset: usize,
    len: usize,
}

impl<'g, C, T, D> TpStages<'g, C, T, D>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
{
    /// The stages of `schedule` that pipeline rank `pp_rank` holds, built
    /// on tensor rank `tp.rank()` (blocks under `--work sleep` too: their
    /// collectives need the buffers).
    pub fn new(
        c: &C,
        cfg: &TpStageConfig,
        schedule: &Schedule,
        pp_rank: usize,
        work: Work,
        tp: &'g mut T,
        dp: &'g mut D,
    ) -> Result<Self, PipelineError> {
        cfg.validate(tp.world())?;
        if dp.world() != cfg.dp {
            return Err(PipelineError::Invalid(format!(
                "{} data ranks configured, the data group has {}",
                cfg.dp,
                dp.world()
            )));
        }
        let (t, rank) = (tp.world(), tp.rank());
        let mut blocks = HashMap::new();
        let mut scratch = HashMap::new();
        for st in schedule.stages_of(pp_rank) {
            let first = st * cfg.layers_per_stage;
            let layers = (first..first + cfg.layers_per_stage)
                .map(|l| {
                    TpBlock::new(c, &cfg.block, t, rank, layer_seed(cfg.seed, l)).map_err(layer_err)
                })
                .collect::<Result<Vec<_>, _>>()?;
            if matches!(work, Work::Sleep(_)) {
                let x = c.alloc(cfg.block.tokens() * cfg.block.shape.hidden)?;
                scratch.insert(st, layers[0].new_state(c, x).map_err(layer_err)?);
            }
            blocks.insert(st, layers);
        }
        Ok(TpStages {
            cfg: cfg.clone(),
            dtype: c.dtype(),
            blocks,
            tp,
            dp,
            microbatches: schedule.microbatches,
            actions: schedule.compute_actions(pp_rank).len(),
            done: 0,
            weight_passes: HashMap::new(),
            reduced: Vec::new(),
            shares: HashMap::new(),
            scratch,
            step: StageStepTimes::default(),
            times: Vec::new(),
            action_start_us: host_now_us(),
            in_action: false,
            corrupt: false,
            step_spans: Vec::new(),
            spans: Vec::new(),
        })
    }

    /// Adds one pass's compute and tensor-parallel time, and its
    /// collectives' spans (`born`: host time the pass's clock began).
    fn charge(&mut self, clock: &PhaseClock, born: f64) {
        self.step.charge(clock);
        let at = born - self.action_start_us;
        let action = self.done;
        self.step_spans
            .extend(clock.comm_spans().iter().map(|&(a, b)| CommSpan {
                group: SpanGroup::Tp,
                action,
                offset_us: at + a.as_secs_f64() * 1e6,
                dur_us: (b - a).as_secs_f64() * 1e6,
            }));
    }

    /// Stamps the current action's start, once per action (a `B`'s weight
    /// pass continues the action its input pass began).
    fn begin_action(&mut self) {
        if !self.in_action {
            self.action_start_us = host_now_us();
            self.in_action = true;
        }
    }

    fn layers(&mut self, stage: usize) -> Result<&mut Vec<TpBlock<C>>, PipelineError> {
        self.blocks
            .get_mut(&stage)
            .ok_or_else(|| PipelineError::Protocol(format!("stage {stage} is not on this rank")))
    }

    /// Global index of this data rank's microbatch `mb`.
    fn global_mb(&self, mb: usize) -> usize {
        self.dp.rank() * self.microbatches + mb
    }

    /// The buckets of `stage`: its gradients in reverse layer order, each
    /// bucket at most `bucket_bytes` (a larger tensor is a bucket alone).
    fn buckets(&self, stage: usize) -> Vec<Vec<Slot>> {
        let elem = self.dtype.size();
        let cap = (self.cfg.reduce.bucket_bytes / elem).max(1);
        let specs = ParamSpecs::new(&self.cfg.block);
        let t = self.tp.world();
        let layers = self.blocks.get(&stage).map_or(0, Vec::len);
        let mut out: Vec<Vec<Slot>> = Vec::new();
        let mut fill = 0usize;
        for layer in (0..layers).rev() {
            for (param, spec) in specs.all().iter().enumerate().rev() {
                let len = spec.local_len(t);
                if out.is_empty() || (fill > 0 && fill + len > cap) {
                    out.push(Vec::new());
                    fill = 0;
                }
                if let Some(b) = out.last_mut() {
                    b.push(Slot {
                        layer,
                        param,
                        offset: fill,
                        len,
                    });
                }
                fill += len;
            }
        }
        out
    }

    /// Reduces `stage`'s gradients over the data group, bucket by bucket:
    /// each bucket's gradients copied into one buffer, averaged across
    /// the group (all-reduce, or reduce-scatter keeping this rank's share),
    /// and copied back. Times go to this step's `dp_comm_us`, and to its
    /// exposed part when `exposed`.
    fn reduce_stage(&mut self, c: &C, stage: usize, exposed: bool) -> Result<(), PipelineError> {
        if self.reduced.contains(&stage) {
            return Ok(());
        }
        self.reduced.push(stage);
        let d = self.dp.world();
        if d == 1 {
            return Ok(());
        }
        let dtype = self.dtype;
        for (bi, bucket) in self.buckets(stage).into_iter().enumerate() {
            let used: usize = bucket.iter().map(|s| s.len).sum();
            // A reduce-scatter needs whole shares: the bucket is padded.
            let len = used.div_ceil(d) * d;
            let start = host_now_us();
            let mut buf = c.alloc(len)?;
            let blocks = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
            for s in &bucket {
                let g = grad(blocks, s)?;
                c.copy(g, 0, &mut buf, s.offset, s.len)?;
            }
            c.sync()?;
            if self.cfg.reduce.dist_opt {
                let mut share = c.alloc(len / d)?;
                self.dp.reduce_scatter(
                    Io::OutOfPlace {
                        send: &buf,
                        recv: &mut share,
                    },
                    len / d,
                    dtype,
                    ReduceOp::Avg,
                )?;
                self.dp.sync()?;
                self.shares.insert((stage, bi), (share, len / d));
            } else {
                self.dp
                    .all_reduce(Io::InPlace(&mut buf), len, dtype, ReduceOp::Avg)?;
                self.dp.sync()?;
                let blocks = self.blocks.get_mut(&stage).ok_or_else(|| missing(stage))?;
                for s in &bucket {
                    let g = grad_mut(blocks, s)?;
                    c.copy(&buf, s.offset, g, 0, s.len)?;
                }
                c.sync()?;
            }
            let took = host_now_us() - start;
            self.step_spans.push(CommSpan {
                group: SpanGroup::Dp,
                action: self.done.saturating_sub(1),
                offset_us: start - self.action_start_us,
                dur_us: took,
            });
            self.step.dp_comm_us += took;
            if exposed {
                self.step.dp_exposed_us += took;
            }
            self.step.buckets += 1;
        }
        Ok(())
    }

    /// This rank's gradients after the step, per stage it holds (stage
    /// order), per block, per parameter ([`ParamSpecs::all`]'s order),
    /// as reduced over the data group. With the distributed optimizer
    /// each data rank holds a share of each bucket: the shares are
    /// gathered over the data group first (a collective of the group,
    /// for the check only; a real step would update its share instead).
    pub fn reduced_grads(&mut self, c: &C) -> Result<Vec<Vec<Vec<f32>>>, PipelineError> {
        let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
        stages.sort_unstable();
        let d = self.dp.world();
        let dtype = self.dtype;
        let t = self.tp.world();
        let specs = ParamSpecs::new(&self.cfg.block);
        let mut out = Vec::new();
        for st in stages {
            let blocks = self.blocks.get(&st).ok_or_else(|| missing(st))?;
            let mut per = Vec::with_capacity(blocks.len());
            for (layer, _) in blocks.iter().enumerate() {
                let params = (0..8)
                    .map(|param| {
                        let len = specs.all()[param].local_len(t);
                        let s = Slot {
                            layer,
                            param,
                            offset: 0,
                            len,
                        };
                        download_n(c, grad(blocks, &s)?, len)
                    })
                    .collect::<Result<Vec<_>, PipelineError>>()?;
                per.push(params);
            }
            if self.cfg.reduce.dist_opt && d > 1 {
                for (bi, bucket) in self.buckets(st).into_iter().enumerate() {
                    let (share, n) = self.shares.get(&(st, bi)).ok_or_else(|| {
                        PipelineError::Protocol(format!(
                            "bucket {bi} of stage {st} was not reduced"
                        ))
                    })?;
                    let flat = gather_to_host(c, &mut *self.dp, share, *n, dtype)?;
                    for s in &bucket {
                        per[s.layer][s.param] = flat[s.offset..s.offset + s.len].to_vec();
                    }
                }
            }
            out.push(per.into_iter().flatten().collect());
        }
        Ok(out)
    }
}

impl<'g, C, T, D> TpStages<'g, C, T, D>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
{
    /// [`TpStages::reduced_grads`] with each tensor gathered across the
    /// tensor group and assembled whole (a collective of both groups).
    pub fn whole_grads(&mut self, c: &C) -> Result<Vec<Vec<Vec<f32>>>, PipelineError> {
        let mut local = self.reduced_grads(c)?;
        if self.corrupt {
            // Far beyond any rounding: a check that passes this is broken.
            if let Some(v) = local.iter_mut().flatten().flatten().next() {
                *v += 1.0 + v.abs();
            }
        }
        let t = self.tp.world();
        let specs = ParamSpecs::new(&self.cfg.block).grads(self.cfg.block.sequence_split(t));
        let mut out = Vec::with_capacity(local.len());
        for stage in local {
            let mut whole = Vec::with_capacity(stage.len());
            for (i, shard) in stage.into_iter().enumerate() {
                let spec = &specs[i % 8];
                let shards = if t == 1 {
                    vec![shard]
                } else {
                    let n = shard.len();
                    let mut send = c.alloc(n)?;
                    c.upload(&shard, &mut send)?;
                    let flat = gather_to_host(c, &mut *self.tp, &send, n, self.dtype)?;
                    flat.chunks(n.max(1)).take(t).map(<[f32]>::to_vec).collect()
                };
                whole.push(spec.assemble(t, &shards).map_err(layer_err)?);
            }
            out.push(whole);
        }
        Ok(out)
    }

    /// Tests only: this rank's reduced gradients, as [`Self::whole_grads`]
    /// gathers them for the check, get one value changed, so that a test
    /// can see the check fail.
    pub fn corrupt_for_test(&mut self) {
        self.corrupt = true;
    }

    /// This rank's place: (tensor rank, data rank).
    pub fn place(&self) -> (usize, usize) {
        (self.tp.rank(), self.dp.rank())
    }
}

fn layer_err(e: crate::layers::LayerError) -> PipelineError {
    match e {
        crate::layers::LayerError::Comm(e) => PipelineError::Comm(e),
        crate::layers::LayerError::Compute(e) => PipelineError::Compute(e),
        crate::layers::LayerError::Config(m) => PipelineError::Invalid(m),
    }
}

fn missing(stage: usize) -> PipelineError {
    PipelineError::Protocol(format!("stage {stage} is not on this rank"))
}

fn grad<'a, C: Compute>(blocks: &'a [TpBlock<C>], s: &Slot) -> Result<&'a C::Buf, PipelineError> {
    let g = blocks
        .get(s.layer)
        .and_then(|b| b.param_grads())
        .ok_or_else(|| PipelineError::Protocol(format!("block {} has no gradients", s.layer)))?;
    Ok(g.all()[s.param])
}

fn grad_mut<'a, C: Compute>(
    blocks: &'a mut [TpBlock<C>],
    s: &Slot,
) -> Result<&'a mut C::Buf, PipelineError> {
    blocks
        .get_mut(s.layer)
        .and_then(|b| b.param_grad_mut(s.param))
        .ok_or_else(|| PipelineError::Protocol(format!("block {} has no gradients", s.layer)))
}

fn download_n<C: Compute>(c: &C, buf: &C::Buf, n: usize) -> Result<Vec<f32>, PipelineError> {
    let mut v = vec![0f32; n];
    c.download(buf, &mut v)?;
    Ok(v)
}

/// All-gathers `n` elements of `send` from every rank of `group` and
/// downloads the `n * world` of them, rank by rank.
fn gather_to_host<C, G>(
    c: &C,
    group: &mut G,
    send: &C::Buf,
    n: usize,
    dtype: DType,
) -> Result<Vec<f32>, PipelineError>
where
    C: Compute,
    G: Communicator<Buffer = C::Buf> + ?Sized,
{
    let total = n * group.world();
    let mut all = c.alloc(total)?;
    group.all_gather(
        Io::OutOfPlace {
            send,
            recv: &mut all,
        },
        n,
        dtype,
    )?;
    group.sync()?;
    download_n(c, &all, total)
}

impl<'g, C, T, D> StageWork<C> for TpStages<'g, C, T, D>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
{
    /// One state per block, first to last.
    type Stash = Vec<BlockState<C::Buf>>;

    fn message_len(&self) -> usize {
        let t = self.tp.world();
        DataSpecs::new(&self.cfg.block, t).x.local_len(t)
    }

    fn zero_grads(&mut self, c: &C) -> Result<(), PipelineError> {
        for layers in self.blocks.values_mut() {
            for b in layers {
                b.zero_grads(c).map_err(layer_err)?;
            }
        }
        self.shares.clear();
        self.reduced.clear();
        self.weight_passes.clear();
        self.done = 0;
        self.step = StageStepTimes::default();
        self.step_spans.clear();
        Ok(())
    }

    fn forward(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        x: Option<C::Buf>,
    ) -> Result<(C::Buf, Self::Stash), PipelineError> {
        self.begin_action();
        let (t, r) = (self.tp.world(), self.tp.rank());
        let mut x = match x {
            Some(x) => x,
            None => seeded_act(c, &self.cfg, t, r, self.global_mb(mb), None)?,
        };
        let born = host_now_us();
        let mut clock = PhaseClock::new();
        let tp = &mut *self.tp;
        let layers = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
        let mut stash = Vec::with_capacity(layers.len());
        for b in layers {
            let mut st = b.new_state(c, x).map_err(layer_err)?;
            b.forward_state(c, tp, &mut clock, &mut st)
                .map_err(layer_err)?;
            x = st.take_output(c).map_err(layer_err)?;
            stash.push(st);
        }
        self.charge(&clock, born);
        Ok((x, stash))
    }

    fn backward_input(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        stash: &mut Self::Stash,
        dy: Option<C::Buf>,
        need_dx: bool,
    ) -> Result<Option<C::Buf>, PipelineError> {
        self.begin_action();
        let (t, r) = (self.tp.world(), self.tp.rank());
        let scale = 1.0 / self.microbatches as f32;
        let mut dy = match dy {
            Some(g) => g,
            None => seeded_act(c, &self.cfg, t, r, self.global_mb(mb), Some(scale))?,
        };
        let born = host_now_us();
        let mut clock = PhaseClock::new();
        let tp = &mut *self.tp;
        let layers = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
        for (b, st) in layers.iter().zip(stash.iter_mut()).rev() {
            b.backward_input_state(c, tp, &mut clock, st, dy)
                .map_err(layer_err)?;
            dy = st.take_input_grad(c).map_err(layer_err)?;
        }
        self.charge(&clock, born);
        Ok(need_dx.then_some(dy))
    }

    fn backward_weight(
        &mut self,
        c: &C,
        stage: usize,
        stash: Self::Stash,
    ) -> Result<(), PipelineError> {
        self.begin_action();
        let born = host_now_us();
        let mut clock = PhaseClock::new();
        let layers = self.layers(stage)?;
        for (b, st) in layers.iter_mut().zip(&stash).rev() {
            b.backward_weight_state(c, &mut clock, st)
                .map_err(layer_err)?;
        }
        self.charge(&clock, born);
        Ok(())
    }

    fn stash_bytes(&self, stash: &Self::Stash) -> usize {
        stash.iter().map(BlockState::elems).sum::<usize>() * self.dtype.size()
    }

    fn stand_in(&mut self, c: &C, a: Action, d: Duration) -> Result<(), PipelineError> {
        self.begin_action();
        let Some(layers) = self.blocks.get(&a.stage) else {
            return Err(missing(a.stage));
        };
        let st = self
            .scratch
            .get_mut(&a.stage)
            .ok_or_else(|| missing(a.stage))?;
        let per_layer = d / layers.len().max(1) as u32;
        let talks = !matches!(a.kind, ActionKind::W);
        let born = host_now_us();
        let mut clock = PhaseClock::new();
        for b in layers {
            std::thread::sleep(per_layer);
            clock.end_compute(c).map_err(layer_err)?;
            if talks {
                b.pass_collectives(c, &mut *self.tp, &mut clock, st)
                    .map_err(layer_err)?;
            }
        }
        self.charge(&clock, born);
        Ok(())
    }

    fn after_action(&mut self, c: &C, a: Action) -> Result<(), PipelineError> {
        self.in_action = false;
        self.done += 1;
        let last = self.done == self.actions;
        if matches!(a.kind, ActionKind::B | ActionKind::W) {
            let n = self.weight_passes.entry(a.stage).or_insert(0);
            *n += 1;
            if *n == self.microbatches && self.cfg.reduce.overlap {
                self.reduce_stage(c, a.stage, last)?;
            }
        }
        Ok(())
    }

    fn after_step(&mut self, c: &C) -> Result<(), PipelineError> {
        let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
        stages.sort_unstable();
        for st in stages {
            self.reduce_stage(c, st, true)?;
        }
        self.times.push(self.step);
        self.spans.push(std::mem::take(&mut self.step_spans));
        Ok(())
    }
}

/// One rank running the whole model (every stage's blocks at `tp = 1`)
/// on the whole global batch, microbatch by microbatch with the
/// gradients accumulating: each block's gradients, in the order of
/// [`TpStages::reduced_grads`] over every stage. The loss is the mean
/// over the `dp x microbatches` microbatches, as the composed step's.
pub fn reference_grads<C, M>(
    c: &C,
    comm: &mut M,
    cfg: &TpStageConfig,
    stages: usize,
    microbatches: usize,
) -> Result<Vec<Vec<Vec<f32>>>, PipelineError>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let one = TpStageConfig {
        block: BlockConfig {
            seq_parallel: false,
            ..cfg.block
        },
        ..cfg.clone()
    };
    one.validate(1)?;
    let layers = stages * cfg.layers_per_stage;
    let mut blocks = (0..layers)
        .map(|l| TpBlock::new(c, &one.block, 1, 0, layer_seed(cfg.seed, l)).map_err(layer_err))
        .collect::<Result<Vec<_>, _>>()?;
    for b in &mut blocks {
        b.zero_grads(c).map_err(layer_err)?;
    }
    let total = cfg.dp * microbatches;
    let scale = 1.0 / total as f32;
    let mut clock = PhaseClock::new();
    for g in 0..total {
        let mut x = seeded_act(c, &one, 1, 0, g, None)?;
        let mut states = Vec::with_capacity(layers);
        for b in &blocks {
            let mut st = b.new_state(c, x).map_err(layer_err)?;
            b.forward_state(c, comm, &mut clock, &mut st)
                .map_err(layer_err)?;
            x = st.take_output(c).map_err(layer_err)?;
            states.push(st);
        }
        let mut dy = seeded_act(c, &one, 1, 0, g, Some(scale))?;
        for (b, st) in blocks.iter_mut().zip(states.iter_mut()).rev() {
            b.backward_input_state(c, comm, &mut clock, st, dy)
                .map_err(layer_err)?;
            dy = st.take_input_grad(c).map_err(layer_err)?;
            b.backward_weight_state(c, &mut clock, st)
                .map_err(layer_err)?;
        }
    }
    let per_block = blocks
        .iter()
        .map(|b| {
            let g = b
                .param_grads()
                .ok_or_else(|| PipelineError::Invalid("reference without gradients".into()))?;
            let specs = ParamSpecs::new(&one.block);
            g.all()
                .iter()
                .zip(specs.all())
                .map(|(buf, spec)| download_n(c, buf, spec.local_len(1)))
                .collect()
        })
        .collect::<Result<Vec<Vec<Vec<f32>>>, PipelineError>>()?;
    Ok(per_block
        .chunks(cfg.layers_per_stage)
        .map(|ch| ch.iter().flatten().cloned().collect())
        .collect())
}
