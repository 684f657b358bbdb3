//! Starting the stage ranks on a backend, and what each rank runs.

use crate::cli::{Args, PipelineJob};
use crate::output::Recorder;
use anyhow::{anyhow, bail, Result};
use parbench::comm::mesh::MeshShape;
use parbench::comm::{Algo, CommBuffer, CommError, Communicator, DType, Io, ReduceOp};
use parbench::compute::cpu::CpuCompute;
use parbench::compute::Compute;
use parbench::launch::flags::Backend;
use parbench::launch::ranks::{self, Ended, JobFault, RankBody, RankComm, Ranks, Wanted};
use parbench::launch::{self, RankInfo};
use parbench::limits::bytes_text;
use parbench::measure::clock_sync::TimeBase;
use parbench::pipeline::{run_composed, run_rank, ComposedConfig, ComposedRecord};
use parbench::results::{self, PipelineRow};
use std::sync::Mutex;

/// A failure the launcher already named on stderr: exit with its code.
use parbench::launch::Reported;
/// Bad input found before anything runs (an unwritable --out, more memory
/// than the machine has, no GPU): one line, exit code 2.
use parbench::launch::UsageError as Refused;

/// Checks --out (when this process writes it) and the memory the largest
/// run takes on this host, `host(per_rank)` bytes from each run's per-rank
/// figures, before anything is allocated.
fn preflight(
    args: &Args,
    plan: &PipelineJob,
    writes: bool,
    host: impl Fn(&[u128]) -> u128,
) -> Result<()> {
    if writes {
        results::prepare_out::<PipelineRow>(&args.out)
            .map_err(|e| Refused(format!("--out {e}")))?;
    }
    for run in &plan.runs {
        let (per_rank, reference) = match &plan.composed {
            None => (run.cfg.memory_bytes_per_rank(), run.cfg.reference_bytes()),
            // Every pipeline of the mesh holds the same shares.
            Some(c) => {
                let one = c.memory_bytes_per_rank(&run.cfg.schedule);
                let replicas = c.dp * c.tp;
                let all: Vec<u128> = (0..replicas).flat_map(|_| one.iter().copied()).collect();
                (all, c.reference_bytes(&run.cfg.schedule))
            }
        };
        let need = host(&per_rank) + reference;
        let flags = if plan.composed.is_some() {
            "--dp/--tp/--hidden/--heads/--ffn/--seq/--microbatch-size/--microbatches/--layers-per-stage"
        } else {
            "--hidden/--microbatch-size/--microbatches/--layers-per-stage"
        };
        parbench::limits::check_host_memory(
            need,
            flags,
            &format!(
                "{} S{} M{}: weights, kept activations and messages of the ranks on this host, {} at most per rank, and the gradient check's reference",
                run.cfg.schedule.name,
                run.cfg.schedule.ranks(),
                run.cfg.schedule.microbatches,
                bytes_text(per_rank.iter().copied().max().unwrap_or(0))
            ),
        )
        .map_err(|e| Refused(e.0))?;
    }
    Ok(())
}

/// Every rank's figure, summed: all ranks on this host.
fn all_ranks(per_rank: &[u128]) -> u128 {
    per_rank.iter().sum()
}

/// Runs every planned run on the ranks the launcher starts for the
/// backend `--backend` names: one per stage rank.
pub fn run(args: &Args, plan: &PipelineJob) -> Result<()> {
    parbench::launch::check_env_settings()?;
    let backend: Backend = args
        .backend
        .parse()
        .map_err(|_| anyhow!("unknown backend '{}'", args.backend))?;
    let joined = RankInfo::from_env().map_err(|e| Refused(e.to_string()))?;
    let too_many_gpus = |stages: usize, gpus: usize| {
        format!("--backend {backend}: {stages} stages but {gpus} GPU(s)")
    };
    let wanted = Wanted {
        ranks: Some(args.nprocs.unwrap_or(plan.ranks)),
        gpus: Some(plan.ranks),
        default: plan.ranks,
        job: None,
        too_many_gpus: &too_many_gpus,
    };
    match Ranks::choose(backend, joined, wanted)? {
        ranks if ranks.backend().on_gpus() => run_gpus(args, plan, ranks),
        ranks @ Ranks::Here { .. } => run_threads(args, plan, ranks),
        ranks @ (Ranks::Spawn(_) | Ranks::Job(_) | Ranks::Joined { .. }) => {
            run_processes(args, plan, ranks)
        }
        ranks @ Ranks::LibraryWorld { .. } => run_library_world(args, plan, ranks),
    }
}

/// Without `--stages` on GPUs: one stage per visible GPU (a machine
/// without a driver is one line, exit code 2; a build without CUDA the
/// backend's refusal). Other backends keep the default.
pub fn default_stages(args: &mut Args) -> Result<(), String> {
    let Ok(backend) = args.backend.parse::<Backend>() else {
        return Ok(());
    };
    if !backend.on_gpus() || args.stages.is_some() || args.schedule_csv.is_some() {
        return Ok(());
    }
    backend.require_built().map_err(|e| e.0)?;
    let gpus = ranks::visible_gpus().map_err(|e| format!("--backend {backend}: {e}"))?;
    if gpus == 0 {
        return Err(format!("--backend {backend}: no visible GPU"));
    }
    args.stages = Some(gpus);
    Ok(())
}

/// Compute threads of each stage rank: `--threads`, or the cores divided
/// among the stages (one each when stages >= cores), so that a stage never
/// computes on another's cores.
fn threads(args: &Args, ranks: usize) -> usize {
    args.threads
        .unwrap_or_else(|| CpuCompute::threads_per_rank(ranks))
        .max(1)
}

/// Pins the calling thread to core `rank` when every rank has a core of its
/// own and computes on one thread; otherwise the scheduler shares the cores.
fn pin(rank: usize, ranks: usize, threads: usize, enabled: bool) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if !enabled || threads != 1 || ranks > cores {
        return;
    }
    // SAFETY: cpu_set_t is plain data, zeroed is a valid empty set; CPU_SET
    // stays inside it for rank < cores <= CPU_SETSIZE; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(rank % cores, &mut set);
        // Failing to pin (a restricted cpuset) only loses isolation.
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// What each rank runs: every planned run in order over one communicator,
/// on time base `base` (threads of one process share a clock; processes
/// estimate their offsets); rank 0 hands each record to `record`.
fn rank_main<Cm, C>(
    comm: &mut Cm,
    compute: &C,
    plan: &PipelineJob,
    base: TimeBase,
    mut record: impl FnMut(&crate::cli::RunPlan, &str, &parbench::pipeline::RunRecord) -> Result<()>,
) -> Result<(), CommError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    let rank = comm.rank();
    for run in &plan.runs {
        let rec = run_rank(comm, compute, &run.cfg, base).map_err(|e| e.into_comm(rank))?;
        if let Some(rec) = rec {
            let wire = comm.wire();
            record(run, &wire, &rec).map_err(|e| records_failed(rank, &e))?;
        }
    }
    Ok(())
}

/// What each rank of a composed run runs: every planned run in order, each
/// a composed step over the world (its stages compute on the CPU: the
/// mesh's groups move host buffers); world rank 0 hands each record to
/// `record`.
fn composed_main<Cm: Communicator>(
    comm: &mut Cm,
    threads: usize,
    plan: &PipelineJob,
    job: &crate::cli::ComposedJob,
    base: TimeBase,
    mut record: impl FnMut(&crate::cli::RunPlan, &str, &ComposedRecord) -> Result<()>,
) -> Result<(), CommError> {
    let rank = comm.rank();
    let cpu = CpuCompute::new(DType::F32, threads)
        .map_err(|e| CommError::Device(format!("rank {rank}: {e}")))?;
    for run in &plan.runs {
        let mesh = MeshShape::new(job.dp, job.tp, run.cfg.schedule.ranks(), job.order)
            .map_err(CommError::InvalidArgument)?;
        let cfg = ComposedConfig {
            mesh,
            stages: job.stages.clone(),
            pipeline: run.cfg.clone(),
            check: job.check,
            algo: Algo::Auto,
            corrupt_grad_rank: job.corrupt_grad_rank,
        };
        let rec = run_composed(comm, &cpu, &cfg, base).map_err(|e| e.into_comm(rank))?;
        if let Some(rec) = rec {
            let wire = comm.wire();
            record(run, &wire, &rec).map_err(|e| records_failed(rank, &e))?;
        }
    }
    Ok(())
}

/// The stage ranks as the launcher runs them: each computes on the device
/// beside its communicator; rank 0 starts the records once its
/// communicator is up (a failed start records nothing) and keeps each run.
struct Stages<'a> {
    args: &'a Args,
    plan: &'a PipelineJob,
    backend: Backend,
    /// The compute named in the records, when not the device's own name.
    compute_label: Option<&'static str>,
    threads: usize,
    base: TimeBase,
    /// Threads of this process pin themselves; a joined rank was pinned
    /// before it connected (the transport's threads inherit its core).
    pin_each: bool,
    /// Under mpirun the world is known once MPI has started: each rank
    /// checks it, --out and this host's memory first ([`Stages::joined`]),
    /// with this many ranks on this host.
    check_in_body: Option<u128>,
    recorder: Mutex<Option<Recorder>>,
}

impl RankBody for Stages<'_> {
    /// Bad input found once the world was known (exit code 2).
    type Out = Option<anyhow::Error>;
    fn run<C: RankComm>(&self, comm: &mut C) -> Result<Self::Out, CommError> {
        let rank = comm.rank();
        if let Some(here) = self.check_in_body {
            if let Some(refused) = self.joined(comm, here)? {
                return Ok(Some(refused));
            }
        }
        if self.pin_each {
            pin(rank, self.plan.ranks, self.threads, self.args.pin);
        }
        let dev = comm.device(DType::F32, self.threads)?;
        if rank == 0 {
            let name = self
                .compute_label
                .map_or_else(|| dev.name(), str::to_string);
            let mut started = Recorder::new(self.args, self.plan, self.backend, &name);
            if let Some(library) = comm.library() {
                started.note_library(&library);
            }
            if let Ok(mut r) = self.recorder.lock() {
                *r = Some(started);
            }
        }
        let recorder = || self.recorder.lock().map_err(|_| poisoned());
        let ran = match &self.plan.composed {
            None => rank_main(
                comm,
                &dev,
                self.plan,
                self.base,
                |run, wire, rec| match recorder()?.as_mut() {
                    Some(r) => r.record(run, wire, rec, None),
                    None => Ok(()),
                },
            ),
            Some(job) => composed_main(
                comm,
                self.threads,
                self.plan,
                job,
                self.base,
                |run, wire, rec| match recorder()?.as_mut() {
                    Some(r) => r.record(run, wire, &rec.record, Some((job, rec))),
                    None => Ok(()),
                },
            ),
        };
        ran.map(|()| None)
    }
}

impl Stages<'_> {
    /// What the other backends check before their ranks start, on a rank
    /// that learnt its world from MPI: the world is the schedule's (`here`
    /// ranks on this host), --out (rank 0) and this host's memory. The
    /// ranks agree before any measures, so that one rank's refusal ends
    /// the job at once: the lowest refusing rank names it, and every rank
    /// ends with exit code 2.
    fn joined<C: Communicator>(
        &self,
        comm: &mut C,
        here: u128,
    ) -> Result<Option<anyhow::Error>, CommError> {
        let (rank, world) = (comm.rank(), comm.world());
        let mine = if world != self.plan.ranks {
            let ranks = self.plan.ranks;
            Err(Refused(match &self.plan.composed {
                Some(c) => format!(
                    "--backend mpi: the job has {world} ranks but the world is dp {} x tp {} x {} stage ranks = {ranks} (start it with mpirun -np {ranks})",
                    c.dp,
                    c.tp,
                    ranks / (c.dp * c.tp).max(1)
                ),
                None => format!(
                    "--backend mpi: the job has {world} ranks but the schedule has {ranks} (start it with mpirun -np {ranks})"
                ),
            })
            .into())
        } else {
            preflight(self.args, self.plan, rank == 0, |p| {
                p.iter().copied().max().unwrap_or(0) * here
            })
        };
        let Some(first) = first_refusing(comm, mine.is_err())? else {
            return Ok(None);
        };
        if let (Err(e), true) = (&mine, first == rank) {
            crate::say(e);
        }
        // mpirun ends the job on the first rank's exit: the line is out
        // before any rank leaves.
        comm.barrier()?;
        Ok(Some(Reported(parbench::launch::EXIT_USAGE).into()))
    }
}

/// The lowest rank of `comm` that says `refused`, if any (a collective of
/// the world).
fn first_refusing<C: Communicator>(
    comm: &mut C,
    refused: bool,
) -> Result<Option<usize>, CommError> {
    let (rank, world) = (comm.rank(), comm.world());
    let mut v = comm.alloc(8)?;
    let mine = if refused { rank } else { world } as f64;
    v.write_from_host(&mine.to_le_bytes())?;
    comm.all_reduce(Io::InPlace(&mut v), 1, DType::F64, ReduceOp::Min)?;
    comm.sync()?;
    let mut b = [0u8; 8];
    v.read_to_host(&mut b)?;
    let first = f64::from_le_bytes(b);
    Ok((first < world as f64).then_some(first as usize))
}

/// Rank 0 could not write its records (a full disk, a folder gone): an
/// I/O error of the records, not of the job's setup.
fn records_failed(rank: usize, e: &anyhow::Error) -> CommError {
    CommError::Io(std::io::Error::other(format!(
        "rank {rank}: writing the records: {e:#}"
    )))
}

fn poisoned() -> anyhow::Error {
    anyhow!("the recorder was poisoned by a panic")
}

impl Stages<'_> {
    /// Runs the stage ranks `ranks` describes, then writes rank 0's records
    /// where this process holds them.
    fn run_on(self, ranks: Ranks) -> Result<()> {
        // Spawned ranks take this id, so that the record a rank 0 killed
        // outright leaves unended is the one this launcher completes.
        let spawned_id = matches!(ranks, Ranks::Spawn(_)).then(|| results::new_run_id("pipeline"));
        match ranks::run(ranks, Algo::Auto, self.plan.timeout, &self) {
            Ok(Ended::Ran(outs)) => {
                if let Some(refused) = outs.into_iter().flatten().next() {
                    return Err(refused);
                }
            }
            Ok(Ended::Launched { code: 0, .. }) => return Ok(()),
            // The launcher named the rank; its code is the run's.
            Ok(Ended::Launched { code, failure }) => {
                if let (Some(id), Some(why)) = (&spawned_id, failure) {
                    let _ = results::record_seen_death(&self.args.out, id, &why);
                }
                return Err(Reported(code).into());
            }
            Err(JobFault::Launch(e)) => return Err(e.into()),
            // The first rank at fault explains best; the others report losing it.
            Err(e) => bail!("{e}"),
        }
        let recorder = self.recorder.into_inner().map_err(|_| poisoned())?;
        recorder.map_or(Ok(()), Recorder::finish)
    }
}

fn run_threads(args: &Args, plan: &PipelineJob, ranks: Ranks) -> Result<()> {
    preflight(args, plan, true, all_ranks)?;
    let stages = Stages {
        args,
        plan,
        backend: ranks.backend(),
        compute_label: None,
        threads: threads(args, plan.ranks),
        base: TimeBase::Shared,
        pin_each: true,
        check_in_body: None,
        recorder: Mutex::new(None),
    };
    stages.run_on(ranks)
}

/// One process per stage: `--nprocs N` (default S) spawns the ranks on this
/// host; under torchrun, mpirun or srun their variables give the rank.
fn run_processes(args: &Args, plan: &PipelineJob, ranks: Ranks) -> Result<()> {
    match ranks.joined() {
        // The spawning launcher checks for all its ranks, before they start.
        None => preflight(args, plan, true, all_ranks)?,
        Some(i) if i.source != launch::LaunchSource::Spawned => {
            let here = launch::ranks_on_this_host(i.world) as u128;
            preflight(args, plan, i.prints(), |p| {
                p.iter().copied().max().unwrap_or(0) * here
            })?
        }
        Some(_) => {}
    }
    let threads = threads(args, plan.ranks);
    if let Some(info) = ranks.joined() {
        check_joined_world(info, plan)?;
        // Ranks on this host share its cores; without a local rank, assume all do.
        pin(
            info.local_rank.unwrap_or(info.rank),
            plan.ranks,
            threads,
            args.pin,
        );
    }
    let stages = Stages {
        args,
        plan,
        backend: ranks.backend(),
        compute_label: None,
        threads,
        base: TimeBase::Estimated,
        pin_each: false,
        check_in_body: None,
        recorder: Mutex::new(None),
    };
    stages.run_on(ranks)
}

/// The world a launcher started must be the schedule's.
fn check_joined_world(info: &RankInfo, plan: &PipelineJob) -> Result<()> {
    if info.world != plan.ranks {
        bail!(
            "the job has {} ranks but the schedule has {} (set --stages or --nprocs to match)",
            info.world,
            plan.ranks
        );
    }
    Ok(())
}

/// One thread and one NCCL communicator per GPU of this process (GPUs
/// 0..S), each stage computing with cuBLASLt on its own GPU in f32; under
/// a launcher, this process's one stage rank on its GPU.
fn run_gpus(args: &Args, plan: &PipelineJob, ranks: Ranks) -> Result<()> {
    if let Some(info) = ranks.joined() {
        check_joined_world(info, plan)?;
    }
    let writes = ranks.joined().is_none_or(RankInfo::prints);
    preflight(args, plan, writes, |_| 0)?;
    let gpu = ranks.joined().map_or(0, |i| i.local_rank.unwrap_or(0));
    if let Some(have) = ranks::gpu_memory(gpu) {
        for run in &plan.runs {
            let per_gpu = run
                .cfg
                .memory_bytes_per_rank()
                .iter()
                .copied()
                .max()
                .unwrap_or(0);
            parbench::limits::check_memory(
                per_gpu + run.cfg.reference_bytes(),
                have as u128,
                "--hidden/--microbatch-size/--microbatches/--layers-per-stage",
                "one stage rank's weights, kept activations and messages, with the reference on GPU 0",
                "GPU 0's memory",
            )
            .map_err(|e| Refused(e.0))?;
        }
    }
    let stages = Stages {
        args,
        plan,
        backend: ranks.backend(),
        compute_label: Some("cuda (cuBLASLt, f32)"),
        threads: 0,
        // Threads of one process share a clock; processes estimate offsets.
        base: match ranks.joined() {
            None => TimeBase::Shared,
            Some(_) => TimeBase::Estimated,
        },
        pin_each: false,
        check_in_body: None,
        recorder: Mutex::new(None),
    };
    stages.run_on(ranks)
}

/// One rank of an mpirun job (`--features mpi`): MPI gives the world, which
/// each rank checks before it measures ([`Stages::joined`]); processes are
/// treated as on separate hosts (offsets estimated). The ranks on this
/// host (the launcher's count, else the whole job) split its cores.
fn run_library_world(args: &Args, plan: &PipelineJob, ranks: Ranks) -> Result<()> {
    let here = launch::ranks_on_this_host(plan.ranks);
    let stages = Stages {
        args,
        plan,
        backend: ranks.backend(),
        compute_label: None,
        threads: threads(args, here),
        base: TimeBase::Estimated,
        pin_each: false,
        check_in_body: Some(here as u128),
        recorder: Mutex::new(None),
    };
    stages.run_on(ranks)
}
