//! An MoE layer costed: its attention as a dense block without an MLP,
//! its routed and shared experts' GEMMs at their shapes after expert
//! parallelism, the router, the tokens' permutation, and the all-to-all
//! that dispatches and combines them (exposed, as Megatron-Core's
//! dispatchers run it without `--overlap-moe-expert-parallel-comm`).
//! A model's dense layers (DeepSeek-V3's first 3) are costed as dense
//! blocks; a layer of the pipeline is the mean of the two kinds.

use super::{Planner, StageWork};
use crate::comm::Collective;
use crate::model::footprint::{activation_bytes_of, Recompute};
use crate::model::moe::{
    a2a_bytes, a2a_seconds, bottleneck_gbps, permute_bytes, A2aShape, DispatchCost, Moe,
    ROUTER_BYTES,
};
use crate::model::opcost::STREAM_BYTES;
use crate::model::plan::costed::ComputeParts;
use crate::model::plan::input::WireKind;
use crate::model::plan::layouts::Layout;
use crate::model::presets::Preset;

/// `m` with dense layers only, each of MLP `ffn` (0: attention alone),
/// its attention kept.
fn dense_variant(m: &Preset, moe: Moe, ffn: u64) -> Preset {
    Preset {
        ffn,
        moe: Some(Moe {
            experts: 0,
            topk: 0,
            expert_ffn: 0,
            shared_experts: 0,
            dense_layers: m.layers,
            ..moe
        }),
        ..*m
    }
}

/// `a` times `wa` plus `b` times `wb`.
fn mix(a: &StageWork, wa: f64, b: &StageWork, wb: f64) -> StageWork {
    let mut parts = ComputeParts::default();
    parts.add(&a.parts, wa);
    parts.add(&b.parts, wb);
    StageWork {
        f: a.f * wa + b.f * wb,
        i: a.i * wa + b.i * wb,
        w: a.w * wa + b.w * wb,
        comm_f: a.comm_f * wa + b.comm_f * wb,
        comm_b: a.comm_b * wa + b.comm_b * wb,
        cp_f: a.cp_f * wa + b.cp_f * wb,
        cp_b: a.cp_b * wa + b.cp_b * wb,
        dp_f: a.dp_f * wa + b.dp_f * wb,
        dp_b: a.dp_b * wa + b.dp_b * wb,
        dp_all: a.dp_all * wa + b.dp_all * wb,
        ep: a.ep * wa + b.ep * wb,
        parts,
    }
}

impl Planner<'_> {
    /// Parameters of one (mean) layer on a rank: the routed experts
    /// over `ep x etp`, the rest over `tp`.
    pub(super) fn layer_params(&self, l: &Layout) -> f64 {
        let m = &self.input.model;
        let routed = m.routed_expert_params() as f64 / m.layers.max(1) as f64;
        (m.params_per_layer() as f64 - routed) / l.tp.max(1) as f64
            + routed / l.ep.saturating_mul(l.etp).max(1) as f64
    }

    /// Routed assignments (token, expert) one rank computes per
    /// microbatch: `b s k etp / (tp cp)` (the tensor group's tokens of the
    /// rank's `s / cp`, gathered over the experts' tensor group), times
    /// the imbalance.
    fn assignments(&self, l: &Layout, moe: &Moe) -> f64 {
        let tokens = (l.micro_batch * self.local_seq(l)) as f64;
        tokens * moe.topk as f64 * l.etp.max(1) as f64 / l.tp.max(1) as f64
            * self.input.moe_imbalance
    }

    /// The mean layer of an MoE model on one microbatch.
    pub(super) fn moe_layer_work(&self, l: &Layout, tp_wire: WireKind) -> StageWork {
        let m = &self.input.model;
        let Some(moe) = m.moe else {
            return self.block_work(m, l, tp_wire);
        };
        let mut expert = self.block_work(&dense_variant(m, moe, 0), l, tp_wire);
        let (f, i, w, parts) = self.experts_compute(l, &moe);
        expert.f += f;
        expert.i += i;
        expert.w += w;
        expert.parts.add(&parts, 1.0);
        let a2a = self.a2a_pass(l, &moe);
        // Recomputing the MoE layer dispatches and combines again.
        let again = if self.input.recompute == Recompute::Full || self.input.moe_recompute.moe {
            a2a
        } else {
            0.0
        };
        expert.comm_f += a2a;
        expert.comm_b += a2a + again;
        expert.ep = 2.0 * a2a + again;
        let layers = m.layers.max(1) as f64;
        let dense_layers = moe.dense_layers.min(m.layers) as f64;
        let mut layer = if dense_layers == 0.0 {
            expert
        } else {
            let dense = self.block_work(&dense_variant(m, moe, m.ffn), l, tp_wire);
            mix(
                &dense,
                dense_layers / layers,
                &expert,
                1.0 - dense_layers / layers,
            )
        };
        let norms = self.norms_again(l);
        layer.i += norms;
        layer.parts.memory_s += norms;
        layer
    }

    /// The two norms of a layer run again in its backward (`layernorm`
    /// of `--recompute-modules`): each reads and writes the rank's
    /// `b s h / (tp cp)` elements (its `b s h / cp` without sequence
    /// parallelism), 4 bytes an element, at the memory-bound rate.
    fn norms_again(&self, l: &Layout) -> f64 {
        let input = self.input;
        let recomputed = input.moe_recompute.layernorm && input.recompute != Recompute::Full;
        let Some(ops) = input.ops.as_ref().filter(|_| recomputed) else {
            return 0.0;
        };
        let t = if input.sequence_parallel {
            l.tp.max(1)
        } else {
            1
        };
        let elements = (l.micro_batch * self.local_seq(l) * input.model.hidden) as f64 / t as f64;
        ops.stream(2.0 * 4.0 * elements)
    }

    /// The experts' compute on one microbatch: forward, input gradient,
    /// weight gradient, and by kind. The routed experts' GEMMs are one
    /// grouped GEMM of the rank's `E/ep` experts (or, without grouped
    /// GEMMs, as many GEMMs, each launched by the host); the shared
    /// experts a dense SwiGLU MLP of `S F` over `t`; the router `h x E`
    /// on the rank's `b s / t` tokens and its fused top-k and auxiliary
    /// loss ([`ROUTER_BYTES`] a token and expert); permuting the tokens
    /// into expert order and back ([`permute_bytes`] an element of each
    /// routed copy, each pass); SwiGLU streams the inner activations.
    /// Recomputed modules (`--recompute-modules`) add their forward to
    /// the backward: `moe_act` the routed experts' SwiGLU, `moe` all of it.
    fn experts_compute(&self, l: &Layout, moe: &Moe) -> (f64, f64, f64, ComputeParts) {
        let input = self.input;
        let m = &input.model;
        let (h, ffn) = (m.hidden, moe.expert_ffn);
        let (t, etp) = (l.tp.max(1), l.etp.max(1));
        let local = (moe.experts / l.ep.max(1)).max(1);
        let assigned = self.assignments(l, moe);
        let per_expert = (assigned / local as f64).ceil() as u64;
        let tokens = l.micro_batch * self.local_seq(l);
        let shared_ffn = moe.shared_experts * ffn / t;
        let routed = [
            (per_expert, 2 * ffn / etp, h, local),
            (per_expert, h, ffn / etp, local),
        ];
        let shared = [
            (tokens, 2 * shared_ffn, h, 1),
            (tokens, h, shared_ffn, 1),
            (tokens / t, moe.experts, h, 1),
        ];
        let routed_inner = assigned * (ffn / etp) as f64;
        let inner = routed_inner + (tokens * shared_ffn) as f64;
        let copies = assigned * h as f64;
        let router_scores = (tokens / t * moe.experts) as f64;
        let permute = permute_bytes(input.step.moe.dispatcher, local, l.ep.max(1));
        let full = input.recompute == Recompute::Full;
        let whole_again = full || input.moe_recompute.moe;
        let Some(ops) = &input.ops else {
            let flops: f64 = routed
                .iter()
                .chain(shared.iter())
                .map(|&(a, b, c, g)| 2.0 * (a * b * c * g) as f64)
                .sum();
            let f = flops / input.flops_per_s;
            let again = if whole_again { f } else { 0.0 };
            let parts = ComputeParts {
                gemm_s: 3.0 * f + again,
                ..ComputeParts::default()
            };
            return (f, f + again, f, parts);
        };
        let (mut gf, mut gi, mut gw) = (0.0, 0.0, 0.0);
        for &(a, b, c, g) in routed.iter().chain(shared.iter()) {
            gf += ops.gemm(a, b, c, g);
            gi += ops.gemm(a, c, b, g);
            gw += ops.gemm(c, b, a, g);
        }
        let sb = STREAM_BYTES.swiglu;
        let mem_f = ops.stream(inner * sb.0 + permute * copies + ROUTER_BYTES.0 * router_scores);
        let mem_b = ops.stream(inner * sb.1 + permute * copies + ROUTER_BYTES.1 * router_scores);
        // Without grouped GEMMs the host launches each expert's GEMMs
        // (two forward, four backward): the passes wait for it.
        let (host_f, host_b) = if input.step.moe.grouped_gemm {
            (0.0, 0.0)
        } else {
            let launch = input.step.launch_s * local as f64;
            (
                (2.0 * launch - gf).max(0.0),
                (4.0 * launch - gi - gw).max(0.0),
            )
        };
        // What the backward runs again: the whole forward, or the routed
        // experts' SwiGLU alone (`moe_act`).
        let (gemm_again, memory_again) = if whole_again {
            (gf, mem_f + host_f)
        } else if input.moe_recompute.moe_act {
            (0.0, ops.stream(routed_inner * sb.0))
        } else {
            (0.0, 0.0)
        };
        let again = gemm_again + memory_again;
        let parts = ComputeParts {
            gemm_s: gf + gi + gw + gemm_again,
            memory_s: mem_f + mem_b + host_f + host_b + memory_again,
            ..ComputeParts::default()
        };
        (gf + mem_f + host_f, gi + mem_b + host_b + again, gw, parts)
    }

    /// One pass's dispatch and combine over the expert-parallel group,
    /// seconds: the rank's `b s / t` tokens, the busiest rank's share
    /// (times the imbalance), NVLink inside the node and the rank's NIC
    /// beyond it at once; with an experts' tensor degree above 1, the
    /// received tokens all-gathered (and their outputs reduce-scattered)
    /// over it. The group is `etp ep` consecutive ranks (Megatron-Core
    /// orders the experts' ranks tensor, expert, data, pipeline), so it
    /// holds `G / etp` ranks of each node it spans.
    fn a2a_pass(&self, l: &Layout, moe: &Moe) -> f64 {
        let input = self.input;
        let m = &input.model;
        let etp = l.etp.max(1);
        let one = self.dispatch(l).map_or(0.0, |d| d.seconds) * input.moe_imbalance;
        let gather = if etp > 1 {
            let received =
                self.assignments(l, moe) / etp as f64 * m.hidden as f64 * input.dtype_bytes as f64;
            input
                .intra
                .seconds(Collective::AllGather, etp, received as u64)
        } else {
            0.0
        };
        2.0 * (one + gather)
    }

    /// One dispatch of the layout's microbatch under balanced routing
    /// (`None`: a dense model, or one rank of experts).
    pub(super) fn dispatch(&self, l: &Layout) -> Option<DispatchCost> {
        let input = self.input;
        let m = &input.model;
        let moe = m.moe?;
        let (ep, etp) = (l.ep.max(1), l.etp.max(1));
        if ep == 1 {
            return None;
        }
        let per_node = (input.gpus_per_node / etp).max(1).min(ep);
        let shape = A2aShape {
            tokens: (l.micro_batch * self.local_seq(l)) as f64 / l.tp.max(1) as f64,
            hidden: m.hidden,
            elem_bytes: input.dtype_bytes as f64,
            topk: moe.topk,
            experts: moe.experts,
            ep,
            per_node,
            node_limit: moe.node_limit,
            dispatcher: input.step.moe.dispatcher,
        };
        let bytes = a2a_bytes(&shape);
        let (nv, nic) = (&input.intra.link, &input.inter.link);
        Some(DispatchCost {
            tokens: shape.tokens,
            nvlink_bytes: bytes.nvlink,
            rdma_bytes: bytes.rdma,
            nodes_reached: bytes.nodes_reached,
            seconds: a2a_seconds(&bytes, nv, nic),
            bottleneck_gbps: bottleneck_gbps(&bytes, nv, nic),
        })
    }

    /// Activation bytes of the mean layer of an MoE model (`None`:
    /// dense): the attention's as a dense block's without an MLP, and per
    /// routed copy the experts' input (`2h`), their gate and up outputs
    /// (`4F/etp`) and SwiGLU's product (`2F/etp`), and the shared
    /// experts' as a dense SwiGLU MLP's; the dense layers as dense blocks.
    /// Recomputed modules keep less: `layernorm` the norms' outputs,
    /// `moe_act` SwiGLU's product, `moe` nothing of the experts.
    pub(super) fn moe_activation_bytes(&self, l: &Layout, flash: bool) -> Option<f64> {
        let input = self.input;
        let m = &input.model;
        let moe = m.moe?;
        let seq = self.local_seq(l);
        let of = |p: &Preset| {
            activation_bytes_of(
                p,
                seq,
                l.micro_batch,
                l.tp,
                input.sequence_parallel,
                input.recompute,
                flash,
            )
        };
        let attention = of(&dense_variant(m, moe, 0))?;
        let recompute = input.moe_recompute;
        let tokens = (l.micro_batch * seq) as f64;
        let experts = if input.recompute == Recompute::Full || recompute.moe {
            0.0
        } else {
            let f = (moe.expert_ffn / l.etp.max(1)) as f64;
            let shared = (moe.shared_experts * moe.expert_ffn) as f64 / l.tp.max(1) as f64;
            // `moe_act` keeps SwiGLU's input, not its product.
            let product = if recompute.moe_act { 0.0 } else { 2.0 * f };
            self.assignments(l, &moe) * (2.0 * m.hidden as f64 + 4.0 * f + product)
                + tokens * 6.0 * shared
        };
        let routed = attention + experts;
        let dense = of(&dense_variant(m, moe, m.ffn))?;
        let share = moe.dense_layers.min(m.layers) as f64 / m.layers.max(1) as f64;
        // `layernorm` keeps each norm's input (the residual stream), not
        // its 16-bit output: two of `b s h` a layer (over `tp` with
        // sequence parallelism).
        let norms = if recompute.layernorm && input.recompute != Recompute::Full {
            let t = if input.sequence_parallel {
                l.tp.max(1)
            } else {
                1
            };
            2.0 * 2.0 * tokens * m.hidden as f64 / t as f64
        } else {
            0.0
        };
        Some((dense * share + routed * (1.0 - share) - norms).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::Planner;
    use crate::model::device::Device;
    use crate::model::moe::{Dispatcher, MoeRecompute};
    use crate::model::opcost::{Attention, FlashKernel, GradAccumulation, OpModel};
    use crate::model::plan::input::WireKind;
    use crate::model::plan::{plan_layout, Costed, LayoutQuery, PlanInput, Wire};
    use crate::model::presets::Preset;
    use std::collections::HashMap;

    /// Mixtral 8x7B on 64 H100s, Megatron-Core's reference mapping.
    fn mixtral(imbalance: f64, ep: u64) -> Costed {
        let (input, q) = mixtral_input(imbalance, ep);
        plan_layout(&input, &q).unwrap().ranked.remove(0)
    }

    /// The plan's input and layout of [`mixtral`].
    fn mixtral_input(imbalance: f64, ep: u64) -> (PlanInput, LayoutQuery) {
        let d = Device::by_name("h100-sxm5-80gb").unwrap();
        let ops = OpModel::of_device(
            &d,
            None,
            Attention::Flash,
            FlashKernel::Cudnn,
            GradAccumulation::Fused,
        );
        let m = Preset::by_name("mixtral-8x7b").unwrap();
        let mut input = PlanInput::new(
            m,
            256,
            64,
            8,
            ops.gemm_flops,
            Wire::ring(d.intra_link()),
            Wire::ring(d.inter_link()),
        );
        input.ops = Some(ops);
        input.moe_imbalance = imbalance;
        let q = LayoutQuery {
            dp: 16,
            tp: 1,
            pp: 4,
            chunks: Some(8),
            micro_batch: Some(1),
            schedule: Some("interleaved".into()),
            ep: Some(ep),
            etp: Some(1),
            ..LayoutQuery::default()
        };
        (input, q)
    }

    /// One mean layer's work of `input` at its layout.
    fn layer(input: &PlanInput, q: &LayoutQuery) -> super::StageWork {
        let l = plan_layout(input, q).unwrap().ranked.remove(0).layout;
        Planner {
            input,
            peaks: HashMap::new(),
            makespans: HashMap::new(),
        }
        .moe_layer_work(&l, WireKind::None)
    }

    /// `--recompute-modules`: `layernorm` adds the two norms' forward
    /// (4 bytes an element each, `b s h` elements at tp 1) to the
    /// backward; `moe_act` the routed experts' SwiGLU (6 bytes an inner
    /// element, `b s k F` of them at balance); `moe` the layer's
    /// dispatch and combine once more, so its all-to-all is 3/2.
    #[test]
    fn recomputed_modules_add_their_forward() {
        let (mut input, q) = mixtral_input(1.0, 8);
        let base = layer(&input, &q);
        let ops = input.ops.unwrap();
        let m = input.model;
        let moe = m.moe.unwrap();
        let tokens = (m.seq) as f64;
        input.moe_recompute = MoeRecompute::parse("layernorm").unwrap();
        let norms = layer(&input, &q);
        let want = ops.stream(2.0 * 4.0 * tokens * m.hidden as f64);
        assert!(
            (norms.i - base.i - want).abs() < 1e-12,
            "{} {want}",
            norms.i - base.i
        );
        assert_eq!(norms.f, base.f);
        input.moe_recompute = MoeRecompute::parse("moe_act").unwrap();
        let act = layer(&input, &q);
        let inner = tokens * moe.topk as f64 * moe.expert_ffn as f64;
        let want = ops.stream(6.0 * inner);
        assert!(
            (act.i - base.i - want).abs() < 1e-12,
            "{} {want}",
            act.i - base.i
        );
        input.moe_recompute = MoeRecompute::parse("moe").unwrap();
        let whole = layer(&input, &q);
        assert!((whole.ep / base.ep - 1.5).abs() < 1e-12);
        assert!(whole.i > act.i);
        assert!(MoeRecompute::parse("mlp").is_err());
    }

    /// The grouped GEMMs at fine-grained experts' shapes against the one
    /// public Hopper measurement: Transformer Engine pull request 2045
    /// (H100, BF16, TE 2.7, CUDA 12.9, `general_grouped_gemm`, multi-stream
    /// cuBLAS): `(g, m, n, k)` = (8, 4096, 768, 2048) at 627.9 TFLOP/s and
    /// (16, 2048, 768, 2048) at 553.9.
    #[test]
    fn grouped_gemms_against_te_on_h100() {
        let (input, _) = mixtral_input(1.0, 8);
        let ops = input.ops.unwrap();
        for (g, m, n, k, published) in [(8, 4096, 768, 2048, 627.9), (16, 2048, 768, 2048, 553.9)] {
            let rate = 2.0 * (g * m * n * k) as f64 / ops.gemm(m, n, k, g) / 1e12;
            eprintln!("g {g} m {m} n {n} k {k}: {rate:.1} TFLOP/s, published {published}");
            // Not fitted to it (docs/report.md, "Grouped GEMMs"): the
            // planner prices these above the measurement, by at most 20%.
            assert!(rate >= published && rate <= 1.2 * published, "{rate}");
        }
    }

    /// The router's kernels and the permutation are in the forward:
    /// the alltoall dispatcher's chunk sorts make its permutation twice
    /// DeepEP's at 4 local experts a rank.
    #[test]
    fn the_permutation_follows_the_dispatcher() {
        let (mut input, q) = mixtral_input(1.0, 2);
        let all = layer(&input, &q);
        input.step.moe.dispatcher = Dispatcher::DeepEp;
        let deep = layer(&input, &q);
        let ops = input.ops.unwrap();
        let m = input.model;
        let copies = m.seq as f64 * m.moe.unwrap().topk as f64 * m.hidden as f64;
        let want = ops.stream(8.0 * copies);
        let fwd = all.f - deep.f;
        assert!((fwd - want).abs() < 1e-12, "{fwd} {want}");
        assert!((all.i - deep.i - want).abs() < 1e-12);
        assert_eq!(super::permute_bytes(Dispatcher::AllToAll, 1, 8), 8.0);
        assert_eq!(super::permute_bytes(Dispatcher::AllToAll, 4, 1), 8.0);
    }

    /// The routed experts lie on `ep` ranks, the rest whole on each: at
    /// ep 8 a rank holds `(all - routed) / pp + routed / (8 pp)`.
    #[test]
    fn experts_are_split_over_ep() {
        let m = Preset::by_name("mixtral-8x7b").unwrap();
        let routed = m.routed_expert_params() as f64;
        let rest = m.params() as f64 - routed;
        let at = |ep: u64| mixtral(1.0, ep).memory.params;
        // The busiest rank holds 8 of 32 layers and one of the ends.
        let layers = |x: f64| x / 4.0;
        let ends = at(8) - layers(rest - m.embedding_params() as f64) - layers(routed) / 8.0;
        assert!(ends > 0.0 && ends <= m.embedding_params() as f64, "{ends}");
        let saved = at(2) - at(8);
        let want = layers(routed) * (1.0 / 2.0 - 1.0 / 8.0);
        assert!((saved / want - 1.0).abs() < 1e-9, "{saved} {want}");
    }

    /// One rank of experts has no all-to-all; EP 8 inside a node has one;
    /// an imbalance of 2 doubles it and lengthens the experts' GEMMs.
    #[test]
    fn the_all_to_all_and_the_imbalance() {
        let one = mixtral(1.0, 1);
        assert_eq!(one.ep_comm_s, 0.0);
        assert!(one.ep_dispatch.is_none());
        let eight = mixtral(1.0, 8);
        let d = eight.ep_dispatch.unwrap();
        assert_eq!(d.rdma_bytes, 0.0);
        // 4096 tokens, hidden 4096, 2 bytes, 2 copies, 7 of 8 leave the rank.
        let want = 4096.0 * 4096.0 * 2.0 * 2.0 * 7.0 / 8.0;
        assert!((d.nvlink_bytes - want).abs() < 1.0);
        assert!(eight.ep_comm_s > 0.0);
        let skew = mixtral(2.0, 8);
        assert!((skew.ep_comm_s / eight.ep_comm_s - 2.0).abs() < 1e-9);
        assert!(skew.compute_s > eight.compute_s);
        // The model's FLOPs do not change with the routing.
        assert_eq!(skew.model_flops, eight.model_flops);
    }
}
