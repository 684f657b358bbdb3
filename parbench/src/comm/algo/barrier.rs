//! Dissemination barrier.
//!
//! Structure (p ranks): ceil(lg p) rounds; in round k a rank sends an empty
//! message to `rank + 2^k` and waits for one from `rank - 2^k`. After the
//! last round every rank has heard, directly or not, from every other.

use crate::comm::{CommResult, RecvInto, Transport};
use std::time::Instant;

/// Returns once every rank has entered the barrier.
pub fn barrier<T: Transport + ?Sized>(t: &mut T, deadline: Instant) -> CommResult<()> {
    let (p, r) = (t.world(), t.rank());
    let mut dist = 1;
    while dist < p {
        let to = (r + dist) % p;
        let from = (r + p - dist) % p;
        t.exchange(to, &[], from, RecvInto::Copy(&mut []), deadline)?;
        dist *= 2;
    }
    Ok(())
}
