//! The MoE block's all-to-alls: each rank sends a variable number of rows
//! to each other rank (dispatch, combine and their gradients), after the
//! per-expert row counts are exchanged.
//!
//! The rows travel in one [`Communicator::all_to_all_v`] (the library's:
//! a pairwise exchange on local and tcp, `MPI_Alltoallv`, grouped NCCL
//! sends and receives); the counts in one uniform all-to-all before it.
//! Each exchange is preceded by a barrier timed as waiting, so the
//! all-to-all's own time holds no skew between ranks.

use super::super::block::PhaseClock;
use super::super::LayerResult;
use crate::comm::{CommBuffer, Communicator, DType, Io, VCounts};
use crate::compute::Compute;

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
