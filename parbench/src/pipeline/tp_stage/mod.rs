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
//!   bucket). Without `overlap` every bucket is reduced on the rank's own
//!   thread after its last action. With `overlap` (DDP's and Megatron's
//!   `overlap_grad_reduce`) a bucket is handed to the reduction thread of
//!   [`super::dp_overlap`] as soon as every gradient in it is final: in
//!   the stage's last weight-gradient pass (its `M`-th), right after the
//!   lowest layer the bucket holds; it then runs concurrently with the
//!   rest of that pass and the rank's later actions, and the step waits
//!   at its end only for what is still running.

mod adam;
mod buckets;
mod config;
mod reference;
mod shard;
mod shares;
mod step_times;
mod work;

use buckets::{download_n, Launched};
pub use config::{DpReduce, TpStageConfig};
pub use reference::reference_grads;
pub use shard::bytes_per_param;
pub use step_times::{CommSpan, HeldBytes, SpanGroup, StageStepTimes};

use super::dp_overlap::Reducer;
use super::stage::StageWork;
use super::{PipelineError, Work};
use crate::comm::{Communicator, DType, Io, ReduceOp};
use crate::compute::Compute;
use crate::layers::layout::{DataSpecs, ParamSpecs};
use crate::layers::{BlockConfig, BlockState, PhaseClock, TpBlock};
use crate::measure::clock_sync::host_now_us;
use crate::schedule::{Action, ActionKind, Schedule};
use crate::seed::splitmix64;
use std::collections::HashMap;
use std::time::Duration;

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

/// This rank's stages of the composed model, over its tensor group `tp`
/// and data group `dp` (the pipeline group is the executor's).
pub struct TpStages<'g, C: Compute, T, D> {
    cfg: TpStageConfig,
    dtype: DType,
    /// Stage -> its blocks, first to last.
    blocks: HashMap<usize, Vec<TpBlock<C>>>,
    tp: &'g mut T,
    /// The shard group: the whole data group unless sharding is hybrid.
    dp: &'g mut D,
    /// Hybrid sharding: the replica group (the data ranks holding the
    /// same share), across which the shares are averaged.
    replicas: Option<&'g mut D>,
    /// This rank's data-parallel rank (its microbatches' place).
    data_rank: usize,
    /// ZeRO-3: per (stage, layer) this rank's share of the weights.
    param_shares: HashMap<(usize, usize), C::Buf>,
    /// ZeRO-2 and -3: per (stage, layer) this rank's share of the
    /// reduced gradients, accumulated over the microbatches.
    grad_shares: HashMap<(usize, usize), C::Buf>,
    /// Per (stage, unit) Adam's state for this rank's share.
    adam: HashMap<(usize, usize), adam::AdamState>,
    /// Bytes of a communication copy held at the moment (for [`HeldBytes`]).
    transient: f64,
    /// ZeRO-3 with prefetch: the gathers handed to the thread, in order,
    /// the bytes they will hold, and when the thread's previous one ended.
    prefetched: std::collections::VecDeque<shard::Prefetch>,
    in_flight_bytes: f64,
    last_gather_end_us: f64,
    /// Microbatches per data rank.
    microbatches: usize,
    /// Actions run so far in this step.
    done: usize,
    /// Per stage: weight-gradient passes run this step.
    weight_passes: HashMap<usize, usize>,
    /// Stages whose buckets were reduced this step.
    reduced: Vec<usize>,
    /// Per (stage, bucket): this rank's share after a reduce-scatter,
    /// and its elements.
    shares: HashMap<(usize, usize), (C::Buf, usize)>,
    /// Each (stage, bucket)'s flat buffer, kept from step to step as
    /// DDP keeps its buckets: allocated anew each step, a bucket's
    /// reduction also timed the page faults of a fresh buffer (200-366 us
    /// per step on one rank of two, measured).
    bucket_bufs: HashMap<(usize, usize), C::Buf>,
    /// Under `--work sleep`: one state per stage for the collectives.
    scratch: HashMap<usize, BlockState<C::Buf>>,
    step: StageStepTimes,
    /// Every step's times (warm-up steps first).
    pub times: Vec<StageStepTimes>,
    /// Host time the current action's work began: spans are placed from
    /// it, as the executor's record places the action.
    action_start_us: f64,
    /// Tests only: [`Self::whole_grads`] changes one value.
    corrupt: bool,
    step_spans: Vec<CommSpan>,
    /// Every step's communication spans (warm-up steps first).
    pub spans: Vec<Vec<CommSpan>>,
    /// The overlapped reduction's thread, when `reduce.overlap`.
    reducer: Option<&'g mut Reducer<C::Buf>>,
    /// This step's buckets handed to it, in order.
    launched: Vec<Launched>,
    /// Test only: start each bucket this many layers before its gradients
    /// are final (see [`TpStages::launch_buckets_early_for_test`]).
    launch_early: usize,
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
        let group = cfg.reduce.group_of(cfg.dp);
        if dp.world() != group {
            let per = if group < cfg.dp {
                " per shard group"
            } else {
                ""
            };
            return Err(PipelineError::Invalid(format!(
                "{group} data ranks configured{per}, the data group has {}",
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
        let data_rank = dp.rank();
        let mut stages = TpStages {
            cfg: cfg.clone(),
            dtype: c.dtype(),
            blocks,
            tp,
            dp,
            replicas: None,
            data_rank,
            param_shares: HashMap::new(),
            grad_shares: HashMap::new(),
            adam: HashMap::new(),
            transient: 0.0,
            prefetched: std::collections::VecDeque::new(),
            in_flight_bytes: 0.0,
            last_gather_end_us: f64::NEG_INFINITY,
            microbatches: schedule.microbatches,
            done: 0,
            weight_passes: HashMap::new(),
            reduced: Vec::new(),
            shares: HashMap::new(),
            bucket_bufs: HashMap::new(),
            scratch,
            step: StageStepTimes::default(),
            times: Vec::new(),
            action_start_us: host_now_us(),
            corrupt: false,
            step_spans: Vec::new(),
            spans: Vec::new(),
            reducer: None,
            launched: Vec::new(),
            launch_early: 0,
        };
        stages.shard_params_at_start(c)?;
        Ok(stages)
    }

    /// Hybrid sharding: `replicas` is this rank's replica group (the data
    /// ranks with its share, ordered by shard group), the shard group
    /// the one `new` was given; data rank `replica * group + shard rank`.
    pub fn with_replicas(&mut self, replicas: &'g mut D) -> Result<(), PipelineError> {
        let g = self.dp.world();
        if replicas.world() * g != self.cfg.dp {
            return Err(PipelineError::Invalid(format!(
                "{} replicas of {g} data ranks are not the {} data ranks",
                replicas.world(),
                self.cfg.dp
            )));
        }
        self.data_rank = replicas.rank() * g + self.dp.rank();
        self.replicas = Some(replicas);
        Ok(())
    }

    /// Reduces the buckets on `reducer`'s thread as their gradients become
    /// final (with `reduce.overlap`; see [`super::dp_overlap::with_overlap`]).
    pub fn overlap_on(&mut self, reducer: &'g mut Reducer<C::Buf>) {
        self.reducer = Some(reducer);
    }

    /// The buckets go to the reduction thread as they become final (with
    /// `--overlap`; the thread may also be there for ZeRO-3's prefetch).
    fn buckets_overlapped(&self) -> bool {
        self.cfg.reduce.overlap && self.reducer.is_some()
    }

    /// For tests of the check only: hands each bucket to the reduction
    /// thread `layers` layers before its gradients are final, which a
    /// correct step never does; the gradient check must then fail.
    #[doc(hidden)]
    pub fn launch_buckets_early_for_test(&mut self, layers: usize) {
        self.launch_early = layers;
    }

    /// This weight-gradient pass on `stage` is its last of the step (its
    /// `M`-th) and its buckets go to the reduction thread as they become final.
    fn final_overlapped_pass(&self, stage: usize) -> bool {
        self.buckets_overlapped()
            && self.weight_passes.get(&stage).copied().unwrap_or(0) + 1 == self.microbatches
    }

    /// The loss gradient of microbatch `mb` on the last stage (scaled by
    /// `1 / M`), or the gradient the next stage sent.
    fn output_grad(&self, c: &C, mb: usize, dy: Option<C::Buf>) -> Result<C::Buf, PipelineError> {
        let (t, r) = (self.tp.world(), self.tp.rank());
        let scale = 1.0 / self.microbatches as f32;
        match dy {
            Some(g) => Ok(g),
            None => seeded_act(c, &self.cfg, t, r, self.global_mb(mb), Some(scale)),
        }
    }

    /// The input-gradient pass over `stage`'s blocks from the top: the
    /// gradient at the stage's input.
    fn input_pass(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        stash: &mut [BlockState<C::Buf>],
        dy: Option<C::Buf>,
    ) -> Result<C::Buf, PipelineError> {
        let mut dy = self.output_grad(c, mb, dy)?;
        let mut born = host_now_us();
        let mut clock = PhaseClock::new();
        for layer in (0..stash.len()).rev() {
            self.sharded_op(&mut clock, &mut born, |s| {
                s.gather_layer(c, stage, layer, layer.checked_sub(1))
            })?;
            let tp = &mut *self.tp;
            let b = block(&self.blocks, stage, layer)?;
            let st = &mut stash[layer];
            b.backward_input_state(c, tp, &mut clock, st, dy)
                .map_err(layer_err)?;
            dy = st.take_input_grad(c).map_err(layer_err)?;
            self.release_layer(c, stage, layer)?;
        }
        self.charge(&clock, born);
        Ok(dy)
    }

    /// The weight-gradient pass over `stage`'s blocks from the top; in the
    /// stage's last pass with overlap each layer's buckets start as it ends.
    fn weight_pass(
        &mut self,
        c: &C,
        stage: usize,
        stash: &[BlockState<C::Buf>],
    ) -> Result<(), PipelineError> {
        let last = self.final_overlapped_pass(stage);
        let mut born = host_now_us();
        let mut clock = PhaseClock::new();
        for (layer, st) in stash.iter().enumerate().rev() {
            self.layer_weight_grads(c, stage, layer, st, last, &mut clock, &mut born)?;
        }
        self.charge(&clock, born);
        Ok(())
    }

    /// Layer `layer`'s weight gradients from its stash `st`, then (sharded
    /// per layer) their reduce-scatter; in the stage's last pass with
    /// overlap its buckets start as it ends.
    #[allow(clippy::too_many_arguments)]
    fn layer_weight_grads(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
        st: &BlockState<C::Buf>,
        last: bool,
        clock: &mut PhaseClock,
        born: &mut f64,
    ) -> Result<(), PipelineError> {
        self.layer_weight_pass(c, stage, layer, clock, born, |s, clock| {
            let b = block_mut(&mut s.blocks, stage, layer)?;
            b.backward_weight_state(c, clock, st).map_err(layer_err)
        })?;
        if last {
            self.layer_final(c, stage, layer, clock, born)?;
        }
        Ok(())
    }

    /// Layer `layer` of `stage` has its final gradients: charges what the
    /// pass's clock counted so far, hands the buckets now complete to the
    /// reduction thread (off the compute's clock) and restarts the clock.
    fn layer_final(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
        clock: &mut PhaseClock,
        born: &mut f64,
    ) -> Result<(), PipelineError> {
        self.charge(clock, *born);
        self.launch_ready(c, stage, layer)?;
        *clock = PhaseClock::new();
        *born = host_now_us();
        Ok(())
    }

    /// A full backward layer by layer from the top (with overlap): each
    /// layer's input gradients, then its weight gradients; in the stage's
    /// last pass each layer's buckets start as it ends.
    fn layered_backward(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        stash: &mut [BlockState<C::Buf>],
        dy: Option<C::Buf>,
    ) -> Result<C::Buf, PipelineError> {
        let last = self.final_overlapped_pass(stage);
        let mut dy = self.output_grad(c, mb, dy)?;
        let mut born = host_now_us();
        let mut clock = PhaseClock::new();
        for layer in (0..stash.len()).rev() {
            self.sharded_op(&mut clock, &mut born, |s| {
                s.gather_layer(c, stage, layer, layer.checked_sub(1))
            })?;
            let st = &mut stash[layer];
            let tp = &mut *self.tp;
            let b = block_mut(&mut self.blocks, stage, layer)?;
            b.backward_input_state(c, tp, &mut clock, st, dy)
                .map_err(layer_err)?;
            dy = st.take_input_grad(c).map_err(layer_err)?;
            self.release_layer(c, stage, layer)?;
            self.layer_weight_grads(c, stage, layer, &stash[layer], last, &mut clock, &mut born)?;
        }
        self.charge(&clock, born);
        Ok(dy)
    }

    /// Under `--work sleep`, a stage's last weight-gradient pass with
    /// overlap, layer by layer from the top as the compute runs it: for a
    /// `B` the layer's input-gradient half with its tensor-parallel
    /// collectives, then (for `B` and `W`) its weight share, after which
    /// the layer's buckets start.
    fn stand_in_last_weight_pass(
        &mut self,
        c: &C,
        a: Action,
        d: Duration,
    ) -> Result<(), PipelineError> {
        let n = self.blocks.get(&a.stage).map_or(0, Vec::len);
        let (input_half, weight_half) = match a.kind {
            ActionKind::B => (d / 2, d - d / 2),
            _ => (Duration::ZERO, d),
        };
        let per_layer = |half: Duration| half / n.max(1) as u32;
        let mut born = host_now_us();
        let mut clock = PhaseClock::new();
        for layer in (0..n).rev() {
            if a.kind == ActionKind::B {
                std::thread::sleep(per_layer(input_half));
                clock.end_compute(c).map_err(layer_err)?;
                self.stand_in_collectives(c, a.stage, layer, &mut clock)?;
            }
            std::thread::sleep(per_layer(weight_half));
            clock.end_compute(c).map_err(layer_err)?;
            self.layer_final(c, a.stage, layer, &mut clock, &mut born)?;
        }
        self.charge(&clock, born);
        Ok(())
    }

    /// Under `--work sleep`: layer `layer`'s tensor-parallel collectives
    /// of one pass on its stage's scratch state.
    fn stand_in_collectives(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
        clock: &mut PhaseClock,
    ) -> Result<(), PipelineError> {
        let b = block(&self.blocks, stage, layer)?;
        let st = self.scratch.get_mut(&stage).ok_or_else(|| missing(stage))?;
        b.pass_collectives(c, &mut *self.tp, clock, st)
            .map_err(layer_err)
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

    /// A sharded layer collective inside a pass (ZeRO-2 and -3): the
    /// pass's clock is charged up to here, the collective times itself,
    /// and the clock restarts after it.
    fn sharded_op(
        &mut self,
        clock: &mut PhaseClock,
        born: &mut f64,
        op: impl FnOnce(&mut Self) -> Result<(), PipelineError>,
    ) -> Result<(), PipelineError> {
        if !self.cfg.reduce.per_layer() {
            return Ok(());
        }
        self.charge(clock, *born);
        op(self)?;
        *clock = PhaseClock::new();
        *born = host_now_us();
        Ok(())
    }

    /// Global index of this data rank's microbatch `mb`.
    fn global_mb(&self, mb: usize) -> usize {
        self.data_rank * self.microbatches + mb
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
        (self.tp.rank(), self.data_rank)
    }
}

fn layer_err(e: crate::layers::LayerError) -> PipelineError {
    match e {
        crate::layers::LayerError::Comm(e) => PipelineError::Comm(e),
        crate::layers::LayerError::Compute(e) => PipelineError::Compute(e),
        crate::layers::LayerError::Config(m) => PipelineError::Invalid(m),
    }
}

/// Block `layer` of `stage` (borrowing only the blocks, so that a
/// caller can hold the groups beside it).
fn block<C: Compute>(
    blocks: &HashMap<usize, Vec<TpBlock<C>>>,
    stage: usize,
    layer: usize,
) -> Result<&TpBlock<C>, PipelineError> {
    blocks
        .get(&stage)
        .and_then(|l| l.get(layer))
        .ok_or_else(|| missing(stage))
}

fn block_mut<C: Compute>(
    blocks: &mut HashMap<usize, Vec<TpBlock<C>>>,
    stage: usize,
    layer: usize,
) -> Result<&mut TpBlock<C>, PipelineError> {
    blocks
        .get_mut(&stage)
        .and_then(|l| l.get_mut(layer))
        .ok_or_else(|| missing(stage))
}

fn missing(stage: usize) -> PipelineError {
    PipelineError::Protocol(format!("stage {stage} is not on this rank"))
}

/// This rank's share of `layer`'s weights on `stage` (ZeRO-3), from the
/// shares it holds; a free function so that the data group can be borrowed
/// beside it.
fn weights_share<B>(
    shares: &HashMap<(usize, usize), B>,
    stage: usize,
    layer: usize,
) -> Result<&B, PipelineError> {
    shares.get(&(stage, layer)).ok_or_else(|| missing(stage))
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
