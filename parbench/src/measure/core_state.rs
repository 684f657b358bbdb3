//! Where the host put the ranks' cores, and every row timed in the state
//! the wire was measured in.
//!
//! On a virtual machine the host moves the vCPUs between physical cores:
//! on the 2-core EPYC VM this project measures on, a cache line moved
//! between the two ranks' cores in 30 ns or in 150 ns, the host switching
//! between the two every second or so (a two-thread line ping-pong sampled
//! every 0.5 s: 11 of 40 samples at 144-156 ns; 18 of 30 with the main
//! thread spinning between samples instead of sleeping), and the two vCPUs
//! at times read as hyper-threads of one core. Every shared-memory figure moved with it: an out-of-place
//! all_gather of 64 KiB-1 MiB ran 3-5x slower in the slow state, and
//! ladders measured in one state put the model 3-12x off rows timed in
//! another. A model and a row measured on two different machines cannot
//! agree, and a ceiling from another machine is no ceiling. So the wire is
//! measured in one state (each rung waiting for it,
//! `measure::wire`'s ladders), each row waits for the cores to be in that
//! state before it is timed ([`wait_for_state`], at most [`MOST_WAIT`],
//! and [`WAIT_BUDGET`] in all)
//! and is probed again after: a row that found another state or saw the
//! cores move is marked (its model `~`) and left out of the fits, and the
//! bench's footer says how many and how long the run waited. parbench's sockets
//! are tracked the same way, by a probe of their own ([`tracks_state`]).

use crate::comm::{CommResult, Communicator};
use crate::measure::{self, CoreState, StateFigures};
use std::time::Instant;

/// How far apart each figure of two [`CoreState`]s may lie and still be
/// one state of the cores: the states of the 2-core EPYC VM lie 1.7-3.5x
/// apart in at least one figure, a state's own spread within 1.4x.
pub const STATE_RATIO: f64 = 1.5;

/// How far a row's two probes (after its wait, before its rungs; after
/// its timing) may part in the exchange of just-written lines, the
/// figure both wires' probes judge by, and the row still count as timed
/// in one state. Finer than [`STATE_RATIO`]: the figure has sub-modes
/// that ratio calls one state. On the EPYC VM:
/// - the shared-memory probe read 7.7-8.3 GB/s in one and 5.8-6.8 in
///   another;
/// - the socket probe read 1.6 in one and 1.9-2.0 in another.
///
/// A rung measured in one sub-mode and a row timed in the other priced
/// it up to 1.5x off: a tcp all_reduce of 16 MiB took 6.9-7.3 ms after
/// probes of 1.63 then 1.92 GB/s, priced at 9.8-10.3 ms by rungs of the
/// first. Over the 11,844 rows of a day's local runs, the ratio between
/// a row's two probes falls in two humps, 1.00-1.06 and 1.20-1.32, with
/// a trough at 1.10-1.17 between; the socket probe's ratios fall off
/// from 1.00 with a shoulder at 1.20-1.27, and its fast mode parts by up
/// to 1.15 within itself. The bound sits in the trough.
pub const MOVED_RATIO: f64 = 1.15;

/// Whether two probes of one row part beyond [`MOVED_RATIO`] in the
/// exchange of just-written lines (`false` when either is missing).
fn parted(a: Option<&CoreState>, b: Option<&CoreState>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            let (x, y) = (a.shared_gbps, b.shared_gbps);
            x > 0.0 && y > 0.0 && (x / y).max(y / x) > MOVED_RATIO
        }
        _ => false,
    }
}

/// The longest a row (or a rung of the wire) waits for the cores to come
/// back to the wire's state, seconds: the VM's states lasted 0.5-3 s.
pub const MOST_WAIT: f64 = 2.0;

/// Whether two core-state probes saw the same state (`None`: nothing to
/// tell apart, the state not tracked).
pub fn same_state(a: Option<&CoreState>, b: Option<&CoreState>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.same_as(b, STATE_RATIO),
        _ => true,
    }
}

/// Whether the wire's state is tracked: on shared memory, whose figures
/// move with where the host puts the ranks' cores, and on parbench's own
/// sockets, whose loopback moved between two modes on the EPYC VM
/// (all_reduce rows of 2-16 MiB at 1.1-1.3 GB/s busbw for seconds at a
/// time, then 3.5-5.5 again: in 4 of 5 default tcp runs the ladders were
/// measured in one mode and rows timed in the other). Sockets are probed with
/// [`SOCKET_PROBE_BYTES`] per exchange: the kernel's own jitter moves a
/// small exchange as much as a mode does (8 B exchanges of 7.6 or 10.6 us,
/// 32 KiB at 1 or 2 GB/s, minutes apart).
pub fn tracks_state<C: Communicator>(comm: &C) -> bool {
    comm.world() > 1 && matches!(comm.backend(), "local" | "tcp")
}

/// Bytes per transfer of the socket probe's exchange of just-written
/// buffers: long enough (tens of microseconds) that a mode, not the
/// kernel's wake-up jitter, sets its rate.
pub const SOCKET_PROBE_BYTES: usize = 256 << 10;

/// The core-state probe where it is tracked ([`tracks_state`]), else `None`.
pub fn state_probe<C: Communicator>(comm: &mut C) -> CommResult<Option<CoreState>> {
    if !tracks_state(comm) {
        return Ok(None);
    }
    if comm.backend() == "tcp" {
        measure::core_state_probe_with(comm, SOCKET_PROBE_BYTES, StateFigures::Transfer)
    } else {
        measure::core_state_probe(comm)
    }
}

/// Seconds a run's rows may wait in all, and as many its wire's rungs: on
/// a loaded machine (or among concurrent tests) the probe finds another
/// state at every row, and 2 s per row would make a sweep of 200 rows
/// wait 400 s. Once spent, rows are timed at once and marked if elsewhere.
pub const WAIT_BUDGET: f64 = 10.0;

/// What is left of a [`WAIT_BUDGET`], seconds: the same on every rank
/// (it counts down by rank 0's waits).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WaitBudget(pub f64);

impl Default for WaitBudget {
    fn default() -> Self {
        WaitBudget(WAIT_BUDGET)
    }
}

/// Probes until the cores are in `state`, or [`MOST_WAIT`] or what is left
/// of `budget` has passed (rank 0's clock decides, through a gather, so
/// every rank takes the same turn): the last probe and rank 0's seconds
/// waited, taken off `budget`. Every rank must call it.
pub fn wait_for_state<C: Communicator>(
    comm: &mut C,
    state: Option<&CoreState>,
    budget: &mut WaitBudget,
) -> CommResult<(Option<CoreState>, f64)> {
    if !tracks_state(comm) {
        return Ok((None, 0.0));
    }
    let most = MOST_WAIT.min(budget.0.max(0.0));
    // The wait counts from the first probe's end: through a 1 Gbit/s link
    // one probe takes 60-70 ms, and counted as a wait it made every row of
    // a quiet run read as one that waited.
    let mut start: Option<Instant> = None;
    loop {
        let now = state_probe(comm)?;
        let begun = *start.get_or_insert_with(Instant::now);
        let waited = measure::gather_f64(comm, &[begun.elapsed().as_secs_f64()])?
            .first()
            .and_then(|v| v.first().copied())
            .unwrap_or(0.0);
        if same_state(state, now.as_ref()) || waited >= most {
            budget.0 -= waited;
            return Ok((now, waited));
        }
    }
}

/// A row's core-state probes: before (after the wait) and after its timing.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RowState {
    pub row: String,
    pub before: Option<CoreState>,
    pub after: Option<CoreState>,
    /// Seconds the row waited for the wire's state.
    pub waited_s: f64,
    /// Whether both probes found the wire's state.
    pub in_state: bool,
}

impl RowState {
    /// A row timed after waiting for the wire's state `at`.
    pub fn new(
        row: String,
        at: Option<&CoreState>,
        (before, waited_s): (Option<CoreState>, f64),
        after: Option<CoreState>,
    ) -> RowState {
        let mut state = RowState {
            row,
            before,
            after,
            waited_s,
            in_state: false,
        };
        state.in_state = same_state(at, state.before.as_ref())
            && same_state(at, state.after.as_ref())
            && !state.moved();
        state
    }

    /// Whether the cores (or the wire) moved between the row's wait and
    /// the end of its timing, while its rungs were measured or it was
    /// timed: its probes tell two states apart ([`STATE_RATIO`]), or two
    /// sub-modes of one ([`MOVED_RATIO`]).
    pub fn moved(&self) -> bool {
        !same_state(self.before.as_ref(), self.after.as_ref())
            || parted(self.before.as_ref(), self.after.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(exchange_us: f64) -> CoreState {
        CoreState {
            exchange_us,
            shared_gbps: 8.0,
            copy_gbps: 95.0,
            judged_by: StateFigures::All,
        }
    }

    fn row(before: f64, after: f64) -> RowState {
        RowState {
            row: format!("all_reduce {before} {after}"),
            before: Some(state(before)),
            after: Some(state(after)),
            waited_s: 0.0,
            in_state: true,
        }
    }

    #[test]
    fn a_row_moved_only_when_its_probes_part_beyond_the_ratio() {
        assert!(!row(0.15, 0.19).moved());
        assert!(row(0.15, 0.34).moved());
        assert!(row(0.34, 0.15).moved());
        let none = RowState {
            before: None,
            after: None,
            ..row(1.0, 1.0)
        };
        assert!(!none.moved());
        // Hyper-threads of one core: the same exchange, shared lines 3x faster.
        let siblings = RowState {
            after: Some(CoreState {
                shared_gbps: 25.0,
                copy_gbps: 55.0,
                ..state(0.15)
            }),
            ..row(0.15, 0.15)
        };
        assert!(siblings.moved());
    }

    fn shared(gbps: f64) -> Option<CoreState> {
        Some(CoreState {
            shared_gbps: gbps,
            ..state(0.15)
        })
    }

    /// As recorded on the EPYC VM: the shared-line exchange's two
    /// sub-modes (8.0 and 6.4 GB/s, one state at [`STATE_RATIO`]) part a
    /// row, as the socket probe's two slow ones do (1.63 and 1.92); the
    /// exchange's own jitter (8.0 and 7.2) does not, nor does the socket
    /// probe's fast mode (4.7 and 4.2).
    #[test]
    fn a_row_whose_probes_part_between_sub_modes_moved_and_is_out_of_state() {
        let at = state(0.15);
        let new = |before: f64, after: f64| {
            RowState::new("r".into(), Some(&at), (shared(before), 0.0), shared(after))
        };
        let sub = new(8.0, 6.4);
        assert!(sub.moved() && !sub.in_state);
        assert!(new(6.4, 8.0).moved());
        let jitter = new(8.0, 7.2);
        assert!(!jitter.moved() && jitter.in_state);
        let sockets = |gbps: f64| {
            shared(gbps).map(|s| CoreState {
                judged_by: crate::measure::StateFigures::Transfer,
                ..s
            })
        };
        let fast = RowState::new(
            "r".into(),
            sockets(4.4).as_ref(),
            (sockets(4.7), 0.0),
            sockets(4.2),
        );
        assert!(!fast.moved() && fast.in_state);
        let slow = RowState::new(
            "r".into(),
            sockets(1.9).as_ref(),
            (sockets(1.63), 0.0),
            sockets(1.92),
        );
        assert!(slow.moved() && !slow.in_state);
        // A probe missing on either side: nothing to part.
        assert!(!parted(shared(8.0).as_ref(), None));
    }

    #[test]
    fn a_row_is_in_state_only_when_both_probes_find_the_wires() {
        let at = state(0.15);
        let new = |before: f64, after: f64| {
            RowState::new(
                "r".into(),
                Some(&at),
                (Some(state(before)), 0.0),
                Some(state(after)),
            )
        };
        assert!(new(0.16, 0.14).in_state);
        assert!(!new(0.34, 0.34).in_state);
        assert!(!new(0.15, 0.34).in_state);
        let untracked = RowState::new("r".into(), None, (None, 0.0), None);
        assert!(untracked.in_state && !untracked.moved());
    }
}
