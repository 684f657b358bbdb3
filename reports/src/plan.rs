//! `report plan`: the capacity planner fed by measured figures. Flags and
//! results folders become a [`PlanInput`]; `parbench::model::plan` does the
//! rest; this file prints the ranking and the reasons, and writes the plan
//! as JSON for `report html` (which draws a planning section from every
//! `plan.json` in the folders it reads).

use crate::load::{load_sources, Source};
use crate::predict;
use crate::table::Table;
use crate::units;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use parbench::model::footprint::Recompute;
use parbench::model::opcost::{Attention, GradAccumulation, OpModel};
use parbench::model::plan::{Costed, LayoutRanking, LossGroup, PlanInput, Shard, Wire, WireKind};
use parbench::model::presets::Arch;
use parbench::model::{LinkParams, Preset};
use parbench::stats::median_of_finite;
use parbench::vocab;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file `report html` looks for in each results folder.
pub const PLAN_FILE: &str = "plan.json";

/// Version of the plan file's layout.
pub const PLAN_SCHEMA: u32 = 1;

/// Flags of `report plan`.
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct PlanArgs {
    /// A model preset (tiny, gpt3-1.3b, llama2-70b, gpt3-175b); or give the shape with --layers, --hidden, --heads, --ffn, --seq.
    #[arg(long)]
    pub model: Option<String>,
    /// Transformer layers (custom shape).
    #[arg(long)]
    pub layers: Option<u64>,
    /// Hidden size (custom shape).
    #[arg(long)]
    pub hidden: Option<u64>,
    /// Attention heads (custom shape).
    #[arg(long)]
    pub heads: Option<u64>,
    /// Key/value heads (custom shape; default: --heads).
    #[arg(long)]
    pub kv_heads: Option<u64>,
    /// MLP inner size (custom shape).
    #[arg(long)]
    pub ffn: Option<u64>,
    /// Sequence length in tokens (custom shape; with --model, overrides its context).
    #[arg(long)]
    pub seq: Option<u64>,
    /// Vocabulary (custom shape; default GPT-2's 50257).
    #[arg(long)]
    pub vocab: Option<u64>,
    /// Block family of a custom shape: gpt (biases, LayerNorm, a GELU MLP of two matrices, tied embedding) or llama (no biases, RMSNorm, a SwiGLU MLP of three matrices, untied output layer).
    #[arg(long, default_value = "gpt")]
    pub arch: String,
    /// A device description: a preset (a100-sxm4-80gb, h100-sxm5-80gb, h200). Costs compute by operation (GEMMs at their shapes, attention, memory-bound work at HBM bandwidth, the optimizer), the wires from NVLink and the NICs, and memory from HBM; --compute-tflops, --intra, --inter, --memory and --from's measured figures override its figures.
    #[arg(long, value_name = "NAME", conflicts_with = "device_file")]
    pub device: Option<String>,
    /// A device description of your own: a JSON file with the fields of the presets (docs/report.md, "Device descriptions").
    #[arg(long, value_name = "FILE")]
    pub device_file: Option<PathBuf>,
    /// Cost one layout instead of searching: dp=D,tp=T,pp=P with optional vpp=V (interleaved chunks), mbs=B (microbatch size), schedule=NAME, first=F,last=L (layers of the first and last stages); what is not given is searched within the split. Prints each term, and how it compares with the search's best.
    #[arg(long, value_name = "SPEC")]
    pub layout: Option<String>,
    /// Attention with a device: flash (FlashAttention: scores on chip) or unfused (batched GEMMs and softmax through HBM, as Megatron-LM ran before FlashAttention).
    #[arg(long, default_value = "flash")]
    pub attention: String,
    /// Gradient accumulation with a device: fused (inside the weight-gradient GEMM) or unfused (a pass per microbatch, as Megatron-LM's code of 2021).
    #[arg(long, default_value = "fused")]
    pub grad_accumulation: String,
    /// The data-parallel reduction overlapped with the backward in buckets: on or off (default: on with a device, off without).
    #[arg(long)]
    pub dp_overlap: Option<String>,
    /// Data-parallel sharding modes to search (comma-separated: none, zero1, zero2, zero3; default none, or zero1 with --distributed-optimizer).
    #[arg(long = vocab::shard::LONG, value_name = vocab::shard::VALUE, value_delimiter = ',')]
    pub shard: Vec<String>,
    /// Also search ZeRO-2/3 sharded inside a node and replicated across nodes (HSDP).
    #[arg(long)]
    pub hybrid_shard: bool,
    /// Only these pipeline schedules (comma-separated registry names, e.g. 1f1b,interleaved).
    #[arg(long = vocab::schedule::LONG, value_name = vocab::schedule::VALUE, value_delimiter = ',')]
    pub schedules: Vec<String>,
    /// Sequences per training step (the global batch, B = dp x M x b).
    #[arg(long, required_unless_present = "against")]
    pub global_batch: Option<u64>,
    /// Devices in all.
    #[arg(long, required_unless_present = "against")]
    pub gpus: Option<u64>,
    #[arg(long = vocab::against::LONG, value_name = vocab::against::VALUE, help = vocab::against::HELP, conflicts_with_all = ["model", "from", "output_file", "device", "layout"])]
    pub against: Option<PathBuf>,
    /// Devices per node (the tensor-parallel group stays inside one; default: the device's, or 8).
    #[arg(long)]
    pub gpus_per_node: Option<u64>,
    /// Results folders to take the measured figures from: all_reduce rows of collectives.csv (local/nccl: the intra-node wire; tcp/mpi: the inter-node wire), GEMM GFLOP/s of layers.csv.
    #[arg(long = "from", num_args = 1..)]
    pub from: Vec<PathBuf>,
    /// The intra-node wire as GBPS,US (instead of the measured fit).
    #[arg(long = vocab::intra::LONG, value_name = vocab::intra::VALUE)]
    pub intra: Option<String>,
    /// The inter-node wire as GBPS,US (instead of the measured fit).
    #[arg(long = vocab::inter::LONG, value_name = vocab::inter::VALUE)]
    pub inter: Option<String>,
    /// Memory per device, GiB (default: no limit).
    #[arg(long)]
    pub memory: Option<f64>,
    /// Sustained matrix-product rate per device, TFLOP/s (instead of bench-layers' measured GFLOP/s).
    #[arg(long)]
    pub compute_tflops: Option<f64>,
    /// Let the tensor-parallel group span nodes.
    #[arg(long)]
    pub allow_tp_across_nodes: bool,
    /// Sequence parallelism (less activation memory, the same traffic).
    #[arg(long)]
    pub sequence_parallel: bool,
    /// Activation recomputation: none, selective or full.
    #[arg(long, default_value = "none")]
    pub recompute: String,
    /// Adam state sharded over the data-parallel ranks (Megatron's distributed optimizer).
    #[arg(long = vocab::distributed_optimizer::LONG)]
    pub distributed_optimizer: bool,
    /// Layouts to print.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Also write the plan as JSON (put it in a results folder as plan.json for `report html`).
    #[arg(long = vocab::output_file::LONG, value_name = vocab::output_file::VALUE)]
    pub output_file: Option<PathBuf>,
}

/// Where a figure came from, in words.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sourced<T> {
    pub value: T,
    pub from: String,
}

/// What `--output-file` writes and `report html` reads.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PlanFile {
    pub schema: u32,
    /// The command line that made it.
    pub command: String,
    /// The model in words.
    pub model: String,
    pub global_batch: u64,
    pub gpus: u64,
    pub gpus_per_node: u64,
    pub memory_gib: Option<f64>,
    pub compute: Sourced<f64>,
    pub intra: Sourced<LinkParams>,
    pub inter: Sourced<LinkParams>,
    /// The device the plan is costed on, with its sources; `None`: a flat GEMM rate.
    #[serde(default)]
    pub device: Option<Sourced<String>>,
    /// How the step runs, in words (attention, accumulation, overlap).
    #[serde(default)]
    pub software: String,
    /// With --layout: the layout asked for, its best costing (first in `top`), and the search's best.
    #[serde(default)]
    pub layout_query: Option<String>,
    #[serde(default)]
    pub search_best: Option<Costed>,
    /// The ways to split (data, sharded data, tensor, pipeline parallel):
    /// each one's best layout or why none fits.
    #[serde(default)]
    pub families: Vec<crate::plan_layout::Family>,
    /// Layouts enumerated, fitting and rejected.
    pub enumerated: usize,
    pub fitting: usize,
    /// The best layouts (up to --top), fastest first.
    pub top: Vec<Costed>,
    /// Why the others lose.
    pub losses: Vec<LossGroup>,
}

/// The columns of a ranked layout that the text table and the page share,
/// in order; each adds its token latency (and the text its wires).
pub const LAYOUT_COLUMNS: [&str; 14] = [
    "#", "dp", "tp", "pp", "schedule", "b", "M", "tokens/s", "step", "compute", "tp comm",
    "bubble", "dp comm", "memory",
];

/// Runs `report plan`.
pub fn run(a: &PlanArgs) -> Result<()> {
    if let Some(dir) = &a.against {
        return crate::plan_check::run(dir);
    }
    // The output is checked before anything is costed (a device, a FIFO,
    // a symlink or a record of another kind is refused).
    if let Some(path) = &a.output_file {
        // What the plan file begins with (serde's pretty form of PlanFile),
        // so that a plan may replace the plan it wrote before.
        parbench::results::check_output(path, Some(b"{\n  \"schema\": "))
            .map_err(|e| anyhow!("--output-file: {e}"))?;
    }
    let (input, mut file) = prepare(a)?;
    let plan = predict::rank_layouts(&input).map_err(|e| anyhow!("{e}"))?;
    let file = match &a.layout {
        None => {
            file.families = crate::plan_layout::families(&plan);
            finish(file, &plan, a.top)
        }
        Some(spec) => {
            let q = crate::plan_layout::parse_layout(spec)?;
            let named = parbench::model::plan::plan_layout(&input, &q)
                .map_err(|e| anyhow!("--layout {spec}: {e}"))?;
            if named.ranked.is_empty() {
                let why = crate::plan_layout::closest_rejection(&named, |_| true)
                    .unwrap_or_else(|| "no schedule or microbatch size of it runs".into());
                bail!("--layout {spec}: does not fit: {why}");
            }
            file.layout_query = Some(spec.clone());
            file.search_best = plan.ranked.first().cloned();
            file.families = crate::plan_layout::families(&plan);
            finish(file, &named, a.top)
        }
    };
    parbench::out!("{}", render(&file));
    if let Some(path) = &a.output_file {
        let json = serde_json::to_string_pretty(&file)?;
        parbench::results::write_atomic(path, json.as_bytes())
            .map_err(|e| anyhow!("--output-file: cannot write the plan: {e}"))?;
        eprintln!("report: wrote {}", path.display());
    }
    Ok(())
}

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
        return Ok(p);
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
    Ok(Preset {
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
    })
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

/// bench-layers' matrix-product rate, FLOP/s: the median GFLOP/s of the
/// full-sequence rows (decode GEMMs are skinny) at the largest shape
/// (batch x seq x hidden) and the smallest tensor-parallel degree measured
/// there (one rank alone on its device: unsharded GEMMs).
fn measured_flops(sources: &[Source]) -> Option<(f64, String)> {
    let rows: Vec<(&Source, &parbench::results::LayerRow)> = sources
        .iter()
        .flat_map(|s| s.layers.iter().map(move |r| (s, r)))
        .filter(|(_, r)| !r.decode && r.compute_gflops.is_finite() && r.compute_gflops > 0.0)
        .collect();
    let work =
        |r: &parbench::results::LayerRow| r.batch.saturating_mul(r.seq).saturating_mul(r.hidden);
    let largest = rows.iter().map(|(_, r)| work(r)).max()?;
    // One rank alone on its device: the smallest degree measured at that
    // shape (on a CPU, ranks of a higher degree share its cores).
    let tp = rows
        .iter()
        .filter(|(_, r)| work(r) == largest)
        .map(|(_, r)| r.tp)
        .min()?;
    let at: Vec<_> = rows
        .iter()
        .filter(|(_, r)| work(r) == largest && r.tp == tp)
        .collect();
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

/// The plan's input from the flags and folders, and the file's header.
fn prepare(a: &PlanArgs) -> Result<(PlanInput, PlanFile)> {
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
    let device = crate::plan_layout::resolve_device(a.device.as_deref(), a.device_file.as_deref())?;
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
        if !(m.is_finite() && m > 0.0) {
            bail!("--memory {m}: GiB per device, above 0");
        }
    }
    if let Some(t) = a.compute_tflops {
        if !(t.is_finite() && t > 0.0) {
            bail!("--compute-tflops {t}: TFLOP/s per device, above 0");
        }
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
    let attention = match a.attention.as_str() {
        "flash" => Attention::Flash,
        "unfused" => Attention::Unfused,
        other => bail!("--attention {other}: expected flash or unfused"),
    };
    let accumulation = match a.grad_accumulation.as_str() {
        "fused" => GradAccumulation::Fused,
        "unfused" => GradAccumulation::Unfused,
        other => bail!("--grad-accumulation {other}: expected fused or unfused"),
    };
    let dp_overlap = match a.dp_overlap.as_deref() {
        None => device.is_some(),
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
    // With a device, the GEMM rate is the device's unless measured or given.
    let (compute, ops) = match &device {
        Some(d) => {
            let (tflops, from) = match (a.compute_tflops, &measured) {
                (Some(t), _) => (t, format!("--compute-tflops {t}")),
                (None, Some((f, from))) => (f / 1e12, from.clone()),
                (None, None) => (d.gemm_tflops, format!("{}'s datasheet GEMM rate", d.name)),
            };
            let ops = OpModel::of_device(d, Some(tflops), attention, accumulation);
            (
                (
                    ops.gemm_flops,
                    format!(
                        "{from}: {} TFLOP/s x {} in a step; GEMMs by shape on {} SMs, memory-bound work at {} GB/s x {}",
                        units::sig3(tflops),
                        parbench::model::device::IN_STEP_GEMM_SHARE,
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
    input.peak_flops = device.as_ref().map(|d| d.peak_tflops * 1e12);
    input.rails = device.is_some();
    input.dp_overlap = dp_overlap;
    input.schedules = (!a.schedules.is_empty()).then(|| a.schedules.clone());
    input.shard_modes = a
        .shard
        .iter()
        .map(|n| {
            Shard::by_name(n)
                .ok_or_else(|| anyhow!("--shard {n}: expected none, zero1, zero2 or zero3"))
        })
        .collect::<Result<_>>()?;
    input.hybrid = a.hybrid_shard;
    input.allow_tp_across_nodes = a.allow_tp_across_nodes;
    input.sequence_parallel = a.sequence_parallel;
    input.recompute = recompute;
    input.distributed_optimizer = a.distributed_optimizer;
    let m = &model;
    let file = PlanFile {
        schema: PLAN_SCHEMA,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        model: format!(
            "{} ({} layers, hidden {}, {} heads ({} KV), ffn {}, seq {}, vocabulary {}: {} parameters)",
            m.name,
            m.layers,
            m.hidden,
            m.heads,
            m.kv_heads,
            m.ffn,
            m.seq,
            m.vocab,
            count(m.params() as f64)
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
        software: software_words(&input),
        layout_query: None,
        search_best: None,
        families: Vec::new(),
        enumerated: 0,
        fitting: 0,
        top: Vec::new(),
        losses: Vec::new(),
    };
    Ok((input, file))
}

/// How the step runs, in words.
fn software_words(input: &PlanInput) -> String {
    let mut parts = Vec::new();
    if let Some(ops) = &input.ops {
        parts.push(match ops.attention {
            Attention::Flash => "flash attention",
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
        Recompute::None => "no recomputation",
        Recompute::Selective => "selective recomputation",
        Recompute::Full => "full recomputation",
    });
    parts.join(", ")
}

/// The file with the plan's figures.
fn finish(mut file: PlanFile, plan: &LayoutRanking, top: usize) -> PlanFile {
    file.enumerated = plan.ranked.len() + plan.rejected.len();
    file.fitting = plan.ranked.len();
    file.top = plan.ranked.iter().take(top).cloned().collect();
    file.losses = plan.losses();
    file
}

/// A parameter count as people say it: 6.96M, 1.32B, 175B.
fn count(n: f64) -> String {
    if n >= 1e9 {
        format!("{}B", units::sig3(n / 1e9))
    } else {
        format!("{}M", units::sig3(n / 1e6))
    }
}

fn wire_words(l: &LinkParams) -> String {
    format!(
        "{} GB/s, alpha {}",
        units::sig3(l.bandwidth_gbps()),
        units::micros(l.alpha_us())
    )
}

fn wire_letter(w: WireKind) -> &'static str {
    match w {
        WireKind::Intra => "intra",
        WireKind::Inter => "inter",
        WireKind::None => "-",
    }
}

/// Milliseconds with three significant figures.
fn ms(s: f64) -> String {
    units::micros(s * 1e6)
}

/// A layout's schedule column: the schedule, its chunks, an uneven
/// split and the data-parallel sharding.
pub fn schedule_cell(l: &parbench::model::plan::Layout) -> String {
    let mut cell = l.schedule.clone();
    if l.chunks > 1 {
        cell.push_str(&format!(" v={}", l.chunks));
    }
    if l.first_stage_layers > 0 {
        cell.push_str(&format!(
            " {}/../{}",
            l.first_stage_layers, l.last_stage_layers
        ));
    }
    if l.shard != Shard::None {
        cell.push_str(&format!(" {}", l.shard.name()));
        if l.shard_group > 1 && l.shard_group < l.dp {
            cell.push_str(&format!("/{}", l.shard_group));
        }
    }
    cell
}

/// The printed plan.
pub fn render(f: &PlanFile) -> String {
    let mut out = String::new();
    out.push_str(&format!("Plan: {}\n", f.model));
    out.push_str(&format!(
        "  global batch {} sequences on {} devices ({} per node), {}\n",
        f.global_batch,
        f.gpus,
        f.gpus_per_node,
        f.memory_gib
            .map_or("no memory limit".to_string(), |m| format!(
                "{} GiB each",
                units::short(m)
            ))
    ));
    if let Some(d) = &f.device {
        out.push_str(&format!("  device:     {} ({})\n", d.value, d.from));
    }
    out.push_str(&format!(
        "  compute:    {} TFLOP/s per device, from {}\n",
        units::sig3(f.compute.value / 1e12),
        f.compute.from
    ));
    if !f.software.is_empty() {
        out.push_str(&format!("  the step:   {}\n", f.software));
    }
    out.push_str(&format!(
        "  intra-node: {}, from {}\n",
        wire_words(&f.intra.value),
        f.intra.from
    ));
    out.push_str(&format!(
        "  inter-node: {}, from {}\n",
        wire_words(&f.inter.value),
        f.inter.from
    ));
    out.push_str(&format!(
        "  {} layouts enumerated, {} fit\n\n",
        f.enumerated, f.fitting
    ));
    if !f.families.is_empty() {
        out.push_str(&crate::plan_layout::render_families(&f.families));
        out.push('\n');
    }
    if let (Some(spec), Some(named)) = (&f.layout_query, f.top.first()) {
        out.push_str(&format!("Layout {spec}: {}\n", named.layout));
        out.push_str(&crate::plan_layout::render_terms(named, f.gpus));
        if let Some(best) = &f.search_best {
            out.push_str(&crate::plan_layout::why_loses(named, best));
        }
        out.push('\n');
    }
    if f.top.is_empty() {
        out.push_str("No layout fits.\n");
    } else {
        out.push_str(&format!(
            "Best layouts by tokens/s (of {} that fit)\n\n",
            f.fitting
        ));
        let mut t =
            Table::new(
                LAYOUT_COLUMNS
                    .into_iter()
                    .chain(["MFU", "token lat", "wires tp/dp/pp"]),
            );
        for (i, c) in f.top.iter().enumerate() {
            let l = &c.layout;
            let share = |x: f64| format!("{} {}", ms(x), units::percent(x / c.step_s));
            t.row([
                (i + 1).to_string(),
                l.dp.to_string(),
                l.tp.to_string(),
                l.pp.to_string(),
                schedule_cell(l),
                l.micro_batch.to_string(),
                l.microbatches.to_string(),
                units::sig3(c.tokens_per_s),
                ms(c.step_s),
                share(c.compute_s),
                share(c.tp_comm_s),
                share(c.bubble_s),
                share(c.dp_comm_s),
                units::bytes(c.memory.total()),
                c.mfu.map_or("-".into(), units::percent),
                ms(c.token_latency_s),
                format!(
                    "{}/{}/{}",
                    wire_letter(c.tp_wire),
                    wire_letter(c.dp_wire),
                    wire_letter(c.pp_wire)
                ),
            ]);
        }
        out.push_str(&t.text());
        out.push_str("step = compute + tp comm + bubble + dp comm + optimizer (the busiest pipeline rank; the bubble includes waits for point-to-point messages; tensor-parallel communication is not overlapped; dp comm is the part of the data-parallel reduction the step waits for). b: sequences per microbatch; M: microbatches per step per pipeline. MFU: model FLOPs per second over the devices' peak (needs --device). token lat: one decode step (b new tokens) through the layout, compute-bound.\n");
    }
    if !f.losses.is_empty() {
        out.push_str("\nWhy the others lose\n\n");
        let mut t = Table::new(["reason", "layouts", "example", "detail"]);
        for g in &f.losses {
            t.row([
                g.group.clone(),
                g.count.to_string(),
                g.example.to_string(),
                g.detail.clone(),
            ]);
        }
        out.push_str(&t.text());
        out.push_str("Splits that break a rule are counted per (dp, tp, pp); every other line per layout (schedule, b, M).\n");
    }
    out
}

/// Reads `dir/plan.json` when it exists (for `report html`); a file that
/// exists but does not parse is an error naming it.
pub fn read_plan(dir: &Path) -> Result<Option<PlanFile>> {
    let path = dir.join(PLAN_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::text_file::read_text(&path)?;
    let f: PlanFile = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a plan written by report plan --output-file",
            path.display()
        )
    })?;
    if f.schema != PLAN_SCHEMA {
        bail!(
            "{}: plan schema {}, this report reads {PLAN_SCHEMA}",
            path.display(),
            f.schema
        );
    }
    Ok(Some(f))
}
