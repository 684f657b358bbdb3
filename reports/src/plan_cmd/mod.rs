//! `report plan`: the capacity planner fed by measured figures. Flags and
//! results folders become a [`parbench::model::plan::PlanInput`]
//! ([`input`]); `parbench::model::plan` does the rest; this command prints
//! the ranking and the reasons ([`text`]), and writes the plan as JSON
//! ([`file`]) for `report html` (which draws a planning section from every
//! `plan.json` in the folders it reads). `--layout` costs one named layout
//! ([`layout`]); `--against` holds composed runs to the planner ([`check`]).

pub mod check;
pub mod file;
mod input;
pub mod layout;
pub mod moe;
pub mod text;
pub mod validation;

pub use file::{read_plan, PlanFile, PLAN_FILE};
pub use text::{schedule_cell, LAYOUT_COLUMNS};

use crate::predict;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use input::prepare;
use parbench::model::device::Device;
use parbench::model::plan::{LayoutRanking, PlanInput, Shard};
use parbench::model::stack::Stack;
use parbench::model::Preset;
use parbench::schedule::ScheduleKind;
use parbench::vocab;
use std::path::PathBuf;
use text::render;

/// Flags of `report plan`.
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct PlanArgs {
    #[arg(help_heading = "Model", long, help = format!("A model preset {}; or give the shape with --layers, --hidden, --heads, --ffn, --seq", vocab::one_of(Preset::names())))]
    pub model: Option<String>,
    /// Transformer layers (custom shape).
    #[arg(help_heading = "Model", long)]
    pub layers: Option<u64>,
    /// Hidden size (custom shape).
    #[arg(help_heading = "Model", long)]
    pub hidden: Option<u64>,
    /// Attention heads (custom shape).
    #[arg(help_heading = "Model", long)]
    pub heads: Option<u64>,
    /// Key/value heads (custom shape; default: --heads).
    #[arg(help_heading = "Model", long)]
    pub kv_heads: Option<u64>,
    /// MLP inner size (custom shape).
    #[arg(help_heading = "Model", long)]
    pub ffn: Option<u64>,
    /// Sequence length in tokens (custom shape; with --model, overrides its context).
    #[arg(help_heading = "Model", long)]
    pub seq: Option<u64>,
    /// Vocabulary (custom shape; default GPT-2's 50257).
    #[arg(help_heading = "Model", long)]
    pub vocab: Option<u64>,
    /// Block family of a custom shape: gpt (biases, LayerNorm, a GELU MLP of two matrices, tied embedding) or llama (no biases, RMSNorm, a SwiGLU MLP of three matrices, untied output layer).
    #[arg(help_heading = "Model", long, default_value = "gpt")]
    pub arch: String,
    /// A GPT model's output layer has its own weights (Megatron's --untie-embeddings-and-output-weights).
    #[arg(help_heading = "Model", long)]
    pub untie_embeddings: bool,
    #[command(flatten)]
    pub moe: moe::MoeArgs,

    /// Devices in all.
    #[arg(help_heading = "Devices and wires", long, required_unless_present_any = ["against", "validation"])]
    pub gpus: Option<u64>,
    /// Devices per node (the tensor-parallel group stays inside one; default: the device's, or 8).
    #[arg(help_heading = "Devices and wires", long)]
    pub gpus_per_node: Option<u64>,
    /// Sequences per training step (the global batch, B = dp x M x b).
    #[arg(help_heading = "Devices and wires", long, required_unless_present_any = ["against", "validation"])]
    pub global_batch: Option<u64>,
    #[arg(help_heading = "Devices and wires", long, value_name = "NAME", conflicts_with = "device_file", help = device_help())]
    pub device: Option<String>,
    /// A device description of your own: a JSON file with the fields of the presets (docs/report.md, "Device descriptions").
    #[arg(help_heading = "Devices and wires", long, value_name = "FILE")]
    pub device_file: Option<PathBuf>,
    /// Memory per device, GiB (default: the device's HBM, else no limit).
    #[arg(
        help_heading = "Devices and wires",
        long = "device-memory",
        value_name = "GIB"
    )]
    pub memory: Option<f64>,
    /// Sustained matrix-product rate per device, TFLOP/s (instead of bench-layers' measured GFLOP/s).
    #[arg(help_heading = "Devices and wires", long)]
    pub compute_tflops: Option<f64>,
    /// The intra-node wire as GBPS,US (instead of the measured fit).
    #[arg(help_heading = "Devices and wires", long = vocab::intra::LONG, value_name = vocab::intra::VALUE)]
    pub intra: Option<String>,
    /// The inter-node wire as GBPS,US (instead of the measured fit).
    #[arg(help_heading = "Devices and wires", long = vocab::inter::LONG, value_name = vocab::inter::VALUE)]
    pub inter: Option<String>,
    /// Results folders to take the measured figures from: all_reduce rows of collectives.csv (local/nccl: the intra-node wire; tcp/mpi: the inter-node wire), GEMM GFLOP/s of layers.csv.
    #[arg(help_heading = "Devices and wires", long = "from", num_args = 1..)]
    pub from: Vec<PathBuf>,

    #[arg(help_heading = "Stack and search", long, value_name = "NAME", help = stack_help())]
    pub stack: Option<String>,
    /// Cost one layout instead of searching: dp=D,tp=T,pp=P with optional cp=C (context parallel), ep=E and etp=T (experts: expert-parallel degree, and their tensor degree, default tp), vpp=V (interleaved chunks), mbs=B (microbatch size), schedule=NAME, first=F,last=L (layers of the first and last stages); what is not given is searched within the split. Prints each term, and how it compares with the search's best.
    #[arg(help_heading = "Stack and search", long, value_name = "SPEC")]
    pub layout: Option<String>,
    /// With --stack and --layout: search what the layout leaves open (schedules, v, microbatch size) instead of the stack's choices.
    #[arg(help_heading = "Stack and search", long)]
    pub search_open: bool,
    /// Attention with a device: flash (scores on chip, the stack's kernel: cuDNN's fused attention on megatron-core and nemo-24, else FlashAttention-2), fa2 or cudnn (that flash kernel: Transformer Engine runs FlashAttention-2 under NVTE_FUSED_ATTN=0), or unfused (batched GEMMs and softmax through HBM, as Megatron-LM ran before FlashAttention). Default: the stack's, else flash.
    #[arg(help_heading = "Stack and search", long)]
    pub attention: Option<String>,
    /// Gradient accumulation with a device: fused (inside the weight-gradient GEMM) or unfused (a pass per microbatch, as Megatron-LM's code of 2021). Default: the stack's, else fused.
    #[arg(help_heading = "Stack and search", long)]
    pub grad_accumulation: Option<String>,
    /// The data-parallel reduction overlapped with the backward in buckets: on or off (default: on with a device, off without).
    #[arg(help_heading = "Stack and search", long)]
    pub dp_overlap: Option<String>,
    #[arg(help_heading = "Stack and search", long = vocab::shard::LONG, value_name = vocab::shard::VALUE, value_delimiter = ',', help = format!("Data-parallel sharding modes to search, comma-separated {}; default none, or zero1 with --distributed-optimizer", vocab::any_of(Shard::ALL.map(|(name, _)| name))))]
    pub shard: Vec<String>,
    /// Also search ZeRO-2/3 sharded inside a node and replicated across nodes (HSDP).
    #[arg(help_heading = "Stack and search", long)]
    pub hybrid_shard: bool,
    #[arg(help_heading = "Stack and search", long = vocab::schedule::LONG, value_name = vocab::schedule::VALUE, value_delimiter = ',', help = format!("Only these pipeline schedules, comma-separated {}", vocab::any_of(ScheduleKind::ALL.map(ScheduleKind::name))))]
    pub schedules: Vec<String>,
    /// Let the tensor-parallel group span nodes.
    #[arg(help_heading = "Stack and search", long)]
    pub allow_tp_across_nodes: bool,
    /// Sequence parallelism (less activation memory, the same traffic).
    #[arg(help_heading = "Stack and search", long)]
    pub sequence_parallel: bool,
    /// Activation recomputation: none, selective or full.
    #[arg(help_heading = "Stack and search", long, default_value = "none")]
    pub recompute: String,
    /// The linear layers' precision: bf16, or fp8 (Transformer Engine's FP8 GEMMs on a device with FP8 tensor cores: H100, H200; docs/report.md, "FP8").
    #[arg(help_heading = "Stack and search", long, default_value = "bf16")]
    pub precision: String,
    /// With --precision fp8: the linear layers' weights held in FP8 (NeMo's fp8_params), not 16-bit beside an FP8 copy: 2 bytes a linear-layer parameter less.
    #[arg(help_heading = "Stack and search", long)]
    pub fp8_params: bool,
    /// How context parallelism exchanges keys and values: p2p (a ring overlapped with the attention), all_gather, or a2a (DeepSpeed-Ulysses). Default: the stack's, else p2p.
    #[arg(help_heading = "Stack and search", long = vocab::cp_comm_type::LONG, value_name = vocab::cp_comm_type::VALUE)]
    pub cp_comm_type: Option<String>,
    /// Search context-parallel degrees up to this (1: none); cp= in --layout names one.
    #[arg(help_heading = "Stack and search", long, default_value_t = 1)]
    pub max_cp: u64,
    /// Adam state sharded over the data-parallel ranks (Megatron's distributed optimizer).
    #[arg(help_heading = "Stack and search", long = vocab::distributed_optimizer::LONG)]
    pub distributed_optimizer: bool,

    /// Layouts to print.
    #[arg(help_heading = "Output and checks", long, default_value_t = 10)]
    pub top: usize,
    /// Also write the plan as JSON (put it in a results folder as plan.json for `report html`).
    #[arg(help_heading = "Output and checks", long = vocab::output_file::LONG, value_name = vocab::output_file::VALUE)]
    pub output_file: Option<PathBuf>,
    /// Cost every published run of the validation table with its stack and print each one's error and each stack's band (with --output-file, also as JSON).
    #[arg(help_heading = "Output and checks", long, conflicts_with_all = ["model", "layout", "against", "stack"])]
    pub validation: bool,
    /// Also print every figure's source in full, how the step runs, each
    /// term explained and the table's every column.
    #[arg(help_heading = "Output and checks", short = 'v', long)]
    pub verbose: bool,
    #[arg(help_heading = "Output and checks", long = vocab::against::LONG, value_name = vocab::against::VALUE, help = vocab::against::HELP, conflicts_with_all = ["model", "from", "output_file", "device", "layout"])]
    pub against: Option<PathBuf>,
}

/// `--device`'s help, listing the device presets.
fn device_help() -> String {
    format!(
        "A device description: a preset {}. Costs compute by operation (GEMMs at their shapes, attention, memory-bound work at HBM bandwidth, the optimizer), the wires from NVLink and the NICs, and memory from HBM; --compute-tflops, --intra, --inter, --device-memory and --from's measured figures override its figures",
        vocab::one_of(Device::names())
    )
}

/// `--stack`'s help, listing the stacks the planner knows.
fn stack_help() -> String {
    format!(
        "The software stack the step runs on {}: its attention, accumulation, overlaps, sharding, sequence parallelism, loss and schedules (docs/report.md, \"Stacks\"); the flags below override its choices. With --layout, the layout is costed as the stack runs it (its schedule and microbatch size where the layout does not say)",
        vocab::one_of(Stack::names())
    )
}

/// Runs `report plan`.
pub fn run(a: &PlanArgs) -> Result<()> {
    if let Some(dir) = &a.against {
        return check::run(dir);
    }
    if a.validation {
        return validation::run(a.output_file.as_deref());
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
    if let Some(s) = &file.stack {
        let name = validation::band_for(&s.value, &input);
        file.band = validation::band(&name)?;
        file.band_name = Some(name);
    }
    let plan = predict::rank_layouts(&input).map_err(|e| anyhow!("{e}"))?;
    let file = match &a.layout {
        None => {
            file.families = layout::families(&plan);
            finish(file, &plan, a.top)
        }
        Some(spec) => {
            let named = named_layout(a, &input, spec)?;
            file.layout_query = Some(spec.clone());
            file.search_best = plan.ranked.first().cloned();
            file.families = layout::families(&plan);
            finish(file, &named, a.top)
        }
    };
    parbench::out!("{}", render(&file, a.verbose));
    if let Some(path) = &a.output_file {
        let json = serde_json::to_string_pretty(&file)?;
        parbench::results::write_atomic(path, json.as_bytes())
            .map_err(|e| anyhow!("--output-file: cannot write the plan: {e}"))?;
        eprintln!("report: wrote {}", path.display());
    }
    Ok(())
}

/// `--layout SPEC` costed: as the stack runs it (its schedule and
/// microbatch size where the spec does not say) unless `--search-open`;
/// the layouts of it that fit, best first, or why none does.
fn named_layout(a: &PlanArgs, input: &PlanInput, spec: &str) -> Result<LayoutRanking> {
    let mut q = layout::parse_layout(spec)?;
    if let (Some(s), false) = (input::stack_of(a)?, a.search_open) {
        layout::as_stack_runs(&mut q, s, input.global_batch);
    }
    let named = parbench::model::plan::plan_layout(input, &q)
        .map_err(|e| anyhow!("--layout {spec}: {e}"))?;
    if named.ranked.is_empty() {
        let why = layout::closest_rejection(&named, |_| true)
            .unwrap_or_else(|| "no schedule or microbatch size of it runs".into());
        bail!("--layout {spec}: does not fit: {why}");
    }
    Ok(named)
}

/// One named layout of `a` costed, and the devices it runs on (the
/// validation table's rows).
pub fn cost_named(a: &PlanArgs, spec: &str) -> Result<(parbench::model::plan::Costed, u64)> {
    let (input, _) = prepare(a)?;
    let named = named_layout(a, &input, spec)?;
    let best = named
        .ranked
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("--layout {spec}: nothing fits"))?;
    Ok((best, input.gpus))
}

/// The file with the plan's figures.
fn finish(mut file: PlanFile, plan: &LayoutRanking, top: usize) -> PlanFile {
    file.enumerated = plan.ranked.len() + plan.rejected.len();
    file.fitting = plan.ranked.len();
    file.top = plan.ranked.iter().take(top).cloned().collect();
    if plan.ranked.first().is_some_and(|c| file.tight(c)) {
        file.best_sure = plan.ranked.iter().find(|c| !file.tight(c)).cloned();
    }
    file.losses = plan.losses();
    file
}
