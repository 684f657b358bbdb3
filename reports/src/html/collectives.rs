//! The collectives section: bus bandwidth and latency against message size
//! per collective, one series per run and configuration (results folder,
//! wire, ranks, type, op), the algorithm of each size shown by its marker,
//! each beside the model's line and the wire's measured ceiling; then the
//! alpha-beta fit of each series.

use super::page::{self, num, text, Cell, KeyItem};
use crate::charts::{band_points, Axis, LegendItem, LineChart, LineStyle, Marker, Series};
use crate::load::{headlines, Headline, Source};
use crate::predict;
use crate::units;
use parbench::results::CollectiveRow;
use parbench::stats::median_of_finite;
use std::collections::BTreeMap;

/// The rows of one measured curve, one per message size.
pub struct Curve<'a> {
    pub source: &'a str,
    pub row: &'a CollectiveRow,
    /// The runs behind the curve: one (its own curve), or more (their median).
    pub runs: Vec<String>,
    /// Whether any of those runs was noisy (other processes took more than
    /// 10% of the machine).
    pub noisy: bool,
    /// Rows by size: the run's own, or the median over the runs with their
    /// min..max.
    pub by_size: Vec<SizePoint>,
    /// The headline its run printed and recorded for the curve's
    /// collective (single-run curves; `extra.headlines`).
    pub headline: Option<Headline>,
    /// The algorithms of its sizes, in size order, each once (`auto`
    /// switches by size: one curve, one marker per algorithm).
    pub algos: Vec<String>,
}

impl Curve<'_> {
    /// Its algorithm, or its algorithms joined (`tree+ring`).
    pub fn algo_label(&self) -> String {
        self.algos.join("+")
    }

    /// The algorithm of its largest size: the one a fit from the large
    /// sizes and a projection to other degrees take.
    pub fn fit_algo(&self) -> &str {
        self.by_size
            .last()
            .and_then(|p| self.algos.get(p.algo))
            .map_or(self.row.algo.as_str(), String::as_str)
    }

    /// Its points of the fit's algorithm (`fit_algo`) from `from` bytes up.
    fn fit_points(&self, from: f64) -> Vec<(u64, f64)> {
        let algo = self.algos.iter().position(|a| a == self.fit_algo());
        self.by_size
            .iter()
            .filter(|p| p.bytes >= from && p.p50 > 0.0 && Some(p.algo) == algo)
            .map(|p| (p.bytes as u64, p.p50))
            .collect()
    }
}

/// One message size of a curve.
#[derive(Clone, Copy, Debug)]
pub struct SizePoint {
    pub bytes: f64,
    pub busbw: f64,
    pub p50: f64,
    pub p99: f64,
    pub model_us: f64,
    pub ceiling: f64,
    pub wrong: u64,
    /// Lowest and highest busbw and p50 over the curve's runs.
    pub busbw_range: (f64, f64),
    pub p50_range: (f64, f64),
    /// The algorithm that ran it: an index into the curve's `algos`.
    pub algo: usize,
}

/// At most this many runs of one configuration in one folder are drawn as
/// curves of their own; more become one "median of N runs" curve with
/// their min..max band (a nightly folder of rounds).
pub const MAX_RUN_CURVES: usize = 2;

fn range(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        })
}

/// The identity of a curve's configuration (everything but the size and
/// the run; the algorithm only where one run measured a size with several).
type CurveKey = (
    String,
    String,
    String,
    String,
    usize,
    String,
    String,
    i64,
    bool,
);

fn curve_key(source: &str, r: &CollectiveRow) -> CurveKey {
    (
        source.to_string(),
        r.collective.clone(),
        r.backend.clone(),
        r.wire.clone(),
        r.world,
        String::new(),
        format!("{}/{}", r.dtype, r.op),
        r.root,
        r.in_place,
    )
}

/// The run ids of a folder whose noise guard said noisy.
fn noisy_runs(s: &Source) -> Vec<&str> {
    s.runs
        .iter()
        .filter(|r| r.noise().is_some_and(|n| n.noisy()))
        .map(|r| r.run_id.as_str())
        .collect()
}

/// One curve of `rows` (one or more runs of one configuration).
fn make_curve<'a>(
    source: &'a str,
    rows: &[&'a CollectiveRow],
    runs: Vec<String>,
    noisy: bool,
) -> Curve<'a> {
    let mut sizes: BTreeMap<u64, Vec<&CollectiveRow>> = BTreeMap::new();
    for r in rows {
        sizes.entry(r.bytes).or_default().push(r);
    }
    let mut algos: Vec<String> = Vec::new();
    for rs in sizes.values() {
        if !algos.contains(&rs[0].algo) {
            algos.push(rs[0].algo.clone());
        }
    }
    let by_size = sizes
        .into_iter()
        .map(|(bytes, rs)| {
            let m = |f: fn(&CollectiveRow) -> f64| median_of_finite(rs.iter().map(|r| f(r)));
            SizePoint {
                bytes: bytes as f64,
                busbw: m(|r| r.busbw_gbps),
                p50: m(|r| r.p50_us),
                p99: m(|r| r.p99_us),
                model_us: m(|r| r.model_us),
                ceiling: m(|r| r.ceiling_gbps),
                wrong: rs.iter().map(|r| r.wrong).sum(),
                busbw_range: range(rs.iter().map(|r| r.busbw_gbps)),
                p50_range: range(rs.iter().map(|r| r.p50_us)),
                algo: algos.iter().position(|a| *a == rs[0].algo).unwrap_or(0),
            }
        })
        .collect();
    Curve {
        source,
        row: rows[0],
        runs,
        noisy,
        by_size,
        headline: None,
        algos,
    }
}

/// Every curve of every source: one per run of each configuration (or the
/// median of more than [`MAX_RUN_CURVES`] runs, with their band), never a
/// silent pool of runs. Out-of-place curves are drawn; an in-place curve
/// only where its out-of-place twin was not measured.
pub fn curves(sources: &[Source]) -> Vec<Curve<'_>> {
    type Runs<'a> = BTreeMap<String, Vec<&'a CollectiveRow>>;
    let mut groups: BTreeMap<CurveKey, (&str, Vec<&str>, Runs<'_>)> = BTreeMap::new();
    for s in sources {
        let noisy = noisy_runs(s);
        let mut by_run: BTreeMap<(CurveKey, &str), Vec<&CollectiveRow>> = BTreeMap::new();
        for r in &s.collectives {
            by_run
                .entry((curve_key(&s.label, r), r.run_id.as_str()))
                .or_default()
                .push(r);
        }
        for ((key, run), rows) in by_run {
            for (key, rows) in split_by_algo(key, rows) {
                groups
                    .entry(key)
                    .or_insert((s.label.as_str(), noisy.clone(), BTreeMap::new()))
                    .2
                    .entry(run.to_string())
                    .or_default()
                    .extend(rows);
            }
        }
    }
    let keys: Vec<_> = groups.keys().cloned().collect();
    let mut out = Vec::new();
    for (key, (source, noisy, runs)) in groups {
        if key.8 {
            let mut twin = key.clone();
            twin.8 = false;
            if keys.contains(&twin) {
                continue;
            }
        }
        if runs.len() <= MAX_RUN_CURVES {
            for (id, rows) in &runs {
                let is_noisy = noisy.contains(&id.as_str());
                let mut c = make_curve(source, rows, vec![id.clone()], is_noisy);
                let meta = sources
                    .iter()
                    .find(|s| s.label == source)
                    .and_then(|s| s.run(id));
                c.headline = meta.and_then(|m| {
                    headlines(m)
                        .into_iter()
                        .find(|h| h.collective == c.row.collective)
                });
                out.push(c);
            }
        } else {
            let ids: Vec<String> = runs.keys().cloned().collect();
            let is_noisy = ids.iter().any(|id| noisy.contains(&id.as_str()));
            let rows: Vec<&CollectiveRow> = runs.into_values().flatten().collect();
            out.push(make_curve(source, &rows, ids, is_noisy));
        }
    }
    out
}

/// One run's rows of a configuration as curves: one curve when each size
/// ran one algorithm (an `auto` sweep that switches by size), one per
/// algorithm when a size ran several (a sweep of named algorithms).
fn split_by_algo(key: CurveKey, rows: Vec<&CollectiveRow>) -> Vec<(CurveKey, Vec<&CollectiveRow>)> {
    let mut per_size: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for r in &rows {
        let algos = per_size.entry(r.bytes).or_default();
        if !algos.contains(&r.algo.as_str()) {
            algos.push(&r.algo);
        }
    }
    if per_size.values().all(|a| a.len() <= 1) {
        return vec![(key, rows)];
    }
    let mut by_algo: BTreeMap<String, Vec<&CollectiveRow>> = BTreeMap::new();
    for r in rows {
        by_algo.entry(r.algo.clone()).or_default().push(r);
    }
    by_algo
        .into_iter()
        .map(|(algo, rows)| {
            let mut k = key.clone();
            k.5 = algo;
            (k, rows)
        })
        .collect()
}

/// A run id's time, `collectives-20261201T111018Z-16627` -> `2026-12-01 11:10:18Z`.
fn run_time(id: &str) -> String {
    let stamp = id
        .split('-')
        .find(|p| p.len() == 16 && p.ends_with('Z') && p.contains('T'));
    match stamp {
        Some(t) => format!(
            "{}-{}-{} {}:{}:{}Z",
            &t[0..4],
            &t[4..6],
            &t[6..8],
            &t[9..11],
            &t[11..13],
            &t[13..15]
        ),
        None => id.to_string(),
    }
}

/// What tells a curve's runs apart in its label.
pub fn run_words(c: &Curve) -> String {
    let runs = match c.runs.as_slice() {
        [one] => format!("run {}", run_time(one)),
        many => format!("median of {} runs", many.len()),
    };
    if c.noisy {
        format!("{runs} NOISY")
    } else {
        runs
    }
}

/// The chart a curve belongs to: its collective, and its type (with the
/// operator when the collective reduces).
fn chart_group(r: &CollectiveRow) -> (String, String) {
    let reduces = r
        .collective
        .parse::<parbench::comm::Collective>()
        .map_or(true, |c| c.reduces());
    let variant = if reduces {
        format!("{}, {}", r.dtype, r.op)
    } else {
        r.dtype.clone()
    };
    (r.collective.clone(), variant)
}

/// A curve's name in legends: the folder and the fields that tell it apart
/// from the other curves of the same chart.
fn labels(curves: &[&Curve]) -> Vec<String> {
    let fields = |c: &Curve| -> Vec<String> {
        vec![
            c.source.to_string(),
            format!("{}/{}", c.row.backend, c.row.wire),
            c.algo_label(),
            format!("np{}", c.row.world),
            format!("{} {}", c.row.dtype, c.row.op),
            if c.row.in_place {
                "in-place".into()
            } else {
                String::new()
            },
            run_words(c),
        ]
    };
    let all: Vec<Vec<String>> = curves.iter().map(|c| fields(c)).collect();
    let varies: Vec<bool> = (0..7)
        .map(|i| all.iter().any(|f| f[i] != all[0][i]))
        .collect();
    let names: Vec<String> = all
        .iter()
        .map(|f| {
            let parts: Vec<&str> = f
                .iter()
                .enumerate()
                // The wire always; the runs whenever a curve is a median or noisy.
                .filter(|(i, v)| {
                    (varies[*i] || *i == 1 || (*i == 6 && !v.starts_with("run "))) && !v.is_empty()
                })
                .map(|(_, v)| v.as_str())
                .collect();
            parts.join(" ")
        })
        .collect();
    unique_labels(names, |i| {
        let c = curves[i];
        format!("root {}, {}", c.row.root, c.runs.join(" "))
    })
}

/// Labels that two curves share get what tells them apart (`detail`), and
/// if that is shared too, their place: every legend entry names one curve.
pub fn unique_labels(mut names: Vec<String>, detail: impl Fn(usize) -> String) -> Vec<String> {
    let shared = |names: &[String], i: usize| names.iter().filter(|n| **n == names[i]).count() > 1;
    let first: Vec<bool> = (0..names.len()).map(|i| shared(&names, i)).collect();
    for (i, dup) in first.into_iter().enumerate() {
        if dup {
            names[i] = format!("{} ({})", names[i], detail(i));
        }
    }
    let second: Vec<bool> = (0..names.len()).map(|i| shared(&names, i)).collect();
    for (i, dup) in second.into_iter().enumerate() {
        if dup {
            names[i] = format!("{} #{}", names[i], i + 1);
        }
    }
    names
}

/// Markers of the algorithms of one chart, in the order they first appear.
const ALGO_MARKERS: [Marker; 3] = [Marker::Circle, Marker::Square, Marker::Triangle];

/// The algorithms of a chart's curves, each once, in order.
fn chart_algos(curves: &[&Curve]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in curves {
        for a in &c.algos {
            if !out.contains(a) {
                out.push(a.clone());
            }
        }
    }
    out
}

fn algo_marker(algos: &[String], algo: &str) -> Marker {
    let i = algos.iter().position(|a| a == algo).unwrap_or(0);
    ALGO_MARKERS[i % ALGO_MARKERS.len()]
}

/// A curve's figure `y` at each size: one line, and the points of each
/// algorithm marked with its marker (unlabelled: the key names them).
fn per_size(
    color: usize,
    line: LineStyle,
    c: &Curve,
    algos: Option<&[String]>,
    y: fn(&SizePoint) -> f64,
) -> Vec<Series> {
    let mut out = vec![Series {
        label: String::new(),
        color,
        line,
        marker: Marker::None,
        points: c.by_size.iter().map(|p| (p.bytes, y(p))).collect(),
    }];
    if let Some(algos) = algos {
        for (k, algo) in c.algos.iter().enumerate() {
            out.push(Series {
                label: String::new(),
                color,
                line: LineStyle::None,
                marker: algo_marker(algos, algo),
                points: c
                    .by_size
                    .iter()
                    .filter(|p| p.algo == k)
                    .map(|p| (p.bytes, y(p)))
                    .collect(),
            });
        }
    }
    out
}

/// The min..max band of a curve of several runs, per size.
fn band(color: usize, c: &Curve, range: impl Fn(&SizePoint) -> (f64, f64)) -> Series {
    let pts: Vec<(f64, f64, f64)> = c
        .by_size
        .iter()
        .map(|p| {
            let (lo, hi) = range(p);
            (p.bytes, lo, hi)
        })
        .collect();
    Series {
        label: String::new(),
        color,
        line: LineStyle::Band,
        marker: Marker::None,
        points: band_points(&pts),
    }
}

/// One legend entry per curve: its colour and name.
fn legend(names: &[String]) -> Vec<LegendItem> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| LegendItem {
            label: n.clone(),
            color: i,
            line: LineStyle::Solid,
            marker: Marker::None,
        })
        .collect()
}

/// The shared key: the solid line's meaning, with the algorithms' markers,
/// then `rest`.
fn key(solid: &str, curves: &[&Curve], rest: &[(LineStyle, &str)]) -> Vec<KeyItem> {
    let algos = chart_algos(curves);
    let mut out = vec![KeyItem {
        line: LineStyle::Solid,
        marker: Marker::None,
        text: solid.to_string(),
    }];
    for a in &algos {
        out.push(KeyItem {
            line: LineStyle::None,
            marker: algo_marker(&algos, a),
            text: a.clone(),
        });
    }
    for (line, text) in rest {
        out.push(KeyItem {
            line: *line,
            marker: Marker::None,
            text: text.to_string(),
        });
    }
    if curves.iter().any(|c| c.runs.len() > 1) {
        out.push(KeyItem {
            line: LineStyle::Band,
            marker: Marker::None,
            text: "min..max over the runs".into(),
        });
    }
    out
}

fn busbw_chart(collective: &str, curves: &[&Curve], names: &[String]) -> LineChart {
    let algos = chart_algos(curves);
    let mut series = Vec::new();
    type Wire<'a> = (&'a str, &'a str, &'a str, &'a [String]);
    let mut ceilings_drawn: Vec<Wire> = Vec::new();
    for (i, c) in curves.iter().enumerate() {
        if c.runs.len() > 1 {
            series.push(band(i, c, |p| p.busbw_range));
        }
        series.extend(per_size(i, LineStyle::Solid, c, Some(&algos), |p| p.busbw));
        let factor = predict::busbw_factor(&c.row.collective, c.row.world).unwrap_or(f64::NAN);
        let model: Vec<(f64, f64)> = c
            .by_size
            .iter()
            .filter(|p| p.model_us > 0.0)
            .map(|p| (p.bytes, p.bytes / p.model_us / 1e3 * factor))
            .filter(|(_, y)| y.is_finite())
            .collect();
        if !model.is_empty() {
            series.push(Series {
                label: String::new(),
                color: i,
                line: LineStyle::Dashed,
                marker: Marker::None,
                points: model,
            });
        }
        // One ceiling per wire and run: the curves of one folder, wire and
        // run share the ladder measured once, each size at its own working set.
        let wire: Wire = (c.source, &c.row.backend, &c.row.wire, &c.runs);
        if ceilings_drawn.contains(&wire) {
            continue;
        }
        ceilings_drawn.push(wire);
        let mut pts: Vec<(f64, f64)> = curves
            .iter()
            .filter(|o| {
                (
                    o.source,
                    o.row.backend.as_str(),
                    o.row.wire.as_str(),
                    o.runs.as_slice(),
                ) == wire
            })
            .flat_map(|o| o.by_size.iter().map(|p| (p.bytes, p.ceiling)))
            .filter(|(_, g)| g.is_finite() && *g > 0.0)
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts.dedup_by(|a, b| a.0 == b.0);
        if pts.is_empty() {
            continue;
        }
        series.push(Series {
            label: String::new(),
            color: i,
            line: LineStyle::Dotted,
            marker: Marker::None,
            points: pts,
        });
    }
    LineChart {
        title: format!("{collective}: bus bandwidth against message size"),
        x_desc: "message size (bytes per rank's buffer, log2)".into(),
        y_desc: "bus bandwidth (GB/s, log10)".into(),
        x: Axis::Log2Bytes,
        y: Axis::Log10,
        series,
        legend: legend(names),
    }
}

fn latency_chart(collective: &str, curves: &[&Curve], names: &[String]) -> LineChart {
    let algos = chart_algos(curves);
    let mut series = Vec::new();
    for (i, c) in curves.iter().enumerate() {
        if c.runs.len() > 1 {
            series.push(band(i, c, |p| p.p50_range));
        }
        series.extend(per_size(i, LineStyle::Solid, c, Some(&algos), |p| p.p50));
        series.extend(per_size(i, LineStyle::Dashed, c, None, |p| p.p99));
    }
    LineChart {
        title: format!("{collective}: time per operation, p50 and p99 of iterations"),
        x_desc: "message size (log2)".into(),
        y_desc: "time per operation (log10)".into(),
        x: Axis::Log2Bytes,
        y: Axis::Log10Micros,
        series,
        legend: legend(names),
    }
}

/// The alpha-beta fit of a curve's median times (every size) with its own
/// algorithm: the plain link (alpha, beta) that the capacity section
/// projects to other sizes and degrees.
pub fn curve_fit(c: &Curve) -> Result<predict::Fit, String> {
    let pts = c.fit_points(0.0);
    let algo = predict::ModelAlgo::of(c.fit_algo());
    predict::fit(&c.row.collective, &algo, c.row.world, &pts)
}

/// The fits' window: from this size up (bench-collectives' default `--fit-from`).
pub const FIT_FROM: f64 = 1048576.0;

/// A curve's fit over the window, as the table shows it.
struct WindowFit {
    structure: &'static str,
    alpha_us: f64,
    bandwidth: String,
    rms: f64,
    max: f64,
    sizes: usize,
}

/// The fit of a curve's p50 over [`FIT_FROM`] and up: `t = L alpha + F n
/// beta` with the algorithm's L and F.
fn window_fit(c: &Curve) -> Result<WindowFit, String> {
    let us = c.fit_points(FIT_FROM);
    let algo = predict::ModelAlgo::of(c.fit_algo());
    let f = predict::fit(&c.row.collective, &algo, c.row.world, &us)?;
    Ok(WindowFit {
        structure: "single beta",
        alpha_us: f.alpha_us,
        bandwidth: f
            .gbps
            .map_or("-".into(), |g| format!("link {}", units::sig3(g))),
        rms: f.rms_rel_err,
        max: f.max_rel_err,
        sizes: f.points,
    })
}

fn fit_rows(curves: &[&Curve], names: &[String]) -> Vec<Vec<Cell>> {
    curves
        .iter()
        .zip(names)
        .map(|(c, name)| {
            let fit = window_fit(c);
            let peak = c
                .by_size
                .iter()
                .filter(|p| p.busbw.is_finite())
                .max_by(|a, b| a.busbw.total_cmp(&b.busbw));
            let first = c.by_size.first();
            let wrong: u64 = c.by_size.iter().map(|p| p.wrong).sum();
            let (err, poor) = match &fit {
                Ok(f) => (
                    format!("{} / {}", units::percent(f.rms), units::percent(f.max)),
                    f.rms > 0.2 || f.max > 0.2,
                ),
                Err(_) => ("-".into(), false),
            };
            vec![
                text(name.clone()),
                num(c.by_size.len().to_string()),
                match &fit {
                    Ok(f) => text(format!(
                        "{} sizes from {}, {}",
                        f.sizes,
                        units::bytes(FIT_FROM),
                        f.structure
                    )),
                    Err(e) => text(format!("no fit: {e}")),
                },
                num(fit
                    .as_ref()
                    .map_or("-".into(), |f| units::micros(f.alpha_us))),
                num(fit.as_ref().map_or("-".into(), |f| f.bandwidth.clone())),
                if poor {
                    Cell::Bad(format!("{err} poor fit"))
                } else {
                    num(err)
                },
                num(peak.map_or("-".into(), |p| {
                    format!("{} at {}", units::sig3(p.busbw), units::bytes(p.bytes))
                })),
                num(match peak {
                    Some(p) if p.ceiling > 0.0 => units::sig3(p.ceiling),
                    _ => "-".into(),
                }),
                match peak {
                    Some(p) if p.ceiling > 0.0 && p.busbw > 1.05 * p.ceiling => {
                        Cell::Bad(units::percent(p.busbw / p.ceiling))
                    }
                    Some(p) if p.ceiling > 0.0 => num(units::percent(p.busbw / p.ceiling)),
                    _ => num("-"),
                },
                num(first.map_or("-".into(), |p| {
                    format!(
                        "{} / {} at {}",
                        units::micros(p.p50),
                        units::micros(p.p99),
                        units::bytes(p.bytes)
                    )
                })),
                if wrong > 0 {
                    Cell::Bad(wrong.to_string())
                } else {
                    num("0")
                },
            ]
        })
        .collect()
}

/// The section's HTML; none without collective rows.
pub fn section(sources: &[Source]) -> Option<String> {
    let all = curves(sources);
    if all.is_empty() {
        return None;
    }
    let mut body = page::note(
        "Bus bandwidth as nccl-tests defines it (algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 otherwise; GB = 1e9 B). The model's line is the prediction recorded with each row (the alpha-beta-gamma form of its algorithm: alpha, and beta and gamma at the row's working set, measured before the sweep); the ceiling is the wire's bandwidth measured in the same run at each size's own working set (a ladder of memory copies, every rank at once, for shared memory; the better of one stream and both directions at once through the communicator for sockets), so a size that stays in cache is held against the in-cache rate. A curve is one run; more than two runs of one configuration in one folder are drawn as their median with a min..max band, and say so.",
    );
    // One chart pair per collective and element type (and operator where the
    // collective reduces): a `-d all -o all` sweep stays readable.
    let mut groups: BTreeMap<(String, String), Vec<&Curve>> = BTreeMap::new();
    for c in &all {
        groups.entry(chart_group(c.row)).or_default().push(c);
    }
    let mut fits = Vec::new();
    for ((collective, variant), curves) in &groups {
        let names = labels(curves);
        let title = format!("{collective} ({variant})");
        body.push_str(&page::h3(&title));
        // At most LEGEND_MAX curves a chart: more are drawn over several.
        let parts = curves.len().div_ceil(page::LEGEND_MAX);
        for (k, (part, part_names)) in curves
            .chunks(page::LEGEND_MAX)
            .zip(names.chunks(page::LEGEND_MAX))
            .enumerate()
        {
            let (suffix, of) = if parts > 1 {
                (format!("-{}", k + 1), format!(" ({} of {parts})", k + 1))
            } else {
                (String::new(), String::new())
            };
            let busbw_key = key(
                "measured (each size marked by its algorithm)",
                part,
                &[
                    (LineStyle::Dashed, "the model's prediction"),
                    (
                        LineStyle::Dotted,
                        "the wire's ceiling at each size's working set",
                    ),
                ],
            );
            body.push_str(&page::line_figure(
                &format!("busbw-{collective}-{variant}{suffix}"),
                &busbw_chart(&format!("{title}{of}"), part, part_names),
                &format!("{title}: measured bus bandwidth per message size, the model's prediction and the wire's ceiling."),
                &busbw_key,
            ));
            let latency_key = key(
                "p50 (each size marked by its algorithm)",
                part,
                &[(LineStyle::Dashed, "p99")],
            );
            body.push_str(&page::line_figure(
                &format!("latency-{collective}-{variant}{suffix}"),
                &latency_chart(&format!("{title}{of}"), part, part_names),
                &format!("{title}: median and 99th-percentile time per operation (each iteration timed by its slowest rank)."),
                &latency_key,
            ));
        }
        for mut row in fit_rows(curves, &names) {
            row.insert(0, text(title.clone()));
            fits.push(row);
        }
    }
    body.push_str(&page::h3("Alpha-beta fit and peaks"));
    body.push_str(&page::note(
        "Each curve's median times from 1 MiB up fitted (parbench::model) with relative error so every size counts: time = L x alpha + B x bytes x beta with the algorithm's L and B (ring all_reduce: L = 2(p-1) per slice, B = 2(p-1)/p); link = 1/beta. An error above 20% is marked poor. Peak bus bandwidth is the best single size, not a mean over sizes, held against the ceiling at that size's own working set.",
    ));
    body.push_str(&page::table(
        &[
            "collective",
            "curve",
            "sizes",
            "fit window",
            "alpha (latency)",
            "bandwidth GB/s",
            "fit rms / max error",
            "peak busbw GB/s",
            "its ceiling GB/s",
            "peak / ceiling",
            "smallest size p50 / p99",
            "#wrong",
        ],
        &fits,
    ));
    Some(page::section("collectives", "Collectives", &body))
}

#[cfg(test)]
mod tests {
    use super::unique_labels;

    #[test]
    fn legend_entries_that_collide_are_told_apart() {
        let names = vec![
            "a".to_string(),
            "a".into(),
            "b".into(),
            "c".into(),
            "c".into(),
        ];
        let out = unique_labels(names, |i| {
            if i < 2 {
                format!("run {i}")
            } else {
                "same".into()
            }
        });
        assert_eq!(
            out,
            ["a (run 0)", "a (run 1)", "b", "c (same) #4", "c (same) #5"]
        );
        let mut sorted = out.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), out.len(), "every entry names one curve");
    }
}
