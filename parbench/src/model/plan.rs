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
//! A mixture of experts' layouts also carry `ep` and `etp`: the routed
//! experts split over `ep x etp` ranks, an MoE layer's compute and its
//! all-to-all costed in `costs/moe.rs` (docs/report.md, "Mixtures of
//! experts"); a dense model's are `ep = etp = 1`.
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
//! `report plan --against` holds against a measured composed step.
//!
//! Nothing here measures or prints: the `report plan` binary loads the
//! measured figures and draws the table.

mod costed;
mod costs;
mod given;
mod input;
mod layouts;
mod rejections;
mod shard;

pub use costed::{ComputeParts, Costed, Loss, Memory};
pub use costs::{hardware_flops, pipeline_makespan};
pub use given::{
    bucket_ready_times, cost_given, overlapped_exposure, Calibration, CallFit, GivenCost,
    GivenLayout, GivenShard,
};
pub use input::{PlanError, PlanInput, Wire, WireKind, DDP_BUCKET_BYTES};
pub use layouts::{divisors, group_wire, uneven_split, Layout};
pub use rejections::{LossGroup, Rejected, Rejection};
pub use shard::Shard;

use crate::model::context;
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

/// What `report plan --layout` fixes: the split, and optionally the
/// schedule, `v`, `b` and an uneven split's first and last stages; what is
/// not fixed is searched within the split.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayoutQuery {
    pub dp: u64,
    pub tp: u64,
    /// Context-parallel degree (0 or 1: none).
    pub cp: u64,
    pub pp: u64,
    pub schedule: Option<String>,
    pub chunks: Option<u64>,
    pub micro_batch: Option<u64>,
    /// Layers of the first and last stages.
    pub first_last: Option<(u64, u64)>,
    /// The data-parallel sharding, and its group (hybrid below `dp`).
    pub shard: Option<Shard>,
    pub shard_group: Option<u64>,
    /// Expert-parallel degree, and the experts' tensor degree (default `tp`).
    pub ep: Option<u64>,
    pub etp: Option<u64>,
}

/// Plans: enumerates every layout, rejects those that cannot run, costs the
/// others and ranks them by tokens per second.
pub fn plan(input: &PlanInput) -> Result<LayoutRanking, PlanError> {
    check_input(input)?;
    let (mut planner, mut out) = start(input);
    let n = input.gpus;
    for tp in divisors(n) {
        for cp in divisors(n / tp)
            .into_iter()
            .filter(|&c| c <= input.max_cp.max(1))
        {
            for pp in divisors(n / (tp * cp)) {
                let dp = n / (tp * cp * pp);
                plan_split(&mut planner, &mut out, Split { dp, tp, cp, pp }, None);
            }
        }
    }
    rank(&mut out);
    Ok(out)
}

/// Costs the layouts `q` allows (one, when it fixes everything), ranked.
pub fn plan_layout(input: &PlanInput, q: &LayoutQuery) -> Result<LayoutRanking, PlanError> {
    check_input(input)?;
    let cp = q.cp.max(1);
    let world =
        q.dp.checked_mul(q.tp)
            .and_then(|x| x.checked_mul(cp))
            .and_then(|x| x.checked_mul(q.pp));
    if world != Some(input.gpus) {
        return Err(PlanError::LayoutWorld {
            dp: q.dp,
            tp: q.tp,
            cp,
            pp: q.pp,
            gpus: input.gpus,
        });
    }
    let (mut planner, mut out) = start(input);
    let split = Split {
        dp: q.dp,
        tp: q.tp,
        cp,
        pp: q.pp,
    };
    plan_split(&mut planner, &mut out, split, Some(q));
    rank(&mut out);
    Ok(out)
}

/// A planner with empty caches, and an empty outcome.
fn start(input: &PlanInput) -> (Planner<'_>, LayoutRanking) {
    (
        Planner {
            input,
            peaks: HashMap::new(),
            makespans: HashMap::new(),
        },
        LayoutRanking {
            ranked: Vec::new(),
            rejected: Vec::new(),
        },
    )
}

fn rank(out: &mut LayoutRanking) {
    out.ranked.sort_by(|a, b| {
        b.tokens_per_s
            .total_cmp(&a.tokens_per_s)
            .then(a.memory.total().total_cmp(&b.memory.total()))
    });
}

/// The layers of the first and last of `stages` stages (pipeline stages
/// times chunks): `None` for an even split, Megatron's uneven split
/// otherwise (or the query's), or the rule the split breaks.
fn stage_split(
    m: &crate::model::Preset,
    pp: u64,
    chunks: u64,
    q: Option<&LayoutQuery>,
) -> Result<Option<(u64, u64)>, String> {
    let stages = pp.saturating_mul(chunks);
    if let Some((first, last)) = q.and_then(|q| q.first_last) {
        let middle = stages.saturating_sub(2);
        let rest = m.layers.checked_sub(first.saturating_add(last));
        // The first stage may hold the embedding alone and the last the
        // output layer and loss alone (Megatron-Core's
        // --pipeline-model-parallel-layout, as DeepSeek-V3's recipe
        // "Et|(tt|)*30mL"; Llama 3's chunks of one layer, the first
        // "only the embedding"); a middle stage holds layers.
        let ok = stages >= 2
            && rest.is_some_and(|r| {
                if middle == 0 {
                    r == 0
                } else {
                    r.is_multiple_of(middle) && r > 0
                }
            });
        if !ok {
            return Err(format!(
                "first stage {first} and last stage {last} layers leave {} layers for {} middle stages: not a whole number each",
                rest.map_or("no".to_string(), |r| r.to_string()),
                middle
            ));
        }
        return Ok(Some((first, last)));
    }
    match m.check_split(1, pp, chunks) {
        Ok(()) => Ok(None),
        Err(e) => layouts::uneven_split(m.layers, stages)
            .map(Some)
            .ok_or_else(|| e.to_string()),
    }
}

/// The data-parallel sharding modes a `dp x tp` layout is tried with, each
/// with its sharding group: the input's modes (or the query's), ZeRO-2
/// and ZeRO-3 also hybrid (sharded over the data ranks of one node,
/// replicated across nodes) when `input.hybrid` and a node holds more than
/// one data rank but not all of them. One data rank shards nothing.
fn shard_modes(input: &PlanInput, dp: u64, tp: u64, q: Option<&LayoutQuery>) -> Vec<(Shard, u64)> {
    // With context parallelism `dp` is the gradient group, `dp x cp`,
    // and a node's share of it counts its context ranks too.
    if dp < 2 {
        return vec![(Shard::None, 1)];
    }
    let modes: Vec<Shard> = match q.and_then(|q| q.shard) {
        Some(s) => vec![s],
        None if !input.shard_modes.is_empty() => input.shard_modes.clone(),
        None if input.distributed_optimizer => vec![Shard::Zero1],
        None => vec![Shard::None],
    };
    let in_node = (input.gpus_per_node / tp.max(1)).max(1);
    let mut out = Vec::new();
    for s in modes {
        if s == Shard::None {
            out.push((s, 1));
            continue;
        }
        let wanted = q.and_then(|q| q.shard_group);
        if wanted.is_none_or(|g| g == dp) {
            out.push((s, dp));
        }
        let hybrid = matches!(s, Shard::Zero2 | Shard::Zero3)
            && in_node > 1
            && in_node < dp
            && dp.is_multiple_of(in_node);
        match wanted {
            Some(g) if g > 1 && g < dp && dp.is_multiple_of(g) => out.push((s, g)),
            None if hybrid && input.hybrid => out.push((s, in_node)),
            _ => {}
        }
    }
    out
}

/// The expert splits a `dp x tp` layout is tried with, `(ep, etp)`:
/// `(1, 1)` for a dense model; for an MoE, the query's `ep` or every one
/// dividing the experts (the search lists them), each with the query's
/// `etp` or both `tp` (Megatron-Core's default) and 1, where `ep etp`
/// divides `dp tp` (the experts' data-parallel degree, Megatron-Core's
/// `parallel_state`: `world / (etp ep pp)`). Or the rule the query breaks.
fn moe_splits(
    m: &crate::model::Preset,
    dp: u64,
    tp: u64,
    q: Option<&LayoutQuery>,
) -> Result<Vec<(u64, u64)>, String> {
    let Some(moe) = m.moe else {
        return match q.and_then(|q| q.ep) {
            Some(ep) if ep > 1 => Err(format!("ep={ep}: the model has no experts")),
            _ => Ok(vec![(1, 1)]),
        };
    };
    let ranks = dp.saturating_mul(tp);
    let etps: Vec<u64> = match q.and_then(|q| q.etp) {
        Some(e) => vec![e],
        None if tp > 1 => vec![tp, 1],
        None => vec![1],
    };
    let eps = match q.and_then(|q| q.ep) {
        Some(ep) => vec![ep],
        None => divisors(moe.experts),
    };
    let fits = |ep: u64, etp: u64| {
        ep >= 1
            && etp >= 1
            && moe.experts.is_multiple_of(ep)
            && moe.expert_ffn.is_multiple_of(etp)
            && ranks.is_multiple_of(ep.saturating_mul(etp))
    };
    let all: Vec<(u64, u64)> = eps
        .iter()
        .flat_map(|&ep| etps.iter().map(move |&etp| (ep, etp)))
        .filter(|&(ep, etp)| fits(ep, etp))
        .collect();
    if all.is_empty() {
        return Err(format!(
            "no ep x etp of {} experts (MLP {}) divides dp x tp ({ranks}){}: the experts must divide by ep, their MLP by etp, and dp x tp by ep x etp (the experts' data-parallel group)",
            moe.experts,
            moe.expert_ffn,
            q.and_then(|q| q.ep).map_or(String::new(), |ep| format!(" with ep={ep}"))
        ));
    }
    Ok(all)
}

/// The degrees of one split of the devices.
#[derive(Clone, Copy)]
struct Split {
    dp: u64,
    tp: u64,
    cp: u64,
    pp: u64,
}

/// Why `cp` context ranks cannot run: the stack has no context
/// parallelism, its attention is not flash attention (Transformer
/// Engine's context parallelism runs inside its fused attention), or the
/// sequence or heads do not split ([`context::check`]).
fn context_rule(input: &PlanInput, tp: u64, cp: u64) -> Result<(), String> {
    if cp <= 1 {
        return Ok(());
    }
    let Some(comm) = input.step.cp_comm else {
        return Err(format!("cp={cp}: the stack has no context parallelism"));
    };
    if input
        .ops
        .is_some_and(|o| o.attention != crate::model::opcost::Attention::Flash)
    {
        return Err(format!(
            "cp={cp}: context parallelism runs inside flash attention (Transformer Engine's fused attention), not unfused attention"
        ));
    }
    let m = &input.model;
    if m.moe.is_some() {
        // The experts' all-to-all and groups are costed without context
        // ranks; refused rather than costed wrong.
        return Err(format!(
            "cp={cp}: context parallelism of an MoE model is not modelled"
        ));
    }
    context::check(m.seq, m.heads, tp, cp, comm)
}

/// Every layout of one `dp x tp x cp x pp` split (those `q` allows),
/// costed or rejected into `out`.
fn plan_split(planner: &mut Planner, out: &mut LayoutRanking, sp: Split, q: Option<&LayoutQuery>) {
    let Split { dp, tp, cp, pp } = sp;
    let input = planner.input;
    let g = input.gpus_per_node;
    let m = &input.model;
    let split = Layout {
        dp,
        tp,
        cp,
        pp,
        schedule: String::new(),
        chunks: 1,
        micro_batch: 0,
        microbatches: 0,
        first_stage_layers: 0,
        last_stage_layers: 0,
        uneven: false,
        shard: Shard::None,
        shard_group: 1,
        ep: 1,
        etp: 1,
    };
    let reject = |reason| Rejected {
        layout: split.clone(),
        reason,
        memory: None,
    };
    if !input.allow_tp_across_nodes && (tp > g || !g.is_multiple_of(tp)) {
        out.rejected.push(reject(Rejection::TpAcrossNodes {
            tp,
            gpus_per_node: g,
        }));
        return;
    }
    if let Err(e) = m.check_split(tp, 1, 1) {
        out.rejected.push(reject(Rejection::InvalidSplit {
            rule: e.to_string(),
        }));
        return;
    }
    if let Err(rule) = context_rule(input, tp, cp) {
        out.rejected.push(reject(Rejection::InvalidSplit { rule }));
        return;
    }
    // Without chunks the layers must split (evenly or Megatron's way);
    // each chunk count is checked again below.
    if let Err(rule) = stage_split(m, pp, 1, q) {
        if q.is_none_or(|q| q.chunks.is_none_or(|v| v <= 1)) {
            out.rejected.push(reject(Rejection::InvalidSplit { rule }));
            return;
        }
    }
    // A query's chunks that the layers cannot fill: say why, not "nothing runs".
    if let Some(v) = q.and_then(|q| q.chunks).filter(|&v| v > 1) {
        if let Err(rule) = stage_split(m, pp, v, q) {
            let rule = match q.and_then(|q| q.first_last) {
                Some(_) => rule,
                None => format!("{rule}, nor split Megatron's uneven way: give first=F,last=L"),
            };
            out.rejected.push(reject(Rejection::InvalidSplit { rule }));
            return;
        }
    }
    let experts = match moe_splits(m, dp, tp, q) {
        Ok(e) => e,
        Err(rule) => {
            out.rejected.push(reject(Rejection::InvalidSplit { rule }));
            return;
        }
    };
    if !input.global_batch.is_multiple_of(dp) {
        out.rejected.push(reject(Rejection::Batch {
            global_batch: input.global_batch,
            dp,
        }));
        return;
    }
    let per_replica = input.global_batch / dp;
    for b in divisors(per_replica) {
        if q.and_then(|q| q.micro_batch).is_some_and(|want| want != b) {
            continue;
        }
        let micro = per_replica / b;
        // A named vpp beyond the search's range is costed as named.
        let max_chunks = q
            .and_then(|q| q.chunks)
            .map_or(input.max_chunks, |v| v.max(input.max_chunks));
        for (schedule, chunks) in schedules(input, pp, micro, max_chunks) {
            let wanted = q.is_none_or(|q| {
                q.schedule.as_deref().is_none_or(|s| s == schedule)
                    && q.chunks.is_none_or(|v| v == chunks)
            });
            if !wanted {
                continue;
            }
            let Ok(ends) = stage_split(m, pp, chunks, q) else {
                continue;
            };
            let (first, last) = ends.unwrap_or((0, 0));
            let modes = shard_modes(input, dp * cp, tp, q);
            for ((shard, group), &(ep, etp)) in modes
                .iter()
                .flat_map(|m| experts.iter().map(move |e| (*m, e)))
            {
                let layout = Layout {
                    dp,
                    tp,
                    cp,
                    pp,
                    schedule: schedule.into(),
                    chunks,
                    micro_batch: b,
                    microbatches: micro,
                    first_stage_layers: first,
                    last_stage_layers: last,
                    uneven: ends.is_some(),
                    shard,
                    shard_group: group,
                    ep,
                    etp,
                };
                let memory = planner.memory(&layout);
                // Refused only when both counts exceed the device: within
                // the model's uncertainty a layout is costed, marked tight.
                match input.memory_bytes {
                    Some(have) if memory.range().0 > have => out.rejected.push(Rejected {
                        layout,
                        reason: Rejection::Memory {
                            needs_bytes: memory.range().0,
                            have_bytes: have,
                        },
                        memory: Some(memory),
                    }),
                    _ => out.ranked.push(planner.cost(layout, memory)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
