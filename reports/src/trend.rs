//! `report trend DIR`: a nightly results folder's key figures night by
//! night (scripts/nightly.sh's `DIR/<date>/` folders), beside the band the
//! baseline's nights span (`DIR/baseline/<night>/`), the nights the gate
//! called a regression marked: a slowdown that crept in over weeks, each
//! night inside the noise, shows as a slope.
//!
//! The figures: busbw at the largest size of every collective and wire
//! (out of place), bench-layers' step per degree and mode, and the measured
//! bubble of every schedule at its most microbatches; each the median over
//! the night's rounds.

use crate::charts::{band_points, Axis, LineChart, LineStyle, Marker, Series};
use crate::html::page;
use crate::load::{load_sources, Source};
use crate::units;
use anyhow::{bail, Result};
use parbench::stats::median_of_finite;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A figure's name and what it measures, in its unit.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FigureKey {
    pub name: String,
    pub unit: &'static str,
}

/// The key figures of one results folder, each the median of its rounds.
pub fn figures(s: &Source) -> BTreeMap<FigureKey, f64> {
    let mut out = BTreeMap::new();
    let mut largest: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in s.collectives.iter().filter(|r| !r.in_place) {
        let k = (r.collective.clone(), format!("{}/{}", r.backend, r.wire));
        let e = largest.entry(k).or_insert(0);
        *e = (*e).max(r.bytes);
    }
    for ((coll, wire), bytes) in &largest {
        let v = median_of_finite(
            s.collectives
                .iter()
                .filter(|r| {
                    !r.in_place
                        && &r.collective == coll
                        && &format!("{}/{}", r.backend, r.wire) == wire
                        && r.bytes == *bytes
                })
                .map(|r| r.busbw_gbps),
        );
        out.insert(
            FigureKey {
                name: format!(
                    "{coll} busbw at {} ({wire}, out of place)",
                    units::bytes(*bytes as f64)
                ),
                unit: "GB/s",
            },
            v,
        );
    }
    let mut layers: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in &s.layers {
        layers
            .entry(format!(
                "bench-layers step, tp {} {} (hidden {}, {}/{})",
                r.tp,
                parbench::layers::record_mode_name(&r.mode, r.decode),
                r.hidden,
                r.backend,
                r.wire
            ))
            .or_default()
            .push(r.total_us);
    }
    for (name, v) in layers {
        out.insert(FigureKey { name, unit: "us" }, median_of_finite(v));
    }
    let mut most: BTreeMap<String, usize> = BTreeMap::new();
    for r in &s.pipeline {
        let e = most.entry(r.schedule.clone()).or_insert(0);
        *e = (*e).max(r.microbatches);
    }
    for (sched, m) in most {
        let v = median_of_finite(
            s.pipeline
                .iter()
                .filter(|r| r.schedule == sched && r.microbatches == m)
                .map(|r| r.bubble_measured),
        );
        out.insert(
            FigureKey {
                name: format!("{sched} bubble measured, M = {m}"),
                unit: "share of the step",
            },
            v,
        );
    }
    out.retain(|_, v| v.is_finite());
    out
}

/// Whether the gate called a regression on a night: its `compare.md`
/// summary counts one or more. No compare.md: the gate did not run. It
/// is read as every record is (a regular file, bounded): a FIFO or a link
/// to a device is an error, never a wait or an endless read.
fn gate_called(dir: &Path) -> Result<bool> {
    let path = dir.join("compare.md");
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(false);
    }
    let text = crate::text_file::read_text(&path)?;
    Ok(text
        .split(" regressions")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0))
}

/// The folders below `dir` that hold records, by name.
fn record_folders(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries {
        let p = e?.path();
        let has_records = ["collectives.csv", "layers.csv", "pipeline.csv"]
            .iter()
            .any(|f| p.join(f).is_file());
        if p.is_dir() && has_records {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Runs `report trend`.
pub fn run(dir: &Path, output: &Path) -> Result<()> {
    parbench::results::check_output(output, Some(page::DOCTYPE.as_bytes()))?;
    if !dir.is_dir() {
        bail!("{}: no such results folder", dir.display());
    }
    let night_dirs: Vec<PathBuf> = record_folders(dir)?
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "baseline"))
        .collect();
    if night_dirs.is_empty() {
        bail!(
            "{}: no nights (folders with records, as scripts/nightly.sh writes them)",
            dir.display()
        );
    }
    let baseline_dirs = record_folders(&dir.join("baseline"))?;
    let nights = load_sources(&night_dirs, false)?;
    let baseline = if baseline_dirs.is_empty() {
        Vec::new()
    } else {
        load_sources(&baseline_dirs, false)?
    };
    let called = night_dirs
        .iter()
        .map(|d| gate_called(d))
        .collect::<Result<Vec<bool>>>()?;
    let html = render(dir, &nights, &baseline, &night_dirs, &called);
    parbench::results::write_atomic(output, html.as_bytes())?;
    eprintln!("report: wrote {}", output.display());
    Ok(())
}

fn night_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The page: one chart per key figure.
pub fn render(
    dir: &Path,
    nights: &[Source],
    baseline: &[Source],
    dirs: &[PathBuf],
    called: &[bool],
) -> String {
    let per_night: Vec<BTreeMap<FigureKey, f64>> = nights.iter().map(figures).collect();
    let per_base: Vec<BTreeMap<FigureKey, f64>> = baseline.iter().map(figures).collect();
    let names: Vec<String> = dirs.iter().map(|d| night_name(d)).collect();
    let mut keys: Vec<&FigureKey> = per_night.iter().flat_map(|m| m.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut body = page::note(&format!(
        "{} nights of {} ({}); the baseline: {} nights. Nights: {}.",
        nights.len(),
        dir.display(),
        if called.iter().any(|&c| c) {
            format!(
                "the gate called a regression on {}",
                names
                    .iter()
                    .zip(called)
                    .filter(|(_, &c)| c)
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            "the gate called no regression".into()
        },
        baseline.len(),
        names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{} = {n}", i + 1))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for (i, key) in keys.iter().enumerate() {
        let points: Vec<(f64, f64)> = per_night
            .iter()
            .enumerate()
            .filter_map(|(n, m)| m.get(key).map(|&v| ((n + 1) as f64, v)))
            .collect();
        let base: Vec<f64> = per_base
            .iter()
            .filter_map(|m| m.get(key).copied())
            .collect();
        let mut series = Vec::new();
        if let (Some(lo), Some(hi)) = (
            base.iter().copied().reduce(f64::min),
            base.iter().copied().reduce(f64::max),
        ) {
            let xs = [1.0, nights.len().max(2) as f64];
            series.push(Series {
                label: format!(
                    "baseline: {} nights, {} .. {}",
                    base.len(),
                    units::sig3(lo),
                    units::sig3(hi)
                ),
                color: 1,
                line: LineStyle::Band,
                marker: Marker::None,
                points: band_points(&xs.map(|x| (x, lo, hi))),
            });
        }
        series.push(Series {
            label: "each night (median of its rounds)".into(),
            color: 0,
            line: LineStyle::Solid,
            marker: Marker::Circle,
            points: points.clone(),
        });
        let marked: Vec<(f64, f64)> = points
            .iter()
            .filter(|(x, _)| called.get(*x as usize - 1).copied().unwrap_or(false))
            .copied()
            .collect();
        if !marked.is_empty() {
            series.push(Series {
                label: "the gate called a regression".into(),
                color: 3,
                line: LineStyle::None,
                marker: Marker::Triangle,
                points: marked,
            });
        }
        let chart = LineChart {
            title: key.name.clone(),
            x_desc: "night".into(),
            y_desc: key.unit.into(),
            x: Axis::Linear,
            y: if key.unit == "share of the step" {
                Axis::Fraction
            } else {
                Axis::Linear
            },
            series,
            legend: Vec::new(),
        };
        body.push_str(&page::line_figure(
            &format!("trend-{i}"),
            &chart,
            &format!("{}: night by night against the baseline's band.", key.name),
            &[],
        ));
    }
    let mut out = page::head(
        &format!("parbench trend: {}", dir.display()),
        &[],
        &[("trend", "Trend")],
    );
    out.push_str(&page::section("trend", "Key figures by night", &body));
    out.push_str(page::tail());
    out
}
