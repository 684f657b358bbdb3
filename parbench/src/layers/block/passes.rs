//! The block's passes over one microbatch: the forward, and the split
//! backward's input-gradient and weight-gradient passes, with the
//! collectives that end each sub-block.

use super::super::LayerResult;
use super::attention::{attention_backward, attention_forward};
use super::state::BlockState;
use super::{full, not_train, Ctx, Dims, Params, PhaseClock};
use crate::comm::{Communicator, Io, ReduceOp};
use crate::compute::{Compute, Gemm};

/// One pass over a microbatch: what it reads of the block, and the device,
/// communicator and clock its compute and collectives run on.
pub(super) struct Pass<'a, C: Compute, M> {
    pub(super) ctx: Ctx<'a, C::Buf>,
    pub(super) dev: &'a C,
    pub(super) comm: &'a mut M,
    pub(super) clock: &'a mut PhaseClock,
}

impl<C: Compute, M: Communicator<Buffer = C::Buf>> Pass<'_, C, M> {
    /// The forward of one microbatch: attention then MLP, each ending in its
    /// collective.
    pub(super) fn forward(&mut self, st: &mut BlockState<C::Buf>) -> LayerResult<()> {
        let (a, p, dev) = (&mut st.acts, self.ctx.params, self.dev);
        let Dims {
            n, nr, h, hl, fl, ..
        } = self.ctx.dims;

        self.gather(&a.x, &mut a.x_g)?;
        let x = full(&a.x, &a.x_g);
        dev.gemm(&Gemm::dense(n, 3 * hl, h), x, &p.w_qkv, &mut a.qkv)?;
        dev.add_bias(&mut a.qkv, &p.b_qkv, n, 3 * hl)?;
        if let (Some(kc), Some(vc)) = (a.k_cache.as_mut(), a.v_cache.as_mut()) {
            // The new token's K and V join the cache in its last slot.
            let d = &self.ctx.dims;
            for b in 0..d.batch {
                let slot = (b * d.l + d.seq) * hl;
                dev.copy(&a.qkv, b * 3 * hl + hl, kc, slot, hl)?;
                dev.copy(&a.qkv, b * 3 * hl + 2 * hl, vc, slot, hl)?;
            }
        }
        attention_forward(dev, &self.ctx.dims, self.ctx.decode, a)?;
        dev.gemm(&Gemm::dense(n, h, hl), &a.ctx, &p.w_o, &mut a.z)?;
        self.reduce(&mut a.z, &mut a.z_s)?;

        dev.copy(&a.x, 0, &mut a.y1, 0, nr * h)?;
        dev.add(&mut a.y1, full(&a.z, &a.z_s), nr * h)?;
        dev.add_bias(&mut a.y1, &p.b_o, nr, h)?;

        self.gather(&a.y1, &mut a.y1_g)?;
        let y1 = full(&a.y1, &a.y1_g);
        dev.gemm(&Gemm::dense(n, fl, h), y1, &p.w_1, &mut a.h1)?;
        dev.add_bias(&mut a.h1, &p.b_1, n, fl)?;
        dev.gelu(&a.h1, &mut a.a1, n * fl)?;
        dev.gemm(&Gemm::dense(n, h, fl), &a.a1, &p.w_2, &mut a.z2)?;
        self.reduce(&mut a.z2, &mut a.z2_s)?;

        dev.copy(&a.y1, 0, &mut a.y, 0, nr * h)?;
        dev.add(&mut a.y, full(&a.z2, &a.z2_s), nr * h)?;
        dev.add_bias(&mut a.y, &p.b_2, nr, h)?;
        self.end()
    }

    /// The input-gradient pass of one microbatch (zero-bubble's `I`): from
    /// `dy` at the output to `dx` at the input, through both sub-blocks' input
    /// gradients and collectives, keeping what the weight pass reads.
    pub(super) fn input_grad(&mut self, st: &mut BlockState<C::Buf>) -> LayerResult<()> {
        let ga = st.gacts.as_mut().ok_or_else(not_train)?;
        let (a, p, dev) = (&st.acts, self.ctx.params, self.dev);
        let Dims {
            n, nr, h, hl, fl, ..
        } = self.ctx.dims;

        // MLP: the output gradient reaches every rank's columns (all-gather
        // with sequence parallelism; replicated otherwise).
        self.gather(&ga.dy, &mut ga.dy_g)?;
        let dy = full(&ga.dy, &ga.dy_g);
        dev.gemm(&nt(n, fl, h, h, h), dy, &p.w_2, &mut ga.da)?;
        dev.gelu_backward(&a.h1, &ga.da, &mut ga.dh, n * fl)?;
        dev.gemm(&nt(n, h, fl, fl, fl), &ga.dh, &p.w_1, &mut ga.dy1p)?;
        self.reduce(&mut ga.dy1p, &mut ga.dy1p_s)?;
        dev.copy(&ga.dy, 0, &mut ga.dy1, 0, nr * h)?;
        dev.add(&mut ga.dy1, full(&ga.dy1p, &ga.dy1p_s), nr * h)?;

        // Attention.
        self.gather(&ga.dy1, &mut ga.dy1_g)?;
        let dy1 = full(&ga.dy1, &ga.dy1_g);
        dev.gemm(&nt(n, hl, h, h, h), dy1, &p.w_o, &mut ga.dctx)?;
        attention_backward(dev, &self.ctx.dims, a, ga)?;
        dev.gemm(
            &nt(n, h, 3 * hl, 3 * hl, 3 * hl),
            &ga.dqkv,
            &p.w_qkv,
            &mut ga.dxp,
        )?;
        self.reduce(&mut ga.dxp, &mut ga.dxp_s)?;
        dev.copy(&ga.dy1, 0, &mut ga.dx, 0, nr * h)?;
        dev.add(&mut ga.dx, full(&ga.dxp, &ga.dxp_s), nr * h)?;
        self.end()
    }

    /// All-gathers token rows into `gathered` where sequence parallelism keeps one.
    pub(super) fn gather(
        &mut self,
        local: &C::Buf,
        gathered: &mut Option<C::Buf>,
    ) -> LayerResult<()> {
        let Some(recv) = gathered.as_mut() else {
            return Ok(());
        };
        let count = self.ctx.dims.nr * self.ctx.dims.h;
        self.clock.before_collective(self.dev, self.comm)?;
        let send = local;
        self.comm
            .all_gather(Io::OutOfPlace { send, recv }, count, self.ctx.dtype)?;
        self.clock.end_comm(self.comm)
    }

    /// Sums a row-parallel product's partial results: all-reduce in place,
    /// or reduce-scatter into `scattered` with sequence parallelism.
    pub(super) fn reduce(
        &mut self,
        partial: &mut C::Buf,
        scattered: &mut Option<C::Buf>,
    ) -> LayerResult<()> {
        if self.ctx.tp <= 1 {
            return Ok(());
        }
        let Dims { n, nr, h, .. } = self.ctx.dims;
        let dtype = self.ctx.dtype;
        self.clock.before_collective(self.dev, self.comm)?;
        match scattered.as_mut() {
            Some(recv) => {
                let send = partial;
                let io = Io::OutOfPlace { send, recv };
                self.comm.reduce_scatter(io, nr * h, dtype, ReduceOp::Sum)?
            }
            None => self
                .comm
                .all_reduce(Io::InPlace(partial), n * h, dtype, ReduceOp::Sum)?,
        }
        self.clock.end_comm(self.comm)
    }

    /// Ends the pass's last compute phase.
    pub(super) fn end(&mut self) -> LayerResult<()> {
        self.clock.end_compute(self.dev)
    }
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

/// The weight-gradient pass of one microbatch (zero-bubble's `W`): every
/// parameter's gradient from the activations and the input-gradient
/// pass's intermediate gradients; `accumulate` adds to the gradients
/// instead of overwriting them. Needs no communication: the gathered
/// copies it reads were made by the input pass.
pub(super) fn weight_grad_pass<C: Compute>(
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
