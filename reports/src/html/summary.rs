//! The page's first section: the few figures a reader sizing a cluster
//! wants before the charts, each computed from the same rows and model
//! calls as the sections below.

use super::collectives::{curve_fit, curves};
use super::page;
use crate::load::Source;
use crate::units;

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
        items.push(format!(
            "all_reduce on {} ({}/{}, {}, {} ranks, {}): peak bus bandwidth {} GB/s at {}{}; {} takes {} (p50){}.",
            c.source,
            c.row.backend,
            c.row.wire,
            c.row.algo,
            c.row.world,
            super::collectives::run_words(c),
            units::sig3(peak.busbw),
            units::bytes(peak.bytes),
            if ceiling > 0.0 {
                format!(", {} of the ceiling at that size's working set ({} GB/s)", units::percent(peak.busbw / ceiling), units::sig3(ceiling))
            } else {
                String::new()
            },
            first.map_or("-".into(), |p| units::bytes(p.bytes)),
            first.map_or("-".into(), |p| units::micros(p.p50)),
            fit.map_or(String::new(), |f| format!("; fitted alpha {} per message", units::micros(f.alpha_us)))
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
        items.push(format!(
            "Pipeline: over {} runs the measured bubble is within {:.1} points of the simulation (largest gap: {} S={} M={}, measured {} against {}).",
            pipe.len(),
            (worst.bubble_measured - worst.bubble_simulated).abs() * 100.0,
            worst.schedule,
            worst.stages,
            worst.microbatches,
            units::percent(worst.bubble_measured),
            units::percent(worst.bubble_simulated)
        ));
    }
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
