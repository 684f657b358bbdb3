//! The timed loop of one operation on one rank.

use crate::comm::{CommResult, Communicator};
use std::time::{Duration, Instant};

/// How a timed loop runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopSpec {
    /// Untimed iterations first (caches, connections, page faults).
    pub warmup: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Injected delay before each timed iteration on this rank (`--straggler`),
    /// to show how one slow rank paces the others.
    pub delay: Option<Duration>,
}

/// One rank's timings of one loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankTimes {
    /// The whole timed loop, one clock pair around it, including the final
    /// [`Communicator::sync`]: nccl-tests' measure (divide by `iters`).
    pub total: Duration,
    /// Per iteration, nanoseconds from the end of the previous iteration (or
    /// the loop's start) to the end of this one, injected delay included.
    pub iter_ns: Vec<u64>,
    /// Per iteration, nanoseconds from entering the call (after any injected
    /// delay) to its return. A rank that arrives late waits least, so across
    /// ranks this shows who arrives last (no clock synchronisation needed).
    pub in_call_ns: Vec<u64>,
}

impl RankTimes {
    /// Mean time per iteration in microseconds (nccl-tests' time), 0 for no iterations.
    pub fn mean_us(&self) -> f64 {
        if self.iter_ns.is_empty() {
            0.0
        } else {
            self.total.as_secs_f64() * 1e6 / self.iter_ns.len() as f64
        }
    }
}

/// Runs `op` `spec.warmup` times untimed, aligns the ranks with a barrier,
/// then `spec.iters` times under the clock.
///
/// The reported time is one clock pair around the whole loop, as nccl-tests
/// does; the per-iteration times come from one extra clock read per
/// iteration (a few tens of nanoseconds), so the loop costs about what a bare
/// loop of the same calls costs. On device backends the per-iteration times
/// are launch times unless `op` synchronises; the loop time always includes
/// the final synchronisation.
pub fn time_loop<C, F>(comm: &mut C, spec: &LoopSpec, mut op: F) -> CommResult<RankTimes>
where
    C: Communicator,
    F: FnMut(&mut C) -> CommResult<()>,
{
    for _ in 0..spec.warmup {
        op(comm)?;
    }
    comm.sync()?;
    comm.barrier()?;

    let mut iter_ns = Vec::with_capacity(spec.iters);
    let mut in_call_ns = Vec::with_capacity(spec.iters);
    let start = Instant::now();
    let mut prev = start;
    for _ in 0..spec.iters {
        let enter = match spec.delay {
            Some(d) => {
                std::thread::sleep(d);
                Instant::now()
            }
            None => prev,
        };
        op(comm)?;
        let end = Instant::now();
        iter_ns.push(nanos(end - prev));
        in_call_ns.push(nanos(end - enter));
        prev = end;
    }
    comm.sync()?;
    let total = start.elapsed();
    Ok(RankTimes {
        total,
        iter_ns,
        in_call_ns,
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
