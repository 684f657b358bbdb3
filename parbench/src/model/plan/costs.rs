//! The cost of one layout: its memory per device, and its training step
//! (compute, tensor-parallel collectives, the simulated pipeline bubble,
//! the data-parallel all-reduce) and decode step.

use super::input::{PlanInput, Wire, WireKind};
use super::layouts::{kind_of, wires_of, Layout};
use crate::comm::Collective;
use crate::model::bubble::peak_activations;
use crate::model::footprint::{
    activation_bytes_per_layer, Recompute, MIXED_PRECISION_ADAM_BYTES_PER_PARAM,
};
use crate::model::sim::{simulate, SimCosts, StageCosts};
use crate::model::tensor_parallel::{TpMode, TpTraffic};
use crate::schedule::{generate, peak_in_flight, ScheduleKind};
use std::collections::HashMap;

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
pub(super) struct LayerCosts {
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
pub(super) type SimKey = (String, u64, u64, u64, [u64; 7]);

pub(super) struct Planner<'a> {
    pub(super) input: &'a PlanInput,
    /// Peak in-flight microbatch-chunks on the busiest rank, by (schedule, S, M, v).
    pub(super) peaks: HashMap<(String, u64, u64, u64), u64>,
    /// Simulated makespans by every input of the simulation (bits of the floats).
    pub(super) makespans: HashMap<SimKey, Option<(f64, bool)>>,
}

impl Planner<'_> {
    pub(super) fn traffic(&self, l: &Layout, mode: TpMode) -> TpTraffic {
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
            Some(kind) if kind.chunked() => {
                // Reached in the warm-up: a pipeline of 3S microbatches has it.
                let m = l.microbatches.min(3 * l.pp);
                generate(kind, l.pp as usize, m as usize, l.chunks as usize)
                    .map(|s| peak_in_flight(&s).into_iter().max().unwrap_or(0) as u64)
                    .unwrap_or(l.microbatches * l.chunks)
            }
            Some(kind) => peak_activations(kind.closed_form(l.chunks), l.pp, l.microbatches)
                .unwrap_or(l.microbatches),
            None => l.microbatches,
        };
        self.peaks.insert(key, peak);
        peak
    }

    pub(super) fn memory(&mut self, l: &Layout) -> Memory {
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

    pub(super) fn cost(&mut self, l: Layout, memory: Memory) -> Costed {
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
        let kind = kind_of(&l.schedule)?;
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
