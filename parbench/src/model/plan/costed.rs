//! What costing a layout says: its memory per device, its step in parts
//! (compute by kind, the collectives, the bubble), its throughput and
//! decode latency, and what it loses most to.

use super::input::WireKind;
use super::layouts::Layout;

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
    /// The same device by Megatron-LM's `theoretical_memory_usage.py` for
    /// the same arguments (its most loaded shard, Table 2 activations):
    /// the second count, whose distance from [`Self::total`] is the
    /// memory model's own uncertainty.
    #[serde(default)]
    pub formula_bytes: f64,
}

impl Memory {
    /// Everything.
    pub fn total(&self) -> f64 {
        self.states_bytes + self.activation_bytes
    }

    /// The lower and upper of the two counts.
    pub fn range(&self) -> (f64, f64) {
        let t = self.total();
        if self.formula_bytes > 0.0 {
            (t.min(self.formula_bytes), t.max(self.formula_bytes))
        } else {
            (t, t)
        }
    }

    /// Whether `have` bytes is within the model's uncertainty: the lower
    /// count fits, the upper does not.
    pub fn tight(&self, have: f64) -> bool {
        let (lo, hi) = self.range();
        lo <= have && hi > have
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
    /// The busiest rank's expert-parallel all-to-all (dispatch and
    /// combine, forward and backward), exposed.
    #[serde(default)]
    pub ep_comm_s: f64,
    /// One dispatch of a microbatch (an MoE layout with `ep > 1`).
    #[serde(default)]
    pub ep_dispatch: Option<crate::model::moe::DispatchCost>,
    /// The busiest rank's context-parallel exchanges of K and V that the
    /// attention does not hide.
    #[serde(default)]
    pub cp_comm_s: f64,
    /// The busiest rank's idle time in the pipeline (bubble and the waits
    /// for point-to-point messages).
    pub bubble_s: f64,
    /// The data-parallel gradient reduction the step waits for (all of it
    /// without overlap).
    pub dp_comm_s: f64,
    /// The whole data-parallel reduction, hidden or not.
    #[serde(default)]
    pub dp_comm_total_s: f64,
    /// The optimizer step (with a device: Adam's reads and writes).
    #[serde(default)]
    pub optimizer_s: f64,
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
    /// extended linearly (see [`super::costs::pipeline_makespan`]).
    pub extrapolated: bool,
    /// FLOPs of the model in one step (forward and backward, no
    /// recomputation): what MFU counts.
    #[serde(default)]
    pub model_flops: f64,
    /// FLOPs the hardware computes ([`super::costs::hardware_flops`]): what HFU counts.
    #[serde(default)]
    pub hardware_flops: f64,
    /// Model FLOPs per second over the devices' peak (PaLM's MFU); `None`
    /// without a device.
    #[serde(default)]
    pub mfu: Option<f64>,
    /// Hardware FLOPs per second over the peak.
    #[serde(default)]
    pub hfu: Option<f64>,
    /// The busiest rank's compute by kind, per step (with a device).
    #[serde(default)]
    pub compute_parts: Option<ComputeParts>,
}

impl Costed {
    /// The largest overhead (what this layout loses to).
    pub fn dominant_overhead(&self) -> Loss {
        let parts = [
            (Loss::Bubble, self.bubble_s),
            (Loss::TpComm, self.tp_comm_s),
            (Loss::EpComm, self.ep_comm_s),
            (Loss::DpComm, self.dp_comm_s),
        ];
        parts
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(Loss::Bubble, |p| p.0)
    }
}

/// Compute seconds of the busiest rank by kind (per step in a [`Costed`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ComputeParts {
    /// The projections' and MLP's GEMMs.
    pub gemm_s: f64,
    /// The attention core.
    pub attention_s: f64,
    /// Norms, activations, residual adds, dropout, accumulation (and a
    /// pass's wait for the host's kernel launches, where it binds).
    pub memory_s: f64,
    /// The output layer and loss (last stage), the embedding (first).
    pub logits_s: f64,
}

impl ComputeParts {
    pub(super) fn add(&mut self, o: &ComputeParts, k: f64) {
        self.gemm_s += k * o.gemm_s;
        self.attention_s += k * o.attention_s;
        self.memory_s += k * o.memory_s;
        self.logits_s += k * o.logits_s;
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
    /// Its expert-parallel all-to-all is.
    EpComm,
}

impl Loss {
    /// Words for tables.
    pub fn describe(self) -> &'static str {
        match self {
            Loss::Bubble => "largest overhead: the bubble",
            Loss::TpComm => "largest overhead: tensor-parallel communication",
            Loss::DpComm => "largest overhead: data-parallel communication",
            Loss::EpComm => "largest overhead: the expert-parallel all-to-all",
        }
    }
}
