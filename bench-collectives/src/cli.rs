//! Command line: nccl-tests' flags with their meanings, plus parbench's
//! backend, algorithm, deadline, output folder and straggler injection.

use crate::config::{NcclTestsFlags, SweepConfig};
use crate::nccl_flags::other_flag_help;
use anyhow::{anyhow, bail, Result};
use clap::Parser;
use parbench::comm::{Algo, Collective, DType, ReduceOp};
use parbench::launch::flags;
use parbench::vocab;
use std::path::PathBuf;
use std::time::Duration;

/// Sweeps collectives over message sizes and prints nccl-tests' table, plus
/// per-iteration percentiles, the alpha-beta model's prediction, and busbw as
/// a share of the wire's ceiling measured in the same run.
#[derive(Parser, Debug, Clone)]
// A flag given twice: the last one wins, as in nccl-tests (getopt). A
// negative number is taken as a flag's value, so that its own check
// names the flag ("-n -5" is not "unexpected argument '-5'"). -V is
// nccl-tests' CTA count, so the version is --version alone.
#[command(
    name = "bench-collectives",
    version,
    about,
    allow_negative_numbers = true,
    args_override_self = true,
    disable_version_flag = true
)]
pub struct Args {
    /// Print the version.
    #[arg(long, action = clap::ArgAction::Version)]
    pub version: Option<bool>,
    #[arg(value_name = "COLLECTIVE", help = collectives_help(), default_values_t = ["all_reduce".to_string(), "all_gather".to_string()])]
    pub collectives: Vec<String>,

    /// Smallest size in bytes (K, M, G: binary suffixes).
    #[arg(
        help_heading = "Sizes",
        short = 'b',
        long = "min-bytes",
        alias = "minbytes",
        default_value = "8"
    )]
    pub min_bytes: String,
    /// Largest size in bytes (K, M, G: binary suffixes).
    #[arg(
        help_heading = "Sizes",
        short = 'e',
        long = "max-bytes",
        alias = "maxbytes",
        default_value = "64M"
    )]
    pub max_bytes: String,
    /// Multiply the size by this factor at each step.
    /// nccl-tests' reading: a factor of 1 (or 0) steps by -i bytes instead
    /// (1M when -i is not given), and a factor above 1 wins over -i.
    #[arg(
        help_heading = "Sizes",
        short = 'f',
        long = "step-factor",
        alias = "stepfactor"
    )]
    pub step_factor: Option<u64>,
    /// Add this many bytes at each step instead (K, M, G suffixes).
    #[arg(
        help_heading = "Sizes",
        short = 'i',
        long = "step-bytes",
        alias = "stepbytes"
    )]
    pub step_bytes: Option<String>,
    /// Smallest size the fits after the sweep use (K, M, G suffixes): the
    /// fits' window, from this size to the largest swept.
    #[arg(
        help_heading = "Sizes",
        long = "fit-from",
        value_name = "SIZE",
        default_value = "1M"
    )]
    pub fit_from: String,

    #[arg(help_heading = "Measurement", short = 'n', long = vocab::iters::LONG, value_name = vocab::iters::VALUE, help = vocab::iters::HELP, default_value_t = 20)]
    pub iters: usize,
    #[arg(help_heading = "Measurement", 
        short = 'w',
        long = vocab::warmup::LONG,
        alias = "warmup_iters",
        value_name = vocab::warmup::VALUE,
        help = vocab::warmup::HELP,
        default_value_t = 5
    )]
    pub warmup: usize,
    /// Check iterations after the timed loop (0 = no check).
    #[arg(
        help_heading = "Measurement",
        short = 'c',
        long = "check",
        value_name = "N",
        default_value_t = 1
    )]
    pub check: usize,
    /// Skip the correctness check (as -c 0).
    #[arg(help_heading = "Measurement", long = vocab::no_check::LONG)]
    pub no_check: bool,
    #[arg(help_heading = "Measurement", short = 'o', long = "op", default_value = "sum", help = op_help())]
    pub op: String,
    #[arg(help_heading = "Measurement", 
        help = format!("Element type {}, or all", vocab::one_of(DType::ALL.map(DType::name))),
        short = 'd',
        long = vocab::dtype::LONG,
        alias = "datatype",
        value_name = vocab::dtype::VALUE,
        default_value = "float"
    )]
    pub dtype: String,
    /// Root rank of broadcast and reduce; -1: every rank in turn.
    #[arg(
        help_heading = "Measurement",
        short = 'r',
        long = "root",
        default_value_t = 0
    )]
    pub root: i64,
    /// How per-rank times combine: 0 rank 0, 1 mean, 2 min, 3 max.
    #[arg(
        help_heading = "Measurement",
        short = 'a',
        long = "average",
        default_value_t = 1
    )]
    pub average: u8,
    /// Measure in-place only.
    #[arg(
        help_heading = "Measurement",
        long = "inplace-only",
        conflicts_with = "outplace_only"
    )]
    pub inplace_only: bool,
    /// Measure out-of-place only.
    #[arg(help_heading = "Measurement", long = "outplace-only")]
    pub outplace_only: bool,
    /// Operations aggregated per timed iteration (nccl-tests' -m): parbench
    /// times one operation per iteration, so only 1 is accepted.
    #[arg(
        help_heading = "Measurement",
        short = 'm',
        long = "agg-iters",
        alias = "agg_iters",
        value_name = "N",
        default_value_t = 1
    )]
    pub agg_iters: usize,
    /// Blocking collectives (nccl-tests' -z): 0 the backend's own way, 1 wait
    /// for each operation before the next (the CPU backends always do).
    #[arg(
        help_heading = "Measurement",
        short = 'z',
        long = "blocking",
        value_name = "0|1",
        default_value_t = 0
    )]
    pub blocking: u8,
    /// Run each table's sizes this many times, in one table (nccl-tests'
    /// -N; 0 runs until interrupted).
    #[arg(
        help_heading = "Measurement",
        short = 'N',
        long = "run-cycles",
        alias = "run_cycles",
        value_name = "N",
        default_value_t = 1
    )]
    pub run_cycles: usize,
    /// Capture N calls as one CUDA graph and time its replays (nccl-tests'
    /// -G; --backend nccl only): the time per call without the host's launch cost.
    #[arg(
        help_heading = "Measurement",
        short = 'G',
        long,
        alias = "cudagraph",
        value_name = "N"
    )]
    pub graph: Option<usize>,
    #[arg(help_heading = "Measurement", long = vocab::straggler::LONG, value_name = vocab::straggler::VALUE, help = vocab::straggler::HELP)]
    pub straggler: Option<String>,

    #[arg(help_heading = "Ranks", long = vocab::backend::LONG, value_name = vocab::backend::VALUE, help = vocab::backend::HELP, default_value = "auto")]
    pub backend: String,
    // Default: the CPU cores, at least 2.
    #[arg(help_heading = "Ranks", long = vocab::nprocs::LONG, visible_alias = "np", value_name = vocab::nprocs::VALUE, help = vocab::nprocs::HELP)]
    pub nprocs: Option<usize>,
    #[arg(help_heading = "Ranks", long, default_value = "auto", help = format!("Algorithm of the CPU backends {}", vocab::one_of(Algo::ALL.map(Algo::name))))]
    pub algo: String,
    /// GPUs driven by this process (nccl-tests' -g; --backend nccl only):
    /// the ranks of a run without a launcher.
    #[arg(help_heading = "Ranks", short = 'g', long = "ngpus", value_name = "N")]
    pub ngpus: Option<usize>,
    /// Threads per process (nccl-tests' -t): 1, one rank per thread
    /// (--backend local runs its ranks as threads: -np N).
    #[arg(
        help_heading = "Ranks",
        short = 't',
        long = "nthreads",
        value_name = "N"
    )]
    pub nthreads: Option<i64>,
    #[arg(help_heading = "Ranks", short = 'T', long = vocab::timeout::LONG, value_name = vocab::timeout::VALUE, help = vocab::timeout::HELP, default_value_t = 60.0)]
    pub timeout: f64,

    #[arg(help_heading = "Output", long = vocab::out::LONG, value_name = vocab::out::VALUE, help = vocab::out::HELP, default_value = "results")]
    pub out: PathBuf,
    /// Table layout: parbench (default: nccl-tests' columns plus the
    /// share of the wire's ceiling) or nccl-tests (exactly its
    /// columns and footers, for scripts written for nccl-tests).
    #[arg(
        help_heading = "Output",
        long,
        value_name = "FORMAT",
        default_value = "parbench"
    )]
    pub format: String,
    /// Also print each row's p50 and p99, the model's time and the
    /// algorithm, and the model's and placement's lines in the header.
    #[arg(
        help_heading = "Output",
        short = 'v',
        long = "verbose",
        visible_alias = "columns"
    )]
    pub verbose: bool,
    /// Also write the results as nccl-tests' -J JSON (its field names and
    /// layout, parbench's extras beside them) to FILE.
    #[arg(help_heading = "Output", 
        short = 'J',
        long = vocab::output_file::LONG,
        alias = "output_file",
        value_name = vocab::output_file::VALUE
    )]
    pub json_file: Option<PathBuf>,
    /// nccl-tests' per-iteration timing: 1 adds its per-iteration columns
    /// to --format nccl-tests (parbench's layout has p50 and p99 already).
    #[arg(
        help_heading = "Output",
        short = 'I',
        long = "per_iter_timing",
        value_name = "0|1"
    )]
    pub per_iter_timing: Option<String>,

    /// Tokens per rank of the `moe` pattern (T).
    #[arg(help_heading = "MoE (`moe`)", long, value_name = "T")]
    pub tokens: Option<usize>,
    /// Hidden size of the `moe` pattern (H, channels per token).
    #[arg(help_heading = "MoE (`moe`)", long, value_name = "H")]
    pub hidden: Option<usize>,
    #[arg(help_heading = "MoE (`moe`)", long = vocab::experts::LONG, value_name = vocab::experts::VALUE, help = vocab::experts::HELP)]
    pub experts: Option<usize>,
    #[arg(help_heading = "MoE (`moe`)", long = vocab::topk::LONG, value_name = vocab::topk::VALUE, help = vocab::topk::HELP)]
    pub topk: Option<usize>,
    /// Expert popularity: uniform, or zipf:S (the expert of popularity
    /// rank i drawn with weight 1/(i+1)^S).
    #[arg(help_heading = "MoE (`moe`)", long, value_name = "uniform|zipf:S")]
    pub routing: Option<String>,
    /// DeepSeek-V3's node-limited routing: each token's experts on at most
    /// M ranks (a rank's experts are one group).
    #[arg(help_heading = "MoE (`moe`)", long, value_name = "M")]
    pub node_limit: Option<usize>,
    /// Megatron-Core's token dropping: each expert takes at most
    /// ceil(T x k / E x CF) tokens of each rank (default: none dropped).
    #[arg(help_heading = "MoE (`moe`)", long, value_name = "CF")]
    pub capacity_factor: Option<f64>,
    /// Dispatched payload: bf16, or fp8 (E4M3, one f32 scale per 128
    /// channels, as DeepEP's dispatch); combine is bf16.
    #[arg(help_heading = "MoE (`moe`)", long, value_name = "bf16|fp8")]
    pub payload: Option<String>,
    /// Copies of a token: dedup (one per destination rank, DeepEP's normal
    /// kernels) or k (one per expert, its low-latency kernels).
    #[arg(help_heading = "MoE (`moe`)", long, value_name = "dedup|k")]
    pub copies: Option<String>,

    /// The compute stand-in beside each step of the `cp-ring` pattern, us
    /// of a busy loop calibrated on each rank's core; auto (the default):
    /// as long as that size's exchange step alone.
    #[arg(help_heading = "CP ring (`cp-ring`)", long, value_name = "US|auto")]
    pub compute_us: Option<String>,

    // nccl-tests' flags with no counterpart here, accepted at the value
    // that asks for nothing and otherwise refused in one line that says
    // what they do in nccl-tests (nccl_flags::OTHER_FLAGS, which words
    // their help too).
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'C', long = "report_cputime", value_name = "0|1", help = other_flag_help("-C"))]
    pub report_cputime: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'S', long = "report_timestamps", value_name = "0|1", help = other_flag_help("-S"))]
    pub report_timestamps: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'R', long = "local_register", value_name = "0|1|2", help = other_flag_help("-R"))]
    pub local_register: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'M', long = "memory", value_name = "0|1", help = other_flag_help("-M"))]
    pub memory: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'u', long = "unalign", value_name = "N", help = other_flag_help("-u"))]
    pub unalign: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'p', long = "parallel_init", value_name = "0|1", help = other_flag_help("-p"))]
    pub parallel_init: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'y', long = "stream_null", value_name = "0|1", help = other_flag_help("-y"))]
    pub stream_null: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'x', long = "cta_policy", value_name = "N", help = other_flag_help("-x"))]
    pub cta_policy: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'D', long = "device_implementation", value_name = "N", help = other_flag_help("-D"))]
    pub device_implementation: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'V', long = "device_cta_count", value_name = "N", help = other_flag_help("-V"))]
    pub device_cta_count: Option<String>,
    #[arg(help_heading = "nccl-tests' flags without a counterpart", short = 'K', long = "per_iter_skip", value_name = "N", help = other_flag_help("-K"))]
    pub per_iter_skip: Option<String>,
}

/// The positional argument's help, listing the collectives the library has.
fn collectives_help() -> String {
    format!(
        "Collectives to run {}, or all; or `links` alone: every ordered pair of ranks, one at a time (latency, one-way and both-way bandwidth); or `moe` alone: an MoE layer's dispatch and combine (the MoE flags); or `cp-ring` alone: context parallelism's ring of sendrecv steps beside compute, per size",
        vocab::one_of(Collective::ALL.map(Collective::name))
    )
}

/// `-o`'s help, listing the operators the library has.
fn op_help() -> String {
    format!(
        "Reduction operator {}, or all; mulsum is NCCL's PreMulSum with nccl-tests' scalar: 1 on even ranks, 2 on odd",
        vocab::one_of(ReduceOp::ALL.map(ReduceOp::name))
    )
}

/// Parses a command line in today's spellings (`-np N` and the last
/// release's spellings rewritten first, [`vocab::rewrite`]); the notices
/// of the old spellings it met come back beside it, for `main` to print.
pub fn parse_command_line<I, S>(argv: I) -> (Result<Args, clap::Error>, Vec<String>)
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString>,
{
    let (argv, notices) = vocab::rewrite::modernize(vocab::Tool::Collectives, argv);
    (Args::try_parse_from(argv), notices)
}

/// [`parse_command_line`] without its notices (the tests' way in).
#[cfg(test)]
pub fn parse_args<I, S>(argv: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString>,
{
    parse_command_line(argv).0
}

/// The backend chosen on the command line: `auto`, or one of the library's.
pub use parbench::launch::flags::Backend;

/// `--backend`'s value, with the one line that lists what it takes.
pub(crate) fn parse_backend(s: &str) -> Result<Backend> {
    s.parse::<Backend>().map_err(|_| {
        anyhow!(
            "unknown backend '{}' (expected auto, local, tcp, nccl or mpi)",
            s.to_ascii_lowercase()
        )
    })
}

/// The parsed command line: backend, ranks, algorithm, and the sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepJob {
    pub backend: Backend,
    pub nprocs: Option<usize>,
    pub algo: Algo,
    pub out: PathBuf,
    pub sweep: SweepConfig,
    /// nccl-tests' flags beyond the sweep, and the output layouts.
    pub nccl_tests: NcclTestsFlags,
    /// `bench-collectives links`: the pair matrix instead of the sweep.
    pub links: bool,
    /// `bench-collectives moe`: an MoE layer's exchange instead of the sweep.
    pub moe: Option<parbench::comm::moe::MoeShape>,
    /// `bench-collectives cp-ring`: the CP ring's steps beside compute, per size.
    pub cp_ring: Option<crate::cp_ring::StandIn>,
    /// `-v`: the table's extra columns.
    pub verbose: bool,
}

/// Most sizes a sweep may have: a typo in `-i` must not start a million-row run.
pub const MAX_SIZES: usize = 10_000;
/// Parses `8`, `64K`, `1M`, `2G` (the library's [`flags::ByteSize`]),
/// and nccl-tests' decimal sizes (`1.5K` is 1536, the bytes rounded down).
pub fn parse_size(s: &str) -> Result<u64> {
    s.parse::<flags::ByteSize>()
        .map(|b| b.0)
        .or_else(|e| decimal_size(s).ok_or(e))
        .map_err(|e| anyhow!(e))
}

/// nccl-tests' `parsesize`: a number, then at most one of K, M, G.
fn decimal_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let (num, unit) = match t.chars().last()?.to_ascii_lowercase() {
        'k' => (&t[..t.len() - 1], 1u64 << 10),
        'm' => (&t[..t.len() - 1], 1 << 20),
        'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let x: f64 = num.trim().parse().ok()?;
    let bytes = x * unit as f64;
    // Whole through ByteSize's bound: the largest size parbench takes.
    (x.is_finite() && x >= 0.0 && !num.contains(['e', 'E', 'i', 'n', 'I', 'N']))
        .then(|| bytes.floor() as u64)
        .filter(|&b| format!("{b}").parse::<flags::ByteSize>().is_ok())
}

/// nccl-tests' size steps from `min` to `max` inclusive: times `factor`, or plus `step`.
pub fn size_steps(min: u64, max: u64, factor: Option<u64>, step: Option<u64>) -> Result<Vec<u64>> {
    if min > max {
        bail!("--min-bytes {min} is larger than --max-bytes {max}");
    }
    let mut sizes = vec![min];
    let mut s = min;
    loop {
        let next = match (factor, step) {
            (_, Some(0)) => bail!("--step-bytes 0: at least 1"),
            (_, Some(i)) => s.checked_add(i),
            (Some(f), None) if f < 2 => bail!("--step-factor must be at least 2"),
            (f, None) => s.checked_mul(f.unwrap_or(2)),
        };
        // A zero minimum would never grow by a factor: step to 1 first.
        let next = match next {
            Some(0) => Some(1),
            other => other,
        };
        match next {
            Some(n) if n <= max && n > s => {
                sizes.push(n);
                s = n;
            }
            _ => break,
        }
        if sizes.len() > MAX_SIZES {
            bail!("the size steps give more than {MAX_SIZES} sizes; use a larger -f or -i");
        }
    }
    Ok(sizes)
}

pub fn parse_list<T>(s: &str, all: &[T], what: &str) -> Result<Vec<T>>
where
    T: std::str::FromStr<Err = String> + Copy + PartialEq,
{
    let mut out = Vec::new();
    for part in s.split(',') {
        if part.trim().eq_ignore_ascii_case("all") {
            return Ok(all.to_vec());
        }
        let v: T = part
            .trim()
            .parse()
            .map_err(|e: String| anyhow!("--{what}: {e}"))?;
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

/// Parses `RANK:MS`.
pub fn parse_straggler(s: &str) -> Result<(usize, Duration)> {
    let st: flags::Straggler = s.parse().map_err(|e| anyhow!("--straggler {e}"))?;
    Ok((st.rank, st.delay))
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
    use crate::config::Step;
    use parbench::comm::{Collective, DType, ReduceOp};
    use parbench::measure::Average;

    fn job(args: &[&str]) -> Result<SweepJob> {
        let mut v = vec!["bench-collectives"];
        v.extend_from_slice(args);
        parse_args(v)?.job()
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 65_536);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("16B").unwrap(), 16);
        // nccl-tests' decimal sizes.
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("0.5m").unwrap(), 1 << 19);
        for bad in [
            "",
            "K",
            "-1",
            "12X",
            "99999999999999G",
            "1e3",
            "nan",
            "inf",
            "1.5T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn steps_follow_nccl_tests() {
        assert_eq!(size_steps(8, 64, None, None).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(size_steps(8, 100, Some(4), None).unwrap(), vec![8, 32]);
        assert_eq!(size_steps(8, 30, None, Some(10)).unwrap(), vec![8, 18, 28]);
        assert_eq!(size_steps(0, 4, None, None).unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(size_steps(5, 5, None, None).unwrap(), vec![5]);
        assert!(size_steps(9, 8, None, None).is_err());
        assert!(size_steps(8, 16, Some(1), None).is_err());
        // nccl-tests' -f 1 steps by -i (1M unless given); a factor above 1 wins.
        let p = job(&["-b", "1M", "-e", "3M", "-f", "1"]).unwrap();
        assert_eq!(p.sweep.sizes, vec![1 << 20, 2 << 20, 3 << 20]);
        assert_eq!(p.nccl_tests.step, Step::Bytes(1 << 20));
        let p = job(&["-b", "8", "-e", "64", "-f", "4", "-i", "8"]).unwrap();
        assert_eq!(p.sweep.sizes, vec![8, 32]);
        assert_eq!(p.nccl_tests.step, Step::Factor(4));
        assert_eq!((p.nccl_tests.min_bytes, p.nccl_tests.max_bytes), (8, 64));
        assert!(size_steps(0, 1 << 40, None, Some(1)).is_err());
    }

    #[test]
    fn defaults_run_all_reduce_and_all_gather() {
        let p = job(&[]).unwrap();
        assert_eq!(
            p.sweep.collectives,
            vec![Collective::AllReduce, Collective::AllGather]
        );
        assert_eq!(p.backend, Backend::Auto);
        assert_eq!(p.sweep.dtypes, vec![DType::F32]);
        assert_eq!(p.sweep.ops, vec![ReduceOp::Sum]);
        assert_eq!(p.sweep.average, Average::Mean);
        assert!(p.sweep.in_place && p.sweep.out_of_place);
        assert_eq!(p.sweep.sizes.first(), Some(&8));
        assert_eq!(p.sweep.sizes.last(), Some(&(64 << 20)));
    }

    #[test]
    fn parses_nccl_tests_flags() {
        let p = job(&[
            "all",
            "--backend",
            "tcp",
            "-np",
            "3",
            "--algo",
            "ring",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "7",
            "-w",
            "2",
            "-c",
            "3",
            "-o",
            "all",
            "-d",
            "half,int32",
            "-r",
            "2",
            "-a",
            "3",
            "--outplace-only",
            "--timeout",
            "5",
            "--out",
            "x",
            "--straggler",
            "1:2.5",
        ])
        .unwrap();
        assert_eq!(p.sweep.collectives.len(), 8);
        assert_eq!(p.backend, Backend::Tcp);
        assert_eq!(p.nprocs, Some(3));
        assert_eq!(p.algo, Algo::Ring);
        assert_eq!(
            p.sweep.sizes,
            vec![1024, 4096, 16384, 65536, 262144, 1 << 20]
        );
        assert_eq!((p.sweep.iters, p.sweep.warmup, p.sweep.check), (7, 2, 3));
        assert_eq!(p.sweep.ops.len(), 6);
        assert_eq!(p.sweep.dtypes, vec![DType::F16, DType::I32]);
        // nccl-tests' layout runs `-d all` in nccl-tests' order.
        let all = job(&["-d", "all", "--format", "nccl-tests"]).unwrap();
        let names: Vec<&str> = all.sweep.dtypes.iter().map(|d| d.name()).collect();
        assert_eq!(
            names,
            [
                "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
                "bfloat16", "f8e4m3", "f8e5m2"
            ]
        );
        assert!(all.sweep.dtypes_all && !p.sweep.dtypes_all);
        let ops = job(&["-o", "all"]).unwrap();
        let names: Vec<&str> = ops.sweep.ops.iter().map(|o| o.name()).collect();
        assert_eq!(names, ["sum", "prod", "max", "min", "avg", "mulsum"]);
        assert_eq!((p.sweep.root, p.sweep.average), (Some(2), Average::Max));
        assert!(!p.sweep.in_place && p.sweep.out_of_place);
        assert_eq!(p.sweep.timeout, Duration::from_secs(5));
        assert_eq!(p.out, PathBuf::from("x"));
        assert_eq!(p.sweep.straggler, Some((1, Duration::from_micros(2500))));
        assert!(p.sweep.check_world(3).is_ok());
        assert!(p.sweep.check_world(2).is_err(), "root 2 of 2 ranks");
        let p = job(&["-np=4", "-i", "1K", "-b", "0", "-e", "2K"]).unwrap();
        assert_eq!(p.nprocs, Some(4));
        assert_eq!(p.sweep.sizes, vec![0, 1024, 2048]);
    }

    #[test]
    fn help_lists_the_registries_and_stays_in_this_binary() {
        use clap::CommandFactory;
        let cmd = Args::command();
        let collectives = Collective::ALL.map(Collective::name);
        help_check::assert_lists(&cmd, None, "collectives", collectives);
        help_check::assert_lists(&cmd, None, "algo", Algo::ALL.map(Algo::name));
        help_check::assert_lists(&cmd, None, "op", ReduceOp::ALL.map(ReduceOp::name));
        help_check::assert_lists(&cmd, None, "dtype", DType::ALL.map(DType::name));
        help_check::assert_plain_help(cmd, &["bench-layers", "bench-pipeline"]);
    }

    #[test]
    fn flags_are_the_shared_vocabulary() {
        use clap::CommandFactory;
        vocab_check::assert_shared_vocabulary(vocab::Tool::Collectives, Args::command());
        // --no-check is -c 0; -T 0 the longest deadline, as in nccl-tests.
        assert_eq!(job(&["--no-check", "-c", "3"]).unwrap().sweep.check, 0);
        let longest = Duration::from_secs_f64(parbench::limits::MAX_TIMEOUT_S);
        assert_eq!(job(&["-T", "0"]).unwrap().sweep.timeout, longest);
        // Another spelling of a type is read, with a notice naming nccl-tests'.
        let (args, notices) = parse_command_line(["b", "-d", "fp16"]);
        assert_eq!(args.unwrap().job().unwrap().sweep.dtypes, vec![DType::F16]);
        assert!(notices[0].contains("-d fp16 is now -d half"), "{notices:?}");
    }

    #[test]
    fn rejects_bad_flags() {
        for bad in [
            &["all_scatter"][..],
            &["--backend", "gloo"],
            &["--algo", "bruck"],
            &["-b", "1Q"],
            &["-o", "xor"],
            &["-d", "complex"],
            &["-a", "4"],
            &["-n", "0"],
            &["--inplace-only", "--outplace-only"],
            &["--timeout", "-1"],
            &["-r", "-2"],
            &["--straggler", "1"],
            &["--straggler", "x:3"],
            &["-np", "0"],
        ] {
            assert!(job(bad).is_err(), "{bad:?}");
        }
        let p = job(&["--straggler", "5:1"]).unwrap();
        assert!(p.sweep.check_world(4).is_err());
    }
}
