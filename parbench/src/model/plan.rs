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
//! Nothing here measures or prints: the `report plan` binary loads the
//! measured figures and draws the table.

use super::alpha_beta::{predict_textbook, LinkParams};
use super::bubble::{peak_activations, BubbleSchedule};
use super::footprint::{
    activation_bytes_per_layer, Recompute, MIXED_PRECISION_ADAM_BYTES_PER_PARAM,
};
use super::presets::Preset;
use super::sim::{simulate, SimCosts, StageCosts};
use super::tensor_parallel::{TpMode, TpTraffic};
use crate::comm::Collective;
use crate::schedule::{generate, peak_in_flight, ScheduleKind};
use std::collections::HashMap;

/// A wire between devices: its alpha-beta parameters and the algorithm to
/// cost collectives with (`ring`, or any name [`predict_textbook`] knows).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Wire {
    pub link: LinkParams,
    pub algo: String,
}

impl Wire {
    /// A ring over `link`.
    pub fn ring(link: LinkParams) -> Self {
        Wire {
            link,
            algo: "ring".into(),
        }
    }

    /// Seconds of one `coll` of `bytes` over `p` ranks; 0 on one rank. A
    /// pair with no model falls back to the ring (every collective the
    /// planner calls has one).
    fn seconds(&self, coll: Collective, p: u64, bytes: u64) -> f64 {
        if p <= 1 || bytes == 0 {
            return 0.0;
        }
        let p = usize::try_from(p).unwrap_or(usize::MAX);
        predict_textbook(coll, &self.algo, p, bytes, &self.link)
            .or_else(|| predict_textbook(coll, "ring", p, bytes, &self.link))
            .unwrap_or(f64::INFINITY)
    }

    /// Seconds of one point-to-point message of `bytes`: `alpha + n beta`.
    fn message_seconds(&self, bytes: f64) -> f64 {
        self.link.alpha_s + bytes * self.link.beta_s_per_byte
    }
}

/// Which wire a group of ranks uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireKind {
    /// Inside one node (NVLink; shared memory on CPUs).
    Intra,
    /// Between nodes (InfiniBand, Ethernet; TCP on CPUs).
    Inter,
    /// The group is one rank: nothing crosses a wire.
    None,
}

/// Everything a plan needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    /// The model's shape.
    pub model: Preset,
    /// Sequences per training step, `B`.
    pub global_batch: u64,
    /// Devices, `N`.
    pub gpus: u64,
    /// Devices per node, `G`.
    pub gpus_per_node: u64,
    /// Memory per device, bytes; `None`: no limit.
    pub memory_bytes: Option<f64>,
    /// Sustained matrix-product rate of one device, FLOP/s.
    pub flops_per_s: f64,
    /// The wire inside a node.
    pub intra: Wire,
    /// The wire between nodes.
    pub inter: Wire,
    /// Let the tensor-parallel group leave the node (Megatron's rule keeps it in).
    pub allow_tp_across_nodes: bool,
    /// Bytes per activation, weight and gradient element (2: fp16/bf16).
    pub dtype_bytes: u64,
    /// Sequence parallelism (Korthikanti et al.): less activation memory, the same traffic.
    pub sequence_parallel: bool,
    /// Activation recomputation.
    pub recompute: Recompute,
    /// Adam state sharded over the data-parallel ranks (Megatron's distributed optimizer, ZeRO-1).
    pub distributed_optimizer: bool,
    /// Largest `v` tried for interleaved 1F1B.
    pub max_chunks: u64,
}

impl PlanInput {
    /// The defaults of a plan for `model` on `gpus` devices, `gpus_per_node` per node.
    pub fn new(
        model: Preset,
        global_batch: u64,
        gpus: u64,
        gpus_per_node: u64,
        flops_per_s: f64,
        intra: Wire,
        inter: Wire,
    ) -> Self {
        PlanInput {
            model,
            global_batch,
            gpus,
            gpus_per_node,
            memory_bytes: None,
            flops_per_s,
            intra,
            inter,
            allow_tp_across_nodes: false,
            dtype_bytes: 2,
            sequence_parallel: false,
            recompute: Recompute::None,
            distributed_optimizer: false,
            max_chunks: 8,
        }
    }
}

/// Why a plan cannot be made at all (as opposed to a layout that loses).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error("the compute rate must be a positive number of FLOP/s (got {0})")]
    BadCompute(f64),
    #[error("the memory per device must be a positive number of bytes (got {0})")]
    BadMemory(f64),
    #[error("{which} wire: bandwidth and latency must be finite, bandwidth above 0")]
    BadWire { which: &'static str },
    #[error("{gpus} devices is not a whole number of {per_node}-device nodes")]
    PartialNode { gpus: u64, per_node: u64 },
}

/// One layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// Data-parallel degree.
    pub dp: u64,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline stages (ranks of one pipeline).
    pub pp: u64,
    /// `none` (one stage), `gpipe`, `1f1b`, `interleaved`, `zb-h1`.
    pub schedule: String,
    /// Chunks per pipeline rank (`v`; 1 but for interleaved).
    pub chunks: u64,
    /// Sequences per microbatch, `b`.
    pub micro_batch: u64,
    /// Microbatches per step per pipeline, `M`.
    pub microbatches: u64,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dp={} tp={} pp={}", self.dp, self.tp, self.pp)?;
        if self.schedule.is_empty() {
            return Ok(());
        }
        write!(f, " {}", self.schedule)?;
        if self.chunks > 1 {
            write!(f, " v={}", self.chunks)?;
        }
        write!(f, " b={} M={}", self.micro_batch, self.microbatches)
    }
}

/// Memory of one device, bytes.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    /// Parameters held by the device (its stage's layers and the non-layer
    /// parameters, over `t`).
    pub params: f64,
    /// Weights, gradients and optimizer state.
    pub states_bytes: f64,
    /// Activations of the in-flight microbatches on the busiest rank.
    pub activation_bytes: f64,
    /// Microbatch-chunks whose activations the busiest rank holds at once.
    pub in_flight: u64,
}

impl Memory {
    /// Everything.
    pub fn total(&self) -> f64 {
        self.states_bytes + self.activation_bytes
    }
}

/// A layout that fits, costed. The four parts add up to the step.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Costed {
    pub layout: Layout,
    /// One training step, seconds.
    pub step_s: f64,
    /// The busiest rank's matrix products.
    pub compute_s: f64,
    /// The busiest rank's tensor-parallel collectives.
    pub tp_comm_s: f64,
    /// The busiest rank's idle time in the pipeline (bubble and the waits
    /// for point-to-point messages).
    pub bubble_s: f64,
    /// The data-parallel gradient all-reduce.
    pub dp_comm_s: f64,
    /// Tokens of the global batch per second.
    pub tokens_per_s: f64,
    /// One decode step through this layout (one new token for each of `b`
    /// sequences with a full context): compute at the measured rate (a
    /// lower bound: decode reads every weight and is often memory-bound),
    /// tensor-parallel all-reduces and the pipeline's hops.
    pub token_latency_s: f64,
    pub memory: Memory,
    pub tp_wire: WireKind,
    pub dp_wire: WireKind,
    pub pp_wire: WireKind,
    /// Whether the bubble came from a simulation at fewer microbatches,
    /// extended linearly (see [`pipeline_makespan`]).
    pub extrapolated: bool,
}

impl Costed {
    /// The largest overhead (what this layout loses to).
    pub fn dominant_overhead(&self) -> Loss {
        let parts = [
            (Loss::Bubble, self.bubble_s),
            (Loss::TpComm, self.tp_comm_s),
            (Loss::DpComm, self.dp_comm_s),
        ];
        parts
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(Loss::Bubble, |p| p.0)
    }
}

/// Why a layout is not the best one.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Its pipeline bubble is its largest overhead.
    Bubble,
    /// Its tensor-parallel communication is.
    TpComm,
    /// Its data-parallel gradient all-reduce is.
    DpComm,
}

impl Loss {
    /// Words for tables.
    pub fn describe(self) -> &'static str {
        match self {
            Loss::Bubble => "bubble dominates",
            Loss::TpComm => "communication dominates (tensor parallel)",
            Loss::DpComm => "communication dominates (data-parallel gradients)",
        }
    }
}

/// Why a layout cannot run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Rejection {
    /// The tensor-parallel group would leave the node.
    TpAcrossNodes { tp: u64, gpus_per_node: u64 },
    /// Megatron-LM's divisibility rules ([`Preset::check_split`]).
    InvalidSplit { rule: String },
    /// The global batch does not split over the data-parallel ranks.
    Batch { global_batch: u64, dp: u64 },
    /// It needs more memory than a device has.
    Memory { needs_bytes: f64, have_bytes: f64 },
}

impl Rejection {
    /// The group a rejection is counted in.
    pub fn group(&self) -> &'static str {
        match self {
            Rejection::TpAcrossNodes { .. } => "tensor parallel across nodes",
            Rejection::InvalidSplit { .. } => "invalid split (Megatron's rule)",
            Rejection::Batch { .. } => "global batch does not divide",
            Rejection::Memory { .. } => "does not fit in memory",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::TpAcrossNodes { tp, gpus_per_node } => write!(
                f,
                "tensor-parallel degree {tp} does not fit in a node of {gpus_per_node} devices (--allow-tp-across-nodes)"
            ),
            Rejection::InvalidSplit { rule } => f.write_str(rule),
            Rejection::Batch { global_batch, dp } => write!(
                f,
                "global batch {global_batch} is not divisible by the data-parallel degree {dp}"
            ),
            Rejection::Memory {
                needs_bytes,
                have_bytes,
            } => write!(
                f,
                "needs {} of {} ({:+.1}%)",
                binary_bytes(*needs_bytes),
                binary_bytes(*have_bytes),
                (needs_bytes / have_bytes - 1.0) * 100.0
            ),
        }
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Bytes in GiB, or MiB below one GiB (the reasons are read by people).
fn binary_bytes(b: f64) -> String {
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    }
}

/// A layout that cannot run, and why. Structural rejections (tensor
/// parallel across nodes, splits, batch) are counted once per
/// `(dp, tp, pp)` (or per interleaved `v`), with an empty schedule; memory
/// rejections once per full layout.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rejected {
    pub layout: Layout,
    pub reason: Rejection,
    /// The memory the layout needs, when it got that far.
    pub memory: Option<Memory>,
}

/// The outcome: the layouts that fit, fastest first, and the others.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// Every layout that fits, by tokens per second, fastest first.
    pub ranked: Vec<Costed>,
    /// Every layout that cannot run.
    pub rejected: Vec<Rejected>,
}

/// One line of "why the others lose".
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossGroup {
    /// The group's name (a [`Loss::describe`] or [`Rejection::group`]).
    pub group: String,
    /// How many layouts (or splits) are in it.
    pub count: usize,
    /// Its most telling member: the fastest loser, the closest to fitting,
    /// the first split rule broken.
    pub example: Layout,
    /// What the example shows (its overhead's share of the step, how far
    /// over memory it is, the rule it breaks).
    pub detail: String,
}

impl Plan {
    /// The reasons the layouts other than the best lose, grouped: the
    /// fitting ones by their largest overhead (with the fastest of each
    /// group), then the rejected ones by reason (with the one closest to
    /// fitting in memory, or the first rule broken).
    pub fn losses(&self) -> Vec<LossGroup> {
        let mut out = Vec::new();
        let mut by_loss: Vec<(Loss, Vec<&Costed>)> = Vec::new();
        for c in self.ranked.iter().skip(1) {
            let l = c.dominant_overhead();
            match by_loss.iter_mut().find(|(k, _)| *k == l) {
                Some((_, v)) => v.push(c),
                None => by_loss.push((l, vec![c])),
            }
        }
        by_loss.sort_by_key(|(l, _)| *l);
        for (loss, members) in by_loss {
            let Some(first) = members.first() else {
                continue;
            };
            let part = match loss {
                Loss::Bubble => first.bubble_s,
                Loss::TpComm => first.tp_comm_s,
                Loss::DpComm => first.dp_comm_s,
            };
            let best = self.ranked.first().map_or(f64::NAN, |b| b.tokens_per_s);
            out.push(LossGroup {
                group: loss.describe().into(),
                count: members.len(),
                example: first.layout.clone(),
                detail: format!(
                    "{:.1}% of its step; {:.1}% of the best layout's tokens/s",
                    part / first.step_s * 100.0,
                    first.tokens_per_s / best * 100.0
                ),
            });
        }
        let mut groups: Vec<(&'static str, Vec<&Rejected>)> = Vec::new();
        for r in &self.rejected {
            let g = r.reason.group();
            match groups.iter_mut().find(|(k, _)| *k == g) {
                Some((_, v)) => v.push(r),
                None => groups.push((g, vec![r])),
            }
        }
        for (group, members) in groups {
            let example = members
                .iter()
                .min_by(|a, b| excess(a).total_cmp(&excess(b)))
                .copied();
            if let Some(e) = example {
                out.push(LossGroup {
                    group: group.into(),
                    count: members.len(),
                    example: e.layout.clone(),
                    detail: if matches!(e.reason, Rejection::Memory { .. }) {
                        format!("closest: {}", e.reason)
                    } else {
                        e.reason.to_string()
                    },
                });
            }
        }
        out
    }
}

/// How far over memory a rejected layout is (0 for other reasons, so the
/// first one stays the example).
fn excess(r: &Rejected) -> f64 {
    match r.reason {
        Rejection::Memory {
            needs_bytes,
            have_bytes,
        } => needs_bytes / have_bytes,
        _ => 0.0,
    }
}

/// The divisors of `n`, smallest first (`n` up to about 1e12 in well under a millisecond).
pub fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1u64;
    while i.saturating_mul(i) <= n {
        if n.is_multiple_of(i) {
            small.push(i);
            if i != n / i {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Which wire a group of `span` consecutive ranks uses on nodes of `per_node`.
pub fn group_wire(group_size: u64, span: u64, per_node: u64) -> WireKind {
    if group_size <= 1 {
        WireKind::None
    } else if span <= per_node && per_node.is_multiple_of(span) {
        WireKind::Intra
    } else {
        WireKind::Inter
    }
}

/// Megatron's order places tensor ranks innermost, then data, then pipeline.
fn wires_of(l: &Layout, per_node: u64) -> (WireKind, WireKind, WireKind) {
    let tp = group_wire(l.tp, l.tp, per_node);
    let dp = group_wire(l.dp, l.tp.saturating_mul(l.dp), per_node);
    let pp = group_wire(
        l.pp,
        l.tp.saturating_mul(l.dp).saturating_mul(l.pp),
        per_node,
    );
    (tp, dp, pp)
}

/// The schedule kind and closed-form name of a layout's schedule.
fn kind_of(schedule: &str) -> Option<(ScheduleKind, BubbleSchedule)> {
    Some(match schedule {
        "none" | "1f1b" => (ScheduleKind::OneFOneB, BubbleSchedule::OneFOneB),
        "gpipe" => (ScheduleKind::GPipe, BubbleSchedule::GPipe),
        "zb-h1" => (ScheduleKind::ZbH1, BubbleSchedule::ZbH1),
        "interleaved" => (
            ScheduleKind::Interleaved,
            BubbleSchedule::Interleaved { chunks: 2 },
        ),
        _ => return None,
    })
}

/// Plans: enumerates every layout, rejects those that cannot run, costs the
/// others and ranks them by tokens per second.
pub fn plan(input: &PlanInput) -> Result<Plan, PlanError> {
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
    Ok(Plan { ranked, rejected })
}

fn check_input(input: &PlanInput) -> Result<(), PlanError> {
    let m = &input.model;
    for (what, v) in [
        ("layers", m.layers),
        ("hidden size", m.hidden),
        ("attention heads", m.heads),
        ("key/value heads", m.kv_heads),
        ("MLP inner size", m.ffn),
        ("sequence length", m.seq),
        ("global batch", input.global_batch),
        ("devices", input.gpus),
        ("devices per node", input.gpus_per_node),
        ("bytes per element", input.dtype_bytes),
    ] {
        if v == 0 {
            return Err(PlanError::Zero { what });
        }
    }
    if !(input.flops_per_s.is_finite() && input.flops_per_s > 0.0) {
        return Err(PlanError::BadCompute(input.flops_per_s));
    }
    if let Some(mem) = input.memory_bytes {
        if !(mem.is_finite() && mem > 0.0) {
            return Err(PlanError::BadMemory(mem));
        }
    }
    for (which, w) in [("intra-node", &input.intra), ("inter-node", &input.inter)] {
        let l = &w.link;
        let ok = l.alpha_s.is_finite()
            && l.alpha_s >= 0.0
            && l.beta_s_per_byte.is_finite()
            && l.beta_s_per_byte > 0.0
            && l.gamma_s_per_byte.is_finite()
            && l.gamma_s_per_byte >= 0.0;
        if !ok {
            return Err(PlanError::BadWire { which });
        }
    }
    if input.gpus > input.gpus_per_node && !input.gpus.is_multiple_of(input.gpus_per_node) {
        return Err(PlanError::PartialNode {
            gpus: input.gpus,
            per_node: input.gpus_per_node,
        });
    }
    Ok(())
}

/// The schedules a pipeline of `pp` stages with `micro` microbatches can
/// run: one stage has no schedule to choose (`none`); otherwise GPipe,
/// 1F1B, ZB-H1 and interleaved 1F1B with every `v` from 2 to
/// `max_chunks` that Megatron accepts (layers divisible by `pp v`,
/// microbatches a multiple of `pp`).
fn schedules(input: &PlanInput, pp: u64, micro: u64) -> Vec<(&'static str, u64)> {
    if pp == 1 {
        return vec![("none", 1)];
    }
    let mut out = vec![("gpipe", 1), ("1f1b", 1), ("zb-h1", 1)];
    if micro.is_multiple_of(pp) {
        for v in 2..=input.max_chunks {
            if input.model.check_split(1, pp, v).is_ok() {
                out.push(("interleaved", v));
            }
        }
    }
    out
}

/// Pipelines longer than this many microbatches are simulated at two
/// shorter lengths and extended linearly (see [`pipeline_makespan`]).
const SIMULATED_STEADY_GROUPS: u64 = 3;

/// The makespan of `kind` on `stages` ranks with `micro` microbatches and
/// `chunks` per rank. A pipeline in its steady state adds the same time per
/// microbatch, so beyond `3 x stages` microbatches the simulator runs at `2S`
/// and `3S` and the line through them is extended to `micro` (exact for the
/// schedules here: see the test `extrapolation_matches_full_simulation`).
/// Returns the makespan and whether it was extended.
pub fn pipeline_makespan(
    kind: ScheduleKind,
    stages: u64,
    micro: u64,
    chunks: u64,
    costs: &SimCosts,
) -> Option<(f64, bool)> {
    let run = |m: u64| -> Option<f64> {
        let s = generate(
            kind,
            usize::try_from(stages).ok()?,
            usize::try_from(m).ok()?,
            usize::try_from(chunks).ok()?,
        )
        .ok()?;
        simulate(&s, costs).ok().map(|r| r.makespan)
    };
    let cap = SIMULATED_STEADY_GROUPS.saturating_mul(stages).max(4);
    if micro <= cap {
        return run(micro).map(|t| (t, false));
    }
    let (m1, m2) = (cap - stages.max(1), cap);
    let (t1, t2) = (run(m1)?, run(m2)?);
    let slope = (t2 - t1) / (m2 - m1) as f64;
    Some((t2 + slope * (micro - m2) as f64, true))
}

/// Per-layer, per-microbatch costs of a layout, seconds.
struct LayerCosts {
    /// Forward matrix products.
    compute_f: f64,
    /// Extra forward work the backward repeats (recomputation).
    recompute: f64,
    /// Forward tensor-parallel collectives (2 all-reduces).
    tp_f: f64,
    /// Backward tensor-parallel collectives (2, plus the forward's again
    /// with full recomputation).
    tp_b: f64,
}

/// Every input of one simulation: schedule, S, M, v and the bits of the
/// first and last stage's costs and of the link (the middle stages equal the first).
type SimKey = (String, u64, u64, u64, [u64; 7]);

struct Planner<'a> {
    input: &'a PlanInput,
    /// Peak in-flight microbatch-chunks on the busiest rank, by (schedule, S, M, v).
    peaks: HashMap<(String, u64, u64, u64), u64>,
    /// Simulated makespans by every input of the simulation (bits of the floats).
    makespans: HashMap<SimKey, Option<(f64, bool)>>,
}

impl Planner<'_> {
    fn traffic(&self, l: &Layout, mode: TpMode) -> TpTraffic {
        let m = &self.input.model;
        TpTraffic {
            tp: l.tp,
            batch: l.micro_batch,
            seq: m.seq,
            hidden: m.hidden,
            dtype_bytes: self.input.dtype_bytes,
            mode,
            sequence_parallel: self.input.sequence_parallel,
        }
    }

    fn wire(&self, kind: WireKind) -> &Wire {
        match kind {
            WireKind::Inter => &self.input.inter,
            _ => &self.input.intra,
        }
    }

    /// Seconds of one layer's tensor-parallel collectives in one pass.
    fn tp_pass_seconds(&self, traffic: &TpTraffic, wire: &Wire) -> f64 {
        // The forward of `traffic.mode` (2 calls per pass, or 2 + 2 with
        // sequence parallelism): TpTraffic's list, timed with textbook forms.
        traffic
            .collectives()
            .iter()
            .map(|&(c, calls)| calls as f64 * wire.seconds(c, traffic.tp, traffic.bytes_per_call()))
            .sum()
    }

    fn layer_costs(&self, l: &Layout, tp_wire: WireKind) -> LayerCosts {
        let m = &self.input.model;
        let flops = self.input.flops_per_s;
        let t = l.tp as f64;
        let compute_f = m.forward_flops_per_layer(l.micro_batch, m.seq) / t / flops;
        let one_pass = self.tp_pass_seconds(&self.traffic(l, TpMode::Prefill), self.wire(tp_wire));
        let (recompute, tp_extra) = match self.input.recompute {
            Recompute::None => (0.0, 0.0),
            // The attention scores and their weighted sum: 4 b s^2 h.
            Recompute::Selective => {
                let (b, s, h) = (l.micro_batch as f64, m.seq as f64, m.hidden as f64);
                (4.0 * b * s * s * h / t / flops, 0.0)
            }
            Recompute::Full => (compute_f, one_pass),
        };
        LayerCosts {
            compute_f,
            recompute,
            tp_f: one_pass,
            tp_b: one_pass + tp_extra,
        }
    }

    /// Parameters on the busiest device.
    fn params_per_device(&self, l: &Layout) -> f64 {
        let m = &self.input.model;
        let layers = (m.layers / l.pp.max(1)) as f64;
        (layers * m.params_per_layer() as f64 + m.embedding_params() as f64) / l.tp as f64
    }

    fn peak(&mut self, l: &Layout) -> u64 {
        let key = (l.schedule.clone(), l.pp, l.microbatches, l.chunks);
        if let Some(&p) = self.peaks.get(&key) {
            return p;
        }
        let peak = match kind_of(&l.schedule) {
            Some((ScheduleKind::Interleaved, _)) => {
                // Reached in the warm-up: a pipeline of 3S microbatches has it.
                let m = l.microbatches.min(3 * l.pp);
                generate(
                    ScheduleKind::Interleaved,
                    l.pp as usize,
                    m as usize,
                    l.chunks as usize,
                )
                .map(|s| peak_in_flight(&s).into_iter().max().unwrap_or(0) as u64)
                .unwrap_or(l.microbatches * l.chunks)
            }
            Some((_, closed)) => {
                peak_activations(closed, l.pp, l.microbatches).unwrap_or(l.microbatches)
            }
            None => l.microbatches,
        };
        self.peaks.insert(key, peak);
        peak
    }

    fn memory(&mut self, l: &Layout) -> Memory {
        let input = self.input;
        let m = &input.model;
        let params = self.params_per_device(l);
        let per_param = if input.distributed_optimizer {
            // fp16 weights and gradients kept; the 12 bytes of fp32 master
            // weights and Adam moments sharded over the data-parallel ranks.
            4.0 + 12.0 / l.dp as f64
        } else {
            MIXED_PRECISION_ADAM_BYTES_PER_PARAM as f64
        };
        let in_flight = self.peak(l);
        let layers_per_chunk = (m.layers / (l.pp * l.chunks).max(1)) as f64;
        let per_layer = activation_bytes_per_layer(
            m.seq,
            l.micro_batch,
            m.hidden,
            m.heads,
            l.tp,
            input.sequence_parallel,
            input.recompute,
        )
        .unwrap_or(f64::INFINITY);
        Memory {
            params,
            states_bytes: params * per_param,
            activation_bytes: in_flight as f64 * layers_per_chunk * per_layer,
            in_flight,
        }
    }

    fn cost(&mut self, l: Layout, memory: Memory) -> Costed {
        let input = self.input;
        let m = &input.model;
        let (tp_wire, dp_wire, pp_wire) = wires_of(&l, input.gpus_per_node);
        let lc = self.layer_costs(&l, tp_wire);
        let t = l.tp as f64;
        let stages = l.pp * l.chunks;
        let per_stage = (m.layers / stages.max(1)) as f64;
        // The logits (and their backward) on the last stage, split over t
        // as Megatron splits the vocabulary.
        let logits_f = m.logit_flops(l.micro_batch, m.seq) / t / input.flops_per_s;
        let mut costs: Vec<StageCosts> = (0..stages)
            .map(|_| {
                StageCosts::split(
                    per_stage * (lc.compute_f + lc.tp_f),
                    per_stage * (lc.compute_f + lc.recompute + lc.tp_b),
                    per_stage * lc.compute_f,
                )
            })
            .collect();
        if let Some(last) = costs.last_mut() {
            *last = StageCosts::split(last.f + logits_f, last.i + logits_f, last.w + logits_f);
        }
        // Per rank, per microbatch: compute and tensor-parallel parts of its stages.
        let rank_parts = |r: u64| -> (f64, f64) {
            let mut compute = 0.0;
            let mut comm = 0.0;
            for c in 0..l.chunks {
                let s = c * l.pp + r;
                let logits = if s + 1 == stages { 3.0 * logits_f } else { 0.0 };
                compute += per_stage * (3.0 * lc.compute_f + lc.recompute) + logits;
                comm += per_stage * (lc.tp_f + lc.tp_b);
            }
            (compute, comm)
        };
        let (compute_mb, comm_mb) = (0..l.pp)
            .map(rank_parts)
            .max_by(|a, b| (a.0 + a.1).total_cmp(&(b.0 + b.1)))
            .unwrap_or((0.0, 0.0));
        let micro = l.microbatches as f64;
        let busy = micro * (compute_mb + comm_mb);
        let pp_link = self.wire(pp_wire).link;
        // In floats: absurd flags must not overflow into a panic.
        let message =
            l.micro_batch as f64 * m.seq as f64 * m.hidden as f64 * input.dtype_bytes as f64 / t;
        let sim = SimCosts {
            stages: costs,
            latency: if pp_wire == WireKind::None {
                0.0
            } else {
                pp_link.alpha_s
            },
            bandwidth: if pp_wire == WireKind::None || pp_link.beta_s_per_byte <= 0.0 {
                f64::INFINITY
            } else {
                1.0 / pp_link.beta_s_per_byte
            },
            message_bytes: message,
        };
        let (makespan, extrapolated) = self.makespan(&l, &sim).unwrap_or((busy, false));
        let bubble = (makespan - busy).max(0.0);
        let grad_bytes = (memory.params * input.dtype_bytes as f64) as u64;
        let dp_comm = self
            .wire(dp_wire)
            .seconds(Collective::AllReduce, l.dp, grad_bytes);
        let step = makespan.max(busy) + dp_comm;
        let tokens = input.global_batch as f64 * m.seq as f64;
        let token_latency = self.token_latency(&l, tp_wire, pp_wire);
        Costed {
            step_s: step,
            compute_s: micro * compute_mb,
            tp_comm_s: micro * comm_mb,
            bubble_s: bubble,
            dp_comm_s: dp_comm,
            tokens_per_s: tokens / step,
            token_latency_s: token_latency,
            memory,
            tp_wire,
            dp_wire,
            pp_wire,
            extrapolated,
            layout: l,
        }
    }

    fn makespan(&mut self, l: &Layout, sim: &SimCosts) -> Option<(f64, bool)> {
        let kind = kind_of(&l.schedule)?.0;
        let (first, last) = (sim.stages.first()?, sim.stages.last()?);
        let bits = [
            first.f.to_bits(),
            first.i.to_bits(),
            first.w.to_bits(),
            last.f.to_bits(),
            sim.latency.to_bits(),
            sim.bandwidth.to_bits(),
            sim.message_bytes.to_bits(),
        ];
        let key = (l.schedule.clone(), l.pp, l.microbatches, l.chunks, bits);
        if let Some(r) = self.makespans.get(&key) {
            return *r;
        }
        let r = pipeline_makespan(kind, l.pp, l.microbatches, l.chunks, sim);
        self.makespans.insert(key, r);
        r
    }

    /// One decode step: each layer's forward for `b` new tokens attending
    /// to `s` cached ones (`2 b W + 4 b s h` FLOPs), its two all-reduces of
    /// `b h` elements, the logits, and `pp - 1` hops of `b h / t` elements.
    fn token_latency(&self, l: &Layout, tp_wire: WireKind, pp_wire: WireKind) -> f64 {
        let input = self.input;
        let m = &input.model;
        let (b, s, h, t) = (
            l.micro_batch as f64,
            m.seq as f64,
            m.hidden as f64,
            l.tp as f64,
        );
        let flops_layer = 2.0 * b * m.matmul_params_per_layer() as f64 + 4.0 * b * s * h;
        let compute = (m.layers as f64 * flops_layer + m.logit_flops(l.micro_batch, 1))
            / t
            / input.flops_per_s;
        let comm = m.layers as f64
            * self.tp_pass_seconds(&self.traffic(l, TpMode::Decode), self.wire(tp_wire));
        let hops = if pp_wire == WireKind::None {
            0.0
        } else {
            (l.pp - 1) as f64
                * self
                    .wire(pp_wire)
                    .message_seconds(b * h * input.dtype_bytes as f64 / t)
        };
        compute + comm + hops
    }
}

#[cfg(test)]
mod tests;
