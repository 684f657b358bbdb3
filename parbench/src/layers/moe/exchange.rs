//! The MoE block's all-to-alls: each rank sends a variable number of rows
//! to each other rank (dispatch, combine and their gradients), after the
//! per-expert row counts are exchanged.
//!
//! The rows travel in one [`Communicator::all_to_all_v`] (the library's:
//! a pairwise exchange on local and tcp, `MPI_Alltoallv`, grouped NCCL
//! sends and receives); the counts in one uniform all-to-all before it.
//! Each exchange is preceded by a barrier timed as waiting, so the
//! all-to-all's own time holds no skew between ranks.
//!
//! An exchange inside a group of the layer's ranks (an expert-parallel or
//! expert-tensor group) is one all-to-all-v over all of them whose blocks
//! to ranks outside the group are empty: no backend sends an empty block
//! (the pairwise exchange skips it, MPI and NCCL move nothing), so the
//! groups' exchanges run side by side on the wires their own would use,
//! on every backend and device, without a split communicator.

use super::super::block::PhaseClock;
use super::super::LayerResult;
use crate::comm::{CommBuffer, Communicator, DType, Io, VCounts};
use crate::compute::Compute;
use std::cell::Cell;
use std::time::Duration;

/// A group of the layer's ranks (an expert-tensor or an attention tensor
/// group) and the account its exchanges' communication time goes to.
#[derive(Clone, Copy)]
pub(super) struct Group<'a> {
    /// The members' ranks, in group order (this rank among them).
    pub(super) ranks: &'a [usize],
    /// Their exchanges' time, added up (it is in the clock's too).
    pub(super) spent: &'a Cell<Duration>,
}

impl Group<'_> {
    /// Members.
    pub(super) fn len(&self) -> usize {
        self.ranks.len()
    }

    /// Charges the communication `f` does on `clock` to the account too.
    fn counted<T>(
        &self,
        clock: &mut PhaseClock,
        f: impl FnOnce(&mut PhaseClock) -> LayerResult<T>,
    ) -> LayerResult<T> {
        let before = clock.comm();
        let out = f(clock)?;
        self.spent.set(self.spent.get() + (clock.comm() - before));
        Ok(out)
    }

    /// [`exchange_counts_in`] over the group, timed as communication.
    pub(super) fn exchange_counts<M: Communicator>(
        &self,
        comm: &mut M,
        clock: &mut PhaseClock,
        send: &[Vec<usize>],
    ) -> LayerResult<Vec<Vec<usize>>> {
        self.counted(clock, |clock| {
            let got = exchange_counts_in(comm, self.ranks, send)?;
            clock.end_comm(comm)?;
            Ok(got)
        })
    }

    /// Waits for every peer, then [`exchange_rows_in`] over the group:
    /// `send[i]` to member `i`, `recv_len[i]` elements from it.
    pub(super) fn exchange<C, M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        send: Vec<Vec<f32>>,
        recv_len: &[usize],
    ) -> LayerResult<Vec<Vec<f32>>>
    where
        C: Compute,
        M: Communicator<Buffer = C::Buf>,
    {
        wait_for_peers(dev, comm, clock)?;
        self.counted(clock, |clock| {
            exchange_rows_in(dev, comm, clock, self.ranks, send, recv_len)
        })
    }
}

/// The element-wise sum of `parts` (each `len` long) in their order: a
/// reduce-scatter's sum on the receiving rank.
pub(super) fn sum_parts(parts: &[Vec<f32>], len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    for part in parts {
        for (o, v) in out.iter_mut().zip(part) {
            *o += v;
        }
    }
    out
}

/// Waits for every rank (charged to waiting) before an exchange, after
/// ending the compute phase before it.
pub(super) fn wait_for_peers<C, M>(dev: &C, comm: &mut M, clock: &mut PhaseClock) -> LayerResult<()>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    clock.end_compute(dev)?;
    clock.wait_for_peers(comm)
}

/// Every rank's `send[peer]` counts (the same number per peer) received as
/// `out[peer]`: an all-to-all of f64 counts, exact below 2^53.
pub(super) fn exchange_counts<M: Communicator>(
    comm: &mut M,
    rank: usize,
    send: &[Vec<usize>],
) -> LayerResult<Vec<Vec<usize>>> {
    let p = send.len();
    if p <= 1 {
        return Ok(send.to_vec());
    }
    let per = send[0].len();
    let bytes: Vec<u8> = send
        .iter()
        .flat_map(|c| c.iter().map(|&v| v as f64))
        .flat_map(f64::to_ne_bytes)
        .collect();
    let mut send_buf = comm.alloc(bytes.len())?;
    send_buf.write_from_host(&bytes)?;
    let mut recv_buf = comm.alloc(bytes.len())?;
    if per > 0 {
        // Out of place: NCCL runs it as grouped sends and receives.
        let io = Io::OutOfPlace {
            send: &send_buf,
            recv: &mut recv_buf,
        };
        comm.all_to_all(io, per, DType::F64)?;
        comm.sync()?;
    }
    let mut out = vec![0u8; bytes.len()];
    recv_buf.read_to_host(&mut out)?;
    let vals: Vec<usize> = out
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap_or([0; 8])) as usize)
        .collect();
    let mut got: Vec<Vec<usize>> = vals.chunks(per.max(1)).map(<[usize]>::to_vec).collect();
    got.resize(p, vec![0; per]);
    got[rank] = send[rank].clone();
    Ok(got)
}

/// [`exchange_counts`] inside `group` (the layer's ranks, this one among
/// them): `send[i]` goes to `group[i]`, and the result is indexed the same.
pub(super) fn exchange_counts_in<M: Communicator>(
    comm: &mut M,
    group: &[usize],
    send: &[Vec<usize>],
) -> LayerResult<Vec<Vec<usize>>> {
    if group.len() <= 1 {
        return Ok(send.to_vec());
    }
    let per = send.first().map_or(0, Vec::len);
    let all = spread(comm.world(), group, send.to_vec(), vec![0; per]);
    let got = exchange_counts(comm, comm.rank(), &all)?;
    Ok(pick(group, got))
}

/// `items[i]` at `group[i]` of `world` places, `empty` elsewhere.
fn spread<T: Clone>(world: usize, group: &[usize], items: Vec<T>, empty: T) -> Vec<T> {
    let mut all = vec![empty; world];
    for (&r, item) in group.iter().zip(items) {
        all[r] = item;
    }
    all
}

/// The items at `group`'s places of `all`, in group order.
fn pick<T: Default>(group: &[usize], mut all: Vec<T>) -> Vec<T> {
    group.iter().map(|&r| std::mem::take(&mut all[r])).collect()
}

/// [`exchange_rows`] inside `group` (the layer's ranks, this one among
/// them): `send[i]` goes to `group[i]`, `recv_len[i]` elements come from
/// it; the blocks of the ranks outside are empty.
pub(super) fn exchange_rows_in<C, M>(
    dev: &C,
    comm: &mut M,
    clock: &mut PhaseClock,
    group: &[usize],
    send: Vec<Vec<f32>>,
    recv_len: &[usize],
) -> LayerResult<Vec<Vec<f32>>>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    if group.len() <= 1 {
        return Ok(send);
    }
    let world = comm.world();
    let all = spread(world, group, send, Vec::new());
    let lens = spread(world, group, recv_len.to_vec(), 0);
    let got = exchange_rows(dev, comm, clock, &all, &lens)?;
    Ok(pick(group, got))
}

/// Sends `send[peer]` (host rows, f32) to each peer and returns what each
/// peer sent here, `recv_len[peer]` elements from each: one
/// [`Communicator::all_to_all_v`] of the rows in the device's storage type,
/// packed in rank order in buffers of the block's device. The transfer is
/// charged to communication on `clock`; packing the rows into and out of
/// the device buffers to compute.
pub(super) fn exchange_rows<C, M>(
    dev: &C,
    comm: &mut M,
    clock: &mut PhaseClock,
    send: &[Vec<f32>],
    recv_len: &[usize],
) -> LayerResult<Vec<Vec<f32>>>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    if send.len() <= 1 {
        return Ok(send.to_vec());
    }
    let counts = VCounts::new(send.iter().map(Vec::len).collect(), recv_len.to_vec())?;
    let mut send_buf = dev.alloc(counts.send_total())?;
    dev.upload(&send.concat(), &mut send_buf)?;
    let mut recv_buf = dev.alloc(counts.recv_total())?;
    clock.end_compute(dev)?;
    comm.all_to_all_v(&send_buf, &mut recv_buf, &counts, dev.dtype())?;
    clock.end_comm(comm)?;
    let mut all = vec![0f32; counts.recv_total()];
    dev.download(&recv_buf, &mut all)?;
    Ok((0..recv_len.len())
        .map(|i| all[counts.recv_range(i)].to_vec())
        .collect())
}
