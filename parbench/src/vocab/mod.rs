//! The flag vocabulary every binary shares: one spelling, one value syntax
//! and one help text per concept, defined here once and used by each
//! binary's clap definitions (`long = vocab::iters::LONG`, ...), so that
//! `-n` cannot mean iterations in one tool and steps in another.
//!
//! Three parts:
//! - the flags (one module of constants per concept, and [`SHARED`], the
//!   table the checks read);
//! - [`rewrite`]: the spellings of the last release, still accepted for
//!   one more, rewritten to today's with a one-line notice each;
//! - [`check`]: a binary's definitions held to the table (its tests run
//!   it over every argument clap knows, so a second spelling or a second
//!   value syntax of a shared concept fails a test).
//!
//! The library still parses no command line: the binaries do, through
//! clap; what lives here is the vocabulary they share.

pub mod check;
pub mod rewrite;

/// A binary of the suite (the `report` subcommands are scopes of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Collectives,
    Layers,
    Pipeline,
    Report,
}

impl Tool {
    /// Its name on the command line and at the start of its notices.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Collectives => "bench-collectives",
            Tool::Layers => "bench-layers",
            Tool::Pipeline => "bench-pipeline",
            Tool::Report => "report",
        }
    }
}

/// One shared concept as the table holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag {
    /// The concept in a few words (docs/usage.md's table of shared flags).
    pub concept: &'static str,
    pub long: &'static str,
    /// Its short letter, where it has one: nccl-tests' letter of the same
    /// meaning, or one nccl-tests does not use (`-v`).
    pub short: Option<char>,
    /// The value's syntax as help prints it; `None` for a switch.
    pub value: Option<&'static str>,
    /// For a list syntax (`T[,T...]`): the syntax in a tool that takes
    /// one value (`T`), so that its help does not advertise a list.
    pub one: Option<&'static str>,
}

/// Defines one concept's constants and its [`Flag`].
macro_rules! flag {
    ($m:ident, $concept:literal, long $long:literal, short $short:expr, value $value:expr, help $help:literal) => {
        flag!($m, $concept, long $long, short $short, value $value, one None, help $help);
    };
    ($m:ident, $concept:literal, long $long:literal, short $short:expr, value $value:expr, one $one:expr, help $help:literal) => {
        #[doc = $concept]
        pub mod $m {
            pub const LONG: &str = $long;
            pub const HELP: &str = $help;
            /// The value's syntax; empty for a switch.
            pub const VALUE: &str = match $value {
                Some(v) => v,
                None => "",
            };
            /// The syntax of one value, where the shared one is a list.
            pub const ONE: &str = match $one {
                Some(v) => v,
                None => VALUE,
            };
            pub const FLAG: super::Flag = super::Flag {
                concept: $concept,
                long: $long,
                short: $short,
                value: $value,
                one: $one,
            };
        }
    };
}

flag!(iters, "timed iterations of each measurement (a size, a degree, a pipeline step)",
    long "iters", short Some('n'), value Some("N"),
    help "Timed iterations of each measurement (nccl-tests' -n)");
flag!(warmup, "untimed warm-up iterations before timing",
    long "warmup", short Some('w'), value Some("N"),
    help "Untimed warm-up iterations before timing (nccl-tests' -w)");
flag!(nprocs, "ranks to run (spawned on this host, or threads)",
    long "nprocs", short None, value Some("N"),
    help "Ranks to run: threads (--backend local) or processes spawned on this host (tcp); `-np N` as in mpirun and nccl-tests");
flag!(timeout, "deadline of every wait, seconds",
    long "timeout", short Some('T'), value Some("SECS"),
    help "Deadline of every wait, in seconds: a dead or hung rank becomes an error naming it; 0: the longest, a day (nccl-tests' -T 0)");
flag!(backend, "the communicator",
    long "backend", short None, value Some("NAME"),
    help "Communicator: auto (tcp under a launcher: torchrun, mpirun, srun, a spawning parent; local otherwise), local (threads, shared memory), tcp (processes, sockets), nccl (GPUs; --features cuda), mpi (under mpirun; --features mpi)");
flag!(out, "results folder (CSV rows and run.json appended)",
    long "out", short None, value Some("DIR"),
    help "Results folder: the suite's CSV and run.json are appended to it, never overwritten");
flag!(output_file, "the one file a command writes",
    long "output-file", short None, value Some("FILE"),
    help "File to write (atomically; an existing one of the same kind is replaced)");
flag!(dtype, "element type, nccl-tests' names",
    long "dtype", short Some('d'), value Some("TYPE"),
    help "Element type, nccl-tests' names: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2 (each tool runs those it has kernels for)");
flag!(straggler, "one rank late before each timed iteration",
    long "straggler", short None, value Some("RANK:MS"),
    help "Delay rank RANK by MS milliseconds before each timed iteration (it arrives late at every collective)");
flag!(slow_rank, "one rank slower at every action",
    long "slow-rank", short None, value Some("RANK:MS"),
    help "Slow rank RANK down: MS milliseconds added to each of its actions (a slower device)");
flag!(tp, "tensor-parallel degree(s)",
    long "tp", short None, value Some("T[,T...]"), one Some("T"),
    help "Tensor-parallel degrees, comma-separated");
flag!(stages, "pipeline stage ranks",
    long "stages", short None, value Some("S[,S...]"), one Some("S"),
    help "Pipeline stage ranks, comma-separated");
flag!(microbatches, "microbatches per step (a sweep)",
    long "microbatches", short None, value Some("M[,M...]"),
    help "Microbatches per step M, comma-separated (a sweep)");
flag!(microbatch_size, "sequences (rows) in one microbatch",
    long "microbatch-size", short None, value Some("B"),
    help "Sequences in one microbatch b (Megatron's --micro-batch-size)");
flag!(chunks, "stages per rank of the interleaved schedule",
    long "chunks", short None, value Some("V"),
    help "Stages per rank v of the interleaved schedule");
flag!(schedule, "pipeline schedules by name",
    long "schedule", short None, value Some("NAME[,NAME...]"),
    help "Pipeline schedules by their registry names, comma-separated");
flag!(shard, "data-parallel sharding modes (ZeRO)",
    long "shard", short None, value Some("MODE[,MODE...]"), one Some("MODE"),
    help "Data-parallel sharding modes, comma-separated: none, zero1, zero2, zero3");
flag!(mode, "which passes a step runs",
    long "mode", short None, value Some("MODE"),
    help "Which passes a step runs: prefill (forward over --seq tokens), decode (one new token per sequence against a KV cache of --seq tokens) or train (forward and backward)");
flag!(no_check, "skip the correctness check",
    long "no-check", short None, value None,
    help "Skip the correctness check");
flag!(verbose, "more on the screen (the first screen is the answer)",
    long "verbose", short Some('v'), value None,
    help "More on the screen: the detail behind the answer");
flag!(link, "a wire given by hand",
    long "link", short None, value Some("GBPS,US"),
    help "The wire as GBPS,US (bandwidth in GB/s, latency in microseconds), instead of the one measured");
flag!(intra, "the wire inside a node",
    long "intra", short None, value Some("GBPS,US"),
    help "The wire inside a node as GBPS,US (bandwidth in GB/s, latency in microseconds)");
flag!(inter, "the wire between nodes",
    long "inter", short None, value Some("GBPS,US"),
    help "The wire between nodes as GBPS,US (bandwidth in GB/s, latency in microseconds)");
flag!(distributed_optimizer, "optimizer state sharded over data-parallel ranks (reduce-scatter)",
    long "distributed-optimizer", short None, value None,
    help "Megatron's distributed optimizer: gradients reduce-scattered and the optimizer state sharded over the data-parallel ranks");
flag!(against, "hold the planner to measured composed runs",
    long "against", short None, value Some("DIR"),
    help "Instead of a search: each composed dp x tp x pp run in this results folder (bench-pipeline --dp/--tp) costed from the run's own calibration, beside the measurement term by term; writes DIR/plan-check.csv");
flag!(experts, "routed experts of a mixture-of-experts layer",
    long "experts", short None, value Some("E"),
    help "Routed experts of each mixture-of-experts layer (E)");
flag!(topk, "experts each token is routed to",
    long "topk", short None, value Some("K"),
    help "Experts each token is routed to (top-k)");
flag!(expert_ffn, "one routed expert's MLP width",
    long "expert-ffn", short None, value Some("F"),
    help "Inner width of one routed expert's gated MLP (F)");
flag!(shared_experts, "experts every token also runs",
    long "shared-experts", short None, value Some("S"),
    help "Shared experts, each of --expert-ffn, that every token passes through besides its routed ones");
flag!(cp_comm_type, "how context parallelism moves keys and values",
    long "cp-comm-type", short None, value Some("METHOD"),
    help "How context parallelism exchanges keys and values: p2p (a ring overlapped with the attention), all_gather, or a2a (DeepSpeed-Ulysses)");

/// Every shared concept; docs/usage.md's table lists each (tests/doc_vocab.rs).
pub const SHARED: &[Flag] = &[
    iters::FLAG,
    warmup::FLAG,
    nprocs::FLAG,
    timeout::FLAG,
    backend::FLAG,
    out::FLAG,
    output_file::FLAG,
    dtype::FLAG,
    straggler::FLAG,
    slow_rank::FLAG,
    tp::FLAG,
    stages::FLAG,
    microbatches::FLAG,
    microbatch_size::FLAG,
    chunks::FLAG,
    schedule::FLAG,
    shard::FLAG,
    mode::FLAG,
    no_check::FLAG,
    verbose::FLAG,
    link::FLAG,
    intra::FLAG,
    inter::FLAG,
    distributed_optimizer::FLAG,
    against::FLAG,
    experts::FLAG,
    topk::FLAG,
    expert_ffn::FLAG,
    shared_experts::FLAG,
    cp_comm_type::FLAG,
];

/// nccl-tests' short letters and their long names (`src/common.cu`'s
/// options). bench-collectives keeps every one with nccl-tests' meaning;
/// another tool may use one only for the shared concept of the same
/// meaning (`-n`, `-w`, `-d`, `-T`), never for something else (`report
/// html -o` was the output file where nccl-tests' `-o` is the operator).
pub const NCCL_TESTS_SHORTS: &[(char, &str)] = &[
    ('t', "nthreads"),
    ('g', "ngpus"),
    ('b', "minbytes"),
    ('e', "maxbytes"),
    ('i', "stepbytes"),
    ('f', "stepfactor"),
    ('n', "iters"),
    ('m', "agg_iters"),
    ('w', "warmup_iters"),
    ('N', "run_cycles"),
    ('p', "parallel_init"),
    ('c', "check"),
    ('o', "op"),
    ('d', "datatype"),
    ('r', "root"),
    ('z', "blocking"),
    ('y', "stream_null"),
    ('T', "timeout"),
    ('G', "cudagraph"),
    ('C', "report_cputime"),
    ('S', "report_timestamps"),
    ('J', "output_file"),
    ('a', "average"),
    ('R', "local_register"),
    ('x', "cta_policy"),
    ('D', "device_implementation"),
    ('V', "device_cta_count"),
    ('u', "unalign"),
    ('M', "memory"),
    ('I', "per_iter_timing"),
    ('K', "per_iter_skip"),
];

/// The value of a flag whose shared syntax is a comma list (`--tp`,
/// `--stages`) in a tool that runs one value: the list of one, or one line
/// saying that this tool takes one (clap's value parser).
pub fn one_count<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    if s.contains(',') {
        return Err(format!("'{s}': this flag takes one value, not a list"));
    }
    s.trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number"))
}

/// A registry's names as a help text lists them for a flag of one value:
/// `(one of: a, b, c)`. Built at run time from the registry, so that help
/// cannot fall behind it; the help tests read the list back
/// ([`listed_names`]).
pub fn one_of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    format!("(one of: {})", join_names(names))
}

/// As [`one_of`], for a flag that takes a comma list: `(any of: a, b)`.
pub fn any_of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    format!("(any of: {})", join_names(names))
}

fn join_names<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    names
        .into_iter()
        .map(|n| n.as_ref().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names a help text lists with [`one_of`] or [`any_of`], in order;
/// empty when it lists none.
pub fn listed_names(help: &str) -> Vec<String> {
    let Some(start) = help.find("(one of: ").or_else(|| help.find("(any of: ")) else {
        return Vec::new();
    };
    let rest = &help[start + "(one of: ".len()..];
    let end = rest.find(')').unwrap_or(rest.len());
    rest[..end]
        .split(',')
        .map(|n| n.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|n| !n.is_empty())
        .collect()
}

/// The one shared concept that owns a short letter, if any.
pub fn concept_of_short(c: char) -> Option<&'static Flag> {
    SHARED.iter().find(|f| f.short == Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_names_reads_back_what_one_of_wrote() {
        let help = format!("A model {}; or a shape", one_of(["tiny", "gpt3-1.3b"]));
        assert_eq!(listed_names(&help), ["tiny", "gpt3-1.3b"]);
        assert_eq!(listed_names(&any_of(["gpipe"])), ["gpipe"]);
        assert!(listed_names("no list here").is_empty());
    }

    #[test]
    fn one_count_takes_a_list_of_one() {
        assert_eq!(one_count::<usize>("4"), Ok(4));
        assert!(one_count::<usize>("2,4").unwrap_err().contains("one value"));
        assert!(one_count::<usize>("x").is_err());
    }

    #[test]
    fn each_concept_has_one_spelling_and_one_letter() {
        for (i, a) in SHARED.iter().enumerate() {
            for b in &SHARED[i + 1..] {
                assert_ne!(a.long, b.long, "{} twice", a.long);
                if a.short.is_some() {
                    assert_ne!(a.short, b.short, "-{:?} twice", a.short);
                }
            }
            // A shared short letter nccl-tests has means in parbench what it
            // means there; one it lacks (-v) is free.
            if let Some(c) = a.short {
                let Some((_, theirs)) = NCCL_TESTS_SHORTS.iter().find(|(l, _)| *l == c) else {
                    continue;
                };
                assert!(
                    theirs.starts_with(a.long) || theirs.contains(a.long) || *theirs == "datatype",
                    "-{c} is nccl-tests' --{theirs}, here --{}",
                    a.long
                );
            }
        }
    }
}
