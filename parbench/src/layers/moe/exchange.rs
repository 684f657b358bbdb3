//! The MoE block's all-to-alls: each rank sends a variable number of rows
//! to each other rank (dispatch, combine and their gradients), after the
//! per-expert row counts are exchanged.
//!
//! Written over the communicator's point-to-point calls as a pairwise
//! exchange, so it runs on every backend: in each round every rank meets
//! one partner (a round-robin tournament's pairing, `p - 1` rounds for even
//! `p`), and the two send to each other at once, which the communicator's
//! send never deadlocks on; a rank's rows for itself never leave it.
//! Each exchange is preceded by a barrier timed as waiting, so the
//! all-to-all's own time holds no skew between ranks.

use super::super::block::PhaseClock;
use super::super::LayerResult;
use crate::comm::{CommBuffer, Communicator, DType, Io};
use crate::compute::Compute;

/// Waits for every rank (charged to waiting) before an exchange, after
/// ending the compute phase before it.
pub(super) fn wait_for_peers<C, M>(dev: &C, comm: &mut M, clock: &mut PhaseClock) -> LayerResult<()>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    clock.end_compute(dev)?;
    comm.barrier()?;
    clock.end_wait(comm)
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
    let mut buf = comm.alloc(bytes.len())?;
    buf.write_from_host(&bytes)?;
    if per > 0 {
        comm.all_to_all(Io::InPlace(&mut buf), per, DType::F64)?;
        comm.sync()?;
    }
    let mut out = vec![0u8; bytes.len()];
    buf.read_to_host(&mut out)?;
    let vals: Vec<usize> = out
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap_or([0; 8])) as usize)
        .collect();
    let mut got: Vec<Vec<usize>> = vals.chunks(per.max(1)).map(<[usize]>::to_vec).collect();
    got.resize(p, vec![0; per]);
    // Our own counts never travel (in place, block `rank` is ours already).
    got[rank] = send[rank].clone();
    Ok(got)
}

/// Sends `send[peer]` (host rows, f32) to each peer and returns what each
/// peer sent here, `recv_len[peer]` elements from each: the rows travel in
/// the device's storage type, in buffers of the block's device. The
/// transfers are charged to communication on `clock`; staging the rows
/// into and out of device buffers to compute.
pub(super) fn exchange_rows<C, M>(
    dev: &C,
    comm: &mut M,
    clock: &mut PhaseClock,
    rank: usize,
    send: &[Vec<f32>],
    recv_len: &[usize],
) -> LayerResult<Vec<Vec<f32>>>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let p = send.len();
    let mut out: Vec<Vec<f32>> = recv_len.iter().map(|&n| vec![0f32; n]).collect();
    if let (Some(mine), Some(o)) = (send.get(rank), out.get_mut(rank)) {
        let n = mine.len().min(o.len());
        o[..n].copy_from_slice(&mine[..n]);
    }
    if p <= 1 {
        return Ok(out);
    }
    let mut sends = Vec::with_capacity(p);
    let mut recvs = Vec::with_capacity(p);
    for peer in 0..p {
        let rows = send.get(peer).filter(|_| peer != rank);
        let mut b = dev.alloc(rows.map_or(0, Vec::len))?;
        if let Some(r) = rows {
            dev.upload(r, &mut b)?;
        }
        sends.push(b);
        let n = if peer == rank { 0 } else { recv_len[peer] };
        recvs.push(dev.alloc(n)?);
    }
    let dtype = dev.dtype();
    clock.end_compute(dev)?;
    for round in 0..rounds(p) {
        let Some(peer) = partner(p, round, rank) else {
            continue;
        };
        let count = send[peer].len();
        if count > 0 {
            comm.send(&sends[peer], count, dtype, peer)?;
        }
        if recv_len[peer] > 0 {
            comm.recv(&mut recvs[peer], recv_len[peer], dtype, peer)?;
        }
    }
    clock.end_comm(comm)?;
    for peer in (0..p).filter(|&q| q != rank && recv_len[q] > 0) {
        dev.download(&recvs[peer], &mut out[peer])?;
    }
    Ok(out)
}

/// Rounds of the round-robin pairing of `p` ranks: `p - 1`, or `p` when
/// `p` is odd (one rank sits each round out).
fn rounds(p: usize) -> usize {
    if p.is_multiple_of(2) {
        p.saturating_sub(1)
    } else {
        p
    }
}

/// Rank `rank`'s partner in round `round` of the circle method's pairing
/// of `p` ranks (with a phantom rank `p` when `p` is odd): the last player
/// meets `round`, and the others pair so that their indices sum to
/// `2 round` modulo `n - 1`. `None`: no partner this round.
fn partner(p: usize, round: usize, rank: usize) -> Option<usize> {
    let n = if p.is_multiple_of(2) { p } else { p + 1 };
    if n < 2 {
        return None;
    }
    let other = if rank == n - 1 {
        round
    } else if rank == round {
        n - 1
    } else {
        (2 * round + (n - 1) - rank % (n - 1)) % (n - 1)
    };
    (other < p && other != rank).then_some(other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_meets_once_and_partners_agree() {
        for p in 1..=9 {
            let mut met = vec![vec![0; p]; p];
            for round in 0..rounds(p) {
                for r in 0..p {
                    if let Some(q) = partner(p, round, r) {
                        assert_eq!(partner(p, round, q), Some(r), "p {p} round {round}");
                        met[r][q] += 1;
                    }
                }
            }
            for (r, row) in met.iter().enumerate() {
                for (q, &m) in row.iter().enumerate() {
                    assert_eq!(m, usize::from(r != q), "p {p}: {r} met {q} {m} times");
                }
            }
        }
    }
}
