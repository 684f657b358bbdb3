//! `bench-layers`: Megatron tensor-parallel transformer blocks at TP 1, 2,
//! 4, 8 on any backend: compute and communication time per block and per
//! token, checked against the unsharded block, beside the alpha-beta model
//! of the same wire. See the README's bench-layers section.
//!
//! How each backend sweeps the degrees:
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
//! Cores: ranks on one host split its cores evenly
//! ([`CpuCompute::threads_per_rank`]), so t ranks never oversubscribe the
//! machine and TP = 1 uses every core.

mod cli;
mod output;
mod sweep;

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use cli::{Backend, Cli, Plan, UsageError};
use parbench::comm::{local, Algo, CommError};
use parbench::compute::cpu::CpuCompute;
use parbench::launch::{LocalJob, RankInfo};
use parbench::results::{append_rows, new_run_id, read_rows, record_run, LayerRow, RunMeta};
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
    // The noise guard's window starts here: run.json records the CPU time
    // other processes took while the whole run measured.
    parbench::measure::noise::mark_start();
    // mpirun's spelling `-np N` is one flag here, not `-n p` (iterations).
    let cli = match Cli::try_parse_from(parbench::term::rewrite_np(std::env::args_os())) {
        Ok(c) => c,
        Err(e) => {
            // Help and version are not errors; everything else exits 2.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    match run(&cli) {
        Ok(()) => {}
        Err(e) => {
            if let Some(u) = e.downcast_ref::<UsageError>() {
                eprintln!("bench-layers: {u}");
                std::process::exit(2);
            }
            eprintln!("bench-layers: {e:#}");
            std::process::exit(1);
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let rank = RankInfo::from_env().map_err(|e| UsageError(e.to_string()))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // On GPUs the ranks available are the visible GPUs, not the cores.
    let default_ranks = if cli.backend.eq_ignore_ascii_case("nccl") {
        visible_gpus()?
    } else {
        rank.as_ref().map_or(cores, |r| r.world)
    };
    let plan = cli.plan(default_ranks)?;
    match (plan.backend, rank) {
        (Backend::Local, _) => finish_sweep(&plan, sweep_local(&plan)),
        (Backend::Tcp, Some(info)) => tcp_rank(&plan, &info),
        (Backend::Tcp, None) => tcp_launch(&plan),
        (Backend::Nccl, _) => {
            if let Some(&t) = plan.tps.iter().find(|&&t| t > default_ranks) {
                return Err(UsageError(format!(
                    "--tp {t}: this machine has {default_ranks} visible GPU(s)"
                ))
                .into());
            }
            finish_sweep(&plan, sweep_nccl(&plan))
        }
        (Backend::Mpi, _) => mpi_rank(&plan),
    }
}

/// Records the rows of the degrees measured before a sweep stopped, then
/// reports why it stopped: a degree that fails loses no earlier one.
fn finish_sweep(
    plan: &Plan,
    (ms, failed): (Vec<TpMeasurement>, Option<anyhow::Error>),
) -> anyhow::Result<()> {
    if !ms.is_empty() {
        let world = ms.iter().map(|m| m.tp).max().unwrap_or(1);
        let backend = plan.backend.name();
        let rows = build_rows(plan, backend, &ms);
        finish(plan, &new_run_id("layers"), backend, world, rows)?;
    }
    failed.map_or(Ok(()), Err)
}

/// Runs `measure` for each degree in order until one fails: the results of
/// the degrees before it, and its error.
fn sweep_degrees<T>(
    tps: &[usize],
    mut measure: impl FnMut(usize) -> anyhow::Result<T>,
) -> (Vec<T>, Option<anyhow::Error>) {
    let mut out = Vec::new();
    for &t in tps {
        match measure(t) {
            Ok(m) => out.push(m),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// The GPUs this process sees, for `--backend nccl`'s default degrees; no
/// driver (or a build without CUDA) is one line, exit code 2.
#[cfg(feature = "cuda")]
fn visible_gpus() -> anyhow::Result<usize> {
    parbench::gpu::device_count().map_err(|e| UsageError(format!("--backend nccl: {e}")).into())
}

#[cfg(not(feature = "cuda"))]
fn visible_gpus() -> anyhow::Result<usize> {
    Err(UsageError(
        "--backend nccl: this build has no CUDA support (rebuild with --features cuda)".into(),
    )
    .into())
}

fn build_rows(plan: &Plan, backend: &str, ms: &[TpMeasurement]) -> Vec<LayerRow> {
    let id = std::env::var(ENV_RUN_ID).unwrap_or_else(|_| new_run_id("layers"));
    output::rows(plan, &id, backend, ms)
}

/// Prints the table and records the rows and the run.
fn finish(
    plan: &Plan,
    run_id: &str,
    backend: &str,
    world: usize,
    rows: Vec<LayerRow>,
) -> anyhow::Result<()> {
    finish_run(plan, RunMeta::start("layers", run_id, backend, world), rows)
}

/// [`finish`] with a run record the caller started (and may have added to).
fn finish_run(plan: &Plan, mut meta: RunMeta, mut rows: Vec<LayerRow>) -> anyhow::Result<()> {
    let run_id = meta.run_id.clone();
    for r in &mut rows {
        r.run_id = run_id.clone();
    }
    output::fill_speedup(&mut rows);
    parbench::out!("{}", output::table(plan, &rows));
    let path =
        append_rows(&plan.out, &rows).with_context(|| format!("writing {}", plan.out.display()))?;
    meta.extra.insert("block".into(), output::block_json(plan));
    meta.finish();
    record_run(&plan.out, &meta)?;
    parbench::outln!("# wrote {} rows to {}", rows.len(), path.display());
    Ok(())
}

/// The first error of a failed local run: the rank that caused it, not the
/// ranks that lost it.
fn root_cause(
    errors: &Mutex<Vec<(usize, String)>>,
    results: Vec<Result<TpMeasurement, CommError>>,
) -> anyhow::Error {
    let own = errors.lock().map(|e| e.clone()).unwrap_or_default();
    if let Some((rank, msg)) = own.into_iter().min_by_key(|e| e.0) {
        return anyhow!("rank {rank}: {msg}");
    }
    let mut errs: Vec<CommError> = results.into_iter().filter_map(Result::err).collect();
    errs.sort_by_key(|e| matches!(e, CommError::PeerLost { .. }));
    errs.into_iter()
        .next()
        .map_or_else(|| anyhow!("no rank returned a result"), anyhow::Error::from)
}

/// Each degree on t threads of this process.
fn sweep_local(plan: &Plan) -> (Vec<TpMeasurement>, Option<anyhow::Error>) {
    sweep_degrees(&plan.tps, |t| {
        let threads = CpuCompute::threads_per_rank(t);
        let errors = Mutex::new(Vec::new());
        let results = local::run(t, Algo::Auto, plan.timeout, |comm| {
            let rank = parbench::comm::Communicator::rank(comm);
            let fail = |e: String| {
                if let Ok(mut v) = errors.lock() {
                    v.push((rank, e.clone()));
                }
                CommError::Device(e)
            };
            let dev = CpuCompute::new(plan.dtype, threads).map_err(|e| fail(e.to_string()))?;
            measure_tp(&dev, comm, plan, threads).map_err(|e| match e {
                parbench::layers::LayerError::Comm(c) => c,
                other => fail(other.to_string()),
            })
        });
        if results.iter().any(Result::is_err) {
            return Err(root_cause(&errors, results).context(format!("tp {t}")));
        }
        let first = results.into_iter().next().and_then(Result::ok);
        first.ok_or_else(|| anyhow!("tp {t}: no result from rank 0"))
    })
}

/// Each degree on GPUs 0..t of this process, one thread and one NCCL
/// communicator per GPU (nccl-tests' `-g` way), the block computing on the
/// communicator's stream.
#[cfg(feature = "cuda")]
fn sweep_nccl(plan: &Plan) -> (Vec<TpMeasurement>, Option<anyhow::Error>) {
    use parbench::comm::nccl::NcclComm;
    use parbench::compute::cuda::CudaCompute;
    sweep_degrees(&plan.tps, |t| {
        let ordinals: Vec<usize> = (0..t).collect();
        let comms =
            NcclComm::init_all(&ordinals, plan.timeout).with_context(|| format!("tp {t}"))?;
        let results: Vec<Result<TpMeasurement, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    s.spawn(move || {
                        let mut dev = CudaCompute::on(comm.gpu().clone(), plan.dtype)
                            .map_err(|e| e.to_string())?;
                        dev.set_timeout(plan.timeout);
                        measure_tp(&dev, &mut comm, plan, 0).map_err(|e| e.to_string())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("rank panicked".into())))
                .collect()
        });
        let mut first = None;
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(m) if rank == 0 => first = Some(m),
                Ok(_) => {}
                Err(e) => bail!("tp {t}: rank {rank}: {e}"),
            }
        }
        first.ok_or_else(|| anyhow!("tp {t}: no result from rank 0"))
    })
}

#[cfg(not(feature = "cuda"))]
fn sweep_nccl(_: &Plan) -> (Vec<TpMeasurement>, Option<anyhow::Error>) {
    // visible_gpus refuses first; kept so the match in `run` is total.
    (Vec::new(), visible_gpus().err())
}

/// The launcher of `--backend tcp` without a launcher around it: one job of
/// t local ranks per degree, rows handed back through files.
fn tcp_launch(plan: &Plan) -> anyhow::Result<()> {
    let run_id = new_run_id("layers");
    let dir = std::env::temp_dir().join(format!("{run_id}-rows"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut rows = Vec::new();
    let mut outcome = Ok(());
    for &t in &plan.tps {
        let rows_dir = dir.join(format!("tp{t}"));
        let job = LocalJob::of_current_exe(t)?
            .env(ENV_TP, t.to_string())
            .env(ENV_ROWS, &rows_dir)
            .env(ENV_RUN_ID, &run_id);
        if let Err(e) = job.run() {
            outcome = Err(anyhow!(e).context(format!("tp {t}")));
            break;
        }
        match read_rows::<LayerRow>(&rows_dir.join("layers.csv")) {
            Ok(got) => rows.extend(got),
            Err(e) => {
                outcome = Err(anyhow!(e).context(format!("tp {t}: reading rank 0's row")));
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    outcome?;
    let world = plan.tps.iter().copied().max().unwrap_or(1);
    finish(plan, &run_id, "tcp", world, rows)
}

/// One rank of a tcp job: runs the job's degree; rank 0 writes the row to
/// the launcher's folder, or records it itself under an external launcher.
fn tcp_rank(plan: &Plan, info: &RankInfo) -> anyhow::Result<()> {
    let t = info.world;
    if let Ok(want) = std::env::var(ENV_TP) {
        if want != t.to_string() {
            bail!("spawned for tp {want} but the job has {t} ranks");
        }
    } else if !plan.tps.contains(&t) {
        return Err(UsageError(format!(
            "--tp: under a launcher the sweep runs the job's world ({t}), which --tp does not list"
        ))
        .into());
    }
    let local_ranks = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(t);
    let threads = CpuCompute::threads_per_rank(local_ranks);
    let mut comm = parbench::comm::tcp::comm(info, Algo::Auto, plan.timeout)?;
    let dev = CpuCompute::new(plan.dtype, threads)?;
    let m = measure_tp(&dev, &mut comm, plan, threads)?;
    if info.rank != 0 {
        return Ok(());
    }
    let rows = build_rows(plan, "tcp", &[m]);
    match std::env::var_os(ENV_ROWS) {
        Some(dir) => {
            append_rows(Path::new(&dir), &rows)?;
            Ok(())
        }
        None => finish(plan, &new_run_id("layers"), "tcp", t, rows),
    }
}

/// The local ranks an MPI launcher started on this host (Open MPI, then
/// MPICH/Hydra), so that the ranks split this host's cores; the job's world
/// when neither says.
#[cfg(feature = "mpi")]
fn mpi_local_ranks(world: usize) -> usize {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
        .filter(|&n: &usize| n >= 1)
        .unwrap_or(world)
}

/// One rank of an mpirun job: the job's world (as MPI reports it) is the one
/// degree; rank 0 records the row, with the MPI library's version.
#[cfg(feature = "mpi")]
fn mpi_rank(plan: &Plan) -> anyhow::Result<()> {
    use parbench::comm::Communicator;
    let mut comm = parbench::comm::mpi::MpiComm::init(plan.timeout)?;
    let t = comm.world();
    if !plan.tps.contains(&t) {
        return Err(UsageError(format!(
            "--tp: under mpirun the sweep runs the job's world ({t}), which --tp does not list"
        ))
        .into());
    }
    let threads = CpuCompute::threads_per_rank(mpi_local_ranks(t));
    let dev = CpuCompute::new(plan.dtype, threads)?;
    let m = measure_tp(&dev, &mut comm, plan, threads)
        .with_context(|| format!("rank {}", comm.rank()))?;
    if comm.rank() != 0 {
        return Ok(());
    }
    let run_id = new_run_id("layers");
    let rows = build_rows(plan, "mpi", &[m]);
    let mut meta = RunMeta::start("layers", &run_id, "mpi", t);
    meta.versions
        .insert("mpi".into(), comm.library().to_string());
    finish_run(plan, meta, rows)
}

#[cfg(not(feature = "mpi"))]
fn mpi_rank(_: &Plan) -> anyhow::Result<()> {
    Err(UsageError(
        "--backend mpi: this build has no MPI support (rebuild with --features mpi; needs libopenmpi-dev)"
            .into(),
    )
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_degree_keeps_the_degrees_before_it() {
        let (done, failed) = sweep_degrees(&[1, 2, 4, 8], |t| {
            if t == 4 {
                bail!("tp {t}: no peer");
            }
            Ok(t * 10)
        });
        assert_eq!(done, vec![10, 20]);
        assert_eq!(
            failed.map(|e| e.to_string()).as_deref(),
            Some("tp 4: no peer")
        );
        let (done, failed) = sweep_degrees(&[1, 2], Ok::<_, anyhow::Error>);
        assert_eq!((done, failed.is_none()), (vec![1, 2], true));
    }
}
