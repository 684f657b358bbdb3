//! Recursive doubling all-reduce (latency-optimal), and the fold that lets
//! recursive doubling and halving-doubling run on any world size.
//!
//! Structure (p ranks, p' = largest power of two <= p, e = p - p'):
//! - fold in (only if e > 0): each even rank r < 2e sends its whole buffer
//!   to r + 1, which reduces it (1 step of n bytes); the even ranks sit out;
//! - lg p' steps: at step k the remaining ranks exchange their whole buffer
//!   with the partner whose (renumbered) rank differs in bit k, and reduce;
//! - fold out (only if e > 0): each odd rank r < 2e sends the result to
//!   r - 1 (1 step of n bytes).
//!
//! So lg p steps of n bytes for a power of two, lg p' + 2 otherwise.

use super::{pow2_floor, pull, push, Scratch};
use crate::comm::copy_bytes;
use crate::comm::{CommResult, DType, RecvInto, ReduceOp, Transport};
use std::time::Instant;

/// A rank's place in the power-of-two core of a folded world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Folded {
    /// Size of the core, the largest power of two <= world.
    pub core: usize,
    /// Number of ranks folded away (world - core).
    pub extra: usize,
    /// This rank's number inside the core, or `None` if it sits out.
    pub new_rank: Option<usize>,
}

impl Folded {
    /// Where `rank` of `world` stands.
    pub fn of(rank: usize, world: usize) -> Self {
        let core = pow2_floor(world);
        let extra = world - core;
        let new_rank = if rank < 2 * extra {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - extra)
        };
        Folded {
            core,
            extra,
            new_rank,
        }
    }

    /// The real rank of core member `new_rank`.
    pub fn real(&self, new_rank: usize) -> usize {
        if new_rank < self.extra {
            2 * new_rank + 1
        } else {
            new_rank + self.extra
        }
    }
}

/// Folds the world onto its power-of-two core: even ranks below 2e hand
/// their buffer to the next rank, which reduces it into its own.
pub fn fold_in<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> CommResult<Folded> {
    let r = t.rank();
    let f = Folded::of(r, t.world());
    if r < 2 * f.extra {
        if r.is_multiple_of(2) {
            push(t, r + 1, buf, deadline)?;
        } else {
            pull(
                t,
                r - 1,
                RecvInto::Reduce {
                    acc: buf,
                    dtype,
                    op,
                },
                deadline,
            )?;
        }
    }
    Ok(f)
}

/// Hands the result back to the ranks that [`fold_in`] set aside.
pub fn fold_out<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    folded: Folded,
    deadline: Instant,
) -> CommResult<()> {
    let r = t.rank();
    if r < 2 * folded.extra {
        if r % 2 == 1 {
            push(t, r - 1, buf, deadline)?;
        } else {
            pull(t, r + 1, RecvInto::Copy(buf), deadline)?;
        }
    }
    Ok(())
}

/// Recursive doubling all-reduce of the whole of `buf`. Each step sends a
/// copy of the running result (in `scratch`) while reducing the partner's
/// into `buf`, since a rank cannot reduce into bytes its partner is reading.
pub fn all_reduce<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    scratch: &mut Scratch,
    deadline: Instant,
) -> CommResult<()> {
    around_core(t, buf, dtype, op, deadline, |t, buf, folded, nr| {
        let mut mask = 1;
        while mask < folded.core {
            let partner = folded.real(nr ^ mask);
            let copy = scratch.bytes(buf.len());
            copy_bytes(copy, buf);
            let into = RecvInto::Reduce {
                acc: &mut *buf,
                dtype,
                op,
            };
            t.exchange(partner, copy, partner, into, deadline)?;
            mask <<= 1;
        }
        Ok(())
    })
}

/// The frame of both recursive all-reduces: folds the extra ranks' data in
/// ([`fold_in`]), runs `core` on the ranks of the power-of-two core (with
/// this rank's number in it), and hands the result back out ([`fold_out`]).
/// One rank or an empty buffer has nothing to do.
pub fn around_core<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
    core: impl FnOnce(&mut T, &mut [u8], &Folded, usize) -> CommResult<()>,
) -> CommResult<()> {
    if t.world() < 2 || buf.is_empty() {
        return Ok(());
    }
    let folded = fold_in(t, buf, dtype, op, deadline)?;
    if let Some(nr) = folded.new_rank {
        core(t, buf, &folded, nr)?;
    }
    fold_out(t, buf, folded, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_maps_core_ranks_both_ways() {
        for world in 1..=12 {
            let mut seen = vec![false; pow2_floor(world)];
            for r in 0..world {
                let f = Folded::of(r, world);
                assert_eq!(f.core + f.extra, world);
                if let Some(nr) = f.new_rank {
                    assert_eq!(f.real(nr), r);
                    assert!(!seen[nr]);
                    seen[nr] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }
}
