//! The collectives section: bus bandwidth and latency against message size
//! per collective, one series per (results folder, wire, algorithm, ranks,
//! type, op), each beside the model's line and the wire's measured ceiling;
//! then the alpha-beta fit of each series.

use super::page::{self, num, text, Cell, CHART_H, CHART_W};
use crate::charts::{self, Axis, LineChart, LineStyle, Marker, Series};
use crate::load::Source;
use crate::predict;
use crate::units;
use parbench::results::CollectiveRow;
use std::collections::BTreeMap;

/// The rows of one measured curve, one per message size.
pub struct Curve<'a> {
    pub source: &'a str,
    pub row: &'a CollectiveRow,
    /// Rows by size (median over repeats when a size was run more than once).
    pub by_size: Vec<SizePoint>,
}

/// One message size of a curve.
#[derive(Clone, Copy, Debug)]
pub struct SizePoint {
    pub bytes: f64,
    pub time_us: f64,
    pub busbw: f64,
    pub p50: f64,
    pub p99: f64,
    pub model_us: f64,
    pub ceiling: f64,
    pub wrong: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The identity of a curve (everything but the size).
fn curve_key(
    source: &str,
    r: &CollectiveRow,
) -> (
    String,
    String,
    String,
    String,
    usize,
    String,
    String,
    i64,
    bool,
) {
    (
        source.to_string(),
        r.collective.clone(),
        r.backend.clone(),
        r.wire.clone(),
        r.world,
        r.algo.clone(),
        format!("{}/{}", r.dtype, r.op),
        r.root,
        r.in_place,
    )
}

/// Every curve of every source. Out-of-place curves are drawn; an in-place
/// curve only where its out-of-place twin was not measured.
pub fn curves(sources: &[Source]) -> Vec<Curve<'_>> {
    let mut groups: BTreeMap<_, (&str, Vec<&CollectiveRow>)> = BTreeMap::new();
    for s in sources {
        for r in &s.collectives {
            groups
                .entry(curve_key(&s.label, r))
                .or_insert((s.label.as_str(), Vec::new()))
                .1
                .push(r);
        }
    }
    let keys: Vec<_> = groups.keys().cloned().collect();
    let mut out = Vec::new();
    for (key, (source, rows)) in groups {
        if key.8 {
            let mut twin = key.clone();
            twin.8 = false;
            if keys.contains(&twin) {
                continue;
            }
        }
        let mut sizes: BTreeMap<u64, Vec<&CollectiveRow>> = BTreeMap::new();
        for r in &rows {
            sizes.entry(r.bytes).or_default().push(r);
        }
        let by_size = sizes
            .into_iter()
            .map(|(bytes, rs)| {
                let m = |f: fn(&CollectiveRow) -> f64| median(rs.iter().map(|r| f(r)).collect());
                SizePoint {
                    bytes: bytes as f64,
                    time_us: m(|r| r.time_us),
                    busbw: m(|r| r.busbw_gbps),
                    p50: m(|r| r.p50_us),
                    p99: m(|r| r.p99_us),
                    model_us: m(|r| r.model_us),
                    ceiling: m(|r| r.ceiling_gbps),
                    wrong: rs.iter().map(|r| r.wrong).sum(),
                }
            })
            .collect();
        out.push(Curve {
            source,
            row: rows[0],
            by_size,
        });
    }
    out
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
            c.row.algo.clone(),
            format!("np{}", c.row.world),
            format!("{} {}", c.row.dtype, c.row.op),
            if c.row.in_place {
                "in-place".into()
            } else {
                String::new()
            },
        ]
    };
    let all: Vec<Vec<String>> = curves.iter().map(|c| fields(c)).collect();
    let varies: Vec<bool> = (0..6)
        .map(|i| all.iter().any(|f| f[i] != all[0][i]))
        .collect();
    all.iter()
        .map(|f| {
            let parts: Vec<&str> = f
                .iter()
                .enumerate()
                .filter(|(i, v)| (varies[*i] || *i == 1) && !v.is_empty())
                .map(|(_, v)| v.as_str())
                .collect();
            parts.join(" ")
        })
        .collect()
}

fn busbw_chart(collective: &str, curves: &[&Curve], names: &[String]) -> LineChart {
    let mut series = Vec::new();
    let mut ceilings_drawn: Vec<(&str, &str, &str)> = Vec::new();
    for (i, (c, name)) in curves.iter().zip(names).enumerate() {
        series.push(Series {
            label: format!("{name} measured"),
            color: i,
            line: LineStyle::Solid,
            marker: Marker::Circle,
            points: c.by_size.iter().map(|p| (p.bytes, p.busbw)).collect(),
        });
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
                label: format!("{name} model"),
                color: i,
                line: LineStyle::Dashed,
                marker: Marker::None,
                points: model,
            });
        }
        let ceiling = median(
            c.by_size
                .iter()
                .map(|p| p.ceiling)
                .filter(|v| *v > 0.0)
                .collect(),
        );
        // One ceiling line per wire: the curves of one folder and wire (an
        // `auto` sweep splits by algorithm) share the ceiling measured once.
        let wire = (c.source, c.row.backend.as_str(), c.row.wire.as_str());
        if ceiling.is_finite() && ceiling > 0.0 && !ceilings_drawn.contains(&wire) {
            ceilings_drawn.push(wire);
            let same_wire = curves
                .iter()
                .filter(|o| (o.source, o.row.backend.as_str(), o.row.wire.as_str()) == wire);
            let lo = same_wire
                .clone()
                .filter_map(|o| o.by_size.first())
                .map(|p| p.bytes)
                .fold(f64::INFINITY, f64::min);
            let hi = same_wire
                .filter_map(|o| o.by_size.last())
                .map(|p| p.bytes)
                .fold(0.0, f64::max);
            series.push(Series {
                label: format!(
                    "ceiling {} GB/s: {} {}/{}",
                    units::sig3(ceiling),
                    c.source,
                    c.row.backend,
                    c.row.wire
                ),
                color: i,
                line: LineStyle::Dotted,
                marker: Marker::None,
                points: vec![(lo, ceiling), (hi, ceiling)],
            });
        }
    }
    LineChart {
        title: format!("{collective}: bus bandwidth against message size"),
        x_desc: "message size (bytes per rank's buffer, log2)".into(),
        y_desc: "bus bandwidth (GB/s)".into(),
        x: Axis::Log2Bytes,
        y: Axis::Linear,
        series,
        legend_title: String::new(),
    }
}

fn latency_chart(collective: &str, curves: &[&Curve], names: &[String]) -> LineChart {
    let mut series = Vec::new();
    for (i, (c, name)) in curves.iter().zip(names).enumerate() {
        series.push(Series {
            label: format!("{name} p50"),
            color: i,
            line: LineStyle::Solid,
            marker: Marker::Circle,
            points: c.by_size.iter().map(|p| (p.bytes, p.p50)).collect(),
        });
        series.push(Series {
            label: format!("{name} p99"),
            color: i,
            line: LineStyle::Dashed,
            marker: Marker::Triangle,
            points: c.by_size.iter().map(|p| (p.bytes, p.p99)).collect(),
        });
    }
    LineChart {
        title: format!("{collective}: time per operation, p50 and p99 of iterations"),
        x_desc: "message size (log2)".into(),
        y_desc: "time per operation (log10)".into(),
        x: Axis::Log2Bytes,
        y: Axis::Log10Micros,
        series,
        legend_title: String::new(),
    }
}

/// The alpha-beta fit of a curve's mean times with its own algorithm.
pub fn curve_fit(c: &Curve) -> Result<predict::Fit, String> {
    let pts: Vec<(u64, f64)> = c
        .by_size
        .iter()
        .map(|p| (p.bytes as u64, p.time_us))
        .collect();
    predict::fit(&c.row.collective, &c.row.algo, c.row.world, &pts)
}

fn fit_rows(curves: &[&Curve], names: &[String]) -> Vec<Vec<Cell>> {
    curves
        .iter()
        .zip(names)
        .map(|(c, name)| {
            let fit = curve_fit(c);
            let peak = c
                .by_size
                .iter()
                .filter(|p| p.busbw.is_finite())
                .max_by(|a, b| a.busbw.total_cmp(&b.busbw));
            let ceiling = median(
                c.by_size
                    .iter()
                    .map(|p| p.ceiling)
                    .filter(|v| *v > 0.0)
                    .collect(),
            );
            let first = c.by_size.first();
            let wrong: u64 = c.by_size.iter().map(|p| p.wrong).sum();
            vec![
                text(name.clone()),
                num(c.by_size.len().to_string()),
                match &fit {
                    Ok(f) => num(units::micros(f.alpha_us)),
                    Err(e) => text(format!("no fit: {e}")),
                },
                num(fit
                    .as_ref()
                    .ok()
                    .and_then(|f| f.gbps)
                    .map_or("-".into(), units::sig3)),
                num(fit
                    .as_ref()
                    .map_or("-".into(), |f| units::percent(f.rms_rel_err))),
                num(peak.map_or("-".into(), |p| {
                    format!("{} at {}", units::sig3(p.busbw), units::bytes(p.bytes))
                })),
                num(if ceiling.is_finite() {
                    units::sig3(ceiling)
                } else {
                    "-".into()
                }),
                num(match peak {
                    Some(p) if ceiling > 0.0 => units::percent(p.busbw / ceiling),
                    _ => "-".into(),
                }),
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

/// The section's HTML.
pub fn section(sources: &[Source]) -> String {
    let all = curves(sources);
    if all.is_empty() {
        return page::section(
            "collectives",
            "Collectives",
            &page::empty("No collective measurements in these results folders (no collectives.csv rows). Run bench-collectives --out DIR to add them."),
        );
    }
    let mut body = page::note(
        "Bus bandwidth as nccl-tests defines it (algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 otherwise; GB = 1e9 B). The model's line is the alpha-beta prediction recorded with each row; the ceiling is the wire's bandwidth measured in the same run (memory copy for shared memory, one socket stream for TCP).",
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
        body.push_str(&page::figure(
            &format!("busbw-{collective}-{variant}"),
            charts::line_chart(&busbw_chart(&title, curves, &names), CHART_W, CHART_H),
            &format!("{title}: measured bus bandwidth per message size, the model's prediction and the wire's ceiling."),
        ));
        body.push_str(&page::figure(
            &format!("latency-{collective}-{variant}"),
            charts::line_chart(&latency_chart(&title, curves, &names), CHART_W, CHART_H),
            &format!("{title}: median and 99th-percentile time per operation (each iteration timed by its slowest rank)."),
        ));
        for mut row in fit_rows(curves, &names) {
            row.insert(0, text(title.clone()));
            fits.push(row);
        }
    }
    body.push_str(&page::h3("Alpha-beta fit and peaks"));
    body.push_str(&page::note(
        "Each curve's mean times fitted (parbench::model::fit) to its algorithm's alpha-beta cost, time = L x alpha + B x bytes x beta (ring all_reduce: L = 2(p-1) per slice, B = 2(p-1)/p), minimising relative error so every size counts; alpha is the latency per message and 1/beta the bandwidth per link (for algo auto: per call, and the asymptotic bus bandwidth). Peak bus bandwidth is the best single size, not a mean over sizes.",
    ));
    body.push_str(&page::table(
        &[
            "collective",
            "curve",
            "sizes",
            "alpha (latency)",
            "link GB/s (1/beta)",
            "fit rms error",
            "peak busbw GB/s",
            "ceiling GB/s",
            "peak / ceiling",
            "smallest size p50 / p99",
            "#wrong",
        ],
        &fits,
    ));
    page::section("collectives", "Collectives", &body)
}
