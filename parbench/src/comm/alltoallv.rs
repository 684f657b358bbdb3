//! All-to-all with per-pair counts (MPI's `MPI_Alltoallv`; NCCL has no such
//! call, so nccl-tests' alltoall and DeepEP issue grouped `ncclSend` /
//! `ncclRecv`, and so does [`super::Communicator::all_to_all_v`] on NCCL).
//!
//! Each rank's send buffer holds, packed in rank order, `send[j]` elements
//! for rank j; its receive buffer gets `recv[i]` elements from rank i,
//! packed in rank order ([`VCounts`]). The ranks' counts must agree: rank
//! i's `send[j]` is rank j's `recv[i]`, as MPI requires.

use super::{CommBuffer, CommError, CommResult, Communicator, DType};
use crate::seed::splitmix64;
use std::ops::Range;

/// One rank's element counts of an all-to-all-v: `send[j]` go to rank j,
/// `recv[i]` come from rank i, each buffer packed in rank order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VCounts {
    send: Vec<usize>,
    recv: Vec<usize>,
    send_at: Vec<usize>,
    recv_at: Vec<usize>,
}

impl VCounts {
    /// The counts of one rank; both lists have one entry per rank.
    pub fn new(send: Vec<usize>, recv: Vec<usize>) -> CommResult<Self> {
        if send.len() != recv.len() {
            return Err(CommError::InvalidArgument(format!(
                "all_to_all_v counts for {} ranks to send and {} to receive",
                send.len(),
                recv.len()
            )));
        }
        let (send_at, recv_at) = (offsets(&send)?, offsets(&recv)?);
        Ok(VCounts {
            send,
            recv,
            send_at,
            recv_at,
        })
    }

    /// Rank `rank`'s counts of the matrix `pair(from, to)` (elements rank
    /// `from` sends to rank `to`) over `world` ranks.
    pub fn of_matrix(
        world: usize,
        rank: usize,
        pair: impl Fn(usize, usize) -> usize,
    ) -> CommResult<Self> {
        let send = (0..world).map(|j| pair(rank, j)).collect();
        let recv = (0..world).map(|i| pair(i, rank)).collect();
        Self::new(send, recv)
    }

    /// Ranks the counts are for.
    pub fn world(&self) -> usize {
        self.send.len()
    }
    /// Elements sent to each rank.
    pub fn send(&self) -> &[usize] {
        &self.send
    }
    /// Elements received from each rank.
    pub fn recv(&self) -> &[usize] {
        &self.recv
    }
    /// Elements of the send buffer.
    pub fn send_total(&self) -> usize {
        self.send_at.last().copied().unwrap_or(0)
    }
    /// Elements of the receive buffer.
    pub fn recv_total(&self) -> usize {
        self.recv_at.last().copied().unwrap_or(0)
    }
    /// Where (elements) the block for rank `j` lies in the send buffer.
    pub fn send_range(&self, j: usize) -> Range<usize> {
        self.send_at[j]..self.send_at[j + 1]
    }
    /// Where (elements) the block from rank `i` lies in the receive buffer.
    pub fn recv_range(&self, i: usize) -> Range<usize> {
        self.recv_at[i]..self.recv_at[i + 1]
    }

    /// Checks the counts against a communicator of `world` ranks and its
    /// buffers of `send_bytes` and `recv_bytes`.
    pub fn check(
        &self,
        world: usize,
        dtype: DType,
        send_bytes: usize,
        recv_bytes: usize,
    ) -> CommResult<()> {
        if self.world() != world {
            return Err(CommError::InvalidArgument(format!(
                "all_to_all_v counts for {} ranks in a world of {world}",
                self.world()
            )));
        }
        for (what, total, have) in [
            ("send", self.send_total(), send_bytes),
            ("recv", self.recv_total(), recv_bytes),
        ] {
            let need = total.checked_mul(dtype.size()).ok_or_else(|| {
                CommError::InvalidArgument(format!("{total} elements overflow the address space"))
            })?;
            if have < need {
                return Err(CommError::InvalidArgument(format!(
                    "all_to_all_v {what} buffer holds {have} bytes, the counts need {need}"
                )));
            }
        }
        Ok(())
    }
}

/// The running sums of `counts`, starting at 0 (one more entry than `counts`).
fn offsets(counts: &[usize]) -> CommResult<Vec<usize>> {
    let mut at = Vec::with_capacity(counts.len() + 1);
    let mut sum = 0usize;
    at.push(0);
    for &c in counts {
        sum = sum.checked_add(c).ok_or_else(|| {
            CommError::InvalidArgument("all_to_all_v counts overflow the address space".into())
        })?;
        at.push(sum);
    }
    Ok(at)
}

/// The partner ranks of step `s` of the pairwise exchange on `rank` of
/// `world`: (sent to, received from). Step 0 is the rank's own block.
pub(crate) fn step_peers(rank: usize, world: usize, s: usize) -> (usize, usize) {
    ((rank + s) % world, (rank + world - s) % world)
}

/// The bytes rank `from` sends rank `to` in a check of all-to-all-v under
/// `seed`, from byte `at` on, written into `out`: a function of (seed,
/// from, to, byte) alone, so the receiver knows what must arrive.
pub fn fill_pair(seed: u64, from: usize, to: usize, at: usize, out: &mut [u8]) {
    let key = splitmix64(seed ^ splitmix64(((from as u64) << 32) | to as u64));
    for (k, b) in out.iter_mut().enumerate() {
        let i = at + k;
        *b = splitmix64(key.wrapping_add((i / 8) as u64)).to_le_bytes()[i % 8];
    }
}

/// Elements rank `from` sends rank `to` in a seeded check: 0 to `max`,
/// some pairs empty.
pub fn seeded_count(seed: u64, from: usize, to: usize, max: usize) -> usize {
    let h = splitmix64(seed ^ 0xA11_70A1 ^ splitmix64(((from as u64) << 32) | to as u64));
    (h % (max as u64 + 1)) as usize
}

/// Runs one seeded all-to-all-v of `dtype` with counts up to `max` per pair
/// on every rank of `comm`, and checks every received byte, and that the
/// receive buffer past the counts is untouched. `Ok(None)` when right, or
/// where the first wrong byte was.
pub fn check_seeded<C: Communicator>(
    comm: &mut C,
    seed: u64,
    max: usize,
    dtype: DType,
) -> CommResult<Option<String>> {
    let (rank, world, size) = (comm.rank(), comm.world(), dtype.size());
    let counts = VCounts::of_matrix(world, rank, |i, j| seeded_count(seed, i, j, max))?;
    let mut input = vec![0u8; counts.send_total() * size];
    for j in 0..world {
        let r = counts.send_range(j);
        fill_pair(seed, rank, j, 0, &mut input[r.start * size..r.end * size]);
    }
    const GUARD: usize = 64;
    let recv_bytes = counts.recv_total() * size;
    let mut send = comm.alloc(input.len())?;
    send.write_from_host(&input)?;
    let mut recv = comm.alloc(recv_bytes + GUARD)?;
    recv.write_from_host(&vec![0xA5; recv_bytes + GUARD])?;
    comm.all_to_all_v(&send, &mut recv, &counts, dtype)?;
    comm.sync()?;
    let mut got = vec![0u8; recv_bytes + GUARD];
    recv.read_to_host(&mut got)?;
    let mut want = vec![0u8; recv_bytes];
    for i in 0..world {
        let r = counts.recv_range(i);
        fill_pair(seed, i, rank, 0, &mut want[r.start * size..r.end * size]);
    }
    if let Some(k) = (0..recv_bytes).find(|&k| got[k] != want[k]) {
        let from = (0..world)
            .find(|&i| counts.recv_range(i).end * size > k)
            .unwrap_or(0);
        return Ok(Some(format!(
            "byte {k} (from rank {from}) is {:#04x}, {:#04x} was sent",
            got[k], want[k]
        )));
    }
    if let Some(k) = (recv_bytes..got.len()).find(|&k| got[k] != 0xA5) {
        return Ok(Some(format!(
            "byte {k} past the {recv_bytes} received was written"
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{local, Algo, LocalComm};
    use std::time::Duration;

    #[test]
    fn counts_pack_blocks_in_rank_order() {
        let c = VCounts::of_matrix(3, 1, |i, j| 10 * i + j).unwrap();
        assert_eq!(c.send(), &[10, 11, 12]);
        assert_eq!(c.recv(), &[1, 11, 21]);
        assert_eq!((c.send_total(), c.recv_total()), (33, 33));
        assert_eq!(c.send_range(2), 21..33);
        assert_eq!(c.recv_range(1), 1..12);
        assert!(VCounts::new(vec![1], vec![1, 2]).is_err());
        assert!(VCounts::new(vec![usize::MAX, 1], vec![0, 0]).is_err());
        assert!(c.check(2, DType::U8, 100, 100).is_err());
        assert!(c.check(3, DType::F32, 132, 131).is_err());
        assert!(c.check(3, DType::F32, 132, 132).is_ok());
    }

    #[test]
    fn fill_pair_is_the_same_in_pieces() {
        let mut whole = vec![0u8; 37];
        fill_pair(7, 1, 2, 0, &mut whole);
        let mut tail = vec![0u8; 20];
        fill_pair(7, 1, 2, 17, &mut tail);
        assert_eq!(&whole[17..], &tail[..]);
        let mut other = vec![0u8; 37];
        fill_pair(7, 2, 1, 0, &mut other);
        assert_ne!(whole, other);
    }

    fn on_local(world: usize, f: impl Fn(&mut LocalComm) -> Option<String> + Sync) {
        let results = local::run(world, Algo::Auto, Duration::from_secs(30), |comm| {
            Ok(f(comm))
        });
        for (rank, r) in results.into_iter().enumerate() {
            assert_eq!(r.unwrap(), None, "rank {rank} of {world}");
        }
    }

    #[test]
    fn local_all_to_all_v_delivers_every_byte() {
        for world in 1..=5 {
            on_local(world, |comm| {
                let wrong = crate::comm::conformance::run_v_suite(comm).unwrap();
                wrong.first().map(|m| m.to_string())
            });
        }
    }

    #[test]
    fn the_staged_fallback_delivers_every_byte() {
        on_local(4, |comm| {
            let (rank, world) = (comm.rank(), comm.world());
            let seed = 11;
            let counts =
                VCounts::of_matrix(world, rank, |i, j| seeded_count(seed, i, j, 300)).unwrap();
            let mut input = vec![0u8; counts.send_total() * 2];
            for j in 0..world {
                let r = counts.send_range(j);
                fill_pair(seed, rank, j, 0, &mut input[r.start * 2..r.end * 2]);
            }
            let send = crate::comm::HostBuffer::from_slice(&input);
            let mut recv = crate::comm::HostBuffer::zeroed(counts.recv_total() * 2);
            crate::comm::group::all_to_all_v_over_point_to_point(
                comm,
                &send,
                &mut recv,
                &counts,
                DType::BF16,
            )
            .unwrap();
            let mut want = vec![0u8; counts.recv_total() * 2];
            for i in 0..world {
                let r = counts.recv_range(i);
                fill_pair(seed, i, rank, 0, &mut want[r.start * 2..r.end * 2]);
            }
            (recv.bytes() != want.as_slice()).then(|| "staged path differs".to_string())
        });
    }

    #[test]
    fn mismatched_counts_are_errors_not_panics() {
        on_local(2, |comm| {
            let counts = VCounts::new(vec![1, 1, 1], vec![1, 1, 1]).unwrap();
            let (send, mut recv) = (comm.alloc(64).unwrap(), comm.alloc(64).unwrap());
            let e = comm.all_to_all_v(&send, &mut recv, &counts, DType::F32);
            (!matches!(e, Err(CommError::InvalidArgument(_)))).then(|| format!("{e:?}"))
        });
    }
}
