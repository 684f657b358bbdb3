//! `report compare`: holds a run against a baseline, figure by figure, and
//! calls a regression only beyond the noise the runs themselves measured.
//!
//! Rows are matched by their `Record::key()`. Each run in a folder is one
//! round (a nightly job runs every suite several times into one folder).
//! A figure is a **regression** when every one of these holds:
//!
//! 1. neither side's rows come from a noisy run (other processes took more
//!    than `--noise-limit`, default 10%, of the machine: `extra.noise` in run.json, or, for a
//!    collective's rows, that collective's table: `extra.noise_per_collective`);
//!    rows of noisy runs are left out, and a figure with no quiet row left
//!    on a side is "noisy: not judged";
//! 2. its median over the rounds got worse by more than `--threshold`;
//! 3. and by more than the noise: with two or more rounds on a side, the
//!    spread of that side's rounds (max - min over the median: rounds of
//!    one night, minutes apart, agree more closely than nights do, and half
//!    the spread called unchanged nights apart); with one round, the row's own
//!    spread below its median (`(p50 - fastest) / p50`: a descheduled
//!    iteration only ever lengthens the slow tail, so it says nothing about
//!    the median); the larger side counts;
//! 4. with two or more rounds on both sides, every current round is worse
//!    than every baseline round (the ranges do not overlap); a side that
//!    ran two or more rounds of a row but kept fewer than two quiet ones
//!    is not judged: its noise is not measured;
//! 5. for a figure that is a time (or derived from one), the time changed
//!    by more than the floor: the larger of both runs' clock resolution and
//!    latency jitter (p90 - p10 of the ping-pong half trips), recorded in
//!    run.json's `extra.floor`.
//!
//! A baseline may be several folders (nights): their runs are pooled, so
//! that the noise a night is held against is measured across nights, not
//! within one.
//!
//! Layers' compute times are first put on the baseline's machine speed by
//! the fixed product every run times beside its block ([`compute_basis`]):
//! a slower machine is not a slower block.
//!
//! An improvement is the mirror image. A suite present on both sides whose
//! rows match nothing (a renamed wire, another host, another world size) is
//! an error: a gate that compares nothing must not pass.

use crate::load::{load_pooled, load_source, Source};
use anyhow::{bail, Result};
use clap::Args;
use parbench::results::{CollectiveRow, LayerRow, PipelineRow, Record};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod compute_basis;
mod cp_rows;
mod render;
mod rule;
pub use compute_basis::ComputeBasis;
pub use render::render;
use rule::{judge, side, spread_below, Judged};

/// Exit code of a comparison that found no regression but could not judge
/// some figures because their runs were noisy.
pub const EXIT_NOISY: u8 = 3;

/// Flags of `report compare`.
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct CompareArgs {
    /// The baseline's results folder(s), then the folder to judge (last).
    /// Several baseline folders (nights) are pooled: each of their runs is
    /// a round, and the noise spans the nights.
    #[arg(num_args = 2.., required = true, value_name = "FOLDER")]
    pub folders: Vec<PathBuf>,
    /// Smallest relative change that counts (0.05 = 5%; for the bubble
    /// fraction, 0.05 = 5 percentage points).
    #[arg(long, default_value_t = 0.05)]
    pub threshold: f64,
    /// Largest share of the machine other processes may take during a run
    /// (run.json's noise guard) for its rows to be judged: 0.10 = 10%. On a
    /// shared runner, raise it to get a verdict (a noisier baseline).
    #[arg(long, value_name = "FRACTION", default_value_t = parbench::measure::noise::NOISY_FRACTION)]
    pub noise_limit: f64,
    /// Print a GitHub-flavoured Markdown summary (for a CI job summary).
    #[arg(long)]
    pub markdown: bool,
    /// Also print the rule in full and what single rounds cannot tell.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

impl CompareArgs {
    /// The baseline folders: every folder but the last.
    pub fn baselines(&self) -> &[PathBuf] {
        &self.folders[..self.folders.len().saturating_sub(1)]
    }

    /// The folder judged: the last.
    pub fn current(&self) -> &Path {
        self.folders.last().map_or(Path::new(""), PathBuf::as_path)
    }

    /// The baseline folders in words.
    pub fn baseline_label(&self) -> String {
        let names: Vec<String> = self
            .baselines()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        match names.len() {
            1 => names[0].clone(),
            n => format!("{n} baseline folders pooled ({})", names.join(", ")),
        }
    }
}

/// Which direction of a figure is worse.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Worse {
    /// Times: higher is worse; compared as a ratio.
    Higher,
    /// Bandwidths: lower is worse; compared as a ratio.
    Lower,
    /// Fractions (the bubble): higher is worse; compared as a difference.
    HigherFraction,
    /// Fractions (a hidden share): lower is worse; compared as a difference.
    LowerFraction,
}

/// One figure of one row, with its own noise.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub name: &'static str,
    pub value: f64,
    pub worse: Worse,
    /// The row's own spread below its central value, relative (absolute
    /// for fractions): the noise of a single round.
    pub noise: f64,
    /// The time (us) behind the figure, held against the floor; `None`
    /// for figures without one.
    pub time_us: Option<f64>,
}

/// A row type whose figures `compare` knows.
pub trait Compared: Record {
    /// The suite's name in tables.
    const SUITE: &'static str;
    /// The figures to compare.
    fn figures(&self) -> Vec<Figure>;
    /// The parts of the key, in words, for saying why nothing matched.
    fn key_parts(&self) -> Vec<(&'static str, String)>;
    /// The part of the run whose own noise figure covers this row (a
    /// collective's table: run.json's `extra.noise_per_collective`), if any.
    fn noise_scope(&self) -> Option<&str> {
        None
    }
}

impl Compared for CollectiveRow {
    const SUITE: &'static str = "collectives";
    /// The median iteration (p50) and the bus bandwidth at that time, not
    /// the mean: on a shared machine one descheduled iteration moves the
    /// mean of 20 by 10x or more, while the median holds.
    fn figures(&self) -> Vec<Figure> {
        let noise = spread_below(self.time_min_us, self.p50_us);
        let busbw_at_p50 = self.busbw_gbps * self.time_us / self.p50_us;
        vec![
            Figure {
                name: "p50_us",
                value: self.p50_us,
                worse: Worse::Higher,
                noise,
                time_us: Some(self.p50_us),
            },
            Figure {
                name: "busbw_gbps@p50",
                value: busbw_at_p50,
                worse: Worse::Lower,
                noise,
                time_us: Some(self.p50_us),
            },
        ]
    }
    fn noise_scope(&self) -> Option<&str> {
        Some(&self.collective)
    }
    fn key_parts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("backend", self.backend.clone()),
            ("wire", self.wire.clone()),
            ("ranks", self.world.to_string()),
            ("collective", self.collective.clone()),
            ("algo", self.algo.clone()),
            ("type", format!("{}/{}", self.dtype, self.op)),
            ("size", self.bytes.to_string()),
        ]
    }
}

impl Compared for LayerRow {
    const SUITE: &'static str = "layers";
    fn figures(&self) -> Vec<Figure> {
        // The total's spread below its mean, in microseconds, charged in full to each part.
        let below = (self.total_us - self.total_min_us).max(0.0);
        let rel = |v: f64| spread_below(v - below, v);
        let fig = |name, value: f64| Figure {
            name,
            value,
            worse: Worse::Higher,
            noise: rel(value),
            time_us: Some(value),
        };
        vec![
            fig("total_us", self.total_us),
            fig("compute_us", self.compute_us),
            // The collectives with the waits before them: the same time in
            // rows written before `wait_us`, whose `comm_us` held both.
            fig("comm_wait_us", self.comm_us + self.wait_us.max(0.0)),
            Figure {
                noise: rel(self.total_us),
                ..fig("per_token_us", self.per_token_us)
            },
        ]
    }
    fn key_parts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("backend", self.backend.clone()),
            ("wire", self.wire.clone()),
            (
                "mode",
                parbench::layers::record_mode_name(&self.mode, self.decode).to_string(),
            ),
            ("preset", self.preset.clone()),
            ("tp", self.tp.to_string()),
        ]
    }
}

impl Compared for PipelineRow {
    const SUITE: &'static str = "pipeline";
    fn figures(&self) -> Vec<Figure> {
        let noise = spread_below(self.step_min_us, self.step_us);
        vec![
            Figure {
                name: "step_us",
                value: self.step_us,
                worse: Worse::Higher,
                noise,
                time_us: Some(self.step_us),
            },
            Figure {
                name: "bubble_measured",
                value: self.bubble_measured,
                worse: Worse::HigherFraction,
                noise,
                time_us: None,
            },
        ]
    }
    fn key_parts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("backend", self.backend.clone()),
            ("schedule", self.schedule.clone()),
            ("stages", self.stages.to_string()),
            ("microbatches", self.microbatches.to_string()),
        ]
    }
}

/// What became of one figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Regression,
    Improvement,
    /// Within the threshold, the noise, the rounds' overlap or the floor.
    Unchanged,
    /// Every row on one side came from a noisy run.
    NotJudged,
    /// The figure is not a number that can be held against the other side
    /// (a zero time it divides by, say): never a pass.
    CannotJudge,
}

/// One compared figure.
#[derive(Clone, Debug)]
pub struct Change {
    pub suite: &'static str,
    pub key: String,
    pub figure: &'static str,
    pub baseline: f64,
    pub current: f64,
    /// How much worse (positive) or better (negative): relative, or
    /// absolute for fractions.
    pub worse_by: f64,
    pub noise: f64,
    pub worse: Worse,
    pub verdict: Verdict,
    /// Quiet rounds on each side.
    pub rounds: (usize, usize),
    /// The change of the time behind the figure, and the floor it met, us.
    pub time_change_us: Option<f64>,
    pub floor_us: f64,
}

/// What the runs of a folder say about themselves, by run id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunInfo {
    /// Share of the machine other processes took, when recorded.
    pub foreign: Option<f64>,
    /// The same per part of the run (bench-collectives: per collective's table).
    pub per_scope: BTreeMap<String, f64>,
    /// The compare floor, us (0 when not recorded).
    pub floor_us: f64,
}

impl RunInfo {
    /// Whether others took more than `limit` of the machine in the run.
    pub fn noisy(&self, limit: f64) -> bool {
        self.foreign.is_some_and(|f| f > limit)
    }

    /// Whether a row of the run is too noisy to judge: the run, or the
    /// part of it the row was measured in.
    pub fn noisy_for<R: Compared>(&self, row: &R, limit: f64) -> bool {
        self.noisy(limit)
            || row
                .noise_scope()
                .and_then(|s| self.per_scope.get(s))
                .is_some_and(|&f| f > limit)
    }
}

/// The runs of a loaded folder.
pub fn run_infos(src: &Source) -> BTreeMap<String, RunInfo> {
    src.runs
        .iter()
        .map(|r| {
            let floor_us = r
                .extra
                .get("floor")
                .and_then(|f| f.get("floor_us"))
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0);
            let per_scope = r
                .extra
                .get("noise_per_collective")
                .and_then(serde_json::Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.get("fraction")?.as_f64()?)))
                        .collect()
                })
                .unwrap_or_default();
            (
                r.run_id.clone(),
                RunInfo {
                    foreign: r.noise().map(|n| n.fraction),
                    per_scope,
                    floor_us,
                },
            )
        })
        .collect()
}

/// The outcome of comparing two folders.
#[derive(Debug, Default)]
pub struct Comparison {
    pub changes: Vec<Change>,
    /// (suite, key) present only in the baseline / only in the current run.
    pub only_baseline: Vec<(&'static str, String)>,
    pub only_current: Vec<(&'static str, String)>,
    /// Noisy runs left out: (folder side, run id, share of the machine taken).
    pub noisy_runs: Vec<(&'static str, String, f64)>,
    /// Suites present on both sides whose keys matched nothing, with why.
    pub unmatched: Vec<String>,
    /// Runs of the current folder that were cut short: (run id, why).
    pub cut_short: Vec<(String, String)>,
    /// The machine speed the layers' compute times were judged at, when
    /// both sides have layers rows.
    pub compute_basis: Option<ComputeBasis>,
}

impl Comparison {
    /// The changes with this verdict, worst first.
    pub fn with(&self, v: Verdict) -> Vec<&Change> {
        let mut out: Vec<&Change> = self.changes.iter().filter(|c| c.verdict == v).collect();
        out.sort_by(|a, b| {
            b.worse_by
                .abs()
                .total_cmp(&a.worse_by.abs())
                .then_with(|| (a.suite, &a.key, a.figure).cmp(&(b.suite, &b.key, b.figure)))
        });
        out
    }
}

/// The rounds (runs) among `rows`.
fn rounds<R: Compared>(rows: &[&R]) -> usize {
    rows.iter()
        .map(|r| r.run_id())
        .collect::<BTreeSet<_>>()
        .len()
}

fn group<R: Compared>(rows: &[R]) -> BTreeMap<String, Vec<&R>> {
    let mut map: BTreeMap<String, Vec<&R>> = BTreeMap::new();
    for r in rows {
        map.entry(r.key()).or_default().push(r);
    }
    map
}

/// What a comparison holds a figure to: the smallest change that counts,
/// and the most of the machine other processes may take in a judged run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub threshold: f64,
    pub noise: f64,
}

/// Compares the rows of one suite.
pub fn compare_rows<R: Compared>(
    base: &[R],
    cur: &[R],
    runs: (&BTreeMap<String, RunInfo>, &BTreeMap<String, RunInfo>),
    limits: Limits,
    out: &mut Comparison,
) {
    let threshold = limits.threshold;
    let (b, c) = (group(base), group(cur));
    let info =
        |runs: &BTreeMap<String, RunInfo>, id: &str| runs.get(id).cloned().unwrap_or_default();
    let mut matched = 0;
    for (key, brows) in &b {
        let Some(crows) = c.get(key) else {
            out.only_baseline.push((R::SUITE, key.clone()));
            continue;
        };
        matched += 1;
        let floor_us = brows
            .iter()
            .map(|r| info(runs.0, r.run_id()).floor_us)
            .chain(crows.iter().map(|r| info(runs.1, r.run_id()).floor_us))
            .fold(0.0, f64::max);
        let quiet = |rows: &[&R], runs: &BTreeMap<String, RunInfo>| -> Vec<Vec<(String, Figure)>> {
            let n = rows.first().map_or(0, |r| r.figures().len());
            (0..n)
                .map(|i| {
                    rows.iter()
                        .filter(|r| !info(runs, r.run_id()).noisy_for(**r, limits.noise))
                        .filter_map(|r| Some((r.run_id().to_string(), r.figures().get(i)?.clone())))
                        .collect()
                })
                .collect()
        };
        let (bq, cq) = (quiet(brows, runs.0), quiet(crows, runs.1));
        let (brounds, crounds) = (rounds(brows), rounds(crows));
        // Figure `i` judged on these rounds: both sides, and the verdict.
        let on = |bq: &[Vec<(String, Figure)>],
                  cq: &[Vec<(String, Figure)>],
                  i: usize,
                  worse|
         -> Option<Judged> {
            let (bs, cs) = (
                bq.get(i).and_then(|f| side(f))?,
                cq.get(i).and_then(|f| side(f))?,
            );
            let (by, noise, dt, mut verdict) = judge(worse, &bs, &cs, threshold, floor_us);
            // A side that ran several rounds but kept one quiet round
            // has no measured noise, and its one round is the one the
            // host let through: not judged.
            if (brounds >= 2 && bs.rounds < 2) || (crounds >= 2 && cs.rounds < 2) {
                verdict = Verdict::NotJudged;
            }
            Some((bs, cs, by, noise, dt, verdict))
        };
        let all_figs = brows.first().map(|r| r.figures()).unwrap_or_default();
        for (i, fig) in all_figs.iter().enumerate() {
            let mut change = Change {
                suite: R::SUITE,
                key: key.clone(),
                figure: fig.name,
                baseline: f64::NAN,
                current: f64::NAN,
                worse_by: 0.0,
                noise: 0.0,
                worse: fig.worse,
                verdict: Verdict::NotJudged,
                rounds: (0, 0),
                time_change_us: None,
                floor_us,
            };
            // Quiet rows on both sides whose figure is no finite number.
            let has = |q: &Vec<Vec<(String, Figure)>>| q.get(i).is_some_and(|f| !f.is_empty());
            let unjudgeable =
                |q: &Vec<Vec<(String, Figure)>>| has(q) && q.get(i).and_then(|f| side(f)).is_none();
            if unjudgeable(&bq) || unjudgeable(&cq) {
                change.verdict = Verdict::CannotJudge;
            }
            if let Some((bs, cs, by, noise, dt, verdict)) = on(&bq, &cq, i, fig.worse) {
                change = Change {
                    baseline: bs.median,
                    current: cs.median,
                    worse_by: by,
                    noise,
                    verdict,
                    rounds: (bs.rounds, cs.rounds),
                    time_change_us: dt,
                    ..change
                };
            }
            out.changes.push(change);
        }
    }
    for key in c.keys().filter(|k| !b.contains_key(*k)) {
        out.only_current.push((R::SUITE, key.clone()));
    }
    if matched == 0 && !b.is_empty() && !c.is_empty() {
        out.unmatched
            .push(format!("{}: {}", R::SUITE, why_unmatched(base, cur)));
    }
}

/// The first part of the key in which the two folders' rows differ, in words.
fn why_unmatched<R: Compared>(base: &[R], cur: &[R]) -> String {
    let parts = |rows: &[R]| -> Vec<(&'static str, BTreeSet<String>)> {
        let mut out: Vec<(&'static str, BTreeSet<String>)> = Vec::new();
        for r in rows {
            for (name, v) in r.key_parts() {
                match out.iter_mut().find(|(n, _)| *n == name) {
                    Some(e) => {
                        e.1.insert(v);
                    }
                    None => out.push((name, BTreeSet::from([v]))),
                }
            }
        }
        out
    };
    let (pb, pc) = (parts(base), parts(cur));
    let list = |s: &BTreeSet<String>| s.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
    for ((name, b), (_, c)) in pb.iter().zip(&pc) {
        if b.is_disjoint(c) {
            return format!(
                "no row matches: the baseline's {name} is {} and the current run's {} (a renamed wire, another host or another setup)",
                list(b),
                list(c)
            );
        }
    }
    "no row matches (every key differs in some part: compare the \"only in\" lists)".to_string()
}

/// Compares every suite of two loaded folders.
pub fn compare_sources(base: &Source, cur: &Source, limits: Limits) -> Comparison {
    let mut out = Comparison::default();
    let (bi, ci) = (run_infos(base), run_infos(cur));
    out.cut_short = cur
        .runs
        .iter()
        .filter_map(|r| Some((r.run_id.clone(), r.cut_short.clone()?)))
        .collect();
    for (side, infos) in [("baseline", &bi), ("current", &ci)] {
        for (id, i) in infos {
            if i.noisy(limits.noise) {
                out.noisy_runs
                    .push((side, id.clone(), i.foreign.unwrap_or(0.0)));
                continue;
            }
            for (scope, &f) in &i.per_scope {
                if f > limits.noise {
                    out.noisy_runs
                        .push((side, format!("{id} ({scope} table)"), f));
                }
            }
        }
    }
    compare_rows(
        &base.collectives,
        &cur.collectives,
        (&bi, &ci),
        limits,
        &mut out,
    );
    match compute_basis::at_one_speed(base, cur) {
        Some((bl, cl, basis)) => {
            compare_rows(&bl, &cl, (&bi, &ci), limits, &mut out);
            out.compute_basis = Some(basis);
        }
        None => compare_rows(&base.layers, &cur.layers, (&bi, &ci), limits, &mut out),
    }
    compare_rows(&base.cp, &cur.cp, (&bi, &ci), limits, &mut out);
    compare_rows(&base.cp_ring, &cur.cp_ring, (&bi, &ci), limits, &mut out);
    compare_rows(&base.moe, &cur.moe, (&bi, &ci), limits, &mut out);
    compare_rows(&base.pipeline, &cur.pipeline, (&bi, &ci), limits, &mut out);
    let suites = |s: &Source| {
        [
            !s.collectives.is_empty(),
            !s.layers.is_empty(),
            !s.cp.is_empty(),
            !s.cp_ring.is_empty(),
            !s.moe.is_empty(),
            !s.pipeline.is_empty(),
        ]
    };
    let (sb, sc) = (suites(base), suites(cur));
    if !sb.iter().zip(&sc).any(|(a, b)| *a && *b) {
        out.unmatched.push(
            "the two folders share no suite (collectives, layers, layers_cp, cp-ring, moe, \
             pipeline): nothing to compare"
                .to_string(),
        );
    }
    out
}

/// `--noise-limit` (compare's and quiet's): a fraction of the machine.
pub fn check_noise_limit(limit: f64) -> Result<()> {
    if !(limit.is_finite() && (0.0..=1.0).contains(&limit)) {
        bail!(
            "--noise-limit {}: a fraction from 0 to 1 (0.10 = 10% of the machine)",
            parbench::units::number_text(limit)
        );
    }
    Ok(())
}

/// Runs `report compare`: exit 1 on a regression, [`EXIT_NOISY`] when
/// nothing regressed but noisy runs left figures unjudged, 0 otherwise; an
/// error (exit 2) when a suite's rows match nothing.
pub fn run(args: &CompareArgs) -> Result<ExitCode> {
    // Beyond 100 (10,000% worse) no gate is left to pass or fail.
    if !(args.threshold.is_finite() && (0.0..=100.0).contains(&args.threshold)) {
        bail!(
            "--threshold {}: a fraction from 0 to 100 (0.05 = 5%)",
            parbench::units::number_text(args.threshold)
        );
    }
    check_noise_limit(args.noise_limit)?;
    let base = load_pooled(args.baselines())?;
    let cur = load_source(args.current(), false)?;
    let limits = Limits {
        threshold: args.threshold,
        noise: args.noise_limit,
    };
    let cmp = compare_sources(&base, &cur, limits);
    if let Some(why) = cmp.unmatched.first() {
        bail!(
            "nothing compared between {} and {}: {why}",
            args.baseline_label(),
            args.current().display()
        );
    }
    parbench::out!("{}", render(&cmp, args));
    let regressed = !cmp.with(Verdict::Regression).is_empty();
    // A current run the gate could not judge whole never passes it.
    if !regressed {
        if let Some(c) = cmp.with(Verdict::CannotJudge).first() {
            bail!(
                "{} figure(s) of {} cannot be judged (no finite change: a zero figure?), first {} {} {}: baseline {}, current {}",
                cmp.with(Verdict::CannotJudge).len(),
                args.current().display(),
                c.suite,
                c.key,
                c.figure,
                c.baseline,
                c.current
            );
        }
        if let Some((id, why)) = cmp.cut_short.first() {
            bail!(
                "{}: run {id} was cut short ({why}): the sizes it did not reach were not judged",
                args.current().display()
            );
        }
    }
    Ok(if regressed {
        ExitCode::from(1)
    } else if !cmp.with(Verdict::NotJudged).is_empty() {
        ExitCode::from(EXIT_NOISY)
    } else {
        ExitCode::SUCCESS
    })
}
