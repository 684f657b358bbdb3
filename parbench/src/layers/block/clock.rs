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
    /// A clock that starts counting compute now.
    pub fn new() -> Self {
        let now = Instant::now();
        PhaseClock {
            compute: Duration::ZERO,
            comm: Duration::ZERO,
            wait: Duration::ZERO,
            mark: now,
            born: now,
            spans: Vec::new(),
        }
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

    /// Time charged to waiting for peers so far ([`PhaseClock::end_wait`]).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Ends a wait for peers (a barrier before a collective): waits for the
    /// communicator, charges the time since the mark to waiting, so that
    /// the collective after it is timed without a late peer's skew.
    pub fn end_wait<M: Communicator>(&mut self, comm: &mut M) -> LayerResult<()> {
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
