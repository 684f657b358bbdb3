//! The split of a block call's wall time into compute and communication.

use super::super::LayerResult;
use crate::comm::Communicator;
use crate::compute::Compute;
use std::time::{Duration, Instant};

/// Splits the wall time of a block call into compute and communication,
/// and keeps where each communication phase lay (for a trace).
#[derive(Clone, Debug)]
pub struct PhaseClock {
    compute: Duration,
    comm: Duration,
    /// Time in barriers that wait for every peer before a collective.
    wait: Duration,
    /// Whether a collective of the dense block starts with such a barrier
    /// ([`PhaseClock::waiting_apart`]).
    wait_apart: bool,
    mark: Instant,
    born: Instant,
    /// Each communication phase: (start, end) since the clock began.
    spans: Vec<(Duration, Duration)>,
}

impl Default for PhaseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl PhaseClock {
    /// A clock that starts counting compute now. A collective's time
    /// includes any wait for a slower peer, as a step's does.
    pub fn new() -> Self {
        let now = Instant::now();
        PhaseClock {
            compute: Duration::ZERO,
            comm: Duration::ZERO,
            wait: Duration::ZERO,
            wait_apart: false,
            mark: now,
            born: now,
            spans: Vec::new(),
        }
    }

    /// A clock that starts counting compute now and times waiting apart:
    /// before each of the dense block's collectives
    /// ([`PhaseClock::before_collective`]) a barrier, charged to waiting,
    /// so that the collective's own time holds no peer's compute.
    pub fn waiting_apart() -> Self {
        PhaseClock {
            wait_apart: true,
            ..Self::new()
        }
    }

    /// Ends the compute phase before a collective, then, on a clock made
    /// by [`PhaseClock::waiting_apart`], waits for every peer.
    pub fn before_collective<C: Compute, M: Communicator>(
        &mut self,
        dev: &C,
        comm: &mut M,
    ) -> LayerResult<()> {
        self.end_compute(dev)?;
        if self.wait_apart {
            self.wait_for_peers(comm)?;
        }
        Ok(())
    }

    /// Each communication phase, (start, end) since the clock began.
    pub fn comm_spans(&self) -> &[(Duration, Duration)] {
        &self.spans
    }

    /// Time charged to compute so far.
    pub fn compute(&self) -> Duration {
        self.compute
    }

    /// Time charged to communication so far.
    pub fn comm(&self) -> Duration {
        self.comm
    }

    /// Time charged to waiting for peers so far ([`PhaseClock::wait_for_peers`]).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Waits for every peer (a barrier before a collective) and charges
    /// the time since the mark to waiting, so that the collective after it
    /// is timed without a late peer's skew.
    pub fn wait_for_peers<M: Communicator>(&mut self, comm: &mut M) -> LayerResult<()> {
        comm.barrier()?;
        comm.sync()?;
        let now = Instant::now();
        self.wait += now - self.mark;
        self.mark = now;
        Ok(())
    }

    /// Ends a compute phase: waits for the device, charges the time since the mark.
    pub fn end_compute<C: Compute>(&mut self, dev: &C) -> LayerResult<()> {
        dev.sync()?;
        let now = Instant::now();
        self.compute += now - self.mark;
        self.mark = now;
        Ok(())
    }

    /// Ends a communication phase: waits for the communicator, charges the time since the mark.
    pub fn end_comm<M: Communicator>(&mut self, comm: &mut M) -> LayerResult<()> {
        comm.sync()?;
        let now = Instant::now();
        self.comm += now - self.mark;
        self.spans.push((self.mark - self.born, now - self.born));
        self.mark = now;
        Ok(())
    }
}
