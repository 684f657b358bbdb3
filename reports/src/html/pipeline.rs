//! The pipeline section: the bubble against the number of microbatches per
//! schedule (measured end to end, simulated from the measured per-action
//! costs, and the closed form), the run table, and each run's timeline.

use super::page::{self, num, text, Cell, KeyItem, CHART_W};
use crate::charts::{self, Axis, LegendItem, LineChart, LineStyle, Marker, Series, TimelineChart};
use crate::load::Source;
use crate::units;
use parbench::results::PipelineRow;
use std::collections::BTreeMap;

/// Timelines drawn per report at most; a sweep can record hundreds.
const MAX_TIMELINES: usize = 40;

pub(super) fn schedule_name(r: &PipelineRow) -> String {
    if r.chunks > 1 {
        format!("{} v={}", r.schedule, r.chunks)
    } else {
        r.schedule.clone()
    }
}

fn group_name(source: &str, r: &PipelineRow) -> String {
    format!(
        "{source}: {}/{} {} stages, work {}, layers {}, hidden {}, b {}{}",
        r.backend,
        r.wire,
        r.stages,
        r.work,
        r.stage_layers,
        r.hidden,
        r.microbatch_size,
        if r.straggler.is_empty() {
            String::new()
        } else {
            format!(", straggler {}", r.straggler)
        }
    )
}

/// The bubble's three curves per schedule, in the legend's order: the name,
/// how it is drawn, and the row's figure.
type BubbleCurve = (&'static str, LineStyle, Marker, fn(&PipelineRow) -> f64);
const BUBBLES: [BubbleCurve; 3] = [
    ("measured", LineStyle::Solid, Marker::Circle, |r| {
        r.bubble_measured
    }),
    ("simulated", LineStyle::Dashed, Marker::Square, |r| {
        r.bubble_simulated
    }),
    ("closed form", LineStyle::Dotted, Marker::None, |r| {
        r.bubble_formula
    }),
];

fn bubble_chart(rows: &[&PipelineRow]) -> LineChart {
    let mut by_schedule: BTreeMap<String, Vec<&PipelineRow>> = BTreeMap::new();
    for r in rows {
        by_schedule.entry(schedule_name(r)).or_default().push(r);
    }
    let mut series = Vec::new();
    let mut legend = Vec::new();
    for (i, (name, mut rs)) in by_schedule.into_iter().enumerate() {
        legend.push(LegendItem {
            label: name.clone(),
            color: i,
            line: LineStyle::Solid,
            marker: Marker::None,
        });
        rs.sort_by_key(|r| r.microbatches);
        let pts = |f: fn(&PipelineRow) -> f64| -> Vec<(f64, f64)> {
            rs.iter()
                .map(|r| (r.microbatches as f64, f(r)))
                .filter(|p| p.1.is_finite())
                .collect()
        };
        for &(what, line, marker, bubble) in &BUBBLES {
            series.push(Series {
                label: format!("{name} {what}"),
                color: i,
                line,
                marker,
                points: pts(bubble),
            });
        }
    }
    LineChart {
        title: "bubble: idle share of the step against microbatches".into(),
        x_desc: "microbatches per step (log2)".into(),
        y_desc: "idle time / (ranks x step time)".into(),
        x: Axis::Log2Count,
        y: Axis::Fraction,
        series,
        legend,
    }
}

/// `part_us` (summed over the ranks, per step) as a share of the row's idle
/// time, with the time itself; `-` for rows written before it was measured.
fn idle_share(part_us: f64, r: &PipelineRow) -> String {
    let idle = r.idle_us * r.stages as f64;
    if !part_us.is_finite() || idle.is_nan() || idle <= 0.0 {
        return "-".into();
    }
    format!(
        "{} ({})",
        units::percent(part_us / idle),
        units::micros(part_us)
    )
}

fn run_table(rows: &[&PipelineRow]) -> String {
    let cells: Vec<Vec<Cell>> = rows
        .iter()
        .map(|r| {
            vec![
                text(schedule_name(r)),
                num(r.stages.to_string()),
                num(r.microbatches.to_string()),
                num(units::micros(r.step_us)),
                num(format!(
                    "{} .. {}",
                    units::micros(r.step_min_us),
                    units::micros(r.step_max_us)
                )),
                num(units::percent(r.bubble_measured)),
                num(units::percent(r.bubble_simulated)),
                num(units::percent(r.bubble_formula)),
                num(format!(
                    "{:+.1} pt",
                    (r.bubble_measured - r.bubble_simulated) * 100.0
                )),
                num(format!(
                    "{} ({})",
                    r.peak_activations,
                    units::bytes(r.peak_activation_bytes as f64)
                )),
                num(r.expected_peak_activations.to_string()),
                super::layers::check_cell(r.grad_max_err),
                num(if r.bubble_replayed.is_finite() {
                    units::percent(r.bubble_replayed)
                } else {
                    "-".into()
                }),
                num(if r.message_us.is_finite() {
                    units::micros(r.message_us)
                } else {
                    "-".into()
                }),
                num(idle_share(r.wait_us, r)),
                num(idle_share(r.transfer_us, r)),
                num(if r.clock_uncertainty_us.is_finite() {
                    format!("+/- {}", units::micros(r.clock_uncertainty_us))
                } else {
                    "-".into()
                }),
            ]
        })
        .collect();
    page::table(
        &[
            "schedule",
            "stages",
            "microbatches",
            "step",
            "step min .. max",
            "bubble measured",
            "simulated",
            "closed form",
            "measured - simulated",
            "peak activations (bytes)",
            "expected peak",
            "gradient error",
            "replayed",
            "message",
            "idle waiting",
            "idle transfer",
            "clock",
        ],
        &cells,
    )
}

/// A name cut into text and numbers, so that `M4` sorts before `M16`.
fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut digits = String::new();
    for ch in name.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
        } else {
            if !digits.is_empty() {
                out.push((
                    std::mem::take(&mut text),
                    digits.parse().unwrap_or(u64::MAX),
                ));
                digits.clear();
            }
            text.push(ch);
        }
    }
    out.push((text, digits.parse().unwrap_or(0)));
    out
}

fn timelines(sources: &[Source]) -> String {
    let mut out = String::new();
    let mut drawn = 0;
    let mut total = 0;
    for s in sources {
        // By schedule, then stages and microbatches as numbers (M=1, 4,
        // 16; not the file names' M1, M16, M4), then the file's name.
        let mut files: Vec<_> = s.timelines.iter().collect();
        files.sort_by_key(|(file, _)| {
            let row = s
                .pipeline
                .iter()
                .find(|r| r.timeline.trim() == file.as_str());
            (
                row.map(|r| (r.schedule.clone(), r.stages, r.microbatches, r.chunks)),
                natural_key(file),
            )
        });
        for (file, tl) in files {
            let rows: Vec<&PipelineRow> = s
                .pipeline
                .iter()
                .filter(|r| r.timeline.trim() == file)
                .collect();
            for (k, run) in tl.runs.iter().enumerate() {
                total += 1;
                if drawn >= MAX_TIMELINES {
                    continue;
                }
                drawn += 1;
                let title = match (rows.as_slice(), tl.runs.len()) {
                    ([r], 1) => format!(
                        "{}: {} S={} M={} step {}",
                        s.label,
                        schedule_name(r),
                        r.stages,
                        r.microbatches,
                        units::micros(r.step_us)
                    ),
                    _ => format!("{}: {} ({file})", s.label, run.title),
                };
                out.push_str(&page::figure(
                    &format!("timeline-{}-{file}-{k}", s.label),
                    charts::timeline_chart(
                        &TimelineChart {
                            title: title.clone(),
                            lanes: &run.lanes,
                        },
                        CHART_W,
                    ),
                    &format!("{title}: each rank's actions from {file}; light grey waiting for the peer, yellow transfers and white gaps are the bubble."),
                ));
            }
        }
    }
    if total == 0 {
        return String::new();
    }
    if drawn < total {
        out.push_str(&page::note(&format!(
            "{drawn} of {total} timelines drawn; open the timeline-*.json files in Perfetto (ui.perfetto.dev) for the others."
        )));
    }
    out
}

/// The section's HTML; none without pipeline rows.
pub fn section(sources: &[Source]) -> Option<String> {
    let mut groups: BTreeMap<String, Vec<&PipelineRow>> = BTreeMap::new();
    for s in sources {
        for r in &s.pipeline {
            groups.entry(group_name(&s.label, r)).or_default().push(r);
        }
    }
    if groups.is_empty() {
        return None;
    }
    let mut body = page::note(
        "The bubble is the idle share of the step, measured end to end: each rank's idle time over ranks x step time. Beside it, the simulator's prediction from the measured per-action costs, and the closed form for equal stages and free communication ((S-1)/(S+M-1) for GPipe and 1F1B, 1/v of that bubble time for interleaved, (S-1)(T_F+T_B-T_W) for ZB-H1). In the table, replayed is the simulator replaying each step with its own measured action times, message the one-way time of one activation message between ranks 0 and 1, idle waiting the share of idle time spent waiting for a peer that had not yet sent, idle transfer the share spent on messages already sent but not yet in hand, and clock the largest uncertainty of any rank's times on the run's common time base (0 for threads of one process).",
    );
    for (i, (name, mut rows)) in groups.into_iter().enumerate() {
        rows.sort_by(|a, b| {
            (schedule_name(a), a.microbatches).cmp(&(schedule_name(b), b.microbatches))
        });
        body.push_str(&page::h3(&name));
        let key: Vec<KeyItem> = BUBBLES
            .iter()
            .map(|&(what, line, marker, _)| KeyItem {
                line,
                marker,
                text: what.to_string(),
            })
            .collect();
        body.push_str(&page::line_figure(
            &format!("bubble-{i}"),
            &bubble_chart(&rows),
            &format!("{name}: bubble against microbatches per schedule."),
            &key,
        ));
        body.push_str(&run_table(&rows));
    }
    let timelines = timelines(sources);
    if !timelines.is_empty() {
        body.push_str(&page::h3("Timelines"));
        body.push_str(&timelines);
    }
    Some(page::section("pipeline", "Pipeline schedules", &body))
}

#[cfg(test)]
mod natural_order_tests {
    use super::natural_key;

    #[test]
    fn microbatch_counts_sort_as_numbers() {
        let mut files = vec![
            "tl-1f1b-S2-M16-v1.json",
            "tl-1f1b-S2-M1-v1.json",
            "tl-1f1b-S2-M4-v1.json",
        ];
        files.sort_by_key(|f| natural_key(f));
        assert_eq!(
            files,
            [
                "tl-1f1b-S2-M1-v1.json",
                "tl-1f1b-S2-M4-v1.json",
                "tl-1f1b-S2-M16-v1.json"
            ]
        );
    }
}
