//! The one place where `report` asks `parbench::model` for a figure: every
//! prediction, fit (`fit`), closed form and the planner's
//! ranking (`rank_layouts`) goes through here, and nothing in `report`
//! computes a formula of its own. Record names become the model's types
//! here or just before the call (`ModelAlgo::of`, `Collective`'s
//! `FromStr`).
//!
//! Other files only name `model`'s data types, which ask it nothing:
//! `plan_cmd/input.rs` builds the planner's `PlanInput` and `Wire`s, `html/plan.rs`
//! draws its `Costed` layouts, and `model_cmd.rs` and `html/capacity.rs` hold `TpMode`,
//! `TpTraffic`, `Preset` and `LinkParams` values.

use parbench::comm::algo::Algorithm;
use parbench::comm::{Collective, DType};
use parbench::model::{self, LinkParams, RingFactor, TpMode, TpTraffic};

pub use parbench::model::ModelAlgo;

pub use parbench::model::presets::PRESETS;
pub use parbench::model::{NETWORK_REFERENCE_GBPS, NVLINK_REFERENCE_GBPS};

/// Bytes per element of a dtype name as records and flags spell it.
pub fn dtype_bytes(dtype: &str) -> Option<u64> {
    dtype.parse::<DType>().ok().map(|d| d.size() as u64)
}

/// nccl-tests' bus-bandwidth factor of a collective (by record name) on `world` ranks.
pub fn busbw_factor(collective: &str, world: usize) -> Option<f64> {
    let c: Collective = collective.parse().ok()?;
    Some(model::busbw_factor(c, world))
}

/// An alpha-beta fit of one measured curve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Latency per message (per latency step of the algorithm), microseconds.
    pub alpha_us: f64,
    /// Bandwidth per link, GB/s; `None` when the sizes were too small to show it.
    pub gbps: Option<f64>,
    pub rms_rel_err: f64,
    pub max_rel_err: f64,
    pub points: usize,
    /// The fitted link, for predictions on other sizes and rank counts.
    pub link: LinkParams,
}

/// Fits the (bytes, microseconds) points of `collective` run with `algo` on
/// `world` ranks; the error says why no fit exists.
pub fn fit(
    collective: &str,
    algo: &ModelAlgo,
    world: usize,
    points: &[(u64, f64)],
) -> Result<Fit, String> {
    let c: Collective = collective.parse()?;
    let secs: Vec<(u64, f64)> = points.iter().map(|&(n, us)| (n, us * 1e-6)).collect();
    let f = model::fit(c, algo, world, &secs).map_err(|e| e.to_string())?;
    Ok(Fit {
        alpha_us: f.alpha_us(),
        gbps: f.bandwidth_gbps(),
        rms_rel_err: f.rms_rel_err,
        max_rel_err: f.max_rel_err,
        points: f.points,
        link: f.link(),
    })
}

/// The planner's layouts for `input`, best first (`model::plan`).
pub fn rank_layouts(
    input: &model::plan::PlanInput,
) -> Result<model::plan::LayoutRanking, model::plan::PlanError> {
    model::plan::plan(input)
}

/// A link with only a bandwidth (the reference wires of the worked example).
pub fn bandwidth_link(gbps: f64) -> LinkParams {
    LinkParams::from_gbps_us(gbps, 0.0)
}

/// The algorithm to project a fitted link with: the measured one, or ring
/// when the curve was measured with `auto` (whose fit is per call).
pub fn projection_algo(measured: &ModelAlgo) -> ModelAlgo {
    match measured {
        ModelAlgo::Selector(s) if s.eq_ignore_ascii_case("auto") => Algorithm::Ring.into(),
        other => other.clone(),
    }
}

/// The algorithm the planner costs a fitted wire with: the measured one,
/// or ring for any selector (`auto`, `nccl`, `mpi`), whose fit is per call.
pub fn planner_algo(measured: &ModelAlgo) -> ModelAlgo {
    if measured.is_selector() {
        Algorithm::Ring.into()
    } else {
        measured.clone()
    }
}

/// Communication time of one step through `layers` layers over `link` with
/// `algo`, microseconds (alpha-beta of every collective call).
pub fn comm_us_per_step(
    traffic: &TpTraffic,
    layers: u64,
    algo: &ModelAlgo,
    link: &LinkParams,
) -> Option<f64> {
    traffic
        .comm_seconds_per_block(algo, link)
        .map(|s| s * layers as f64 * 1e6)
}

/// Bytes each device sends per step through `layers` layers.
pub fn wire_bytes_per_step(traffic: &TpTraffic, layers: u64, exact: bool) -> f64 {
    traffic.wire_bytes_per_step(
        layers,
        if exact {
            RingFactor::Exact
        } else {
            RingFactor::Limit
        },
    )
}

/// Ring factor of one all-reduce (or all-gather/reduce-scatter with
/// sequence parallelism): exact, or the large-t limit.
pub fn ring_factor(traffic: &TpTraffic, exact: bool) -> f64 {
    let c = if traffic.sequence_parallel {
        Collective::AllGather
    } else {
        Collective::AllReduce
    };
    traffic.ring_factor(
        c,
        if exact {
            RingFactor::Exact
        } else {
            RingFactor::Limit
        },
    )
}

/// Seconds to move `bytes` at `gbps`, bandwidth only.
pub fn transfer_us(bytes: f64, gbps: f64) -> f64 {
    model::transfer_seconds(bytes, gbps) * 1e6
}

/// Idle share of a GPipe/1F1B step: (S-1)/(S+M-1).
pub fn bubble_of_step(stages: usize, microbatches: usize) -> Option<f64> {
    model::bubble_fraction_of_step(stages as u64, microbatches as u64)
}

/// Bubble over ideal time (Megatron's form): (S-1)/M.
pub fn bubble_of_ideal(stages: usize, microbatches: usize) -> Option<f64> {
    model::bubble_fraction_of_ideal(stages as u64, microbatches as u64)
}

/// Idle share of an interleaved 1F1B step with `chunks` per rank.
pub fn bubble_of_step_interleaved(
    stages: usize,
    microbatches: usize,
    chunks: usize,
) -> Option<f64> {
    model::bubble::interleaved_bubble_fraction_of_step(
        stages as u64,
        microbatches as u64,
        chunks as u64,
    )
}

/// The fewest microbatches that keep a pipeline of `stages` (with `chunks`
/// per rank) busy at least `busy` of the step.
pub fn microbatches_for_busy(stages: usize, chunks: usize, busy: f64) -> Option<u64> {
    model::microbatches_for_utilisation(stages as u64, chunks as u64, busy)
}

/// The mode named on the command line.
pub fn tp_mode(name: &str) -> Option<TpMode> {
    match name {
        "decode" => Some(TpMode::Decode),
        "prefill" | "forward" => Some(TpMode::Prefill),
        "train" => Some(TpMode::Train),
        _ => None,
    }
}
