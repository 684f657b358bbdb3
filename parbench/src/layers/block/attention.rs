//! Scaled-dot-product attention of a rank's heads and its backward.

use super::super::LayerResult;
use super::state::{Acts, GradActs};
use super::Dims;
use crate::compute::{Compute, Gemm};

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
        attention: true,
    }
}

/// Scaled-dot-product attention of this rank's heads:
/// `ctx = softmax(Q K^T / sqrt(d)) V`, causal in prefill.
pub(super) fn attention_forward<C: Compute>(
    dev: &C,
    dims: &Dims,
    decode: bool,
    a: &mut Acts<C::Buf>,
) -> LayerResult<()> {
    let cache = (&a.k_cache, &a.v_cache);
    attend(dev, dims, !decode, &a.qkv, cache, &mut a.probs, &mut a.ctx)
}

/// [`attention_forward`] on explicit buffers (the MoE layer's attention
/// holds no block state): `ctx` and the probabilities `probs` from the
/// fused `qkv` rows, or the caches' keys and values where given.
pub(in crate::layers) fn attend<C: Compute>(
    dev: &C,
    dims: &Dims,
    causal: bool,
    qkv: &C::Buf,
    cache: (&Option<C::Buf>, &Option<C::Buf>),
    probs: &mut C::Buf,
    ctx: &mut C::Buf,
) -> LayerResult<()> {
    let (hl, al, d, batch, lq, l) = dims.attention_shape();
    let scale = 1.0 / (d as f32).sqrt();
    let sq = lq * l;
    for b in 0..batch {
        let kv = kv_view(dims, qkv, cache, b);
        let g = per_head(
            dims,
            (lq, l, d),
            (false, b * lq * 3 * hl, 3 * hl, d),
            (true, kv.k_off, kv.ld, d),
            (b * al * sq, l, sq),
            scale,
        );
        dev.gemm(&g, qkv, kv.k, probs)?;
    }
    dev.softmax(probs, 0, batch * al * lq, l, causal)?;
    for b in 0..batch {
        let kv = kv_view(dims, qkv, cache, b);
        let g = per_head(
            dims,
            (lq, d, l),
            (false, b * al * sq, l, sq),
            (false, kv.v_off, kv.ld, d),
            (b * lq * hl, hl, d),
            1.0,
        );
        dev.gemm(&g, probs, kv.v, ctx)?;
    }
    Ok(())
}

/// Backward of [`attention_forward`] in prefill: `dqkv` from `dctx`.
pub(super) fn attention_backward<C: Compute>(
    dev: &C,
    dims: &Dims,
    a: &Acts<C::Buf>,
    ga: &mut GradActs<C::Buf>,
) -> LayerResult<()> {
    let grads = (&mut ga.dprobs, &mut ga.dqkv);
    attend_backward(dev, dims, (&a.qkv, &a.probs), &ga.dctx, grads)
}

/// [`attention_backward`] on explicit buffers: `dqkv` (and the scratch
/// `dprobs`) from `dctx`, given the forward's `qkv` and `probs`.
pub(in crate::layers) fn attend_backward<C: Compute>(
    dev: &C,
    dims: &Dims,
    (qkv, probs): (&C::Buf, &C::Buf),
    dctx: &C::Buf,
    (dprobs, dqkv): (&mut C::Buf, &mut C::Buf),
) -> LayerResult<()> {
    let (hl, al, d, batch, lq, l) = dims.attention_shape();
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
        dev.gemm(&g, dctx, qkv, dprobs)?;
        // dV = P^T dO
        let g = per_head(
            dims,
            (l, d, lq),
            (true, p_off, l, sq),
            (false, o_off, hl, d),
            (v_off, 3 * hl, d),
            1.0,
        );
        dev.gemm(&g, probs, dctx, dqkv)?;
    }
    // dS = softmax'(P) dP, in place; then the scale of S = scale Q K^T.
    dev.softmax_backward(probs, dprobs, 0, batch * al * lq, l)?;
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
        dev.gemm(&g, dprobs, qkv, dqkv)?;
        // dK = scale dS^T Q
        let g = per_head(
            dims,
            (l, d, lq),
            (true, p_off, l, sq),
            (false, q_off, 3 * hl, d),
            (k_off, 3 * hl, d),
            scale,
        );
        dev.gemm(&g, dprobs, qkv, dqkv)?;
    }
    Ok(())
}
