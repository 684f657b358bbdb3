//! Flags, and the list of runs they ask for, each validated before anything runs.

use clap::Parser;
use parbench::comm::mesh::{MeshShape, Order};
use parbench::launch::flags::{Backend, Straggler};
use parbench::layers::{BlockConfig, BlockShape, Mode};
use parbench::model::plan::Shard;
use parbench::pipeline::{DpReduce, MlpShape, PipelineConfig, TpStageConfig, Work};
use parbench::schedule::{self, Schedule, ScheduleKind};
use parbench::vocab;
use std::path::PathBuf;
use std::time::Duration;

/// Real pipeline schedules on real stages: step time, per-rank busy and
/// idle time, the measured bubble beside the simulated and the closed form.
#[derive(Parser, Debug, Clone)]
// A flag given twice is refused (clap's default for single values, as in
// every parbench binary); a negative number reaches the flag's own check.
// -V is nccl-tests' CTA count: the version is --version alone.
#[command(
    name = "bench-pipeline",
    version,
    allow_negative_numbers = true,
    disable_version_flag = true
)]
pub struct Args {
    /// Print the version.
    #[arg(long, action = clap::ArgAction::Version)]
    pub version: Option<bool>,

    /// Stage ranks S, one count (default 4; with --backend nccl, one per
    /// visible GPU).
    #[arg(help_heading = "Pipeline", long = vocab::stages::LONG, value_name = vocab::stages::ONE, value_parser = vocab::one_count::<usize>)]
    pub stages: Option<usize>,
    #[arg(help_heading = "Pipeline", long = vocab::schedule::LONG, value_name = vocab::schedule::VALUE, help = schedule_help(), default_value = "gpipe,1f1b,interleaved,zb-h1")]
    pub schedule: String,
    /// Microbatches per step, comma-separated (a sweep): 1,2,4,8,16,32.
    #[arg(help_heading = "Pipeline", long = vocab::microbatches::LONG, value_name = vocab::microbatches::VALUE, default_value = "8")]
    pub microbatches: String,
    #[arg(help_heading = "Pipeline", long = vocab::chunks::LONG, value_name = vocab::chunks::VALUE, help = vocab::chunks::HELP, default_value_t = 2)]
    pub chunks: usize,
    /// Layers of every stage: MLP layers, or with --dp/--tp Megatron blocks.
    #[arg(help_heading = "Pipeline", long, default_value_t = 2)]
    pub layers_per_stage: usize,
    /// MLP layers of each stage, comma-separated (unbalanced stages), e.g. 2,2,4,2.
    #[arg(help_heading = "Pipeline", long, conflicts_with = "layers_per_stage")]
    pub stage_layers: Option<String>,
    /// Width of every layer (default 256; with --dp/--tp the block's width, default 64).
    #[arg(help_heading = "Pipeline", long)]
    pub hidden: Option<usize>,
    /// Rows of one microbatch (default 32; with --dp/--tp its sequences b, default 1).
    #[arg(help_heading = "Pipeline", long = vocab::microbatch_size::LONG, value_name = vocab::microbatch_size::VALUE)]
    pub microbatch_size: Option<usize>,
    /// What each action does: compute (real MLP passes) or sleep:US.
    #[arg(help_heading = "Pipeline", long, default_value = "compute")]
    pub work: String,
    /// Run a hand-written schedule: PyTorch's compute-only CSV (one row per rank).
    #[arg(help_heading = "Pipeline", long)]
    pub schedule_csv: Option<PathBuf>,
    /// Also write each generated schedule as compute-only CSV into this folder.
    #[arg(help_heading = "Pipeline", long)]
    pub dump_schedules: Option<PathBuf>,

    /// Data-parallel degree D: the world is D x T x S ranks.
    #[arg(
        help_heading = "Data and tensor parallel (composed step)",
        long,
        default_value_t = 1
    )]
    pub dp: usize,
    /// Tensor-parallel degree T of every stage's blocks, one.
    #[arg(help_heading = "Data and tensor parallel (composed step)", long = vocab::tp::LONG, value_name = vocab::tp::ONE, value_parser = vocab::one_count::<usize>, default_value = "1")]
    pub tp: usize,
    /// With --dp/--tp: the block's attention heads (default 4).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub heads: Option<usize>,
    /// With --dp/--tp: the block's MLP width (default 4 x hidden).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub ffn: Option<usize>,
    /// With --dp/--tp: tokens per sequence (default 32).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub seq: Option<usize>,
    /// With --dp/--tp: the mesh's rank order, fastest axis first (default tp-dp-pp, Megatron's).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub order: Option<String>,
    /// With --dp: most MiB in one gradient bucket (default 25, DDP's).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub bucket_mib: Option<f64>,
    /// With --dp: reduce each bucket on a thread and communicator of its
    /// own as soon as its gradients are final, concurrently with the rest
    /// of the backward (DDP's overlap; local and tcp).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub overlap: bool,
    /// With --dp: reduce-scatter the buckets (Megatron's distributed optimizer): --shard zero1.
    #[arg(help_heading = "Data and tensor parallel (composed step)", long = vocab::distributed_optimizer::LONG)]
    pub dist_opt: bool,
    /// With --dp: sharded data parallel, one mode, ending each step in Adam
    /// over what it shards: none (replicated, DDP), zero1 (optimizer state),
    /// zero2 (and gradients, reduce-scattered per layer), zero3 (and
    /// weights, all-gathered per layer: FSDP's FULL_SHARD).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long = vocab::shard::LONG, value_name = vocab::shard::ONE)]
    pub shard: Option<String>,
    /// With --shard zero1/zero2/zero3: shard inside groups of G consecutive
    /// data ranks and replicate across them (HSDP; G divides --dp).
    #[arg(
        help_heading = "Data and tensor parallel (composed step)",
        long,
        value_name = "G"
    )]
    pub shard_group: Option<usize>,
    /// With --shard zero3: all-gather each layer's weights on a thread and
    /// communicator of their own while the layer before it computes
    /// (FSDP's prefetch; local and tcp).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub prefetch: bool,
    /// With --dp/--tp: skip the gradient check (on by default for shapes whose reference is small).
    #[arg(help_heading = "Data and tensor parallel (composed step)", long)]
    pub no_check: bool,

    #[arg(help_heading = "Run", long = vocab::backend::LONG, value_name = vocab::backend::VALUE, help = vocab::backend::HELP, default_value = "local")]
    pub backend: String,
    /// With --backend tcp: spawn this many local ranks of this binary
    /// (default: the world, --stages x --dp x --tp); `-np N` as in mpirun.
    #[arg(help_heading = "Run", long = vocab::nprocs::LONG, visible_alias = "np", value_name = vocab::nprocs::VALUE)]
    pub nprocs: Option<usize>,
    #[arg(help_heading = "Run", short = 'n', long = vocab::iters::LONG, value_name = vocab::iters::VALUE, help = "Timed steps of each run (nccl-tests' -n)", default_value_t = 5)]
    pub steps: usize,
    #[arg(help_heading = "Run", short = 'w', long = vocab::warmup::LONG, value_name = vocab::warmup::VALUE, help = vocab::warmup::HELP, default_value_t = 2)]
    pub warmup: usize,
    /// Deadline of every wait and every action, in seconds; 0: the longest, a day.
    #[arg(help_heading = "Run", short = 'T', long = vocab::timeout::LONG, value_name = vocab::timeout::VALUE, default_value_t = 60.0)]
    pub timeout: f64,
    /// Compute threads of each stage rank (default: the cores divided among the stages).
    #[arg(help_heading = "Run", long)]
    pub threads: Option<usize>,
    /// Pin each stage rank to its own core when there are enough cores.
    #[arg(help_heading = "Run", long, default_value_t = true, action = clap::ArgAction::Set)]
    pub pin: bool,
    #[arg(help_heading = "Run", long = vocab::slow_rank::LONG, value_name = vocab::slow_rank::VALUE, help = vocab::slow_rank::HELP)]
    pub straggler: Option<String>,
    /// Seed of weights, inputs and targets.
    #[arg(help_heading = "Run", long, default_value_t = 1)]
    pub seed: u64,

    /// Results folder (pipeline.csv, run.json, timeline-*.json).
    #[arg(help_heading = "Output", long = vocab::out::LONG, value_name = vocab::out::VALUE, default_value = "results")]
    pub out: PathBuf,
    /// Under each run's row: per-rank busy and idle time, the idle split,
    /// clocks, pace, message time, replay, peak activations and the timeline.
    #[arg(help_heading = "Output", short = 'v', long)]
    pub verbose: bool,
    /// Draw each run's median step in the terminal (default: with -v, for small runs).
    #[arg(help_heading = "Output", long)]
    pub timeline: bool,
}

/// `--schedule`'s help, listing the schedules the registry generates.
fn schedule_help() -> String {
    format!(
        "Schedules to run, comma-separated {}; or all (every one that can be generated for the given stages and microbatches)",
        vocab::any_of(ScheduleKind::ALL.map(ScheduleKind::name))
    )
}

/// Stage ranks when --stages is absent (and the backend does not count GPUs).
pub const DEFAULT_STAGES: usize = 4;

/// One run of the sweep.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// The generator, or `None` for a CSV schedule.
    pub kind: Option<ScheduleKind>,
    pub cfg: PipelineConfig,
}

/// The composed step's part of the job (`--dp`/`--tp` above 1): the
/// mesh and the stages of Megatron blocks, the same for every run.
#[derive(Clone, Debug)]
pub struct ComposedJob {
    pub dp: usize,
    pub tp: usize,
    pub order: Order,
    /// The blocks, the batch and the reduction (`dp`, buckets, overlap).
    pub stages: TpStageConfig,
    /// Run the gradient check (compute mode, small enough reference).
    pub check: bool,
    /// Why the check is off, when it is.
    pub no_check_reason: Option<String>,
    /// Tests only ([`CORRUPT_GRAD_VAR`]): the world rank whose gradients
    /// are changed after the reduction, so that the check must fail.
    pub corrupt_grad_rank: Option<usize>,
}

/// Tests only: `PARBENCH_TEST_CORRUPT_GRAD=RANK` changes one value of
/// world rank RANK's reduced gradients before the check, so that a test
/// can see the check fail, name that rank's replica and exit 1 with the
/// records written. Not a flag: no run a user means to measure sets it.
pub const CORRUPT_GRAD_VAR: &str = "PARBENCH_TEST_CORRUPT_GRAD";

/// Floating-point operations the check's reference may take (one rank
/// running the whole model on the whole batch): a few seconds of one core.
const CHECK_REFERENCE_FLOPS: f64 = 2e10;

/// Default block of the composed step: small enough for 8 ranks on 2 cores.
const COMPOSED_HIDDEN: usize = 64;
const COMPOSED_HEADS: usize = 4;
const COMPOSED_SEQ: usize = 32;
const COMPOSED_SEQUENCES: usize = 1;

/// Every run, in order, and what they share.
#[derive(Clone, Debug)]
pub struct PipelineJob {
    pub runs: Vec<RunPlan>,
    /// Ranks of the world: the schedule's, times D x T when composed.
    pub ranks: usize,
    /// `Some` with `--dp` or `--tp` above 1.
    pub composed: Option<ComposedJob>,
    pub timeout: Duration,
    /// Sweep points left out (interleaved needs M a multiple of S), for rank 0 to print.
    pub skipped: Vec<String>,
}

fn list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    let v: Result<Vec<T>, String> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse::<T>().map_err(|e| format!("{flag}: '{x}': {e}")))
        .collect();
    let v = v?;
    if v.is_empty() {
        return Err(format!("{flag}: empty list"));
    }
    Ok(v)
}

/// `RANK:MS` through the library's one parser (one set of bounds for
/// every binary), the rank one of the schedule's.
fn straggler(s: &str, ranks: usize) -> Result<(usize, Duration), String> {
    let st: Straggler = s.parse().map_err(|e| format!("--slow-rank {e}"))?;
    if st.rank >= ranks {
        return Err(format!(
            "--slow-rank: rank {} but only {ranks} ranks",
            st.rank
        ));
    }
    Ok((st.rank, st.delay))
}

fn stage_layers(args: &Args, stages: usize) -> Result<Vec<usize>, String> {
    match &args.stage_layers {
        Some(s) => {
            let v: Vec<usize> = list("--stage-layers", s)?;
            if v.len() != stages {
                return Err(format!(
                    "--stage-layers has {} entries for {stages} stages",
                    v.len()
                ));
            }
            if v.contains(&0) {
                return Err("--stage-layers: every stage needs at least one layer".into());
            }
            Ok(v)
        }
        None if args.layers_per_stage == 0 => Err("--layers-per-stage must be at least 1".into()),
        None => Ok(vec![args.layers_per_stage; stages]),
    }
}

/// Builds and validates every run; an error here is a bad flag, file or
/// schedule (exit 2). A schedule error carries the marked grid.
pub fn job(args: &Args) -> Result<PipelineJob, String> {
    let work: Work = args.work.parse()?;
    let timeout = parbench::limits::timeout(args.timeout).map_err(|e| e.0)?;
    let composed = args.dp > 1 || args.tp > 1;
    if !composed {
        refuse_composed_flags(args)?;
    }
    let hidden = args
        .hidden
        .unwrap_or(if composed { COMPOSED_HIDDEN } else { 256 });
    let rows = args
        .microbatch_size
        .unwrap_or(if composed { COMPOSED_SEQUENCES } else { 32 });
    for (flag, v) in [
        ("--dp", args.dp),
        ("--tp", args.tp),
        ("--hidden", hidden),
        ("--microbatch-size", rows),
        ("-n/--iters", args.steps),
        ("--chunks", args.chunks),
        ("--threads", args.threads.unwrap_or(1)),
        ("--nprocs", args.nprocs.unwrap_or(1)),
    ] {
        if v == 0 {
            return Err(format!("{flag} 0: at least 1"));
        }
    }
    use parbench::limits::{count, MAX_ITERATIONS};
    count("-n/--iters", args.steps, MAX_ITERATIONS).map_err(|e| e.0)?;
    count("-w/--warmup", args.warmup, MAX_ITERATIONS).map_err(|e| e.0)?;
    let Some(backend) = Backend::named(&args.backend) else {
        return Err(format!(
            "--backend '{}': expected {}",
            args.backend,
            Backend::expected()
        ));
    };
    backend.require_built().map_err(|e| e.0)?;
    if composed {
        refuse_with_composed(args)?;
    }
    let block = composed
        .then(|| block_config(args, hidden, rows))
        .transpose()?;
    // The executor's messages: one microbatch's activation, all its rows.
    let shape = MlpShape {
        hidden,
        rows: block.map_or(rows, |b| b.tokens()),
    };
    let mut schedules: Vec<(Option<ScheduleKind>, Schedule)> = Vec::new();
    let mut skipped = Vec::new();
    if let Some(path) = &args.schedule_csv {
        let s = schedule::load_csv(path).map_err(|e| e.to_string())?;
        schedules.push((None, s));
    } else {
        // -np N is the world's ranks, as in every binary: without
        // --stages, the stage ranks they leave after --dp x --tp.
        let stages = args
            .stages
            .or_else(|| args.nprocs.map(|n| n / (args.dp * args.tp).max(1)))
            .unwrap_or(DEFAULT_STAGES);
        if stages == 0 {
            return Err("--stages must be at least 1".into());
        }
        let all = args.schedule.trim().eq_ignore_ascii_case("all");
        let kinds: Vec<ScheduleKind> = if all {
            ScheduleKind::ALL.to_vec()
        } else {
            list("--schedule", &args.schedule)?
        };
        let ms: Vec<usize> = list("--microbatches", &args.microbatches)?;
        let sweep = ms.len() * kinds.len();
        for kind in kinds {
            for &m in &ms {
                let v = if kind.chunked() { args.chunks } else { 1 };
                match schedule::generate(kind, stages, m, v) {
                    Ok(s) => schedules.push((Some(kind), s)),
                    // In a sweep, a schedule skips the shape it cannot
                    // run; alone, its error is the answer.
                    Err(e) if sweep > 1 => skipped.push(e.to_string()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
    }
    if schedules.is_empty() {
        return Err(format!(
            "nothing to run: {}",
            skipped.first().map(String::as_str).unwrap_or("empty sweep")
        ));
    }
    let stage_ranks = schedules.first().map(|(_, s)| s.ranks()).unwrap_or(1);
    let ranks = stage_ranks * args.dp * args.tp;
    if let Some(n) = args.nprocs {
        if n != ranks {
            return Err(if composed {
                format!(
                    "--nprocs {n} but the world is dp {} x tp {} x {stage_ranks} stage ranks = {ranks}",
                    args.dp, args.tp
                )
            } else {
                format!("--nprocs {n} but the schedule runs on {ranks} stage ranks (--stages, or the CSV's rows): give one of the two, or both alike")
            });
        }
        if !Backend::named(&args.backend).is_some_and(Backend::started_here) {
            return Err(format!(
                "--nprocs: --backend {} takes its ranks from its launcher (mpirun -np) or the GPUs",
                args.backend
            ));
        }
    }
    let straggler = args
        .straggler
        .as_deref()
        .map(|s| straggler(s, ranks))
        .transpose()?;
    // Every action ends within the deadline, on every backend: a backward
    // sleeps twice the forward's time, plus a straggler's delay.
    let extra = straggler.map_or(Duration::ZERO, |(_, d)| d);
    if let Work::Sleep(d) = work {
        let longest = d.saturating_mul(2).saturating_add(extra);
        if longest >= timeout {
            return Err(format!(
                "--work {}: a backward sleeps {} (twice the time{}), not less than --timeout {}",
                args.work,
                parbench::launch::duration_text(longest),
                if extra.is_zero() {
                    ""
                } else {
                    ", with the slow rank's delay"
                },
                args.timeout
            ));
        }
    } else if extra >= timeout {
        return Err(format!(
            "--slow-rank {}: the delay is not less than --timeout {}",
            args.straggler.as_deref().unwrap_or(""),
            args.timeout
        ));
    }
    let mut runs = Vec::new();
    for (kind, s) in schedules {
        schedule::validate(&s).map_err(|e| e.to_string())?;
        if let Some(dir) = &args.dump_schedules {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let file = dir.join(format!(
                "{}-S{}-M{}-v{}.csv",
                s.name,
                s.ranks(),
                s.microbatches,
                s.chunks()
            ));
            schedule::save_csv(&s, &file).map_err(|e| e.to_string())?;
        }
        let layers = stage_layers(args, s.num_stages)?;
        runs.push(RunPlan {
            kind,
            cfg: PipelineConfig {
                stage_layers: layers,
                shape,
                work,
                straggler,
                seed: args.seed,
                warmup: args.warmup,
                steps: args.steps,
                schedule: s,
            },
        });
    }
    let composed = match block {
        Some(block) => Some(composed_job(args, block, work, stage_ranks, &runs)?),
        None => None,
    };
    Ok(PipelineJob {
        runs,
        ranks,
        composed,
        timeout,
        skipped,
    })
}

/// The flags that shape the composed step, refused without it.
fn refuse_composed_flags(args: &Args) -> Result<(), String> {
    let given = [
        ("--heads", args.heads.is_some()),
        ("--ffn", args.ffn.is_some()),
        ("--seq", args.seq.is_some()),
        ("--bucket-mib", args.bucket_mib.is_some()),
        ("--overlap", args.overlap),
        ("--distributed-optimizer", args.dist_opt),
        ("--shard", args.shard.is_some()),
        ("--shard-group", args.shard_group.is_some()),
        ("--prefetch", args.prefetch),
        ("--order", args.order.is_some()),
        ("--no-check", args.no_check),
    ];
    match given.iter().find(|(_, g)| *g) {
        Some((flag, _)) => Err(format!(
            "{flag} applies to the composed step: give --dp or --tp above 1"
        )),
        None => Ok(()),
    }
}

/// What the plain pipeline has and the composed step does not.
fn refuse_with_composed(args: &Args) -> Result<(), String> {
    if Backend::named(&args.backend).is_some_and(Backend::on_gpus) {
        return Err("--dp/--tp: the mesh's groups move host buffers; the composed step runs on --backend local, tcp or mpi".into());
    }
    for (flag, given) in [
        ("--stage-layers", args.stage_layers.is_some()),
        ("--slow-rank", args.straggler.is_some()),
    ] {
        if given {
            return Err(format!(
                "{flag} applies to the plain pipeline, not with --dp/--tp (every stage holds --layers-per-stage blocks)"
            ));
        }
    }
    if args.dp == 1
        && (args.overlap
            || args.dist_opt
            || args.bucket_mib.is_some()
            || args.shard.is_some()
            || args.shard_group.is_some()
            || args.prefetch)
    {
        return Err(
            "--bucket-mib/--overlap/--distributed-optimizer/--shard shape the data-parallel reduction: give --dp above 1"
                .into(),
        );
    }
    Ok(())
}

/// `--shard` (or `--distributed-optimizer`, ZeRO-1) as a mode; `None` without either.
fn shard_mode(args: &Args) -> Result<Option<Shard>, String> {
    let named =
        match args.shard.as_deref() {
            None => None,
            Some(n) => Some(Shard::by_name(n).ok_or_else(|| {
                format!("--shard {n}: one mode here: none, zero1, zero2 or zero3")
            })?),
        };
    let mode = match (named, args.dist_opt) {
        (Some(s), true) if s != Shard::Zero1 => {
            return Err(format!(
                "--distributed-optimizer is --shard zero1; it does not go with --shard {}",
                s.name()
            ))
        }
        (None, true) => Some(Shard::Zero1),
        (m, _) => m,
    };
    if let Some(g) = args.shard_group {
        if !matches!(mode, Some(Shard::Zero1 | Shard::Zero2 | Shard::Zero3)) {
            return Err("--shard-group G shards inside groups of G data ranks: give --shard zero1, zero2 or zero3".into());
        }
        if g < 1 || !args.dp.is_multiple_of(g) {
            return Err(format!("--shard-group {g}: a divisor of --dp {}", args.dp));
        }
    }
    if args.prefetch && mode != Some(Shard::Zero3) {
        return Err("--prefetch gathers ZeRO-3's weights ahead: give --shard zero3".into());
    }
    if args.overlap && matches!(mode, Some(Shard::Zero2 | Shard::Zero3)) {
        return Err("--overlap overlaps replicated and ZeRO-1 buckets; zero2 and zero3 reduce-scatter each layer as it is done".into());
    }
    Ok(mode)
}

/// The block of the composed step from the flags; one line when a size
/// does not divide.
fn block_config(args: &Args, hidden: usize, sequences: usize) -> Result<BlockConfig, String> {
    let b = BlockConfig {
        shape: BlockShape {
            hidden,
            heads: args.heads.unwrap_or(COMPOSED_HEADS),
            ffn: args.ffn.unwrap_or(4 * hidden),
            seq: args.seq.unwrap_or(COMPOSED_SEQ),
            batch: sequences,
        },
        mode: Mode::Train,
        decode: false,
        seq_parallel: false,
    };
    for (flag, v) in [
        ("--heads", b.shape.heads),
        ("--ffn", b.shape.ffn),
        ("--seq", b.shape.seq),
    ] {
        if v == 0 {
            return Err(format!("{flag} 0: at least 1"));
        }
    }
    use parbench::limits::{count, MAX_ITERATIONS};
    count("-n/--iters", args.steps, MAX_ITERATIONS).map_err(|e| e.0)?;
    count("-w/--warmup", args.warmup, MAX_ITERATIONS).map_err(|e| e.0)?;
    b.validate(args.tp)
        .map_err(|e| format!("--tp {}: {e}", args.tp))?;
    Ok(b)
}

/// The mesh, the stages and the check of the composed step, checked.
fn composed_job(
    args: &Args,
    block: BlockConfig,
    work: Work,
    stage_ranks: usize,
    runs: &[RunPlan],
) -> Result<ComposedJob, String> {
    let order: Order = match &args.order {
        Some(o) => o.parse().map_err(|e| format!("--order {e}"))?,
        None => Order::MEGATRON,
    };
    MeshShape::new(args.dp, args.tp, stage_ranks, order)?;
    let mib = args.bucket_mib.unwrap_or(25.0);
    if !(mib.is_finite() && mib > 0.0 && mib <= 1024.0 * 1024.0) {
        return Err(format!(
            "--bucket-mib {mib}: a positive size in MiB (at most 1 TiB)"
        ));
    }
    let stages = TpStageConfig {
        block,
        layers_per_stage: args.layers_per_stage,
        seed: args.seed,
        dp: args.dp,
        reduce: DpReduce {
            bucket_bytes: ((mib * 1048576.0) as usize).max(4),
            overlap: args.overlap,
            shard: shard_mode(args)?,
            shard_group: args.shard_group.unwrap_or(0),
            prefetch: args.prefetch,
        },
    };
    stages.validate(args.tp).map_err(|e| e.to_string())?;
    // The reference runs every block of the whole model at tp 1 on every
    // microbatch of the global batch, on one rank.
    let reference = runs
        .iter()
        .map(|r| {
            let s = &r.cfg.schedule;
            BlockConfig {
                seq_parallel: false,
                ..block
            }
            .flops()
                * (s.num_stages * args.layers_per_stage * args.dp * s.microbatches) as f64
        })
        .fold(0.0, f64::max);
    let no_check_reason = if args.no_check {
        Some("--no-check".to_string())
    } else if work != Work::Compute {
        Some(format!("--work {work}: no gradients are computed"))
    } else if reference > CHECK_REFERENCE_FLOPS {
        Some(format!(
            "the reference (one rank, the whole model on the whole batch) would take {:.1e} FLOP, more than {CHECK_REFERENCE_FLOPS:.0e}",
            reference
        ))
    } else {
        None
    };
    let world = args.dp * args.tp * runs.first().map_or(1, |r| r.cfg.schedule.ranks());
    let corrupt_grad_rank = match std::env::var(CORRUPT_GRAD_VAR) {
        Err(_) => None,
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(r) if r < world => Some(r),
            _ => {
                return Err(format!(
                    "{CORRUPT_GRAD_VAR}={v}: expected a world rank below {world}"
                ))
            }
        },
    };
    Ok(ComposedJob {
        dp: args.dp,
        tp: args.tp,
        order,
        stages,
        check: no_check_reason.is_none(),
        no_check_reason,
        corrupt_grad_rank,
    })
}

impl ComposedJob {
    /// Bytes one rank of `s`'s pipeline holds (upper bound): per block it
    /// holds, its weights, gradients and one microbatch's activations
    /// ([`BlockConfig::memory_bytes`]), once for each microbatch the
    /// schedule keeps in flight there.
    pub fn memory_bytes_per_rank(&self, s: &Schedule) -> Vec<u128> {
        let (one, _) = self.stages.block.memory_bytes(self.tp, 4, false);
        let held = schedule::peak_in_flight(s);
        (0..s.ranks())
            .map(|r| {
                let blocks = (s.stages_of(r).len() * self.stages.layers_per_stage) as u128;
                blocks * one * held.get(r).copied().unwrap_or(1).max(1) as u128
            })
            .collect()
    }

    /// What the check's reference adds on its rank: the whole model at
    /// tp 1 with one microbatch's activations per block.
    pub fn reference_bytes(&self, s: &Schedule) -> u128 {
        if !self.check {
            return 0;
        }
        let (one, _) = BlockConfig {
            seq_parallel: false,
            ..self.stages.block
        }
        .memory_bytes(1, 4, false);
        (s.num_stages * self.stages.layers_per_stage) as u128 * one
    }
}

#[cfg(test)]
#[path = "../../test-support/vocab.rs"]
mod vocab_check;

#[cfg(test)]
#[path = "../../test-support/help.rs"]
mod help_check;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_the_schedules_and_stays_in_this_binary() {
        use clap::CommandFactory;
        let names = ScheduleKind::ALL.map(ScheduleKind::name);
        help_check::assert_lists(&Args::command(), None, "schedule", names);
        help_check::assert_plain_help(Args::command(), &["bench-collectives", "bench-layers"]);
    }

    #[test]
    fn one_value_flags_do_not_advertise_a_list() {
        use clap::CommandFactory;
        let help = Args::command().render_help().to_string();
        for (flag, one) in [("--stages", "S"), ("--tp", "T"), ("--shard", "MODE")] {
            assert!(help.contains(&format!("{flag} <{one}>")), "{flag}: {help}");
        }
    }

    #[test]
    fn flags_are_the_shared_vocabulary() {
        use clap::CommandFactory;
        vocab_check::assert_shared_vocabulary(vocab::Tool::Pipeline, Args::command());
        let e = Args::try_parse_from(["bench-pipeline", "--tp", "2,4"]).unwrap_err();
        assert!(e.to_string().contains("one value"), "{e}");
    }

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["bench-pipeline"];
        v.extend(extra);
        Args::parse_from(v)
    }

    #[test]
    fn n_is_iterations_w_warm_up_np_ranks() {
        let a = Args::parse_from(parbench::term::rewrite_np([
            "bench-pipeline",
            "-n",
            "3",
            "-w",
            "1",
            "-np",
            "2",
        ]));
        assert_eq!((a.steps, a.warmup, a.nprocs), (3, 1, Some(2)));
    }

    #[test]
    fn np_is_the_worlds_ranks() {
        // Without --stages, -np N runs N stage ranks (was: refused as 4).
        let p = job(&args(&["--nprocs", "2", "--schedule", "1f1b"])).unwrap();
        assert_eq!((p.ranks, p.runs[0].cfg.schedule.num_stages), (2, 2));
        let p = job(&args(&[
            "--nprocs",
            "8",
            "--dp",
            "2",
            "--schedule",
            "1f1b",
            "--microbatches",
            "4",
        ]))
        .unwrap();
        assert_eq!(p.ranks, 8);
        let e = job(&args(&["--nprocs", "2", "--stages", "4"])).unwrap_err();
        assert!(e.contains("give one of the two"), "{e}");
    }

    #[test]
    fn the_default_sweep_is_every_schedule() {
        let p = job(&args(&[])).unwrap();
        assert_eq!(p.runs.len(), 4);
        assert_eq!(p.ranks, 4);
        assert_eq!(p.runs[2].cfg.schedule.num_stages, 8);
        assert_eq!(p.runs[2].cfg.stage_layers, vec![2; 8]);
    }

    #[test]
    fn all_runs_every_schedule_the_shape_allows() {
        let p = job(&args(&["--schedule", "all", "--microbatches", "8"])).unwrap();
        let names: Vec<&str> = p
            .runs
            .iter()
            .map(|r| r.cfg.schedule.name.as_str())
            .collect();
        let every: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, every);
        // DualPipeV needs M >= 2S, interleaved M a multiple of S: skipped with a note.
        let p = job(&args(&["--schedule", "ALL", "--microbatches", "6"])).unwrap();
        assert_eq!(p.runs.len(), ScheduleKind::ALL.len() - 2);
        assert!(
            p.skipped.iter().any(|s| s.contains("dualpipev")),
            "{:?}",
            p.skipped
        );
        let zbv = job(&args(&["--schedule", "zb-v", "--chunks", "3"])).unwrap();
        assert_eq!(
            zbv.runs[0].cfg.schedule.stage_to_rank,
            [0, 1, 2, 3, 3, 2, 1, 0]
        );
        let e = job(&args(&["--schedule", "dualpipev", "--microbatches", "4"])).unwrap_err();
        assert!(e.contains("M = 4 < 2R = 8") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn bad_flags_name_the_problem() {
        let e = job(&args(&["--schedule", "pipedream"])).unwrap_err();
        assert!(e.contains("unknown schedule 'pipedream'"), "{e}");
        let e = job(&args(&["--stage-layers", "2,2"])).unwrap_err();
        assert!(e.contains("2 entries for 4 stages"), "{e}");
        let e = job(&args(&["--slow-rank", "9:5"])).unwrap_err();
        assert!(e.contains("rank 9"), "{e}");
        let e = job(&args(&["--schedule", "interleaved", "--microbatches", "6"])).unwrap_err();
        assert!(e.contains("multiple of 4"), "{e}");
        let p = job(&args(&["--microbatches", "2,4"])).unwrap();
        assert_eq!(p.runs.len(), 7, "interleaved M=2 is left out of the sweep");
        assert!(p.skipped[0].contains("multiple of 4"), "{:?}", p.skipped);
        let e = job(&args(&["--work", "sleep:x"])).unwrap_err();
        assert!(e.contains("microseconds"), "{e}");
        for (a, want) in [
            (&["--timeout", "-1"][..], "--timeout -1"),
            (&["--threads", "0"][..], "--threads 0"),
            (
                &["--work", "sleep:3000000", "--timeout", "5"][..],
                "--work sleep:3000000",
            ),
            (&["--stages", "100000"][..], "at most 256 stage ranks"),
            (&["--microbatches", "10000000"][..], "at most 65536"),
        ] {
            let e = job(&args(a)).unwrap_err();
            assert!(e.contains(want), "{a:?}: {e}");
        }
    }
}
