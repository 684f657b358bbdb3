//! `--experts`: the MoE block's sweep over its `--ep` x `--etp` layouts on
//! every backend, through the same launcher paths as the dense block's
//! (threads or GPUs here, tcp ranks spawned per layout, a job under an
//! external launcher or mpirun). The rows are printed and kept in run.json
//! (`extra.moe_rows`); layers.csv keeps the dense block's columns only.

use crate::cli::LayerJob;
use crate::output;
use crate::sweep::{measure_moe, MoeMeasurement};
use crate::{
    degree_fault, job_degree, mpi_outcomes, preflight, rank_0s, ranks_of, ENV_ROWS, ENV_RUN_ID,
    ENV_TP,
};
use anyhow::{anyhow, bail, Context};
use parbench::comm::{Algo, CommError, Communicator};
use parbench::compute::cpu::CpuCompute;
use parbench::launch::ranks::{self, Ended, RankBody, RankComm, Ranks};
use parbench::launch::{self, LocalJob};
use parbench::layers::moe::{MoeConfig, MoeLayout};
use parbench::results::{self, new_run_id, RunMeta};
use std::path::Path;

/// The file a spawned layout's rank 0 hands its measurement back in.
const HANDOFF: &str = "moe.json";

/// Set in a spawned rank: its layout's place in the plan's layouts (the
/// child parses the same flags, so it has the same list).
const ENV_LAYOUT: &str = "PARBENCH_LAYERS_MOE_LAYOUT";

/// One layout on each rank of a job: rank 0's measurement.
struct MoeDegree<'a> {
    plan: &'a LayerJob,
    moe: MoeConfig,
    /// `None`: the layout of the job's world (an MPI job's).
    layout: Option<MoeLayout>,
    threads: usize,
}

impl RankBody for MoeDegree<'_> {
    type Out = Option<MoeMeasurement>;
    fn run<C: RankComm>(&self, comm: &mut C) -> Result<Self::Out, CommError> {
        let world = Communicator::world(comm);
        let layout = match self.layout {
            Some(l) => l,
            None => job_layout(self.plan, world)
                .map_err(|e| CommError::InvalidArgument(e.to_string()))?,
        };
        let dev = comm.device(self.plan.device_dtype(), self.threads)?;
        let m = measure_moe(&dev, comm, self.plan, &self.moe, layout, self.threads).map_err(
            |e| match e {
                parbench::layers::LayerError::Comm(c) => c,
                other => CommError::Device(other.to_string()),
            },
        )?;
        Ok((Communicator::rank(comm) == 0).then_some(m))
    }
}

/// The run record: begun before the first degree, each row added as it
/// completes, so a fault keeps the degrees before it.
struct MoeRecords<'a> {
    plan: &'a LayerJob,
    moe: MoeConfig,
    meta: RunMeta,
    rows: Vec<MoeMeasurement>,
}

impl<'a> MoeRecords<'a> {
    fn begin(plan: &'a LayerJob, moe: MoeConfig, mut meta: RunMeta) -> Self {
        meta.extra
            .insert("block".into(), output::moe_json(plan, &moe));
        results::begin_run(&plan.out, &meta);
        parbench::outln!("{}", output::moe_header(plan, &moe));
        MoeRecords {
            plan,
            moe,
            meta,
            rows: Vec::new(),
        }
    }

    fn keep(&mut self, m: MoeMeasurement) {
        parbench::outln!(
            "{}",
            output::moe_row(&m, self.rows.first(), &self.moe, self.plan.verbose)
        );
        self.rows.push(m);
        self.meta.extra.insert(
            "moe_rows".into(),
            serde_json::to_value(&self.rows).unwrap_or_default(),
        );
        results::begin_run(&self.plan.out, &self.meta);
    }

    fn finish(mut self, err: Option<anyhow::Error>) -> anyhow::Result<()> {
        for m in &self.rows {
            if let Some(l) = output::moe_above_ideal(m, self.rows.first()) {
                parbench::outln!("{l}");
            }
        }
        for m in &self.rows {
            parbench::outln!("{}", output::moe_detail(self.plan, &self.moe, m));
        }
        // The model of every exchange against their measured sum, per layout.
        let held: Vec<(usize, f64, f64)> = self
            .rows
            .iter()
            .enumerate()
            .filter(|(_, m)| m.ep * m.etp > 1)
            .map(|(i, m)| {
                let measured = m.a2a_us + m.etp_us + m.tp_us;
                (
                    i + 1,
                    measured,
                    m.a2a_model_us + m.etp_model_us + m.tp_model_us,
                )
            })
            .collect();
        let noise = parbench::measure::noise::since_start();
        for line in output::model_lines("layout", &held, noise.as_ref()) {
            parbench::outln!("{line}");
        }
        if let Some(e) = err {
            return Err(e);
        }
        self.meta.finish();
        if let Some(n) = self.meta.noise() {
            parbench::outln!("# while it ran, {}", n.describe());
        }
        results::record_run(&self.plan.out, &self.meta).context("recording the run")?;
        parbench::outln!(
            "# recorded in {} (extra.moe_rows)",
            self.plan.out.join("run.json").display()
        );
        Ok(())
    }
}

/// The MoE sweep, on the ranks the plan's backend chose for its first layout.
pub fn run(plan: &LayerJob, moe: MoeConfig, first: Ranks) -> anyhow::Result<()> {
    let world = plan.tps.iter().copied().max().unwrap_or(1);
    match first {
        Ranks::Here { backend, .. } => {
            let on_gpus = backend.on_gpus();
            preflight(plan, true, |t| if on_gpus { 0 } else { t })?;
            let run_id = new_run_id("layers");
            let mut rec = MoeRecords::begin(
                plan,
                moe,
                ranks::run_meta("layers", &run_id, plan.backend, world),
            );
            for &layout in &plan.moe_layouts {
                let w = layout.world();
                let threads = if on_gpus {
                    0
                } else {
                    CpuCompute::threads_per_rank(w)
                };
                let body = MoeDegree {
                    plan,
                    moe,
                    layout: Some(layout),
                    threads,
                };
                let got = ranks_of(plan, None, w, None)
                    .and_then(|r| rank_0s(plan, &layout.to_string(), r, &body));
                match got {
                    Ok(m) => rec.keep(m),
                    Err(e) => return rec.finish(Some(e)),
                }
            }
            rec.finish(None)
        }
        Ranks::Spawn(_) | Ranks::Job(_) => launch_tcp(plan, moe, world),
        ranks @ Ranks::Joined { .. } => joined(plan, moe, ranks),
        Ranks::LibraryWorld { backend } => {
            let body = MoeDegree {
                plan,
                moe,
                layout: None,
                threads: 1,
            };
            let out = mpi_outcomes(plan, backend, &body)?;
            record_here(plan, moe, backend, out.into_iter().flatten().next())
        }
    }
}

/// The layout a job of `world` ranks runs: the spawning launcher's
/// (`ENV_LAYOUT`), or under an external launcher the first of the plan's
/// on that many ranks.
fn job_layout(plan: &LayerJob, world: usize) -> anyhow::Result<MoeLayout> {
    if let Ok(at) = std::env::var(ENV_LAYOUT) {
        let layout = at
            .parse::<usize>()
            .ok()
            .and_then(|i| plan.moe_layouts.get(i).copied())
            .ok_or_else(|| anyhow!("{ENV_LAYOUT}={at}: no such layout"))?;
        if layout.world() != world {
            bail!("spawned for {layout} but the job has {world} ranks");
        }
        return Ok(layout);
    }
    plan.moe_layouts
        .iter()
        .copied()
        .find(|l| l.world() == world)
        .ok_or_else(|| {
            crate::cli::UsageError(format!(
                "--ep/--etp: under a launcher the sweep runs the job's world ({world}), which no --ep x --etp layout has"
            ))
            .into()
        })
}

/// Rank 0 of a job under an external launcher or mpirun: its run record.
fn record_here(
    plan: &LayerJob,
    moe: MoeConfig,
    backend: crate::cli::Backend,
    m: Option<MoeMeasurement>,
) -> anyhow::Result<()> {
    let Some(m) = m else {
        return Ok(());
    };
    preflight(plan, true, |_| 0)?;
    let meta = ranks::run_meta("layers", &new_run_id("layers"), backend, m.ep * m.etp);
    let mut rec = MoeRecords::begin(plan, moe, meta);
    rec.keep(m);
    rec.finish(None)
}

/// `--backend tcp` without a launcher around it: one job of `ep` local
/// ranks per degree, rank 0's measurement handed back through a file.
fn launch_tcp(plan: &LayerJob, moe: MoeConfig, world: usize) -> anyhow::Result<()> {
    preflight(plan, true, |t| t)?;
    let run_id = new_run_id("layers");
    let dir = std::env::temp_dir().join(format!("{run_id}-moe"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut rec = MoeRecords::begin(
        plan,
        moe,
        ranks::run_meta("layers", &run_id, plan.backend, world),
    );
    let mut failed = None;
    for (at, &layout) in plan.moe_layouts.iter().enumerate() {
        let (w, name) = (layout.world(), layout.to_string());
        let rows_dir = dir.join(format!("layout{at}"));
        let got = LocalJob::of_current_exe(w)
            .map_err(anyhow::Error::from)
            .and_then(|job| {
                let job = job
                    .label(format!("bench-layers: {name}"))
                    .env(ENV_TP, w.to_string())
                    .env(ENV_LAYOUT, at.to_string())
                    .env(ENV_ROWS, &rows_dir)
                    .env(ENV_RUN_ID, &run_id);
                let body = MoeDegree {
                    plan,
                    moe,
                    layout: Some(layout),
                    threads: 0,
                };
                let ranks = ranks_of(plan, None, w, Some(job))?;
                ranks::run(ranks, Algo::Auto, plan.timeout, &body)
                    .map_err(|e| degree_fault(&name, e))?;
                let text = std::fs::read_to_string(rows_dir.join(HANDOFF))
                    .with_context(|| format!("{name}: reading rank 0's row"))?;
                serde_json::from_str::<MoeMeasurement>(&text)
                    .with_context(|| format!("{name}: reading rank 0's row"))
            });
        match got {
            Ok(m) => rec.keep(m),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    rec.finish(failed)
}

/// One rank of a job: the spawning launcher's degree (rank 0 hands its
/// row back), or the job's world under an external launcher.
fn joined(plan: &LayerJob, moe: MoeConfig, ranks: Ranks) -> anyhow::Result<()> {
    let Some(info) = ranks.joined().cloned() else {
        bail!("a joined rank without its launcher's variables");
    };
    let backend = ranks.backend();
    let t = info.world;
    let spawned = std::env::var_os(ENV_ROWS);
    job_degree(plan, "ep", t)?;
    let layout = job_layout(plan, t)?;
    let threads = CpuCompute::threads_per_rank(launch::ranks_on_this_host(t));
    let body = MoeDegree {
        plan,
        moe,
        layout: Some(layout),
        threads,
    };
    let m = match ranks::run(ranks, Algo::Auto, plan.timeout, &body)? {
        Ended::Ran(ms) => ms.into_iter().flatten().next(),
        Ended::Launched { .. } => None,
    };
    match (spawned, m) {
        (Some(dir), Some(m)) => {
            let dir = Path::new(&dir);
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let text = serde_json::to_string(&m)?;
            parbench::files::write_atomic(&dir.join(HANDOFF), text.as_bytes())
                .map_err(|e| anyhow!("{e}"))
        }
        (None, m) => record_here(plan, moe, backend, m),
        (Some(_), None) => Ok(()),
    }
}
