//! One rank's context-parallel attention forward, by each method, with the
//! time of its attention, its transfers and its waiting for them apart.

use super::attend::{Heads, Partial};
use super::{positions, CpComm, CpConfig};
use crate::comm::{CommBuffer, Communicator, DType, DupComm, HostBuffer, Io};
use crate::layers::{LayerError, LayerResult};
use std::time::{Duration, Instant};

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

/// This rank's Q, K and V (`[batch][local tokens][heads][head width]`)
/// and the global positions of its tokens.
#[derive(Clone, Debug)]
pub struct CpInputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub pos: Vec<usize>,
}

impl CpInputs {
    /// Rank `rank` of `cp`'s tokens of the tensors seeded by `seed`.
    pub fn seeded(cfg: &CpConfig, cp: usize, rank: usize, seed: u64) -> Self {
        use super::{seeded, Qkv};
        let pos = positions(cfg.seq, cp, rank);
        CpInputs {
            q: seeded(seed, Qkv::Q, cfg, &pos),
            k: seeded(seed, Qkv::K, cfg, &pos),
            v: seeded(seed, Qkv::V, cfg, &pos),
            pos,
        }
    }
}

fn heads_of(cfg: &CpConfig, heads: usize) -> Heads {
    Heads {
        batch: cfg.batch,
        heads,
        head_dim: cfg.head_dim,
    }
}

/// Runs `f`, adding its time to `to`.
fn timed<R>(to: &mut Duration, f: impl FnOnce() -> R) -> R {
    let t0 = Instant::now();
    let r = f();
    *to += t0.elapsed();
    r
}

/// This rank's attention output (`[batch][local tokens][heads][head
/// width]`) by `cfg.method`. Collective: every rank of `comm` calls it.
/// `dup` is a second communicator over the same ranks for the ring's
/// transfers to run on a thread beside the attention; without one the ring
/// issues each transfer before its step's attention and waits after it (a
/// device backend runs it meanwhile, a blocking host one does not).
pub fn cp_forward<M: Communicator>(
    comm: &mut M,
    dup: Option<&mut DupComm>,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<Vec<f32>> {
    let cp = comm.world();
    cfg.validate(cp)?;
    let shape = heads_of(cfg, cfg.heads);
    if cp == 1 {
        let mut part = Partial::new(shape, x.pos.len());
        timed(&mut clock.compute, || {
            part.add_block(shape, (&x.q, &x.pos), (&x.k, &x.v, &x.pos))
        });
        return Ok(part.finish(cfg.head_dim));
    }
    match cfg.method {
        CpComm::P2p => match dup {
            Some(dup) => ring_on_thread(dup, cfg, x, clock),
            None => ring_in_line(comm, cfg, x, clock),
        },
        CpComm::AllGather => gathered(comm, cfg, x, clock),
        CpComm::A2a => ulysses(comm, cfg, x, clock),
    }
}

/// `[k | v]`, the block a ring step or the gather moves.
fn packed_kv(x: &CpInputs) -> Vec<f32> {
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

/// Rank `rank` of a ring of `cp` before its first step: the next and the
/// previous rank, nothing attended yet, and its own K/V to start with.
fn ring_start(
    cp: usize,
    rank: usize,
    cfg: &CpConfig,
    x: &CpInputs,
) -> (usize, usize, Partial, Vec<f32>) {
    let part = Partial::new(heads_of(cfg, cfg.heads), x.pos.len());
    ((rank + 1) % cp, (rank + cp - 1) % cp, part, packed_kv(x))
}

/// The ring with each transfer on a thread of its own over `dup`: at step
/// `s` this rank attends to the K/V of rank `rank - s` while sending it to
/// `rank + 1` and receiving rank `rank - s - 1`'s from `rank - 1`.
fn ring_on_thread(
    dup: &mut DupComm,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<Vec<f32>> {
    let (cp, rank) = (dup.world(), dup.rank());
    let (next, prev, mut part, mut cur) = ring_start(cp, rank, cfg, x);
    let mut nxt = vec![0f32; cur.len()];
    for step in 0..cp {
        let src = (rank + cp - step) % cp;
        let last = step + 1 == cp;
        let moved = std::thread::scope(|s| -> LayerResult<()> {
            let (send, recv) = (&cur, &mut nxt);
            let dup = &mut *dup;
            let transfer = (!last).then(|| {
                s.spawn(move || {
                    let t0 = Instant::now();
                    let r = exchange(dup, send, next, recv, prev);
                    (r, t0.elapsed())
                })
            });
            timed(&mut clock.compute, || {
                add_kv(&mut part, cfg, x, send, src, cp)
            });
            if let Some(t) = transfer {
                let (r, took) = timed(&mut clock.wait, || t.join()).map_err(|_| {
                    LayerError::Config("the ring's transfer thread panicked".into())
                })?;
                clock.comm += took;
                r?;
            }
            Ok(())
        });
        moved?;
        std::mem::swap(&mut cur, &mut nxt);
    }
    Ok(part.finish(cfg.head_dim))
}

/// One ring transfer on host buffers: `send` to `to`, `recv` from `from`.
fn exchange(
    dup: &mut DupComm,
    send: &[f32],
    to: usize,
    recv: &mut [f32],
    from: usize,
) -> LayerResult<()> {
    let out = HostBuffer::from_slice(send);
    let mut inb = HostBuffer::zeroed(std::mem::size_of_val(recv));
    dup.send_recv(&out, to, &mut inb, from, send.len(), DType::F32)?;
    inb.read_to_host(bytemuck::cast_slice_mut(recv))?;
    Ok(())
}

/// `values` in a buffer of `comm`'s.
fn upload<M: Communicator>(comm: &M, values: &[f32], len: usize) -> LayerResult<M::Buffer> {
    let mut b = comm.alloc(len * 4)?;
    if !values.is_empty() {
        b.write_from_host(bytemuck::cast_slice(values))?;
    }
    Ok(b)
}

/// `buf`'s first `out.len()` values.
fn download<B: CommBuffer>(buf: &B, out: &mut [f32]) -> LayerResult<()> {
    buf.read_to_host(bytemuck::cast_slice_mut(out))?;
    Ok(())
}

/// The ring on `comm` alone: each step's transfer issued before its
/// attention and waited for after it.
fn ring_in_line<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<Vec<f32>> {
    let (cp, rank) = (comm.world(), comm.rank());
    let (next, prev, mut part, mut cur) = ring_start(cp, rank, cfg, x);
    let n = cur.len();
    for step in 0..cp {
        let src = (rank + cp - step) % cp;
        let mut recv = None;
        let mut spent = Duration::ZERO;
        if step + 1 < cp {
            recv = Some(timed(&mut spent, || -> LayerResult<M::Buffer> {
                let send = upload(comm, &cur, n)?;
                let mut r = comm.alloc(n * 4)?;
                comm.send_recv(&send, next, &mut r, prev, n, DType::F32)?;
                Ok(r)
            })?);
        }
        timed(&mut clock.compute, || {
            add_kv(&mut part, cfg, x, &cur, src, cp)
        });
        if let Some(r) = recv {
            timed(&mut spent, || -> LayerResult<()> {
                comm.sync()?;
                download(&r, &mut cur)
            })?;
        }
        clock.comm += spent;
        clock.wait += spent;
    }
    Ok(part.finish(cfg.head_dim))
}

/// All-gather of every rank's K/V, then attention over the whole sequence.
fn gathered<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<Vec<f32>> {
    let cp = comm.world();
    let kv = packed_kv(x);
    let n = kv.len();
    let mut spent = Duration::ZERO;
    let all = timed(&mut spent, || all_gather_f32(comm, &kv))?;
    clock.comm += spent;
    clock.wait += spent;
    let mut part = Partial::new(heads_of(cfg, cfg.heads), x.pos.len());
    timed(&mut clock.compute, || {
        for (src, block) in all.chunks_exact(n).enumerate() {
            add_kv(&mut part, cfg, x, block, src, cp);
        }
    });
    Ok(part.finish(cfg.head_dim))
}

/// Every rank's `values` (the same length on each), in rank order.
pub(super) fn all_gather_f32<M: Communicator>(
    comm: &mut M,
    values: &[f32],
) -> LayerResult<Vec<f32>> {
    let (n, cp) = (values.len(), comm.world());
    let mut all = vec![0f32; n * cp];
    let send = upload(comm, values, n)?;
    let mut recv = comm.alloc(n * cp * 4)?;
    comm.all_gather(
        Io::OutOfPlace {
            send: &send,
            recv: &mut recv,
        },
        n,
        DType::F32,
    )?;
    comm.sync()?;
    download(&recv, &mut all)?;
    Ok(all)
}

/// One all-to-all of `send` (`world` blocks of `block` values, block j to
/// rank j) into the returned values (block i from rank i).
fn all_to_all<M: Communicator>(comm: &mut M, send: &[f32], block: usize) -> LayerResult<Vec<f32>> {
    let total = block * comm.world();
    let s = upload(comm, send, total)?;
    let mut r = comm.alloc(total * 4)?;
    comm.all_to_all(
        Io::OutOfPlace {
            send: &s,
            recv: &mut r,
        },
        block,
        DType::F32,
    )?;
    comm.sync()?;
    let mut out = vec![0f32; total];
    download(&r, &mut out)?;
    Ok(out)
}

/// DeepSpeed-Ulysses: Q, K and V all-to-all from this rank's tokens of
/// every head to every token of its `heads / C` heads, attention, and the
/// output all-to-all back.
fn ulysses<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    x: &CpInputs,
    clock: &mut CpClock,
) -> LayerResult<Vec<f32>> {
    let cp = comm.world();
    let (d, b_n, ls) = (cfg.head_dim, cfg.batch, x.pos.len());
    let hc = cfg.heads / cp;
    // One token's heads of rank j: columns [j hc d, (j + 1) hc d).
    let slice = hc * d;
    let per_tensor = b_n * ls * slice;
    let mut spent = Duration::ZERO;
    // Block j: [q | k | v], each [batch][local tokens][hc][d] of rank j's heads.
    let recv = timed(&mut spent, || {
        let mut send = Vec::with_capacity(3 * per_tensor * cp);
        for j in 0..cp {
            for t in [&x.q, &x.k, &x.v] {
                for row in t.chunks_exact(cfg.width()) {
                    send.extend_from_slice(&row[j * slice..(j + 1) * slice]);
                }
            }
        }
        all_to_all(comm, &send, 3 * per_tensor)
    })?;
    // Every token of every rank, for this rank's heads: [batch][rank i's tokens, i = 0..C][hc][d].
    let mut whole = [Vec::new(), Vec::new(), Vec::new()];
    let mut pos = Vec::with_capacity(cfg.seq);
    for i in 0..cp {
        pos.extend(positions(cfg.seq, cp, i));
    }
    let outputs = timed(&mut clock.compute, || {
        for (w, t) in whole.iter_mut().enumerate() {
            t.reserve(per_tensor * cp);
            for b in 0..b_n {
                for i in 0..cp {
                    let at = (i * 3 + w) * per_tensor + b * ls * slice;
                    t.extend_from_slice(&recv[at..at + ls * slice]);
                }
            }
        }
        let shape = heads_of(cfg, hc);
        let mut part = Partial::new(shape, pos.len());
        part.add_block(shape, (&whole[0], &pos), (&whole[1], &whole[2], &pos));
        part.finish(d)
    });
    // Back: block i is rank i's tokens of this rank's heads.
    let back = timed(&mut spent, || {
        let mut send = Vec::with_capacity(per_tensor * cp);
        for i in 0..cp {
            for b in 0..b_n {
                let at = (b * cp + i) * ls * slice;
                send.extend_from_slice(&outputs[at..at + ls * slice]);
            }
        }
        all_to_all(comm, &send, per_tensor)
    })?;
    clock.comm += spent;
    clock.wait += spent;
    // Block j holds heads of rank j for this rank's tokens.
    let mut out = vec![0f32; b_n * ls * cfg.width()];
    for j in 0..cp {
        let block = &back[j * per_tensor..(j + 1) * per_tensor];
        for (row, piece) in block.chunks_exact(slice).enumerate() {
            let at = row * cfg.width() + j * slice;
            out[at..at + slice].copy_from_slice(piece);
        }
    }
    Ok(out)
}
