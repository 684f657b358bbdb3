//! The page's first section: the few figures a reader sizing a cluster
//! wants before the charts, each computed from the same rows and model
//! calls as the sections below.

use super::collectives::{curve_fit, curves};
use super::page;
use crate::load::Source;
use crate::units;
use parbench::pipeline::analysis::bubble_parts;

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

/// The section's HTML: one bullet per finding, or a plain note.
pub fn section(sources: &[Source], capacity: &[(String, f64)]) -> String {
    let mut items: Vec<String> = Vec::new();
    let all = curves(sources);
    for c in all.iter().filter(|c| c.row.collective == "all_reduce") {
        let Some(peak) = c
            .by_size
            .iter()
            .filter(|p| p.busbw.is_finite())
            .max_by(|a, b| a.busbw.total_cmp(&b.busbw))
        else {
            continue;
        };
        let first = c.by_size.first();
        let ceiling = peak.ceiling;
        let fit = curve_fit(c).ok();
        // The run's own headline where it recorded one: the figure its
        // footer printed, not one computed again here, on the curve that
        // holds its row (another algorithm's curve of the run says nothing).
        let headline = match &c.headline {
            Some(h)
                if h.in_place == c.row.in_place
                    && c.by_size.iter().any(|p| p.bytes as u64 == h.bytes) =>
            {
                h.line.clone()
            }
            Some(_) => continue,
            None => format!(
                "peak bus bandwidth {} GB/s at {}{}",
                units::sig3(peak.busbw),
                units::bytes(peak.bytes),
                if ceiling > 0.0 {
                    format!(
                        ", {} of the ceiling at that size's working set ({} GB/s)",
                        units::percent(peak.busbw / ceiling),
                        units::sig3(ceiling)
                    )
                } else {
                    String::new()
                }
            ),
        };
        items.push(format!(
            "all_reduce on {} ({}/{}, {}, {} ranks, {}): {headline}; {} takes {} (p50){}.",
            c.source,
            c.row.backend,
            c.row.wire,
            c.row.algo,
            c.row.world,
            super::collectives::run_words(c),
            first.map_or("-".into(), |p| units::bytes(p.bytes)),
            first.map_or("-".into(), |p| units::micros(p.p50)),
            fit.map_or(String::new(), |f| format!(
                "; fitted alpha {} per message",
                units::micros(f.alpha_us)
            ))
        ));
    }
    if !capacity.is_empty() {
        let list: Vec<String> = capacity
            .iter()
            .map(|(w, us)| format!("{w} {}", units::micros(*us)))
            .collect();
        items.push(format!(
            "Worked example (80 layers x hidden 8192, TP=8, batch 32, fp16), tensor-parallel communication per token step: {}.",
            list.join("; ")
        ));
    }
    let noisy: Vec<String> = sources
        .iter()
        .flat_map(|s| {
            s.runs.iter().filter_map(move |r| {
                let n = r.noise()?;
                n.noisy().then(|| {
                    format!(
                        "{} {} ({} of the machine)",
                        s.label,
                        r.run_id,
                        units::percent(n.fraction)
                    )
                })
            })
        })
        .collect();
    if !noisy.is_empty() {
        items.push(format!(
            "NOISY runs: other processes took more than 10% of the machine while {} measured: {}. Their figures measure what those processes left; curves from them are marked NOISY.",
            if noisy.len() == 1 { "this run" } else { "these runs" },
            noisy.join("; ")
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
    let rows: usize = sources.iter().map(|s| s.collectives.len()).sum();
    if rows > 0 {
        items.push(if wrong == 0 {
            format!("Correctness: no wrong element in {rows} collective measurements.")
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
        items.push(match why {
            None => format!(
                "Pipeline: over {} runs the measured bubble agrees with the simulation within {:.1} points.",
                pipe.len(),
                gap * 100.0
            ),
            Some(why) => format!(
                "Pipeline: the measured bubble PARTS from the simulation by up to {:.1} points ({} S={} M={}: measured {} against {}); {why}.",
                gap * 100.0,
                worst.schedule,
                worst.stages,
                worst.microbatches,
                units::percent(worst.bubble_measured),
                units::percent(worst.bubble_simulated),
            ),
        });
    }
    items.extend(conclusions(sources, &all, &pipe));
    let body = if items.is_empty() {
        page::empty("Nothing to summarise.")
    } else {
        let mut b = String::from("<ul class=\"summary\">\n");
        for i in items {
            b.push_str(&format!("<li>{}</li>\n", super::escape::esc(&i)));
        }
        b.push_str("</ul>\n");
        b
    };
    page::section("summary", "Summary", &body)
}
