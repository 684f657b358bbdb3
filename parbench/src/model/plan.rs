//! The capacity planner: every way to lay a model over a cluster, each
//! costed with the figures the user measured on their own machines.
//!
//! A layout is `world = data x tensor x pipeline` (Megatron-LM's `dp x tp x
//! pp`), a microbatch size `b` with `M` microbatches per step (global batch
//! `B = dp x M x b` sequences), and a pipeline schedule (GPipe, 1F1B,
//! interleaved 1F1B with `v` chunks, ZB-H1). Each layout's training step is
//! costed as
//!
//! - compute: the step's FLOPs ([`Preset::forward_flops_per_layer`],
//!   [`Preset::logit_flops`]; backward twice the forward) split over `t`,
//!   at the sustained matrix-product rate the caller gives (bench-layers'
//!   measured GFLOP/s, or a flag);
//! - tensor-parallel communication, exposed (Megatron's all-reduces sit on
//!   the critical path): [`TpTraffic`]'s collectives per layer timed with the
//!   textbook alpha-beta forms ([`predict_textbook`]: what NCCL's pipelined
//!   rings run) on the wire the tensor-parallel group uses;
//! - the pipeline bubble: the schedule simulator ([`super::sim`]) over the
//!   stages' costs (compute plus tensor-parallel communication, the logits on
//!   the last stage, so stages are unequal) and point-to-point messages of
//!   `b s h / t` elements (Megatron's scatter/gather of activations) on the
//!   pipeline's wire; the bubble is the busiest rank's idle time;
//! - the data-parallel gradient all-reduce, exposed (no overlap with the
//!   backward assumed: an upper bound), ring over `dp` ranks of the rank's
//!   gradient bytes on the data-parallel group's wire.
//!
//! Ranks are placed in Megatron's order (tensor innermost, then data, then
//! pipeline), so a group is inside one node when its span (`t`, `t dp`,
//! `t dp pp`) fits in the node and divides it; a group that leaves the node
//! pays the inter-node wire.
//!
//! Memory per device: weights, gradients and Adam state at 16 bytes per
//! parameter ([`MIXED_PRECISION_ADAM_BYTES_PER_PARAM`]; with a distributed
//! optimizer `4 + 12/dp`), for the layers of one stage plus every
//! non-layer parameter (embeddings, head: an upper bound for the first and
//! last stages), divided by `t`; plus the activations of the microbatches
//! in flight on the busiest rank (the schedule's peak, counted on the
//! generated schedule) times Korthikanti et al.'s per-layer bytes
//! ([`activation_bytes_per_layer`], a GPT block's form).
//!
//! One given layout with a given schedule and `M` (no search), costed
//! the same way from one run's own calibration: [`cost_given`], which
//! `report plan --check` holds against a measured composed step.
//!
//! Nothing here measures or prints: the `report plan` binary loads the
//! measured figures and draws the table.

mod costs;
mod given;
mod input;
mod layouts;
mod rejections;

pub use costs::{pipeline_makespan, Costed, Loss, Memory};
pub use given::{
    bucket_ready_times, cost_given, overlapped_exposure, Calibration, CallFit, GivenCost,
    GivenLayout,
};
pub use input::{PlanError, PlanInput, Wire, WireKind};
pub use layouts::{divisors, group_wire, Layout};
pub use rejections::{LossGroup, Rejected, Rejection};

use costs::Planner;
use input::check_input;
use layouts::schedules;
use std::collections::HashMap;

/// The outcome: the layouts that fit, fastest first, and the others.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayoutRanking {
    /// Every layout that fits, by tokens per second, fastest first.
    pub ranked: Vec<Costed>,
    /// Every layout that cannot run.
    pub rejected: Vec<Rejected>,
}

/// Plans: enumerates every layout, rejects those that cannot run, costs the
/// others and ranks them by tokens per second.
pub fn plan(input: &PlanInput) -> Result<LayoutRanking, PlanError> {
    check_input(input)?;
    let mut planner = Planner {
        input,
        peaks: HashMap::new(),
        makespans: HashMap::new(),
    };
    let mut ranked = Vec::new();
    let mut rejected = Vec::new();
    let n = input.gpus;
    let g = input.gpus_per_node;
    let m = &input.model;
    for tp in divisors(n) {
        for pp in divisors(n / tp) {
            let dp = n / (tp * pp);
            let split = Layout {
                dp,
                tp,
                pp,
                schedule: String::new(),
                chunks: 1,
                micro_batch: 0,
                microbatches: 0,
            };
            let reject = |reason| Rejected {
                layout: split.clone(),
                reason,
                memory: None,
            };
            if !input.allow_tp_across_nodes && (tp > g || !g.is_multiple_of(tp)) {
                rejected.push(reject(Rejection::TpAcrossNodes {
                    tp,
                    gpus_per_node: g,
                }));
                continue;
            }
            if let Err(e) = m.check_split(tp, pp, 1) {
                rejected.push(reject(Rejection::InvalidSplit {
                    rule: e.to_string(),
                }));
                continue;
            }
            if !input.global_batch.is_multiple_of(dp) {
                rejected.push(reject(Rejection::Batch {
                    global_batch: input.global_batch,
                    dp,
                }));
                continue;
            }
            let per_replica = input.global_batch / dp;
            for b in divisors(per_replica) {
                let micro = per_replica / b;
                for (schedule, chunks) in schedules(input, pp, micro) {
                    let layout = Layout {
                        dp,
                        tp,
                        pp,
                        schedule: schedule.into(),
                        chunks,
                        micro_batch: b,
                        microbatches: micro,
                    };
                    let memory = planner.memory(&layout);
                    match input.memory_bytes {
                        Some(have) if memory.total() > have => rejected.push(Rejected {
                            layout,
                            reason: Rejection::Memory {
                                needs_bytes: memory.total(),
                                have_bytes: have,
                            },
                            memory: Some(memory),
                        }),
                        _ => ranked.push(planner.cost(layout, memory)),
                    }
                }
            }
        }
    }
    ranked.sort_by(|a, b| {
        b.tokens_per_s
            .total_cmp(&a.tokens_per_s)
            .then(a.memory.total().total_cmp(&b.memory.total()))
    });
    Ok(LayoutRanking { ranked, rejected })
}

#[cfg(test)]
mod tests;
