//! The cost of one layout: its memory per device, and its training step
//! (compute, tensor-parallel collectives, the simulated pipeline bubble,
//! the data-parallel all-reduce) and decode step, as a
//! [`super::costed::Costed`].

use super::costed::{ComputeParts, Costed, Memory};
use super::given::{bucket_ready_times, overlapped_exposure};
use super::input::{PlanInput, Wire, WireKind};
use super::layouts::{cp_wire, group_wire, kind_of, wires_of, Layout};
use super::shard::Shard;
use crate::comm::algo::Algorithm;
use crate::comm::Collective;
use crate::model::alpha_beta::LinkParams;
use crate::model::bubble::peak_activations;
use crate::model::context::{self, CpExchange, CpTensors};
use crate::model::footprint::{activation_bytes_of, Recompute};
use crate::model::opcost::BlockSeconds;
use crate::model::precision;
use crate::model::presets::Arch;
use crate::model::sim::{simulate, SimCosts, StageCosts};
use crate::model::stack::{LAYER_KERNELS, UB_PIPELINE_SPLITS};
use crate::model::tensor_parallel::{TpMode, TpTraffic};
use crate::schedule::{generate, peak_in_flight, Placement, ScheduleKind};
use std::collections::HashMap;

/// How Transformer Engine's userbuffers overlap a collective with its GEMM.
#[derive(Clone, Copy, Debug)]
enum UbMethod {
    /// The all-gather in `t` steps around the ring, each beside the product
    /// of the chunk it just received (1 SM).
    RingExchange,
    /// The product in [`UB_PIPELINE_SPLITS`] chunks, each chunk's
    /// reduce-scatter beside the next chunk's product.
    Pipeline,
    /// The whole collective beside the whole product.
    Bulk,
}

impl UbMethod {
    /// What a collective of `comm` seconds beside a GEMM of `gemm` adds to
    /// the GEMM's time, on `t` ranks.
    fn exposed(self, comm: f64, gemm: f64, t: f64) -> f64 {
        match self {
            // Chunk k's product waits for chunk k's arrival: the last
            // product starts when the ring's last step lands.
            UbMethod::RingExchange => (comm + gemm / t.max(1.0)).max(gemm) - gemm,
            // Chunk i's reduce-scatter beside chunk i+1's product: the last
            // chunk's waits, or the chain of scatters outlasts the products.
            UbMethod::Pipeline => {
                let k = UB_PIPELINE_SPLITS;
                (gemm + comm / k).max(gemm / k + comm) - gemm
            }
            UbMethod::Bulk => (comm - gemm).max(0.0),
        }
    }
}

mod moe;

/// The stages rank `r` of layout `l` holds, by its schedule's placement
/// (looped: `r`, `r + pp`, ...; V: `r` and `2 pp - 1 - r`).
fn stages_of(l: &Layout, r: u64) -> impl Iterator<Item = usize> {
    let placement = kind_of(&l.schedule).map_or(Placement::Looped, |k| k.placement());
    let (pp, per_rank) = (l.pp as usize, l.chunks as usize);
    (0..pp.saturating_mul(per_rank))
        .filter(move |&s| placement.rank_of(s, pp, per_rank) == Some(r as usize))
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

/// One stage's work on one microbatch, seconds: compute by pass and its
/// tensor-parallel communication (exposed: Megatron's collectives sit on
/// the critical path).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct StageWork {
    /// Forward compute.
    f: f64,
    /// Input-gradient compute, with what recomputation repeats.
    i: f64,
    /// Weight-gradient compute.
    w: f64,
    /// Forward communication (with the recomputed forward's, when it is
    /// repeated, counted in `comm_b`).
    comm_f: f64,
    comm_b: f64,
    /// Context-parallel exchanges of K and V the passes wait for.
    cp_f: f64,
    cp_b: f64,
    /// Sharded data-parallel collectives the passes wait for (ZeRO-2/3),
    /// forward and backward, and their whole time, hidden or not.
    dp_f: f64,
    dp_b: f64,
    dp_all: f64,
    /// Of the communication: the expert-parallel all-to-all.
    ep: f64,
    /// Of the compute: by kind, for the breakdown.
    parts: ComputeParts,
}

impl StageWork {
    fn compute(&self) -> f64 {
        self.f + self.i + self.w
    }

    fn comm(&self) -> f64 {
        self.comm_f + self.comm_b
    }

    fn cp(&self) -> f64 {
        self.cp_f + self.cp_b
    }

    fn sim(&self) -> StageCosts {
        StageCosts::split(
            self.f + self.comm_f + self.cp_f + self.dp_f,
            self.i + self.comm_b + self.cp_b + self.dp_b,
            self.w,
        )
    }

    fn add(&mut self, o: &StageWork) {
        self.f += o.f;
        self.i += o.i;
        self.w += o.w;
        self.comm_f += o.comm_f;
        self.comm_b += o.comm_b;
        self.cp_f += o.cp_f;
        self.cp_b += o.cp_b;
        self.dp_f += o.dp_f;
        self.dp_b += o.dp_b;
        self.dp_all += o.dp_all;
        self.ep += o.ep;
        self.parts.add(&o.parts, 1.0);
    }
}

/// Every input of one simulation: schedule, S, M, v and the bits of every
/// stage's costs and of the link.
pub(super) type SimKey = (String, u64, u64, u64, Vec<u64>);

pub(super) struct Planner<'a> {
    pub(super) input: &'a PlanInput,
    /// Peak in-flight microbatch-chunks on each rank, by (schedule, S, M, v).
    pub(super) peaks: HashMap<(String, u64, u64, u64), Vec<u64>>,
    /// Simulated makespans by every input of the simulation (bits of the floats).
    pub(super) makespans: HashMap<SimKey, Option<(f64, bool)>>,
}

impl Planner<'_> {
    pub(super) fn traffic(&self, l: &Layout, mode: TpMode) -> TpTraffic {
        let m = &self.input.model;
        TpTraffic {
            tp: l.tp,
            batch: l.micro_batch,
            seq: self.local_seq(l),
            hidden: m.hidden,
            dtype_bytes: self.input.dtype_bytes,
            mode,
            sequence_parallel: self.input.sequence_parallel,
        }
    }

    /// Tokens of a sequence one rank holds: `s / cp`.
    fn local_seq(&self, l: &Layout) -> u64 {
        self.input.model.seq / l.cp.max(1)
    }

    /// One layer's context-parallel exchange on one microbatch, given its
    /// attention seconds on the rank (forward, backward), on the group's
    /// wire: point-to-point messages to the ring's next rank (over NVLink,
    /// or each GPU's own NIC across nodes), collectives over the group.
    fn cp_exchange(&self, l: &Layout, attention: (f64, f64)) -> CpExchange {
        let input = self.input;
        let m = &input.model;
        let Some(method) = input.step.cp_comm.filter(|_| l.cp > 1) else {
            return CpExchange::default();
        };
        let tensors = CpTensors::of(m, l.micro_batch, l.cp, l.tp, input.dtype_bytes);
        let kind = cp_wire(l, input.gpus_per_node);
        let p2p = self.wire(kind);
        let group = self.group_link(l.cp, l.tp);
        context::exchange(
            method,
            l.cp,
            tensors,
            attention,
            |bytes| p2p.message_seconds(bytes),
            |c, bytes| group.seconds(c, l.cp, bytes as u64),
        )
    }

    fn wire(&self, kind: WireKind) -> &Wire {
        match kind {
            WireKind::Inter => &self.input.inter,
            _ => &self.input.intra,
        }
    }

    /// The wire of a group of `size` ranks `stride` apart (a data-parallel
    /// group: `tp` apart). Across nodes with rails, NCCL's rings run one
    /// per NIC: a group with `k` members in each node crosses over `k`
    /// NICs at once, so its bus bandwidth is `k` times a rail's, up to
    /// NVLink's.
    fn group_link(&self, size: u64, stride: u64) -> Wire {
        let input = self.input;
        let per_node = input.gpus_per_node;
        let kind = group_wire(size, size.saturating_mul(stride), per_node);
        if kind != WireKind::Inter || !input.rails {
            return self.wire(kind).clone();
        }
        let k = (per_node / stride.max(1)).clamp(1, size.max(1));
        let rails = input.inter.link.bandwidth_gbps() * k as f64;
        let gbps = rails.min(input.intra.link.bandwidth_gbps());
        Wire {
            link: LinkParams::from_gbps_us(gbps, input.inter.link.alpha_us()),
            algo: input.inter.algo.clone(),
        }
    }

    /// One layer's sharded data-parallel collectives on one microbatch
    /// (ZeRO-2: the reduce-scatter of its gradients; ZeRO-3: also the
    /// all-gathers of its parameters before its forward and its
    /// backward), each hidden behind a layer's compute where it can be:
    /// the next layer's gather runs during the current layer's forward or
    /// backward, a layer's reduce-scatter during the next layer's backward.
    /// Returns (exposed in the forward, exposed in the backward, the
    /// collectives' whole time), per layer; [`Self::pass_edges`] adds what
    /// no layer hides at a pass's ends.
    fn shard_layer(&self, l: &Layout, layer: &StageWork) -> (f64, f64, f64) {
        let (ag, rs) = self.shard_calls(l);
        let fwd = layer.f + layer.comm_f;
        let bwd = layer.i + layer.w + layer.comm_b;
        match l.shard {
            Shard::Zero3 => ((ag - fwd).max(0.0), (ag + rs - bwd).max(0.0), 2.0 * ag + rs),
            Shard::Zero2 => (0.0, (rs - bwd).max(0.0), rs),
            Shard::None | Shard::Zero1 => (0.0, 0.0, 0.0),
        }
    }

    /// One layer's all-gather and reduce-scatter over the sharding group.
    fn shard_calls(&self, l: &Layout) -> (f64, f64) {
        let group = l.shard_group.max(1);
        let params = self.layer_params(l);
        let gather = (params * self.input.dtype_bytes as f64) as u64;
        let scatter = (params * self.input.step.grad_bytes as f64) as u64;
        let w = self.group_link(group, l.tp);
        (
            w.seconds(Collective::AllGather, group, gather),
            w.seconds(Collective::ReduceScatter, group, scatter),
        )
    }

    /// What a pass over a stage exposes at its ends: the first layer's
    /// gather (nothing earlier to hide behind) and the last layer's
    /// reduce-scatter (nothing later); forward and backward.
    fn pass_edges(&self, l: &Layout) -> (f64, f64) {
        let (ag, rs) = self.shard_calls(l);
        match l.shard {
            Shard::Zero3 => (ag, ag + rs),
            Shard::Zero2 => (0.0, rs),
            Shard::None | Shard::Zero1 => (0.0, 0.0),
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

    /// A pass's tensor-parallel collectives overlapped with the GEMMs
    /// beside them, as Transformer Engine's userbuffers run them with
    /// `--tp-comm-overlap`. Returns what stays exposed and what the GEMMs
    /// lose to the SMs the communication holds while they overlap. (0, 0)
    /// without the overlap. With sequence parallelism and the four linear
    /// layers, each collective runs beside its own GEMM ([`ub_pairs`]);
    /// otherwise beside the pass's GEMMs at once, the last chunk's
    /// reduce-scatter exposed, `share` of the block's collectives
    /// ([`attention_collectives_share`]).
    fn tp_overlap(
        &self,
        l: &Layout,
        tp_wire: WireKind,
        blk: &BlockSeconds,
        forward: bool,
        share: f64,
    ) -> (f64, f64) {
        let input = self.input;
        let (Some(ops), true) = (&input.ops, input.step.tp_overlap) else {
            return (0.0, 0.0);
        };
        let traffic = self.traffic(l, TpMode::Prefill);
        let wire = self.wire(tp_wire);
        let sms = ops.sms.max(1) as f64;
        let (rs_sms, ag_sms) = input.step.tp_sms;
        // Compute beside a collective holding `held` of the SMs runs on the rest.
        let slowed = |hidden: f64, held_sms: f64| {
            let held = held_sms / sms;
            hidden * held / (1.0 - held).max(0.5)
        };
        if let (Some(linears), true) = (blk.linears, traffic.sequence_parallel) {
            let bytes = traffic.bytes_per_call();
            // FP8 all-gathers move the FP8 cast (`fp8_buf`); reduce-scatters bf16.
            let ag_bytes = if ops.fp8_gemm_flops.is_some() {
                bytes / 2
            } else {
                bytes
            };
            let ag = wire.seconds(Collective::AllGather, traffic.tp, ag_bytes);
            let rs = wire.seconds(Collective::ReduceScatter, traffic.tp, bytes);
            if ag + rs == 0.0 {
                return (0.0, 0.0);
            }
            let (mut exposed, mut lost) = (0.0, 0.0);
            let t = traffic.tp as f64;
            for (comm, gemm, method) in ub_pairs(&linears, forward, ag, rs) {
                let held = match method {
                    UbMethod::RingExchange => ag_sms,
                    UbMethod::Pipeline | UbMethod::Bulk => rs_sms,
                };
                exposed += method.exposed(comm, gemm, t);
                lost += slowed(comm.min(gemm), held);
            }
            return (exposed, lost);
        }
        let gemms = if forward {
            blk.gemm_forward
        } else {
            blk.gemm - blk.gemm_forward
        };
        let (mut gather, mut scatter) = (0.0, 0.0);
        for (c, calls) in traffic.collectives() {
            let t = share * calls as f64 * wire.seconds(c, traffic.tp, traffic.bytes_per_call());
            match c {
                Collective::AllGather => gather += t,
                // Without sequence parallelism the all-reduces are a
                // reduce-scatter and an all-gather each: priced as the scatter.
                _ => scatter += t,
            }
        }
        let comm = gather + scatter;
        if comm == 0.0 {
            return (0.0, 0.0);
        }
        let hidden = comm.min(gemms);
        let exposed = (comm - gemms).max(0.0) + scatter / l.tp.max(1) as f64;
        // The SMs held while each kind runs hidden, weighted by its time.
        let held = (scatter * rs_sms + gather * ag_sms) / comm;
        (exposed, slowed(hidden, held))
    }

    /// One layer on one microbatch (an MoE model's: the mean of its layers).
    fn layer_work(&self, l: &Layout, tp_wire: WireKind) -> StageWork {
        match self.input.model.moe {
            Some(_) => self.moe_layer_work(l, tp_wire),
            None => self.block_work(&self.input.model, l, tp_wire),
        }
    }

    /// One block of `m` on one microbatch.
    fn block_work(&self, m: &crate::model::Preset, l: &Layout, tp_wire: WireKind) -> StageWork {
        let input = self.input;
        let share = attention_collectives_share(m);
        let one_pass =
            share * self.tp_pass_seconds(&self.traffic(l, TpMode::Prefill), self.wire(tp_wire));
        let comm_recompute = if input.recompute == Recompute::Full {
            one_pass
        } else {
            0.0
        };
        if let Some(ops) = &input.ops {
            let (blk, attention) = context::block(
                ops,
                m,
                l.micro_batch,
                l.tp,
                l.cp,
                input.sequence_parallel,
                input.recompute,
            );
            let cp = self.cp_exchange(l, attention);
            // The ring's sends and receives are NCCL kernels beside the attention.
            let share = input.step.dp_sm_share;
            let cp_slowed = |hidden: f64| hidden * share / (1.0 - share).max(0.5);
            let (cp_slowed_f, cp_slowed_b) = (cp_slowed(cp.hidden_f), cp_slowed(cp.hidden_b));
            let (exposed_f, slowed_f) = self.tp_overlap(l, tp_wire, &blk, true, share);
            let (exposed_b, slowed_b) = self.tp_overlap(l, tp_wire, &blk, false, share);
            let (comm_f, comm_b) = if self.input.step.tp_overlap {
                (exposed_f, exposed_b + comm_recompute)
            } else {
                (one_pass, one_pass + comm_recompute)
            };
            // The host issues each pass's kernels; a pass shorter than
            // that waits for it.
            let launch = input.step.launch_s;
            let (kf, kb) = LAYER_KERNELS;
            let host_f = (kf * launch - blk.forward - slowed_f).max(0.0);
            let host_b = (kb * launch - blk.input_grad - blk.weight_grad - slowed_b).max(0.0);
            return StageWork {
                f: blk.forward + slowed_f + host_f + cp_slowed_f,
                i: blk.input_grad + blk.recompute + slowed_b + host_b + cp_slowed_b,
                w: blk.weight_grad,
                comm_f,
                comm_b,
                cp_f: cp.exposed_f,
                cp_b: cp.exposed_b,
                parts: ComputeParts {
                    gemm_s: blk.gemm + slowed_f + slowed_b,
                    attention_s: blk.attention + cp_slowed_f + cp_slowed_b,
                    memory_s: blk.memory + host_f + host_b,
                    logits_s: 0.0,
                },
                ..StageWork::default()
            };
        }
        let flops = input.flops_per_s;
        // A context rank computes 1/cp of everything (balanced attention).
        let t = l.tp as f64 * l.cp.max(1) as f64;
        let compute_f = m.forward_flops_per_layer(l.micro_batch, m.seq) / t / flops;
        let (b, s, h) = (l.micro_batch as f64, m.seq as f64, m.hidden as f64);
        // The attention scores and their weighted sum: 4 b s^2 h.
        let scores = 4.0 * b * s * s * h / t / flops;
        let recompute = match input.recompute {
            Recompute::None => 0.0,
            Recompute::Selective => scores,
            Recompute::Full => compute_f,
        };
        // Under the causal mask half of the scores, backward twice the forward.
        let cp = self.cp_exchange(l, (scores / 2.0, scores));
        StageWork {
            f: compute_f,
            i: compute_f + recompute,
            w: compute_f,
            comm_f: one_pass,
            comm_b: one_pass + comm_recompute,
            cp_f: cp.exposed_f,
            cp_b: cp.exposed_b,
            parts: ComputeParts {
                gemm_s: 3.0 * compute_f + recompute,
                ..ComputeParts::default()
            },
            ..StageWork::default()
        }
    }

    /// What the first stage (the embedding) and the last (the output layer
    /// and loss) add to a microbatch. With a device, the vocabulary-parallel
    /// embedding's output and the output layer's input gradient are each
    /// all-reduced over the tensor group, as Megatron-LM does.
    fn ends_work(&self, l: &Layout, tp_wire: WireKind) -> (StageWork, StageWork) {
        let input = self.input;
        let m = &input.model;
        let Some(ops) = &input.ops else {
            // The logits split over t as Megatron splits the vocabulary,
            // backward twice the forward.
            let lf =
                m.logit_flops(l.micro_batch, self.local_seq(l)) / l.tp as f64 / input.flops_per_s;
            let last = StageWork {
                f: lf,
                i: lf,
                w: lf,
                parts: ComputeParts {
                    logits_s: 3.0 * lf,
                    ..ComputeParts::default()
                },
                ..StageWork::default()
            };
            return (StageWork::default(), last);
        };
        let call = |l: &Layout| {
            let t = self.traffic(l, TpMode::Prefill);
            self.wire(tp_wire)
                .seconds(Collective::AllReduce, t.tp, t.bytes_per_call())
        };
        let reduce = call(l);
        let seq = self.local_seq(l);
        let (ef, eb) = ops.embedding(m, l.micro_batch, seq);
        let ew = ops.embedding_weight_grad(m, l.tp, input.step.main_grad_add_bytes());
        let (lf, lb) = ops.logits(m, l.micro_batch, seq, l.tp);
        let first = StageWork {
            f: ef,
            i: eb,
            w: ew,
            comm_f: reduce,
            parts: ComputeParts {
                logits_s: ef + eb + ew,
                ..ComputeParts::default()
            },
            ..StageWork::default()
        };
        let last = StageWork {
            f: lf,
            i: lb,
            comm_b: reduce,
            parts: ComputeParts {
                logits_s: lf + lb,
                ..ComputeParts::default()
            },
            ..StageWork::default()
        };
        (first, last)
    }

    /// The layers held by each rank (all its chunks), most first.
    fn busiest_rank_layers(&self, l: &Layout) -> u64 {
        let per_stage = l.stage_layers(self.input.model.layers);
        (0..l.pp)
            .map(|r| {
                stages_of(l, r)
                    .filter_map(|s| per_stage.get(s))
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Microbatch-chunks each rank holds at its peak: counted on the
    /// generated schedule (reached in the warm-up, so a pipeline of `3S`
    /// microbatches has it), or where a closed form says more (GPipe's
    /// `M`), that on every rank.
    fn peaks(&mut self, l: &Layout) -> Vec<u64> {
        let key = (l.schedule.clone(), l.pp, l.microbatches, l.chunks);
        if let Some(p) = self.peaks.get(&key) {
            return p.clone();
        }
        let pp = l.pp.max(1);
        let peaks = match kind_of(&l.schedule) {
            Some(kind) => {
                let m = l.microbatches.min(3 * pp);
                let counted: Vec<u64> = generate(kind, pp as usize, m as usize, l.chunks as usize)
                    .map(|s| peak_in_flight(&s).into_iter().map(|x| x as u64).collect())
                    .unwrap_or_default();
                let most = counted.iter().copied().max();
                match peak_activations(kind.closed_form(l.chunks), l.pp, l.microbatches) {
                    Some(p) if most.is_none_or(|c| c < p) => vec![p; pp as usize],
                    _ if counted.len() == pp as usize => counted,
                    _ => vec![l.microbatches * l.chunks; pp as usize],
                }
            }
            None => vec![l.microbatches; pp as usize],
        };
        self.peaks.insert(key, peaks.clone());
        peaks
    }

    /// What one rank holds: its parameters, and its memory (states and
    /// activations) as [`Memory`].
    fn rank_memory(&self, l: &Layout, r: u64, in_flight: u64, per_layer: f64) -> Memory {
        let input = self.input;
        let m = &input.model;
        let per_stage = l.stage_layers(m.layers);
        let last_stage = per_stage.len().saturating_sub(1);
        let stages: Vec<usize> = stages_of(l, r).collect();
        let layers: u64 = stages.iter().filter_map(|&s| per_stage.get(s)).sum();
        let chunk_layers = stages
            .iter()
            .filter_map(|&s| per_stage.get(s))
            .max()
            .copied()
            .unwrap_or(0) as f64;
        let (first, last) = (stages.contains(&0), stages.contains(&last_stage));
        let (h, v) = (m.hidden as f64, m.vocab as f64);
        // The embedding on the first stage, the output layer on the last:
        // a copy of the tied embedding when they are different ranks
        // (Megatron-LM keeps one there), its own weights when untied.
        // Llama's `embedding_params` counts both tables, GPT's one.
        let tied = m.arch == Arch::Gpt && !input.untied_output;
        let input_side =
            m.embedding_params() as f64 - if m.arch == Arch::Llama { v * h } else { 0.0 };
        let output_side = if tied && first { 0.0 } else { v * h };
        let ends = if first { input_side } else { 0.0 } + if last { output_side } else { 0.0 };
        // Routed experts split over ep x etp, the rest over t.
        let routed = m.routed_expert_params() as f64 / m.layers.max(1) as f64 * layers as f64;
        let dense = (layers as f64 * m.params_per_layer() as f64 - routed + ends) / l.tp as f64;
        let experts = routed / l.ep.saturating_mul(l.etp).max(1) as f64;
        let params = dense + experts;
        // 16-bit weights, the stack's gradients, fp32 master weights and
        // Adam moments: what each mode shards over its group; the
        // experts' over their data-parallel group, `dp tp / (etp ep)`.
        let grad = input.step.grad_bytes as usize;
        let master = input.step.master_bytes(self.fp8_params());
        let per_param = l
            .shard
            .state_bytes_with_master(2, grad, master, l.shard_group);
        let expert_group =
            (l.shard_group.saturating_mul(l.tp) / l.ep.saturating_mul(l.etp).max(1)).max(1);
        let per_expert_param = l
            .shard
            .state_bytes_with_master(2, grad, master, expert_group);
        // What a sharded step holds whole for a moment: one layer's
        // gradients before their reduce-scatter; with ZeRO-3 also two
        // layers' gathered parameters (the current and the prefetched).
        let layer_params = self.layer_params(l);
        let dtype = input.dtype_bytes as f64;
        let transient = match l.shard {
            Shard::Zero2 => input.step.grad_bytes as f64 * layer_params,
            Shard::Zero3 => (2.0 * dtype + input.step.grad_bytes as f64) * layer_params,
            Shard::None | Shard::Zero1 => 0.0,
        };
        // The last stage holds one microbatch's logits for the loss's
        // backward (fp32 where the loss casts them).
        let logit_width = if input.step.fp32_logits { 4.0 } else { dtype };
        let logits = if last {
            l.micro_batch as f64
                * self.local_seq(l) as f64
                * m.vocab.div_ceil(l.tp) as f64
                * logit_width
        } else {
            0.0
        };
        Memory {
            params,
            states_bytes: dense * per_param
                + experts * per_expert_param
                + transient
                + self.fp8_weight_bytes(layers as f64, l),
            activation_bytes: in_flight as f64 * chunk_layers * per_layer + logits,
            in_flight,
            formula_bytes: 0.0,
        }
    }

    /// Megatron-LM's `theoretical_memory_usage.py` for this layout: the
    /// most loaded shard's parameters (`L/pp` layers and the embedding,
    /// the output layer too when untied on one stage) at the layout's
    /// bytes per parameter (18, or `6 + 12/dp` with the distributed
    /// optimizer); activations of the first stage, `s b h (18 + 4 ffn/h)`
    /// a layer over `t` with sequence parallelism (`10 + 24/t` without),
    /// times `L`, times `1 + (pp-1)/(pp v)` when interleaved or
    /// `min(1, M/pp)` when not; the embedding's input and dropout mask for
    /// `pp` microbatches; with one stage the output layer's input and
    /// fp32 logits, `4 s b h (1 + V/h)`. Full recomputation keeps `2 s b
    /// h` a layer (the script does not model it).
    fn formula_bytes(&self, l: &Layout) -> f64 {
        let input = self.input;
        let m = &input.model;
        // A context rank holds the activations of its s / cp tokens.
        let (s, b, h, v) = (
            self.local_seq(l) as f64,
            l.micro_batch as f64,
            m.hidden as f64,
            m.vocab as f64,
        );
        let (t, pp, layers) = (l.tp as f64, l.pp.max(1) as f64, m.layers as f64);
        let untied = m.arch == Arch::Llama || input.untied_output;
        let mut params = layers / pp * m.params_per_layer() as f64 + v * h;
        if untied && l.pp == 1 {
            params += v * h;
        }
        let per_param = l.shard.state_bytes_with_master(
            2,
            input.step.grad_bytes as usize,
            input.step.master_bytes(self.fp8_params()),
            l.shard_group,
        );
        let weights = params / t * per_param;
        let sbh = s * b * h;
        let per_layer = match input.recompute {
            Recompute::Full => 2.0 * sbh * t,
            _ if input.sequence_parallel => sbh * (18.0 + 4.0 * m.ffn as f64 / h),
            _ => sbh * (10.0 * t + 24.0),
        };
        let mut act = per_layer * layers;
        if l.chunks > 1 {
            act *= 1.0 + (pp - 1.0) / (pp * l.chunks as f64);
        } else if l.pp > 1 {
            act *= (l.microbatches as f64 / pp).min(1.0);
        }
        act += 8.0 * s * b * pp + sbh * pp;
        if l.pp == 1 {
            act += 4.0 * sbh * (1.0 + v / h);
        }
        let fp8 = self.fp8_weight_bytes(layers / pp, l);
        weights + act / t + fp8
    }

    /// Whether the linear layers run in FP8.
    fn fp8(&self) -> bool {
        self.input.ops.is_some_and(|o| o.fp8_gemm_flops.is_some())
    }

    /// Whether the linear layers' weights are held in FP8 (`fp8_params`).
    fn fp8_params(&self) -> bool {
        self.input.ops.is_some_and(|o| o.fp8_params)
    }

    /// Bytes FP8 adds to the 16-bit weights of a rank holding `layers`
    /// layers through a step (0 in bf16).
    fn fp8_weight_bytes(&self, layers: f64, l: &Layout) -> f64 {
        if !self.fp8() {
            return 0.0;
        }
        let m = &self.input.model;
        let added = precision::weight_bytes_added(self.fp8_params());
        layers * m.matmul_params_per_layer() as f64 / l.tp as f64 * added
    }

    /// The rank that needs the most memory, and what it holds.
    pub(super) fn memory(&mut self, l: &Layout) -> Memory {
        let input = self.input;
        let m = &input.model;
        let flash = input
            .ops
            .is_some_and(|o| o.attention == crate::model::opcost::Attention::Flash);
        let per_layer = self.moe_activation_bytes(l, flash).unwrap_or_else(|| {
            activation_bytes_of(
                m,
                self.local_seq(l),
                l.micro_batch,
                l.tp,
                input.sequence_parallel,
                input.recompute,
                flash,
            )
            .unwrap_or(f64::INFINITY)
        });
        let per_layer = if self.fp8() && input.recompute != Recompute::Full {
            let tokens = (l.micro_batch * self.local_seq(l)) as f64;
            let (h, ffn, t) = (m.hidden as f64, m.ffn as f64, l.tp as f64);
            per_layer - precision::saved_input_savings(tokens, h, ffn, t, input.sequence_parallel)
        } else {
            per_layer
        };
        let peaks = self.peaks(l);
        let formula_bytes = self.formula_bytes(l);
        let mut most = (0..l.pp.max(1))
            .map(|r| {
                let in_flight = peaks.get(r as usize).copied().unwrap_or(0);
                self.rank_memory(l, r, in_flight, per_layer)
            })
            .max_by(|a, b| a.total().total_cmp(&b.total()))
            .unwrap_or(Memory {
                params: 0.0,
                states_bytes: 0.0,
                activation_bytes: 0.0,
                in_flight: 0,
                formula_bytes: 0.0,
            });
        // Megatron-LM's script counts no experts, and the microbatches in
        // flight of its own schedules only (1F1B, interleaved): no second
        // count for an MoE or another schedule (GPipe, looped BFS, zero
        // bubble, DualPipe).
        let megatron_schedule = matches!(l.schedule.as_str(), "none" | "1f1b" | "interleaved");
        most.formula_bytes = if m.moe.is_some() || !megatron_schedule {
            0.0
        } else {
            formula_bytes
        };
        most
    }

    /// One pipeline hop of a microbatch's activations (`b s h` elements).
    /// Across nodes with `t > 1`, Megatron's scatter/gather: each tensor
    /// rank sends `1/t` of it over its own NIC, and the receivers
    /// all-gather it inside the node.
    fn hop_seconds(&self, l: &Layout, pp_wire: WireKind) -> f64 {
        let input = self.input;
        let m = &input.model;
        let bytes = l.micro_batch as f64
            * self.local_seq(l) as f64
            * m.hidden as f64
            * input.dtype_bytes as f64;
        match pp_wire {
            WireKind::None => 0.0,
            WireKind::Intra => self.input.intra.message_seconds(bytes / l.tp as f64),
            WireKind::Inter if input.ops.is_some() && l.tp > 1 => {
                input.inter.message_seconds(bytes / l.tp as f64)
                    + input
                        .intra
                        .seconds(Collective::AllGather, l.tp, bytes as u64)
            }
            WireKind::Inter => input.inter.message_seconds(bytes / l.tp as f64),
        }
    }

    pub(super) fn cost(&mut self, l: Layout, memory: Memory) -> Costed {
        let input = self.input;
        let m = &input.model;
        let (tp_wire, dp_wire, pp_wire) = wires_of(&l, input.gpus_per_node);
        let mut layer = self.layer_work(&l, tp_wire);
        let (dp_f, dp_b, dp_all) = self.shard_layer(&l, &layer);
        layer.dp_f = dp_f;
        layer.dp_b = dp_b;
        layer.dp_all = dp_all;
        let (edge_f, edge_b) = self.pass_edges(&l);
        let (first_extra, last_extra) = self.ends_work(&l, tp_wire);
        let per_stage = l.stage_layers(m.layers);
        let stages = per_stage.len();
        let works: Vec<StageWork> = per_stage
            .iter()
            .enumerate()
            .map(|(s, &n)| {
                let k = n as f64;
                let mut w = StageWork {
                    f: k * layer.f,
                    i: k * layer.i,
                    w: k * layer.w,
                    comm_f: k * layer.comm_f,
                    comm_b: k * layer.comm_b,
                    cp_f: k * layer.cp_f,
                    cp_b: k * layer.cp_b,
                    dp_f: k * layer.dp_f + edge_f,
                    dp_b: k * layer.dp_b + edge_b,
                    dp_all: k * layer.dp_all,
                    ep: k * layer.ep,
                    parts: ComputeParts::default(),
                };
                w.parts.add(&layer.parts, k);
                if s == 0 {
                    w.add(&first_extra);
                }
                if s + 1 == stages {
                    w.add(&last_extra);
                }
                w
            })
            .collect();
        // The busiest rank: the most work per microbatch over its stages.
        let rank_work = |r: u64| -> StageWork {
            let mut sum = StageWork::default();
            for s in stages_of(&l, r) {
                if let Some(w) = works.get(s) {
                    sum.add(w);
                }
            }
            sum
        };
        let load = |w: &StageWork| w.compute() + w.comm() + w.cp() + w.dp_f + w.dp_b;
        let busiest = (0..l.pp)
            .map(rank_work)
            .max_by(|a, b| load(a).total_cmp(&load(b)))
            .unwrap_or_default();
        let micro = l.microbatches as f64;
        let busy = micro * load(&busiest);
        let sim = SimCosts {
            stages: works.iter().map(StageWork::sim).collect(),
            latency: self.hop_seconds(&l, pp_wire),
            bandwidth: f64::INFINITY,
            message_bytes: 0.0,
        };
        let (makespan, extrapolated) = self.makespan(&l, &sim).unwrap_or((busy, false));
        let pipeline = makespan.max(busy);
        let bubble = (pipeline - busy).max(0.0);
        // The data-parallel work once a step: DDP's all-reduce and ZeRO-1's
        // reduce-scatter in buckets as the backward ends (overlapped or
        // not), ZeRO-1's and ZeRO-2's all-gather of the updated
        // parameters, and with hybrid sharding the all-reduce of each
        // shard across the replicas.
        // Gradients reduce at the stack's gradient width (fp32 main
        // gradients: 4 bytes); parameters gather at the weights' width.
        let grad_bytes = memory.params * input.step.grad_bytes as f64;
        let mut param_bytes = memory.params * input.dtype_bytes as f64;
        if input.step.fp8_param_gather && self.fp8_params() {
            // FP8 weights gather as their FP8 bytes, 1 an element.
            let layers = self.busiest_rank_layers(&l) as f64;
            let linear = layers * m.matmul_params_per_layer() as f64 / l.tp as f64;
            param_bytes -= linear * (input.dtype_bytes as f64 - 1.0);
        }
        let group = l.shard_group.max(1);
        // With context parallelism the gradients reduce over dp x cp.
        let dp = l.grad_ranks();
        let wire = self.group_link(dp, l.tp);
        let shard_wire = self.group_link(group, l.tp);
        let bucketed = match l.shard {
            Shard::None => Some(Collective::AllReduce),
            Shard::Zero1 => Some(Collective::ReduceScatter),
            Shard::Zero2 | Shard::Zero3 => None,
        };
        let mut dp_total = 0.0;
        let mut dp_exposed = 0.0;
        // Of the collectives, what runs beside compute (and takes SMs from it).
        let mut dp_hidden = 0.0;
        if let Some(coll) = bucketed {
            let whole = wire.seconds(coll, dp, grad_bytes as u64);
            dp_total += whole;
            let exposed = if input.dp_overlap && dp > 1 && grad_bytes > 0.0 {
                // The buckets fill in the rank's last backward, top layer first.
                let (base, per_dp) = input.step.bucket_params;
                let bucket = if base > 0.0 {
                    base.max(per_dp * dp as f64) * input.step.grad_bytes as f64
                } else {
                    input.bucket_bytes
                };
                let n = (grad_bytes / bucket.max(1.0)).ceil().max(1.0);
                let bucket_s = wire.seconds(coll, dp, (grad_bytes / n) as u64);
                let backward = busiest.i + busiest.w + busiest.comm_b + busiest.cp_b;
                let layers = self.busiest_rank_layers(&l) as usize;
                let ready = bucket_ready_times(pipeline, backward, layers, n as usize);
                let buckets: Vec<(f64, f64)> = ready.into_iter().map(|t| (t, bucket_s)).collect();
                overlapped_exposure(&buckets, pipeline)
            } else {
                whole
            };
            dp_exposed += exposed;
            dp_hidden += (whole - exposed).max(0.0);
        }
        if matches!(l.shard, Shard::Zero1 | Shard::Zero2) {
            let gather = shard_wire.seconds(Collective::AllGather, group, param_bytes as u64);
            dp_total += gather;
            // Overlapped (`--overlap-param-gather`): bucket by bucket
            // behind the next step's first forward on the rank.
            let exposed = if input.step.param_gather_overlap {
                (gather - (busiest.f + busiest.comm_f)).max(0.0)
            } else {
                gather
            };
            dp_exposed += exposed;
            dp_hidden += gather - exposed;
        }
        if l.shard != Shard::None && group < dp {
            let replicas = dp / group;
            let across = self
                .group_link(replicas, l.tp.saturating_mul(group))
                .seconds(
                    Collective::AllReduce,
                    replicas,
                    (grad_bytes / group as f64) as u64,
                );
            dp_total += across;
            dp_exposed += across;
        }
        dp_total += micro * busiest.dp_all;
        dp_exposed += micro * (busiest.dp_f + busiest.dp_b);
        dp_hidden += micro * (busiest.dp_all - busiest.dp_f - busiest.dp_b).max(0.0);
        // Compute beside an overlapped collective runs on the SMs it leaves.
        let share = input.step.dp_sm_share;
        let dp_slowed = dp_hidden * share / (1.0 - share).max(0.5);
        let shards = if l.shard == Shard::None { 1 } else { group };
        let optimizer = input.ops.as_ref().map_or(0.0, |ops| {
            let adam = input.step.adam_bytes(self.fp8_params());
            ops.optimizer_step(memory.params, adam, shards, input.step.grad_buffer_bytes())
        });
        let pipeline_comm = micro * (busiest.dp_f + busiest.dp_b);
        // The sharded collectives the passes wait for are inside the
        // pipeline's time already.
        // FP8: the weights' cast and transpose once a step (at the first
        // microbatch, on the critical path); at each chunk's forward exit
        // and backward end, every microbatch, the amax all-reduce over the
        // stage's tp x dp x cp ranks and the fused scale update.
        let fp8_step = match &input.ops {
            Some(ops) if self.fp8() => {
                let layers = self.busiest_rank_layers(&l) as f64;
                let linear = layers * m.matmul_params_per_layer() as f64 / l.tp as f64;
                let chunks = l.chunks.max(1) as f64;
                let group = l.tp * l.dp * l.cp.max(1);
                let exit = |forward: bool| {
                    let e = precision::autocast_exit(layers / chunks, forward);
                    // A few KiB: NCCL's tuner takes the faster of its ring
                    // and tree (NCCL_ALGO's default); both priced on the
                    // group's wire.
                    let link = self.group_link(group, 1);
                    let tree = Wire {
                        link: link.link,
                        algo: Algorithm::Tree.into(),
                    };
                    let bytes = e.amax_bytes as u64;
                    let reduce = link
                        .seconds(Collective::AllReduce, group, bytes)
                        .min(tree.seconds(Collective::AllReduce, group, bytes));
                    reduce + ops.stream(e.update_bytes)
                };
                ops.stream(precision::step_bytes(linear, ops.fp8_params))
                    + micro * chunks * (exit(true) + exit(false))
            }
            _ => 0.0,
        };
        let step = pipeline + (dp_exposed - pipeline_comm) + optimizer + dp_slowed + fp8_step;
        let tokens = input.global_batch as f64 * m.seq as f64;
        let token_latency = self.token_latency(&l, tp_wire, pp_wire);
        let model_flops = m.train_flops(input.global_batch, m.seq, false);
        let hardware_flops = hardware_flops(m, input.global_batch, input.recompute);
        let share = |flops: f64| {
            input
                .peak_flops
                .map(|p| flops / (step * input.gpus as f64 * p))
        };
        let mut parts = ComputeParts::default();
        parts.add(&busiest.parts, micro);
        parts.memory_s += fp8_step;
        Costed {
            step_s: step,
            compute_s: micro * busiest.compute() + fp8_step,
            tp_comm_s: micro * (busiest.comm() - busiest.ep),
            ep_comm_s: micro * busiest.ep,
            ep_dispatch: self.dispatch(&l),
            cp_comm_s: micro * busiest.cp(),
            bubble_s: bubble,
            dp_comm_s: dp_exposed + dp_slowed,
            dp_comm_total_s: dp_total,
            optimizer_s: optimizer,
            tokens_per_s: tokens / step,
            token_latency_s: token_latency,
            memory,
            tp_wire,
            dp_wire,
            pp_wire,
            extrapolated,
            model_flops,
            hardware_flops,
            mfu: share(model_flops),
            hfu: share(hardware_flops),
            compute_parts: input.ops.is_some().then_some(parts),
            layout: l,
        }
    }

    fn makespan(&mut self, l: &Layout, sim: &SimCosts) -> Option<(f64, bool)> {
        let kind = kind_of(&l.schedule)?;
        let mut bits: Vec<u64> = sim
            .stages
            .iter()
            .flat_map(|s| [s.f.to_bits(), s.i.to_bits(), s.w.to_bits()])
            .collect();
        bits.extend([
            sim.latency.to_bits(),
            sim.bandwidth.to_bits(),
            sim.message_bytes.to_bits(),
        ]);
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

/// FLOPs a step's hardware computes: the model's, and what recomputation
/// repeats (the whole forward of every layer, or with selective
/// recomputation the attention's `4 b s^2 h`). Megatron-LM SC21's
/// "TFLOP/s per GPU" is this over the step and the GPUs (its eq. 3).
pub fn hardware_flops(m: &crate::model::Preset, batch: u64, recompute: Recompute) -> f64 {
    match recompute {
        Recompute::None => m.train_flops(batch, m.seq, false),
        Recompute::Full => m.train_flops(batch, m.seq, true),
        Recompute::Selective => {
            let (b, s, h) = (batch as f64, m.seq as f64, m.hidden as f64);
            m.train_flops(batch, m.seq, false) + m.layers as f64 * 4.0 * b * s * s * h
        }
    }
}

/// The share of a block's tensor-parallel collectives (two per sub-block
/// and pass) that a block of `m` runs: half for an MoE layer's attention
/// alone (`ffn` 0), whose experts take the sequence-parallel shard as it
/// is, with no gather before them or scatter after.
fn attention_collectives_share(m: &crate::model::Preset) -> f64 {
    if m.ffn == 0 {
        0.5
    } else {
        1.0
    }
}

/// Each collective of a pass beside the GEMM it overlaps, as
/// `initialize_ub` pairs them (Transformer Engine 1.10,
/// `pytorch/module/base.py`: ring exchange `qkv_fprop`, `fc1_fprop`,
/// `proj_dgrad`, `fc2_dgrad`; pipeline `proj_fprop`, `fc2_fprop`; bulk
/// `qkv_dgrad`, `qkv_wgrad`, `fc1_dgrad`, `fc1_wgrad`). The backward
/// gathers the norm's output again for the weight gradients (sequence
/// parallelism keeps only its shard; Korthikanti et al. 2022): six
/// collectives to the forward's four. A linear of no width has none: an
/// MoE layer's attention alone, whose experts take the sequence-parallel
/// shard as it is (the dispatcher's). `(comm, gemm, method)` each.
fn ub_pairs(lin: &[[f64; 3]; 4], forward: bool, ag: f64, rs: f64) -> Vec<(f64, f64, UbMethod)> {
    const QKV: usize = 0;
    const PROJ: usize = 1;
    const UP: usize = 2;
    const DOWN: usize = 3;
    let (f, d, w) = (0, 1, 2);
    use UbMethod::{Bulk, Pipeline, RingExchange};
    let pairs = if forward {
        vec![
            (ag, lin[QKV][f], RingExchange),
            (rs, lin[PROJ][f], Pipeline),
            (ag, lin[UP][f], RingExchange),
            (rs, lin[DOWN][f], Pipeline),
        ]
    } else {
        vec![
            (ag, lin[PROJ][d], RingExchange),
            (ag, lin[DOWN][d], RingExchange),
            (ag, lin[QKV][d], Bulk),
            (rs, lin[QKV][w], Bulk),
            (ag, lin[UP][d], Bulk),
            (rs, lin[UP][w], Bulk),
        ]
    };
    pairs
        .into_iter()
        .filter(|&(_, gemm, _)| gemm > 0.0)
        .collect()
}

#[cfg(test)]
mod ub_tests {
    use super::*;

    /// A ring exchange hides a gather up to `(1 - 1/t)` of its GEMM; a
    /// pipelined scatter always leaves its last chunk, and beyond the GEMM
    /// its chain; a bulk overlap leaves what outlasts the GEMM.
    #[test]
    fn each_method_exposes_what_outlasts_its_gemm() {
        let ring = UbMethod::RingExchange;
        assert_eq!(ring.exposed(0.5, 1.0, 8.0), 0.0);
        assert!((ring.exposed(1.0, 1.0, 8.0) - 0.125).abs() < 1e-12);
        assert!((ring.exposed(2.0, 1.0, 4.0) - 1.25).abs() < 1e-12);
        let pipe = UbMethod::Pipeline;
        assert!((pipe.exposed(0.4, 1.0, 8.0) - 0.1).abs() < 1e-12);
        assert!((pipe.exposed(2.0, 1.0, 8.0) - 1.25).abs() < 1e-12);
        assert_eq!(UbMethod::Bulk.exposed(0.9, 1.0, 8.0), 0.0);
        assert!((UbMethod::Bulk.exposed(1.5, 1.0, 8.0) - 0.5).abs() < 1e-12);
    }

    /// Forward: a gather before QKV and the up projection, a scatter after
    /// the projection and the down projection. Backward: six, each beside
    /// the GEMM TE's `initialize_ub` names. A linear of no width, none.
    #[test]
    fn the_pairs_are_transformer_engines() {
        // Linear i's passes are 10 i + (1, 2, 3): forward, dgrad, wgrad.
        let lin: [[f64; 3]; 4] = std::array::from_fn(|i| {
            let i = 10.0 * i as f64;
            [i + 1.0, i + 2.0, i + 3.0]
        });
        let (ag, rs) = (0.5, 0.25);
        let pairs = |forward| {
            ub_pairs(&lin, forward, ag, rs)
                .into_iter()
                .map(|(c, g, _)| (c, g))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pairs(true),
            vec![(ag, 1.0), (rs, 11.0), (ag, 21.0), (rs, 31.0)]
        );
        assert_eq!(
            pairs(false),
            vec![
                (ag, 12.0),
                (ag, 32.0),
                (ag, 2.0),
                (rs, 3.0),
                (ag, 22.0),
                (rs, 23.0)
            ]
        );
        // An MoE layer's attention alone: the MLP's linears have no width.
        let attention = [lin[0], lin[1], [0.0; 3], [0.0; 3]];
        assert_eq!(ub_pairs(&attention, true, ag, rs).len(), 2);
        assert_eq!(ub_pairs(&attention, false, ag, rs).len(), 3);
        let dense = crate::model::Preset::by_name("llama3-8b").unwrap();
        let alone = crate::model::Preset { ffn: 0, ..dense };
        assert_eq!(attention_collectives_share(&dense), 1.0);
        assert_eq!(attention_collectives_share(&alone), 0.5);
    }
}
