//! The planning section: for every results folder that holds a `plan.json`
//! (written by `report plan --output-file DIR/plan.json`), the ranking of the
//! best layouts, a chart of each one's step split into compute,
//! tensor-parallel communication, bubble and data-parallel communication,
//! and why the other layouts lose; and for every folder with a
//! `plan-check.csv` (`report plan --against DIR`), each composed run's
//! measured terms beside the planner's prediction of that layout.

use super::page::{self, num, text, Cell, CHART_H, CHART_W};
use crate::charts::{self, BarStack, Bars};
use crate::load::Source;
use crate::plan_cmd::{read_plan, PlanFile, PLAN_FILE};
use crate::units;

/// Layouts drawn in the chart (the table lists every one of the file).
const CHART_LAYOUTS: usize = 12;

/// The one planning section: every folder's plan and plan check, then
/// the tensor-parallel cost per token on each measured wire; none when
/// there is neither.
pub fn section(sources: &[Source]) -> Option<String> {
    let mut body = String::new();
    for s in sources {
        match read_plan(&s.dir) {
            Ok(Some(f)) => {
                body.push_str(&one_plan(&s.label, &f));
            }
            Ok(None) => {}
            // `report html` checks the files before drawing (see
            // `check`); a file that changed in between is said here.
            Err(e) => body.push_str(&page::empty(&format!("{e:#}"))),
        }
    }
    for s in sources {
        match crate::plan_cmd::check::read_rows(&s.dir) {
            Ok(rows) if !rows.is_empty() => body.push_str(&plan_check(&s.label, &rows)),
            Ok(_) => {}
            Err(e) => body.push_str(&page::empty(&format!("{e:#}"))),
        }
    }
    if let Some(tp) = super::capacity::body(sources) {
        body.push_str(&page::h3(
            "Tensor-parallel communication per token step on each measured wire",
        ));
        body.push_str(&tp);
    }
    page::section_if("plan", "Planning", &body)
}

/// One folder's plan-check rows: a table per layout and the term that parts most.
fn plan_check(label: &str, rows: &[crate::plan_cmd::check::CheckRow]) -> String {
    let mut out = page::h3(&format!(
        "{label}: the planner against measured composed steps ({})",
        crate::plan_cmd::check::PLAN_CHECK_FILE
    ));
    let mut layouts: Vec<&str> = rows.iter().map(|r| r.layout.as_str()).collect();
    layouts.dedup();
    for l in layouts {
        let mine: Vec<_> = rows.iter().filter(|r| r.layout == l).cloned().collect();
        out.push_str(&page::note(l));
        let cells: Vec<Vec<Cell>> = mine
            .iter()
            .map(|r| {
                vec![
                    text(r.term.clone()),
                    num(units::micros(r.measured_us)),
                    num(units::micros(r.predicted_us)),
                    num(if r.ratio.is_finite() {
                        format!("{:.2}", r.ratio)
                    } else {
                        "-".into()
                    }),
                ]
            })
            .collect();
        out.push_str(&page::table(
            &["term", "measured", "predicted", "predicted / measured"],
            &cells,
        ));
        if let Some(w) = crate::plan_cmd::check::parts_most(&mine) {
            out.push_str(&page::note(&format!(
                "Parts most: {} (measured {}, predicted {}).",
                w.term,
                units::micros(w.measured_us),
                units::micros(w.predicted_us)
            )));
        }
    }
    out
}

/// Reads every folder's plan file, so that a bad one stops `report html`
/// with an error naming it (exit 2) instead of a page that hides it.
pub fn check(sources: &[Source]) -> anyhow::Result<()> {
    for s in sources {
        read_plan(&s.dir)?;
        crate::plan_cmd::check::read_rows(&s.dir)?;
    }
    Ok(())
}

fn ms(s: f64) -> String {
    units::micros(s * 1e6)
}

fn one_plan(label: &str, f: &PlanFile) -> String {
    let mut out = page::h3(&format!("{label}: {} ({PLAN_FILE})", f.model));
    out.push_str(&page::note(&format!(
        "Global batch {} sequences on {} devices ({} per node), {}. Compute {} TFLOP/s per device ({}); intra-node wire {} GB/s, alpha {} ({}); inter-node wire {} GB/s, alpha {} ({}). {} layouts enumerated, {} fit. Command: {}",
        f.global_batch,
        f.gpus,
        f.gpus_per_node,
        f.memory_gib.map_or("no memory limit".to_string(), |m| format!("{} GiB per device", units::short(m))),
        units::sig3(f.compute.value / 1e12),
        f.compute.from,
        units::sig3(f.intra.value.bandwidth_gbps()),
        units::micros(f.intra.value.alpha_us()),
        f.intra.from,
        units::sig3(f.inter.value.bandwidth_gbps()),
        units::micros(f.inter.value.alpha_us()),
        f.inter.from,
        f.enumerated,
        f.fitting,
        f.command
    )));
    if let Some(d) = &f.device {
        out.push_str(&page::note(&format!(
            "Device {}: {}. The step: {}.",
            d.value, d.from, f.software
        )));
    }
    if !f.families.is_empty() {
        let rows: Vec<Vec<Cell>> = f
            .families
            .iter()
            .map(|fam| {
                vec![
                    text(fam.name.clone()),
                    text(match (&fam.best, &fam.why_not) {
                        (Some((layout, tps)), _) => {
                            format!("fits: {} tokens/s, {layout}", units::sig3(*tps))
                        }
                        (None, Some(why)) => why.clone(),
                        (None, None) => String::new(),
                    }),
                ]
            })
            .collect();
        out.push_str(&page::table(
            &["way to split", "best layout, or why none runs"],
            &rows,
        ));
    }
    if let (Some(spec), Some(named)) = (&f.layout_query, f.top.first()) {
        out.push_str(&page::note(&format!(
            "Layout {spec}: {}. {}",
            named.layout,
            f.search_best
                .as_ref()
                .map(|b| crate::plan_cmd::layout::why_loses(named, b))
                .unwrap_or_default()
        )));
    }
    if f.top.is_empty() {
        out.push_str(&page::empty("No layout fits in the devices' memory."));
    } else {
        let rows: Vec<Vec<Cell>> = f
            .top
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let l = &c.layout;
                let share = |x: f64| num(format!("{} ({})", ms(x), units::percent(x / c.step_s)));
                vec![
                    num((i + 1).to_string()),
                    num(l.dp.to_string()),
                    num(l.tp.to_string()),
                    num(l.pp.to_string()),
                    text(crate::plan_cmd::schedule_cell(l)),
                    num(l.micro_batch.to_string()),
                    num(l.microbatches.to_string()),
                    num(units::sig3(c.tokens_per_s)),
                    num(ms(c.step_s)),
                    share(c.compute_s),
                    share(c.tp_comm_s),
                    share(c.bubble_s),
                    share(c.dp_comm_s),
                    num(f.memory_cell(c)),
                    num(ms(c.token_latency_s)),
                ]
            })
            .collect();
        let header: Vec<&str> = crate::plan_cmd::LAYOUT_COLUMNS
            .into_iter()
            .chain(["token latency"])
            .collect();
        out.push_str(&page::table(&header, &rows));
        let shown: Vec<_> = f.top.iter().take(CHART_LAYOUTS).collect();
        let stack =
            |label: &str, color: usize, part: fn(&parbench::model::plan::Costed) -> f64| BarStack {
                label: label.into(),
                color,
                values: shown.iter().map(|c| part(c) * 1e6).collect(),
            };
        let bars = Bars {
            title: "step time of the best layouts".into(),
            y_desc: "time per step".into(),
            categories: shown
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let l = &c.layout;
                    format!("#{} {}/{}/{}", i + 1, l.dp, l.tp, l.pp)
                })
                .collect(),
            stacks: vec![
                stack("compute", 0, |c| c.compute_s),
                stack("tensor-parallel comm", 1, |c| c.tp_comm_s),
                stack("pipeline bubble", 2, |c| c.bubble_s),
                stack("data-parallel comm", 3, |c| c.dp_comm_s),
            ],
            markers: Vec::new(),
            legend_title: String::new(),
        };
        out.push_str(&page::figure(
            &format!("plan-{label}"),
            charts::stacked_bars(&bars, CHART_W, CHART_H),
            &format!(
                "{label}: each layout's step (dp/tp/pp), split into compute, tensor-parallel communication, pipeline bubble and data-parallel gradient all-reduce; tokens/s = global batch x seq / step."
            ),
        ));
    }
    if !f.losses.is_empty() {
        let rows: Vec<Vec<Cell>> = f
            .losses
            .iter()
            .map(|g| {
                vec![
                    text(g.group.clone()),
                    num(g.count.to_string()),
                    text(g.example.to_string()),
                    text(g.detail.clone()),
                ]
            })
            .collect();
        out.push_str(&page::h3("Why the others lose"));
        out.push_str(&page::table(
            &["reason", "layouts", "example", "detail"],
            &rows,
        ));
    }
    out
}
