//! `report compare`: holds a run against a baseline, figure by figure.
//!
//! Rows are matched by their `Record::key()`. A figure is a regression only
//! when it got worse by more than `--threshold` AND by more than the noise
//! the runs themselves show: the half-width of each row's min..max spread
//! relative to its value, and, when one side holds several rows with the
//! same key (repeats), the half-width of their spread; the larger of the
//! two sides counts. So a change inside the runs' own jitter is not called
//! a regression however large the threshold-only ratio looks.

use crate::load::{load_source, Source};
use crate::table::Table;
use crate::units;
use anyhow::{bail, Result};
use clap::Args;
use parbench::results::{CollectiveRow, LayerRow, PipelineRow, Record};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `report compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The reference results folder.
    pub baseline: PathBuf,
    /// The results folder to judge.
    pub current: PathBuf,
    /// Smallest relative change that counts (0.05 = 5%; for the bubble
    /// fraction, 0.05 = 5 percentage points).
    #[arg(long, default_value_t = 0.05)]
    pub threshold: f64,
    /// Print a GitHub-flavoured Markdown summary (for a CI job summary).
    #[arg(long)]
    pub markdown: bool,
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
}

/// One figure of one row, with its own noise.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub name: &'static str,
    pub value: f64,
    pub worse: Worse,
    /// Relative half-spread (absolute, for fractions) seen within the run.
    pub noise: f64,
}

/// A row type whose figures `compare` knows.
pub trait Compared: Record {
    /// The suite's name in tables.
    const SUITE: &'static str;
    /// The figures to compare.
    fn figures(&self) -> Vec<Figure>;
}

/// Half of (max - min) over `value`, or 0 when the spread is not recorded.
fn half_spread(min: f64, max: f64, value: f64) -> f64 {
    let n = (max - min) / (2.0 * value.abs());
    if n.is_finite() && n > 0.0 {
        n
    } else {
        0.0
    }
}

impl Compared for CollectiveRow {
    const SUITE: &'static str = "collectives";
    /// The median iteration (p50) and the bus bandwidth at that time, not
    /// the mean: on a shared machine one descheduled iteration moves the
    /// mean of 20 by 10x or more (seen between two nightly runs of this
    /// very suite), while the median holds. The noise is still the rows'
    /// whole min..max spread.
    fn figures(&self) -> Vec<Figure> {
        let noise = half_spread(self.time_min_us, self.time_max_us, self.p50_us);
        let busbw_at_p50 = self.busbw_gbps * self.time_us / self.p50_us;
        vec![
            Figure {
                name: "p50_us",
                value: self.p50_us,
                worse: Worse::Higher,
                noise,
            },
            Figure {
                name: "busbw_gbps@p50",
                value: busbw_at_p50,
                worse: Worse::Lower,
                noise,
            },
        ]
    }
}

impl Compared for LayerRow {
    const SUITE: &'static str = "layers";
    fn figures(&self) -> Vec<Figure> {
        // The total's spread in microseconds, charged in full to each part.
        let abs = (self.total_max_us - self.total_min_us) / 2.0;
        let rel = |v: f64| half_spread(0.0, 2.0 * abs, v);
        vec![
            Figure {
                name: "total_us",
                value: self.total_us,
                worse: Worse::Higher,
                noise: rel(self.total_us),
            },
            Figure {
                name: "compute_us",
                value: self.compute_us,
                worse: Worse::Higher,
                noise: rel(self.compute_us),
            },
            Figure {
                name: "comm_us",
                value: self.comm_us,
                worse: Worse::Higher,
                noise: rel(self.comm_us),
            },
            Figure {
                name: "per_token_us",
                value: self.per_token_us,
                worse: Worse::Higher,
                noise: rel(self.total_us),
            },
        ]
    }
}

impl Compared for PipelineRow {
    const SUITE: &'static str = "pipeline";
    fn figures(&self) -> Vec<Figure> {
        let noise = half_spread(self.step_min_us, self.step_max_us, self.step_us);
        vec![
            Figure {
                name: "step_us",
                value: self.step_us,
                worse: Worse::Higher,
                noise,
            },
            Figure {
                name: "bubble_measured",
                value: self.bubble_measured,
                worse: Worse::HigherFraction,
                noise,
            },
        ]
    }
}

/// What became of one figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Regression,
    Improvement,
    Unchanged,
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
}

/// The outcome of comparing two folders.
#[derive(Debug, Default)]
pub struct Comparison {
    pub changes: Vec<Change>,
    /// (suite, key) present only in the baseline / only in the current run.
    pub only_baseline: Vec<(&'static str, String)>,
    pub only_current: Vec<(&'static str, String)>,
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

/// A figure aggregated over the rows sharing a key: the median, and noise
/// from the rows' own spread and the spread of the repeats.
fn aggregate(figs: &[Figure]) -> Option<(f64, f64)> {
    let mut vals: Vec<f64> = figs
        .iter()
        .map(|f| f.value)
        .filter(|v| v.is_finite())
        .collect();
    if vals.is_empty() {
        return None;
    }
    vals.sort_by(f64::total_cmp);
    let mid = vals.len() / 2;
    let median = if vals.len() % 2 == 1 {
        vals[mid]
    } else {
        (vals[mid - 1] + vals[mid]) / 2.0
    };
    let own = figs.iter().map(|f| f.noise).fold(0.0, f64::max);
    let first = figs.first().map(|f| f.worse).unwrap_or(Worse::Higher);
    let (lo, hi) = (vals[0], vals[vals.len() - 1]);
    let repeats = match first {
        Worse::HigherFraction => (hi - lo) / 2.0,
        _ => half_spread(lo, hi, median),
    };
    Some((median, own.max(repeats)))
}

fn group<R: Compared>(rows: &[R]) -> BTreeMap<String, Vec<&R>> {
    let mut map: BTreeMap<String, Vec<&R>> = BTreeMap::new();
    for r in rows {
        map.entry(r.key()).or_default().push(r);
    }
    map
}

/// How much worse `cur` is than `base` (negative: better).
fn worse_by(worse: Worse, base: f64, cur: f64) -> f64 {
    match worse {
        Worse::Higher => cur / base - 1.0,
        Worse::Lower => 1.0 - cur / base,
        Worse::HigherFraction => cur - base,
    }
}

/// Compares the rows of one suite.
pub fn compare_rows<R: Compared>(base: &[R], cur: &[R], threshold: f64, out: &mut Comparison) {
    let (b, c) = (group(base), group(cur));
    for (key, brows) in &b {
        let Some(crows) = c.get(key) else {
            out.only_baseline.push((R::SUITE, key.clone()));
            continue;
        };
        let bfigs: Vec<Vec<Figure>> = brows.iter().map(|r| r.figures()).collect();
        let cfigs: Vec<Vec<Figure>> = crows.iter().map(|r| r.figures()).collect();
        let n = bfigs.first().map_or(0, Vec::len);
        for i in 0..n {
            let pick = |figs: &[Vec<Figure>]| -> Vec<Figure> {
                figs.iter().filter_map(|f| f.get(i).cloned()).collect()
            };
            let (bf, cf) = (pick(&bfigs), pick(&cfigs));
            let (Some(first), Some((bv, bn)), Some((cv, cn))) =
                (bf.first(), aggregate(&bf), aggregate(&cf))
            else {
                continue;
            };
            let by = worse_by(first.worse, bv, cv);
            if !by.is_finite() {
                continue;
            }
            let noise = bn.max(cn);
            let verdict = if by > threshold && by > noise {
                Verdict::Regression
            } else if -by > threshold && -by > noise {
                Verdict::Improvement
            } else {
                Verdict::Unchanged
            };
            out.changes.push(Change {
                suite: R::SUITE,
                key: key.clone(),
                figure: first.name,
                baseline: bv,
                current: cv,
                worse_by: by,
                noise,
                worse: first.worse,
                verdict,
            });
        }
    }
    for key in c.keys().filter(|k| !b.contains_key(*k)) {
        out.only_current.push((R::SUITE, key.clone()));
    }
}

/// Compares every suite of two loaded folders.
pub fn compare_sources(base: &Source, cur: &Source, threshold: f64) -> Comparison {
    let mut out = Comparison::default();
    compare_rows(&base.collectives, &cur.collectives, threshold, &mut out);
    compare_rows(&base.layers, &cur.layers, threshold, &mut out);
    compare_rows(&base.pipeline, &cur.pipeline, threshold, &mut out);
    out
}

fn change_text(c: &Change, relative: f64) -> String {
    match c.worse {
        Worse::HigherFraction => format!("{:+.1} pt", relative * 100.0),
        _ => format!("{:+.1}%", relative * 100.0),
    }
}

fn changes_table(changes: &[&Change]) -> Table {
    let mut t = Table::new([
        "suite / key",
        "figure",
        "baseline",
        "current",
        "change",
        "worse by",
        "noise",
    ]);
    for c in changes {
        let value = |v: f64| match c.worse {
            Worse::HigherFraction => units::percent(v),
            _ => units::sig3(v),
        };
        let raw = match c.worse {
            Worse::HigherFraction => c.current - c.baseline,
            _ => c.current / c.baseline - 1.0,
        };
        t.row([
            format!("{} {}", c.suite, c.key),
            c.figure.to_string(),
            value(c.baseline),
            value(c.current),
            change_text(c, raw),
            change_text(c, c.worse_by),
            match c.worse {
                Worse::HigherFraction => format!("{:.1} pt", c.noise * 100.0),
                _ => format!("{:.1}%", c.noise * 100.0),
            },
        ]);
    }
    t
}

/// The comparison as text or Markdown.
pub fn render(cmp: &Comparison, args: &CompareArgs) -> String {
    let regs = cmp.with(Verdict::Regression);
    let imps = cmp.with(Verdict::Improvement);
    let same = cmp.changes.len() - regs.len() - imps.len();
    let md = args.markdown;
    let mut out = String::new();
    let heading = |s: &str| {
        if md {
            format!("\n### {s}\n\n")
        } else {
            format!("\n{s}\n")
        }
    };
    if md {
        out.push_str("## parbench: current run against the baseline\n\n");
    }
    out.push_str(&format!(
        "{} figures compared ({} against {}, threshold {:.1}%, noise from the runs' own spread): {} regressions, {} improvements, {} unchanged; {} keys only in the baseline, {} only in the current run.\n",
        cmp.changes.len(),
        args.current.display(),
        args.baseline.display(),
        args.threshold * 100.0,
        regs.len(),
        imps.len(),
        same,
        cmp.only_baseline.len(),
        cmp.only_current.len()
    ));
    let table = |t: Table| if md { t.markdown() } else { t.text() };
    if !regs.is_empty() {
        out.push_str(&heading("Regressions"));
        out.push_str(&table(changes_table(&regs)));
    }
    if !imps.is_empty() {
        out.push_str(&heading("Improvements"));
        out.push_str(&table(changes_table(&imps)));
    }
    for (title, keys) in [
        (
            "Only in the baseline (not measured now)",
            &cmp.only_baseline,
        ),
        ("Only in the current run (new)", &cmp.only_current),
    ] {
        if !keys.is_empty() {
            out.push_str(&heading(title));
            let mut t = Table::new(["suite", "key"]);
            for (s, k) in keys {
                t.row([s.to_string(), k.clone()]);
            }
            out.push_str(&table(t));
        }
    }
    if cmp.changes.is_empty() {
        out.push_str(
            "No row of the current run matches a row of the baseline: nothing was compared.\n",
        );
    }
    out
}

/// Runs `report compare`: exit 1 on a regression, 0 otherwise.
pub fn run(args: &CompareArgs) -> Result<ExitCode> {
    if !(args.threshold.is_finite() && args.threshold >= 0.0) {
        bail!(
            "--threshold {}: a fraction at least 0 (0.05 = 5%)",
            args.threshold
        );
    }
    let base = load_source(&args.baseline, false)?;
    let cur = load_source(&args.current, false)?;
    let cmp = compare_sources(&base, &cur, args.threshold);
    print!("{}", render(&cmp, args));
    Ok(if cmp.with(Verdict::Regression).is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(value: f64, noise: f64) -> Figure {
        Figure {
            name: "time_us",
            value,
            worse: Worse::Higher,
            noise,
        }
    }

    #[test]
    fn repeats_add_their_spread() {
        let (median, noise) =
            aggregate(&[fig(100.0, 0.01), fig(110.0, 0.01), fig(90.0, 0.0)]).unwrap();
        assert_eq!(median, 100.0);
        assert!((noise - 0.1).abs() < 1e-12, "{noise}");
    }

    #[test]
    fn directions() {
        assert!((worse_by(Worse::Higher, 100.0, 120.0) - 0.2).abs() < 1e-12);
        assert!((worse_by(Worse::Lower, 10.0, 8.0) - 0.2).abs() < 1e-12);
        assert!((worse_by(Worse::HigherFraction, 0.10, 0.16) - 0.06).abs() < 1e-12);
        assert!(worse_by(Worse::Lower, 10.0, 12.0) < 0.0);
    }

    #[test]
    fn spread_unknown_is_no_noise() {
        assert_eq!(half_spread(0.0, 0.0, 10.0), 0.0);
        assert_eq!(half_spread(9.0, 11.0, 10.0), 0.1);
        assert_eq!(half_spread(1.0, 2.0, 0.0), 0.0);
    }
}
