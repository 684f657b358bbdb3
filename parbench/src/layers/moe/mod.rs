//! A mixture-of-experts block split across `ep` expert-parallel ranks and
//! run for real: what `bench-layers --experts` times and checks.
//!
//! The block replaces a transformer layer's MLP (as in Mixtral, DeepSeek,
//! Qwen3-MoE): a router GEMM gives each token a logit per expert, the top
//! `k` experts are kept and their logits softmaxed into gate weights, each
//! token's hidden state is dispatched (all-to-all) to the ranks holding its
//! experts, every expert runs its gated MLP (SwiGLU) on the tokens it got,
//! one GEMM per expert over all of them (Megatron's sequential grouped
//! GEMM), the results come back (all-to-all) and are combined with the gate
//! weights; shared experts, when there are any, run on every token of their
//! rank beside the routed ones; the residual is added. Train mode runs the
//! backward through all of it, with the two all-to-alls in reverse.
//!
//! The ranks: `ep x etp` ([`MoeLayout`], Megatron-Core's folding). Rank
//! `r` holds the tokens `r N/W .. (r+1) N/W` of the call (`W = ep etp`: the
//! token split that data and sequence parallelism leave the layer); its
//! expert group `r / etp` holds experts `g E/ep .. (g+1) E/ep`, each
//! expert's MLP split over the group's `etp` ranks as Megatron's column-
//! and row-parallel MLP (gate and up columns, down rows). A token goes by
//! all-to-all to the rank of its expert's group with the same expert-tensor
//! index; inside the group the rows are all-gathered (each rank computes its
//! columns for all of them), and the down projection's partial sums are
//! reduce-scattered back before the combine: Megatron's all-to-all
//! dispatcher with expert tensor parallelism. The router and the shared
//! experts are replicated. No token is dropped (no capacity factor).
//!
//! Parts, one job each: [`MoeConfig`] (sizes, validated against a
//! layout), `layout` (the ranks' split, every tensor's shape, split and
//! seeded values), `routing` (top-k and its gradient), `exchange` (the
//! all-to-alls of rows inside a group of the layer's ranks), `etp` (the
//! expert-tensor group's gather and reduce-scatter), `block` (one rank's
//! shard, forward and backward), `check` (against the unsharded block) and
//! `run` (the timed loop and the figures across ranks).

mod attention;
mod block;
mod check;
mod etp;
mod exchange;
mod layout;
mod routing;
mod run;

pub use block::MoeBlock;
pub use check::check_moe;
pub use layout::{MoeLayout, MoeSpecs};
pub use routing::{routing_gap, top_k, Routing};
pub use run::{run_ep, MoeOutcome, MoeTiming};

use super::{LayerError, LayerResult, Mode};

/// The attention before the MoE layer (`--tp` with `--experts`): causal,
/// over sequences of `seq` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeAttention {
    pub heads: usize,
    pub seq: usize,
}

/// The sizes of one MoE block and of the tokens it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Model width `h`.
    pub hidden: usize,
    /// Each expert's MLP width `F` (its gate and up projections are `h x F`).
    pub ffn: usize,
    /// Routed experts `E`.
    pub experts: usize,
    /// Experts each token is routed to.
    pub topk: usize,
    /// Shared experts, each of width `F`, that see every token.
    pub shared: usize,
    /// Tokens of one block call, all ranks together.
    pub tokens: usize,
    pub mode: Mode,
    /// The attention before the MoE layer, making the block a transformer
    /// layer; `None`: the MoE layer alone.
    pub attention: Option<MoeAttention>,
}

impl MoeConfig {
    /// Experts each rank holds at `ep` ranks.
    pub fn local_experts(&self, ep: usize) -> usize {
        self.experts / ep.max(1)
    }

    /// Tokens each rank holds at `ranks` ranks (`ep x etp`).
    pub fn local_tokens(&self, ranks: usize) -> usize {
        self.tokens / ranks.max(1)
    }

    /// Checks that the block splits across `layout`'s ranks; the error
    /// names the size that does not divide.
    pub fn validate(&self, layout: MoeLayout) -> LayerResult<()> {
        let bad = |m: String| Err(LayerError::Config(m));
        let MoeLayout { ep, etp, tp } = layout;
        if ep == 0 {
            return bad("expert-parallel degree must be at least 1".into());
        }
        if etp == 0 {
            return bad("expert tensor-parallel degree must be at least 1".into());
        }
        for (name, v) in [
            ("hidden", self.hidden),
            ("expert ffn", self.ffn),
            ("experts", self.experts),
            ("topk", self.topk),
            ("tokens", self.tokens),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if self.topk > self.experts {
            return bad(format!(
                "topk {} is more than the {} experts",
                self.topk, self.experts
            ));
        }
        let w = |v: usize| v as u128;
        let largest = [
            w(self.experts) * w(self.hidden) * w(self.ffn) * 3,
            w(self.tokens) * w(self.topk) * (w(self.hidden) + 3 * w(self.ffn)),
            w(self.tokens) * w(self.shared) * w(self.ffn) * 3,
        ];
        if largest.iter().any(|&n| n > (isize::MAX as u128) / 8) {
            return bad("sizes overflow the address space".into());
        }
        if !self.experts.is_multiple_of(ep) {
            return bad(format!(
                "ep {ep} does not divide the {} experts: each rank must hold whole experts",
                self.experts
            ));
        }
        if !self.ffn.is_multiple_of(etp) {
            return bad(format!(
                "etp {etp} does not divide the expert ffn {}: each rank must hold whole columns",
                self.ffn
            ));
        }
        let world = layout.world();
        if !self.tokens.is_multiple_of(world) {
            return bad(format!(
                "{layout} ({world} ranks) does not divide the {} tokens of a block call",
                self.tokens
            ));
        }
        self.validate_attention(world, tp)
    }

    /// The attention's part of [`MoeConfig::validate`]: `tp` ranks split
    /// its heads, and each of the `world / tp` replicas attends over whole
    /// sequences.
    fn validate_attention(&self, world: usize, tp: usize) -> LayerResult<()> {
        let bad = |m: String| Err(LayerError::Config(m));
        let Some(a) = self.attention else {
            return match tp {
                1 => Ok(()),
                _ => bad(format!(
                    "tp {tp} splits an attention the block does not have"
                )),
            };
        };
        if a.heads == 0 || a.seq == 0 || tp == 0 {
            return bad("heads, seq and tp must be at least 1".into());
        }
        if !self.hidden.is_multiple_of(a.heads) || !a.heads.is_multiple_of(tp) {
            return bad(format!(
                "tp {tp} must divide the {} heads, and they the hidden {}",
                a.heads, self.hidden
            ));
        }
        if !world.is_multiple_of(tp) {
            return bad(format!("tp {tp} does not divide the layer's {world} ranks"));
        }
        let sequences = self.tokens / a.seq;
        let replicas = world / tp;
        if !self.tokens.is_multiple_of(a.seq) || !sequences.is_multiple_of(replicas) {
            return bad(format!(
                "the {replicas} attention replicas (ranks / tp) do not split the {sequences} sequences of a call into whole ones"
            ));
        }
        Ok(())
    }

    /// Matrix-product FLOPs of one block call on all ranks together: the
    /// router, the `k` routed experts of each token and the shared experts
    /// (forward; three times that in train mode).
    pub fn flops(&self) -> f64 {
        let (n, h, f) = (self.tokens as f64, self.hidden as f64, self.ffn as f64);
        let per_expert_token = 2.0 * 3.0 * h * f;
        // The attention: QKV and output projections, scores and their
        // product with V over every key of the sequence (no causal saving).
        let attention = self
            .attention
            .map_or(0.0, |a| 2.0 * n * h * 4.0 * h + 4.0 * n * a.seq as f64 * h);
        let fwd = 2.0 * n * h * self.experts as f64
            + n * (self.topk + self.shared) as f64 * per_expert_token
            + attention;
        match self.mode {
            Mode::Forward => fwd,
            Mode::Train => 3.0 * fwd,
        }
    }

    /// Bytes one rank of `layout` holds at once with `elem`-byte values,
    /// and what the check's unsharded block adds on rank 0 (when `check`):
    /// an estimate from the weights (doubled by gradients in train mode)
    /// and the activations of a balanced routing, in u128 so that nothing
    /// overflows before it is refused.
    pub fn memory_bytes(&self, layout: MoeLayout, elem: u128, check: bool) -> (u128, u128) {
        let one = |ep: u128, etp: u128| -> u128 {
            let w = |v: usize| v as u128;
            let (h, f, e, s) = (w(self.hidden), w(self.ffn), w(self.experts), w(self.shared));
            let n = w(self.tokens) / (ep * etp).max(1);
            let k = w(self.topk);
            let fl = f / etp.max(1);
            let params = h * e + 3 * h * fl * (e / ep.max(1)) + 3 * h * f * s;
            // Rows sent and received, the expert group's gathered rows and
            // their activations, shared activations.
            let acts = n * k * 4 * h
                + n * k * etp * (2 * h + 6 * fl)
                + n * (4 * h + 6 * s * f)
                + n * e * 2;
            let train = u128::from(self.mode == Mode::Train);
            (params + acts) * (1 + train) * elem
        };
        // The attention's weights, the replica's rows and its scores.
        let attention = self.attention.map_or(0, |a| {
            let (h, tp) = (self.hidden as u128, layout.tp.max(1) as u128);
            let rows = self.tokens as u128 * tp / layout.world().max(1) as u128;
            (4 * h * h / tp + rows * (6 * h + a.heads as u128 / tp * a.seq as u128)) * elem * 2
        });
        let rank = one(layout.ep as u128, layout.etp as u128) + attention;
        let extra = if check { 2 * one(1, 1) } else { 0 };
        (rank, extra)
    }
}

#[cfg(test)]
mod tests;
