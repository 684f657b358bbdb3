//! One rank's shard of the block: its weights, activations and gradients on
//! a compute device, its forward and backward, and the collectives between
//! them on a communicator that moves the same buffers.
//!
//! Every collective is bracketed by [`PhaseClock`]: the device is synced
//! before it (so the compute before it is charged to compute) and the
//! communicator after it (so the collective is charged to communication).
//! On a GPU this serialises compute and communication, which is what makes
//! the two figures separable; the wait for a slower peer's compute lands in
//! the communication time of the faster rank, as it does in a real step.

use super::layout::{DataSpecs, ParamSpecs, TensorSpec};
use super::{BlockConfig, LayerError, LayerResult, Mode};
use crate::comm::{Communicator, DType, Io, ReduceOp};
use crate::compute::{Compute, Gemm};
use std::time::{Duration, Instant};

/// Splits the wall time of a block call into compute and communication,
/// and keeps where each communication phase lay (for a trace).
#[derive(Clone, Debug)]
pub struct PhaseClock {
    compute: Duration,
    comm: Duration,
    mark: Instant,
    born: Instant,
    /// Each communication phase: (start, end) since the clock began.
    spans: Vec<(Duration, Duration)>,
}

impl Default for PhaseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl PhaseClock {
    /// A clock that starts counting compute now.
    pub fn new() -> Self {
        let now = Instant::now();
        PhaseClock {
            compute: Duration::ZERO,
            comm: Duration::ZERO,
            mark: now,
            born: now,
            spans: Vec::new(),
        }
    }

    /// Each communication phase, (start, end) since the clock began.
    pub fn comm_spans(&self) -> &[(Duration, Duration)] {
        &self.spans
    }

    /// Time charged to compute so far.
    pub fn compute(&self) -> Duration {
        self.compute
    }

    /// Time charged to communication so far.
    pub fn comm(&self) -> Duration {
        self.comm
    }

    /// Ends a compute phase: waits for the device, charges the time since the mark.
    pub fn end_compute<C: Compute>(&mut self, dev: &C) -> LayerResult<()> {
        dev.sync()?;
        let now = Instant::now();
        self.compute += now - self.mark;
        self.mark = now;
        Ok(())
    }

    /// Ends a communication phase: waits for the communicator, charges the time since the mark.
    pub fn end_comm<M: Communicator>(&mut self, comm: &mut M) -> LayerResult<()> {
        comm.sync()?;
        let now = Instant::now();
        self.comm += now - self.mark;
        self.spans.push((self.mark - self.born, now - self.born));
        self.mark = now;
        Ok(())
    }
}

/// The sizes every kernel call is built from.
#[derive(Clone, Copy, Debug)]
struct Dims {
    /// Tokens per block call.
    n: usize,
    /// Token rows this rank holds (n / t with sequence parallelism, else n).
    nr: usize,
    h: usize,
    /// Q (or K, or V) columns of this rank: its heads x head width.
    hl: usize,
    /// Heads of this rank.
    al: usize,
    /// Head width.
    d: usize,
    /// MLP columns of this rank.
    fl: usize,
    batch: usize,
    /// Query rows per sequence.
    lq: usize,
    /// Keys per sequence.
    l: usize,
    /// Cache slot of the new token in decode.
    seq: usize,
}

/// The block's eight parameters (or their gradients) on a device.
#[derive(Debug)]
pub struct Params<B> {
    pub w_qkv: B,
    pub b_qkv: B,
    pub w_o: B,
    pub b_o: B,
    pub w_1: B,
    pub b_1: B,
    pub w_2: B,
    pub b_2: B,
}

impl<B> Params<B> {
    /// Every tensor, in [`ParamSpecs::all`]'s order.
    pub fn all(&self) -> [&B; 8] {
        [
            &self.w_qkv,
            &self.b_qkv,
            &self.w_o,
            &self.b_o,
            &self.w_1,
            &self.b_1,
            &self.w_2,
            &self.b_2,
        ]
    }
}

/// Forward activations. `*_g` are the token-gathered copies that exist only
/// with sequence parallelism; `*_s` the reduce-scattered results.
struct Acts<B> {
    x: B,
    x_g: Option<B>,
    qkv: B,
    probs: B,
    ctx: B,
    k_cache: Option<B>,
    v_cache: Option<B>,
    z: B,
    z_s: Option<B>,
    y1: B,
    y1_g: Option<B>,
    h1: B,
    a1: B,
    z2: B,
    z2_s: Option<B>,
    y: B,
}

/// Backward activations (train mode).
struct GradActs<B> {
    dy: B,
    dy_g: Option<B>,
    da: B,
    dh: B,
    dy1p: B,
    dy1p_s: Option<B>,
    dy1: B,
    dy1_g: Option<B>,
    dctx: B,
    dprobs: B,
    dqkv: B,
    dxp: B,
    dxp_s: Option<B>,
    dx: B,
}

/// What one microbatch leaves in the block between its passes: the
/// forward's activations and (train mode) the backward's. A pipeline stage
/// holds one per microbatch in flight; the block's own single-shot calls
/// ([`TpBlock::forward`], [`TpBlock::backward`]) use the block's own.
pub struct BlockState<B> {
    acts: Acts<B>,
    gacts: Option<GradActs<B>>,
    /// Elements held (for the pipeline's peak-activation count).
    elems: usize,
}

impl<B> BlockState<B> {
    /// Elements this state holds on the device.
    pub fn elems(&self) -> usize {
        self.elems
    }
}

/// Rank `rank`'s shard of a tensor-parallel transformer block on device `C`.
pub struct TpBlock<C: Compute> {
    cfg: BlockConfig,
    tp: usize,
    rank: usize,
    dims: Dims,
    dtype: DType,
    params: Params<C::Buf>,
    grads: Option<Params<C::Buf>>,
    st: BlockState<C::Buf>,
}

/// What the passes read of a block besides a microbatch's state.
struct Ctx<'a, B> {
    tp: usize,
    dims: Dims,
    dtype: DType,
    decode: bool,
    params: &'a Params<B>,
}

impl<B> Ctx<'_, B> {
    /// The block's collectives at these sizes.
    fn coll(&self) -> Coll {
        let Dims { n, nr, h, .. } = self.dims;
        Coll {
            tp: self.tp,
            dtype: self.dtype,
            full: n * h,
            local: nr * h,
        }
    }
}

/// A seeded tensor's shard on the device.
fn shard<C: Compute>(
    dev: &C,
    spec: &TensorSpec,
    seed: u64,
    tp: usize,
    rank: usize,
) -> LayerResult<C::Buf> {
    let mut b = dev.alloc(spec.local_len(tp))?;
    dev.upload(&spec.shard_values(seed, tp, rank), &mut b)?;
    Ok(b)
}

/// The whole-token view of an activation: the gathered copy if there is one.
fn full<'a, B>(local: &'a B, gathered: &'a Option<B>) -> &'a B {
    gathered.as_ref().unwrap_or(local)
}

impl<C: Compute> TpBlock<C> {
    /// Builds rank `rank`'s shard of `cfg`'s block at `tp` ranks with weights,
    /// input and output gradient seeded by `seed`.
    pub fn new(dev: &C, cfg: &BlockConfig, tp: usize, rank: usize, seed: u64) -> LayerResult<Self> {
        cfg.validate(tp)?;
        if rank >= tp {
            return Err(LayerError::Config(format!("rank {rank} of {tp}")));
        }
        let s = &cfg.shape;
        let split = cfg.sequence_split(tp);
        let n = cfg.tokens();
        let dims = Dims {
            n,
            nr: if split { n / tp } else { n },
            h: s.hidden,
            hl: s.hidden / tp,
            al: s.heads / tp,
            d: s.hidden / s.heads,
            fl: s.ffn / tp,
            batch: s.batch,
            lq: cfg.query_len(),
            l: cfg.kv_len(),
            seq: s.seq,
        };
        let ps = ParamSpecs::new(cfg);
        let ds = DataSpecs::new(cfg, tp);
        let load = |spec: &TensorSpec| shard(dev, spec, seed, tp, rank);
        let params = Params {
            w_qkv: load(&ps.w_qkv)?,
            b_qkv: load(&ps.b_qkv)?,
            w_o: load(&ps.w_o)?,
            b_o: load(&ps.b_o)?,
            w_1: load(&ps.w_1)?,
            b_1: load(&ps.b_1)?,
            w_2: load(&ps.w_2)?,
            b_2: load(&ps.b_2)?,
        };
        let train = cfg.mode == Mode::Train;
        let grads = if train {
            let g = |spec: &TensorSpec| dev.alloc(spec.local_len(tp));
            Some(Params {
                w_qkv: g(&ps.w_qkv)?,
                b_qkv: g(&ps.b_qkv)?,
                w_o: g(&ps.w_o)?,
                b_o: g(&ps.b_o)?,
                w_1: g(&ps.w_1)?,
                b_1: g(&ps.b_1)?,
                w_2: g(&ps.w_2)?,
                b_2: g(&ps.b_2)?,
            })
        } else {
            None
        };
        let caches = if cfg.decode {
            Some((load(&ds.k_cache)?, load(&ds.v_cache)?))
        } else {
            None
        };
        let dy = if train { Some(load(&ds.dy)?) } else { None };
        let st = alloc_state(dev, cfg, &dims, load(&ds.x)?, dy, caches)?;
        Ok(TpBlock {
            cfg: *cfg,
            tp,
            rank,
            dims,
            dtype: dev.dtype(),
            params,
            grads,
            st,
        })
    }

    /// A fresh microbatch state with input `x` (this rank's rows of the
    /// block's input), for a pipeline stage that holds several microbatches
    /// at once. Train mode, prefill only.
    pub fn new_state(&self, dev: &C, x: C::Buf) -> LayerResult<BlockState<C::Buf>> {
        if self.cfg.mode != Mode::Train || self.cfg.decode {
            return Err(LayerError::Config(
                "a microbatch state is for training a prefill block".into(),
            ));
        }
        let (n, h) = (self.dims.nr, self.dims.h);
        let dy = dev.alloc(n * h)?;
        alloc_state(dev, &self.cfg, &self.dims, x, Some(dy), None)
    }

    fn ctx(&self) -> Ctx<'_, C::Buf> {
        Ctx {
            tp: self.tp,
            dims: self.dims,
            dtype: self.dtype,
            decode: self.cfg.decode,
            params: &self.params,
        }
    }

    /// Sets every parameter gradient to zero (before a step that accumulates).
    pub fn zero_grads(&mut self, dev: &C) -> LayerResult<()> {
        let tp = self.tp;
        if let Some(g) = self.grads.as_mut() {
            let ps = ParamSpecs::new(&self.cfg);
            for (buf, spec) in [
                (&mut g.w_qkv, &ps.w_qkv),
                (&mut g.b_qkv, &ps.b_qkv),
                (&mut g.w_o, &ps.w_o),
                (&mut g.b_o, &ps.b_o),
                (&mut g.w_1, &ps.w_1),
                (&mut g.b_1, &ps.b_1),
                (&mut g.w_2, &ps.w_2),
                (&mut g.b_2, &ps.b_2),
            ] {
                *buf = dev.alloc(spec.local_len(tp))?;
            }
        }
        Ok(())
    }

    /// The configuration this block runs.
    pub fn config(&self) -> &BlockConfig {
        &self.cfg
    }

    /// Tensor-parallel degree and this rank.
    pub fn shard_of(&self) -> (usize, usize) {
        (self.tp, self.rank)
    }

    /// The block's output `y` on this rank (its token rows under sequence parallelism).
    pub fn output(&self) -> &C::Buf {
        &self.st.acts.y
    }

    /// The gradient of the block's input on this rank, after [`TpBlock::backward`].
    pub fn input_grad(&self) -> Option<&C::Buf> {
        self.st.gacts.as_ref().map(|g| &g.dx)
    }

    /// This rank's parameter gradients, after [`TpBlock::backward`].
    pub fn param_grads(&self) -> Option<&Params<C::Buf>> {
        self.grads.as_ref()
    }

    /// Parameter gradient `i` ([`Params::all`]'s order), to write a
    /// reduced gradient back.
    pub fn param_grad_mut(&mut self, i: usize) -> Option<&mut C::Buf> {
        let g = self.grads.as_mut()?;
        Some(match i {
            0 => &mut g.w_qkv,
            1 => &mut g.b_qkv,
            2 => &mut g.w_o,
            3 => &mut g.b_o,
            4 => &mut g.w_1,
            5 => &mut g.b_1,
            6 => &mut g.w_2,
            7 => &mut g.b_2,
            _ => return None,
        })
    }

    /// One forward pass: attention then MLP, each ending in its collective.
    pub fn forward<M>(&mut self, dev: &C, comm: &mut M, clock: &mut PhaseClock) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let mut st = std::mem::replace(&mut self.st, empty_state(dev)?);
        let r = forward_pass(&self.ctx(), dev, comm, clock, &mut st);
        self.st = st;
        r
    }

    /// One backward pass from the seeded output gradient `dy`, after
    /// [`TpBlock::forward`]: every parameter's gradient and the input's
    /// (the input-gradient pass, then the weight-gradient pass).
    pub fn backward<M>(&mut self, dev: &C, comm: &mut M, clock: &mut PhaseClock) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        self.backward_input(dev, comm, clock)?;
        self.backward_weight(dev, clock)
    }

    /// The input-gradient half of [`TpBlock::backward`] (zero-bubble's
    /// `I`): the gradient of the block's input, with the block's two
    /// collectives; no parameter gradient is touched.
    pub fn backward_input<M>(
        &mut self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
    ) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let mut st = std::mem::replace(&mut self.st, empty_state(dev)?);
        let r = input_grad_pass(&self.ctx(), dev, comm, clock, &mut st);
        self.st = st;
        r
    }

    /// The weight-gradient half of [`TpBlock::backward`] (zero-bubble's
    /// `W`): every parameter's gradient from what the input-gradient pass
    /// left, overwriting the previous ones. No communication.
    pub fn backward_weight(&mut self, dev: &C, clock: &mut PhaseClock) -> LayerResult<()> {
        let TpBlock {
            dims, grads, st, ..
        } = self;
        weight_grad_pass(dims, grads.as_mut(), dev, st, false)?;
        clock.end_compute(dev)
    }

    /// [`TpBlock::forward`] on a microbatch's own state.
    pub fn forward_state<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        st: &mut BlockState<C::Buf>,
    ) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        forward_pass(&self.ctx(), dev, comm, clock, st)
    }

    /// [`TpBlock::backward_input`] on a microbatch's own state, from the
    /// gradient `dy` at the block's output (this rank's rows).
    pub fn backward_input_state<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        st: &mut BlockState<C::Buf>,
        dy: C::Buf,
    ) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let ga = st.gacts.as_mut().ok_or_else(not_train)?;
        ga.dy = dy;
        input_grad_pass(&self.ctx(), dev, comm, clock, st)
    }

    /// [`TpBlock::backward_weight`] on a microbatch's state, adding to the
    /// gradients (a step's microbatches accumulate, as Megatron's do).
    pub fn backward_weight_state(
        &mut self,
        dev: &C,
        clock: &mut PhaseClock,
        st: &BlockState<C::Buf>,
    ) -> LayerResult<()> {
        weight_grad_pass(&self.dims, self.grads.as_mut(), dev, st, true)?;
        clock.end_compute(dev)
    }
}

impl<C: Compute> TpBlock<C> {
    /// The collectives of one forward or input-gradient pass alone (two
    /// gathers where sequence parallelism keeps them, two reductions), on
    /// `st`'s buffers: what `--work sleep` keeps of a pass, since the
    /// tensor-parallel traffic stays real when the compute is a sleep.
    pub fn pass_collectives<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        st: &mut BlockState<C::Buf>,
    ) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let io = self.ctx().coll();
        let a = &mut st.acts;
        io.gather(dev, comm, clock, &a.x, &mut a.x_g)?;
        io.reduce(dev, comm, clock, &mut a.z, &mut a.z_s)?;
        io.gather(dev, comm, clock, &a.y1, &mut a.y1_g)?;
        io.reduce(dev, comm, clock, &mut a.z2, &mut a.z2_s)?;
        clock.end_compute(dev)
    }
}

impl<B> BlockState<B> {
    /// Takes the block's output `y` (this rank's rows) out of the state,
    /// leaving an empty buffer: the backward does not read it.
    pub fn take_output<C: Compute<Buf = B>>(&mut self, dev: &C) -> LayerResult<B> {
        Ok(std::mem::replace(&mut self.acts.y, dev.alloc(0)?))
    }

    /// Takes the gradient of the block's input (this rank's rows) after
    /// the input-gradient pass; the weight pass does not read it.
    pub fn take_input_grad<C: Compute<Buf = B>>(&mut self, dev: &C) -> LayerResult<B> {
        let ga = self.gacts.as_mut().ok_or_else(not_train)?;
        Ok(std::mem::replace(&mut ga.dx, dev.alloc(0)?))
    }
}

fn not_train() -> LayerError {
    LayerError::Config("backward needs a block built in train mode".into())
}

/// A state of no buffers, standing in while the block's own is lent out.
fn empty_state<C: Compute>(dev: &C) -> LayerResult<BlockState<C::Buf>> {
    let e = || dev.alloc(0);
    Ok(BlockState {
        acts: Acts {
            x: e()?,
            x_g: None,
            qkv: e()?,
            probs: e()?,
            ctx: e()?,
            k_cache: None,
            v_cache: None,
            z: e()?,
            z_s: None,
            y1: e()?,
            y1_g: None,
            h1: e()?,
            a1: e()?,
            z2: e()?,
            z2_s: None,
            y: e()?,
        },
        gacts: None,
        elems: 0,
    })
}

/// Every activation buffer of one microbatch, with input `x`, output
/// gradient `dy` (train mode) and the KV caches (decode).
fn alloc_state<C: Compute>(
    dev: &C,
    cfg: &BlockConfig,
    dims: &Dims,
    x: C::Buf,
    dy: Option<C::Buf>,
    caches: Option<(C::Buf, C::Buf)>,
) -> LayerResult<BlockState<C::Buf>> {
    let Dims {
        n,
        nr,
        h,
        hl,
        al,
        fl,
        batch,
        lq,
        l,
        ..
    } = *dims;
    let split = nr != n;
    let probs_len = batch * al * lq * l;
    let mut elems = 0usize;
    let mut a = |len: usize| {
        elems += len;
        dev.alloc(len)
    };
    let (k_cache, v_cache) = match caches {
        Some((k, v)) => (Some(k), Some(v)),
        None => (None, None),
    };
    let opt = |cond: bool, len: usize, a: &mut dyn FnMut(usize) -> _| -> LayerResult<_> {
        cond.then(|| a(len)).transpose().map_err(LayerError::from)
    };
    let acts = Acts {
        x,
        x_g: opt(split, n * h, &mut a)?,
        qkv: a(n * 3 * hl)?,
        probs: a(probs_len)?,
        ctx: a(n * hl)?,
        k_cache,
        v_cache,
        z: a(n * h)?,
        z_s: opt(split, nr * h, &mut a)?,
        y1: a(nr * h)?,
        y1_g: opt(split, n * h, &mut a)?,
        h1: a(n * fl)?,
        a1: a(n * fl)?,
        z2: a(n * h)?,
        z2_s: opt(split, nr * h, &mut a)?,
        y: a(nr * h)?,
    };
    let gacts = match dy {
        Some(dy) if cfg.mode == Mode::Train => Some(GradActs {
            dy,
            dy_g: opt(split, n * h, &mut a)?,
            da: a(n * fl)?,
            dh: a(n * fl)?,
            dy1p: a(n * h)?,
            dy1p_s: opt(split, nr * h, &mut a)?,
            dy1: a(nr * h)?,
            dy1_g: opt(split, n * h, &mut a)?,
            dctx: a(n * hl)?,
            dprobs: a(probs_len)?,
            dqkv: a(n * 3 * hl)?,
            dxp: a(n * h)?,
            dxp_s: opt(split, nr * h, &mut a)?,
            dx: a(nr * h)?,
        }),
        _ => None,
    };
    // The input and output gradient count too.
    let elems = elems + nr * h * (1 + usize::from(gacts.is_some()));
    Ok(BlockState { acts, gacts, elems })
}

/// The forward of one microbatch: attention then MLP, each ending in its
/// collective.
fn forward_pass<C, M>(
    ctx: &Ctx<'_, C::Buf>,
    dev: &C,
    comm: &mut M,
    clock: &mut PhaseClock,
    st: &mut BlockState<C::Buf>,
) -> LayerResult<()>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let Dims {
        n, nr, h, hl, fl, ..
    } = ctx.dims;
    let io = ctx.coll();
    let (a, p) = (&mut st.acts, ctx.params);

    io.gather(dev, comm, clock, &a.x, &mut a.x_g)?;
    let x = full(&a.x, &a.x_g);
    dev.gemm(&Gemm::dense(n, 3 * hl, h), x, &p.w_qkv, &mut a.qkv)?;
    dev.add_bias(&mut a.qkv, &p.b_qkv, n, 3 * hl)?;
    if let (Some(kc), Some(vc)) = (a.k_cache.as_mut(), a.v_cache.as_mut()) {
        // The new token's K and V join the cache in its last slot.
        let d = &ctx.dims;
        for b in 0..d.batch {
            let slot = (b * d.l + d.seq) * hl;
            dev.copy(&a.qkv, b * 3 * hl + hl, kc, slot, hl)?;
            dev.copy(&a.qkv, b * 3 * hl + 2 * hl, vc, slot, hl)?;
        }
    }
    attention_forward(dev, &ctx.dims, ctx.decode, a)?;
    dev.gemm(&Gemm::dense(n, h, hl), &a.ctx, &p.w_o, &mut a.z)?;
    io.reduce(dev, comm, clock, &mut a.z, &mut a.z_s)?;

    dev.copy(&a.x, 0, &mut a.y1, 0, nr * h)?;
    dev.add(&mut a.y1, full(&a.z, &a.z_s), nr * h)?;
    dev.add_bias(&mut a.y1, &p.b_o, nr, h)?;

    io.gather(dev, comm, clock, &a.y1, &mut a.y1_g)?;
    let y1 = full(&a.y1, &a.y1_g);
    dev.gemm(&Gemm::dense(n, fl, h), y1, &p.w_1, &mut a.h1)?;
    dev.add_bias(&mut a.h1, &p.b_1, n, fl)?;
    dev.gelu(&a.h1, &mut a.a1, n * fl)?;
    dev.gemm(&Gemm::dense(n, h, fl), &a.a1, &p.w_2, &mut a.z2)?;
    io.reduce(dev, comm, clock, &mut a.z2, &mut a.z2_s)?;

    dev.copy(&a.y1, 0, &mut a.y, 0, nr * h)?;
    dev.add(&mut a.y, full(&a.z2, &a.z2_s), nr * h)?;
    dev.add_bias(&mut a.y, &p.b_2, nr, h)?;
    clock.end_compute(dev)
}

/// A `Gemm` with the first operand transposed (`A^T B`), writing `C`
/// with `beta` (1 accumulates).
fn tn(m: usize, n: usize, k: usize, lda: usize, ldb: usize, beta: f32) -> Gemm {
    Gemm {
        trans_a: true,
        lda,
        ldb,
        beta,
        ..Gemm::dense(m, n, k)
    }
}

/// A `Gemm` with the second operand transposed (`A B^T`).
fn nt(m: usize, n: usize, k: usize, lda: usize, ldb: usize) -> Gemm {
    Gemm {
        trans_b: true,
        lda,
        ldb,
        ..Gemm::dense(m, n, k)
    }
}

/// The input-gradient pass of one microbatch (zero-bubble's `I`): from
/// `dy` at the output to `dx` at the input, through both sub-blocks' input
/// gradients and collectives, keeping what the weight pass reads.
fn input_grad_pass<C, M>(
    ctx: &Ctx<'_, C::Buf>,
    dev: &C,
    comm: &mut M,
    clock: &mut PhaseClock,
    st: &mut BlockState<C::Buf>,
) -> LayerResult<()>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let Dims {
        n, nr, h, hl, fl, ..
    } = ctx.dims;
    let io = ctx.coll();
    let (a, p) = (&st.acts, ctx.params);
    let ga = st.gacts.as_mut().ok_or_else(not_train)?;

    // MLP: the output gradient reaches every rank's columns (all-gather
    // with sequence parallelism; replicated otherwise).
    io.gather(dev, comm, clock, &ga.dy, &mut ga.dy_g)?;
    let dy = full(&ga.dy, &ga.dy_g);
    dev.gemm(&nt(n, fl, h, h, h), dy, &p.w_2, &mut ga.da)?;
    dev.gelu_backward(&a.h1, &ga.da, &mut ga.dh, n * fl)?;
    dev.gemm(&nt(n, h, fl, fl, fl), &ga.dh, &p.w_1, &mut ga.dy1p)?;
    io.reduce(dev, comm, clock, &mut ga.dy1p, &mut ga.dy1p_s)?;
    dev.copy(&ga.dy, 0, &mut ga.dy1, 0, nr * h)?;
    dev.add(&mut ga.dy1, full(&ga.dy1p, &ga.dy1p_s), nr * h)?;

    // Attention.
    io.gather(dev, comm, clock, &ga.dy1, &mut ga.dy1_g)?;
    let dy1 = full(&ga.dy1, &ga.dy1_g);
    dev.gemm(&nt(n, hl, h, h, h), dy1, &p.w_o, &mut ga.dctx)?;
    attention_backward(dev, &ctx.dims, a, ga)?;
    dev.gemm(
        &nt(n, h, 3 * hl, 3 * hl, 3 * hl),
        &ga.dqkv,
        &p.w_qkv,
        &mut ga.dxp,
    )?;
    io.reduce(dev, comm, clock, &mut ga.dxp, &mut ga.dxp_s)?;
    dev.copy(&ga.dy1, 0, &mut ga.dx, 0, nr * h)?;
    dev.add(&mut ga.dx, full(&ga.dxp, &ga.dxp_s), nr * h)?;
    clock.end_compute(dev)
}

/// The weight-gradient pass of one microbatch (zero-bubble's `W`): every
/// parameter's gradient from the activations and the input-gradient
/// pass's intermediate gradients; `accumulate` adds to the gradients
/// instead of overwriting them. Needs no communication: the gathered
/// copies it reads were made by the input pass.
fn weight_grad_pass<C: Compute>(
    dims: &Dims,
    grads: Option<&mut Params<C::Buf>>,
    dev: &C,
    st: &BlockState<C::Buf>,
    accumulate: bool,
) -> LayerResult<()> {
    let Dims {
        n, nr, h, hl, fl, ..
    } = *dims;
    let (Some(g), Some(ga)) = (grads, st.gacts.as_ref()) else {
        return Err(not_train());
    };
    let a = &st.acts;
    let beta = if accumulate { 1.0 } else { 0.0 };
    // A bias gradient overwrites its output: accumulating goes through a
    // scratch buffer.
    let bias = |src: &C::Buf, dst: &mut C::Buf, rows: usize, cols: usize| -> LayerResult<()> {
        if accumulate {
            let mut part = dev.alloc(cols)?;
            dev.bias_grad(src, &mut part, rows, cols)?;
            dev.add(dst, &part, cols)?;
        } else {
            dev.bias_grad(src, dst, rows, cols)?;
        }
        Ok(())
    };
    let dy = full(&ga.dy, &ga.dy_g);
    bias(&ga.dy, &mut g.b_2, nr, h)?;
    dev.gemm(&tn(fl, h, n, fl, h, beta), &a.a1, dy, &mut g.w_2)?;
    bias(&ga.dh, &mut g.b_1, n, fl)?;
    dev.gemm(
        &tn(h, fl, n, h, fl, beta),
        full(&a.y1, &a.y1_g),
        &ga.dh,
        &mut g.w_1,
    )?;
    let dy1 = full(&ga.dy1, &ga.dy1_g);
    bias(&ga.dy1, &mut g.b_o, nr, h)?;
    dev.gemm(&tn(hl, h, n, hl, h, beta), &a.ctx, dy1, &mut g.w_o)?;
    bias(&ga.dqkv, &mut g.b_qkv, n, 3 * hl)?;
    let x = full(&a.x, &a.x_g);
    dev.gemm(
        &tn(h, 3 * hl, n, h, 3 * hl, beta),
        x,
        &ga.dqkv,
        &mut g.w_qkv,
    )?;
    Ok(())
}

/// The block's two collectives, or nothing at t = 1.
struct Coll {
    tp: usize,
    dtype: DType,
    /// Elements of a whole-token activation.
    full: usize,
    /// Elements of this rank's token rows.
    local: usize,
}

impl Coll {
    /// All-gathers token rows into `gathered` where sequence parallelism keeps one.
    fn gather<C: Compute, M: Communicator<Buffer = C::Buf>>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        local: &C::Buf,
        gathered: &mut Option<C::Buf>,
    ) -> LayerResult<()> {
        let Some(recv) = gathered.as_mut() else {
            return Ok(());
        };
        clock.end_compute(dev)?;
        comm.all_gather(Io::OutOfPlace { send: local, recv }, self.local, self.dtype)?;
        clock.end_comm(comm)
    }

    /// Sums a row-parallel product's partial results: all-reduce in place,
    /// or reduce-scatter into `scattered` with sequence parallelism.
    fn reduce<C: Compute, M: Communicator<Buffer = C::Buf>>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        partial: &mut C::Buf,
        scattered: &mut Option<C::Buf>,
    ) -> LayerResult<()> {
        if self.tp <= 1 {
            return Ok(());
        }
        clock.end_compute(dev)?;
        match scattered.as_mut() {
            Some(recv) => comm.reduce_scatter(
                Io::OutOfPlace {
                    send: partial,
                    recv,
                },
                self.local,
                self.dtype,
                ReduceOp::Sum,
            )?,
            None => comm.all_reduce(Io::InPlace(partial), self.full, self.dtype, ReduceOp::Sum)?,
        }
        clock.end_comm(comm)
    }
}

/// Where a sequence's keys and values live: the fused QKV rows (prefill) or
/// the KV cache (decode); offsets of head 0 and the row stride.
struct KvView<'a, B> {
    k: &'a B,
    k_off: usize,
    v: &'a B,
    v_off: usize,
    ld: usize,
}

fn kv_view<'a, B>(
    dims: &Dims,
    qkv: &'a B,
    cache: (&'a Option<B>, &'a Option<B>),
    b: usize,
) -> KvView<'a, B> {
    let Dims { hl, l, lq, .. } = *dims;
    match (cache.0.as_ref(), cache.1.as_ref()) {
        (Some(k), Some(v)) => KvView {
            k,
            k_off: b * l * hl,
            v,
            v_off: b * l * hl,
            ld: hl,
        },
        _ => {
            let row = b * lq * 3 * hl;
            KvView {
                k: qkv,
                k_off: row + hl,
                v: qkv,
                v_off: row + 2 * hl,
                ld: 3 * hl,
            }
        }
    }
}

/// A product batched over this rank's heads (head i adds `i d` to the offset
/// of every operand that is a head's column slice).
fn per_head(
    dims: &Dims,
    (m, n, k): (usize, usize, usize),
    (trans_a, a_offset, lda, stride_a): (bool, usize, usize, usize),
    (trans_b, b_offset, ldb, stride_b): (bool, usize, usize, usize),
    (c_offset, ldc, stride_c): (usize, usize, usize),
    alpha: f32,
) -> Gemm {
    Gemm {
        m,
        n,
        k,
        trans_a,
        trans_b,
        a_offset,
        lda,
        b_offset,
        ldb,
        c_offset,
        ldc,
        alpha,
        beta: 0.0,
        batch: dims.al,
        stride_a,
        stride_b,
        stride_c,
    }
}

/// Scaled-dot-product attention of this rank's heads:
/// `ctx = softmax(Q K^T / sqrt(d)) V`, causal in prefill.
fn attention_forward<C: Compute>(
    dev: &C,
    dims: &Dims,
    decode: bool,
    a: &mut Acts<C::Buf>,
) -> LayerResult<()> {
    let Dims {
        hl,
        al,
        d,
        batch,
        lq,
        l,
        ..
    } = *dims;
    let scale = 1.0 / (d as f32).sqrt();
    let sq = lq * l;
    for b in 0..batch {
        let kv = kv_view(dims, &a.qkv, (&a.k_cache, &a.v_cache), b);
        let g = per_head(
            dims,
            (lq, l, d),
            (false, b * lq * 3 * hl, 3 * hl, d),
            (true, kv.k_off, kv.ld, d),
            (b * al * sq, l, sq),
            scale,
        );
        dev.gemm(&g, &a.qkv, kv.k, &mut a.probs)?;
    }
    dev.softmax(&mut a.probs, 0, batch * al * lq, l, !decode)?;
    for b in 0..batch {
        let kv = kv_view(dims, &a.qkv, (&a.k_cache, &a.v_cache), b);
        let g = per_head(
            dims,
            (lq, d, l),
            (false, b * al * sq, l, sq),
            (false, kv.v_off, kv.ld, d),
            (b * lq * hl, hl, d),
            1.0,
        );
        dev.gemm(&g, &a.probs, kv.v, &mut a.ctx)?;
    }
    Ok(())
}

/// Backward of [`attention_forward`] in prefill: `dqkv` from `dctx`.
fn attention_backward<C: Compute>(
    dev: &C,
    dims: &Dims,
    a: &Acts<C::Buf>,
    ga: &mut GradActs<C::Buf>,
) -> LayerResult<()> {
    let Dims {
        hl,
        al,
        d,
        batch,
        lq,
        l,
        ..
    } = *dims;
    let scale = 1.0 / (d as f32).sqrt();
    let sq = lq * l;
    for b in 0..batch {
        let (q_off, o_off, p_off) = (b * lq * 3 * hl, b * lq * hl, b * al * sq);
        let v_off = q_off + 2 * hl;
        // dP = dO V^T
        let g = per_head(
            dims,
            (lq, l, d),
            (false, o_off, hl, d),
            (true, v_off, 3 * hl, d),
            (p_off, l, sq),
            1.0,
        );
        dev.gemm(&g, &ga.dctx, &a.qkv, &mut ga.dprobs)?;
        // dV = P^T dO
        let g = per_head(
            dims,
            (l, d, lq),
            (true, p_off, l, sq),
            (false, o_off, hl, d),
            (v_off, 3 * hl, d),
            1.0,
        );
        dev.gemm(&g, &a.probs, &ga.dctx, &mut ga.dqkv)?;
    }
    // dS = softmax'(P) dP, in place; then the scale of S = scale Q K^T.
    dev.softmax_backward(&a.probs, &mut ga.dprobs, 0, batch * al * lq, l)?;
    for b in 0..batch {
        let (q_off, p_off) = (b * lq * 3 * hl, b * al * sq);
        let k_off = q_off + hl;
        // dQ = scale dS K
        let g = per_head(
            dims,
            (lq, d, l),
            (false, p_off, l, sq),
            (false, k_off, 3 * hl, d),
            (q_off, 3 * hl, d),
            scale,
        );
        dev.gemm(&g, &ga.dprobs, &a.qkv, &mut ga.dqkv)?;
        // dK = scale dS^T Q
        let g = per_head(
            dims,
            (l, d, lq),
            (true, p_off, l, sq),
            (false, q_off, 3 * hl, d),
            (k_off, 3 * hl, d),
            scale,
        );
        dev.gemm(&g, &ga.dprobs, &a.qkv, &mut ga.dqkv)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::BlockShape;
    use super::*;
    use crate::compute::cpu::CpuCompute;

    fn cfg(mode: Mode, decode: bool, seq: usize) -> BlockConfig {
        BlockConfig {
            shape: BlockShape {
                hidden: 8,
                heads: 2,
                ffn: 16,
                seq,
                batch: 2,
            },
            mode,
            decode,
            seq_parallel: false,
        }
    }

    fn host(dev: &CpuCompute, b: &crate::comm::HostBuffer) -> Vec<f32> {
        let mut v = vec![0f32; b.count(dev.dtype())];
        dev.download(b, &mut v).unwrap();
        v
    }

    fn set(dev: &CpuCompute, b: &mut crate::comm::HostBuffer, v: &[f32]) {
        dev.upload(v, b).unwrap();
    }

    impl<C: Compute> TpBlock<C> {
        fn param_mut(&mut self, i: usize) -> &mut C::Buf {
            let p = &mut self.params;
            match i {
                0 => &mut p.w_qkv,
                1 => &mut p.b_qkv,
                2 => &mut p.w_o,
                3 => &mut p.b_o,
                4 => &mut p.w_1,
                5 => &mut p.b_1,
                6 => &mut p.w_2,
                _ => &mut p.b_2,
            }
        }
    }

    /// The analytic gradients of loss = sum(dy * y) against central differences.
    #[test]
    fn backward_matches_finite_differences() {
        super::super::on_local_ranks(1, |comm| {
            let dev = CpuCompute::new(DType::F32, 1).unwrap();
            let c = cfg(Mode::Train, false, 4);
            let mut blk = TpBlock::new(&dev, &c, 1, 0, 3).unwrap();
            let mut clock = PhaseClock::new();
            blk.forward(&dev, comm, &mut clock).unwrap();
            blk.backward(&dev, comm, &mut clock).unwrap();
            let dy = host(&dev, &blk.st.gacts.as_ref().unwrap().dy);
            let loss =
                |blk: &mut TpBlock<CpuCompute>, comm: &mut crate::comm::local::LocalComm| -> f64 {
                    blk.forward(&dev, comm, &mut PhaseClock::new()).unwrap();
                    let y = host(&dev, &blk.st.acts.y);
                    y.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum()
                };
            let h = 1e-2f32;
            // Parameters 0..8, then the input (8).
            for which in 0..9 {
                let analytic = if which < 8 {
                    host(&dev, blk.grads.as_ref().unwrap().all()[which])
                } else {
                    host(&dev, &blk.st.gacts.as_ref().unwrap().dx)
                };
                let n = analytic.len();
                for i in (0..n).step_by((n / 9).max(1)) {
                    let mut fd = 0f64;
                    for sign in [1f32, -1.0] {
                        let buf = if which < 8 {
                            blk.param_mut(which)
                        } else {
                            &mut blk.st.acts.x
                        };
                        let mut v = host(&dev, buf);
                        let orig = v[i];
                        v[i] = orig + sign * h;
                        set(&dev, buf, &v);
                        fd += sign as f64 * loss(&mut blk, comm);
                        let buf = if which < 8 {
                            blk.param_mut(which)
                        } else {
                            &mut blk.st.acts.x
                        };
                        v[i] = orig;
                        set(&dev, buf, &v);
                    }
                    fd /= 2.0 * h as f64;
                    let err = (fd - analytic[i] as f64).abs();
                    assert!(
                        err <= 2e-2 * fd.abs() + 2e-4,
                        "tensor {which} element {i}: analytic {} vs numeric {fd}",
                        analytic[i]
                    );
                }
            }
        });
    }

    /// Decoding token s against a cache of tokens 0..s gives the prefill's
    /// output for token s.
    #[test]
    fn decode_with_a_cache_equals_the_last_row_of_prefill() {
        super::super::on_local_ranks(1, |comm| {
            let dev = CpuCompute::new(DType::F32, 1).unwrap();
            let s = 5;
            let mut pre = TpBlock::new(&dev, &cfg(Mode::Forward, false, s + 1), 1, 0, 4).unwrap();
            pre.forward(&dev, comm, &mut PhaseClock::new()).unwrap();
            let (qkv, x, y) = (
                host(&dev, &pre.st.acts.qkv),
                host(&dev, &pre.st.acts.x),
                host(&dev, &pre.st.acts.y),
            );
            let mut dec = TpBlock::new(&dev, &cfg(Mode::Forward, true, s), 1, 0, 4).unwrap();
            let h = 8;
            let mut xd = Vec::new();
            let (mut kc, mut vc) = (vec![0f32; 2 * (s + 1) * h], vec![0f32; 2 * (s + 1) * h]);
            for b in 0..2 {
                let last = b * (s + 1) + s;
                xd.extend_from_slice(&x[last * h..(last + 1) * h]);
                for pos in 0..s {
                    let row = (b * (s + 1) + pos) * 3 * h;
                    let slot = (b * (s + 1) + pos) * h;
                    kc[slot..slot + h].copy_from_slice(&qkv[row + h..row + 2 * h]);
                    vc[slot..slot + h].copy_from_slice(&qkv[row + 2 * h..row + 3 * h]);
                }
            }
            set(&dev, &mut dec.st.acts.x, &xd);
            set(&dev, dec.st.acts.k_cache.as_mut().unwrap(), &kc);
            set(&dev, dec.st.acts.v_cache.as_mut().unwrap(), &vc);
            dec.forward(&dev, comm, &mut PhaseClock::new()).unwrap();
            let yd = host(&dev, &dec.st.acts.y);
            for b in 0..2 {
                let last = b * (s + 1) + s;
                for j in 0..h {
                    let (got, want) = (yd[b * h + j], y[last * h + j]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "batch {b} col {j}: {got} vs {want}"
                    );
                }
            }
        });
    }
}
