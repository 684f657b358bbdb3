//! `report plan`'s input: the model, cluster and software from the flags,
//! and the compute rate and the wires from the results folders' fits
//! (or the flags that override them), as a [`PlanInput`] and the start of
//! the [`PlanFile`] that says where each figure came from.

use super::file::{PlanFile, Sourced, PLAN_SCHEMA};
use super::PlanArgs;
use crate::load::{load_sources, Source};
use crate::predict;
use crate::units;
use anyhow::{anyhow, bail, Result};
use parbench::model::context::CpComm;
use parbench::model::device::Device;
use parbench::model::footprint::Recompute;
use parbench::model::moe::Dispatcher;
use parbench::model::opcost::{Attention, FlashKernel, GradAccumulation, OpModel};
use parbench::model::plan::{PlanInput, Shard, Wire};
use parbench::model::precision::Precision;
use parbench::model::presets::Arch;
use parbench::model::stack::Stack;
use parbench::model::{LinkParams, Preset};
use parbench::stats::median_of_finite;
use std::collections::BTreeMap;

/// Limits on a custom shape and cluster: beyond them a figure means
/// nothing (a typo), and products of them must stay far from overflow.
const MAX_LAYERS: u64 = 100_000;
const MAX_DIMENSION: u64 = 10_000_000;
const MAX_DEVICES: u64 = 100_000_000;
const MAX_NODE_DEVICES: u64 = 4096;

/// The model of the flags.
fn model_of(a: &PlanArgs) -> Result<Preset> {
    let custom = [a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, a.vocab];
    if let Some(name) = &a.model {
        if custom.iter().any(Option::is_some) {
            bail!("--model {name}: give a preset or the shape flags (--layers, --hidden, --heads, --kv-heads, --ffn, --vocab), not both");
        }
        let mut p = Preset::by_name(name).ok_or_else(|| {
            anyhow!(
                "--model {name}: unknown preset (known: {})",
                Preset::names().join(", ")
            )
        })?;
        if let Some(s) = a.seq {
            p.seq = s;
        }
        return a.moe.apply_to(p, false);
    }
    let need = |v: Option<u64>, flag: &str| {
        v.ok_or_else(|| anyhow!("give --model PRESET or the whole shape: {flag} is missing"))
    };
    let heads = need(a.heads, "--heads")?;
    // Grouped-query attention shares each key/value head among a whole
    // number of query heads.
    if let Some(kv) = a.kv_heads {
        if kv == 0 || heads % kv != 0 {
            bail!("--kv-heads {kv} must divide --heads {heads} (each key/value head serves a whole number of query heads)");
        }
    }
    let arch = match a.arch.as_str() {
        "gpt" => Arch::Gpt,
        "llama" => Arch::Llama,
        other => bail!("--arch {other}: expected gpt or llama"),
    };
    let p = Preset {
        name: "custom",
        source: "flags",
        arch,
        layers: need(a.layers, "--layers")?,
        hidden: need(a.hidden, "--hidden")?,
        heads,
        kv_heads: a.kv_heads.unwrap_or(heads),
        ffn: need(a.ffn, "--ffn")?,
        seq: need(a.seq, "--seq")?,
        vocab: a.vocab.unwrap_or(50257),
        moe: None,
    };
    a.moe.apply_to(p, true)
}

/// `GBPS,US` of `flag`, by the library's one parser.
fn parse_link(flag: &str, s: &str) -> Result<LinkParams> {
    s.parse().map_err(|e| anyhow!("{flag} {s}: {e}"))
}

/// Whether a backend's all_reduce rows measure the wire inside a node.
fn is_intra(backend: &str) -> bool {
    matches!(backend, "local" | "nccl")
}

/// A fitted wire of the results folders.
struct Fitted {
    wire: Wire,
    from: String,
}

/// The alpha-beta fit of the best-covered all_reduce curve of each class
/// (intra: local/nccl; inter: tcp/mpi): the curve with the most ranks, then
/// the most sizes; out-of-place rows, median time per size.
fn fitted_wires(sources: &[Source]) -> (Option<Fitted>, Option<Fitted>) {
    // The last field: whether the run's noise guard said noisy.
    type Key<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a str,
        usize,
        &'a str,
        bool,
        bool,
    );
    let mut curves: BTreeMap<Key, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for s in sources {
        let oop = s
            .collectives
            .iter()
            .any(|r| r.collective == "all_reduce" && !r.in_place);
        let noisy: Vec<&str> = s
            .runs
            .iter()
            .filter(|r| r.noise().is_some_and(|n| n.noisy()))
            .map(|r| r.run_id.as_str())
            .collect();
        for r in &s.collectives {
            if r.collective != "all_reduce" || r.in_place == oop || r.bytes == 0 {
                continue;
            }
            curves
                .entry((
                    &s.label,
                    &r.backend,
                    &r.wire,
                    &r.algo,
                    r.world,
                    &r.dtype,
                    is_intra(&r.backend),
                    noisy.contains(&r.run_id.as_str()),
                ))
                .or_default()
                .entry(r.bytes)
                .or_default()
                .push(r.time_us);
        }
    }
    // Best: a quiet run before a noisy one, then the most ranks, then the most sizes.
    type Rank = (bool, usize, usize);
    let mut best: [Option<(Rank, Fitted)>; 2] = [None, None];
    for (k, sizes) in curves {
        let (label, backend, wire, algo, world, dtype, intra, noisy) = k;
        let points: Vec<(u64, f64)> = sizes
            .into_iter()
            .map(|(b, t)| (b, median_of_finite(t)))
            .collect();
        let measured = predict::ModelAlgo::of(algo);
        let Ok(fit) = predict::fit("all_reduce", &measured, world, &points) else {
            continue;
        };
        if fit.gbps.is_none() {
            continue;
        }
        let f = Fitted {
            wire: Wire {
                link: fit.link,
                algo: predict::planner_algo(&measured),
            },
            from: format!(
                "fit of all_reduce {backend}/{wire} {algo} np{world} {dtype} in {label} ({} sizes, rms error {}){}{}",
                fit.points,
                units::percent(fit.rms_rel_err),
                if noisy {
                    "; NOISY: the run's noise guard marked it, measure again"
                } else {
                    ""
                },
                if intra {
                    ""
                } else {
                    "; ranks on the hosts this ran on stand in for the network between nodes"
                }
            ),
        };
        let slot = &mut best[usize::from(!intra)];
        let rank = (!noisy, world, points.len());
        if slot.as_ref().is_none_or(|(r, _)| rank > *r) {
            *slot = Some((rank, f));
        }
    }
    let [a, b] = best;
    (a.map(|x| x.1), b.map(|x| x.1))
}

type LayerAt<'a> = (&'a Source, &'a parbench::results::LayerRow);

/// bench-layers' full-sequence rows (decode GEMMs are skinny) that `keep`
/// picks, at the largest shape (batch x seq x hidden) and the smallest
/// tensor-parallel degree measured there (one rank alone on its device:
/// unsharded GEMMs; on a CPU, ranks of a higher degree share its cores).
fn largest_block_rows<'a>(
    sources: &'a [Source],
    keep: impl Fn(&parbench::results::LayerRow) -> bool,
) -> Vec<LayerAt<'a>> {
    let rows: Vec<LayerAt> = sources
        .iter()
        .flat_map(|s| s.layers.iter().map(move |r| (s, r)))
        .filter(|(_, r)| !r.decode && keep(r))
        .collect();
    let work =
        |r: &parbench::results::LayerRow| r.batch.saturating_mul(r.seq).saturating_mul(r.hidden);
    let Some(largest) = rows.iter().map(|(_, r)| work(r)).max() else {
        return Vec::new();
    };
    let tp = rows
        .iter()
        .filter(|(_, r)| work(r) == largest)
        .map(|(_, r)| r.tp)
        .min();
    rows.into_iter()
        .filter(|(_, r)| work(r) == largest && Some(r.tp) == tp)
        .collect()
}

/// bench-layers' matrix-product rate, FLOP/s: the median GFLOP/s of
/// [`largest_block_rows`].
fn measured_flops(sources: &[Source]) -> Option<(f64, String)> {
    let at = largest_block_rows(sources, |r| {
        r.compute_gflops.is_finite() && r.compute_gflops > 0.0
    });
    let gflops = median_of_finite(at.iter().map(|(_, r)| r.compute_gflops));
    let (s, r) = at.first()?;
    let tps: Vec<String> = at.iter().map(|(_, r)| r.tp.to_string()).collect();
    Some((
        gflops * 1e9,
        format!(
            "bench-layers in {}: median of {} rows (preset {}, {} x {} x hidden {}, tp {}, {} {})",
            s.label,
            at.len(),
            r.preset,
            r.batch,
            r.seq,
            r.hidden,
            tps.join(","),
            r.backend,
            r.mode
        ),
    ))
}

/// The share of the device's GEMM rate a block measured on it sustains:
/// [`largest_block_rows`] run on a GPU (no CPU threads), their median compute time
/// against the same block costed by operation at the datasheet rate
/// (its GEMMs at full rate, its attention and memory-bound work as the
/// planner costs them). `None` without such rows.
fn measured_block_share(
    sources: &[Source],
    d: &parbench::model::device::Device,
    attention: Attention,
    flash_kernel: FlashKernel,
    accumulation: GradAccumulation,
) -> Option<(f64, String)> {
    let at = largest_block_rows(sources, |r| {
        r.threads == 0 && r.compute_us.is_finite() && r.compute_us > 0.0
    });
    let measured_us = median_of_finite(at.iter().map(|(_, r)| r.compute_us));
    let (s, r) = at.first()?;
    let arch = Preset::by_name(&r.preset).map_or(Arch::Gpt, |p| p.arch);
    let block = Preset {
        name: "measured",
        source: "bench-layers",
        arch,
        layers: 1,
        hidden: r.hidden,
        heads: r.heads,
        kv_heads: Preset::by_name(&r.preset).map_or(r.heads, |p| p.kv_heads),
        ffn: r.ffn,
        seq: r.seq,
        vocab: 1,
        moe: None,
    };
    let mut full = OpModel::of_device(d, None, attention, flash_kernel, accumulation);
    full.gemm_flops = d.gemm_tflops * 1e12;
    let t = full.block(
        &block,
        r.batch,
        r.seq,
        r.tp as u64,
        r.seq_parallel,
        Recompute::None,
    );
    let costed_us = 1e6
        * if r.mode == "train" {
            t.total()
        } else {
            t.forward
        };
    let share = costed_us / measured_us;
    if !(share.is_finite() && share > 0.0) {
        return None;
    }
    Some((
        share.min(1.0),
        format!(
            "bench-layers in {}: {} {} block, {} x {} x hidden {}, tp {}, {} us measured (median of {}) against {} us costed at {} TFLOP/s",
            s.label,
            r.preset,
            r.mode,
            r.batch,
            r.seq,
            r.hidden,
            r.tp,
            units::sig3(measured_us),
            at.len(),
            units::sig3(costed_us),
            units::sig3(d.gemm_tflops)
        ),
    ))
}

/// The plan's input from the flags and folders, and the file's header.
pub(super) fn prepare(a: &PlanArgs) -> Result<(PlanInput, PlanFile)> {
    let model = model_of(a)?;
    // clap asks for both unless --check is given, which never reaches here.
    let (Some(global_batch), Some(gpus)) = (a.global_batch, a.gpus) else {
        bail!("--global-batch and --gpus are required (or --against DIR)");
    };
    for (flag, v, max) in [
        ("--layers", model.layers, MAX_LAYERS),
        ("--hidden", model.hidden, MAX_DIMENSION),
        ("--heads", model.heads, MAX_DIMENSION),
        ("--ffn", model.ffn, MAX_DIMENSION),
        ("--seq", model.seq, MAX_DIMENSION),
        ("--vocab", model.vocab, MAX_DIMENSION),
        ("--global-batch", global_batch, MAX_DEVICES),
        ("--gpus", gpus, MAX_DEVICES),
    ] {
        if v > max {
            bail!("{flag} {v}: above {max}, the most a plan takes");
        }
    }
    if model.heads > model.hidden {
        bail!(
            "--heads {} is more than --hidden {}: a head needs at least one dimension",
            model.heads,
            model.hidden
        );
    }
    let device = super::layout::resolve_device(a.device.as_deref(), a.device_file.as_deref())?;
    let gpus_per_node = a
        .gpus_per_node
        .or(device.as_ref().map(|d| d.gpus_per_node))
        .unwrap_or(8);
    // Fewer devices than a node holds is a part of one node (half a DGX);
    // more must be whole nodes (checked below).
    if gpus_per_node > MAX_NODE_DEVICES {
        bail!("--gpus-per-node {gpus_per_node}: above {MAX_NODE_DEVICES}, more than any NVLink domain (NVL576)");
    }
    let recompute = match a.recompute.as_str() {
        "none" => Recompute::None,
        "selective" => Recompute::Selective,
        "full" => Recompute::Full,
        other => bail!("--recompute {other}: expected none, selective or full"),
    };
    if let Some(m) = a.memory {
        parbench::limits::GIB.check("--device-memory", m)?;
    }
    if let Some(t) = a.compute_tflops {
        parbench::limits::TFLOPS.check("--compute-tflops", t)?;
    }
    // Before asking for an inter-node wire: the node count must make sense.
    if gpus_per_node == 0 || (gpus > gpus_per_node && !gpus.is_multiple_of(gpus_per_node)) {
        bail!(
            "--gpus {} --gpus-per-node {}: not a whole number of nodes",
            gpus,
            gpus_per_node
        );
    }
    if a.top == 0 {
        bail!("--top 0: print at least one layout");
    }
    if a.max_cp == 0 || a.max_cp > MAX_DEVICES {
        bail!(
            "--max-cp {}: a context-parallel degree from 1 to {MAX_DEVICES}",
            a.max_cp
        );
    }
    let precision = Precision::by_name(&a.precision)
        .ok_or_else(|| anyhow!("--precision {}: expected bf16 or fp8", a.precision))?;
    if a.fp8_params && precision != Precision::Fp8 {
        bail!("--fp8-params: FP8 weights need --precision fp8");
    }
    // Context parallelism and FP8 are costed for dense models only.
    if model.moe.is_some() {
        if precision == Precision::Fp8 {
            bail!(
                "--precision fp8: FP8 expert layers are not modelled; an MoE model plans in bf16"
            );
        }
        if a.max_cp > 1 {
            bail!(
                "--max-cp {}: context parallelism of an MoE model is not modelled",
                a.max_cp
            );
        }
    }
    let cp_comm = match a.cp_comm_type.as_deref() {
        None => None,
        Some(n) => Some(
            n.parse::<CpComm>()
                .map_err(|e| anyhow!("--cp-comm-type: {e}"))?,
        ),
    };
    let sources = if a.from.is_empty() {
        Vec::new()
    } else {
        load_sources(&a.from, false)?
    };
    let (fit_intra, fit_inter) = fitted_wires(&sources);
    let wire = |flag: &str,
                given: &Option<String>,
                fitted: Option<Fitted>,
                datasheet: Option<(LinkParams, String)>|
     -> Result<Option<(Wire, String)>> {
        Ok(match (given, fitted, datasheet) {
            (Some(s), _, _) => Some((Wire::ring(parse_link(flag, s)?), format!("{flag} {s}"))),
            (None, Some(f), _) => Some((f.wire, f.from)),
            (None, None, Some((l, from))) => Some((Wire::ring(l), from)),
            (None, None, None) => None,
        })
    };
    let sheet = |link: LinkParams, what: String| device.as_ref().map(|_| (link, what));
    let intra_sheet = device.as_ref().and_then(|d| {
        sheet(
            d.intra_link(),
            format!(
                "{}: NVLink {} GB/s a direction x {} (NCCL's ring share), {} us a ring step",
                d.name,
                units::sig3(d.nvlink_gbps),
                parbench::model::device::NVLINK_FRACTION,
                parbench::model::device::NVLINK_STEP_US
            ),
        )
    });
    let inter_sheet = device.as_ref().and_then(|d| {
        sheet(
            d.inter_link(),
            format!(
                "{}: {} NICs of {} GB/s per {} devices, one rail each, x {} (NCCL's share), {} us a ring step (assumed)",
                d.name,
                d.nics_per_node,
                units::sig3(d.nic_gbps),
                d.gpus_per_node,
                parbench::model::device::NIC_FRACTION,
                parbench::model::device::NIC_STEP_US
            ),
        )
    });
    let intra = wire("--intra", &a.intra, fit_intra, intra_sheet)?.ok_or_else(|| {
        anyhow!("no intra-node wire: give --device NAME, --intra GBPS,US or --from a results folder with all_reduce rows of the local (or nccl) backend")
    })?;
    let multi_node = gpus > gpus_per_node;
    let inter = match wire("--inter", &a.inter, fit_inter, inter_sheet)? {
        Some(w) => w,
        None if !multi_node => (intra.0.clone(), "unused (one node): the intra-node wire".into()),
        None => bail!("{} devices span {} nodes: give --device NAME, --inter GBPS,US or --from a results folder with all_reduce rows of the tcp (or mpi) backend", gpus, gpus.div_ceil(gpus_per_node.max(1))),
    };
    let measured = measured_flops(&sources);
    let stack = stack_of(a)?;
    let fp8_peak = match precision {
        Precision::Bf16 => None,
        Precision::Fp8 => Some(fp8_peak_of(device.as_ref(), stack)?),
    };
    let stack_kernel = stack.map_or(FlashKernel::FlashAttention2, |s| s.flash_kernel);
    let (attention, flash_kernel) = match a.attention.as_deref() {
        None => (
            stack.map_or(Attention::Flash, |s| s.attention),
            stack_kernel,
        ),
        Some("flash") => (Attention::Flash, stack_kernel),
        Some("fa2") => (Attention::Flash, FlashKernel::FlashAttention2),
        Some("cudnn") => (Attention::Flash, FlashKernel::Cudnn),
        Some("unfused") => (Attention::Unfused, stack_kernel),
        Some(other) => bail!("--attention {other}: expected flash, fa2, cudnn or unfused"),
    };
    let accumulation = match a.grad_accumulation.as_deref() {
        None => stack.map_or(GradAccumulation::Fused, |s| s.accumulation),
        Some("fused") => GradAccumulation::Fused,
        Some("unfused") => GradAccumulation::Unfused,
        Some(other) => bail!("--grad-accumulation {other}: expected fused or unfused"),
    };
    let dp_overlap = match a.dp_overlap.as_deref() {
        None => stack.map_or(device.is_some(), |s| s.dp_overlap),
        Some("on") => true,
        Some("off") => false,
        Some(other) => bail!("--dp-overlap {other}: expected on or off"),
    };
    for s in &a.schedules {
        if !parbench::schedule::SCHEDULES.iter().any(|e| e.name == s) {
            bail!(
                "--schedule {s}: unknown schedule (known: {})",
                parbench::schedule::SCHEDULES
                    .iter()
                    .map(|e| e.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    // With a device, the GEMM rate is the device's unless measured or
    // given; a block measured on the GPU sets the share of it a step
    // sustains instead of the datasheet's clock.
    let (compute, ops) = match &device {
        Some(d) => {
            let block = measured_block_share(&sources, d, attention, flash_kernel, accumulation);
            // `given`: a rate given or measured, one for every K; the
            // datasheet's is of 8192^3, other K on its measured curve.
            let (tflops, from, given) = match (a.compute_tflops, &measured, &block) {
                (Some(t), _, _) => (t, format!("--compute-tflops {t}"), Some(t)),
                (None, Some((f, from)), None) => (f / 1e12, from.clone(), Some(f / 1e12)),
                (None, _, _) => (
                    d.gemm_tflops,
                    format!("{}'s datasheet GEMM rate", d.name),
                    None,
                ),
            };
            let mut ops = OpModel::of_device(d, given, attention, flash_kernel, accumulation);
            if let Some(s) = stack {
                ops.loss_bytes = s.step.loss_bytes;
                ops.main_grad_bytes = s.step.grad_bytes as f64;
                ops.selective_reruns_flash = s.step.selective_reruns_flash;
            }
            // Set after the in-step share below: FP8 runs at that share too.
            let fp8_speedup = fp8_peak.map(|f| {
                parbench::model::precision::fp8_speedup(
                    parbench::model::precision::REFERENCE_K,
                    f / d.peak_tflops,
                )
            });
            let share = match (&block, a.compute_tflops) {
                (Some((share, how)), None) => {
                    ops.gemm_flops = tflops * 1e12 * share;
                    format!("x {share:.3}, the in-step share measured: {how}")
                }
                _ => format!(
                    "x {:.3} (the datasheet's clock held at the power limit through a step)",
                    d.sustained_clock()
                ),
            };
            ops.fp8_gemm_flops = fp8_speedup.map(|r| ops.gemm_flops * r);
            ops.fp8_params = a.fp8_params;
            let weights = if a.fp8_params {
                "; weights held in FP8 (--fp8-params)"
            } else {
                ""
            };
            let fp8_words = ops.fp8_gemm_flops.map_or(String::new(), |f| {
                format!(
                    "; linear layers in FP8 at {} TFLOP/s ({:.2}x the 16-bit rate: FP8 over FP16 GEMMs of 8192^3 measured on one H800, tilelang's benchmarks, scaled by the {} TFLOP/s FP8 peak's ratio; less at small K){weights}",
                    units::sig3(f / 1e12),
                    fp8_speedup.unwrap_or(0.0),
                    units::sig3(fp8_peak.unwrap_or(0.0))
                )
            });
            let by_k = if ops.k_curve {
                " and by K (Hopper's 16-bit rate by K, tilelang's FP16 benchmarks on one H800)"
            } else {
                ""
            };
            (
                (
                    ops.gemm_flops,
                    format!(
                        "{from}: {} TFLOP/s {share}; GEMMs by shape on {} SMs{by_k}, memory-bound work at {} GB/s x {}{fp8_words}",
                        units::sig3(tflops),
                        d.sms,
                        units::sig3(d.hbm_gbps),
                        parbench::model::device::MEMORY_FRACTION
                    ),
                ),
                Some(ops),
            )
        }
        None => {
            let c = match (a.compute_tflops, measured) {
                (Some(t), _) => (t * 1e12, format!("--compute-tflops {t}")),
                (None, Some(m)) => m,
                (None, None) => bail!("no compute rate: give --device NAME, --compute-tflops X or --from a results folder with bench-layers rows (layers.csv)"),
            };
            (c, None)
        }
    };
    let mut input = PlanInput::new(
        model,
        global_batch,
        gpus,
        gpus_per_node,
        compute.0,
        intra.0.clone(),
        inter.0.clone(),
    );
    let memory_gib = a.memory.or(device.as_ref().map(|d| d.hbm_gib));
    input.memory_bytes = memory_gib.map(|g| g * 1024.0 * 1024.0 * 1024.0);
    input.ops = ops;
    // MFU against the peak of the precision the GEMMs run in.
    input.peak_flops = device
        .as_ref()
        .map(|d| fp8_peak.unwrap_or(d.peak_tflops) * 1e12);
    input.rails = device.is_some();
    input.dp_overlap = dp_overlap;
    input.schedules = match (a.schedules.is_empty(), stack) {
        (false, _) => Some(a.schedules.clone()),
        (true, Some(s)) => Some(s.search.iter().map(|n| n.to_string()).collect()),
        (true, None) => None,
    };
    input.shard_modes = a
        .shard
        .iter()
        .map(|n| {
            Shard::by_name(n)
                .ok_or_else(|| anyhow!("--shard {n}: expected none, zero1, zero2 or zero3"))
        })
        .collect::<Result<_>>()?;
    if input.shard_modes.is_empty() && !a.distributed_optimizer {
        if let Some(s) = stack {
            input.shard_modes = vec![s.shard];
        }
    }
    input.hybrid = a.hybrid_shard;
    input.allow_tp_across_nodes = a.allow_tp_across_nodes;
    input.sequence_parallel = a.sequence_parallel || stack.is_some_and(|s| s.sequence_parallel);
    input.recompute = recompute;
    input.distributed_optimizer =
        a.distributed_optimizer || stack.is_some_and(|s| s.shard == Shard::Zero1);
    input.untied_output = a.untie_embeddings;
    if let Some(s) = stack {
        input.step = s.step;
    }
    let imbalance_from = a.moe.apply_to_input(&mut input, &sources)?;
    if cp_comm.is_some() {
        input.step.cp_comm = cp_comm;
    }
    input.max_cp = a.max_cp;
    let m = &model;
    let file = PlanFile {
        schema: PLAN_SCHEMA,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        model: format!(
            "{} ({} layers, hidden {}, {} heads ({} KV), ffn {}, seq {}, vocabulary {}: {})",
            m.name,
            m.layers,
            m.hidden,
            m.heads,
            m.kv_heads,
            m.ffn,
            m.seq,
            m.vocab,
            match super::moe::words(m) {
                Some(w) => w,
                None => format!("{} parameters", count(all_params(m, a.untie_embeddings))),
            }
        ),
        global_batch,
        gpus,
        gpus_per_node,
        memory_gib,
        compute: Sourced {
            value: compute.0,
            from: compute.1,
        },
        intra: Sourced {
            value: intra.0.link,
            from: intra.1,
        },
        inter: Sourced {
            value: inter.0.link,
            from: inter.1,
        },
        device: device.as_ref().map(|d| Sourced {
            value: d.name.clone(),
            from: d.source.clone(),
        }),
        software: match imbalance_from {
            Some(from) => format!("{}, {from}", software_words(&input)),
            None => software_words(&input),
        },
        stack: stack.map(|s| Sourced {
            value: s.name.to_string(),
            from: format!("{} ({})", s.implies, s.source),
        }),
        band: None,
        band_name: None,
        layout_query: None,
        search_best: None,
        families: Vec::new(),
        enumerated: 0,
        fitting: 0,
        top: Vec::new(),
        best_sure: None,
        losses: Vec::new(),
    };
    Ok((input, file))
}

/// The dense FP8 peak `--precision fp8` runs at, TFLOP/s: the device's;
/// refused by name on a device without FP8 tensor cores, without a
/// device, and on a stack whose FP8 recipe is not Transformer Engine's.
fn fp8_peak_of(device: Option<&Device>, stack: Option<&Stack>) -> Result<f64> {
    let Some(d) = device else {
        bail!("--precision fp8: give --device NAME (the FP8 rate is the device's)");
    };
    let Some(peak) = d.fp8_peak_tflops else {
        bail!(
            "--precision fp8: {} has no FP8 tensor cores (FP8 needs Hopper or newer, e.g. h100-sxm5-80gb)",
            d.name
        );
    };
    if let Some(s) = stack.filter(|s| !s.te_fp8) {
        bail!(
            "--precision fp8: the planner costs Transformer Engine's FP8 recipe (megatron-core, nemo-24), not {}'s",
            s.name
        );
    }
    Ok(peak)
}

/// The stack of `--stack`, checked.
pub(super) fn stack_of(a: &PlanArgs) -> Result<Option<&'static Stack>> {
    match &a.stack {
        None => {
            if a.search_open {
                bail!("--search-open: give --stack NAME (without a stack, --layout searches what it leaves open already)");
            }
            Ok(None)
        }
        Some(n) => Stack::by_name(n).map(Some).ok_or_else(|| {
            anyhow!(
                "--stack {n}: unknown stack (known: {})",
                Stack::names().join(", ")
            )
        }),
    }
}

/// How the step runs, in words.
fn software_words(input: &PlanInput) -> String {
    let mut parts = Vec::new();
    if let Some(ops) = &input.ops {
        parts.push(match ops.attention {
            Attention::Flash => match ops.flash_kernel {
                FlashKernel::FlashAttention2 => "flash attention (FlashAttention-2)",
                FlashKernel::Cudnn => "flash attention (cuDNN fused)",
            },
            Attention::Unfused => "unfused attention (scores through HBM)",
        });
        parts.push(match ops.accumulation {
            GradAccumulation::Fused => "gradient accumulation fused",
            GradAccumulation::Unfused => "gradient accumulation unfused",
        });
    }
    parts.push(if input.dp_overlap {
        "data-parallel reduction overlapped with the backward"
    } else {
        "data-parallel reduction after the backward"
    });
    parts.push(match input.recompute {
        Recompute::None if input.moe_recompute.any() => "recomputation of modules",
        Recompute::None => "no recomputation",
        Recompute::Selective => "selective recomputation",
        Recompute::Full => "full recomputation",
    });
    let step = &input.step;
    if input.sequence_parallel {
        parts.push("sequence parallel");
    }
    if step.tp_overlap {
        parts.push("tensor-parallel communication overlapped with its GEMMs");
    }
    if step.param_gather_overlap {
        parts.push("parameter all-gather overlapped with the forward");
    }
    if step.dp_sm_share > 0.0 {
        parts.push("overlapped collectives take SMs from the compute");
    }
    if step.grad_bytes == 4 {
        parts.push("fp32 gradients");
    }
    if input.model.moe.is_some() {
        parts.push(match (step.moe.dispatcher, step.moe.grouped_gemm) {
            (Dispatcher::AllToAll, true) => "experts: all-to-all dispatcher, grouped GEMMs",
            (Dispatcher::AllToAll, false) => "experts: all-to-all dispatcher, a GEMM per expert",
            (Dispatcher::DeepEp, true) => "experts: DeepEP dispatcher, grouped GEMMs",
            (Dispatcher::DeepEp, false) => "experts: DeepEP dispatcher, a GEMM per expert",
        });
    }
    if input.ops.is_some_and(|o| o.fp8_gemm_flops.is_some()) {
        parts.push("FP8 linear layers (Transformer Engine, delayed scaling; attention, output layer, norms and optimizer in bf16/fp32)");
    }
    if let (Some(c), true) = (step.cp_comm, input.max_cp > 1) {
        parts.push(match c {
            CpComm::P2p => "context parallel by a ring of K/V exchanges",
            CpComm::AllGather => "context parallel by all-gathers of K/V",
            CpComm::A2a => "context parallel by all-to-alls (Ulysses)",
        });
    }
    let mut words = parts.join(", ");
    if input.moe_recompute.any() {
        words += &format!(
            "; recomputed modules: {}",
            input.moe_recompute.names().join(", ")
        );
    }
    words
}

/// A parameter count as people say it: 6.96M, 1.32B, 175B.
fn count(n: f64) -> String {
    if n >= 1e9 {
        format!("{}B", units::sig3(n / 1e9))
    } else {
        format!("{}M", units::sig3(n / 1e6))
    }
}

/// A model's parameters as the plan counts them: a GPT's untied output
/// layer (`--untie-embeddings`) is a second `V x h` table.
fn all_params(m: &Preset, untied: bool) -> f64 {
    let output = if untied && m.arch == Arch::Gpt {
        m.vocab as f64 * m.hidden as f64
    } else {
        0.0
    };
    m.params() as f64 + output
}
