//! One rank's context-parallel attention backward, by each method as
//! Megatron-Core and Transformer Engine run it:
//!
//! - `p2p`: K/V go around the ring again with their gradients dK/dV
//!   following them; each rank adds its queries' share to the block it
//!   holds and passes the sums on, and one last step returns each block's
//!   dK/dV to its owner (C - 1 K/V transfers, C dK/dV transfers, all but
//!   the last behind a step's compute).
//! - `all_gather`: K/V gathered again, dK/dV of the whole sequence summed
//!   back to their owners by a reduce-scatter.
//! - `a2a`: the forward's all-to-alls reversed: the output's gradient to
//!   head-sharded, attention's backward over the whole sequence, dQ/dK/dV
//!   back to sequence-sharded.
//!
//! The attention's backward recomputes the probabilities from the
//! forward's log-sum-exp (flash-attention style): nothing of size
//! seq x seq is kept.

use super::attend::{add_block_backward, delta, Queries};
use super::forward::{heads_of, packed_kv, to_heads, to_tokens, CpClock, CpForward, CpInputs};
use super::ring::{all_gather_f32, blocking, reduce_scatter_f32, timed, Ring};
use super::{positions, CpComm, CpConfig};
use crate::comm::{Communicator, HostBuffer};
use crate::layers::{LayerError, LayerResult};

/// The gradients of this rank's Q, K and V, each
/// `[batch][local tokens][heads][head width]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpGrads {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
}

impl CpGrads {
    /// Splits packed `[dk | dv]`.
    fn with_kv(dq: Vec<f32>, mut dkv: Vec<f32>) -> Self {
        let dv = dkv.split_off(dkv.len() / 2);
        CpGrads { dq, dk: dkv, dv }
    }
}

/// The gradients of this rank's inputs for the output's gradient
/// `x.dout`, after `fwd` by the same method on the same ranks.
/// Collective, as [`super::cp_forward`].
pub fn cp_backward<M, D>(
    comm: &mut M,
    dup: Option<&mut D>,
    cfg: &CpConfig,
    x: &CpInputs,
    fwd: &CpForward,
    clock: &mut CpClock,
) -> LayerResult<CpGrads>
where
    M: Communicator,
    D: Communicator<Buffer = HostBuffer>,
{
    let cp = comm.world();
    if x.dout.len() != fwd.out.len() {
        return Err(LayerError::Config(
            "the backward needs the output's gradient (a train run)".into(),
        ));
    }
    match (cp, cfg.method) {
        (1, _) => Ok(local_backward(cfg, x, fwd, clock)),
        (_, CpComm::P2p) => {
            let ring = match dup {
                Some(d) => Ring::Thread(d),
                None => Ring::InLine(comm),
            };
            ring_backward(ring, cfg, x, fwd, clock)
        }
        (_, CpComm::AllGather) => gathered_backward(comm, cfg, x, fwd, clock),
        (_, CpComm::A2a) => ulysses_backward(comm, cfg, x, fwd, clock),
    }
}

/// This rank's queries as the backward reads them (`delta` computed once).
fn queries<'a>(x: &'a CpInputs, fwd: &'a CpForward, delta: &'a [f32]) -> Queries<'a> {
    Queries {
        q: &x.q,
        pos: &x.pos,
        dout: &x.dout,
        lse: &fwd.lse,
        delta,
    }
}

/// Adds the gradients of the packed `[k | v]` block of rank `src` for
/// this rank's queries: to `dq`, and to the packed `[dk | dv]`.
fn add_kv_backward(
    cfg: &CpConfig,
    qs: Queries<'_>,
    (kv, src, cp): (&[f32], usize, usize),
    dq: &mut [f32],
    dkv: &mut [f32],
) {
    let (k, v) = kv.split_at(kv.len() / 2);
    let (dk, dv) = dkv.split_at_mut(dkv.len() / 2);
    let pos = positions(cfg.seq, cp, src);
    add_block_backward(heads_of(cfg, cfg.heads), qs, (k, v, &pos), dq, (dk, dv));
}

fn local_backward(cfg: &CpConfig, x: &CpInputs, fwd: &CpForward, clock: &mut CpClock) -> CpGrads {
    timed(&mut clock.compute, || {
        let dl = delta(cfg.head_dim, &x.dout, &fwd.out);
        let mut dq = vec![0f32; x.q.len()];
        let mut dkv = vec![0f32; 2 * x.k.len()];
        add_kv_backward(
            cfg,
            queries(x, fwd, &dl),
            (&packed_kv(x), 0, 1),
            &mut dq,
            &mut dkv,
        );
        CpGrads::with_kv(dq, dkv)
    })
}

/// The ring backward: at step `s` this rank holds rank `rank - s`'s K/V
/// and adds its queries' share of that block's dK/dV to the sum the
/// previous rank passed on, while the next K/V and the last step's sum
/// travel; a last transfer hands each completed sum to its owner.
fn ring_backward<M, D>(
    mut ring: Ring<'_, M, D>,
    cfg: &CpConfig,
    x: &CpInputs,
    fwd: &CpForward,
    clock: &mut CpClock,
) -> LayerResult<CpGrads>
where
    M: Communicator,
    D: Communicator<Buffer = HostBuffer>,
{
    let (cp, rank) = ring.place();
    let dl = timed(&mut clock.compute, || {
        delta(cfg.head_dim, &x.dout, &fwd.out)
    });
    let qs = queries(x, fwd, &dl);
    let mut dq = vec![0f32; x.q.len()];
    let mut cur = packed_kv(x);
    let n = cur.len();
    let mut nxt = vec![0f32; n];
    // The sum this rank passes on (its last step's block) and the one it receives.
    let mut passing = vec![0f32; n];
    let mut arriving = vec![0f32; n];
    for step in 0..cp {
        let src = (rank + cp - step) % cp;
        let mut mine = vec![0f32; n];
        {
            let mut moves = Vec::with_capacity(2);
            if step + 1 < cp {
                moves.push((&cur[..], &mut nxt[..]));
            }
            if step > 0 {
                moves.push((&passing[..], &mut arriving[..]));
            }
            let held = &cur;
            ring.step(&mut moves, clock, || {
                add_kv_backward(cfg, qs, (held, src, cp), &mut dq, &mut mine)
            })?;
        }
        if step > 0 {
            timed(&mut clock.compute, || {
                mine.iter_mut().zip(&arriving).for_each(|(a, b)| *a += b)
            });
        }
        passing = mine;
        std::mem::swap(&mut cur, &mut nxt);
    }
    // The completed sum of rank `rank + 1`'s block goes home.
    ring.step(&mut [(&passing[..], &mut arriving[..])], clock, || ())?;
    Ok(CpGrads::with_kv(dq, arriving))
}

/// K/V gathered again; this rank's queries' dK/dV for the whole sequence
/// summed over the ranks by a reduce-scatter that leaves each rank its own.
fn gathered_backward<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    x: &CpInputs,
    fwd: &CpForward,
    clock: &mut CpClock,
) -> LayerResult<CpGrads> {
    let cp = comm.world();
    let kv = packed_kv(x);
    let all = blocking(clock, || all_gather_f32(comm, &kv))?;
    let (dq, dkv_all) = timed(&mut clock.compute, || {
        let dl = delta(cfg.head_dim, &x.dout, &fwd.out);
        let qs = queries(x, fwd, &dl);
        let mut dq = vec![0f32; x.q.len()];
        let mut dkv_all = vec![0f32; all.len()];
        for (src, (block, dkv)) in all
            .chunks_exact(kv.len())
            .zip(dkv_all.chunks_exact_mut(kv.len()))
            .enumerate()
        {
            add_kv_backward(cfg, qs, (block, src, cp), &mut dq, dkv);
        }
        (dq, dkv_all)
    });
    let dkv = blocking(clock, || reduce_scatter_f32(comm, &dkv_all))?;
    Ok(CpGrads::with_kv(dq, dkv))
}

/// Ulysses reversed: the output's gradient to every token of this rank's
/// heads, attention's backward there, and dQ/dK/dV back to this rank's
/// tokens of every head.
fn ulysses_backward<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    x: &CpInputs,
    fwd: &CpForward,
    clock: &mut CpClock,
) -> LayerResult<CpGrads> {
    let cp = comm.world();
    let Some(h) = &fwd.heads else {
        return Err(LayerError::Config(
            "the a2a backward needs an a2a forward's head shard".into(),
        ));
    };
    let dout = blocking(clock, || to_heads(comm, cfg, &[&x.dout]))?
        .pop()
        .unwrap_or_default();
    let shape = heads_of(cfg, cfg.heads / cp);
    let grads = timed(&mut clock.compute, || {
        let dl = delta(cfg.head_dim, &dout, &h.out);
        let qs = Queries {
            q: &h.q,
            pos: &h.pos,
            dout: &dout,
            lse: &fwd.lse,
            delta: &dl,
        };
        let [mut dq, mut dk, mut dv] = [0, 1, 2].map(|_| vec![0f32; h.q.len()]);
        add_block_backward(shape, qs, (&h.k, &h.v, &h.pos), &mut dq, (&mut dk, &mut dv));
        [dq, dk, dv]
    });
    let back = blocking(clock, || {
        to_tokens(comm, cfg, &[&grads[0], &grads[1], &grads[2]])
    })?;
    let [dq, dk, dv]: [Vec<f32>; 3] = back
        .try_into()
        .map_err(|_| LayerError::Config("the all-to-all returned another tensor count".into()))?;
    Ok(CpGrads { dq, dk, dv })
}
