//! Every tensor of the MoE block: its global shape, how the layer's ranks
//! split it ([`MoeLayout`]), and its seeded values (the dense block's
//! [`TensorSpec`], so a rank builds its shard alone and the unsharded block
//! sees the same numbers).
//!
//! The tokens' rows are split over every rank (a [`Split::Rows`] over
//! `ep x etp`); the router and shared experts are whole; the experts' weights
//! are split twice: by expert over the expert groups, and within an expert
//! like Megatron's column- and row-parallel MLP over the expert-tensor
//! ranks (the gate and up projections' columns, the down projection's rows).

use super::super::layout::{Split, TensorSpec};
use super::super::{LayerError, LayerResult};
use super::MoeConfig;

/// How the MoE layer's ranks are split (Megatron-Core's "MoE parallel
/// folding"): `ep x etp` ranks, the expert-tensor rank fastest
/// (`rank = t + etp e`), each expert group of `etp` consecutive ranks
/// holding `E/ep` experts, each of their MLPs split over those `etp`.
/// Every rank holds `tokens / (ep etp)` of the call's tokens. The attention
/// before it, if any, runs on the same ranks as `ep etp / tp` replicas of
/// `tp` consecutive tensor-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeLayout {
    /// Expert-parallel degree: the groups the experts are spread over.
    pub ep: usize,
    /// Expert tensor-parallel degree: the ranks each expert's MLP is split over.
    pub etp: usize,
    /// The attention's tensor-parallel degree (1 without attention).
    pub tp: usize,
}

impl MoeLayout {
    /// One rank holding everything (the unsharded reference).
    pub const SINGLE: MoeLayout = MoeLayout {
        ep: 1,
        etp: 1,
        tp: 1,
    };

    /// Expert parallelism alone.
    pub fn ep(ep: usize) -> Self {
        MoeLayout { ep, etp: 1, tp: 1 }
    }

    /// `ep x etp` ranks, without an attention split.
    pub fn of(ep: usize, etp: usize) -> Self {
        MoeLayout { ep, etp, tp: 1 }
    }

    /// Ranks of the layer.
    pub fn world(&self) -> usize {
        self.ep * self.etp
    }

    /// Rank `rank`'s expert group (its index in its expert-parallel group).
    pub fn ep_rank(&self, rank: usize) -> usize {
        rank / self.etp.max(1)
    }

    /// Rank `rank`'s index in its expert-tensor group.
    pub fn etp_rank(&self, rank: usize) -> usize {
        rank % self.etp.max(1)
    }

    /// The ranks that exchange tokens with `rank` (one per expert group,
    /// the same expert-tensor index), in expert-group order.
    pub fn ep_group(&self, rank: usize) -> Vec<usize> {
        let t = self.etp_rank(rank);
        (0..self.ep).map(|e| e * self.etp + t).collect()
    }

    /// The ranks that share `rank`'s experts, in expert-tensor order.
    pub fn etp_group(&self, rank: usize) -> Vec<usize> {
        let e = self.ep_rank(rank);
        (0..self.etp).map(|t| e * self.etp + t).collect()
    }
}

impl std::fmt::Display for MoeLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ep {} etp {}", self.ep, self.etp)?;
        if self.tp > 1 {
            write!(f, " tp {}", self.tp)?;
        }
        Ok(())
    }
}

/// The block's parameters and data, in a fixed order.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpecs {
    /// Router `h x E`, replicated.
    pub router: TensorSpec,
    /// Every expert's fused gate and up projections, `(E h) x 2F`: expert
    /// `e`'s `h x 2F` matrix is rows `e h .. (e+1) h` (gate columns first).
    /// Expert-tensor rank `t` of `T` holds columns `t F/T .. (t+1) F/T` of
    /// the gate's half and of the up's, stored `[gate_t | up_t]`.
    pub up: TensorSpec,
    /// Every expert's down projection, `(E F) x h`: rank `t` holds rows
    /// `t F/T .. (t+1) F/T` of each of its experts' `F`.
    pub down: TensorSpec,
    /// The shared experts' fused gate and up projections, `h x 2 S F`, replicated.
    pub shared_up: TensorSpec,
    /// The shared experts' down projection, `S F x h`, replicated.
    pub shared_down: TensorSpec,
    /// Input `tokens x h`, token rows per rank (over all `ep x etp`); `y`
    /// and `dx` share its split.
    pub x: TensorSpec,
    /// Output gradient, as `x`.
    pub dy: TensorSpec,
    /// The attention's `w_qkv` and `w_o` (empty without an attention):
    /// tensor-parallel over the layout's `tp`, the same on every replica.
    pub attention: [TensorSpec; 2],
}

impl MoeSpecs {
    /// The tensors of `cfg`'s block. Weights are scaled by `1/sqrt(fan_in)`.
    pub fn new(cfg: &MoeConfig) -> Self {
        let (h, f, e, s) = (cfg.hidden, cfg.ffn, cfg.experts, cfg.shared);
        let w = |name, tag, rows: usize, cols, fan_in: usize, split| TensorSpec {
            name,
            tag,
            rows,
            cols,
            split,
            scale: 1.0 / (fan_in.max(1) as f32).sqrt(),
        };
        let act = |name, tag| TensorSpec {
            name,
            tag,
            rows: cfg.tokens,
            cols: h,
            split: Split::Rows,
            scale: 1.0,
        };
        MoeSpecs {
            router: w("w_router", 21, h, e, h, Split::Whole),
            up: w("w_up", 22, e * h, 2 * f, h, Split::Rows),
            down: w("w_down", 23, e * f, h, f, Split::Rows),
            shared_up: w("w_shared_up", 24, h, 2 * s * f, h, Split::Whole),
            shared_down: w("w_shared_down", 25, s * f, h, s * f, Split::Whole),
            x: act("x", 26),
            dy: act("dy", 27),
            attention: super::attention::weight_specs(cfg),
        }
    }

    /// The parameters, in the order [`super::MoeBlock`] keeps them.
    pub fn params(&self) -> [TensorSpec; 5] {
        [
            self.router,
            self.up,
            self.down,
            self.shared_up,
            self.shared_down,
        ]
    }

    /// How the gradients are split: the experts' like their weights (an
    /// expert group sees every token routed to its experts); the replicated
    /// router and shared experts see only their rank's tokens, so their
    /// gradients are partial sums across ranks (what the data-parallel
    /// all-reduce adds up after the block).
    pub fn grads(&self) -> [TensorSpec; 5] {
        self.params().map(|mut g| {
            if g.split == Split::Whole {
                g.split = Split::Summed;
            }
            g
        })
    }

    /// Elements of rank `rank`'s shard of `spec` (one of this block's).
    pub fn local_len(&self, spec: &TensorSpec, layout: MoeLayout) -> usize {
        if self.is_attention(spec) {
            return spec.local_len(layout.tp);
        }
        // The experts' cuts hold as many elements as a row split over every rank.
        spec.local_len(layout.world())
    }

    /// The global row-major index of element `local` of rank `rank`'s shard.
    pub fn global_index(
        &self,
        spec: &TensorSpec,
        layout: MoeLayout,
        rank: usize,
        local: usize,
    ) -> usize {
        if self.is_attention(spec) {
            return spec.global_index(layout.tp, rank % layout.tp.max(1), local);
        }
        let (e, t) = (layout.ep_rank(rank), layout.etp_rank(rank));
        let experts_here = (spec.rows / self.per_expert_rows(spec)).max(1) / layout.ep.max(1);
        if spec.tag == self.up.tag {
            // Rows by expert group; columns: the rank's slice of each half.
            let f = spec.cols / 2;
            let fl = (f / layout.etp.max(1)).max(1);
            let (row, col) = (local / (2 * fl), local % (2 * fl));
            let grow = e * experts_here * self.up_rows() + row;
            let gcol = (col / fl) * f + t * fl + col % fl;
            grow * spec.cols + gcol
        } else if spec.tag == self.down.tag {
            let f = self.per_expert_rows(spec);
            let fl = (f / layout.etp.max(1)).max(1);
            let (row, col) = (local / spec.cols.max(1), local % spec.cols.max(1));
            let expert = e * experts_here + row / fl;
            (expert * f + t * fl + row % fl) * spec.cols + col
        } else {
            spec.global_index(layout.world(), rank, local)
        }
    }

    /// Rank `rank`'s shard of the seeded tensor `spec`, as f32.
    pub fn shard_values(
        &self,
        spec: &TensorSpec,
        seed: u64,
        layout: MoeLayout,
        rank: usize,
    ) -> Vec<f32> {
        (0..self.local_len(spec, layout))
            .map(|i| spec.value(seed, self.global_index(spec, layout, rank, i)))
            .collect()
    }

    /// Places every rank's shard of `spec` (`gathered[r]`) into the whole
    /// tensor; the attention's (gradients) are summed over the replicas.
    pub fn assemble(
        &self,
        spec: &TensorSpec,
        layout: MoeLayout,
        gathered: &[Vec<f32>],
    ) -> LayerResult<Vec<f32>> {
        let world = layout.world();
        if !self.is_expert(spec) && !self.is_attention(spec) {
            return spec.assemble(world, gathered);
        }
        let len = self.local_len(spec, layout);
        if gathered.len() != world || gathered.iter().any(|g| g.len() != len) {
            return Err(LayerError::Config(format!(
                "{}: shards do not match {layout}",
                spec.name
            )));
        }
        let mut out = vec![0f32; spec.len()];
        let summed = self.is_attention(spec);
        for (rank, shard) in gathered.iter().enumerate() {
            for (i, v) in shard.iter().enumerate() {
                let o = &mut out[self.global_index(spec, layout, rank, i)];
                *o = if summed { *o + v } else { *v };
            }
        }
        Ok(out)
    }

    /// Whether `spec` is one of the attention's weights (or their gradients).
    fn is_attention(&self, spec: &TensorSpec) -> bool {
        self.attention.iter().any(|a| a.tag == spec.tag)
    }

    /// Whether `spec` is an expert weight (or its gradient).
    fn is_expert(&self, spec: &TensorSpec) -> bool {
        spec.tag == self.up.tag || spec.tag == self.down.tag
    }

    /// Rows of one expert's matrix in `spec`: `h` in the up projection, `F` in the down.
    fn per_expert_rows(&self, spec: &TensorSpec) -> usize {
        if spec.tag == self.up.tag {
            self.up_rows()
        } else if spec.tag == self.down.tag {
            self.up.cols / 2
        } else {
            spec.rows
        }
    }

    /// The model width `h`: rows of one expert's up projection.
    fn up_rows(&self) -> usize {
        self.router.rows
    }
}
