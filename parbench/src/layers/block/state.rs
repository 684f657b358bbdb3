//! What one microbatch holds on the device between the block's passes.

use super::super::{BlockConfig, LayerError, LayerResult, Mode};
use super::{not_train, Dims};
use crate::compute::Compute;

/// Forward activations. `*_g` are the token-gathered copies that exist only
/// with sequence parallelism; `*_s` the reduce-scattered results.
pub(super) struct Acts<B> {
    pub(super) x: B,
    pub(super) x_g: Option<B>,
    pub(super) qkv: B,
    pub(super) probs: B,
    pub(super) ctx: B,
    pub(super) k_cache: Option<B>,
    pub(super) v_cache: Option<B>,
    pub(super) z: B,
    pub(super) z_s: Option<B>,
    pub(super) y1: B,
    pub(super) y1_g: Option<B>,
    pub(super) h1: B,
    pub(super) a1: B,
    pub(super) z2: B,
    pub(super) z2_s: Option<B>,
    pub(super) y: B,
}

/// Backward activations (train mode).
pub(super) struct GradActs<B> {
    pub(super) dy: B,
    pub(super) dy_g: Option<B>,
    pub(super) da: B,
    pub(super) dh: B,
    pub(super) dy1p: B,
    pub(super) dy1p_s: Option<B>,
    pub(super) dy1: B,
    pub(super) dy1_g: Option<B>,
    pub(super) dctx: B,
    pub(super) dprobs: B,
    pub(super) dqkv: B,
    pub(super) dxp: B,
    pub(super) dxp_s: Option<B>,
    pub(super) dx: B,
}

/// What one microbatch leaves in the block between its passes: the
/// forward's activations and (train mode) the backward's. A pipeline stage
/// holds one per microbatch in flight; the block's own single-shot calls
/// ([`TpBlock::forward`], [`TpBlock::backward`]) use the block's own.
pub struct BlockState<B> {
    pub(super) acts: Acts<B>,
    pub(super) gacts: Option<GradActs<B>>,
    /// Elements held (for the pipeline's peak-activation count).
    pub(super) elems: usize,
}

impl<B> BlockState<B> {
    /// Elements this state holds on the device.
    pub fn elems(&self) -> usize {
        self.elems
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

/// A state of no buffers, standing in while the block's own is lent out.
pub(super) fn empty_state<C: Compute>(dev: &C) -> LayerResult<BlockState<C::Buf>> {
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
pub(super) fn alloc_state<C: Compute>(
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
