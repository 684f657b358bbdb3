//! What rank 0 prints and records after each run.

use crate::cli::{Args, ComposedJob, PipelineJob, RunPlan};
use crate::composed_out;
use anyhow::{Context, Result};
use parbench::measure::clock_sync::TimeBase;
use parbench::pipeline::analysis::{bubble_parts, oversubscribed, BUBBLE_PARTS};
use parbench::pipeline::{self, ComposedRecord, RunRecord};
use parbench::results::{self, PipelineRow, RunMeta, SCHEMA_VERSION};
use parbench::schedule::Schedule;
use std::path::PathBuf;

/// Runs with at most this many microbatches and stages get a terminal timeline.
const SMALL_MICROBATCHES: usize = 16;
const SMALL_STAGES: usize = 8;
const TIMELINE_WIDTH: usize = 96;

/// The run's clocks in one line: how they were put on one base, and each
/// rank's offset to rank 0 with its bound and drift.
fn clock_line(rec: &RunRecord) -> String {
    let Some(first) = rec.clocks.first() else {
        return "one rank".into();
    };
    let ranks: Vec<String> = rec
        .clocks
        .iter()
        .skip(1)
        .map(|c| {
            format!(
                "rank{} {:+.1} +/- {:.1} us (drift {:+.1})",
                c.rank,
                c.before.offset_us,
                c.before.uncertainty_us,
                c.drift_us()
            )
        })
        .collect();
    let what = match first.base {
        TimeBase::Shared => "one clock (threads); offset estimates as a check, not applied",
        TimeBase::Estimated => "offsets to rank 0 estimated and applied",
    };
    format!("{what}: {}", ranks.join(", "))
}

/// The most activations any rank held at once, and the schedule's most.
fn peaks(sum: &pipeline::Summary) -> (usize, usize) {
    let most = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
    (
        most(&sum.peak_activations),
        most(&sum.expected_peak_activations),
    )
}

/// The cores this process may use, read before any rank pins itself to
/// one (run.json's `cores`, which `report plan --against` compares with the
/// ranks that computed on them).
static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Reads the cores while no thread is pinned yet (call at the start of main).
pub fn note_cores() {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let _ = CORES.set(n);
}

/// Prints each run's table row and writes its records.
pub struct Recorder {
    run_id: String,
    out: PathBuf,
    meta: RunMeta,
    backend: String,
    wire: String,
    straggler: String,
    work: String,
    force_timeline: bool,
    verbose: bool,
    header_printed: bool,
    /// Runs recorded, for the footer's count.
    runs: usize,
    /// More compute ranks than cores: the header said so once.
    crowded: bool,
    /// Why the last parted run parted (the same for every run of a job).
    parted_why: Option<String>,
    /// Each run's clocks, for run.json, and how they share a base.
    clocks: Vec<serde_json::Value>,
    base: Option<TimeBase>,
    /// Each composed run's section of run.json.
    composed: Vec<serde_json::Value>,
    /// Each composed run whose gradient check failed: what differed.
    failed_checks: Vec<String>,
    /// Each run whose measured bubble parted from its simulation.
    parted: Vec<serde_json::Value>,
}

impl Recorder {
    /// Records the version line of the library under the communicator
    /// (MPI's) in run.json's `versions`.
    pub fn note_library(&mut self, library: &str) {
        self.meta.note_library(library.into());
    }

    pub fn new(
        args: &Args,
        plan: &PipelineJob,
        backend: parbench::launch::flags::Backend,
        compute: &str,
    ) -> Self {
        let run_id = results::new_run_id("pipeline");
        let mut meta = parbench::launch::ranks::run_meta("pipeline", &run_id, backend, plan.ranks);
        if let Some(&n) = CORES.get() {
            meta.cores = n;
        }
        meta.extra.insert("compute".into(), compute.into());
        // A fault or a signal from here on records the run as cut short.
        results::begin_run(&args.out, &meta);
        let shape = plan.runs.first().map(|r| r.cfg.shape);
        match &plan.composed {
            None => {
                parbench::outln!(
                    "# bench-pipeline: backend {backend}, {} stage ranks, {} timed steps after {} warm-up\n# run {run_id}",
                    plan.ranks,
                    args.steps,
                    args.warmup
                );
                parbench::outln!(
                    "# each stage: hidden {}, b {} rows per microbatch, work {}, {}",
                    shape.map_or(0, |s| s.hidden),
                    shape.map_or(0, |s| s.rows),
                    args.work,
                    compute,
                );
            }
            Some(c) => composed_out::header(&run_id, backend.name(), plan, c, args, compute),
        }
        let cores = CORES.get().copied().unwrap_or(0);
        // Said once here, not under every run: it holds for all of them.
        let crowded = oversubscribed(plan.ranks, cores, args.work.starts_with("sleep"));
        if crowded {
            parbench::outln!(
                "# {} compute ranks on {cores} cores: the measured bubble may part from the simulated (!); fewer ranks or --work sleep:US run cleanly",
                plan.ranks
            );
        }
        for s in &plan.skipped {
            parbench::outln!("# skipped: {s}");
        }
        if let Some(s) = &args.straggler {
            parbench::outln!("# straggler {s}: that rank adds the time to each action");
        }
        Recorder {
            run_id,
            out: args.out.clone(),
            meta,
            backend: backend.to_string(),
            wire: String::new(),
            straggler: args.straggler.clone().unwrap_or_default(),
            work: args.work.clone(),
            force_timeline: args.timeline,
            verbose: args.verbose,
            header_printed: false,
            runs: 0,
            crowded,
            parted_why: None,
            clocks: Vec::new(),
            base: None,
            composed: Vec::new(),
            failed_checks: Vec::new(),
            parted: Vec::new(),
        }
    }

    /// Prints and records one run; `composed` when it was a composed step
    /// (`rec` is then world rank 0's pipeline).
    pub fn record(
        &mut self,
        run: &RunPlan,
        wire: &str,
        rec: &RunRecord,
        composed: Option<(&ComposedJob, &ComposedRecord)>,
    ) -> Result<()> {
        self.wire = wire.to_string();
        let s = &run.cfg.schedule;
        let sum = pipeline::summarize(s, rec).context("simulating the measured costs")?;
        let formula = pipeline::closed_form(run.kind, s, &sum.costs_us);
        if !self.header_printed {
            parbench::outln!(
                "{:<14} {:>3} {:>3} {:>2} {:>11} {:>8} {:>8}  {:>8} {:>8}",
                "schedule",
                "S",
                "M",
                "v",
                "step(us)",
                "bubble",
                "sim",
                "formula",
                "grad_err"
            );
            self.header_printed = true;
        }
        self.runs += 1;
        let pct = |v: f64| format!("{:.1}%", 100.0 * v);
        let ranks = composed.map_or(s.ranks(), |(job, _)| s.ranks() * job.dp * job.tp);
        let parts = bubble_parts(
            sum.bubble_measured,
            sum.sim.bubble,
            ranks,
            CORES.get().copied().unwrap_or(0),
            self.work.starts_with("sleep"),
        );
        parbench::outln!(
            "{:<14} {:>3} {:>3} {:>2} {:>11.1} {:>8} {:>8}{:1} {:>8} {:>8}",
            s.name,
            s.ranks(),
            s.microbatches,
            s.chunks(),
            sum.step_us,
            pct(sum.bubble_measured),
            pct(sum.sim.bubble),
            if parts.is_some() { "!" } else { "" },
            formula.map(pct).unwrap_or_else(|| "-".into()),
            rec.grad_max_err
                .map(|e| format!("{e:.1e}"))
                .unwrap_or_else(|| "-".into()),
        );
        if self.verbose {
            self.print_detail(s, &sum, rec);
        }
        if let Some(why) = parts {
            self.parted.push(serde_json::json!({
                "schedule": s.name,
                "stages": s.ranks(),
                "microbatches": s.microbatches,
                "measured": sum.bubble_measured,
                "simulated": sum.sim.bubble,
                "likely_cause": why,
            }));
            self.parted_why = Some(why);
        }
        let acausal = pipeline::acausal(s, rec);
        if let Some(worst) = acausal.iter().max_by(|a, b| {
            (a.early_us - a.uncertainty_us).total_cmp(&(b.early_us - b.uncertainty_us))
        }) {
            parbench::outln!(
                "    WARNING: {} dependent actions start before their producer ended, beyond the clock uncertainty (worst: {} {:.1} us before {} ended, uncertainty {:.1} us): these times are not on one base",
                acausal.len(),
                worst.action,
                worst.early_us,
                worst.producer,
                worst.uncertainty_us
            );
        }
        if self.force_timeline
            || (self.verbose && s.microbatches <= SMALL_MICROBATCHES && s.ranks() <= SMALL_STAGES)
        {
            let step = rec
                .steps
                .get(sum.median_step)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            for line in pipeline::terminal_timeline(step, TIMELINE_WIDTH).lines() {
                parbench::outln!("    {line}");
            }
        }
        self.write_records(run, rec, &sum, formula, composed)
    }

    /// `-v`: under a run's row, what each rank did, where the idle time
    /// went, the clocks and the rank that paces the step.
    fn print_detail(&self, s: &Schedule, sum: &pipeline::Summary, rec: &RunRecord) {
        let (peak, expected) = peaks(sum);
        parbench::outln!(
            "    message {:.1} us one way, replayed bubble {:.1}%, peak activations {peak} (schedule's {expected})",
            sum.message_us,
            100.0 * sum.bubble_replayed
        );
        for r in 0..s.ranks() {
            let c = s
                .stages_of(r)
                .iter()
                .filter_map(|&st| sum.costs_us.get(st).map(|c| (st, *c)))
                .map(|(st, c)| {
                    if s.splits_backward() {
                        format!("{st}: F {:.0} I {:.0} W {:.0}", c.f, c.i, c.w)
                    } else {
                        format!("{st}: F {:.0} B {:.0}", c.f, c.b)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            parbench::outln!(
                "    rank{r}: busy {:.0} us, idle {:.0} us (waiting {:.0}, transfer {:.0}), sim idle {:.0} us, peak {} act ({} B), schedule {}; cost us per stage {c}",
                sum.busy_us[r],
                sum.idle_us[r],
                sum.wait_us[r],
                sum.transfer_us[r],
                sum.sim.idle.get(r).copied().unwrap_or(0.0),
                sum.peak_activations[r],
                sum.peak_activation_bytes[r],
                sum.expected_peak_activations[r],
            );
        }
        let idle = sum.idle_split();
        if idle.idle_us > 0.0 {
            let pct = |v: f64| 100.0 * v / idle.idle_us;
            parbench::outln!(
                "    idle {:.0} us per step over the ranks: {:.1}% waiting for a peer that had not sent, {:.1}% transfer (sent, not yet in hand), {:.1}% after the rank's last action, {:.1}% other (the executor between actions)",
                idle.idle_us,
                pct(idle.wait_us),
                pct(idle.transfer_us),
                pct(idle.done_us),
                pct(idle.other_us()),
            );
        }
        parbench::outln!("    clocks: {}", clock_line(rec));
        // The rank with the most work bounds the step from below: with
        // unbalanced stages or a straggler, it paces the pipeline.
        if let Some((r, busy)) = sum
            .sim
            .busy
            .iter()
            .copied()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1))
        {
            if sum.step_us > 0.0 {
                parbench::outln!(
                    "    pace: rank{r} has the most work, {busy:.0} us at median costs = {:.0}% of the {:.0} us step",
                    100.0 * busy / sum.step_us,
                    sum.step_us
                );
            }
        }
    }

    /// Writes one run's trace and CSV row (and its composed section).
    fn write_records(
        &mut self,
        run: &RunPlan,
        rec: &RunRecord,
        sum: &pipeline::Summary,
        formula: Option<f64>,
        composed: Option<(&ComposedJob, &ComposedRecord)>,
    ) -> Result<()> {
        let s = &run.cfg.schedule;
        let idle = sum.idle_split();
        let (peak, expected) = peaks(sum);
        std::fs::create_dir_all(&self.out)
            .with_context(|| format!("creating {}", self.out.display()))?;
        let label = format!(
            "{}-{}-S{}-M{}-v{}",
            self.run_id,
            s.name.replace([':', '/', '\\'], "_"),
            s.ranks(),
            s.microbatches,
            s.chunks()
        );
        let trace_name = format!("timeline-{label}.json");
        let composed = composed.map(|(job, crec)| {
            let figures = composed_out::Figures::of(job, run, crec);
            (job, crec, figures)
        });
        match &composed {
            None => pipeline::write_chrome_trace(
                &self.out.join(&trace_name),
                &label,
                s,
                rec,
                sum.median_step,
            )?,
            Some((job, crec, f)) => {
                composed_out::print(job, crec, f);
                if let Some(failed) = composed_out::check_failure(crec) {
                    self.failed_checks.push(format!("{label}: {failed}"));
                }
                pipeline::write_composed_trace(
                    &self.out.join(&trace_name),
                    &label,
                    s,
                    crec,
                    f.median_index,
                )?;
                self.composed
                    .push(composed_out::json(job, run, crec, f, sum, &trace_name));
            }
        }
        self.base = rec.clocks.first().map(|c| c.base);
        self.clocks.push(serde_json::json!({
            "timeline": trace_name,
            "ranks": pipeline::clocks_json(rec),
        }));
        let n = s.ranks().max(1) as f64;
        let mut row = PipelineRow {
            schema: SCHEMA_VERSION,
            run_id: self.run_id.clone(),
            backend: self.backend.clone(),
            wire: self.wire.clone(),
            schedule: s.name.clone(),
            stages: s.ranks(),
            microbatches: s.microbatches,
            chunks: s.chunks(),
            work: self.work.clone(),
            stage_layers: run
                .cfg
                .stage_layers
                .iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            hidden: run.cfg.shape.hidden as u64,
            microbatch_size: run.cfg.shape.rows as u64,
            steps: rec.steps.len() as u64,
            step_us: sum.step_us,
            step_min_us: sum.step_min_us,
            step_max_us: sum.step_max_us,
            busy_us: sum.busy_us.iter().sum::<f64>() / n,
            idle_us: sum.idle_us.iter().sum::<f64>() / n,
            bubble_measured: sum.bubble_measured,
            bubble_simulated: sum.sim.bubble,
            bubble_formula: formula.unwrap_or(f64::NAN),
            peak_activations: peak as u64,
            peak_activation_bytes: sum.peak_activation_bytes.iter().copied().max().unwrap_or(0)
                as u64,
            expected_peak_activations: expected as u64,
            grad_max_err: rec.grad_max_err.unwrap_or(f64::NAN),
            timeline: trace_name,
            straggler: self.straggler.clone(),
            step_simulated_us: sum.sim.makespan,
            message_us: sum.message_us,
            bubble_replayed: sum.bubble_replayed,
            wait_us: idle.wait_us,
            transfer_us: idle.transfer_us,
            clock_uncertainty_us: (0..s.ranks())
                .map(|r| rec.uncertainty_us(r))
                .fold(0.0, f64::max),
            dp: 1,
            tp: 1,
            tp_comm_us: 0.0,
            dp_comm_us: 0.0,
            dp_exposed_us: 0.0,
        };
        if let Some((job, crec, f)) = &composed {
            composed_out::fill_row(&mut row, job, crec, f);
        }
        results::append_rows(&self.out, &[row])?;
        Ok(())
    }

    /// Writes run.json once every run is recorded.
    pub fn finish(mut self) -> Result<()> {
        self.meta.finish();
        if !self.wire.is_empty() {
            self.meta
                .extra
                .insert("wire".into(), self.wire.clone().into());
        }
        self.meta.extra.insert(
            "time_base".into(),
            serde_json::json!({
                "clock": "each host's CLOCK_MONOTONIC; every time on rank 0's, from each step's first work start",
                "base": self.base.map(TimeBase::name),
                "runs": std::mem::take(&mut self.clocks),
            }),
        );
        if !self.parted.is_empty() {
            let noise = self
                .meta
                .noise()
                .map(|n| format!(" the noise guard: {}", n.describe()))
                .unwrap_or_default();
            let n = self.parted.len();
            let why = self.parted_why.take().unwrap_or_default();
            let noisy = self.meta.noise().and_then(|n| n.warning());
            // The header already named the crowded cores, and a noisy run
            // says so once: the mark's key, not a warning about the model.
            if let Some(w) = noisy {
                parbench::outln!("# {w}");
                parbench::outln!(
                    "# !: measured bubble parted from the simulated by more than {:.0} points in {n} of {} runs (not held to it: a noisy run)",
                    100.0 * BUBBLE_PARTS,
                    self.runs
                );
            } else if self.crowded {
                parbench::outln!(
                    "# !: measured bubble parted from the simulated by more than {:.0} points in {n} of {} runs",
                    100.0 * BUBBLE_PARTS,
                    self.runs
                );
            } else {
                parbench::outln!(
                    "# WARNING: measured bubble parted from the simulated by more than {:.0} points (!) in {n} of {} runs",
                    100.0 * BUBBLE_PARTS,
                    self.runs
                );
                parbench::outln!("# {why}");
            }
            if !noise.is_empty() && !self.meta.noise().is_some_and(|n| n.noisy()) {
                parbench::outln!("#{noise}");
            }
            self.meta.extra.insert(
                "bubble_parts".into(),
                serde_json::Value::Array(std::mem::take(&mut self.parted)),
            );
        } else if let Some(w) = self.meta.noise().and_then(|n| n.warning()) {
            parbench::outln!("# {w}");
        }
        if !self.composed.is_empty() {
            self.meta.extra.insert(
                "composed".into(),
                serde_json::Value::Array(std::mem::take(&mut self.composed)),
            );
        }
        results::record_run(&self.out, &self.meta)?;
        parbench::outln!(
            "# wrote {}/pipeline.csv, run.json and timeline-{}-*.json",
            self.out.display(),
            self.run_id
        );
        // Recorded first: a failed check keeps what was measured.
        if !self.failed_checks.is_empty() {
            anyhow::bail!("gradient check failed: {}", self.failed_checks.join("; "));
        }
        Ok(())
    }
}
