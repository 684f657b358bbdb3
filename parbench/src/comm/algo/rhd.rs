//! Recursive halving-doubling all-reduce (Rabenseifner): bandwidth-optimal
//! like the ring, with lg p steps each way instead of p - 1.
//!
//! Structure (p ranks, p' = largest power of two <= p, e = p - p'):
//! - fold in (if e > 0): 1 step of n bytes (see [`super::rd`]);
//! - reduce-scatter by recursive halving, lg p' steps: the buffer is cut
//!   into p' near-equal blocks; at the step with mask m (m = p'/2, ..., 1)
//!   a rank exchanges half of its current window of 2m blocks with the
//!   partner whose renumbered rank differs in bit m (sends the partner's
//!   half, reduces the partner's copy of its own half): n/2, n/4, ... bytes;
//! - all-gather by recursive doubling, lg p' steps (m = 1, ..., p'/2): the
//!   same partners swap the windows they own: n/p', 2n/p', ... bytes;
//! - fold out (if e > 0): 1 step of n bytes.
//!
//! So 2 lg p steps moving 2(p-1)/p x n bytes for a power of two.

use super::rd::around_core;
use super::{split_two, Blocks};
use crate::comm::{CommResult, DType, RecvInto, ReduceOp, Transport};
use std::time::Instant;

/// Recursive halving-doubling all-reduce of the whole of `buf`.
pub fn all_reduce<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> CommResult<()> {
    around_core(t, buf, dtype, op, deadline, |t, buf, folded, nr| {
        let core = folded.core;
        let blocks = Blocks::new(buf.len() / dtype.size(), core, dtype.size());
        // Reduce-scatter: halve the window each step.
        let mut mask = core / 2;
        while mask > 0 {
            let partner_nr = nr ^ mask;
            let keep = blocks.span(nr & !(mask - 1), mask);
            let give = blocks.span(partner_nr & !(mask - 1), mask);
            let (data, acc) = split_two(buf, give, keep)?;
            let partner = folded.real(partner_nr);
            t.exchange(
                partner,
                data,
                partner,
                RecvInto::Reduce { acc, dtype, op },
                deadline,
            )?;
            mask /= 2;
        }
        // All-gather: double the window each step.
        let mut mask = 1;
        while mask < core {
            let partner_nr = nr ^ mask;
            let mine = blocks.span(nr & !(mask - 1), mask);
            let theirs = blocks.span(partner_nr & !(mask - 1), mask);
            let (data, dst) = split_two(buf, mine, theirs)?;
            let partner = folded.real(partner_nr);
            t.exchange(partner, data, partner, RecvInto::Copy(dst), deadline)?;
            mask *= 2;
        }
        Ok(())
    })
}
