//! Pipeline parallelism, run for real: S stage ranks on any backend, each
//! holding MLP layers with a real forward and a backward split into input
//! and weight gradients, running a [`Schedule`]'s actions in order and
//! timing each one on one time base for every rank
//! ([`crate::measure::clock_sync`]); then the measured bubble next to the
//! simulator's prediction from the measured per-action costs and the
//! closed form.
//!
//! - [`mlp`]: what a stage computes, and the one-device reference.
//! - [`exec`]: the per-rank executor ([`run_rank`]), stamping every action
//!   on its host's clock.
//! - `align`: every rank's stamps onto rank 0's clock, each receive
//!   matched with its send (waiting for the peer told apart from transfer).
//! - [`analysis`]: from timings to step time, busy and idle time, the
//!   measured bubble, the per-action costs, the simulation.
//! - [`trace`]: the Chrome trace (Perfetto) and the terminal timeline.

mod align;
pub mod analysis;
pub mod composed;
mod composed_gather;
mod composed_record;
pub mod composed_run;
pub mod dp_overlap;
pub mod exec;
pub mod mlp;
pub mod stage;
pub mod tp_stage;
pub mod trace;
mod world_base;

pub use analysis::{acausal, closed_form, summarize, Acausal, IdleSplit, Summary};
pub use composed::{check_composed, GradCheck};
pub use composed_record::{
    ComposedRecord, PipelineSteps, RankBreakdown, RankFigures, ShardFigures, ShardWires, WireProbe,
};
pub use composed_run::{run_composed, ComposedConfig};
pub use dp_overlap::{overlap_comm, with_overlap, JobKind, Reducer};
pub use exec::{run_rank, run_stages, ActionTiming, RankStep, RunRecord};
pub use mlp::{MlpShape, MlpStages};
pub use stage::StageWork;
pub use tp_stage::{CommSpan, DpReduce, SpanGroup, StageStepTimes, TpStageConfig, TpStages};
pub use trace::{
    chrome_trace, clocks_json, composed_trace, terminal_timeline, write_chrome_trace,
    write_composed_trace,
};

use crate::schedule::Schedule;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// What each action does (`--work`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// The stage's MLP layers: real forward, input-gradient and weight-gradient passes.
    Compute,
    /// Each action sleeps (F, I and W this long, B twice as long: B = I + W),
    /// leaving the CPU free as a GPU kernel would; messages still cross.
    Sleep(Duration),
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Work::Compute => f.write_str("compute"),
            Work::Sleep(d) => write!(f, "sleep:{}", d.as_micros()),
        }
    }
}

impl FromStr for Work {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "compute" {
            return Ok(Work::Compute);
        }
        if let Some(us) = s.strip_prefix("sleep:") {
            let us: u64 = us
                .parse()
                .map_err(|_| format!("--work sleep:US needs microseconds, got '{us}'"))?;
            if us == 0 {
                return Err("--work sleep:US needs a positive time".into());
            }
            return Ok(Work::Sleep(Duration::from_micros(us)));
        }
        Err(format!("unknown work '{s}' (expected compute or sleep:US)"))
    }
}

/// Everything one pipeline run needs; the same on every rank.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// The validated schedule (one row per rank).
    pub schedule: Schedule,
    /// Layers of each stage (`stage_layers[s]`).
    pub stage_layers: Vec<usize>,
    /// Layer width and microbatch rows.
    pub shape: MlpShape,
    pub work: Work,
    /// A rank that adds this much to each of its actions.
    pub straggler: Option<(usize, Duration)>,
    /// Seed of weights, inputs and targets.
    pub seed: u64,
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
}

impl PipelineConfig {
    /// Bytes each rank holds at once in this run (f32 values), in rank
    /// order: its stages' weights and weight gradients, the activations it
    /// keeps for the backward (two per layer, for the most microbatches the
    /// schedule holds in flight there) and the messages waiting in its
    /// mailbox (every microbatch's, at worst). In u128: an estimate for
    /// refusing flags a machine cannot hold before anything is allocated.
    pub fn memory_bytes_per_rank(&self) -> Vec<u128> {
        let s = &self.schedule;
        let w = |v: usize| v as u128;
        let (h, n) = (w(self.shape.hidden), w(self.shape.rows));
        let held = crate::schedule::peak_in_flight(s);
        (0..s.ranks())
            .map(|r| {
                let layers: u128 = s
                    .stages_of(r)
                    .iter()
                    .map(|&st| w(self.stage_layers.get(st).copied().unwrap_or(0)))
                    .sum();
                let weights = 2 * layers * (h * h + h);
                let acts = w(held.get(r).copied().unwrap_or(0)) * layers * 2 * n * h;
                let mail = 2 * w(s.microbatches) * n * h;
                (weights + acts + mail) * 4
            })
            .collect()
    }

    /// What the gradient check's reference adds on rank 0 under real
    /// compute: every stage's weights and gradients, and one microbatch's
    /// activations through the whole model.
    pub fn reference_bytes(&self) -> u128 {
        if self.work != Work::Compute {
            return 0;
        }
        let w = |v: usize| v as u128;
        let (h, n) = (w(self.shape.hidden), w(self.shape.rows));
        let layers: u128 = self.stage_layers.iter().map(|&l| w(l)).sum();
        (2 * layers * (h * h + h) + 2 * layers * n * h) * 4
    }
}

/// What can stop a pipeline run. Communication errors name the peer.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Comm(#[from] crate::comm::CommError),
    #[error(transparent)]
    Compute(#[from] crate::compute::ComputeError),
    #[error("invalid pipeline run: {0}")]
    Invalid(String),
    #[error("pipeline protocol error: {0}")]
    Protocol(String),
}

impl PipelineError {
    /// As a communicator error of rank `rank`, so that a backend that runs
    /// ranks together (`local`) stops the others naming this rank.
    pub fn into_comm(self, rank: usize) -> crate::comm::CommError {
        use crate::comm::CommError;
        match self {
            PipelineError::Comm(e) => e,
            PipelineError::Compute(e) => CommError::Device(format!("rank {rank}: {e}")),
            PipelineError::Invalid(d) => CommError::InvalidArgument(format!("rank {rank}: {d}")),
            PipelineError::Protocol(detail) => CommError::Protocol {
                rank,
                peer: rank,
                detail,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_parses() {
        assert_eq!("compute".parse::<Work>().unwrap(), Work::Compute);
        assert_eq!(
            "sleep:250".parse::<Work>().unwrap(),
            Work::Sleep(Duration::from_micros(250))
        );
        assert_eq!(
            Work::Sleep(Duration::from_micros(250)).to_string(),
            "sleep:250"
        );
        for bad in ["sleep", "sleep:", "sleep:x", "sleep:0", "gpu"] {
            assert!(bad.parse::<Work>().is_err(), "{bad}");
        }
    }
}
