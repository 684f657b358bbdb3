//! Starting or joining the ranks of each backend, running the sweep on every
//! rank, and writing the records from rank 0.

use crate::cli::{Backend, Plan};
use crate::summary::{self, Summary};
use crate::sweep::{self, Outcome, RunIds};
use crate::wire::{self as wire_mod, WireFigures};
use anyhow::{Context, Result};
use parbench::comm::{CommResult, Communicator};
use parbench::launch;
use parbench::measure::noise::{CpuSnapshot, ForeignCpu};
use parbench::results::{self, RunMeta};

/// A problem with what the user asked for, found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// How a run ended on this process.
pub enum Finished {
    /// This process ran a rank (or all ranks): wrong elements summed over
    /// ranks, as rank 0 saw them (0 on the other processes).
    Ran { wrong: u64 },
    /// This process spawned the ranks (`--backend tcp -np N`): pass on the
    /// exit code of the first rank that failed, or 0. The rank already said why.
    Launched { code: i32 },
}

/// What rank 0 brings back from its sweep.
pub struct RankReport {
    backend: String,
    wire_name: String,
    world: usize,
    wire: WireFigures,
    outcome: Outcome,
    summary: Summary,
}

/// Runs the plan on the chosen backend.
pub fn run(plan: &Plan) -> Result<Finished> {
    let run_id = results::new_run_id("collectives");
    let joined = launch::RankInfo::from_env().map_err(|e| UsageError(e.to_string()))?;
    crate::nccl_flags::check_backend(plan, joined.is_some()).map_err(UsageError)?;
    if plan.links {
        return crate::links::run(plan, &run_id, joined);
    }
    match plan.backend {
        // Under a launcher (torchrun, mpirun, srun, a spawning parent) every
        // process is one rank: that is the tcp backend.
        Backend::Auto if joined.is_some() => run_tcp(plan, &run_id, joined),
        Backend::Auto | Backend::Local => run_local(plan, &run_id),
        Backend::Tcp => run_tcp(plan, &run_id, joined),
        Backend::Nccl => run_nccl(plan, &run_id, joined),
        Backend::Mpi => run_mpi(plan, &run_id),
    }
}

/// Default number of ranks: the CPU cores, at least 2.
pub fn default_ranks() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2)
}

fn run_local(plan: &Plan, run_id: &str) -> Result<Finished> {
    let world = plan.nprocs.unwrap_or_else(default_ranks);
    plan.sweep
        .check_world(world)
        .map_err(|e| UsageError(e.to_string()))?;
    let mut meta = RunMeta::start("collectives", run_id, "local", world);
    let results = parbench::comm::local::run(world, plan.algo, plan.sweep.timeout, |comm| {
        rank_main(comm, plan, run_id)
    });
    let report = first_report(results)?;
    finish(plan, &mut meta, report)
}

/// Joins the job the launcher variables describe, or spawns `-np` ranks of
/// this binary on loopback (they join) and waits for them.
fn run_tcp(plan: &Plan, run_id: &str, joined: Option<launch::RankInfo>) -> Result<Finished> {
    let Some(info) = joined else {
        let world = plan.nprocs.unwrap_or_else(default_ranks);
        plan.sweep
            .check_world(world)
            .map_err(|e| UsageError(e.to_string()))?;
        return match launch::spawn_local_ranks(world, &[]) {
            Ok(status) => Ok(Finished::Launched {
                code: launch::exit_code(status),
            }),
            Err(launch::LaunchError::RankFailed { status, .. }) => Ok(Finished::Launched {
                code: launch::exit_code(status),
            }),
            Err(e) => Err(e.into()),
        };
    };
    plan.sweep
        .check_world(info.world)
        .map_err(|e| UsageError(e.to_string()))?;
    let mut meta = RunMeta::start("collectives", run_id, "tcp", info.world);
    let mut comm = parbench::comm::tcp::comm(&info, plan.algo, plan.sweep.timeout)
        .with_context(|| format!("rank {} joining the tcp job", info.rank))?;
    match rank_main(&mut comm, plan, run_id).with_context(|| format!("rank {}", info.rank))? {
        Some(r) => finish(plan, &mut meta, r),
        None => Ok(Finished::Ran { wrong: 0 }),
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(plan: &Plan, run_id: &str) -> Result<Finished> {
    let mut comm = parbench::comm::mpi::MpiComm::init(plan.sweep.timeout)?;
    let world = comm.world();
    plan.sweep
        .check_world(world)
        .map_err(|e| UsageError(e.to_string()))?;
    let mut meta = RunMeta::start("collectives", run_id, "mpi", world);
    meta.versions
        .insert("mpi".into(), comm.library().to_string());
    let report = rank_main(&mut comm, plan, run_id)?;
    match report {
        Some(r) => finish(plan, &mut meta, r),
        None => Ok(Finished::Ran { wrong: 0 }),
    }
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_plan: &Plan, _run_id: &str) -> Result<Finished> {
    Err(UsageError(
        "--backend mpi needs a build with `--features mpi` (and Open MPI or MPICH installed)"
            .into(),
    )
    .into())
}

/// `--backend nccl`: under a launcher every process is one rank on one GPU
/// (the unique id travels through the rendezvous store); otherwise this
/// process drives `-np` GPUs (default: all visible), one thread each.
#[cfg(feature = "cuda")]
fn run_nccl(plan: &Plan, run_id: &str, joined: Option<launch::RankInfo>) -> Result<Finished> {
    use parbench::comm::nccl::{nccl_version, NcclComm};
    use parbench::gpu::{self, Lib};
    // Before any CUDA call: no driver or no NCCL is one line and exit 2
    // (the probe only looks the symbols up; it calls nothing).
    gpu::require(&[Lib::Driver, Lib::Nccl]).map_err(|e| UsageError(e.to_string()))?;
    // Before NCCL's first call: its tuning log fills the algo column.
    parbench::comm::nccl_tuning::set_up_log(&plan.out, run_id);
    let visible = gpu::device_count().map_err(|e| UsageError(e.to_string()))?;
    let timeout = plan.sweep.timeout;
    let meta = |world: usize| {
        let mut m = RunMeta::start("collectives", run_id, "nccl", world);
        m.gpus = gpu::device_names().unwrap_or_default();
        if let Ok(v) = nccl_version() {
            m.versions.insert("nccl".into(), v);
        }
        if let Ok(v) = gpu::driver_version() {
            m.versions.insert("cuda_driver".into(), v);
        }
        m
    };
    if let Some(info) = joined {
        plan.sweep
            .check_world(info.world)
            .map_err(|e| UsageError(e.to_string()))?;
        let mut m = meta(info.world);
        let mut comm = NcclComm::join(&info, timeout)
            .with_context(|| format!("rank {} joining the nccl job", info.rank))?;
        return match rank_main(&mut comm, plan, run_id)
            .with_context(|| format!("rank {}", info.rank))?
        {
            Some(r) => finish(plan, &mut m, r),
            None => Ok(Finished::Ran { wrong: 0 }),
        };
    }
    let world = plan.nprocs.or(plan.nccl_tests.ngpus).unwrap_or(visible);
    if world == 0 || world > visible {
        return Err(UsageError(format!(
            "--backend nccl -np {world}: this machine has {visible} visible GPU(s)"
        ))
        .into());
    }
    plan.sweep
        .check_world(world)
        .map_err(|e| UsageError(e.to_string()))?;
    let mut m = meta(world);
    let ordinals: Vec<usize> = (0..world).collect();
    let comms = NcclComm::init_all(&ordinals, timeout)?;
    let results: Vec<CommResult<Option<RankReport>>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| s.spawn(move || rank_main(&mut c, plan, run_id)))
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(parbench::comm::CommError::Device(format!(
                        "rank {rank}: its thread panicked"
                    )))
                })
            })
            .collect()
    });
    let report = first_report(results)?;
    finish(plan, &mut m, report)
}

#[cfg(not(feature = "cuda"))]
fn run_nccl(_plan: &Plan, _run_id: &str, _joined: Option<launch::RankInfo>) -> Result<Finished> {
    Err(UsageError(
        "--backend nccl needs a build with `--features cuda` (the NCCL communicator)".into(),
    )
    .into())
}

/// Rank 0's report, or the most telling error: a rank's own failure before
/// the "lost peer" errors it caused on the others.
fn first_report(results: Vec<CommResult<Option<RankReport>>>) -> Result<RankReport> {
    let mut errors = Vec::new();
    let mut report = None;
    for r in results {
        match r {
            Ok(Some(rep)) => report = Some(rep),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
    }
    if let Some(pos) = errors
        .iter()
        .position(|e| !matches!(e, parbench::comm::CommError::PeerLost { .. }))
        .or(if errors.is_empty() { None } else { Some(0) })
    {
        return Err(errors.swap_remove(pos).into());
    }
    report.context("rank 0 returned no report")
}

/// The body every rank runs; rank 0 returns its report.
fn rank_main<C: Communicator>(
    comm: &mut C,
    plan: &Plan,
    run_id: &str,
) -> CommResult<Option<RankReport>> {
    comm.set_timeout(plan.sweep.timeout);
    let run_start = CpuSnapshot::now();
    let wire = wire_mod::measure_wire(comm, &plan.sweep)?;
    let mut printer = crate::nccl_flags::printer(comm, plan);
    let algo = if plan.algo == parbench::comm::Algo::Auto {
        "auto (per size: see the algo column)".to_string()
    } else {
        plan.algo.name().to_string()
    };
    printer.run_header(
        comm.backend(),
        &comm.wire(),
        comm.world(),
        &algo,
        &plan.sweep,
        &wire,
    );
    crate::nccl_flags::print_run_header(&mut printer, comm, plan, &wire);
    let ids = RunIds { run_id };
    let outcome = sweep::run_sweep(comm, &plan.sweep, &ids, &wire, &mut printer)?;
    let noise = ForeignCpu::across_ranks(comm, run_start.as_ref())?;
    let above_ceiling = outcome
        .rows
        .iter()
        .filter(|r| crate::print::above_ceiling(r, &wire))
        .map(|r| {
            (
                format!(
                    "{} {} B {}",
                    r.collective,
                    r.bytes,
                    if r.in_place { "in" } else { "out" }
                ),
                summary::above_ceiling_cause(r, &wire),
            )
        })
        .collect();
    let summary = Summary {
        fits: summary::fits(&outcome.rows, &wire, plan.sweep.fit_from),
        above_ceiling,
        straggler: outcome.straggler(),
        iterations: outcome.tally.iterations(),
        wrong: outcome.wrong,
        checked_rows: if plan.sweep.check > 0 {
            outcome.rows.len()
        } else {
            0
        },
        noise,
        noise_per_collective: outcome.noise.clone(),
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
    }))
}

/// Writes rank 0's rows and run metadata; prints where they went.
fn finish(plan: &Plan, meta: &mut RunMeta, r: RankReport) -> Result<Finished> {
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
            "rows": "each row's ceiling_gbps is this ladder at the row's working set (README: bench-collectives, The wire's ceiling)",
        }),
    );
    extra.insert(
        "model_link".into(),
        serde_json::json!({
            "source": "measured before the sweep, not fitted: alpha = median of timed 8 B exchanges (every rank at once) for exchange steps, of ping-pong half trips 0<->1 for one-way steps, each after a warm-up; beta, gamma and copies from the ladders at each row's working set",
            "alpha_us": w.alpha_us(),
            "alpha_exchange_us": w.model.alpha_exchange_s * 1e6,
            "ping_pong": w.ping,
            "exchange": w.exchange,
            "own_transport_model": w.own_transport,
            "duplex": w.model.duplex,
            "pull": w.model.pull,
            "claim": w.model.claim,
            "both": w.model.both,
            "one_way": w.model.one_way,
            "copy": w.model.copy,
            "reduce": w.model.reduce,
        }),
    );
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
        serde_json::json!(r
            .summary
            .above_ceiling
            .iter()
            .map(|(row, why)| serde_json::json!({"row": row, "why": why}))
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
    let reference = crate::reference_line::describe(&r.backend, &r.wire_name, r.world, &r.wire);
    crate::reference_line::record(meta, &reference, &r.outcome.rows);
    meta.finish();
    let line = results::record_all(&plan.out, &r.outcome.rows, meta)
        .with_context(|| format!("writing {}", plan.out.display()))?;
    parbench::outln!("{line}");
    if let Some(path) = &plan.nccl_tests.json_file {
        crate::json_nccl::write(path, plan, meta, &r.outcome)?;
    }
    Ok(Finished::Ran {
        wrong: r.summary.wrong,
    })
}
