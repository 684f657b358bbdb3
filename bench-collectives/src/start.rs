//! What the sweep and `links` share about starting their ranks: the job
//! as the launcher is told it (its ranks from `-np` or `-g`), and how a
//! run ends on this process. The launcher decides, from the backend,
//! which ranks start (`launch::ranks::Ranks::choose`).

use crate::cli::SweepJob;
use anyhow::Result;
use parbench::launch::ranks::{Ranks, Wanted};
use parbench::launch::RankInfo;

/// How a run ended on this process.
pub enum Finished {
    /// This process ran a rank (or all ranks): wrong elements summed over
    /// ranks, as rank 0 saw them (0 on the other processes).
    Ran { wrong: u64 },
    /// Rank 0 ran, exact, but below `NCCL_TESTS_MIN_BW`: what fell below.
    BelowMinBw { why: String },
    /// This process spawned the ranks (`--backend tcp -np N`): pass on the
    /// exit code of the first rank that failed (in time), or 0. The
    /// launcher already named it.
    Launched { code: i32 },
}

/// Default number of ranks: the CPU cores, at least 2.
pub fn default_ranks() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2)
}

/// The ranks `plan`'s backend starts: `-np` ranks (default: the cores),
/// on GPUs `-np` or `-g` of them (default: every visible one); too many
/// GPUs is refused with `gpus_flag` (`links -np`) in front.
pub fn ranks(plan: &SweepJob, joined: Option<RankInfo>, gpus_flag: &str) -> Result<Ranks> {
    let too_many_gpus = |world: usize, visible: usize| {
        format!("{gpus_flag} {world}: this machine has {visible} visible GPU(s)")
    };
    let wanted = Wanted {
        ranks: plan.nprocs,
        gpus: plan.nprocs.or(plan.nccl_tests.ngpus),
        default: default_ranks(),
        job: None,
        too_many_gpus: &too_many_gpus,
    };
    Ok(Ranks::choose(plan.backend, joined, wanted)?)
}

/// Whether this process writes the records: rank 0 of a joined job, or
/// the process that runs or spawns the ranks (under mpi rank 0 is known
/// only once started, and writes then).
pub fn writes_records(ranks: &Ranks) -> bool {
    match (ranks, ranks.joined()) {
        (_, Some(info)) => info.rank == 0,
        (Ranks::LibraryWorld { .. }, None) => false,
        _ => true,
    }
}

/// The ranks of `world` whose memory this process checks on this host: 0
/// for a spawned rank (its launcher checked for all of them).
pub fn ranks_here(ranks: &Ranks, world: usize) -> usize {
    match ranks.joined() {
        Some(info) if info.source == parbench::launch::LaunchSource::Spawned => 0,
        Some(info) => parbench::launch::ranks_on_this_host(info.world),
        None => world,
    }
}

/// Runs a pattern's `body` (moe, cp-ring) on `ranks`: rank 0's report, or
/// how this process ends without one (it spawned the ranks, or ran others).
pub fn run_pattern<B, T>(
    plan: &SweepJob,
    ranks: Ranks,
    body: &B,
) -> Result<std::result::Result<T, Finished>>
where
    B: parbench::launch::ranks::RankBody<Out = Option<T>>,
{
    use parbench::launch::ranks::Ended;
    let here = matches!(ranks, Ranks::Here { .. });
    let out = match parbench::launch::ranks::run(ranks, plan.algo, plan.sweep.timeout, body)? {
        Ended::Launched { code, .. } => return Ok(Err(Finished::Launched { code })),
        Ended::Ran(outs) => outs.into_iter().flatten().next(),
    };
    match out {
        Some(report) => Ok(Ok(report)),
        None if here => anyhow::bail!("rank 0 returned no rows"),
        None => Ok(Err(Finished::Ran { wrong: 0 })),
    }
}

/// What a pattern's rank 0 prints and records.
pub struct PatternEnd<'a, R> {
    /// The table and the lines under it.
    pub lines: Vec<String>,
    pub rows: &'a [R],
    /// The backend the rows name (`None`: the one the run began with).
    pub backend: Option<String>,
    /// Wrong units over every row (any one exits 7).
    pub wrong: u64,
    /// run.json's `extra` entry: its key and value.
    pub extra: (&'static str, serde_json::Value),
}

/// Prints a pattern's lines, records its rows and run.json, and says how
/// the run ended.
pub fn record_pattern<R: parbench::results::Record>(
    plan: &SweepJob,
    meta: &mut parbench::results::RunMeta,
    end: PatternEnd<'_, R>,
) -> Result<Finished> {
    use anyhow::Context;
    for l in &end.lines {
        parbench::outln!("{l}");
    }
    if let Some(b) = end.backend {
        meta.backend = b;
    }
    meta.extra.insert(end.extra.0.into(), end.extra.1);
    meta.finish();
    let line = parbench::results::record_all(&plan.out, end.rows, meta)
        .with_context(|| format!("writing {}", plan.out.display()))?;
    parbench::outln!("{line}");
    Ok(Finished::Ran { wrong: end.wrong })
}
