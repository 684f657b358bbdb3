//! Flags, and the plan they resolve to. Every problem with a flag is one
//! [`UsageError`] line (exit code 2) before anything runs.

use clap::Parser;
use parbench::comm::DType;
use parbench::layers::cp::{CpComm, CpConfig, CpPlan};
use parbench::layers::moe::{MoeAttention, MoeConfig, MoeLayout};
use parbench::layers::{BlockConfig, BlockShape, Mode};
use parbench::model::{LinkParams, Preset};
use parbench::vocab;
use std::path::PathBuf;
use std::time::Duration;

/// A flag that cannot be used: printed as one line, exit code 2.
pub use parbench::launch::UsageError;

fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Megatron tensor-parallel transformer blocks at TP 1, 2, 4, 8: compute and
/// communication time per block and per token, checked against the unsharded
/// block and held against the alpha-beta model of the same wire.
#[derive(Parser, Debug, Clone)]
// A flag given twice is refused (clap's default for single values, as in
// every parbench binary); a negative number reaches the flag's own check.
// -V is nccl-tests' CTA count: the version is --version alone.
#[command(
    name = "bench-layers",
    version,
    allow_negative_numbers = true,
    disable_version_flag = true
)]
pub struct Cli {
    /// Print the version.
    #[arg(long, action = clap::ArgAction::Version)]
    pub version: Option<bool>,

    #[arg(long, default_value = "tiny", help = preset_help(), help_heading = "Model")]
    pub preset: String,
    /// Model width.
    #[arg(long, help_heading = "Model")]
    pub hidden: Option<usize>,
    /// Attention heads.
    #[arg(long, help_heading = "Model")]
    pub heads: Option<usize>,
    /// MLP width.
    #[arg(long, help_heading = "Model")]
    pub ffn: Option<usize>,
    /// Tokens per sequence (prefill, train) or KV-cache length (decode);
    /// default: the preset's context for GPU backends, 128 on the CPU.
    #[arg(long, help_heading = "Model")]
    pub seq: Option<usize>,
    /// Sequences per block call: the microbatch size b.
    #[arg(long = vocab::microbatch_size::LONG, value_name = vocab::microbatch_size::VALUE, default_value_t = 1, help_heading = "Model")]
    pub batch: usize,
    /// Storage type: float, half or bfloat16 (default float on the CPU,
    /// bfloat16 on GPUs); or fp8: bfloat16 with the block's products in
    /// E4M3 (--backend nccl on sm_89 or newer).
    #[arg(short = 'd', long = vocab::dtype::LONG, value_name = vocab::dtype::VALUE, help_heading = "Model")]
    pub dtype: Option<String>,

    /// Tensor-parallel degrees to sweep, comma-separated (default 1,2,4,8 up
    /// to the ranks available); with --experts, an attention before the MoE
    /// layer, tensor-parallel over each degree on the same ranks.
    #[arg(long = vocab::tp::LONG, value_name = vocab::tp::VALUE, help_heading = "Sweep")]
    pub tp: Option<String>,
    #[arg(long = vocab::mode::LONG, value_name = vocab::mode::VALUE, help = vocab::mode::HELP, default_value = "prefill", help_heading = "Sweep")]
    pub mode: String,
    /// Sequence parallelism: all-gather and reduce-scatter instead of all-reduce.
    #[arg(long, help_heading = "Sweep")]
    pub sequence_parallel: bool,
    /// Timed iterations at each tensor-parallel degree (nccl-tests' -n).
    #[arg(short = 'n', long = vocab::iters::LONG, value_name = vocab::iters::VALUE, default_value_t = 10, help_heading = "Sweep")]
    pub iters: usize,
    #[arg(short = 'w', long = vocab::warmup::LONG, value_name = vocab::warmup::VALUE, help = vocab::warmup::HELP, default_value_t = 2, help_heading = "Sweep")]
    pub warmup: usize,
    /// The wire as GBPS,US (bandwidth in GB/s, latency in microseconds) for
    /// the communication model, instead of fitting it in this run.
    #[arg(long = vocab::link::LONG, value_name = vocab::link::VALUE, help_heading = "Sweep")]
    pub link: Option<String>,
    #[arg(long = vocab::no_check::LONG, help = vocab::no_check::HELP, help_heading = "Sweep")]
    pub no_check: bool,
    /// Context-parallel degrees to sweep, comma-separated: the attention
    /// alone, the sequence split over C ranks (2C chunks, rank i holding
    /// chunks i and 2C-1-i), instead of the tensor-parallel block. With
    /// one --tp T, each degree runs on T x C ranks, the heads split over T.
    #[arg(long, value_name = "LIST", help_heading = "Context parallelism")]
    pub cp: Option<String>,
    /// How --cp moves keys and values: p2p (a ring overlapped with the
    /// attention), all_gather, or a2a (DeepSpeed-Ulysses). Default p2p.
    #[arg(long = vocab::cp_comm_type::LONG, value_name = vocab::cp_comm_type::VALUE, help_heading = "Context parallelism")]
    pub cp_comm_type: Option<String>,
    /// The --cp attention's mask: causal (default) or none.
    #[arg(long, value_name = "MASK", help_heading = "Context parallelism")]
    pub attn_mask: Option<String>,

    /// Routed experts: runs a mixture-of-experts block under expert
    /// parallelism (--ep) instead of the tensor-parallel block.
    #[arg(long = vocab::experts::LONG, value_name = vocab::experts::VALUE, help_heading = "Mixture of experts")]
    pub experts: Option<usize>,
    /// Experts each token is routed to (default 2).
    #[arg(long = vocab::topk::LONG, value_name = vocab::topk::VALUE, help_heading = "Mixture of experts")]
    pub topk: Option<usize>,
    /// Each expert's MLP width (default: --ffn, the preset's MLP width).
    #[arg(long = vocab::expert_ffn::LONG, value_name = vocab::expert_ffn::VALUE, help_heading = "Mixture of experts")]
    pub expert_ffn: Option<usize>,
    /// Shared experts of width --expert-ffn that every token passes through (default 0).
    #[arg(long = vocab::shared_experts::LONG, value_name = vocab::shared_experts::VALUE, help_heading = "Mixture of experts")]
    pub shared_experts: Option<usize>,
    /// Expert-parallel degrees to sweep, comma-separated (default 1,2,4,8 up
    /// to the ranks available).
    #[arg(long, value_name = "E[,E...]", help_heading = "Mixture of experts")]
    pub ep: Option<String>,
    /// Expert tensor-parallel degrees, comma-separated (default 1): each
    /// expert's MLP split over T ranks (column-parallel gate and up,
    /// row-parallel down); every --ep with every --etp, on ep x etp ranks.
    #[arg(long, value_name = "T[,T...]", help_heading = "Mixture of experts")]
    pub etp: Option<String>,

    #[arg(long = vocab::backend::LONG, value_name = vocab::backend::VALUE, help = vocab::backend::HELP, default_value = "local", help_heading = "Ranks and output")]
    pub backend: String,
    // Default: this machine's cores, or the launcher's world.
    #[arg(long = vocab::nprocs::LONG, visible_alias = "np", value_name = vocab::nprocs::VALUE, help = vocab::nprocs::HELP, help_heading = "Ranks and output")]
    pub nprocs: Option<usize>,
    #[arg(short = 'T', long = vocab::timeout::LONG, value_name = vocab::timeout::VALUE, help = vocab::timeout::HELP, default_value_t = 60.0, help_heading = "Ranks and output")]
    pub timeout: f64,
    #[arg(long = vocab::out::LONG, value_name = vocab::out::VALUE, help = vocab::out::HELP, default_value = "results", help_heading = "Ranks and output")]
    pub out: PathBuf,
    /// Also print the columns the records keep beside the answer: each
    /// degree's tok_us, B/call, calls and GF/s (an MoE block's B/a2a and GF/s).
    #[arg(short = 'v', long, help_heading = "Ranks and output")]
    pub verbose: bool,
}

/// `--preset`'s help, listing the presets the library has.
fn preset_help() -> String {
    format!(
        "Block sizes of a named model {}; --hidden/--heads/--ffn/--seq override them",
        vocab::one_of(Preset::names())
    )
}

/// What the flags ask for, checked.
#[derive(Clone, Debug)]
pub struct LayerJob {
    pub backend: Backend,
    pub preset: String,
    pub block: BlockConfig,
    /// Storage type (bfloat16 under `fp8`).
    pub dtype: DType,
    /// `--dtype fp8`: the block's unbatched products in E4M3 on the GPU.
    pub fp8: bool,
    pub tps: Vec<usize>,
    pub iters: usize,
    pub warmup: usize,
    pub link: Option<LinkParams>,
    pub check: bool,
    pub out: PathBuf,
    pub timeout: Duration,
    /// The MoE block of `--experts`: then `tps` holds the ranks of each of
    /// `moe_layouts`, and the dense block's shape only lends its sizes.
    pub moe: Option<MoeConfig>,
    /// The `--ep` x `--etp` layouts the MoE block runs, in order (every
    /// expert-parallel degree at the first expert-tensor one, then the next).
    pub moe_layouts: Vec<MoeLayout>,
    /// `--cp`: the context-parallel attention at these degrees (then `tps`
    /// holds the same degrees, the ranks each one runs on).
    pub cp: Option<CpJob>,
    /// `-v`: every column of the tables.
    pub verbose: bool,
}

/// What `--cp` asks for, checked.
#[derive(Clone, Debug)]
pub struct CpJob {
    /// Context-parallel degrees; each runs on `tp` x degree ranks.
    pub degrees: Vec<usize>,
    pub config: CpConfig,
    /// Tensor-parallel degree (1 without --tp) and forward or train.
    pub plan: CpPlan,
}

impl CpJob {
    /// The ranks degree `c` runs on.
    pub fn world(&self, c: usize) -> usize {
        self.plan.tp * c
    }
}

impl LayerJob {
    /// The type the rank's compute device is opened with: the storage type,
    /// or `F8E4M3` for bf16 storage with FP8 products (`--dtype fp8`).
    pub fn device_dtype(&self) -> DType {
        if self.fp8 {
            DType::F8E4M3
        } else {
            self.dtype
        }
    }

    /// Bytes one rank of degree `t` holds with `elem`-byte values, and what
    /// the unsharded check adds on rank 0: the MoE block's (the largest of
    /// its layouts on `t` ranks) or the dense one's.
    pub fn memory_bytes(&self, t: usize, elem: u128) -> (u128, u128) {
        match &self.moe {
            Some(m) => self
                .moe_layouts
                .iter()
                .filter(|l| l.world() == t)
                .map(|&l| m.memory_bytes(l, elem, self.check))
                .max()
                .unwrap_or((0, 0)),
            None => self.block.memory_bytes(t, elem, self.check),
        }
    }
}

/// The communicator a run uses.
pub use parbench::launch::flags::Backend;

/// Parses `flag`'s `1,2,4,8` into distinct positive degrees, in the given order.
fn parse_degrees(flag: &str, s: &str) -> Result<Vec<usize>, UsageError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let t: usize = part
            .parse()
            .map_err(|_| UsageError(format!("{flag}: '{part}' is not a positive integer")))?;
        if t == 0 {
            return usage(format!("{flag}: degrees must be at least 1"));
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    if out.is_empty() {
        return usage(format!("{flag}: no degree given"));
    }
    Ok(out)
}

impl Cli {
    /// Resolves the flags against the presets and the ranks available
    /// (`default_ranks` when --nprocs is absent).
    pub fn job(&self, default_ranks: usize) -> Result<LayerJob, UsageError> {
        let backend: Backend = self.backend.parse().map_err(|e| {
            UsageError(format!("--backend: {e} (expected {})", Backend::expected()))
        })?;
        let preset = Preset::by_name(&self.preset).ok_or_else(|| {
            UsageError(format!(
                "--preset: unknown '{}' (expected one of {})",
                self.preset,
                Preset::names().join(", ")
            ))
        })?;
        // Its block is dense: an MoE preset's would be one expert's MLP
        // standing for the layer, which is not what the name says.
        if preset.moe.is_some() {
            return usage(format!(
                "--preset {}: a mixture of experts; bench-layers times dense blocks (report plan costs MoE layers)",
                preset.name
            ));
        }
        let (mode, decode) = match self.mode.to_ascii_lowercase().as_str() {
            "prefill" => (Mode::Forward, false),
            "decode" => (Mode::Forward, true),
            "train" => (Mode::Train, false),
            other => return usage(format!("--mode {other}: expected prefill, decode or train")),
        };
        let fp8 = self.dtype.as_deref().is_some_and(|d| {
            d.trim().eq_ignore_ascii_case("fp8") || d.parse::<DType>() == Ok(DType::F8E4M3)
        });
        if fp8 && !backend.on_gpus() {
            return usage(
                "--dtype fp8: fp8 GEMMs need a GPU of sm_89 or newer (--backend nccl); the CPU backends compute in float, half or bfloat16".to_string(),
            );
        }
        let dtype: DType = match &self.dtype {
            Some(_) if fp8 => DType::BF16,
            Some(d) => d.parse().map_err(UsageError)?,
            None if backend.on_gpus() => DType::BF16,
            None => DType::F32,
        };
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return usage(format!(
                "--dtype: {dtype} is not a compute type (float, half or bfloat16)"
            ));
        }
        let as_usize = |v: u64, what: &str| {
            usize::try_from(v).map_err(|_| UsageError(format!("preset {what} too large")))
        };
        let default_seq = if backend.on_gpus() {
            as_usize(preset.seq, "seq")?
        } else {
            as_usize(preset.seq, "seq")?.min(128)
        };
        let shape = BlockShape {
            hidden: self.hidden.unwrap_or(as_usize(preset.hidden, "hidden")?),
            heads: self.heads.unwrap_or(as_usize(preset.heads, "heads")?),
            ffn: self.ffn.unwrap_or(as_usize(preset.ffn, "ffn")?),
            seq: self.seq.unwrap_or(default_seq),
            batch: self.batch,
        };
        for (flag, v) in [
            ("--hidden", self.hidden),
            ("--heads", self.heads),
            ("--ffn", self.ffn),
            ("--seq", self.seq),
            ("--microbatch-size", Some(self.batch)),
        ] {
            if v == Some(0) {
                return usage(format!("{flag} 0: at least 1"));
            }
        }
        // cuBLASLt's FP8 kernels take K a multiple of 16: the products'
        // K are the hidden size, the MLP's width and (weight gradients) the tokens.
        let tokens = shape.seq * shape.batch;
        if fp8 {
            for (what, v) in [
                ("hidden", shape.hidden),
                ("ffn", shape.ffn),
                ("batch x seq", tokens),
            ] {
                if !v.is_multiple_of(16) {
                    return usage(format!(
                        "--dtype fp8: {what} {v} is not a multiple of 16 (cuBLASLt's FP8 products take K a multiple of 16)"
                    ));
                }
            }
        }
        let block = BlockConfig {
            shape,
            mode,
            decode,
            seq_parallel: self.sequence_parallel,
        };
        let ranks = match self.nprocs {
            Some(0) => return usage("--nprocs 0: at least 1 rank"),
            Some(n) => n,
            None => default_ranks.max(1),
        };
        if self.experts.is_some() && self.cp.is_some() {
            return usage(
                "--cp with --experts: --cp runs the attention alone, --experts the MoE block",
            );
        }
        let cp = self.cp_job(&block)?;
        let moe = self.moe(&block)?;
        let most = backend.most_ranks();
        let moe_layouts = match &moe {
            Some(m) => self.moe_layouts(m, ranks, most)?,
            None => Vec::new(),
        };
        let (flag, list) = match &cp {
            Some(_) => ("--cp", &self.cp),
            None => ("--tp", &self.tp),
        };
        let tps = match (&moe, &cp, list) {
            (Some(_), _, _) => moe_layouts.iter().map(MoeLayout::world).collect(),
            (None, Some(cp), _) => cp.degrees.iter().map(|&c| cp.world(c)).collect(),
            (None, None, Some(s)) => parse_degrees(flag, s)?,
            (None, None, None) => [1, 2, 4, 8].into_iter().filter(|&t| t <= ranks).collect(),
        };
        if let Some(&t) = tps.iter().find(|&&t| t > most) {
            return usage(format!(
                "{flag} {t}: --backend {} runs at most {most} ranks",
                backend.name()
            ));
        }
        if moe.is_none() && cp.is_none() {
            // cp_job checked its degrees against the attention's shape.
            for &t in &tps {
                block
                    .validate(t)
                    .map_err(|e| UsageError(format!("--tp {t}: {e}")))?;
            }
        }
        if self.iters == 0 {
            return usage("--iters 0: at least 1");
        }
        use parbench::limits::{count, MAX_ITERATIONS};
        count("-n/--iters", self.iters, MAX_ITERATIONS)?;
        count("-w/--warmup", self.warmup, MAX_ITERATIONS)?;
        let timeout = parbench::limits::timeout(self.timeout).map_err(|e| UsageError(e.0))?;
        let link = self
            .link
            .as_deref()
            .map(|s| {
                s.parse::<LinkParams>()
                    .map_err(|e| UsageError(format!("--link: {e}")))
            })
            .transpose()?;
        Ok(LayerJob {
            backend,
            preset: if self.hidden.is_some() || self.heads.is_some() || self.ffn.is_some() {
                "custom".into()
            } else {
                preset.name.to_string()
            },
            block,
            dtype,
            fp8,
            tps,
            iters: self.iters,
            warmup: self.warmup,
            link,
            check: !self.no_check,
            out: self.out.clone(),
            timeout,
            moe,
            moe_layouts,
            cp,
            verbose: self.verbose,
        })
    }

    /// `--ep` x `--etp`: every layout checked against the block's sizes and
    /// the backend's `most` ranks. Without --ep, the expert-parallel degrees
    /// of 1, 2, 4, 8 whose layouts split the block on at most `ranks` ranks.
    fn moe_layouts(
        &self,
        moe: &MoeConfig,
        ranks: usize,
        most: usize,
    ) -> Result<Vec<MoeLayout>, UsageError> {
        let etps = match &self.etp {
            Some(s) => parse_degrees("--etp", s)?,
            None => vec![1],
        };
        let eps = match &self.ep {
            Some(s) => Some(parse_degrees("--ep", s)?),
            None => None,
        };
        let tps = match &self.tp {
            Some(s) => parse_degrees("--tp", s)?,
            None => vec![1],
        };
        let mut out = Vec::new();
        // Without --ep, why the first default layout did not fit.
        let mut skipped = None;
        for &etp in &etps {
            let given = eps.is_some();
            let eps = eps.clone().unwrap_or_else(|| vec![1, 2, 4, 8]);
            for (ep, &tp) in eps
                .into_iter()
                .flat_map(|e| tps.iter().map(move |t| (e, t)))
            {
                let layout = MoeLayout { ep, etp, tp };
                let fits = moe.validate(layout);
                let name = match self.tp {
                    Some(_) => format!("--ep {ep} --etp {etp} --tp {tp}"),
                    None => format!("--ep {ep} --etp {etp}"),
                };
                if !given && (layout.world() > ranks || fits.is_err()) {
                    skipped = skipped.or(Some(match &fits {
                        Err(e) => format!("{name}: {e}"),
                        Ok(()) => format!("{name}: {} ranks, {ranks} available", layout.world()),
                    }));
                    continue;
                }
                if layout.world() > most {
                    return usage(format!(
                        "{name}: {} ranks, --backend {} runs at most {most}",
                        layout.world(),
                        self.backend
                    ));
                }
                fits.map_err(|e| UsageError(format!("{name}: {e}")))?;
                out.push(layout);
            }
        }
        if out.is_empty() {
            return usage(skipped.unwrap_or_else(|| "--ep: no layout".into()));
        }
        Ok(out)
    }

    /// `--cp` and `--cp-comm-type`, checked against the block's sizes and
    /// the flags that do not apply to the attention alone.
    fn cp_job(&self, block: &BlockConfig) -> Result<Option<CpJob>, UsageError> {
        let Some(list) = &self.cp else {
            for (flag, given) in [
                ("--cp-comm-type", self.cp_comm_type.is_some()),
                ("--attn-mask", self.attn_mask.is_some()),
            ] {
                if given {
                    return usage(format!("{flag}: only with --cp"));
                }
            }
            return Ok(None);
        };
        let degrees = parse_degrees("--cp", list)?;
        let method: CpComm = self
            .cp_comm_type
            .as_deref()
            .unwrap_or("p2p")
            .parse()
            .map_err(|e| UsageError(format!("--cp-comm-type: {e}")))?;
        let causal = match self.attn_mask.as_deref().unwrap_or("causal") {
            "causal" => true,
            "none" => false,
            other => return usage(format!("--attn-mask {other}: expected causal or none")),
        };
        let refused = [
            (block.decode, "--mode decode"),
            (self.sequence_parallel, "--sequence-parallel"),
            (self.link.is_some(), "--link"),
        ];
        if let Some((_, flag)) = refused.iter().find(|(given, _)| *given) {
            return usage(format!(
                "--cp runs the attention alone, prefill or train: {flag} does not apply to it"
            ));
        }
        let tp = match self
            .tp
            .as_deref()
            .map(|s| parse_degrees("--tp", s))
            .transpose()?
        {
            None => 1,
            Some(t) if t.len() == 1 => t[0],
            Some(_) => return usage("--tp with --cp: one degree (the world is tp x cp)"),
        };
        if let Some(d) = &self.dtype {
            if d.parse::<DType>() != Ok(DType::F32) {
                return usage(format!("--cp computes in float on the host: --dtype {d}"));
            }
        }
        let s = &block.shape;
        if !s.hidden.is_multiple_of(s.heads) {
            return usage(format!(
                "--cp: hidden {} is not a multiple of heads {}",
                s.hidden, s.heads
            ));
        }
        let config = CpConfig {
            seq: s.seq,
            heads: s.heads,
            head_dim: s.hidden / s.heads,
            batch: s.batch,
            method,
            causal,
        };
        for &c in &degrees {
            config.validate_grid(tp, c).map_err(|e| {
                let detail = match e {
                    parbench::layers::LayerError::Config(m) => m,
                    other => other.to_string(),
                };
                let grid = if tp > 1 {
                    format!("--tp {tp} ")
                } else {
                    String::new()
                };
                UsageError(format!("{grid}--cp {c}: {detail}"))
            })?;
        }
        let plan = CpPlan {
            tp,
            train: block.mode == Mode::Train,
        };
        Ok(Some(CpJob {
            degrees,
            config,
            plan,
        }))
    }

    /// The MoE block the flags ask for (`None` without --experts), its
    /// flags checked against each other and the dense block's.
    fn moe(&self, block: &BlockConfig) -> Result<Option<MoeConfig>, UsageError> {
        let Some(experts) = self.experts else {
            for (flag, given) in [
                ("--topk", self.topk.is_some()),
                ("--expert-ffn", self.expert_ffn.is_some()),
                ("--shared-experts", self.shared_experts.is_some()),
                ("--ep", self.ep.is_some()),
                ("--etp", self.etp.is_some()),
            ] {
                if given {
                    return usage(format!("{flag} needs --experts"));
                }
            }
            return Ok(None);
        };
        let topk = self.topk.unwrap_or(2);
        let ffn = self.expert_ffn.unwrap_or(block.shape.ffn);
        for (flag, v) in [
            ("--experts", experts),
            ("--topk", topk),
            ("--expert-ffn", ffn),
        ] {
            if v == 0 {
                return usage(format!("{flag} 0: at least 1"));
            }
        }
        if topk > experts {
            return usage(format!(
                "--topk {topk}: more than the {experts} experts (--experts)"
            ));
        }
        if block.decode {
            return usage("--experts runs --mode prefill or train");
        }
        // The attention beside the MoE layer always runs sequence-parallel.
        if block.seq_parallel && self.tp.is_none() {
            return usage(
                "--sequence-parallel with --experts: only with --tp (the attention beside the MoE layer)",
            );
        }
        Ok(Some(MoeConfig {
            hidden: block.shape.hidden,
            ffn,
            experts,
            topk,
            shared: self.shared_experts.unwrap_or(0),
            tokens: block.tokens(),
            mode: block.mode,
            attention: self.tp.as_ref().map(|_| MoeAttention {
                heads: block.shape.heads,
                seq: block.shape.seq,
            }),
        }))
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
    fn flags_are_the_shared_vocabulary() {
        use clap::CommandFactory;
        vocab_check::assert_shared_vocabulary(vocab::Tool::Layers, Cli::command());
    }

    #[test]
    fn help_lists_the_presets_and_stays_in_this_binary() {
        use clap::CommandFactory;
        help_check::assert_lists(&Cli::command(), None, "preset", Preset::names());
        help_check::assert_plain_help(Cli::command(), &["bench-collectives", "bench-pipeline"]);
    }

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("bench-layers").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn default_sweep_stops_at_the_ranks_available() {
        let p = cli(&[]).job(2).unwrap();
        assert_eq!(p.tps, vec![1, 2]);
        assert_eq!(p.block.shape.hidden, 512);
        assert_eq!(p.dtype, DType::F32);
        assert_eq!(cli(&["--np", "8"]).job(2).unwrap().tps, vec![1, 2, 4, 8]);
    }

    #[test]
    fn n_is_iterations_w_is_warm_up_np_is_ranks() {
        let argv = parbench::term::rewrite_np(["bench-layers", "-n", "3", "-w", "1", "-np", "4"]);
        let p = Cli::try_parse_from(argv).unwrap().job(2).unwrap();
        assert_eq!((p.iters, p.warmup), (3, 1));
        assert_eq!(p.tps, vec![1, 2, 4]);
    }

    #[test]
    fn bad_flags_are_one_line_each() {
        for (args, needle) in [
            (&["--tp", "1,x"][..], "--tp"),
            (&["--tp", "3"][..], "heads 8"),
            (&["--heads", "6", "--tp", "4"][..], "heads 6"),
            (
                &["--ffn", "2047", "--heads", "2", "--tp", "2"][..],
                "ffn 2047",
            ),
            (&["--mode", "sideways"][..], "mode"),
            (&["--mode", "forward"][..], "--mode forward"),
            (&["--preset", "gpt5"][..], "--preset"),
            (&["--preset", "deepseek-v3"][..], "mixture of experts"),
            (&["--link", "100"][..], "--link"),
            (&["--link", "0,5"][..], "--link"),
            (&["--dtype", "int32"][..], "--dtype"),
            (&["--backend", "ib"][..], "--backend"),
            (&["--iters", "0"][..], "--iters"),
        ] {
            let e = cli(args).job(8).unwrap_err().0;
            assert!(e.contains(needle), "{args:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn fp8_is_bf16_storage_with_fp8_products_on_gpus_only() {
        let p = cli(&["--backend", "nccl", "--dtype", "fp8", "--tp", "1"])
            .job(8)
            .unwrap();
        assert!(p.fp8);
        assert_eq!((p.dtype, p.device_dtype()), (DType::BF16, DType::F8E4M3));
        let p = cli(&["--backend", "nccl", "--tp", "1"]).job(8).unwrap();
        assert!(!p.fp8);
        assert_eq!(p.device_dtype(), DType::BF16);
        for (args, needle) in [
            (
                &["--dtype", "fp8"][..],
                "fp8 GEMMs need a GPU of sm_89 or newer",
            ),
            (
                &[
                    "--backend",
                    "nccl",
                    "--dtype",
                    "fp8",
                    "--tp",
                    "1",
                    "--hidden",
                    "1000",
                    "--heads",
                    "8",
                ][..],
                "hidden 1000 is not a multiple of 16",
            ),
            (
                &[
                    "--backend",
                    "nccl",
                    "--dtype",
                    "fp8",
                    "--tp",
                    "1",
                    "--seq",
                    "7",
                ][..],
                "batch x seq 7",
            ),
        ] {
            let e = cli(args).job(8).unwrap_err().0;
            assert!(e.contains(needle), "{args:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn cp_takes_its_degrees_and_method_and_refuses_what_does_not_split() {
        let p = cli(&["--cp", "1,2,4", "--cp-comm-type", "a2a", "--heads", "4"])
            .job(2)
            .unwrap();
        let cp = p.cp.unwrap();
        assert_eq!((cp.degrees.clone(), p.tps), (vec![1, 2, 4], vec![1, 2, 4]));
        assert_eq!(cp.config.method.name(), "a2a");
        assert_eq!(cp.config.head_dim, 512 / 4);
        assert!(
            cp.config.causal
                && cp.plan
                    == CpPlan {
                        tp: 1,
                        train: false
                    }
        );
        let args = [
            "--cp",
            "1,2",
            "--tp",
            "2",
            "--mode",
            "train",
            "--attn-mask",
            "none",
        ];
        let p = cli(&args).job(2).unwrap();
        let cp = p.cp.unwrap();
        assert_eq!(p.tps, vec![2, 4], "each degree runs on tp x cp ranks");
        assert!(!cp.config.causal && cp.plan == CpPlan { tp: 2, train: true });
        for (args, needle) in [
            (
                &["--cp", "2", "--cp-comm-type", "ring"][..],
                "--cp-comm-type",
            ),
            (&["--cp-comm-type", "p2p"][..], "only with --cp"),
            (&["--cp", "2,x"][..], "--cp"),
            (
                &["--cp", "2", "--tp", "2,4"][..],
                "--tp with --cp: one degree",
            ),
            (
                &["--cp", "2", "--tp", "3"][..],
                "--tp 3 --cp 2: tp 3 does not divide heads",
            ),
            (&["--cp", "2", "--mode", "decode"][..], "--mode decode"),
            (&["--attn-mask", "none"][..], "--attn-mask: only with --cp"),
            (
                &["--cp", "2", "--attn-mask", "sliding"][..],
                "--attn-mask sliding",
            ),
            (&["--cp", "2", "--dtype", "bfloat16"][..], "--dtype"),
        ] {
            let e = cli(args).job(8).unwrap_err().0;
            assert!(e.contains(needle), "{args:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn experts_sweep_the_expert_parallel_degrees() {
        let p = cli(&["--experts", "8", "--topk", "2", "--ep", "1,2,4"])
            .job(2)
            .unwrap();
        let m = p.moe.unwrap();
        assert_eq!((m.experts, m.topk, m.shared, m.ffn), (8, 2, 0, 2048));
        assert_eq!(m.tokens, 128);
        assert_eq!(p.tps, vec![1, 2, 4]);
        let p = cli(&[
            "--experts",
            "4",
            "--expert-ffn",
            "64",
            "--shared-experts",
            "1",
        ])
        .job(8)
        .unwrap();
        assert_eq!(p.tps, vec![1, 2, 4], "8 does not divide 4 experts");
        assert_eq!(p.moe.map(|m| (m.ffn, m.shared)), Some((64, 1)));
        assert!(cli(&[]).job(2).unwrap().moe.is_none());
        // Every --ep at each --etp, in that order; tps holds their ranks.
        let p = cli(&["--experts", "8", "--ep", "1,2", "--etp", "1,2"])
            .job(2)
            .unwrap();
        let got: Vec<(usize, usize)> = p.moe_layouts.iter().map(|l| (l.ep, l.etp)).collect();
        assert_eq!(got, vec![(1, 1), (2, 1), (1, 2), (2, 2)]);
        assert_eq!(p.tps, vec![1, 2, 2, 4]);
        // Without --ep, the degrees whose layouts fit the ranks.
        let p = cli(&["--experts", "8", "--etp", "2"]).job(4).unwrap();
        assert_eq!(p.tps, vec![2, 4]);
        // --tp: an attention before the MoE layer, on the same ranks.
        let args = ["--experts", "8", "--ep", "2", "--tp", "1,2"];
        let p = cli(&[&args[..], &["--microbatch-size", "2"]].concat())
            .job(2)
            .unwrap();
        let got: Vec<usize> = p.moe_layouts.iter().map(|l| l.tp).collect();
        assert_eq!((got, p.tps.clone()), (vec![1, 2], vec![2, 2]));
        assert!(p.moe.unwrap().attention.is_some());
    }

    #[test]
    fn bad_expert_flags_are_one_line_each() {
        for (args, needle) in [
            (&["--experts", "6", "--ep", "4"][..], "--ep 4"),
            (&["--experts", "8", "--topk", "9"][..], "--topk 9"),
            (&["--experts", "0"][..], "--experts 0"),
            (&["--experts", "8", "--topk", "0"][..], "--topk 0"),
            (&["--topk", "2"][..], "--topk needs --experts"),
            (&["--ep", "2"][..], "--ep needs --experts"),
            (&["--etp", "2"][..], "--etp needs --experts"),
            (
                &["--experts", "8", "--expert-ffn", "64", "--etp", "3"][..],
                "--ep 1 --etp 3: invalid block: etp 3 does not divide the expert ffn 64",
            ),
            (&["--experts", "8", "--etp", "0"][..], "--etp"),
            (
                &["--experts", "8", "--seq", "8", "--ep", "4", "--etp", "4"][..],
                "16 ranks",
            ),
            (&["--experts", "8", "--ep", "2,x"][..], "--ep"),
            (&["--experts", "8", "--tp", "3"][..], "--tp 3"),
            (
                &["--experts", "8", "--sequence-parallel"][..],
                "--sequence-parallel",
            ),
            (&["--experts", "8", "--cp", "2"][..], "--cp with --experts"),
            (&["--experts", "8", "--mode", "decode"][..], "--experts"),
            (
                &["--experts", "8", "--seq", "6", "--ep", "4"][..],
                "6 tokens",
            ),
        ] {
            let e = cli(args).job(8).unwrap_err().0;
            assert!(e.contains(needle), "{args:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn flags_override_the_preset() {
        let p = cli(&[
            "--preset",
            "gpt3-1.3b",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--ffn",
            "256",
            "--seq",
            "16",
        ])
        .job(4)
        .unwrap();
        assert_eq!(p.block.shape.hidden, 64);
        assert_eq!(p.block.shape.seq, 16);
        assert_eq!(p.preset, "custom");
        let l: LinkParams = "400,2.5".parse().unwrap();
        assert!((l.bandwidth_gbps() - 400.0).abs() < 1e-9);
    }
}
