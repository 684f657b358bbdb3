//! One rank's context-parallel attention forward, by each method, with the
//! time of its attention, its transfers and its waiting for them apart,
//! and what its backward reads.

use super::attend::{Heads, Partial};
use super::ring::{all_gather_f32, all_to_all_f32, blocking, timed, Ring};
use super::{positions, CpComm, CpConfig};
use crate::comm::{Communicator, HostBuffer};
use crate::layers::LayerResult;
use std::time::Duration;

/// Where one call's wall time went on this rank.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpClock {
    /// Attention arithmetic.
    pub compute: Duration,
    /// The transfers themselves, from their start to their end, whether or
    /// not attention ran meanwhile (the ring's run beside it).
    pub comm: Duration,
    /// Time the attention stood still for communication: all of it for the
    /// gather and the all-to-alls, what the ring did not hide behind compute.
    pub wait: Duration,
}

/// This rank's Q, K, V and (in training) the output's gradient, each
/// `[batch][local tokens][heads][head width]`, and the global positions
/// of its tokens.
#[derive(Clone, Debug)]
pub struct CpInputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Empty in a forward-only run.
    pub dout: Vec<f32>,
    pub pos: Vec<usize>,
}

impl CpInputs {
    /// Rank `rank` of `cp`'s tokens of the tensors seeded by `seed`, for
    /// the heads `heads` of `cfg` (all of them without tensor parallelism);
    /// the output's gradient too if `train`.
    pub fn seeded(
        cfg: &CpConfig,
        (cp, rank): (usize, usize),
        heads: std::ops::Range<usize>,
        seed: u64,
        train: bool,
    ) -> Self {
        use super::{seeded, Qkv};
        let pos = positions(cfg.seq, cp, rank);
        let of = |t| seeded(seed, t, cfg, &pos, heads.clone());
        CpInputs {
            q: of(Qkv::Q),
            k: of(Qkv::K),
            v: of(Qkv::V),
            dout: if train { of(Qkv::DOut) } else { Vec::new() },
            pos,
        }
    }
}

/// What a forward leaves for its backward.
#[derive(Clone, Debug)]
pub struct CpForward {
    /// This rank's output, `[batch][local tokens][heads][head width]`.
    pub out: Vec<f32>,
    /// Each row's log-sum-exp of the attention this rank ran: its own
    /// tokens' rows, or (Ulysses) every token's rows of its heads.
    pub(super) lse: Vec<f32>,
    /// Ulysses: every token of this rank's heads, as its attention saw them.
    pub(super) heads: Option<HeadShard>,
}

/// Every token of a rank's `heads / C` heads after Ulysses' all-to-all:
/// Q, K, V and the output, `[batch][rank i's tokens, i = 0..C][hc][d]`,
/// and the tokens' positions.
#[derive(Clone, Debug)]
pub(super) struct HeadShard {
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) out: Vec<f32>,
    pub(super) pos: Vec<usize>,
}

pub(super) fn heads_of(cfg: &CpConfig, heads: usize) -> Heads {
    Heads {
        batch: cfg.batch,
        heads,
        head_dim: cfg.head_dim,
        causal: cfg.causal,
    }
}

/// This rank's attention by `cfg.method`, over `comm`'s ranks.
/// Collective: every rank of `comm` calls it. `dup` is a second
/// communicator over the same ranks for the ring's transfers to run on a
/// thread beside the attention ([`Ring`]).
pub fn cp_forward<M, D>(
    comm: &mut M,
    dup: Option<&mut D>,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<CpForward>
where
    M: Communicator,
    D: Communicator<Buffer = HostBuffer>,
{
    let cp = comm.world();
    cfg.validate(cp)?;
    let shape = heads_of(cfg, cfg.heads);
    if cp == 1 {
        let mut part = Partial::new(shape, x.pos.len());
        timed(&mut clock.compute, || {
            part.add_block(shape, (&x.q, &x.pos), (&x.k, &x.v, &x.pos))
        });
        return Ok(finished(part, cfg));
    }
    match cfg.method {
        CpComm::P2p => {
            let ring = match dup {
                Some(d) => Ring::Thread(d),
                None => Ring::InLine(comm),
            };
            ring_forward(ring, cfg, x, clock)
        }
        CpComm::AllGather => gathered(comm, cfg, x, clock),
        CpComm::A2a => ulysses(comm, cfg, x, clock),
    }
}

fn finished(part: Partial, cfg: &CpConfig) -> CpForward {
    let (out, lse) = part.finish_with_lse(cfg.head_dim);
    CpForward {
        out,
        lse,
        heads: None,
    }
}

/// `[k | v]`, the block a ring step or the gather moves.
pub(super) fn packed_kv(x: &CpInputs) -> Vec<f32> {
    let mut kv = Vec::with_capacity(2 * x.k.len());
    kv.extend_from_slice(&x.k);
    kv.extend_from_slice(&x.v);
    kv
}

/// Adds the packed `[k | v]` block of rank `src` to `part`.
fn add_kv(part: &mut Partial, cfg: &CpConfig, x: &CpInputs, kv: &[f32], src: usize, cp: usize) {
    let (k, v) = kv.split_at(kv.len() / 2);
    let pos = positions(cfg.seq, cp, src);
    part.add_block(heads_of(cfg, cfg.heads), (&x.q, &x.pos), (k, v, &pos));
}

/// The ring: at step `s` this rank attends to the K/V of rank `rank - s`
/// while sending it on to `rank + 1` and receiving rank `rank - s - 1`'s
/// from `rank - 1`; C - 1 transfers, each behind a step's attention.
fn ring_forward<M, D>(
    mut ring: Ring<'_, M, D>,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<CpForward>
where
    M: Communicator,
    D: Communicator<Buffer = HostBuffer>,
{
    let (cp, rank) = ring.place();
    let mut part = Partial::new(heads_of(cfg, cfg.heads), x.pos.len());
    let mut cur = packed_kv(x);
    let mut nxt = vec![0f32; cur.len()];
    for step in 0..cp {
        let src = (rank + cp - step) % cp;
        {
            let mut moves = Vec::with_capacity(1);
            if step + 1 < cp {
                moves.push((&cur[..], &mut nxt[..]));
            }
            let held = &cur;
            ring.step(&mut moves, clock, || {
                add_kv(&mut part, cfg, x, held, src, cp)
            })?;
        }
        std::mem::swap(&mut cur, &mut nxt);
    }
    Ok(finished(part, cfg))
}

/// All-gather of every rank's K/V, then attention over the whole sequence.
fn gathered<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<CpForward> {
    let cp = comm.world();
    let kv = packed_kv(x);
    let all = blocking(clock, || all_gather_f32(comm, &kv))?;
    let mut part = Partial::new(heads_of(cfg, cfg.heads), x.pos.len());
    timed(&mut clock.compute, || {
        for (src, block) in all.chunks_exact(kv.len()).enumerate() {
            add_kv(&mut part, cfg, x, block, src, cp);
        }
    });
    Ok(finished(part, cfg))
}

/// Ulysses' first all-to-all: `tensors` (each this rank's tokens of every
/// head) to every token of this rank's `heads / C` heads, each
/// `[batch][rank i's tokens, i = 0..C][hc][d]`.
pub(super) fn to_heads<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    tensors: &[&[f32]],
) -> LayerResult<Vec<Vec<f32>>> {
    let cp = comm.world();
    let (ls, slice) = (cfg.local_seq(cp), cfg.width() / cp);
    let per = cfg.batch * ls * slice;
    // Block j: each tensor's columns of rank j's heads.
    let mut send = Vec::with_capacity(tensors.len() * per * cp);
    for j in 0..cp {
        for t in tensors {
            for row in t.chunks_exact(cfg.width()) {
                send.extend_from_slice(&row[j * slice..(j + 1) * slice]);
            }
        }
    }
    let recv = all_to_all_f32(comm, &send)?;
    // Block i: each tensor's [batch][rank i's tokens][hc][d].
    Ok((0..tensors.len())
        .map(|w| {
            let mut t = Vec::with_capacity(per * cp);
            for b in 0..cfg.batch {
                for i in 0..cp {
                    let at = (i * tensors.len() + w) * per + b * ls * slice;
                    t.extend_from_slice(&recv[at..at + ls * slice]);
                }
            }
            t
        })
        .collect())
}

/// Ulysses' second all-to-all, the first's reverse: `tensors` (each every
/// token of this rank's heads) back to this rank's tokens of every head.
pub(super) fn to_tokens<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    tensors: &[&[f32]],
) -> LayerResult<Vec<Vec<f32>>> {
    let cp = comm.world();
    let (ls, slice) = (cfg.local_seq(cp), cfg.width() / cp);
    let per = cfg.batch * ls * slice;
    // Block i: each tensor's rows of rank i's tokens.
    let mut send = Vec::with_capacity(tensors.len() * per * cp);
    for i in 0..cp {
        for t in tensors {
            for b in 0..cfg.batch {
                let at = (b * cp + i) * ls * slice;
                send.extend_from_slice(&t[at..at + ls * slice]);
            }
        }
    }
    let back = all_to_all_f32(comm, &send)?;
    // Block j: each tensor's rank-j heads of this rank's tokens.
    Ok((0..tensors.len())
        .map(|w| {
            let mut out = vec![0f32; per * cp];
            for j in 0..cp {
                let block = &back[(j * tensors.len() + w) * per..][..per];
                for (row, piece) in block.chunks_exact(slice).enumerate() {
                    let at = row * cfg.width() + j * slice;
                    out[at..at + slice].copy_from_slice(piece);
                }
            }
            out
        })
        .collect())
}

/// The positions of every token in Ulysses' head-sharded layout.
pub(super) fn every_rank_positions(cfg: &CpConfig, cp: usize) -> Vec<usize> {
    (0..cp).flat_map(|i| positions(cfg.seq, cp, i)).collect()
}

/// DeepSpeed-Ulysses: Q, K and V all-to-all from this rank's tokens of
/// every head to every token of its `heads / C` heads, attention, and the
/// output all-to-all back.
fn ulysses<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<CpForward> {
    let cp = comm.world();
    let whole = blocking(clock, || to_heads(comm, cfg, &[&x.q, &x.k, &x.v]))?;
    let [q, k, v]: [Vec<f32>; 3] = whole.try_into().map_err(|_| {
        crate::layers::LayerError::Config("the all-to-all returned another tensor count".into())
    })?;
    let pos = every_rank_positions(cfg, cp);
    let shape = heads_of(cfg, cfg.heads / cp);
    let (out_h, lse) = timed(&mut clock.compute, || {
        let mut part = Partial::new(shape, pos.len());
        part.add_block(shape, (&q, &pos), (&k, &v, &pos));
        part.finish_with_lse(cfg.head_dim)
    });
    let out = blocking(clock, || to_tokens(comm, cfg, &[&out_h]))?
        .pop()
        .unwrap_or_default();
    Ok(CpForward {
        out,
        lse,
        heads: Some(HeadShard {
            q,
            k,
            v,
            out: out_h,
            pos,
        }),
    })
}
