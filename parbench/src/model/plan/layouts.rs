//! The layouts: `dp x tp x pp`, a schedule, a microbatch size; how many
//! there are for a cluster and which wire each group of ranks uses.

use super::input::{PlanInput, WireKind};
use super::shard::Shard;
use crate::schedule::{Placement, ScheduleEntry, ScheduleKind, SCHEDULES};

/// One layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// Data-parallel degree.
    pub dp: u64,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Context-parallel degree: ranks one sequence is split over.
    #[serde(default = "one")]
    pub cp: u64,
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
    /// Layers of the first and last pipeline stages when the layers do not
    /// divide evenly (Megatron-LM's `--decoder-first-pipeline-num-layers`
    /// and `--decoder-last-pipeline-num-layers`), with `uneven`; either
    /// may be 0 (the embedding, or the output layer and loss, alone).
    #[serde(default)]
    pub first_stage_layers: u64,
    #[serde(default)]
    pub last_stage_layers: u64,
    /// The first and last stages hold `first_stage_layers` and
    /// `last_stage_layers`, the middle ones the rest evenly; false: every
    /// stage the same share (a layout written before this field: uneven
    /// when `first_stage_layers > 0`).
    #[serde(default)]
    pub uneven: bool,
    /// How the data-parallel ranks hold the training state.
    #[serde(default)]
    pub shard: Shard,
    /// Ranks one copy of the state is sharded over: `dp`, or fewer for
    /// hybrid sharding (HSDP: sharded in groups, replicated across them);
    /// 0 or 1 without sharding.
    #[serde(default)]
    pub shard_group: u64,
    /// Expert-parallel degree (1 for a dense model), and the tensor
    /// degree of the experts; the experts' data-parallel degree is
    /// `dp tp / (etp ep)` (Megatron-Core's `parallel_state`).
    #[serde(default = "one")]
    pub ep: u64,
    #[serde(default = "one")]
    pub etp: u64,
}

fn one() -> u64 {
    1
}

impl Layout {
    /// The ranks the gradients reduce over (and the distributed optimizer
    /// shards over): Megatron-Core's data-parallel group with context
    /// parallelism, `dp x cp`.
    pub fn grad_ranks(&self) -> u64 {
        self.dp.saturating_mul(self.cp.max(1))
    }

    /// Whether the first and last stages hold their own counts of layers.
    pub fn is_uneven(&self) -> bool {
        self.uneven || self.first_stage_layers > 0
    }

    /// The layers of each of the `pp x chunks` stages, in pipeline order.
    pub fn stage_layers(&self, layers: u64) -> Vec<u64> {
        let stages = self.pp.saturating_mul(self.chunks).max(1);
        if !self.is_uneven() || stages < 2 {
            return vec![layers / stages; stages as usize];
        }
        let (first, last) = (self.first_stage_layers, self.last_stage_layers);
        let middle = stages - 2;
        let mid = layers
            .saturating_sub(first + last)
            .checked_div(middle)
            .unwrap_or(0);
        let mut v = vec![first];
        v.extend(std::iter::repeat_n(mid, middle as usize));
        v.push(last);
        v
    }
}

/// Megatron-LM's uneven split of `layers` over `stages` (pipeline stages
/// times chunks) when they do not divide: every middle stage takes
/// `ceil(layers / stages)`, and the first and last stages (which also hold
/// the embedding and the output layer) share what is left, the first the
/// larger half. `None` when that leaves the last stage nothing or the
/// first more than a middle one.
pub fn uneven_split(layers: u64, stages: u64) -> Option<(u64, u64)> {
    if stages < 2 || layers.is_multiple_of(stages) {
        return None;
    }
    let mid = layers.div_ceil(stages);
    let rest = layers.checked_sub((stages - 2).checked_mul(mid)?)?;
    let (first, last) = (rest.div_ceil(2), rest / 2);
    (last >= 1 && first <= mid).then_some((first, last))
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dp={} tp={}", self.dp, self.tp)?;
        if self.cp > 1 {
            write!(f, " cp={}", self.cp)?;
        }
        write!(f, " pp={}", self.pp)?;
        if self.schedule.is_empty() {
            return Ok(());
        }
        write!(f, " {}", self.schedule)?;
        if self.chunks > 1 {
            write!(f, " v={}", self.chunks)?;
        }
        write!(f, " b={} M={}", self.micro_batch, self.microbatches)?;
        if self.is_uneven() {
            write!(
                f,
                " layers first={} last={}",
                self.first_stage_layers, self.last_stage_layers
            )?;
        }
        if self.ep > 1 {
            write!(f, " ep={}", self.ep)?;
        }
        if self.ep > 1 && self.etp != self.tp {
            write!(f, " etp={}", self.etp)?;
        }
        if self.shard != Shard::None {
            write!(f, " shard={}", self.shard.name())?;
            if self.shard_group > 1 && self.shard_group < self.dp {
                write!(f, " hsdp={}", self.shard_group)?;
            }
        }
        Ok(())
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

/// Megatron's order places tensor ranks innermost, then context, then
/// data, then pipeline (Megatron-Core's `tp-cp-ep-dp-pp`).
pub(super) fn wires_of(l: &Layout, per_node: u64) -> (WireKind, WireKind, WireKind) {
    let tp = group_wire(l.tp, l.tp, per_node);
    let tcp = l.tp.saturating_mul(l.cp.max(1));
    // The gradients reduce over dp x cp ranks, spanning tp x cp x dp.
    let dp = group_wire(l.grad_ranks(), tcp.saturating_mul(l.dp), per_node);
    let pp = group_wire(
        l.pp,
        tcp.saturating_mul(l.dp).saturating_mul(l.pp),
        per_node,
    );
    (tp, dp, pp)
}

/// The wire of a layout's context-parallel group (`cp` ranks `tp` apart).
pub(super) fn cp_wire(l: &Layout, per_node: u64) -> WireKind {
    group_wire(l.cp, l.tp.saturating_mul(l.cp), per_node)
}

/// The schedule of a one-stage layout: nothing to choose (costed as 1F1B,
/// which on one stage is every schedule).
pub(super) const NO_SCHEDULE: &str = "none";

/// The registry's kind of a layout's schedule.
pub(super) fn kind_of(schedule: &str) -> Option<ScheduleKind> {
    if schedule == NO_SCHEDULE {
        return Some(ScheduleKind::OneFOneB);
    }
    SCHEDULES
        .iter()
        .find(|e| e.name == schedule)
        .map(|e| e.kind)
}

/// The schedules a pipeline of `pp` stages with `micro` microbatches can
/// run: one stage has no schedule to choose (`none`); otherwise every
/// schedule of the registry whose shape rules take `pp` and `micro`: those
/// of one stage per rank, the V schedules (two stages per rank), and the
/// looped ones with every `v` from 2 to `max_chunks` (the input's, or a
/// query's larger `vpp`; layers at least `pp v`, microbatches a multiple of
/// `pp`, Megatron's rule, for all of them).
pub(super) fn schedules(
    input: &PlanInput,
    pp: u64,
    micro: u64,
    max_chunks: u64,
) -> Vec<(&'static str, u64)> {
    if pp == 1 {
        return vec![(NO_SCHEDULE, 1)];
    }
    let allowed = |name: &str| {
        input
            .schedules
            .as_ref()
            .is_none_or(|list| list.iter().any(|s| s == name))
    };
    let takes = |e: &ScheduleEntry, v: u64| {
        let (Ok(p), Ok(m), Ok(v)) = (
            usize::try_from(pp),
            usize::try_from(micro),
            usize::try_from(v),
        ) else {
            return false;
        };
        e.kind.accepts(p, m, v).is_ok()
    };
    let mut out: Vec<(&'static str, u64)> = SCHEDULES
        .iter()
        .filter(|e| e.placement != Placement::Looped && allowed(e.name) && takes(e, 1))
        .map(|e| (e.name, e.placement.stages_per_rank(1) as u64))
        .collect();
    // The chunks' layers are checked by the caller (evenly, or Megatron's
    // uneven first and last stages).
    if micro.is_multiple_of(pp) {
        for e in SCHEDULES
            .iter()
            .filter(|e| e.placement == Placement::Looped && allowed(e.name))
        {
            for v in 2..=max_chunks {
                // Two chunks may hold the embedding or the output layer
                // alone (a query's first=0 and last=0).
                if input.model.layers.saturating_add(2) >= pp.saturating_mul(v) && takes(e, v) {
                    out.push((e.name, v));
                }
            }
        }
    }
    out
}
