//! `bench-layers`: Megatron tensor-parallel transformer blocks at TP 1, 2,
//! 4, 8 on any backend: compute and communication time per block and per
//! token, checked against the unsharded block, beside the alpha-beta model
//! of the same wire. See docs/layers.md.
//!
//! How each backend sweeps the degrees (each degree's ranks start through
//! `launch::ranks::run`, and every rank runs the one [`Degree`] body):
//! - `local`: for each t, t threads of this process, one local communicator.
//! - `tcp`: this process is the launcher: for each t it spawns t ranks of
//!   itself on this host (`PARBENCH_LAYERS_TP=t`), each rank runs that one
//!   degree and rank 0 hands its row back through a file; under an external
//!   launcher (torchrun, mpirun, srun) the job's world is the one degree.
//! - `nccl` (feature `cuda`): for each t, GPUs 0..t of this process, one
//!   thread and one NCCL communicator each; the default degrees stop at the
//!   visible GPUs, and a --tp beyond them is refused before anything runs.
//! - `mpi`: needs the `mpi` feature; launched by mpirun, whose world (as MPI
//!   itself reports it) is the one degree, as with tcp under a launcher.
//!
//! Records: --out is checked and the memory of the largest degree held
//! against the machine's before anything runs; each degree's row is
//! appended as it completes, so a later fault or a signal keeps it (and
//! run.json records the run as cut short).
//!
//! Cores: ranks on one host split its cores evenly
//! ([`CpuCompute::threads_per_rank`]), so t ranks never oversubscribe the
//! machine and TP = 1 uses every core.

mod cli;
mod cp;
mod moe;
mod output;
mod sweep;

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use cli::{Backend, Cli, LayerJob, UsageError};
use parbench::comm::{Algo, CommError};
use parbench::compute::cpu::CpuCompute;
use parbench::launch::ranks::{self, Ended, JobFault, RankBody, RankComm, Ranks, Wanted};
use parbench::launch::{
    self, eprint_line, interrupt, report, LaunchError, LocalJob, RankInfo, Reported,
};
use parbench::measure::ComputeReference;
use parbench::results::{self, append_rows, new_run_id, read_rows, LayerRow, RunMeta};
use std::path::Path;
use std::sync::Mutex;
use sweep::{measure_tp, TpMeasurement};

/// Set in a spawned rank: the one degree it runs.
const ENV_TP: &str = "PARBENCH_LAYERS_TP";
/// Set in a spawned rank: where rank 0 writes its row.
const ENV_ROWS: &str = "PARBENCH_LAYERS_ROWS";
/// Set in a spawned rank: the launcher's run id.
const ENV_RUN_ID: &str = "PARBENCH_LAYERS_RUN_ID";

fn main() {
    // Before any thread starts: a signal it can catch keeps the degrees measured.
    let _ = interrupt::install("bench-layers");
    // The noise guard's window starts here: run.json records the CPU time
    // other processes took while the whole run measured.
    parbench::measure::noise::mark_start();
    // mpirun's spelling `-np N` is one flag here, not `-n p` (iterations),
    // and the last release's spellings today's, each with its notice.
    let (argv, notices) =
        parbench::vocab::rewrite::modernize(parbench::vocab::Tool::Layers, std::env::args_os());
    parbench::vocab::rewrite::print_notices(&notices);
    let mut cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            // Help and version are not errors; everything else is one line, exit 2.
            if !e.use_stderr() {
                let _ = e.print();
                std::process::exit(0);
            }
            eprint_line(&report::cli_error_line("bench-layers", &e.to_string()));
            std::process::exit(2);
        }
    };
    // `--backend auto`, as every binary reads it.
    if let Err(e) = parbench::launch::flags::resolve_auto(&mut cli.backend) {
        eprint_line(&format!("bench-layers: {e}"));
        std::process::exit(2);
    }
    // Bad input is one line, exit 2; after a fault the degrees measured
    // before it are in the folder.
    if let Err(e) = run(&cli) {
        std::process::exit(launch::end_on_error(
            "bench-layers",
            e.as_ref(),
            &format!("{e:#}"),
        ));
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let rank = RankInfo::from_env().map_err(|e| UsageError(e.to_string()))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The backend's own parse (and its error) is the job's.
    let named = cli.backend.parse::<Backend>().unwrap_or(Backend::Auto);
    let default_ranks = ranks::default_ranks(named, rank.as_ref(), cores)?;
    let plan = cli.job(default_ranks)?;
    parbench::launch::check_env_settings()?;
    // Every degree's ranks, chosen before any runs: a degree this machine
    // cannot start is refused first.
    let mut chosen = Vec::with_capacity(plan.tps.len());
    for &t in &plan.tps {
        chosen.push(ranks_of(&plan, rank.clone(), t, None)?);
    }
    if let (Some(job), false) = (&plan.cp, chosen.is_empty()) {
        return cp::run(&plan, job, chosen.swap_remove(0));
    }
    if let (Some(moe), false) = (plan.moe, chosen.is_empty()) {
        check_gpus(&plan)?;
        return moe::run(&plan, moe, chosen.swap_remove(0));
    }
    match chosen.first() {
        Some(Ranks::Here { backend, .. }) if !backend.on_gpus() => {
            preflight(&plan, true, |t| t)?;
            sweep_here(&plan, |t| {
                let ranks = ranks_of(&plan, None, t, None)?;
                measure_here(&plan, t, ranks, CpuCompute::threads_per_rank(t))
            })
        }
        Some(Ranks::Here { .. }) => {
            // The host holds little: the blocks live on the GPUs.
            preflight(&plan, true, |_| 0)?;
            check_gpus(&plan)?;
            // One thread and one NCCL communicator per GPU 0..t (nccl-tests'
            // `-g` way), the block computing on the communicator's stream.
            sweep_here(&plan, |t| {
                let ranks = ranks_of(&plan, None, t, None)?;
                measure_here(&plan, t, ranks, 0)
            })
        }
        Some(Ranks::Spawn(_) | Ranks::Job(_)) => tcp_launch(&plan),
        Some(Ranks::Joined { .. }) => {
            let ranks = chosen.swap_remove(0);
            tcp_rank(&plan, ranks)
        }
        Some(Ranks::LibraryWorld { backend }) => {
            let backend = *backend;
            mpi_rank(&plan, backend)
        }
        None => Ok(()),
    }
}

/// The ranks of degree `t` on the plan's backend, as the launcher chooses
/// them (`joined`: this process's rank under a launcher); a spawned degree
/// runs `job`.
fn ranks_of(
    plan: &LayerJob,
    joined: Option<RankInfo>,
    t: usize,
    job: Option<LocalJob>,
) -> anyhow::Result<Ranks> {
    let too_many_gpus =
        |t: usize, visible: usize| format!("--tp {t}: this machine has {visible} visible GPU(s)");
    let wanted = Wanted {
        ranks: Some(t),
        gpus: Some(t),
        default: t,
        job,
        too_many_gpus: &too_many_gpus,
    };
    Ok(Ranks::choose(plan.backend, joined, wanted)?)
}

/// The table of the degrees measured so far, printed if a signal stops the
/// run before its end prints it.
static SIGNAL_TABLE: Mutex<Option<String>> = Mutex::new(None);

/// The rows of one run: kept in --out as each degree completes, then the
/// table and run.json once the sweep is done.
struct Records<'a> {
    plan: &'a LayerJob,
    meta: RunMeta,
    rows: Vec<LayerRow>,
    /// The machine's compute speed, sampled when the run begins and after
    /// each degree (CPU backends; `None` on GPUs, where the CPU's speed
    /// says nothing of the block's).
    reference: Option<ComputeReference>,
}

impl<'a> Records<'a> {
    /// Starts the run record (noted as begun: a fault or a signal from here
    /// on records it as cut short).
    fn begin(plan: &'a LayerJob, meta: RunMeta) -> Self {
        let mut meta = meta;
        meta.extra.insert("block".into(), output::block_json(plan));
        let mut records = Records {
            plan,
            meta,
            rows: Vec::new(),
            reference: (!plan.backend.on_gpus()).then(ComputeReference::on_allowed_cpus),
        };
        records.sample_reference();
        records
    }

    /// Times the compute reference once more and puts it in the record
    /// (so that a run cut short keeps it too).
    fn sample_reference(&mut self) {
        if let Some(r) = &mut self.reference {
            r.sample();
        }
        self.meta.extra.insert(
            "compute_reference".into(),
            output::reference_json(self.reference.as_ref()),
        );
        results::begin_run(&self.plan.out, &self.meta);
    }

    /// Appends one degree's rows, with the run's id and the speed-up over
    /// the TP = 1 row measured before.
    fn keep(&mut self, mut rows: Vec<LayerRow>) -> anyhow::Result<()> {
        for r in &mut rows {
            r.run_id = self.meta.run_id.clone();
        }
        output::fill_speedup(&self.rows, &mut rows);
        let before = self.rows.len();
        self.rows.extend(rows.iter().cloned());
        // The table a signal prints holds these rows from before they are
        // appended: a signal during the append waits for it to finish.
        self.table_for_a_signal();
        if let Err(e) = append_rows(&self.plan.out, &rows) {
            self.rows.truncate(before);
            self.table_for_a_signal();
            return Err(e).with_context(|| format!("writing {}", self.plan.out.display()));
        }
        self.sample_reference();
        Ok(())
    }

    /// Keeps the table of the degrees kept so far where a signal that
    /// stops the run finds it ([`SIGNAL_TABLE`]): a run stopped between two
    /// degrees still prints what it measured.
    fn table_for_a_signal(&self) {
        let text = (!self.rows.is_empty()).then(|| {
            format!(
                "{}{}\n",
                output::table(
                    self.plan,
                    &self.rows,
                    parbench::measure::noise::since_start().as_ref()
                ),
                output::reference_line(self.reference.as_ref(), &self.rows)
            )
        });
        if let Ok(mut t) = SIGNAL_TABLE.lock() {
            *t = text;
        }
        static HOOK: std::sync::OnceLock<interrupt::HookGuard> = std::sync::OnceLock::new();
        HOOK.get_or_init(|| {
            interrupt::on_interrupt(|_| {
                if let Some(t) = SIGNAL_TABLE.lock().ok().and_then(|mut t| t.take()) {
                    parbench::out!("{t}");
                }
            })
        });
    }

    /// Prints the table of the degrees kept.
    fn print_table(&self) {
        if let Ok(mut t) = SIGNAL_TABLE.lock() {
            *t = None;
        }
        if !self.rows.is_empty() {
            let noise = parbench::measure::noise::since_start();
            parbench::out!("{}", output::table(self.plan, &self.rows, noise.as_ref()));
            parbench::outln!(
                "{}",
                output::reference_line(self.reference.as_ref(), &self.rows)
            );
        }
    }

    /// After the whole sweep: the table, then run.json.
    fn finish(mut self) -> anyhow::Result<()> {
        self.print_table();
        self.meta.finish();
        results::record_run(&self.plan.out, &self.meta).context("recording the run")?;
        parbench::outln!(
            "# wrote {} rows to {}",
            self.rows.len(),
            self.plan
                .out
                .join(<LayerRow as results::Record>::FILE)
                .display()
        );
        Ok(())
    }

    /// After a sweep that stopped at `err`: the table of what was kept,
    /// and the error (the caller records the run as cut short).
    fn stopped(self, err: anyhow::Error) -> anyhow::Result<()> {
        self.print_table();
        Err(err)
    }
}

/// Checks --out (where this process writes) and the memory the sweep's
/// largest degree takes on this host: `ranks_here(t)` ranks of degree `t`.
fn preflight(
    plan: &LayerJob,
    writes: bool,
    ranks_here: impl Fn(usize) -> usize,
) -> anyhow::Result<()> {
    if writes {
        results::prepare_out::<LayerRow>(&plan.out)
            .map_err(|e| UsageError(format!("--out {e}")))?;
    }
    // The CPU computes in f32 whatever the storage type: 4 bytes a value.
    let elem = if plan.backend.on_gpus() {
        plan.dtype.size().max(4) as u128
    } else {
        4
    };
    for &t in &plan.tps {
        let (rank, check) = plan.memory_bytes(t, elem);
        let here = ranks_here(t) as u128;
        let need = rank * here + if here > 0 { check } else { 0 };
        parbench::limits::check_host_memory(
            need,
            "--hidden/--ffn/--seq/--microbatch-size",
            &format!(
                "tp {t}: {here} rank(s) on this host x {} for the block{}",
                parbench::limits::bytes_text(rank),
                if plan.check && here > 0 {
                    format!(
                        ", {} for the unsharded check",
                        parbench::limits::bytes_text(check)
                    )
                } else {
                    String::new()
                }
            ),
        )
        .map_err(|e| UsageError(e.0))?;
    }
    Ok(())
}

/// Runs `measure` for each degree in order and hands each result to `keep`
/// as it completes, until one fails: its error (the degrees before it are kept).
fn sweep_degrees<T>(
    tps: &[usize],
    mut measure: impl FnMut(usize) -> anyhow::Result<T>,
    mut keep: impl FnMut(T) -> anyhow::Result<()>,
) -> Option<anyhow::Error> {
    for &t in tps {
        if let Err(e) = measure(t).and_then(&mut keep) {
            return Some(e);
        }
    }
    None
}

/// A sweep on this process's threads or GPUs: every degree measured and
/// kept in turn.
fn sweep_here(
    plan: &LayerJob,
    measure: impl FnMut(usize) -> anyhow::Result<TpMeasurement>,
) -> anyhow::Result<()> {
    let backend = plan.backend.name();
    let world = plan.tps.iter().copied().max().unwrap_or(1);
    let run_id = new_run_id("layers");
    let mut records = Records::begin(
        plan,
        ranks::run_meta("layers", &run_id, plan.backend, world),
    );
    let failed = sweep_degrees(&plan.tps, measure, |m| {
        records.keep(build_rows(plan, backend, &[m]))
    });
    match failed {
        None => records.finish(),
        Some(e) => records.stopped(e),
    }
}

fn build_rows(plan: &LayerJob, backend: &str, ms: &[TpMeasurement]) -> Vec<LayerRow> {
    let id = std::env::var(ENV_RUN_ID).unwrap_or_else(|_| new_run_id("layers"));
    output::rows(plan, &id, backend, ms)
}

/// One degree on this process's ranks (`Ranks::Here`: threads, or one GPU
/// each), each computing with `threads` threads: rank 0's
/// measurement, or the root cause of the degree's failure.
fn measure_here(
    plan: &LayerJob,
    t: usize,
    ranks: Ranks,
    threads: usize,
) -> anyhow::Result<TpMeasurement> {
    rank_0s(plan, &format!("tp {t}"), ranks, &Degree { plan, threads })
}

/// Runs `body` on `ranks` (of this process) for the degree named `degree`
/// (`tp 2`): rank 0's outcome, or the root cause of the degree's failure.
fn rank_0s<T: Send, B: RankBody<Out = Option<T>>>(
    plan: &LayerJob,
    degree: &str,
    ranks: Ranks,
    body: &B,
) -> anyhow::Result<T> {
    match ranks::run(ranks, Algo::Auto, plan.timeout, body) {
        Ok(Ended::Ran(ms)) => ms
            .into_iter()
            .flatten()
            .next()
            .ok_or_else(|| anyhow!("{degree}: no result from rank 0")),
        Ok(Ended::Launched { .. }) => bail!("{degree}: the ranks were launched, not run here"),
        Err(e) => Err(degree_fault(degree, e)),
    }
}

/// A degree's fault as the run's error, in one line after the degree
/// (`tp 2: `): a rank the launcher already named passes on its code; bad
/// input stays bad input (exit code 2).
fn degree_fault(degree: &str, fault: JobFault) -> anyhow::Error {
    let e = match fault {
        JobFault::Launch(e @ LaunchError::RankFailed { .. }) => {
            return anyhow!(Reported(e.exit_code())).context(format!("{degree}: {e}"));
        }
        JobFault::Launch(e) => anyhow!(e),
        JobFault::Unavailable(e) => anyhow!(e),
        other => anyhow!("{other}"),
    };
    e.context(degree.to_string())
}

/// Each degree's block on one GPU must fit its memory (GPU 0's, as every
/// degree uses GPUs 0..t); a GPU that cannot be asked passes.
fn check_gpus(plan: &LayerJob) -> anyhow::Result<()> {
    if !plan.backend.on_gpus() {
        return Ok(());
    }
    let Some(have) = ranks::gpu_memory(0) else {
        return Ok(());
    };
    for &t in &plan.tps {
        let (rank, check) = plan.memory_bytes(t, plan.dtype.size() as u128);
        parbench::limits::check_memory(
            rank + check,
            have as u128,
            "--hidden/--ffn/--seq/--microbatch-size",
            &format!("tp {t}: one rank's block on its GPU, with the unsharded check on GPU 0"),
            "GPU 0's memory",
        )
        .map_err(|e| UsageError(e.0))?;
    }
    Ok(())
}

/// The launcher of `--backend tcp` without a launcher around it: one job of
/// t local ranks per degree, each degree's row handed back through a file
/// and kept in --out as soon as its job ends.
fn tcp_launch(plan: &LayerJob) -> anyhow::Result<()> {
    preflight(plan, true, |t| t)?;
    let world = plan.tps.iter().copied().max().unwrap_or(1);
    let run_id = new_run_id("layers");
    let mut records = Records::begin(
        plan,
        ranks::run_meta("layers", &run_id, plan.backend, world),
    );
    // The ranks run `Degree` in the children; this process only waits.
    let body = Degree { plan, threads: 0 };
    match spawn_degrees(
        plan,
        &run_id,
        &|t| format!("tp {t}"),
        &plan.tps,
        &body,
        |rows| records.keep(rows),
    ) {
        Ok(()) => records.finish(),
        Err(e) => records.stopped(e),
    }
}

/// For each of `degrees` (worlds, each named by `name`: "tp 2", "tp 2 x
/// cp 2"), one job of that many ranks of this binary spawned on this
/// host, running `body`; rank 0's rows come back through a file and go to
/// `keep` as soon as the job ends. The first failure ends the loop and is
/// returned.
fn spawn_degrees<R: results::Record, B: RankBody>(
    plan: &LayerJob,
    run_id: &str,
    name: &dyn Fn(usize) -> String,
    degrees: &[usize],
    body: &B,
    mut keep: impl FnMut(Vec<R>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("{run_id}-rows"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut one = |t: usize| -> anyhow::Result<()> {
        let rows_dir = dir.join(format!("ranks{t}"));
        let job = LocalJob::of_current_exe(t)?
            .label(format!("bench-layers: {}", name(t)))
            .env(ENV_TP, t.to_string())
            .env(ENV_ROWS, &rows_dir)
            .env(ENV_RUN_ID, run_id);
        let ranks = ranks_of(plan, None, t, Some(job))?;
        ranks::run(ranks, Algo::Auto, plan.timeout, body).map_err(|e| degree_fault(&name(t), e))?;
        let got = read_rows::<R>(&rows_dir.join(R::FILE))
            .map_err(|e| anyhow!(e).context(format!("{}: reading rank 0's row", name(t))))?;
        keep(got)
    };
    let outcome = degrees.iter().try_for_each(|&t| one(t));
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// One degree as the launcher runs it on each rank of a job: the block on
/// the device beside the rank's communicator; rank 0 hands its measurement back.
struct Degree<'a> {
    plan: &'a LayerJob,
    /// Compute threads of each rank (the host's cores split among its ranks).
    threads: usize,
}

impl RankBody for Degree<'_> {
    type Out = Option<TpMeasurement>;
    fn run<C: RankComm>(&self, comm: &mut C) -> Result<Self::Out, CommError> {
        let dev = comm.device(self.plan.device_dtype(), self.threads)?;
        let m = measure_tp(&dev, comm, self.plan, self.threads).map_err(|e| match e {
            parbench::layers::LayerError::Comm(c) => c,
            other => CommError::Device(other.to_string()),
        })?;
        Ok((parbench::comm::Communicator::rank(comm) == 0).then_some(m))
    }
}

/// Checks a joined rank's world `t`: the degree its spawning launcher
/// named, or one the sweep (`--tp`, or `--ep` with `--experts`: `flag`)
/// lists under an external launcher.
fn job_degree(plan: &LayerJob, flag: &str, t: usize) -> anyhow::Result<()> {
    if let Ok(want) = std::env::var(ENV_TP) {
        if want != t.to_string() {
            bail!("spawned for {flag} {want} but the job has {t} ranks");
        }
    } else if !plan.tps.contains(&t) {
        return Err(UsageError(format!(
            "--{flag}: under a launcher the sweep runs the job's world ({t}), which --{flag} does not list"
        ))
        .into());
    }
    Ok(())
}

/// One rank of a job a launcher started (tcp, or nccl on one GPU): runs
/// the job's degree; rank 0 writes the row to the spawning launcher's
/// folder, or records it itself under an external launcher.
fn tcp_rank(plan: &LayerJob, ranks: Ranks) -> anyhow::Result<()> {
    let Some(info) = ranks.joined().cloned() else {
        bail!("a joined rank without its launcher's variables");
    };
    let backend = ranks.backend().name();
    let t = info.world;
    let spawned = std::env::var_os(ENV_ROWS);
    job_degree(plan, "tp", t)?;
    let local_ranks = launch::ranks_on_this_host(t);
    // Under an external launcher rank 0 writes --out; every rank checks the
    // host's memory before any allocates (the spawning launcher did both).
    if spawned.is_none() {
        preflight(plan, info.rank == 0, |_| local_ranks)?;
    }
    let threads = CpuCompute::threads_per_rank(local_ranks);
    let rank = info.rank;
    let mut meta = None;
    if spawned.is_none() && rank == 0 {
        meta = Some(Records::begin(
            plan,
            ranks::run_meta("layers", &new_run_id("layers"), ranks.backend(), t),
        ));
    }
    let body = Degree { plan, threads };
    let m = match ranks::run(ranks, Algo::Auto, plan.timeout, &body)? {
        Ended::Ran(ms) => ms.into_iter().flatten().next(),
        Ended::Launched { .. } => None,
    };
    let Some(m) = m else {
        return Ok(());
    };
    let rows = build_rows(plan, backend, &[m]);
    match (spawned, meta) {
        (Some(dir), _) => {
            append_rows(Path::new(&dir), &rows)?;
            Ok(())
        }
        (None, Some(mut records)) => {
            records.keep(rows)?;
            records.finish()
        }
        (None, None) => Ok(()),
    }
}

/// One rank of an mpirun job: the launcher starts MPI, whose world (as MPI
/// itself reports it) is the one degree; the rank checks it, --out and the
/// memory before it measures ([`MpiDegree`]); rank 0 records the row, with
/// the MPI library's version.
fn mpi_rank(plan: &LayerJob, backend: Backend) -> anyhow::Result<()> {
    let body = MpiDegree {
        plan,
        records: Mutex::new(None),
    };
    let outcome = mpi_outcomes(plan, backend, &body)?
        .into_iter()
        .next()
        .context("the MPI rank returned nothing")?;
    let records = body.records.into_inner().ok().flatten();
    match (outcome?, records) {
        (Some(m), Some(mut records)) => {
            records.keep(build_rows(plan, plan.backend.name(), &[m]))?;
            records.finish()
        }
        _ => Ok(()),
    }
}

/// Runs `body` on this process's rank of an mpirun job (MPI's world, one
/// degree): what it returned.
fn mpi_outcomes<B: RankBody>(
    plan: &LayerJob,
    backend: Backend,
    body: &B,
) -> anyhow::Result<Vec<B::Out>> {
    match ranks::run(
        Ranks::LibraryWorld { backend },
        Algo::Auto,
        plan.timeout,
        body,
    )? {
        Ended::Ran(out) => Ok(out),
        Ended::Launched { .. } => bail!("an MPI rank is started by mpirun, not spawned"),
    }
}

/// The degree on one rank of an mpirun job: what the other backends check
/// before their ranks start waits here for MPI's world. Bad input found
/// then is the rank's outcome (exit code 2), not a fault of the transport.
struct MpiDegree<'a> {
    plan: &'a LayerJob,
    /// Rank 0's run record, begun once the world is known.
    records: Mutex<Option<Records<'a>>>,
}

impl RankBody for MpiDegree<'_> {
    type Out = anyhow::Result<Option<TpMeasurement>>;
    fn run<C: RankComm>(&self, comm: &mut C) -> Result<Self::Out, CommError> {
        let (t, rank) = (comm.world(), comm.rank());
        let local_ranks = match self.started(t, rank, comm.library()) {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        let degree = Degree {
            plan: self.plan,
            threads: CpuCompute::threads_per_rank(local_ranks),
        };
        degree.run(comm).map(Ok)
    }
}

impl MpiDegree<'_> {
    /// Checks the world (--tp must list it), --out (on rank 0) and this
    /// host's memory, and begins rank 0's run record with the MPI library's
    /// version; the ranks on this host.
    fn started(&self, t: usize, rank: usize, library: Option<String>) -> anyhow::Result<usize> {
        let plan = self.plan;
        if !plan.tps.contains(&t) {
            return Err(UsageError(format!(
                "--tp: under mpirun the sweep runs the job's world ({t}), which --tp does not list"
            ))
            .into());
        }
        let local_ranks = launch::ranks_on_this_host(t);
        preflight(plan, rank == 0, |_| local_ranks)?;
        if rank == 0 {
            let mut meta = ranks::run_meta("layers", &new_run_id("layers"), plan.backend, t);
            meta.note_library(library.unwrap_or_default());
            let mut kept = self
                .records
                .lock()
                .map_err(|_| anyhow!("the run record was poisoned by a panic"))?;
            *kept = Some(Records::begin(plan, meta));
        }
        Ok(local_ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_degree_keeps_the_degrees_before_it() {
        let mut kept = Vec::new();
        let failed = sweep_degrees(
            &[1, 2, 4, 8],
            |t| {
                if t == 4 {
                    bail!("tp {t}: no peer");
                }
                Ok(t * 10)
            },
            |v| {
                kept.push(v);
                Ok(())
            },
        );
        assert_eq!(kept, vec![10, 20]);
        assert_eq!(
            failed.map(|e| e.to_string()).as_deref(),
            Some("tp 4: no peer")
        );
        let mut all = Vec::new();
        let failed = sweep_degrees(&[1, 2], Ok::<_, anyhow::Error>, |v| {
            all.push(v);
            Ok(())
        });
        assert_eq!((all, failed.is_none()), (vec![1, 2], true));
    }
}
