//! What one step measured on one rank: its phases' times
//! ([`StageStepTimes`]), each communication phase placed against its action
//! ([`CommSpan`]), and the bytes of state it held ([`HeldBytes`]).

use crate::layers::PhaseClock;

/// One step's times on one rank, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageStepTimes {
    /// The blocks' compute (host time between collectives).
    pub compute_us: f64,
    /// The tensor-parallel collectives.
    pub tp_comm_us: f64,
    /// Every data-parallel bucket's reduction.
    pub dp_comm_us: f64,
    /// The part of `dp_comm_us` the step waited for after the rank's last
    /// action: without overlap all of it; with overlap the wait for the
    /// buckets still running and their copies back.
    pub dp_exposed_us: f64,
    /// Buckets reduced.
    pub buckets: usize,
    /// ZeRO-3's per-layer parameter all-gathers, ZeRO-2's and -3's
    /// per-layer gradient reduce-scatters, and the part of both the
    /// compute thread waited for (in the actions; not in `dp_comm_us`).
    pub shard_gather_us: f64,
    pub shard_scatter_us: f64,
    pub shard_exposed_us: f64,
    /// Per-layer sharded collectives run.
    pub shard_calls: usize,
    /// With `--prefetch`: of `shard_gather_us`, the time from each gather
    /// being free to start (handed over, the thread's previous job done)
    /// to the thread taking it up (its wake-up).
    pub shard_handover_us: f64,
    /// Adam's update at the step's end (with `--shard`).
    pub optimizer_us: f64,
    /// What the rank held at the step's end, and the peak of each kind
    /// and of the total during the step ([`HeldBytes`]).
    pub held_end: HeldBytes,
    pub held_peak: HeldBytes,
    pub held_peak_total: f64,
}

impl StageStepTimes {
    /// Adds what `clock` counted (one pass).
    pub(super) fn charge(&mut self, clock: &PhaseClock) {
        self.compute_us += clock.compute().as_secs_f64() * 1e6;
        self.tp_comm_us += clock.comm().as_secs_f64() * 1e6;
    }

    /// The part of the data-parallel reduction the step did not wait for:
    /// it ran while the rank computed or waited on the pipeline.
    pub fn dp_hidden_us(&self) -> f64 {
        (self.dp_comm_us - self.dp_exposed_us).max(0.0)
    }
}

/// Which group a communication span ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanGroup {
    /// A tensor-parallel collective inside a pass.
    Tp,
    /// A data-parallel bucket's reduction on the rank's own thread.
    Dp,
    /// A data-parallel bucket's reduction on the reduction thread
    /// (`overlap`): a track of its own beside the rank's.
    DpThread,
    /// A sharded layer's parameter all-gather (ZeRO-3), and its
    /// gradients' reduce-scatter (ZeRO-2 and -3): a track of their own
    /// beside the rank's.
    ShardGather,
    ShardScatter,
}

/// One communication phase of one step on one rank, placed against the
/// action it ran in (or after, for a bucket): its start counted from that
/// action's work start on the rank's own clock, so that a trace can put it
/// on whatever base the action's times are moved to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommSpan {
    pub group: SpanGroup,
    /// The action's place in the rank's list for the step.
    pub action: usize,
    pub offset_us: f64,
    pub dur_us: f64,
}

/// Bytes one rank holds for the model's state, by kind, counted from the
/// buffers it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeldBytes {
    /// Weights: every block's (empty while ZeRO-3 has them freed) and
    /// ZeRO-3's shares.
    pub params: f64,
    /// Gradients: every block's (empty while ZeRO-2 and -3 have them
    /// freed) and the sharded modes' shares.
    pub grads: f64,
    /// Adam's moments (and master weights).
    pub optimizer: f64,
    /// Copies for communication: the data-parallel buckets, packed layers
    /// and gathered shares while they are held.
    pub buffers: f64,
}

impl HeldBytes {
    pub fn total(&self) -> f64 {
        self.params + self.grads + self.optimizer + self.buffers
    }

    /// The larger of each kind (a peak per kind).
    pub(super) fn max(self, o: HeldBytes) -> HeldBytes {
        HeldBytes {
            params: self.params.max(o.params),
            grads: self.grads.max(o.grads),
            optimizer: self.optimizer.max(o.optimizer),
            buffers: self.buffers.max(o.buffers),
        }
    }
}
