//! Starting or joining the ranks of each backend, running the sweep on every
//! rank, and writing the records from rank 0.

use crate::cli::SweepJob;
use crate::memory;
use crate::start::Finished;
use crate::summary::{self, Headline, Summary};
use crate::sweep::{self, Outcome, RunIds};
use anyhow::{anyhow, Context, Result};
use parbench::comm::{CommError, CommResult, Communicator};
use parbench::launch;
use parbench::launch::flags::Backend;
use parbench::launch::ranks::{self as ranks, Ended, RankBody, Ranks};
use parbench::measure::noise::{CpuSnapshot, ForeignCpu};
use parbench::measure::placement::{self, BindRequest, Placement};
use parbench::measure::wire::{measure_wire, retransmits_since, WireFigures};
use parbench::results::{self, CollectiveRow, Record, RunMeta};
use std::path::Path;

/// A problem with what the user asked for, found after parsing (exit code 2).
pub use parbench::launch::UsageError;

/// What rank 0 brings back from its sweep.
pub struct RankReport {
    backend: String,
    wire_name: String,
    world: usize,
    wire: WireFigures,
    outcome: Outcome,
    summary: Summary,
    reference: crate::reference_line::Reference,
}

/// Runs the plan on the chosen backend.
pub fn run(plan: &SweepJob) -> Result<Finished> {
    let run_id = results::new_run_id("collectives");
    launch::check_env_settings()?;
    let bind = BindRequest::from_env().map_err(UsageError)?;
    let joined = launch::RankInfo::from_env().map_err(|e| UsageError(e.to_string()))?;
    crate::nccl_flags::check_backend(plan, joined.is_some()).map_err(UsageError)?;
    if let Some(shape) = &plan.moe {
        let ranks = crate::start::ranks(plan, joined, "moe -np")?;
        return crate::moe::run(plan, shape, &run_id, ranks);
    }
    if let Some(stand_in) = plan.cp_ring {
        let ranks = crate::start::ranks(plan, joined, "cp-ring -np")?;
        return crate::cp_ring::run(plan, stand_in, &run_id, ranks);
    }
    if plan.links {
        let ranks = crate::start::ranks(plan, joined, "links -np")?;
        return crate::links::run(plan, &run_id, ranks);
    }
    let ranks = crate::start::ranks(plan, joined, "--backend nccl -np")?;
    if let Ranks::Here { backend, n: world } = ranks {
        let most = backend.most_ranks();
        if world > most {
            return Err(UsageError(format!(
                "--nprocs {world}: --backend {backend} runs at most {most} ranks (threads of one process); use --backend tcp"
            ))
            .into());
        }
    }
    // Under mpi the world is known once MPI has started: the rank checks it.
    if let Some(world) = ranks.world() {
        plan.sweep
            .check_world(world)
            .map_err(|e| UsageError(e.to_string()))?;
    }
    match ranks {
        Ranks::Here { backend, n } if backend.on_gpus() => run_gpus(plan, &run_id, backend, n),
        Ranks::Here { backend, n } => run_threads(plan, &run_id, bind, backend, n),
        Ranks::Spawn(world) => run_spawn(plan, &run_id, world),
        // `start` spawns the -np ranks of one sweep, never a named job.
        Ranks::Job(_) => Err(anyhow!("bench-collectives runs one job, not named jobs")),
        Ranks::Joined { backend, info } if backend.on_gpus() => {
            run_joined_gpu(plan, &run_id, backend, info)
        }
        Ranks::Joined { backend, info } => run_joined(plan, &run_id, backend, info, bind),
        Ranks::LibraryWorld { backend } => run_library_world(plan, &run_id, backend),
    }
}

/// What can be checked before anything is measured: the output folder
/// (when this process writes it) and the memory `ranks_here` ranks of the
/// sweep take on this host. Both are bad input (exit 2).
fn preflight(plan: &SweepJob, world: usize, ranks_here: usize, writes: bool) -> Result<()> {
    if writes {
        results::prepare_out::<CollectiveRow>(&plan.out)
            .map_err(|e| UsageError(format!("--out {e}")))?;
    }
    memory::check_host(&plan.sweep, world, ranks_here).map_err(|e| UsageError(e.0))?;
    Ok(())
}

/// Starts the run record and notes it as begun: a fault or a signal from
/// here on records it as cut short, with the rows appended so far.
fn begin(plan: &SweepJob, run_id: &str, backend: Backend, world: usize) -> RunMeta {
    let meta = ranks::run_meta("collectives", run_id, backend, world);
    results::begin_run(&plan.out, &meta);
    meta
}

/// Where a rank of a library's communicator runs: where its launcher or
/// library put it.
fn unbound(whose: &str) -> Placement {
    Placement {
        cpu: None,
        why: format!("left to {whose}"),
    }
}

fn run_threads(
    plan: &SweepJob,
    run_id: &str,
    bind: BindRequest,
    backend: Backend,
    world: usize,
) -> Result<Finished> {
    preflight(plan, world, world, true)?;
    let ranks = Ranks::Here { backend, n: world };
    let mut meta = begin(plan, run_id, ranks.backend(), world);
    let body = Sweep {
        plan,
        run_id,
        out: Some(plan.out.as_path()),
        at: At::EachRank(bind, world),
    };
    let report = rank_zero(ranks::run(ranks, plan.algo, plan.sweep.timeout, &body)?)?;
    finish(plan, &mut meta, report)
}

/// Spawns `-np` ranks of this binary on loopback (they join) and waits for them.
fn run_spawn(plan: &SweepJob, run_id: &str, world: usize) -> Result<Finished> {
    preflight(plan, world, world, true)?;
    // The children run the sweep; this process only waits for them.
    let body = Sweep {
        plan,
        run_id,
        out: None,
        at: At::Fixed(Placement {
            cpu: None,
            why: "spawned".into(),
        }),
    };
    match ranks::run(Ranks::Spawn(world), plan.algo, plan.sweep.timeout, &body) {
        // A failed rank was already named on stderr by the launcher.
        Ok(Ended::Launched { code, failure }) => {
            // Rank 0 killed outright (SIGKILL) could not record its end:
            // the launcher, which saw it die, does.
            if let Some(why) = failure {
                let _ = results::record_seen_death(&plan.out, run_id, &why);
            }
            Ok(Finished::Launched { code })
        }
        Ok(Ended::Ran(_)) => Err(anyhow!("the spawned ranks ran in this process")),
        Err(f) => Err(own_error(f)),
    }
}

/// A job's fault as the error it wraps where it wraps one (starting the
/// ranks, or MPI), so that the one-line report does not say it twice.
fn own_error(fault: ranks::JobFault) -> anyhow::Error {
    match fault {
        ranks::JobFault::Launch(e) => e.into(),
        ranks::JobFault::Start(e) => e.into(),
        other => other.into(),
    }
}

/// Joins the job the launcher variables describe.
fn run_joined(
    plan: &SweepJob,
    run_id: &str,
    backend: Backend,
    info: launch::RankInfo,
    bind: BindRequest,
) -> Result<Finished> {
    // A spawning launcher checked the memory of all its ranks before it
    // started them (here the first to allocate would shrink the others').
    let ranks_here = match info.source {
        launch::LaunchSource::Spawned => 0,
        _ => launch::ranks_on_this_host(info.world),
    };
    if ranks_here > 0 || info.rank == 0 {
        preflight(plan, info.world, ranks_here, info.rank == 0)?;
    }
    let (rank, world) = (info.rank, info.world);
    // Before connecting: the store's and the transport's threads inherit it.
    // Ranks this binary spawned all run here; others may not.
    let here = (info.source == launch::LaunchSource::Spawned).then_some(world);
    let ranks = Ranks::Joined { backend, info };
    let mut meta = if rank == 0 {
        begin(plan, run_id, backend, world)
    } else {
        ranks::run_meta("collectives", run_id, backend, world)
    };
    let body = Sweep {
        plan,
        run_id,
        out: (rank == 0).then_some(plan.out.as_path()),
        at: At::Fixed(placement::place(bind, rank, here)),
    };
    let ended = ranks::run(ranks, plan.algo, plan.sweep.timeout, &body)?;
    if rank != 0 {
        return Ok(Finished::Ran { wrong: 0 });
    }
    finish(plan, &mut meta, rank_zero(ended)?)
}

/// One rank of an mpirun job: the launcher starts MPI, whose world is the
/// library's; the rank checks it, --out and the memory before it measures
/// ([`MpiSweep`]), and rank 0's run record takes the library's version.
fn run_library_world(plan: &SweepJob, run_id: &str, backend: Backend) -> Result<Finished> {
    let ranks = Ranks::LibraryWorld { backend };
    let body = MpiSweep {
        plan,
        run_id,
        backend,
        meta: std::sync::Mutex::new(None),
    };
    // Starting MPI failed: the library's own error, as it gave it.
    let ended = ranks::run(ranks, plan.algo, plan.sweep.timeout, &body).map_err(own_error)?;
    let Ended::Ran(outcomes) = ended else {
        return Err(anyhow!("an MPI rank is started by mpirun, not spawned"));
    };
    let outcome = outcomes
        .into_iter()
        .next()
        .context("the MPI rank returned nothing")?;
    let Some(report) = outcome? else {
        return Ok(Finished::Ran { wrong: 0 });
    };
    let meta = body.meta.into_inner().ok().flatten();
    let mut meta = meta.context("rank 0 started no run record")?;
    finish(plan, &mut meta, report)
}

/// The sweep on one rank of an mpirun job: what the other backends check
/// before their ranks start waits here for MPI's world. Bad input found
/// then is the rank's outcome (exit code 2), not a fault of the transport.
struct MpiSweep<'a> {
    plan: &'a SweepJob,
    run_id: &'a str,
    backend: Backend,
    /// This rank's run record, begun once the world is known.
    meta: std::sync::Mutex<Option<RunMeta>>,
}

impl RankBody for MpiSweep<'_> {
    type Out = Result<Option<RankReport>>;
    fn run<C: ranks::RankComm>(&self, comm: &mut C) -> CommResult<Self::Out> {
        let (world, rank) = (comm.world(), comm.rank());
        if let Err(e) = self.started(world, rank, comm.library()) {
            return Ok(Err(e));
        }
        let out = (rank == 0).then_some(self.plan.out.as_path());
        rank_main(
            comm,
            self.plan,
            self.run_id,
            out,
            &unbound("the MPI launcher"),
        )
        .map(Ok)
    }
}

impl MpiSweep<'_> {
    /// Checks the world, --out (on rank 0) and this host's memory, then
    /// begins the run record with the MPI library's version.
    fn started(&self, world: usize, rank: usize, library: Option<String>) -> Result<()> {
        let plan = self.plan;
        plan.sweep
            .check_world(world)
            .map_err(|e| UsageError(e.to_string()))?;
        preflight(plan, world, launch::ranks_on_this_host(world), rank == 0)?;
        let mut meta = if rank == 0 {
            begin(plan, self.run_id, self.backend, world)
        } else {
            ranks::run_meta("collectives", self.run_id, self.backend, world)
        };
        meta.note_library(library.unwrap_or_default());
        let mut kept = self
            .meta
            .lock()
            .map_err(|_| anyhow!("the run record was poisoned by a panic"))?;
        *kept = Some(meta);
        Ok(())
    }
}

/// The run record of an nccl run (with the GPUs and the library versions:
/// [`ranks::run_meta`]), begun on disk by the rank that `writes`.
fn nccl_meta(plan: &SweepJob, run_id: &str, ranks: &Ranks, writes: bool) -> RunMeta {
    let (backend, world) = (ranks.backend(), ranks.world().unwrap_or(1));
    if writes {
        begin(plan, run_id, backend, world)
    } else {
        ranks::run_meta("collectives", run_id, backend, world)
    }
}

/// One process of an nccl job, on one GPU.
fn run_joined_gpu(
    plan: &SweepJob,
    run_id: &str,
    backend: Backend,
    info: launch::RankInfo,
) -> Result<Finished> {
    // Before NCCL's first call: its tuning log fills the algo column.
    parbench::comm::nccl_tuning::set_up_log(&plan.out, run_id);
    let rank = info.rank;
    preflight(
        plan,
        info.world,
        launch::ranks_on_this_host(info.world),
        rank == 0,
    )?;
    memory::check_gpu(&plan.sweep, info.world, info.local_rank.unwrap_or(0))
        .map_err(|e| UsageError(e.0))?;
    let ranks = Ranks::Joined { backend, info };
    let mut m = nccl_meta(plan, run_id, &ranks, rank == 0);
    let body = Sweep {
        plan,
        run_id,
        out: (rank == 0).then_some(plan.out.as_path()),
        at: At::Fixed(unbound("the launcher")),
    };
    let ended = ranks::run(ranks, plan.algo, plan.sweep.timeout, &body)?;
    if rank != 0 {
        return Ok(Finished::Ran { wrong: 0 });
    }
    finish(plan, &mut m, rank_zero(ended)?)
}

/// `-np` GPUs of this process, one thread each.
fn run_gpus(plan: &SweepJob, run_id: &str, backend: Backend, world: usize) -> Result<Finished> {
    parbench::comm::nccl_tuning::set_up_log(&plan.out, run_id);
    preflight(plan, world, world, true)?;
    memory::check_gpu(&plan.sweep, world, 0).map_err(|e| UsageError(e.0))?;
    let ranks = Ranks::Here { backend, n: world };
    let mut m = nccl_meta(plan, run_id, &ranks, true);
    let body = Sweep {
        plan,
        run_id,
        out: Some(plan.out.as_path()),
        at: At::Fixed(unbound("NCCL")),
    };
    let report = rank_zero(ranks::run(ranks, plan.algo, plan.sweep.timeout, &body)?)?;
    finish(plan, &mut m, report)
}

/// Where each rank of a sweep runs.
enum At {
    /// Threads of this process: rank r takes slot r of `world` ranks here.
    EachRank(BindRequest, usize),
    /// Where the binary or the backend's library already put it.
    Fixed(Placement),
}

/// The sweep as the launcher runs it on each rank.
struct Sweep<'a> {
    plan: &'a SweepJob,
    run_id: &'a str,
    out: Option<&'a Path>,
    at: At,
}

impl RankBody for Sweep<'_> {
    type Out = Option<RankReport>;
    fn run<C: Communicator>(&self, comm: &mut C) -> CommResult<Option<RankReport>> {
        let at = match &self.at {
            At::EachRank(bind, world) => placement::place(*bind, comm.rank(), Some(*world)),
            At::Fixed(p) => p.clone(),
        };
        rank_main(comm, self.plan, self.run_id, self.out, &at)
    }
}

/// Rank 0's report among what this process's ranks returned.
fn rank_zero(ended: Ended<Option<RankReport>>) -> Result<RankReport> {
    match ended {
        Ended::Ran(reports) => reports
            .into_iter()
            .flatten()
            .next()
            .context("rank 0 returned no report"),
        Ended::Launched { code, .. } => Err(anyhow!(
            "the ranks were launched, not run here (exit code {code})"
        )),
    }
}

/// Appends one size's rows to `out` as soon as they are measured.
fn keep_rows(out: &Path, rows: &[CollectiveRow]) -> CommResult<()> {
    results::append_rows(out, rows)
        .map(|_| ())
        .map_err(|e| CommError::Io(std::io::Error::other(format!("writing the records: {e}"))))
}

/// The body every rank runs; rank 0 returns its report, and when it is
/// given `out`, appends each size's rows there as they are measured.
fn rank_main<C: Communicator>(
    comm: &mut C,
    plan: &SweepJob,
    run_id: &str,
    out: Option<&Path>,
    placement: &Placement,
) -> CommResult<Option<RankReport>> {
    comm.set_timeout(plan.sweep.timeout);
    sweep::refuse_types_named(comm, &plan.sweep)?;
    let run_start = CpuSnapshot::now();
    let link_start = comm.link_stats();
    // Up to a few seconds without a word otherwise: say what runs, on a terminal.
    let ticker = (comm.rank() == 0)
        .then(|| crate::progress_lines::wire_starts(comm.backend(), comm.world()));
    let wire = measure_wire(comm, &plan.sweep.rows(), placement)?;
    drop(ticker);
    let mut printer = crate::run_header::printer(comm, plan);
    let algo = if plan.algo == parbench::comm::Algo::Auto {
        "auto"
    } else {
        plan.algo.name()
    };
    printer.run_header(&crate::print::header_lines(
        (comm.backend(), comm.wire().as_str(), comm.world()),
        algo,
        &plan.sweep,
        &wire,
        plan.verbose,
    ));
    crate::run_header::print_run_header(&mut printer, comm, plan);
    let keep = |rows: &[CollectiveRow]| match out {
        Some(dir) => keep_rows(dir, rows),
        None => Ok(()),
    };
    let ids = RunIds {
        run_id,
        keep: (comm.rank() == 0 && out.is_some()).then_some(&keep),
    };
    let outcome = sweep::run_sweep(comm, &plan.sweep, &ids, &wire, &mut printer)?;
    let noise = ForeignCpu::across_ranks(comm, run_start.as_ref())?;
    let link = retransmits_since(comm, link_start)?;
    let reference =
        crate::reference_line::describe(comm.backend(), &comm.wire(), comm.world(), &wire);
    let summary = Summary {
        headlines: Headline::of(&outcome.rows, reference.published_gbps),
        fits: summary::fits(&outcome.rows, plan.sweep.fit_from),
        above_ceiling: outcome
            .rows
            .iter()
            .filter(|r| summary::above_ceiling(r, &wire))
            .map(CollectiveRow::label)
            .collect(),
        straggler: outcome.straggler(),
        wrong: outcome.wrong,
        noise,
        noise_per_collective: outcome.noise.clone(),
        link,
    };
    printer.summary(&summary);
    if comm.rank() != 0 {
        return Ok(None);
    }
    Ok(Some(RankReport {
        backend: comm.backend().to_string(),
        wire_name: comm.wire(),
        world: comm.world(),
        wire,
        outcome,
        summary,
        reference,
    }))
}

/// A wire's model as run.json records it.
fn model_link_json(w: &WireFigures) -> serde_json::Value {
    serde_json::json!({
        "source": "measured before the sweep, not fitted: the alpha-beta-gamma form of each algorithm (parbench's own sliced rings on local and tcp, the textbook forms on a library's backend); alpha = median of timed 8 B exchanges (every rank at once), beta = 1/ceiling at the row's working set, gamma = 1/(float sum kernel at the row's working set)",
        "alpha_us": w.alpha_us(),
        "ping_pong": w.ping,
        "exchange": w.exchange,
        "own_transport_model": w.own_transport,
        "copy": w.copy,
        "reduce": w.reduce,
    })
}

/// Writes rank 0's rows and run metadata; prints where they went.
fn finish(plan: &SweepJob, meta: &mut RunMeta, r: RankReport) -> Result<Finished> {
    meta.backend = r.backend.clone();
    meta.world = r.world;
    let w = &r.wire;
    let extra = &mut meta.extra;
    extra.insert("wire".into(), r.wire_name.clone().into());
    extra.insert(
        "ceiling".into(),
        serde_json::json!({
            "method": w.ceiling.method,
            "in_cache_gbps": w.ceiling.peak_gbps(),
            "out_of_cache_gbps": w.ceiling.rungs.last().map(|r| r.gbps),
            "ladder": w.ceiling,
            "rows": "each row's ceiling_gbps is this ladder at the row's working set (docs/collectives.md, The wire's ceiling)",
        }),
    );
    extra.insert("model_link".into(), model_link_json(w));
    extra.insert(
        "floor".into(),
        serde_json::json!({
            "floor_us": w.floor_us(),
            "clock_resolution_us": w.clock_us,
            "latency_jitter_us": w.ping.as_ref().map(|p| p.jitter_us()),
            "exchange_jitter_us": w.exchange.as_ref().map(|p| p.jitter_us()),
            "rule": "report compare never calls a change of a time smaller than floor_us a regression",
        }),
    );
    extra.insert("wire_measure_s".into(), w.cost_s.into());
    extra.insert(
        "placement".into(),
        serde_json::json!({"cpus": w.cpus, "why": w.placement_why}),
    );
    if let Some(l) = &r.summary.link {
        extra.insert(
            "sockets".into(),
            serde_json::json!({
                "congestion_control": l.congestion_control,
                "chosen_by": l.chosen_by,
                "retransmitted_segments_run": l.retransmitted_segments,
                "retransmitted_segments_wire": w.link.as_ref().map(|x| x.retransmitted_segments),
            }),
        );
    }
    if let Some(n) = &r.summary.noise {
        meta.set_noise(n);
    }
    let extra = &mut meta.extra;
    extra.insert(
        "noise_per_collective".into(),
        serde_json::Value::Object(
            r.summary
                .noise_per_collective
                .iter()
                .filter_map(|(c, n)| {
                    Some((
                        c.name().to_string(),
                        serde_json::to_value(n.as_ref()?).ok()?,
                    ))
                })
                .collect(),
        ),
    );
    extra.insert(
        "above_ceiling".into(),
        serde_json::json!(r.summary.above_ceiling),
    );
    extra.insert(
        "headlines".into(),
        serde_json::json!(r
            .summary
            .headlines
            .iter()
            .map(Headline::json)
            .collect::<Vec<_>>()),
    );
    extra.insert("fits".into(), r.summary.fits_json());
    extra.insert(
        "straggler".into(),
        match &r.summary.straggler {
            Some(v) => serde_json::json!({
                "rank": v.rank,
                "fraction": v.fraction,
                "median_late_us": v.median_late_us,
                "iterations": v.iterations,
            }),
            None => serde_json::Value::Null,
        },
    );
    extra.insert("wrong".into(), r.summary.wrong.into());
    extra.insert("algo".into(), plan.algo.name().into());
    crate::reference_line::record(meta, &r.reference, &r.summary.headlines);
    meta.finish();
    // The rows went in as each size completed.
    let csv = plan.out.join(CollectiveRow::FILE);
    let json = results::record_run(&plan.out, meta).context("recording the run")?;
    parbench::outln!(
        "# Records: {} (+{} rows), {}\n# run {}",
        csv.display(),
        r.outcome.rows.len(),
        json.display(),
        meta.run_id
    );
    if let Some(path) = &plan.nccl_tests.json_file {
        crate::json_nccl::write(path, plan, meta, &r.outcome)?;
    }
    match crate::nccl_tests_format::min_bw_failure(&r.outcome.rows) {
        Some(why) if r.summary.wrong == 0 => Ok(Finished::BelowMinBw { why }),
        _ => Ok(Finished::Ran {
            wrong: r.summary.wrong,
        }),
    }
}
