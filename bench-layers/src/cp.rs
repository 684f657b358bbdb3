//! `--cp`: the context-parallel attention at each degree (on tp x cp
//! ranks with `--tp`), forward or train, on the same ranks the
//! tensor-parallel sweep uses (local threads, tcp processes spawned per
//! degree, mpirun's world, NCCL's GPUs with the attention on the host),
//! one `layers_cp.csv` row per degree.

use crate::cli::{CpJob, LayerJob, UsageError};
use crate::output;
use crate::sweep::run_options;
use crate::{job_degree, mpi_outcomes, rank_0s, ranks_of, spawn_degrees, ENV_ROWS, ENV_RUN_ID};
use anyhow::{bail, Context};
use parbench::comm::{Algo, CommError};
use parbench::launch::flags::Backend;
use parbench::launch::ranks::{self, Ended, RankBody, RankComm, Ranks};
use parbench::layers::cp::{run_cp, CpOutcome};
use parbench::layers::LayerError;
use parbench::results::{self, append_rows, new_run_id, CpRow, Record, RunMeta, SCHEMA_VERSION};
use std::path::Path;

/// What one degree measured (rank 0's copy).
#[derive(Clone, Debug)]
pub struct CpMeasurement {
    pub cp: usize,
    pub wire: String,
    /// The version line of the communicator's library (MPI's), for run.json.
    pub library: Option<String>,
    pub outcome: CpOutcome,
}

/// The attention at the job's degree on each rank.
struct CpDegree<'a> {
    plan: &'a LayerJob,
    job: &'a CpJob,
}

impl RankBody for CpDegree<'_> {
    type Out = Option<CpMeasurement>;
    fn run<C: RankComm>(&self, comm: &mut C) -> Result<Self::Out, CommError> {
        let opts = run_options(self.plan);
        let outcome =
            run_cp(comm, &self.job.config, self.job.plan, &opts).map_err(|e| match e {
                LayerError::Comm(c) => c,
                other => CommError::Device(other.to_string()),
            })?;
        Ok((comm.rank() == 0).then(|| CpMeasurement {
            cp: outcome.cp,
            wire: comm.wire(),
            library: comm.library(),
            outcome,
        }))
    }
}

/// Runs the `--cp` sweep from the ranks chosen for its first degree.
pub fn run(plan: &LayerJob, job: &CpJob, first: Ranks) -> anyhow::Result<()> {
    match first {
        Ranks::Here { .. } => {
            preflight(plan, job, true, |c| c)?;
            let mut records = CpRecords::begin(plan, job, plan.backend);
            for &c in &job.degrees {
                let kept = ranks_of(plan, None, job.world(c), None)
                    .and_then(|r| rank_0s(plan, &format!("cp {c}"), r, &CpDegree { plan, job }))
                    .and_then(|m| records.keep(vec![row(plan, job, &records.meta.run_id, &m)]));
                if let Err(e) = kept {
                    return records.stopped(e);
                }
            }
            records.finish()
        }
        Ranks::Spawn(_) | Ranks::Job(_) => launch(plan, job),
        Ranks::Joined { .. } => joined(plan, job, first),
        Ranks::LibraryWorld { backend } => {
            preflight(plan, job, true, parbench::launch::ranks_on_this_host)?;
            let body = CpDegree { plan, job };
            let Some(m) = mpi_outcomes(plan, backend, &body)?
                .into_iter()
                .flatten()
                .next()
            else {
                return Ok(());
            };
            if !job.degrees.contains(&m.cp) {
                bail!(UsageError(format!(
                    "--cp: under mpirun the sweep runs the job's world ({} = tp {} x cp {}), which --cp does not list",
                    job.world(m.cp),
                    job.plan.tp,
                    m.cp
                )));
            }
            let mut records = CpRecords::begin(plan, job, backend);
            records
                .meta
                .note_library(m.library.clone().unwrap_or_default());
            let rows = vec![row(plan, job, &records.meta.run_id, &m)];
            records.keep(rows)?;
            records.finish()
        }
    }
}

/// `--backend tcp` without a launcher: one job of c local ranks per
/// degree; rank 0 of each hands its row back through a file.
fn launch(plan: &LayerJob, job: &CpJob) -> anyhow::Result<()> {
    preflight(plan, job, true, |c| c)?;
    let mut records = CpRecords::begin(plan, job, plan.backend);
    let run_id = records.meta.run_id.clone();
    let body = CpDegree { plan, job };
    // Each degree's job has tp x cp ranks (plan.tps).
    let tp = job.plan.tp;
    let name = |w: usize| match tp {
        1 => format!("cp {w}"),
        _ => format!("tp {tp} x cp {}", w / tp),
    };
    match spawn_degrees(plan, &run_id, &name, &plan.tps, &body, |rows| {
        records.keep(rows)
    }) {
        Ok(()) => records.finish(),
        Err(e) => records.stopped(e),
    }
}

/// One rank of a tcp job: runs the job's degree; rank 0 writes its row to
/// the spawning launcher's folder, or records the run itself under an
/// external launcher.
fn joined(plan: &LayerJob, job: &CpJob, r: Ranks) -> anyhow::Result<()> {
    let Some(info) = r.joined().cloned() else {
        bail!("a joined rank without its launcher's variables");
    };
    let spawned = std::env::var_os(ENV_ROWS);
    job_degree(plan, "cp", info.world)?;
    if spawned.is_none() {
        preflight(
            plan,
            job,
            info.rank == 0,
            parbench::launch::ranks_on_this_host,
        )?;
    }
    let backend = r.backend();
    let m = match ranks::run(r, Algo::Auto, plan.timeout, &CpDegree { plan, job })? {
        Ended::Ran(ms) => ms.into_iter().flatten().next(),
        Ended::Launched { .. } => None,
    };
    let Some(m) = m else {
        return Ok(());
    };
    match spawned {
        Some(dir) => {
            let id = std::env::var(ENV_RUN_ID).unwrap_or_else(|_| new_run_id("layers"));
            append_rows(Path::new(&dir), &[row(plan, job, &id, &m)])?;
            Ok(())
        }
        None => {
            let mut records = CpRecords::begin(plan, job, backend);
            let rows = vec![row(plan, job, &records.meta.run_id, &m)];
            records.keep(rows)?;
            records.finish()
        }
    }
}

/// Checks --out (where this process writes) and the memory of each
/// degree's `ranks_here(c)` ranks on this host.
fn preflight(
    plan: &LayerJob,
    job: &CpJob,
    writes: bool,
    ranks_here: impl Fn(usize) -> usize,
) -> anyhow::Result<()> {
    if writes {
        results::prepare_out::<CpRow>(&plan.out).map_err(|e| UsageError(format!("--out {e}")))?;
    }
    let (train, shard) = (job.plan.train, job.config.shard(job.plan.tp));
    for &c in &job.degrees {
        let here = ranks_here(job.world(c)) as u128;
        let rank = shard.memory_bytes(c, false, train);
        let check = job.config.memory_bytes(c, plan.check, train)
            - job.config.memory_bytes(c, false, train);
        parbench::limits::check_host_memory(
            rank * here + check,
            "--hidden/--heads/--seq/--batch",
            &format!(
                "cp {c}: {here} rank(s) on this host x {} for the attention",
                parbench::limits::bytes_text(rank)
            ),
        )
        .map_err(|e| UsageError(e.0))?;
    }
    Ok(())
}

/// One degree's row (speed-up NaN until [`CpRecords::keep`]).
fn row(plan: &LayerJob, job: &CpJob, run_id: &str, m: &CpMeasurement) -> CpRow {
    let cfg = &job.config;
    let t = &m.outcome.timing;
    let hidden = if m.cp > 1 && m.outcome.transfer_us > 0.0 {
        (1.0 - t.comm_us / m.outcome.transfer_us).max(0.0)
    } else {
        f64::NAN
    };
    CpRow {
        schema: SCHEMA_VERSION,
        run_id: run_id.to_string(),
        backend: plan.backend.name().to_string(),
        wire: m.wire.clone(),
        method: cfg.method.name().to_string(),
        overlapped: m.outcome.overlapped,
        heads: cfg.heads as u64,
        head_dim: cfg.head_dim as u64,
        seq: cfg.seq as u64,
        batch: cfg.batch as u64,
        cp: m.cp,
        iters: plan.iters as u64,
        compute_us: t.compute_us,
        wait_us: t.comm_us,
        transfer_us: m.outcome.transfer_us,
        total_us: t.total_us,
        total_min_us: t.total_min_us,
        total_max_us: t.total_max_us,
        hidden_share: hidden,
        bytes_sent: cfg.shard(job.plan.tp).bytes_sent(m.cp, job.plan.train),
        speedup: f64::NAN,
        check_max_err: m.outcome.check.as_ref().map_or(f64::NAN, |c| c.max_err),
        slowest_rank: t.slowest_rank,
        mode: mode_of(job).to_string(),
        tp: job.plan.tp,
        causal: cfg.causal,
    }
}

fn mode_of(job: &CpJob) -> &'static str {
    if job.plan.train {
        "train"
    } else {
        "forward"
    }
}

/// The rows of one `--cp` run, kept in --out as each degree completes.
struct CpRecords<'a> {
    plan: &'a LayerJob,
    meta: RunMeta,
    rows: Vec<CpRow>,
}

impl<'a> CpRecords<'a> {
    fn begin(plan: &'a LayerJob, job: &CpJob, backend: Backend) -> Self {
        let world = job.degrees.iter().copied().max().unwrap_or(1);
        let id = std::env::var(ENV_RUN_ID).unwrap_or_else(|_| new_run_id("layers"));
        let mut meta = ranks::run_meta("layers", &id, backend, world);
        let c = &job.config;
        meta.extra.insert(
            "cp".into(),
            serde_json::json!({
                "method": c.method.name(),
                "mode": mode_of(job),
                "tp": job.plan.tp,
                "causal": c.causal,
                "heads": c.heads,
                "head_dim": c.head_dim,
                "seq": c.seq,
                "batch": c.batch,
                "degrees": job.degrees,
                "iters": plan.iters,
                "warmup": plan.warmup,
                "check": plan.check,
                "balance": "2 cp chunks; rank i holds chunks i and 2 cp - 1 - i",
                "grid": "world rank = cp rank x tp + tp rank; tp rank t holds heads [t heads/tp, (t+1) heads/tp)",
                "backward": "probabilities recomputed from the forward's log-sum-exp",
                "times": "per call (forward, or forward and backward), slowest rank's mean; attention on the host in f32",
            }),
        );
        results::begin_run(&plan.out, &meta);
        CpRecords {
            plan,
            meta,
            rows: Vec::new(),
        }
    }

    /// Appends one degree's rows with the speed-up over cp 1.
    fn keep(&mut self, mut rows: Vec<CpRow>) -> anyhow::Result<()> {
        let base = self
            .rows
            .iter()
            .chain(rows.iter())
            .find(|r| r.cp == 1)
            .map(|r| r.total_us);
        for r in &mut rows {
            r.run_id = self.meta.run_id.clone();
            r.speedup = base.map_or(f64::NAN, |b| b / r.total_us);
        }
        append_rows(&self.plan.out, &rows)
            .with_context(|| format!("writing {}", self.plan.out.display()))?;
        self.rows.extend(rows);
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<()> {
        parbench::out!("{}", table(&self.rows));
        self.meta.finish();
        // The machine is shared: the share others took says how far to trust the times.
        if let Some(n) = self.meta.noise() {
            parbench::outln!("# {}", n.describe());
        }
        results::record_run(&self.plan.out, &self.meta).context("recording the run")?;
        parbench::outln!(
            "# wrote {} rows to {}",
            self.rows.len(),
            self.plan.out.join(CpRow::FILE).display()
        );
        Ok(())
    }

    fn stopped(self, err: anyhow::Error) -> anyhow::Result<()> {
        if !self.rows.is_empty() {
            parbench::out!("{}", table(&self.rows));
        }
        Err(err)
    }
}

/// The terminal table: the answer (total and speed-up against the ideal
/// cp-fold) first, then where the time went.
pub fn table(rows: &[CpRow]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mask = if first.causal {
        "causal, balanced"
    } else {
        "no mask"
    };
    let grid = if first.tp > 1 {
        format!(", heads over tp {}", first.tp)
    } else {
        String::new()
    };
    let call = if first.mode == "train" {
        "forward + backward"
    } else {
        "forward"
    };
    let mut out = format!(
        "# cp attention ({mask}{grid}): seq {} x batch {}, heads {} x {}, {} on {} ({}); us per {call} call, slowest rank\n",
        first.seq, first.batch, first.heads, first.head_dim, first.method, first.backend, first.wire
    );
    out.push_str(&format!(
        "{:>4} {:>11} {:>15} {:>11} {:>11} {:>11} {:>7} {:>10} {:>17}\n",
        "cp",
        "total_us",
        "speedup(ideal)",
        "compute_us",
        "wait_us",
        "transfer_us",
        "hidden",
        "sent",
        "check(tol 1e-4)"
    ));
    for r in rows {
        let hidden = if r.hidden_share.is_nan() {
            "-".to_string()
        } else {
            format!("{:.0}%", 100.0 * r.hidden_share)
        };
        let speed = format!("{} ({})", output::speedup_cell(r.speedup, r.cp), r.cp);
        out.push_str(&format!(
            "{:>4} {:>11.1} {:>15} {:>11.1} {:>11.1} {:>11.1} {:>7} {:>10} {:>17}\n",
            r.cp,
            r.total_us,
            speed,
            r.compute_us,
            r.wait_us,
            r.transfer_us,
            hidden,
            parbench::units::bytes_text(r.bytes_sent as u128),
            if r.check_max_err.is_nan() {
                "-".to_string()
            } else {
                format!("{:.1e}", r.check_max_err)
            }
        ));
    }
    if let Some(whole) = rows.iter().find(|r| r.cp == 1) {
        for r in rows {
            let against = output::AgainstWhole {
                ranks: r.cp,
                speedup: r.speedup,
                compute_us: r.compute_us,
                whole_compute_us: whole.compute_us,
                whole_total_us: whole.total_us,
            };
            if let Some(l) = output::above_ideal_line(&format!("cp {}", r.cp), against) {
                out.push_str(&l);
                out.push('\n');
            }
        }
    }
    out
}
