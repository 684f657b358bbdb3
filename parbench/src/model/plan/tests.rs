use super::*;
use crate::model::alpha_beta::LinkParams;
use crate::model::footprint::Recompute;
use crate::model::presets::Arch;
use crate::model::presets::Preset;
use crate::model::sim::simulate;
use crate::model::sim::{SimCosts, StageCosts};
use crate::model::tensor_parallel::TpMode;
use crate::model::tensor_parallel::{RingFactor, WORKED_EXAMPLE_LAYERS};
use crate::schedule::{generate, ScheduleKind};
use costs::Planner;

const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-300)
}

/// A wire so fast that it costs nothing measurable (the papers' free communication).
fn free_wire() -> Wire {
    Wire::ring(LinkParams::from_gbps_us(1e12, 0.0))
}

fn preset(name: &str) -> Preset {
    Preset::by_name(name).unwrap()
}

/// A GPT block stack with no vocabulary: equal stages, as the closed forms assume.
fn equal_stages(layers: u64) -> Preset {
    Preset {
        name: "equal",
        source: "test",
        arch: Arch::Gpt,
        layers,
        hidden: 64,
        heads: 4,
        kv_heads: 4,
        ffn: 256,
        seq: 8,
        vocab: 0,
        moe: None,
    }
}

fn find<'a>(
    plan: &'a LayoutRanking,
    dp: u64,
    tp: u64,
    pp: u64,
    sched: &str,
    v: u64,
    b: u64,
) -> &'a Costed {
    plan.ranked
        .iter()
        .find(|c| {
            let l = &c.layout;
            (
                l.dp,
                l.tp,
                l.pp,
                l.schedule.as_str(),
                l.chunks,
                l.micro_batch,
            ) == (dp, tp, pp, sched, v, b)
        })
        .unwrap_or_else(|| panic!("no layout dp={dp} tp={tp} pp={pp} {sched} v={v} b={b}"))
}

#[test]
fn divisors_and_wires() {
    assert_eq!(divisors(12), [1, 2, 3, 4, 6, 12]);
    assert_eq!(divisors(1), [1]);
    assert_eq!(divisors(1024).len(), 11);
    assert_eq!(group_wire(1, 1, 8), WireKind::None);
    assert_eq!(group_wire(8, 8, 8), WireKind::Intra);
    assert_eq!(group_wire(2, 16, 8), WireKind::Inter);
    // A group of 3 in nodes of 8 would straddle a node boundary.
    assert_eq!(group_wire(3, 3, 8), WireKind::Inter);
}

#[test]
fn worked_example_160_mb_per_token() {
    // Llama 2 70B (80 layers, hidden 8192) at TP = 8, microbatch 32: the
    // planner's decode step moves the worked example's bytes and takes
    // its time on a 400 GB/s wire with compute made free.
    let m = preset(Preset::WORKED_EXAMPLE);
    let nv = Wire::ring(LinkParams::from_gbps_us(400.0, 0.0));
    let input = PlanInput::new(m, 32, 8, 8, 1e30, nv.clone(), nv);
    let plan = plan(&input).unwrap();
    let c = find(&plan, 1, 8, 1, "none", 1, 32);
    let w = Planner {
        input: &input,
        peaks: HashMap::new(),
        makespans: HashMap::new(),
    }
    .traffic(&c.layout, TpMode::Decode);
    assert_eq!(w.bytes_per_call(), 524_288);
    assert_eq!(w.calls_per_step(WORKED_EXAMPLE_LAYERS), 160);
    assert_eq!(
        w.wire_bytes_per_step(m.layers, RingFactor::Limit),
        160.0 * MIB
    );
    // The exact ring moves 1.75 x 0.5 MiB per call: 140 MiB, 0.367 ms.
    let want = 160.0 * 1.75 * 524_288.0 / 400e9;
    assert!(
        close(c.token_latency_s, want, 1e-9),
        "{}",
        c.token_latency_s
    );
    assert!((c.token_latency_s - 0.367e-3).abs() < 0.001e-3);
    // 16x slower across nodes: 16x the time (tensor parallel across 2 nodes of 4).
    let net = Wire::ring(LinkParams::from_gbps_us(25.0, 0.0));
    let nv = Wire::ring(LinkParams::from_gbps_us(400.0, 0.0));
    let mut across = PlanInput::new(m, 32, 8, 4, 1e30, nv, net);
    across.allow_tp_across_nodes = true;
    let plan = super::plan(&across).unwrap();
    let c = find(&plan, 1, 8, 1, "none", 1, 32);
    assert_eq!(c.tp_wire, WireKind::Inter);
    assert!(close(c.token_latency_s, 16.0 * want, 1e-9));
}

#[test]
fn bubble_figures_of_equal_stages() {
    // 4 stages, free communication, no logits: the closed forms.
    let input = PlanInput::new(equal_stages(8), 16, 4, 4, 1e9, free_wire(), free_wire());
    let plan = plan(&input).unwrap();
    let share = |c: &Costed| c.bubble_s / c.step_s;
    // M = 4 (b = 4): 3/7 = 43% idle; M = 16 (b = 1): 3/19 = 16%.
    let m4 = find(&plan, 1, 1, 4, "1f1b", 1, 4);
    assert_eq!(m4.layout.microbatches, 4);
    assert!(close(share(m4), 3.0 / 7.0, 1e-6), "{}", share(m4));
    let m16 = find(&plan, 1, 1, 4, "1f1b", 1, 1);
    assert!(close(share(m16), 3.0 / 19.0, 1e-6), "{}", share(m16));
    // GPipe has 1F1B's bubble; interleaved v = 2 divides it: 3/(2x4+3).
    assert!(close(
        share(find(&plan, 1, 1, 4, "gpipe", 1, 4)),
        3.0 / 7.0,
        1e-6
    ));
    let v2 = find(&plan, 1, 1, 4, "interleaved", 2, 4);
    assert!(close(share(v2), 3.0 / 11.0, 1e-6), "{}", share(v2));
    // ZB-H1 with T_F = T_B = T_W: (S-1)(F+B-W) = 3 of 4 x 3 passes: 3/15.
    let zb = find(&plan, 1, 1, 4, "zb-h1", 1, 4);
    assert!(close(share(zb), 0.2, 1e-6), "{}", share(zb));
    // Peak activations: GPipe holds M, 1F1B S (in microbatches of one stage).
    assert_eq!(find(&plan, 1, 1, 4, "gpipe", 1, 1).memory.in_flight, 16);
    assert_eq!(m16.memory.in_flight, 4);
}

#[test]
fn pytorchs_other_schedules_are_planned_with_their_memory() {
    // 4 stages, 8 layers (two per stage on the V), equal passes, free communication.
    let input = PlanInput::new(equal_stages(8), 16, 4, 4, 1e9, free_wire(), free_wire());
    let plan = plan(&input).unwrap();
    let share = |c: &Costed| c.bubble_s / c.step_s;
    // ZB-V and DualPipeV at T_F = T_B = T_W idle only while the V fills:
    // 3 chunk forwards of a step of 16 x 6 chunk passes.
    let zbv = find(&plan, 1, 1, 4, "zb-v", 2, 1);
    assert!(close(share(zbv), 3.0 / 99.0, 1e-6), "{}", share(zbv));
    let dpv = find(&plan, 1, 1, 4, "dualpipev", 2, 1);
    assert!(close(share(dpv), 3.0 / 99.0, 1e-6), "{}", share(dpv));
    // Memory in chunks of one stage's activations: ZB-V 1F1B's (2S chunks),
    // DualPipeV 2S + 1, looped BFS every forward (v M).
    assert_eq!(zbv.memory.in_flight, 8);
    assert_eq!(dpv.memory.in_flight, 9);
    assert_eq!(
        find(&plan, 1, 1, 4, "looped-bfs", 2, 1).memory.in_flight,
        32
    );
    find(&plan, 1, 1, 4, "interleaved-zb", 2, 1);
    // Both V stages of rank 0 hold its parameters: two stages' layers.
    let one = find(&plan, 1, 1, 4, "1f1b", 1, 1);
    assert!(close(zbv.memory.params, one.memory.params, 1e-9));
    // Megatron-LM's formula is a second memory count for its own
    // schedules only: not for looped BFS's every forward in flight.
    assert!(one.memory.formula_bytes > 0.0);
    let bfs = find(&plan, 1, 1, 4, "looped-bfs", 2, 1);
    for c in [zbv, dpv, bfs] {
        assert_eq!(c.memory.formula_bytes, 0.0, "{}", c.layout);
    }
    // DualPipeV needs M >= 2S: none with fewer.
    assert!(!plan
        .ranked
        .iter()
        .any(|c| c.layout.schedule == "dualpipev" && c.layout.microbatches < 2 * c.layout.pp));
    find(&plan, 1, 1, 4, "zb-v", 2, 4);
}

#[test]
fn the_parts_add_up_to_the_step() {
    let m = preset("gpt3-1.3b");
    let intra = Wire::ring(LinkParams::from_gbps_us(300.0, 5.0));
    let inter = Wire::ring(LinkParams::from_gbps_us(25.0, 10.0));
    let plan = plan(&PlanInput::new(m, 64, 16, 8, 300e12, intra, inter)).unwrap();
    assert!(!plan.ranked.is_empty());
    for c in &plan.ranked {
        let sum = c.compute_s + c.tp_comm_s + c.bubble_s + c.dp_comm_s;
        assert!(
            close(sum, c.step_s, 1e-9),
            "{}: {sum} vs {}",
            c.layout,
            c.step_s
        );
        assert!(c.bubble_s >= 0.0 && c.tp_comm_s >= 0.0);
        let tokens = (64 * m.seq) as f64;
        assert!(close(c.tokens_per_s, tokens / c.step_s, 1e-12));
        assert_eq!(
            c.layout.dp * c.layout.microbatches * c.layout.micro_batch,
            64
        );
        assert_eq!(c.layout.dp * c.layout.tp * c.layout.pp, 16);
    }
    // Ranked fastest first.
    for w in plan.ranked.windows(2) {
        assert!(w[0].tokens_per_s >= w[1].tokens_per_s);
    }
    // One device holds the whole model and its Adam state when tp = pp = 1.
    let one = find(&plan, 16, 1, 1, "none", 1, 1);
    assert_eq!(one.memory.params, m.params() as f64);
    assert_eq!(one.memory.states_bytes, 16.0 * m.params() as f64);
}

#[test]
fn impossible_layouts_are_rejected_with_reasons() {
    // Llama 2 70B on 4 nodes of 8 with 80 GiB each, global batch 16.
    let m = preset("llama2-70b");
    let w = Wire::ring(LinkParams::from_gbps_us(100.0, 5.0));
    let mut input = PlanInput::new(m, 16, 32, 8, 300e12, w.clone(), w);
    input.memory_bytes = Some(80.0 * GIB);
    let plan = plan(&input).unwrap();
    let reason = |dp, tp, pp| {
        plan.rejected
            .iter()
            .find(|r| (r.layout.dp, r.layout.tp, r.layout.pp) == (dp, tp, pp))
            .map(|r| r.reason.clone())
    };
    // 32-way TP leaves the node.
    assert_eq!(
        reason(1, 32, 1),
        Some(Rejection::TpAcrossNodes {
            tp: 32,
            gpus_per_node: 8
        })
    );
    // 80 layers over 32 stages: Megatron's rule, in its words.
    assert_eq!(
        reason(1, 1, 32),
        Some(Rejection::InvalidSplit {
            rule: "layers (80) is not divisible by the pipeline stages x chunks (32)".into()
        })
    );
    // 16 sequences over 32 data-parallel ranks.
    assert_eq!(
        reason(32, 1, 1),
        Some(Rejection::Batch {
            global_batch: 16,
            dp: 32
        })
    );
    // 70B parameters at 16 bytes on 8 devices: 138 GB each, never in 80 GiB.
    match reason(4, 8, 1) {
        Some(Rejection::Memory {
            needs_bytes,
            have_bytes,
        }) => {
            assert!(needs_bytes > 16.0 * m.params() as f64 / 8.0);
            assert_eq!(have_bytes, 80.0 * GIB);
        }
        other => panic!("{other:?}"),
    }
    // Everything ranked fits by one of the two counts at least (between
    // them it is tight, not refused).
    for c in &plan.ranked {
        assert!(c.memory.range().0 <= 80.0 * GIB, "{}", c.layout);
    }
    // The grouped reasons name every kind, the memory one with its closest case.
    let losses = plan.losses();
    let group = |g: &str| losses.iter().find(|l| l.group == g);
    assert!(group("tensor parallel across nodes").is_some());
    assert!(group("invalid split (Megatron's rule)").is_some());
    assert!(group("global batch does not divide").is_some());
    let mem = group("does not fit in memory").unwrap();
    assert!(mem.detail.starts_with("closest: needs"), "{}", mem.detail);
    let closest = plan
        .rejected
        .iter()
        .filter_map(|r| match r.reason {
            Rejection::Memory { needs_bytes, .. } => Some(needs_bytes),
            _ => None,
        })
        .fold(f64::INFINITY, f64::min);
    let ex = plan
        .rejected
        .iter()
        .find(|r| r.layout == mem.example)
        .unwrap();
    assert!(matches!(ex.reason, Rejection::Memory { needs_bytes, .. } if needs_bytes == closest));
}

#[test]
fn tensor_parallel_stays_in_the_node_when_the_network_is_16x_slower() {
    // GPT-3 175B on 8 nodes of 8 (96 heads split 16 ways too), with
    // Megatron's usual sequence parallelism and selective recomputation (so
    // that 8-way layouts fit too), TP across nodes allowed: the planner
    // still keeps it inside.
    let m = preset("gpt3-175b");
    let intra = Wire::ring(LinkParams::from_gbps_us(400.0, 5.0));
    let inter = Wire::ring(LinkParams::from_gbps_us(25.0, 10.0));
    let mut input = PlanInput::new(m, 256, 64, 8, 400e12, intra, inter);
    input.allow_tp_across_nodes = true;
    input.memory_bytes = Some(80.0 * GIB);
    input.sequence_parallel = true;
    input.recompute = Recompute::Selective;
    let plan = plan(&input).unwrap();
    assert!(
        plan.ranked.iter().any(|c| c.layout.tp == 8),
        "an 8-way layout must fit for the rule to mean anything"
    );
    assert!(
        plan.ranked.iter().any(|c| c.layout.tp == 16),
        "a 16-way layout must fit for the rule to mean anything"
    );
    let best = &plan.ranked[0];
    assert!(best.layout.tp <= 8, "{}", best.layout);
    assert_eq!(best.tp_wire, WireKind::Intra);
    // The best 16-way layout loses to communication of its tensor-parallel group.
    let tp16 = plan.ranked.iter().find(|c| c.layout.tp == 16).unwrap();
    assert_eq!(tp16.tp_wire, WireKind::Inter);
    assert_eq!(tp16.dominant_overhead(), Loss::TpComm);
}

#[test]
fn more_microbatches_when_the_bubble_dominates() {
    // 8 stages forced (8 layers, one per device, no memory to spare for
    // fewer stages is not needed: look at the 8-stage layouts).
    let m = equal_stages(8);
    let w = Wire::ring(LinkParams::from_gbps_us(100.0, 1.0));
    let plan = plan(&PlanInput::new(m, 64, 8, 8, 1e9, w.clone(), w)).unwrap();
    let eight: Vec<&Costed> = plan
        .ranked
        .iter()
        .filter(|c| c.layout.pp == 8 && c.layout.schedule == "1f1b")
        .collect();
    let best = eight[0];
    assert_eq!(best.layout.microbatches, 64, "{}", best.layout);
    let few = eight.iter().find(|c| c.layout.microbatches == 8).unwrap();
    assert!(few.bubble_s / few.step_s > 0.4);
    assert!(best.bubble_s / best.step_s < 0.15);
    assert_eq!(few.dominant_overhead(), Loss::Bubble);
}

#[test]
fn extrapolation_matches_full_simulation() {
    // Unequal stages (a heavier last stage) and costly messages.
    for (kind, v) in [
        (ScheduleKind::GPipe, 1),
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::Interleaved, 2),
        (ScheduleKind::LoopedBfs, 2),
        (ScheduleKind::InterleavedZb, 2),
        (ScheduleKind::ZbV, 2),
        (ScheduleKind::DualPipeV, 2),
    ] {
        let stages = 4 * v;
        let mut sc = vec![StageCosts::split(1.0, 1.2, 0.8); stages];
        sc[stages - 1] = StageCosts::split(1.5, 1.7, 1.3);
        let costs = SimCosts {
            stages: sc,
            latency: 0.1,
            bandwidth: 10.0,
            message_bytes: 2.0,
        };
        // A multiple of 4: PyTorch's interleaved zero bubble changes its rounds otherwise.
        let m = 40;
        let (t, extended) = pipeline_makespan(kind, 4, m, v as u64, &costs).unwrap();
        assert!(extended);
        let full = simulate(&generate(kind, 4, m as usize, v).unwrap(), &costs)
            .unwrap()
            .makespan;
        assert!(close(t, full, 1e-9), "{kind}: {t} vs {full}");
    }
}

#[test]
fn bad_inputs_are_errors() {
    let w = free_wire();
    let ok = PlanInput::new(preset("tiny"), 8, 8, 8, 1e9, w.clone(), w);
    assert!(plan(&ok).is_ok());
    let mut x = ok.clone();
    x.gpus = 0;
    assert_eq!(plan(&x), Err(PlanError::Zero { what: "devices" }));
    let mut x = ok.clone();
    x.flops_per_s = f64::NAN;
    assert!(matches!(plan(&x), Err(PlanError::BadCompute(_))));
    let mut x = ok.clone();
    x.gpus = 12;
    assert!(matches!(plan(&x), Err(PlanError::PartialNode { .. })));
    let mut x = ok.clone();
    x.inter.link.beta_s_per_byte = f64::INFINITY;
    assert!(matches!(plan(&x), Err(PlanError::BadWire { .. })));
    let mut x = ok.clone();
    x.memory_bytes = Some(-1.0);
    assert!(matches!(plan(&x), Err(PlanError::BadMemory(_))));
    // Figures a million times below any device: a step of years, refused.
    let mut x = ok.clone();
    x.flops_per_s = 1e-300;
    let e = plan(&x).unwrap_err();
    assert!(matches!(e, PlanError::BadCompute(_)));
    assert!(e.to_string().ends_with("(got 1e-300 FLOP/s)"), "{e}");
    let mut x = ok.clone();
    x.intra.link.beta_s_per_byte = 1e300;
    assert!(matches!(plan(&x), Err(PlanError::BadWire { .. })));
    let mut x = ok.clone();
    x.inter.link.alpha_s = 1e6;
    assert!(matches!(plan(&x), Err(PlanError::BadWire { .. })));
    let mut x = ok;
    x.memory_bytes = Some(1e-300);
    assert!(matches!(plan(&x), Err(PlanError::BadMemory(_))));
}

/// A plan on a described device (A100 presets), costed by operation.
fn on_device(model: Preset, batch: u64, gpus: u64) -> PlanInput {
    use crate::model::device::Device;
    use crate::model::opcost::{Attention, FlashKernel, GradAccumulation, OpModel};
    let d = Device::by_name("a100-sxm4-80gb").unwrap();
    let ops = OpModel::of_device(
        &d,
        None,
        Attention::Flash,
        FlashKernel::FlashAttention2,
        GradAccumulation::Fused,
    );
    let mut input = PlanInput::new(
        model,
        batch,
        gpus,
        d.gpus_per_node,
        ops.gemm_flops,
        Wire::ring(d.intra_link()),
        Wire::ring(d.inter_link()),
    );
    input.ops = Some(ops);
    input.peak_flops = Some(d.peak_tflops * 1e12);
    input.rails = true;
    input.memory_bytes = Some(d.memory_bytes());
    input
}

/// Megatron's uneven split: Llama 3 405B's 126 layers on 16 stages are
/// 7, 8 x 14, 7; a split that leaves the last stage nothing is none.
#[test]
fn layers_that_do_not_divide_split_megatrons_way() {
    assert_eq!(uneven_split(126, 16), Some((7, 7)));
    assert_eq!(uneven_split(80, 3), Some((27, 26)));
    assert_eq!(uneven_split(96, 16), None, "96 divides by 16");
    assert_eq!(uneven_split(5, 8), None, "fewer layers than stages");
    let l = Layout {
        dp: 1,
        tp: 8,
        cp: 1,
        pp: 16,
        schedule: "1f1b".into(),
        chunks: 1,
        micro_batch: 1,
        microbatches: 32,
        first_stage_layers: 7,
        last_stage_layers: 7,
        uneven: true,
        shard: Shard::None,
        shard_group: 1,
        ep: 1,
        etp: 1,
    };
    let stages = l.stage_layers(126);
    assert_eq!(stages.len(), 16);
    assert_eq!(stages.iter().sum::<u64>(), 126);
    assert_eq!((stages[0], stages[1], stages[15]), (7, 8, 7));
}

/// A named `vpp` beyond the search's range is costed as named (NeMo's
/// Nemotron-4 340B recipe runs 96 layers as pp 8, vpp 12); the search
/// itself stops at `max_chunks`.
#[test]
fn a_named_vpp_beyond_the_search_is_costed() {
    let mut input = on_device(preset("gpt3-175b"), 256, 512);
    input.memory_bytes = None;
    input.max_chunks = 8;
    let q = LayoutQuery {
        dp: 8,
        tp: 8,
        pp: 8,
        chunks: Some(12),
        schedule: Some("interleaved".into()),
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let r = plan_layout(&input, &q).unwrap();
    assert_eq!(r.ranked.len(), 1, "{:?}", r.rejected);
    assert_eq!(r.ranked[0].layout.chunks, 12);
    let searched = plan_layout(
        &input,
        &LayoutQuery {
            chunks: None,
            ..q.clone()
        },
    )
    .unwrap();
    assert!(searched.ranked.iter().all(|c| c.layout.chunks <= 8));
}

/// Llama 3's schedule (Dubey et al. 2024, 3.3.2): 126 layers in chunks of
/// one on 16 x 8 stages, the first chunk the embedding alone and the last
/// the output layer alone: the query's first=0, last=0 is that split, not
/// an even one, and the rank holding the empty chunk computes the least.
#[test]
fn a_chunk_may_hold_the_embedding_or_the_output_layer_alone() {
    let mut input = on_device(preset("llama3-405b"), 2048, 8192);
    input.memory_bytes = None;
    input.max_chunks = 8;
    let q = LayoutQuery {
        dp: 64,
        tp: 8,
        pp: 16,
        chunks: Some(8),
        schedule: Some("interleaved".into()),
        micro_batch: Some(1),
        first_last: Some((0, 0)),
        ..LayoutQuery::default()
    };
    let r = plan_layout(&input, &q).unwrap();
    assert_eq!(r.ranked.len(), 1, "{:?}", r.rejected);
    let l = &r.ranked[0].layout;
    assert!(l.is_uneven() && l.to_string().contains("layers first=0 last=0"));
    let stages = l.stage_layers(126);
    assert_eq!(stages.len(), 128);
    assert_eq!(
        (stages[0], stages[1], stages[126], stages[127]),
        (0, 1, 1, 0)
    );
    assert_eq!(stages.iter().sum::<u64>(), 126);
    // Without the split the 126 layers do not fill 128 chunks.
    let even = LayoutQuery {
        first_last: None,
        ..q.clone()
    };
    assert!(plan_layout(&input, &even).unwrap().ranked.is_empty());
}

/// `--layout`: the query's split only, costed with its uneven split;
/// a world that is not the cluster is an error; on a device every part
/// adds up to the step and MFU is below HFU with full recomputation.
#[test]
fn a_named_layout_is_costed_and_its_parts_add_up() {
    let mut input = on_device(preset("llama3-405b"), 2048, 16384);
    input.memory_bytes = None;
    input.sequence_parallel = true;
    input.distributed_optimizer = true;
    input.dp_overlap = true;
    let q = LayoutQuery {
        dp: 128,
        tp: 8,
        pp: 16,
        schedule: Some("1f1b".into()),
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let r = plan_layout(&input, &q).unwrap();
    assert_eq!(r.ranked.len(), 1, "{:?}", r.rejected);
    let c = &r.ranked[0];
    assert_eq!(
        (c.layout.first_stage_layers, c.layout.last_stage_layers),
        (7, 7)
    );
    let parts = c.compute_s + c.tp_comm_s + c.bubble_s + c.dp_comm_s + c.optimizer_s;
    assert!(close(parts, c.step_s, 1e-9), "{parts} {c:?}");
    assert!(c.dp_comm_s <= c.dp_comm_total_s + 1e-12);
    let p = c.compute_parts.unwrap();
    assert!(close(
        p.gemm_s + p.attention_s + p.memory_s + p.logits_s,
        c.compute_s,
        1e-9
    ));
    let mfu = c.mfu.unwrap();
    assert!(mfu > 0.0 && mfu < 1.0 && close(mfu, c.hfu.unwrap(), 1e-12));
    let wrong = LayoutQuery {
        dp: 64,
        ..q.clone()
    };
    assert!(matches!(
        plan_layout(&input, &wrong),
        Err(PlanError::LayoutWorld { .. })
    ));
    input.recompute = Recompute::Full;
    let full = &plan_layout(&input, &q).unwrap().ranked[0];
    assert!(full.hfu.unwrap() > full.mfu.unwrap());
}

/// Across nodes with a rail per GPU, a data-parallel group with 8 members
/// in each node reduces over 8 NICs at once: its reduction is the 1-member
/// group's over 8 (bandwidth terms), and overlapping it never costs more.
#[test]
fn a_data_parallel_group_crosses_nodes_over_every_rail_it_has() {
    let mut input = on_device(preset("gpt3-1.3b"), 512, 64);
    input.memory_bytes = None;
    let cost = |input: &PlanInput, tp| {
        let q = LayoutQuery {
            dp: 64 / tp,
            tp,
            pp: 1,
            micro_batch: Some(1),
            ..LayoutQuery::default()
        };
        plan_layout(input, &q).unwrap().ranked[0].clone()
    };
    // tp 1: 8 members per node; tp 8: one. Per GPU the tp-8 rank holds an
    // eighth of the gradients, the tp-1 rank all of them over 8 rails.
    let wide = cost(&input, 1);
    let narrow = cost(&input, 8);
    assert_eq!(wide.dp_wire, WireKind::Inter);
    let per_byte = |c: &Costed| c.dp_comm_total_s / (c.memory.params * 2.0);
    assert!(
        per_byte(&wide) < per_byte(&narrow) / 4.0,
        "{} {}",
        per_byte(&wide),
        per_byte(&narrow)
    );
    // Without rails the 8 members share one wire's bandwidth.
    input.rails = false;
    assert!(cost(&input, 1).dp_comm_total_s > 4.0 * wide.dp_comm_total_s);
    input.rails = true;
    input.dp_overlap = true;
    let over = cost(&input, 1);
    assert!(over.dp_comm_s <= over.dp_comm_total_s);
    assert!(over.step_s <= wide.step_s + 1e-12);
}

/// Flash attention keeps no score tensor: less activation memory than
/// the same layout without it.
#[test]
fn flash_attention_stores_no_scores() {
    use crate::model::opcost::Attention;
    let mut input = on_device(preset("gpt3-175b"), 64, 64);
    input.memory_bytes = None;
    let q = LayoutQuery {
        dp: 1,
        tp: 8,
        pp: 8,
        schedule: Some("1f1b".into()),
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let flash = plan_layout(&input, &q).unwrap().ranked[0].memory;
    if let Some(ops) = input.ops.as_mut() {
        ops.attention = Attention::Unfused;
    }
    let unfused = plan_layout(&input, &q).unwrap().ranked[0].memory;
    assert!(flash.activation_bytes < 0.8 * unfused.activation_bytes);
    assert_eq!(flash.states_bytes, unfused.states_bytes);
}

/// Sharded data parallel: each mode holds what ZeRO's paper says per
/// parameter (16, 4 + 12/D, 2 + 14/D, 16/D bytes, plus what a step holds
/// whole for a moment), ZeRO-3 moves the most, hybrid sharding shards over
/// the node and adds the replicas' all-reduce, and the parts add up.
#[test]
fn sharded_data_parallel_holds_and_moves_what_zero_says() {
    let mut input = on_device(preset("gpt3-1.3b"), 512, 64);
    input.memory_bytes = None;
    input.dp_overlap = true;
    let cost = |input: &PlanInput, shard, group: Option<u64>| {
        let q = LayoutQuery {
            dp: 64,
            tp: 1,
            pp: 1,
            micro_batch: Some(8),
            shard: Some(shard),
            shard_group: group,
            ..LayoutQuery::default()
        };
        let r = plan_layout(input, &q).unwrap();
        r.ranked
            .into_iter()
            .find(|c| group.is_none_or(|g| c.layout.shard_group == g))
            .unwrap()
    };
    let none = cost(&input, Shard::None, None);
    let z1 = cost(&input, Shard::Zero1, None);
    let z2 = cost(&input, Shard::Zero2, None);
    let z3 = cost(&input, Shard::Zero3, None);
    let p = none.memory.params;
    let m = preset("gpt3-1.3b");
    let layer = m.params_per_layer() as f64;
    assert!(close(none.memory.states_bytes, 16.0 * p, 1e-12));
    assert!(close(
        z1.memory.states_bytes,
        (4.0 + 12.0 / 64.0) * p,
        1e-12
    ));
    assert!(close(
        z2.memory.states_bytes,
        (2.0 + 14.0 / 64.0) * p + 2.0 * layer,
        1e-12
    ));
    assert!(close(
        z3.memory.states_bytes,
        16.0 / 64.0 * p + 6.0 * layer,
        1e-12
    ));
    // ZeRO-3 gathers every layer twice a microbatch beside its scatter;
    // ZeRO-2 scatters and gathers the updated weights once: with one
    // microbatch, 2 AG + RS against AG + RS.
    assert!(
        z3.dp_comm_total_s > 1.5 * z2.dp_comm_total_s,
        "{z3:?} {z2:?}"
    );
    for c in [&none, &z1, &z2, &z3] {
        let parts = c.compute_s + c.tp_comm_s + c.bubble_s + c.dp_comm_s + c.optimizer_s;
        assert!(close(parts, c.step_s, 1e-9), "{:?}", c.layout);
        assert!(c.dp_comm_s <= c.dp_comm_total_s + 1e-12, "{:?}", c.layout);
    }
    // Adam shrinks with its shard; the passes over the whole gradient
    // buffer do not.
    let ops = input.ops.unwrap();
    let buffer = ops.stream(p * input.step.grad_buffer_bytes());
    assert!(buffer > 0.0);
    assert!(close(
        z1.optimizer_s - buffer,
        (none.optimizer_s - buffer) / 64.0,
        1e-9
    ));
    // Hybrid: sharded over the 8 data ranks of a node, replicated across.
    let h = cost(&input, Shard::Zero3, Some(8));
    assert_eq!((h.layout.shard_group, h.layout.dp), (8, 64));
    assert!(close(
        h.memory.states_bytes,
        16.0 / 8.0 * p + 6.0 * layer,
        1e-12
    ));
    // Its gathers stay on NVLink: less exposed than sharding across nodes
    // over the same rails, though it adds the replicas' all-reduce.
    assert!(h.dp_comm_total_s < z3.dp_comm_total_s, "{h:?} {z3:?}");
    // The search tries hybrid groups only when asked.
    input.shard_modes = vec![Shard::Zero3];
    let plain = plan(&input).unwrap();
    assert!(plain
        .ranked
        .iter()
        .all(|c| c.layout.shard_group == c.layout.dp || c.layout.dp == 1));
    input.hybrid = true;
    let hybrid = plan(&input).unwrap();
    assert!(hybrid
        .ranked
        .iter()
        .any(|c| c.layout.shard_group > 1 && c.layout.shard_group < c.layout.dp));
}

/// Llama 3 405B as Megatron-Core holds it (tp 8, pp 16, 1F1B, b = 1, the
/// distributed optimizer with fp32 gradients, sequence parallel, flash):
/// the busiest rank is rank 1 (15 microbatches of 8 layers, more than rank
/// 0's 16 of 7), its states are `6 + 12/dp` bytes a parameter, Megatron's
/// formula counts more than the planner, and 80 GiB between the two is
/// tight, not refused; below both counts it is refused.
#[test]
fn memory_is_counted_per_rank_and_tight_between_two_counts() {
    let mut input = on_device(preset("llama3-405b"), 2048, 8192);
    input.sequence_parallel = true;
    input.distributed_optimizer = true;
    input.step = crate::model::stack::Stack::by_name("megatron-core")
        .unwrap()
        .step;
    input.memory_bytes = None;
    let q = LayoutQuery {
        dp: 64,
        tp: 8,
        pp: 16,
        schedule: Some("1f1b".into()),
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let m = plan_layout(&input, &q).unwrap().ranked[0].memory;
    assert_eq!(m.in_flight, 15);
    let l = preset("llama3-405b");
    let params = 8.0 * l.params_per_layer() as f64 / 8.0;
    assert!(close(m.params, params, 1e-12), "{} {params}", m.params);
    assert!(close(m.states_bytes, params * (6.0 + 12.0 / 64.0), 1e-12));
    // 15 x 8 layers of 31.75 s b h / t bytes.
    let act = 120.0 * 8192.0 * 16384.0 * 31.75 / 8.0;
    assert!(close(m.activation_bytes, act, 1e-12));
    assert!(m.formula_bytes > m.total());
    let (lo, hi) = m.range();
    assert!(lo < 80.0 * GIB && hi > 80.0 * GIB, "{lo} {hi}");
    assert!(m.tight(80.0 * GIB));
    input.memory_bytes = Some(80.0 * GIB);
    assert_eq!(plan_layout(&input, &q).unwrap().ranked.len(), 1);
    input.memory_bytes = Some(0.95 * lo);
    let r = plan_layout(&input, &q).unwrap();
    assert!(r.ranked.is_empty() && r.rejected.len() == 1);
}

/// Megatron-LM's formula for a GPT layout with the distributed optimizer
/// (theoretical_memory_usage.py by hand): 4 layers of 12h^2 + 13h and
/// the embedding over t at 6 + 12/dp bytes; 34 s b h a layer times L
/// over t with sequence parallelism, and the embedding's input and mask.
#[test]
fn megatrons_formula_by_hand() {
    let model = Preset {
        name: "small",
        source: "test",
        arch: Arch::Gpt,
        layers: 8,
        hidden: 1024,
        heads: 8,
        kv_heads: 8,
        ffn: 4096,
        seq: 2048,
        vocab: 32000,
        moe: None,
    };
    let mut input = on_device(model, 64, 16);
    input.memory_bytes = None;
    input.sequence_parallel = true;
    input.distributed_optimizer = true;
    input.step.grad_bytes = 4;
    let q = LayoutQuery {
        dp: 4,
        tp: 2,
        pp: 2,
        schedule: Some("1f1b".into()),
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let m = plan_layout(&input, &q).unwrap().ranked[0].memory;
    let (h, s, v) = (1024.0, 2048.0, 32000.0);
    let per_layer = 12.0 * h * h + 13.0 * h;
    let weights = (4.0 * per_layer + v * h) / 2.0 * (6.0 + 12.0 / 4.0);
    let act = (s * h * 34.0 * 8.0 + 8.0 * s * 2.0 + s * h * 2.0) / 2.0;
    assert!(
        close(m.formula_bytes, weights + act, 1e-12),
        "{} {}",
        m.formula_bytes,
        weights + act
    );
}

/// Overlapping tensor-parallel collectives with their GEMMs exposes less
/// communication and slows the GEMMs by the SMs it holds; data-parallel
/// collectives that overlap compute take SMs from it; a host that cannot
/// launch a layer's kernels as fast as they run sets the pass's time.
#[test]
fn overlap_trades_exposure_for_slower_compute_and_the_host_can_bind() {
    let mut input = on_device(preset("gpt3-175b"), 256, 256);
    input.memory_bytes = None;
    input.sequence_parallel = true;
    input.distributed_optimizer = true;
    input.dp_overlap = true;
    let q = LayoutQuery {
        dp: 4,
        tp: 8,
        pp: 8,
        schedule: Some("1f1b".into()),
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let plain = plan_layout(&input, &q).unwrap().ranked[0].clone();
    input.step.tp_overlap = true;
    input.step.tp_sms = (16.0, 1.0);
    let overlapped = plan_layout(&input, &q).unwrap().ranked[0].clone();
    assert!(overlapped.tp_comm_s < 0.5 * plain.tp_comm_s);
    assert!(overlapped.compute_s > plain.compute_s);
    input.step.dp_sm_share = 0.15;
    let shared = plan_layout(&input, &q).unwrap().ranked[0].clone();
    assert!(shared.dp_comm_s > overlapped.dp_comm_s);
    assert!(close(
        shared.compute_s
            + shared.tp_comm_s
            + shared.bubble_s
            + shared.dp_comm_s
            + shared.optimizer_s,
        shared.step_s,
        1e-9
    ));
    let tiny = PlanInput {
        step: crate::model::stack::StepModel {
            launch_s: 1e-3,
            ..crate::model::stack::StepModel::default()
        },
        ..on_device(preset("tiny"), 8, 8)
    };
    let q = LayoutQuery {
        dp: 8,
        tp: 1,
        pp: 1,
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let bound = plan_layout(&tiny, &q).unwrap().ranked[0].clone();
    let free = plan_layout(
        &PlanInput {
            step: crate::model::stack::StepModel::default(),
            ..tiny.clone()
        },
        &q,
    )
    .unwrap()
    .ranked[0]
        .clone();
    let layers = preset("tiny").layers as f64;
    // 36 launches a layer a microbatch at 1 ms each, one microbatch.
    assert!(bound.compute_s >= 36e-3 * layers, "{}", bound.compute_s);
    assert!(free.compute_s < 1e-3);
}

/// Context parallelism: a cp layout's activations are `1/cp` of the
/// same layout without it, its gradients reduce over `dp x cp`, its parts
/// (with the exchange) add up to the step, and the search tries cp only
/// up to `max_cp`.
#[test]
fn context_parallel_layouts_split_the_sequence() {
    let mut m = preset("llama3-8b");
    m.seq = 32768;
    let mut input = on_device(m, 64, 64);
    input.memory_bytes = None;
    input.sequence_parallel = true;
    input.distributed_optimizer = true;
    let named = |input: &PlanInput, dp, cp| {
        let q = LayoutQuery {
            dp,
            tp: 2,
            cp,
            pp: 1,
            micro_batch: Some(1),
            ..LayoutQuery::default()
        };
        plan_layout(input, &q).unwrap().ranked.remove(0)
    };
    let flat = named(&input, 32, 1);
    let split = named(&input, 8, 4);
    assert_eq!(split.layout.grad_ranks(), 32);
    assert_eq!(split.layout.shard_group, 32, "ZeRO-1 over dp x cp");
    let per_mb = |c: &Costed| c.memory.activation_bytes / c.memory.in_flight.max(1) as f64;
    // Logits scale with the tokens too; everything per token is 1/cp.
    assert!((per_mb(&split) * 4.0 / per_mb(&flat) - 1.0).abs() < 0.02);
    assert!(split.cp_comm_s > 0.0 && flat.cp_comm_s == 0.0);
    let parts = split.compute_s
        + split.tp_comm_s
        + split.cp_comm_s
        + split.bubble_s
        + split.dp_comm_s
        + split.optimizer_s;
    assert!(
        (parts - split.step_s).abs() < 1e-9 * split.step_s,
        "{split:?}"
    );
    // A ring across nodes exposes more than one inside a node.
    let across = {
        let mut i = input.clone();
        i.gpus_per_node = 4;
        named(&i, 8, 4)
    };
    assert!(across.cp_comm_s > split.cp_comm_s);
    let searched = plan(&input).unwrap();
    assert!(searched.ranked.iter().all(|c| c.layout.cp == 1));
    input.max_cp = 4;
    let searched = plan(&input).unwrap();
    assert!(searched.ranked.iter().any(|c| c.layout.cp == 4));
    assert!(searched.ranked.iter().all(|c| c.layout.cp <= 4));
}

/// FP8 linear layers: the GEMMs twice as fast, the step faster but not
/// twice (attention, logits and norms stay, casts are added), and the
/// FP8 weight copies held, or none beside FP8 primary weights.
#[test]
fn fp8_speeds_the_linear_layers_only() {
    let mut input = on_device(preset("llama3-8b"), 64, 8);
    input.memory_bytes = None;
    let q = LayoutQuery {
        dp: 8,
        tp: 1,
        pp: 1,
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let bf16 = plan_layout(&input, &q).unwrap().ranked.remove(0);
    if let Some(ops) = input.ops.as_mut() {
        ops.fp8_gemm_flops = Some(2.0 * ops.gemm_flops);
    }
    let fp8 = plan_layout(&input, &q).unwrap().ranked.remove(0);
    let (pb, pf) = (bf16.compute_parts.unwrap(), fp8.compute_parts.unwrap());
    assert!(pf.gemm_s < 0.6 * pb.gemm_s && pf.gemm_s > 0.45 * pb.gemm_s);
    assert_eq!(pf.attention_s, pb.attention_s);
    assert_eq!(pf.logits_s, pb.logits_s);
    assert!(pf.memory_s > pb.memory_s, "the casts");
    assert!(fp8.step_s < bf16.step_s && fp8.step_s > 0.5 * bf16.step_s);
    let linear = 32.0 * input.model.matmul_params_per_layer() as f64;
    let extra = fp8.memory.states_bytes - bf16.memory.states_bytes;
    assert!(
        (extra - 2.0 * linear).abs() < 1e-6 * extra,
        "{extra} {linear}"
    );
    // FP8 primary weights: the FP8 weight and its transpose in the 16-bit
    // weight's place; the first microbatch refills transposes only.
    if let Some(ops) = input.ops.as_mut() {
        ops.fp8_params = true;
    }
    let primary = plan_layout(&input, &q).unwrap().ranked.remove(0);
    assert_eq!(primary.memory.states_bytes, bf16.memory.states_bytes);
    assert_eq!(primary.memory.activation_bytes, fp8.memory.activation_bytes);
    assert!(primary.step_s < fp8.step_s);
}

/// An MoE model's layouts with `cp > 1` are rejected with the reason, and
/// FP8 with experts is an input error: neither is costed.
#[test]
fn moe_refuses_context_parallelism_and_fp8() {
    let mut input = on_device(preset("mixtral-8x7b"), 64, 16);
    input.memory_bytes = None;
    let q = LayoutQuery {
        dp: 4,
        tp: 2,
        cp: 2,
        pp: 1,
        ep: Some(8),
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let named = plan_layout(&input, &q).unwrap();
    assert!(named.ranked.is_empty());
    assert!(named.rejected.iter().any(|r| matches!(&r.reason,
        Rejection::InvalidSplit { rule } if rule.contains("MoE model is not modelled"))));
    input.max_cp = 2;
    let searched = plan(&input).unwrap();
    assert!(!searched.ranked.is_empty());
    assert!(searched.ranked.iter().all(|c| c.layout.cp == 1));
    if let Some(ops) = input.ops.as_mut() {
        ops.fp8_gemm_flops = Some(2.0 * ops.gemm_flops);
    }
    assert!(matches!(plan(&input), Err(PlanError::Fp8Experts)));
}

/// A layout of one pipeline stage, `dp x tp`, microbatches of `b`.
fn one_stage(dp: u64, tp: u64, b: u64) -> LayoutQuery {
    LayoutQuery {
        dp,
        tp,
        pp: 1,
        micro_batch: Some(b),
        ..LayoutQuery::default()
    }
}

/// Megatron's backward hook adds the embedding's dense gradient into its
/// main gradient every microbatch (the first stage's compute grows by
/// `M` passes of `V/t x h x (2 + 2 x 4)` bytes on top of PyTorch's
/// zero-filled gradient); the passes over the whole gradient buffer are
/// once a step and not sharded.
#[test]
fn the_embeddings_gradient_and_the_gradient_buffer_are_streamed() {
    let mut input = on_device(preset("gpt3-1.3b"), 64, 8);
    input.distributed_optimizer = true;
    input.step.grad_bytes = 4;
    let q = one_stage(4, 2, 2);
    let plain = plan_layout(&input, &q).unwrap().ranked[0].clone();
    input.step.main_grad_hook = true;
    input.step.grad_buffer_passes = 4.0;
    let hooked = plan_layout(&input, &q).unwrap().ranked[0].clone();
    let ops = input.ops.unwrap();
    let m = preset("gpt3-1.3b");
    let table = m.vocab.div_ceil(2) as f64 * m.hidden as f64;
    let micro = hooked.layout.microbatches as f64;
    assert_eq!(micro, 8.0);
    assert!(close(
        hooked.compute_s - plain.compute_s,
        micro * ops.stream(table * 10.0),
        1e-9
    ));
    let p = hooked.memory.params;
    assert!(close(
        hooked.optimizer_s - plain.optimizer_s,
        ops.stream(p * 12.0),
        1e-9
    ));
}

/// A GPT whose output layer is untied holds both `V x h` tables: the
/// word embedding on the first stage and the output layer on the last.
#[test]
fn an_untied_gpt_holds_both_tables() {
    let m = preset("gpt3-1.3b");
    let mut input = on_device(m, 64, 8);
    let q = one_stage(4, 2, 2);
    let tied = plan_layout(&input, &q).unwrap().ranked[0].memory.params;
    assert!(close(tied, m.params() as f64 / 2.0, 1e-12), "{tied}");
    input.untied_output = true;
    let untied = plan_layout(&input, &q).unwrap().ranked[0].memory.params;
    let table = m.vocab as f64 * m.hidden as f64;
    assert!(
        close(untied, (m.params() as f64 + table) / 2.0, 1e-12),
        "{untied}"
    );
}

/// NeMo's optimizer (apex `DistributedFusedAdam` as NeMo 24.07 sets it):
/// bf16 gradients (2 bytes), master weights as 16-bit remainders (2/dp)
/// beside fp32 moments (8/dp), so `4 + 10/dp` bytes a parameter; with
/// FP8 weights full fp32 masters, `4 + 12/dp`. Its reduce-scatter moves
/// the bf16 gradients, half of Megatron-Core's fp32 ones, and the
/// parameters gather at the weights' 2 bytes either way.
#[test]
fn nemo_holds_remainders_and_reduces_bf16_gradients() {
    use crate::comm::Collective;
    use crate::model::device::Device;
    use crate::model::stack::Stack;
    let model = preset("gpt3-1.3b");
    let q = LayoutQuery {
        dp: 4,
        tp: 2,
        pp: 1,
        micro_batch: Some(1),
        ..LayoutQuery::default()
    };
    let run = |stack: &str, fp8_params: bool| {
        let mut input = on_device(model, 64, 8);
        input.memory_bytes = None;
        input.sequence_parallel = true;
        input.distributed_optimizer = true;
        input.step = Stack::by_name(stack).unwrap().step;
        if let Some(ops) = input.ops.as_mut() {
            ops.fp8_params = fp8_params;
        }
        plan_layout(&input, &q).unwrap().ranked[0].clone()
    };
    let nemo = run("nemo-24", false);
    let params = nemo.memory.params;
    assert!(params > 0.0);
    assert!(close(
        nemo.memory.states_bytes,
        params * (4.0 + 10.0 / 4.0),
        1e-12
    ));
    let fp8 = run("nemo-24", true);
    assert!(close(
        fp8.memory.states_bytes,
        params * (4.0 + 12.0 / 4.0),
        1e-12
    ));
    let mcore = run("megatron-core", false);
    assert!(close(
        mcore.memory.states_bytes,
        params * (6.0 + 12.0 / 4.0),
        1e-12
    ));
    // The same wire; only the reduce-scatter's bytes differ.
    let wire = Wire::ring(Device::by_name("a100-sxm4-80gb").unwrap().intra_link());
    let rs = |bytes: f64| wire.seconds(Collective::ReduceScatter, 4, bytes as u64);
    let less = rs(4.0 * params) - rs(2.0 * params);
    assert!(less > 0.0);
    assert!(
        close(mcore.dp_comm_total_s - nemo.dp_comm_total_s, less, 1e-9),
        "{} {} {less}",
        mcore.dp_comm_total_s,
        nemo.dp_comm_total_s
    );
}
