//! What the planner is given: the model, the cluster, its wires and the
//! user's choices; checked before any layout is tried.

use super::shard::Shard;
use crate::comm::algo::Algorithm;
use crate::comm::Collective;
use crate::model::algo::ModelAlgo;
use crate::model::alpha_beta::{predict_textbook, LinkParams};
use crate::model::footprint::Recompute;
use crate::model::opcost::OpModel;
use crate::model::presets::Preset;
use crate::model::stack::StepModel;

/// A wire between devices: its alpha-beta parameters and the algorithm to
/// cost collectives with (`ring`, or any algorithm [`predict_textbook`] knows).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Wire {
    pub link: LinkParams,
    pub algo: ModelAlgo,
}

impl Wire {
    /// A ring over `link`.
    pub fn ring(link: LinkParams) -> Self {
        Wire {
            link,
            algo: ModelAlgo::Ran(Algorithm::Ring),
        }
    }

    /// Seconds of one `coll` of `bytes` over `p` ranks; 0 on one rank. A
    /// pair with no model falls back to the ring (every collective the
    /// planner calls has one).
    pub(super) fn seconds(&self, coll: Collective, p: u64, bytes: u64) -> f64 {
        if p <= 1 || bytes == 0 {
            return 0.0;
        }
        let p = usize::try_from(p).unwrap_or(usize::MAX);
        predict_textbook(coll, &self.algo, p, bytes, &self.link)
            .or_else(|| predict_textbook(coll, &Algorithm::Ring.into(), p, bytes, &self.link))
            .unwrap_or(f64::INFINITY)
    }

    /// Seconds of one point-to-point message of `bytes`: `alpha + n beta`.
    pub(super) fn message_seconds(&self, bytes: f64) -> f64 {
        self.link.alpha_s + bytes * self.link.beta_s_per_byte
    }
}

/// PyTorch DDP's default bucket, 25 MiB (`bucket_cap_mb`).
pub const DDP_BUCKET_BYTES: f64 = 25.0 * 1024.0 * 1024.0;

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
    /// The compute by operation on a described device; `None`: every
    /// FLOP at `flops_per_s` (a measured rate, no memory-bound work).
    pub ops: Option<OpModel>,
    /// The device's dense 16-bit peak, FLOP/s, for MFU and HFU.
    pub peak_flops: Option<f64>,
    /// Each GPU has its own NIC (a rail, as on DGX/HGX nodes): a
    /// data-parallel group with `k` members in a node crosses nodes over
    /// `k` NICs at once.
    pub rails: bool,
    /// The data-parallel reduction overlaps the backward in buckets
    /// (DDP's and Megatron-LM's `--overlap-grad-reduce`).
    pub dp_overlap: bool,
    /// Gradient bytes per bucket of the overlapped reduction.
    pub bucket_bytes: f64,
    /// Only these schedules (registry names); `None`: every one.
    pub schedules: Option<Vec<String>>,
    /// The data-parallel sharding modes to try; empty: ZeRO-1 with
    /// `distributed_optimizer`, else none.
    pub shard_modes: Vec<Shard>,
    /// Also try ZeRO-2/3 sharded inside a node and replicated across (HSDP).
    pub hybrid: bool,
    /// The terms of the step that differ between software stacks.
    pub step: StepModel,
    /// A GPT model's output layer has its own weights (Megatron's
    /// `--untie-embeddings-and-output-weights`); LLaMA's always has.
    pub untied_output: bool,
    /// The busiest rank's routed tokens over the mean (1: balanced
    /// routing): its expert GEMMs and its all-to-all take this much longer.
    pub moe_imbalance: f64,
    /// The MoE layers' modules recomputed (Megatron-Core's `--recompute-modules`).
    pub moe_recompute: crate::model::moe::MoeRecompute,
    /// Largest context-parallel degree searched (1: none).
    pub max_cp: u64,
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
            ops: None,
            peak_flops: None,
            rails: false,
            dp_overlap: false,
            bucket_bytes: DDP_BUCKET_BYTES,
            schedules: None,
            shard_modes: Vec::new(),
            hybrid: false,
            step: StepModel::default(),
            untied_output: false,
            moe_imbalance: 1.0,
            moe_recompute: crate::model::moe::MoeRecompute::default(),
            max_cp: 1,
        }
    }
}

/// Why a plan cannot be made at all (as opposed to a layout that loses).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error("the compute rate must be at least {} TFLOP/s (got {} FLOP/s)", crate::units::number_text(crate::limits::TFLOPS.min), crate::units::number_text(*.0))]
    BadCompute(f64),
    #[error("the memory per device must be at least {} GiB (got {} bytes)", crate::units::number_text(crate::limits::GIB.min), crate::units::number_text(*.0))]
    BadMemory(f64),
    #[error("{which} wire: bandwidth at least {} GB/s, latency at most {} us", crate::units::number_text(crate::limits::GBPS.min), crate::units::number_text(crate::limits::LATENCY_US.max))]
    BadWire { which: &'static str },
    #[error("dp={dp} x tp={tp}{} x pp={pp} is not the {gpus} devices planned for", if *cp > 1 { format!(" x cp={cp}") } else { String::new() })]
    LayoutWorld {
        dp: u64,
        tp: u64,
        cp: u64,
        pp: u64,
        gpus: u64,
    },
    #[error("{gpus} devices is not a whole number of {per_node}-device nodes")]
    PartialNode { gpus: u64, per_node: u64 },
    #[error("FP8 expert layers are not modelled: an MoE model plans in bf16")]
    Fp8Experts,
}

pub(super) fn check_input(input: &PlanInput) -> Result<(), PlanError> {
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
    // The floors of [`crate::limits`]' ranges, whatever gave the figure (a
    // flag, a device file, a measured record): below them a step takes
    // years. No ceilings: tests cost with free wires and compute.
    use crate::limits::{GBPS, GIB, LATENCY_US, TFLOPS};
    if !(input.flops_per_s.is_finite() && input.flops_per_s >= TFLOPS.min * 1e12) {
        return Err(PlanError::BadCompute(input.flops_per_s));
    }
    if let Some(mem) = input.memory_bytes {
        if !(mem.is_finite() && mem >= GIB.min * (1u64 << 30) as f64) {
            return Err(PlanError::BadMemory(mem));
        }
    }
    for (which, w) in [("intra-node", &input.intra), ("inter-node", &input.inter)] {
        let l = &w.link;
        let ok = l.alpha_s.is_finite()
            && l.alpha_s >= 0.0
            && l.alpha_s <= LATENCY_US.max * 1e-6
            && l.beta_s_per_byte.is_finite()
            && l.beta_s_per_byte > 0.0
            && l.beta_s_per_byte <= 1.0 / (GBPS.min * 1e9)
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
    // The experts' GEMMs, casts and weight copies are costed in bf16 only.
    if m.moe.is_some() && input.ops.is_some_and(|o| o.fp8_gemm_flops.is_some()) {
        return Err(PlanError::Fp8Experts);
    }
    Ok(())
}
