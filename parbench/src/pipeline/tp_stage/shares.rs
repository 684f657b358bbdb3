//! How the sharded modes lay a unit out: a layer's (or a bucket's)
//! tensors flat in [`ParamSpecs::all`]'s order, padded to whole shares of
//! the group, rank `r` owning elements `r n / g .. (r + 1) n / g`; and the
//! copies between the blocks' tensors and a flat range of that layout.

use super::super::PipelineError;
use super::buckets::Slot;
use crate::compute::Compute;
use crate::layers::layout::ParamSpecs;
use crate::layers::{BlockConfig, TpBlock};

/// Rank `r`'s share of a unit of `len` elements over `g` ranks: (start, elements).
pub(super) fn share_of(len: usize, g: usize, r: usize) -> (usize, usize) {
    let n = len / g.max(1);
    (r * n, n)
}

/// The slots of one layer's parameters, flat in [`ParamSpecs::all`]'s order.
pub(super) fn layer_slots(cfg: &BlockConfig, tp: usize, layer: usize) -> Vec<Slot> {
    let mut offset = 0;
    ParamSpecs::new(cfg)
        .all()
        .iter()
        .enumerate()
        .map(|(param, spec)| {
            let len = spec.local_len(tp);
            let s = Slot {
                layer,
                param,
                offset,
                len,
            };
            offset += len;
            s
        })
        .collect()
}

/// A unit's length padded to whole shares of `g` ranks.
pub(super) fn padded(slots: &[Slot], g: usize) -> usize {
    let used: usize = slots.iter().map(|s| s.len).sum();
    used.div_ceil(g.max(1)) * g.max(1)
}

/// Which of a block's tensors a copy reads or writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Of {
    Params,
    Grads,
}

pub(super) fn tensor<'a, C: Compute>(
    blocks: &'a [TpBlock<C>],
    s: &Slot,
    of: Of,
) -> Result<&'a C::Buf, PipelineError> {
    let b = blocks
        .get(s.layer)
        .ok_or_else(|| PipelineError::Protocol(format!("no block {}", s.layer)))?;
    match of {
        Of::Params => Ok(b.params().all()[s.param]),
        Of::Grads => super::buckets::grad(blocks, s),
    }
}

/// Copies the part of `slots`' tensors that falls in the flat range
/// `start .. start + n` into `dst` (from its element 0).
pub(super) fn pack_range<C: Compute>(
    c: &C,
    blocks: &[TpBlock<C>],
    slots: &[Slot],
    of: Of,
    start: usize,
    n: usize,
    dst: &mut C::Buf,
) -> Result<(), PipelineError> {
    for s in slots {
        let (lo, hi) = (s.offset.max(start), (s.offset + s.len).min(start + n));
        if lo < hi {
            c.copy(
                tensor(blocks, s, of)?,
                lo - s.offset,
                dst,
                lo - start,
                hi - lo,
            )?;
        }
    }
    Ok(())
}

/// Copies `src` (the flat range `start .. start + n`) into the part of
/// `slots`' tensors it covers.
pub(super) fn unpack_range<C: Compute>(
    c: &C,
    src: &C::Buf,
    start: usize,
    n: usize,
    slots: &[Slot],
    of: Of,
    blocks: &mut [TpBlock<C>],
) -> Result<(), PipelineError> {
    for s in slots {
        let (lo, hi) = (s.offset.max(start), (s.offset + s.len).min(start + n));
        if lo >= hi {
            continue;
        }
        let b = blocks
            .get_mut(s.layer)
            .ok_or_else(|| PipelineError::Protocol(format!("no block {}", s.layer)))?;
        let dst = match of {
            Of::Params => b.param_mut(s.param),
            Of::Grads => b.param_grad_mut(s.param),
        }
        .ok_or_else(|| PipelineError::Protocol(format!("block {} has no tensor", s.layer)))?;
        c.copy(src, lo - start, dst, lo - s.offset, hi - lo)?;
    }
    Ok(())
}
