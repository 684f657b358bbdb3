//! One rank's shard of the block: its weights, activations and gradients on
//! a compute device, its forward and backward, and the collectives between
//! them on a communicator that moves the same buffers.
//!
//! Every collective is bracketed by [`PhaseClock`]: the device is synced
//! before it (so the compute before it is charged to compute) and the
//! communicator after it (so the collective is charged to communication).
//! On a GPU this serialises compute and communication, which is what makes
//! the two figures separable. The wait for a slower peer's compute lands in
//! the communication time of the faster rank, as it does in a real step,
//! unless the clock times waiting apart ([`PhaseClock::waiting_apart`]: a
//! barrier before each collective, as bench-layers times the block).

//!
//! The parts, one job each: [`clock`] (the compute/communication split),
//! `state` (a microbatch's buffers), `passes` (forward, input-gradient and
//! weight-gradient passes with their collectives) and `attention`.

mod attention;
mod clock;
mod passes;
mod state;

pub use super::layout::Params;
pub(super) use attention::{attend, attend_backward};
pub use clock::PhaseClock;
pub use state::BlockState;

use super::layout::{DataSpecs, ParamSpecs, TensorSpec};
use super::{BlockConfig, LayerError, LayerResult, Mode};
use crate::comm::{Communicator, DType};
use crate::compute::Compute;
use passes::{weight_grad_pass, Pass};
use state::{alloc_state, empty_state};

/// The sizes every kernel call is built from.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    /// Tokens per block call.
    pub(super) n: usize,
    /// Token rows this rank holds (n / t with sequence parallelism, else n).
    pub(super) nr: usize,
    pub(super) h: usize,
    /// Q (or K, or V) columns of this rank: its heads x head width.
    pub(super) hl: usize,
    /// Heads of this rank.
    pub(super) al: usize,
    /// Head width.
    pub(super) d: usize,
    /// MLP columns of this rank.
    pub(super) fl: usize,
    pub(super) batch: usize,
    /// Query rows per sequence.
    pub(super) lq: usize,
    /// Keys per sequence.
    pub(super) l: usize,
    /// Cache slot of the new token in decode.
    pub(super) seq: usize,
}

impl Dims {
    /// What attention reads of the shape: (Q columns of this rank, its
    /// heads, head width, sequences, query rows, key rows).
    pub(super) fn attention_shape(&self) -> (usize, usize, usize, usize, usize, usize) {
        (self.hl, self.al, self.d, self.batch, self.lq, self.l)
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
pub(super) struct Ctx<'a, B> {
    pub(super) tp: usize,
    pub(super) dims: Dims,
    pub(super) dtype: DType,
    pub(super) decode: bool,
    pub(super) params: &'a Params<B>,
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
pub(super) fn full<'a, B>(local: &'a B, gathered: &'a Option<B>) -> &'a B {
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
        let params = ps.try_map(load)?;
        let train = cfg.mode == Mode::Train;
        let grads = if train {
            Some(ps.try_map(|spec| dev.alloc(spec.local_len(tp)))?)
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

    /// A pass of this block on `dev`, `comm` and `clock`.
    fn pass<'a, M>(
        &'a self,
        dev: &'a C,
        comm: &'a mut M,
        clock: &'a mut PhaseClock,
    ) -> Pass<'a, C, M> {
        let ctx = Ctx {
            tp: self.tp,
            dims: self.dims,
            dtype: self.dtype,
            decode: self.cfg.decode,
            params: &self.params,
        };
        Pass {
            ctx,
            dev,
            comm,
            clock,
        }
    }

    /// Sets every parameter gradient to zero (before a step that accumulates).
    pub fn zero_grads(&mut self, dev: &C) -> LayerResult<()> {
        let tp = self.tp;
        if self.grads.is_some() {
            let ps = ParamSpecs::new(&self.cfg);
            self.grads = Some(ps.try_map(|spec| dev.alloc(spec.local_len(tp)))?);
        }
        Ok(())
    }

    /// This rank's parameters (the tensor-parallel shard of each).
    pub fn params(&self) -> &Params<C::Buf> {
        &self.params
    }

    /// Hands the parameters over, leaving empty buffers until
    /// [`TpBlock::put_params`] (ZeRO-3 frees a layer's gathered weights
    /// between its uses). A pass run meanwhile fails on its buffer sizes.
    pub fn take_params(&mut self, dev: &C) -> LayerResult<Params<C::Buf>> {
        let empty = self.params.try_map(|_| dev.alloc(0))?;
        Ok(std::mem::replace(&mut self.params, empty))
    }

    /// Puts parameters back (each of its tensor's local length).
    pub fn put_params(&mut self, p: Params<C::Buf>) {
        self.params = p;
    }

    /// Hands the gradients over, leaving empty buffers (ZeRO-2 and -3 keep
    /// only a share after each layer's reduce-scatter); [`TpBlock::zero_grads`]
    /// makes them whole again. `None` outside training.
    pub fn take_grads(&mut self, dev: &C) -> LayerResult<Option<Params<C::Buf>>> {
        let Some(g) = self.grads.as_ref() else {
            return Ok(None);
        };
        let empty = g.try_map(|_| dev.alloc(0))?;
        Ok(self.grads.replace(empty))
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
        self.grads.as_mut()?.get_mut(i)
    }

    /// Parameter `i` ([`Params::all`]'s order), to write updated weights.
    pub fn param_mut(&mut self, i: usize) -> Option<&mut C::Buf> {
        self.params.get_mut(i)
    }

    /// One forward pass: attention then MLP, each ending in its collective.
    pub fn forward<M>(&mut self, dev: &C, comm: &mut M, clock: &mut PhaseClock) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let mut st = std::mem::replace(&mut self.st, empty_state(dev)?);
        let r = self.pass(dev, comm, clock).forward(&mut st);
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
        let r = self.pass(dev, comm, clock).input_grad(&mut st);
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
        self.pass(dev, comm, clock).forward(st)
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
        self.pass(dev, comm, clock).input_grad(st)
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
        let mut io = self.pass(dev, comm, clock);
        let a = &mut st.acts;
        io.gather(&a.x, &mut a.x_g)?;
        io.reduce(&mut a.z, &mut a.z_s)?;
        io.gather(&a.y1, &mut a.y1_g)?;
        io.reduce(&mut a.z2, &mut a.z2_s)?;
        io.end()
    }
}

pub(super) fn not_train() -> LayerError {
    LayerError::Config("backward needs a block built in train mode".into())
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
                            blk.param_mut(which).unwrap()
                        } else {
                            &mut blk.st.acts.x
                        };
                        let mut v = host(&dev, buf);
                        let orig = v[i];
                        v[i] = orig + sign * h;
                        set(&dev, buf, &v);
                        fd += sign as f64 * loss(&mut blk, comm);
                        let buf = if which < 8 {
                            blk.param_mut(which).unwrap()
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
