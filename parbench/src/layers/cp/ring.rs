//! The transfers every method is built from, on the communicator's own
//! buffers, with their time kept apart from the attention's: a step of
//! the ring overlapped with compute, an all-gather, a reduce-scatter and
//! an all-to-all of f32 values.

use super::forward::CpClock;
use crate::comm::{CommBuffer, Communicator, DType, HostBuffer, Io, ReduceOp};
use crate::layers::{LayerError, LayerResult};
use std::time::{Duration, Instant};

/// Runs `f`, adding its time to `to`.
pub(super) fn timed<R>(to: &mut Duration, f: impl FnOnce() -> R) -> R {
    let t0 = Instant::now();
    let r = f();
    *to += t0.elapsed();
    r
}

/// Runs a transfer the attention waits for: its time is both
/// communication and waiting.
pub(super) fn blocking<R>(clock: &mut CpClock, f: impl FnOnce() -> R) -> R {
    let mut spent = Duration::ZERO;
    let r = timed(&mut spent, f);
    clock.comm += spent;
    clock.wait += spent;
    r
}

/// One ring transfer: this rank's `send` goes to the next rank while
/// `recv` fills from the previous one.
pub(super) type Move<'a> = (&'a [f32], &'a mut [f32]);

/// How the ring's transfers run: on a thread of their own over a second
/// communicator beside the attention, or issued on the communicator
/// before the attention and waited for after it (a device backend runs
/// them meanwhile, a blocking host one does not).
pub(super) enum Ring<'a, M, D> {
    Thread(&'a mut D),
    InLine(&'a mut M),
}

impl<M, D> Ring<'_, M, D>
where
    M: Communicator,
    D: Communicator<Buffer = HostBuffer>,
{
    /// (ranks, this rank) of the ring.
    pub(super) fn place(&self) -> (usize, usize) {
        match self {
            Ring::Thread(d) => (d.world(), d.rank()),
            Ring::InLine(m) => (m.world(), m.rank()),
        }
    }

    /// One step: `moves`, in order, while `compute` runs.
    pub(super) fn step<R>(
        &mut self,
        moves: &mut [Move<'_>],
        clock: &mut CpClock,
        compute: impl FnOnce() -> R,
    ) -> LayerResult<R> {
        let (world, rank) = self.place();
        let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
        if moves.is_empty() {
            return Ok(timed(&mut clock.compute, compute));
        }
        match self {
            Ring::Thread(dup) => std::thread::scope(|s| {
                let dup = &mut **dup;
                let transfer = s.spawn(move || {
                    let t0 = Instant::now();
                    let r = moves
                        .iter_mut()
                        .try_for_each(|(send, recv)| exchange(dup, send, next, recv, prev));
                    (r, t0.elapsed())
                });
                let out = timed(&mut clock.compute, compute);
                let (r, took) = timed(&mut clock.wait, || transfer.join()).map_err(|_| {
                    LayerError::Config("the ring's transfer thread panicked".into())
                })?;
                clock.comm += took;
                r.map(|()| out)
            }),
            Ring::InLine(comm) => {
                let mut spent = Duration::ZERO;
                // Both buffers of each transfer live until the sync: a
                // device backend may still be reading the send buffer.
                let bufs = timed(
                    &mut spent,
                    || -> LayerResult<Vec<(M::Buffer, M::Buffer)>> {
                        let mut bufs = Vec::with_capacity(moves.len());
                        for (send, recv) in moves.iter() {
                            let out = upload(*comm, send)?;
                            let mut r = comm.alloc(recv.len() * 4)?;
                            comm.send_recv(&out, next, &mut r, prev, send.len(), DType::F32)?;
                            bufs.push((out, r));
                        }
                        Ok(bufs)
                    },
                )?;
                let out = timed(&mut clock.compute, compute);
                timed(&mut spent, || -> LayerResult<()> {
                    comm.sync()?;
                    for ((_, recv), (_, r)) in moves.iter_mut().zip(&bufs) {
                        download(r, recv)?;
                    }
                    Ok(())
                })?;
                clock.comm += spent;
                clock.wait += spent;
                Ok(out)
            }
        }
    }
}

/// One ring transfer on host buffers: `send` to `to`, `recv` from `from`.
fn exchange<D: Communicator<Buffer = HostBuffer>>(
    dup: &mut D,
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
fn upload<M: Communicator>(comm: &M, values: &[f32]) -> LayerResult<M::Buffer> {
    let mut b = comm.alloc(values.len() * 4)?;
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

/// Every rank's `values` (the same length on each), in rank order.
pub(crate) fn all_gather_f32<M: Communicator>(
    comm: &mut M,
    values: &[f32],
) -> LayerResult<Vec<f32>> {
    let (n, world) = (values.len(), comm.world());
    let mut all = vec![0f32; n * world];
    let send = upload(comm, values)?;
    let mut recv = comm.alloc(n * world * 4)?;
    let io = Io::OutOfPlace {
        send: &send,
        recv: &mut recv,
    };
    comm.all_gather(io, n, DType::F32)?;
    comm.sync()?;
    download(&recv, &mut all)?;
    Ok(all)
}

/// The sum over the ranks of `values` (`world` blocks), block `rank` of it.
pub(super) fn reduce_scatter_f32<M: Communicator>(
    comm: &mut M,
    values: &[f32],
) -> LayerResult<Vec<f32>> {
    let n = values.len() / comm.world().max(1);
    let send = upload(comm, values)?;
    let mut recv = comm.alloc(n * 4)?;
    let io = Io::OutOfPlace {
        send: &send,
        recv: &mut recv,
    };
    comm.reduce_scatter(io, n, DType::F32, ReduceOp::Sum)?;
    comm.sync()?;
    let mut mine = vec![0f32; n];
    download(&recv, &mut mine)?;
    Ok(mine)
}

/// One all-to-all of `send` (`world` blocks, block j to rank j) into the
/// returned values (block i from rank i).
pub(super) fn all_to_all_f32<M: Communicator>(comm: &mut M, send: &[f32]) -> LayerResult<Vec<f32>> {
    let block = send.len() / comm.world().max(1);
    let s = upload(comm, send)?;
    let mut r = comm.alloc(send.len() * 4)?;
    let io = Io::OutOfPlace {
        send: &s,
        recv: &mut r,
    };
    comm.all_to_all(io, block, DType::F32)?;
    comm.sync()?;
    let mut out = vec![0f32; send.len()];
    download(&r, &mut out)?;
    Ok(out)
}
