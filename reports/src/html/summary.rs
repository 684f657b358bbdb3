//! The page's first section: one table that answers the suite's questions
//! (per wire and collective the peak bus bandwidth against the ceiling;
//! per layer configuration what tensor parallelism costs; per schedule the
//! bubble measured, simulated and by formula; the plan's best layout and
//! its band), then a few notes. Every figure comes from the same rows and
//! model calls as the sections below.

use super::collectives::{curves, run_words, Curve};
use super::page::{self, num, text, Cell};
use crate::load::Source;
use crate::units;
use parbench::pipeline::analysis::bubble_parts;
use parbench::results::{LayerRow, PipelineRow};

/// The cores a folder's pipeline run recorded (0 when none did).
fn pipeline_cores(sources: &[Source]) -> usize {
    sources
        .iter()
        .flat_map(|s| &s.runs)
        .filter(|r| r.suite == "pipeline" && r.cores > 0)
        .map(|r| r.cores)
        .min()
        .unwrap_or(0)
}

/// One line per section that says what to conclude: the collective
/// farthest below its ceiling, the schedule with the most bubble, the
/// plan's best layout and what it loses to.
fn conclusions(
    sources: &[Source],
    all: &[super::collectives::Curve],
    pipe: &[&parbench::results::PipelineRow],
) -> Vec<String> {
    let mut out = Vec::new();
    let farthest = all
        .iter()
        .flat_map(|c| c.by_size.iter().map(move |p| (c, p)))
        .filter(|(_, p)| p.ceiling > 0.0 && p.busbw.is_finite() && p.bytes >= 1_048_576.0)
        .min_by(|a, b| (a.1.busbw / a.1.ceiling).total_cmp(&(b.1.busbw / b.1.ceiling)));
    if let Some((c, p)) = farthest {
        out.push(format!(
            "Conclude (collectives): farthest below its ceiling from 1 MiB is {} at {} on {}/{} ({} ranks): {} of what the wire moves at that working set; the other collectives do better.",
            c.row.collective,
            units::bytes(p.bytes),
            c.row.backend,
            c.row.wire,
            c.row.world,
            units::percent(p.busbw / p.ceiling)
        ));
    }
    if let Some(most) = pipe
        .iter()
        .filter(|r| r.stages > 1)
        .max_by(|a, b| a.bubble_measured.total_cmp(&b.bubble_measured))
    {
        out.push(format!(
            "Conclude (pipeline): the most bubble is {} with S={} and M={}: {} of the step idle (simulated {}); more microbatches per stage shrink it.",
            most.schedule,
            most.stages,
            most.microbatches,
            units::percent(most.bubble_measured),
            units::percent(most.bubble_simulated)
        ));
    }
    for s in sources {
        if let Ok(Some(plan)) = crate::plan_cmd::read_plan(&s.dir) {
            if let Some(best) = plan.top.first() {
                out.push(format!(
                    "Conclude (plan, {}): the best layout is {} at {} tokens/s; its largest overhead is {} ({} of the step).",
                    s.label,
                    best.layout,
                    units::sig3(best.tokens_per_s),
                    best.dominant_overhead().describe().trim_start_matches("largest overhead: "),
                    units::percent(
                        [best.bubble_s, best.tp_comm_s, best.dp_comm_s]
                            .into_iter()
                            .fold(0.0, f64::max)
                            / best.step_s
                    )
                ));
            }
        }
    }
    out
}

/// One answer: the question, what it is about, the figure, its reference.
fn answer(q: &str, about: String, figure: String, against: String) -> Vec<Cell> {
    vec![text(q), text(about), num(figure), num(against)]
}

/// Per wire and collective: its peak bus bandwidth against the ceiling at
/// that size's working set (the figure the run's own footer printed, where
/// it recorded one).
fn collective_answers(all: &[Curve]) -> Vec<Vec<Cell>> {
    all.iter()
        .filter_map(|c| {
            let peak = c
                .by_size
                .iter()
                .filter(|p| p.busbw.is_finite())
                .max_by(|a, b| a.busbw.total_cmp(&b.busbw))?;
            // The run's headline names its peak row; that row's figures.
            let peak = match &c.headline {
                Some(h) if h.in_place == c.row.in_place => c
                    .by_size
                    .iter()
                    .find(|p| p.bytes as u64 == h.bytes)
                    .unwrap_or(peak),
                _ => peak,
            };
            let about = format!(
                "{} on {}/{}, {} ranks, {}; {}",
                c.row.collective,
                c.row.backend,
                c.row.wire,
                c.row.world,
                c.algo_label(),
                run_words(c)
            );
            let against = if peak.ceiling > 0.0 {
                format!(
                    "{} of the ceiling {} GB/s",
                    units::percent(peak.busbw / peak.ceiling),
                    units::sig3(peak.ceiling)
                )
            } else {
                "no ceiling measured".into()
            };
            Some(answer(
                "peak bus bandwidth",
                format!("{}: {about}", c.source),
                format!(
                    "{} GB/s at {}",
                    units::sig3(peak.busbw),
                    units::bytes(peak.bytes)
                ),
                against,
            ))
        })
        .collect()
}

/// Per layer configuration: what each tensor-parallel degree above 1
/// costs in communication, and what it buys over TP=1.
fn layer_answers(sources: &[Source]) -> Vec<Vec<Cell>> {
    let mut out = Vec::new();
    for s in sources {
        let mut configs: std::collections::BTreeMap<String, Vec<&LayerRow>> = Default::default();
        for r in &s.layers {
            let name = format!(
                "{}: {} {} on {}/{} (h{}, seq {}, b {})",
                s.label,
                r.preset,
                parbench::layers::record_mode_name(&r.mode, r.decode),
                r.backend,
                r.wire,
                r.hidden,
                r.seq,
                r.batch
            );
            configs.entry(name).or_default().push(r);
        }
        for (name, rows) in configs {
            let costs: Vec<String> = rows
                .iter()
                .filter(|r| r.tp > 1 && r.total_us > 0.0)
                .map(|r| {
                    let waiting = if r.wait_us.is_finite() {
                        format!(" + {} waiting", units::micros(r.wait_us))
                    } else {
                        String::new()
                    };
                    format!(
                        "TP {}: {} communication{waiting}, {} of the block ({}); {:.2}x TP 1",
                        r.tp,
                        units::micros(r.comm_us),
                        units::percent(r.comm_us / r.total_us),
                        units::micros(r.total_us),
                        r.speedup
                    )
                })
                .collect();
            if costs.is_empty() {
                continue;
            }
            let model: Vec<String> = rows
                .iter()
                .filter(|r| r.tp > 1 && r.comm_model_us.is_finite())
                .map(|r| format!("TP {}: {}", r.tp, units::micros(r.comm_model_us)))
                .collect();
            out.push(answer(
                "tensor-parallel cost",
                name,
                costs.join("; "),
                if model.is_empty() {
                    "no model".into()
                } else {
                    format!("model's communication {}", model.join(", "))
                },
            ));
        }
    }
    out
}

/// Per schedule (and stage count): the bubble at its most microbatches,
/// measured beside the simulation and the closed form.
fn pipeline_answers(sources: &[Source]) -> Vec<Vec<Cell>> {
    let mut out = Vec::new();
    for s in sources {
        let mut most: std::collections::BTreeMap<(String, usize, String), &PipelineRow> =
            Default::default();
        for r in &s.pipeline {
            let k = (super::pipeline::schedule_name(r), r.stages, r.work.clone());
            let e = most.entry(k).or_insert(r);
            if r.microbatches > e.microbatches {
                *e = r;
            }
        }
        for ((schedule, stages, work), r) in most {
            out.push(answer(
                "pipeline bubble",
                format!(
                    "{}: {schedule}, {stages} stages, M={}, work {work}",
                    s.label, r.microbatches
                ),
                format!(
                    "{} measured, {} simulated",
                    units::percent(r.bubble_measured),
                    units::percent(r.bubble_simulated)
                ),
                format!("formula {}", units::percent(r.bubble_formula)),
            ));
        }
    }
    out
}

/// Per plan (a `plan.json` among the folders): its best layout and the
/// band of the stack it was costed with.
fn plan_answers(sources: &[Source]) -> Vec<Vec<Cell>> {
    let mut out = Vec::new();
    for s in sources {
        let Ok(Some(plan)) = crate::plan_cmd::read_plan(&s.dir) else {
            continue;
        };
        let Some(best) = plan.top.first() else {
            continue;
        };
        out.push(answer(
            "best layout",
            format!("{}: {} on {} devices", s.label, plan.model, plan.gpus),
            format!(
                "{}: {} tokens/s",
                best.layout,
                units::sig3(best.tokens_per_s)
            ),
            plan.band
                .as_ref()
                .map_or("no stack: no band".into(), |b| b.line()),
        ));
    }
    out
}

/// The section's HTML: the answers, then the notes; none when the folders
/// hold nothing to answer with.
pub fn section(sources: &[Source]) -> Option<String> {
    let all = curves(sources);
    let mut rows = collective_answers(&all);
    rows.extend(layer_answers(sources));
    rows.extend(
        super::cp_moe::ring_answers(sources)
            .into_iter()
            .map(|(of, hidden, against)| answer("CP ring: share hidden", of, hidden, against)),
    );
    rows.extend(pipeline_answers(sources));
    rows.extend(plan_answers(sources));
    // One folder: its name before every answer says nothing.
    if let [only] = sources {
        let prefix = format!("{}: ", only.label);
        for r in &mut rows {
            if let Cell::Text(t) = &mut r[1] {
                if let Some(rest) = t.strip_prefix(&prefix) {
                    *t = rest.to_string();
                }
            }
        }
    }
    let mut items: Vec<String> = Vec::new();
    let noisy: Vec<(String, f64)> = sources
        .iter()
        .flat_map(|s| {
            s.runs.iter().filter_map(move |r| {
                let n = r.noise()?;
                n.noisy()
                    .then(|| (format!("{} {}", s.label, r.suite), n.fraction))
            })
        })
        .collect();
    // "results collectives x3, results layers": each folder's suites once.
    let mut named: Vec<(String, usize)> = Vec::new();
    for (n, _) in &noisy {
        match named.iter_mut().find(|(m, _)| m == n) {
            Some((_, k)) => *k += 1,
            None => named.push((n.clone(), 1)),
        }
    }
    let runs: usize = sources.iter().map(|s| s.runs.len()).sum();
    if !noisy.is_empty() {
        let (lo, hi) = noisy
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(a, b), (_, f)| {
                (a.min(*f), b.max(*f))
            });
        items.push(format!(
            "NOISY: {} of {runs} runs ({}): other processes took {} of the machine while they measured; their figures measure what those processes left.",
            noisy.len(),
            named
                .iter()
                .map(|(n, k)| if *k > 1 { format!("{n} x{k}") } else { n.clone() })
                .collect::<Vec<_>>()
                .join(", "),
            if hi > lo * 1.001 {
                format!("{}..{}", units::percent(lo), units::percent(hi))
            } else {
                units::percent(hi)
            }
        ));
    }
    let above: usize = all
        .iter()
        .flat_map(|c| &c.by_size)
        .filter(|p| p.ceiling > 0.0 && p.busbw > 1.05 * p.ceiling)
        .count();
    if above > 0 {
        items.push(format!(
            "{above} measured sizes beat the ceiling at their own working set by more than 5%: bench-collectives' table marks them (!) and says why in its footer."
        ));
    }
    let wrong: u64 = sources
        .iter()
        .flat_map(|s| &s.collectives)
        .map(|r| r.wrong)
        .sum();
    let measured: usize = sources.iter().map(|s| s.collectives.len()).sum();
    if measured > 0 {
        items.push(if wrong == 0 {
            format!("Correctness: no wrong element in {measured} collective measurements.")
        } else {
            format!("Correctness: {wrong} WRONG elements in the collective measurements (see the #wrong column).")
        });
    }
    let pipe: Vec<_> = sources
        .iter()
        .flat_map(|s| &s.pipeline)
        .filter(|r| r.bubble_measured.is_finite() && r.bubble_simulated.is_finite())
        .collect();
    if let Some(worst) = pipe.iter().max_by(|a, b| {
        (a.bubble_measured - a.bubble_simulated)
            .abs()
            .total_cmp(&(b.bubble_measured - b.bubble_simulated).abs())
    }) {
        let gap = (worst.bubble_measured - worst.bubble_simulated).abs();
        // The rule bench-pipeline warns by, read on the recorded row.
        let why = bubble_parts(
            worst.bubble_measured,
            worst.bubble_simulated,
            worst.stages * worst.dp.max(1) * worst.tp.max(1),
            pipeline_cores(sources),
            worst.work.starts_with("sleep"),
        );
        if let Some(why) = why {
            items.push(format!(
                "Pipeline: the measured bubble parts from the simulation by up to {:.1} points ({} S={} M={}: measured {} against {}); {why}.",
                gap * 100.0,
                worst.schedule,
                worst.stages,
                worst.microbatches,
                units::percent(worst.bubble_measured),
                units::percent(worst.bubble_simulated),
            ));
        }
    }
    items.extend(conclusions(sources, &all, &pipe));
    if rows.is_empty() && items.is_empty() {
        return None;
    }
    let mut body = String::new();
    if !rows.is_empty() {
        body.push_str(&page::table_of(
            "answers",
            &["question", "of", "answer", "against"],
            &rows,
        ));
    }
    if !items.is_empty() {
        body.push_str("<ul class=\"summary\">\n");
        for i in items {
            body.push_str(&format!("<li>{}</li>\n", super::escape::esc(&i)));
        }
        body.push_str("</ul>\n");
    }
    Some(page::section("summary", "Summary", &body))
}
