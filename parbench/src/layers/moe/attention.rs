//! The attention before the MoE layer, tensor-parallel over heads with
//! sequence parallelism (Megatron-Core requires it beside an MoE layer):
//! the layer's `W` ranks form `W / tp` data-parallel replicas of `tp`
//! consecutive ranks (Megatron's order, tensor fastest), each replica
//! attending over its own sequences. A rank holds `N / W` rows of the
//! residual stream, the same rows the MoE layer after it takes: the
//! replica's rows are all-gathered over its tensor group, the fused QKV
//! projection is column-parallel (the rank's heads), the output projection
//! row-parallel, and its partial sums are reduce-scattered back to each
//! rank's rows before the residual. The backward runs the conjugates: an
//! all-gather of the output gradient's rows and a reduce-scatter of the
//! input gradient's partial sums. No biases (the dense block's are
//! element-wise work that moves nothing between ranks).
//!
//! The attention itself is the dense block's ([`attend`], [`attend_backward`]).

use super::super::block::{attend, attend_backward, Dims, PhaseClock};
use super::super::layout::{Split, TensorSpec};
use super::super::LayerResult;
use super::exchange::{sum_parts, Group};
use super::{MoeConfig, MoeLayout};
use crate::comm::Communicator;
use crate::compute::{Compute, Gemm};
use std::cell::Cell;
use std::time::Duration;

/// The attention's two weights: fused `[Q | K | V]` (`h x 3h`, the rank's
/// heads' columns of each third) and the output projection (`h x h`, the
/// rank's heads' rows), both tensor-parallel over `tp` ranks and the same
/// on every replica.
pub(super) fn weight_specs(cfg: &MoeConfig) -> [TensorSpec; 2] {
    let h = cfg.hidden;
    let cols = if cfg.attention.is_some() { 3 * h } else { 0 };
    let w = |name, tag, cols, split| TensorSpec {
        name,
        tag,
        rows: h,
        cols,
        split,
        scale: 1.0 / (h.max(1) as f32).sqrt(),
    };
    [
        w("w_qkv", 31, cols, Split::QkvCols),
        w("w_o", 32, cols / 3, Split::Rows),
    ]
}

/// What the forward leaves for the backward.
struct Saved<B> {
    x_g: B,
    qkv: B,
    probs: B,
    ctx: B,
}

/// One rank's shard of the attention.
pub(super) struct TpAttention<C: Compute> {
    tp: usize,
    /// The ranks of this rank's tensor group, in tensor order.
    group: Vec<usize>,
    dims: Dims,
    /// `w_qkv`, `w_o`.
    params: [C::Buf; 2],
    grads: Option<[C::Buf; 2]>,
    saved: Option<Saved<C::Buf>>,
}

/// `C = op(A) op(B)` for dense row-major operands.
fn gemm(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> Gemm {
    Gemm {
        trans_a,
        trans_b,
        lda: if trans_a { m } else { k },
        ldb: if trans_b { k } else { n },
        ..Gemm::dense(m, n, k)
    }
}

impl<C: Compute> TpAttention<C> {
    /// Rank `rank`'s shard for `cfg`'s attention (`None` without one),
    /// seeded by `seed`. `cfg.validate(layout)` has passed.
    pub(super) fn new(
        dev: &C,
        cfg: &MoeConfig,
        layout: MoeLayout,
        rank: usize,
        seed: u64,
    ) -> LayerResult<Option<Self>> {
        let Some(a) = cfg.attention else {
            return Ok(None);
        };
        let (tp, world) = (layout.tp, layout.world());
        let (h, i) = (cfg.hidden, rank % tp);
        let replica_rows = cfg.tokens / (world / tp);
        let dims = Dims {
            n: replica_rows,
            nr: replica_rows / tp,
            h,
            hl: h / tp,
            al: a.heads / tp,
            d: h / a.heads,
            fl: 0,
            batch: replica_rows / a.seq,
            lq: a.seq,
            l: a.seq,
            seq: a.seq,
        };
        let load = |s: &TensorSpec| -> LayerResult<C::Buf> {
            let mut b = dev.alloc(s.local_len(tp))?;
            dev.upload(&s.shard_values(seed, tp, i), &mut b)?;
            Ok(b)
        };
        let [q, o] = weight_specs(cfg);
        let grads = match cfg.mode {
            super::Mode::Train => Some([dev.alloc(q.local_len(tp))?, dev.alloc(o.local_len(tp))?]),
            super::Mode::Forward => None,
        };
        Ok(Some(TpAttention {
            tp,
            group: (rank - i..rank - i + tp).collect(),
            dims,
            params: [load(&q)?, load(&o)?],
            grads,
            saved: None,
        }))
    }

    /// Weight `i` (`w_qkv`, `w_o`), for the finite-difference test.
    #[cfg(test)]
    pub(super) fn param_mut(&mut self, i: usize) -> &mut C::Buf {
        &mut self.params[i]
    }

    /// The weight gradients (`w_qkv`, `w_o`: this rank's heads, summed over
    /// its replica's tokens), after [`TpAttention::backward`].
    pub(super) fn param_grads(&self) -> Option<&[C::Buf; 2]> {
        self.grads.as_ref()
    }

    /// This rank's tensor group, its time going to `spent`.
    fn group<'a>(&'a self, spent: &'a Cell<Duration>) -> Group<'a> {
        Group {
            ranks: &self.group,
            spent,
        }
    }

    /// All-gathers this rank's rows (`x`, `nr x h`) over the tensor group:
    /// the replica's rows in tensor order.
    fn gather<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        spent: &Cell<Duration>,
        x: Vec<f32>,
    ) -> LayerResult<Vec<f32>>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        if self.tp == 1 {
            return Ok(x);
        }
        let len = x.len();
        let got =
            self.group(spent)
                .exchange(dev, comm, clock, vec![x; self.tp], &vec![len; self.tp])?;
        Ok(got.concat())
    }

    /// Reduce-scatters the replica's partial rows (`n x h`) over the
    /// tensor group: this rank's rows, summed in tensor order.
    fn reduce_scatter<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        spent: &Cell<Duration>,
        all: Vec<f32>,
    ) -> LayerResult<Vec<f32>>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        if self.tp == 1 {
            return Ok(all);
        }
        let mine = all.len() / self.tp;
        let send: Vec<Vec<f32>> = all.chunks_exact(mine.max(1)).map(<[f32]>::to_vec).collect();
        let got = self
            .group(spent)
            .exchange(dev, comm, clock, send, &vec![mine; self.tp])?;
        Ok(sum_parts(&got, mine))
    }

    /// `x + attention(x)` of this rank's rows `x` (host, `nr x h`).
    /// Collective over the layer's ranks; the tensor group's exchanges'
    /// time is added to `spent`.
    pub(super) fn forward<M>(
        &mut self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        spent: &Cell<Duration>,
        x: &[f32],
    ) -> LayerResult<Vec<f32>>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let Dims { n, h, hl, al, .. } = self.dims;
        let mut x_g = dev.alloc(n * h)?;
        dev.upload(&self.gather(dev, comm, clock, spent, x.to_vec())?, &mut x_g)?;
        let mut qkv = dev.alloc(n * 3 * hl)?;
        dev.gemm(
            &gemm(n, 3 * hl, h, false, false),
            &x_g,
            &self.params[0],
            &mut qkv,
        )?;
        let mut probs = dev.alloc(self.dims.batch * al * self.dims.lq * self.dims.l)?;
        let mut ctx = dev.alloc(n * hl)?;
        attend(
            dev,
            &self.dims,
            true,
            &qkv,
            (&None, &None),
            &mut probs,
            &mut ctx,
        )?;
        let mut z = dev.alloc(n * h)?;
        dev.gemm(&gemm(n, h, hl, false, false), &ctx, &self.params[1], &mut z)?;
        let mut z_h = vec![0f32; n * h];
        dev.download(&z, &mut z_h)?;
        let mut y = self.reduce_scatter(dev, comm, clock, spent, z_h)?;
        for (y, x) in y.iter_mut().zip(x) {
            *y += x;
        }
        self.saved = Some(Saved {
            x_g,
            qkv,
            probs,
            ctx,
        });
        Ok(y)
    }

    /// The gradient of this rank's input rows from that of its output rows
    /// `dy` (host, `nr x h`), after [`TpAttention::forward`]; the weight
    /// gradients overwritten.
    pub(super) fn backward<M>(
        &mut self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        spent: &Cell<Duration>,
        dy: &[f32],
    ) -> LayerResult<Vec<f32>>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let Dims { n, h, hl, .. } = self.dims;
        let missing = || super::LayerError::Config("attention backward before forward".into());
        let mut dz = dev.alloc(n * h)?;
        dev.upload(&self.gather(dev, comm, clock, spent, dy.to_vec())?, &mut dz)?;
        let (Some(s), Some([g_qkv, g_o])) = (self.saved.as_ref(), self.grads.as_mut()) else {
            return Err(missing());
        };
        let mut dctx = dev.alloc(n * hl)?;
        dev.gemm(
            &gemm(n, hl, h, false, true),
            &dz,
            &self.params[1],
            &mut dctx,
        )?;
        dev.gemm(&gemm(hl, h, n, true, false), &s.ctx, &dz, g_o)?;
        let d = &self.dims;
        let mut dprobs = dev.alloc(d.batch * d.al * d.lq * d.l)?;
        let mut dqkv = dev.alloc(n * 3 * hl)?;
        let grads = (&mut dprobs, &mut dqkv);
        attend_backward(dev, &self.dims, (&s.qkv, &s.probs), &dctx, grads)?;
        dev.gemm(&gemm(h, 3 * hl, n, true, false), &s.x_g, &dqkv, g_qkv)?;
        let mut dx_part = dev.alloc(n * h)?;
        dev.gemm(
            &gemm(n, h, 3 * hl, false, true),
            &dqkv,
            &self.params[0],
            &mut dx_part,
        )?;
        let mut part = vec![0f32; n * h];
        dev.download(&dx_part, &mut part)?;
        let mut dx = self.reduce_scatter(dev, comm, clock, spent, part)?;
        for (d, y) in dx.iter_mut().zip(dy) {
            *d += y;
        }
        Ok(dx)
    }
}
