//! The printed plan: the ranking's table, the reasons the others lose,
//! and the cells the page shares with it.

use super::file::PlanFile;
use crate::table::Table;
use crate::units;
use parbench::model::plan::{Shard, WireKind};
use parbench::model::LinkParams;

/// The columns of a ranked layout that the text table and the page share,
/// in order; each adds its token latency (and the text its wires).
pub const LAYOUT_COLUMNS: [&str; 14] = [
    "#", "dp", "tp", "pp", "schedule", "b", "M", "tokens/s", "step", "compute", "tp comm",
    "bubble", "dp comm", "memory",
];

fn wire_words(l: &LinkParams) -> String {
    format!(
        "{} GB/s, alpha {}",
        units::sig3(l.bandwidth_gbps()),
        units::micros(l.alpha_us())
    )
}

fn wire_letter(w: WireKind) -> &'static str {
    match w {
        WireKind::Intra => "intra",
        WireKind::Inter => "inter",
        WireKind::None => "-",
    }
}

/// Milliseconds with three significant figures.
fn ms(s: f64) -> String {
    units::micros(s * 1e6)
}

/// A layout's schedule column: its context-parallel degree, the
/// schedule, its chunks, an uneven split and the data-parallel sharding.
pub fn schedule_cell(l: &parbench::model::plan::Layout) -> String {
    schedule_cell_with(l, true, true)
}

/// [`schedule_cell`], the expert tensor-parallel degree and the sharding
/// left out where a table says them once for every row.
fn schedule_cell_with(l: &parbench::model::plan::Layout, etp: bool, shard: bool) -> String {
    let mut cell = if l.cp > 1 {
        format!("cp={} ", l.cp)
    } else {
        String::new()
    };
    cell.push_str(&l.schedule);
    if l.chunks > 1 {
        cell.push_str(&format!(" v={}", l.chunks));
    }
    if l.first_stage_layers > 0 {
        cell.push_str(&format!(
            " {}/../{}",
            l.first_stage_layers, l.last_stage_layers
        ));
    }
    if l.ep > 1 {
        cell.push_str(&format!(" ep={}", l.ep));
        if etp {
            cell.push_str(&etp_word(l));
        }
    }
    if shard {
        cell.push_str(&shard_word(l));
    }
    cell
}

/// The expert tensor-parallel degree where it is not the attention's.
fn etp_word(l: &parbench::model::plan::Layout) -> String {
    if l.ep > 1 && l.etp != l.tp {
        format!(" etp={}", l.etp)
    } else {
        String::new()
    }
}

/// The sharding mode, with its group where it shards over part of dp.
fn shard_word(l: &parbench::model::plan::Layout) -> String {
    match l.shard {
        Shard::None => String::new(),
        _ if l.shard_group > 1 && l.shard_group < l.dp => {
            format!(" {}/{}", l.shard.name(), l.shard_group)
        }
        _ => format!(" {}", l.shard.name()),
    }
}

/// What the plan's figures are worth: its stack's error over the
/// published runs it is held to.
pub fn band_words(f: &PlanFile) -> String {
    match (&f.stack, &f.band) {
        (_, Some(b)) => b.line(),
        (Some(s), None) => format!(
            "{}: no published run in the validation table yet; the figures are the model's alone \
             (report plan --validation lists every band)",
            f.band_name.as_deref().unwrap_or(&s.value)
        ),
        (None, None) => format!(
            "none: without --stack the step is held to no published run (--stack {})",
            parbench::model::stack::Stack::names().join(", ")
        ),
    }
}

/// The band in a few words, for the answer's line.
fn band_brief(f: &PlanFile) -> String {
    match (&f.stack, &f.band) {
        (_, Some(b)) => format!(
            "{:+.0}% mean, {:.0}% worst over {} published runs",
            b.mean * 100.0,
            b.worst * 100.0,
            b.rows.len()
        ),
        (Some(s), None) => format!(
            "none (no published {} run yet)",
            f.band_name.as_deref().unwrap_or(&s.value)
        ),
        (None, None) => "none (without --stack, held to no published run)".into(),
    }
}

/// The byte offsets of the first `": "` and the first `"; "` of `from`
/// outside parentheses.
fn top_level_marks(from: &str) -> (Option<usize>, Option<usize>) {
    let (mut depth, mut colon, mut semi) = (0i32, None, None);
    for (i, c) in from.char_indices() {
        let spaced = from[i + 1..].starts_with(' ');
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ':' if depth == 0 && spaced => {
                colon.get_or_insert(i);
            }
            ';' if depth == 0 && spaced => {
                semi.get_or_insert(i);
            }
            _ => {}
        }
    }
    (colon, semi)
}

/// Where a figure came from, in a few words: a source that names itself
/// before its details ("NAME: details; more") is cut to its name; one
/// that does not (a fit, with its warnings after "; ") stays whole.
pub fn source_brief(from: &str) -> &str {
    match top_level_marks(from) {
        (Some(c), semi) if semi.is_none_or(|s| c < s) => &from[..c],
        _ => from,
    }
}

/// A derived figure's source in a few words: a source that names itself
/// ("NAME: arithmetic; the rest of the model") is cut to its first
/// clause, the arithmetic behind the figure; a fit, whose warnings
/// follow its first "; ", stays whole.
pub fn source_arithmetic(from: &str) -> &str {
    match top_level_marks(from) {
        (Some(c), Some(s)) if c < s => &from[..s],
        _ => from,
    }
}

/// The printed plan: the question, the answer (the named layout's terms,
/// or the search's best), the ways to split, the table, why the others
/// lose, then what it was costed on. `verbose`: every source in full,
/// each term explained and the table's every column.
pub fn render(f: &PlanFile, verbose: bool) -> String {
    let mut out = String::new();
    out.push_str(&parbench::term::wrap_hanging(
        &f.model,
        "Plan: ",
        "  ",
        parbench::term::WIDTH,
    ));
    out.push_str(&format!(
        "  global batch {} sequences on {} devices ({} per node), {}\n\n",
        f.global_batch,
        f.gpus,
        f.gpus_per_node,
        f.memory_gib
            .map_or("no memory limit".to_string(), |m| format!(
                "{} GiB each",
                units::short(m)
            ))
    ));
    out.push_str(&answer(f, verbose));
    if !f.families.is_empty() {
        out.push_str(&super::layout::render_families(&f.families));
        out.push('\n');
    }
    if f.top.is_empty() {
        out.push_str("No layout fits.\n");
    } else {
        out.push_str(&format!(
            "Best layouts by tokens/s (of {} that fit)\n\n",
            f.fitting
        ));
        out.push_str(&if verbose {
            full_table(f)
        } else {
            short_table(f)
        });
    }
    if !f.losses.is_empty() {
        out.push_str(&losses(f, verbose));
    }
    out.push('\n');
    out.push_str(&costed_on(f, verbose));
    out
}

/// The answer: the named layout's terms and what it loses against the
/// search's best, or the search's best; the step beside the band.
fn answer(f: &PlanFile, verbose: bool) -> String {
    let mut out = String::new();
    let Some(first) = f.top.first() else {
        return out;
    };
    match &f.layout_query {
        Some(spec) => {
            out.push_str(&parbench::term::wrap_hanging(
                &format!("{spec}: {}", first.layout),
                "Layout ",
                "  ",
                parbench::term::WIDTH,
            ));
            let terms = super::layout::render_terms(first, f.gpus, f.memory_gib, verbose);
            // The band beside the step it bounds: after the step's line
            // and its continuations (indented past the term's name).
            let cont = " ".repeat(16);
            let mut band = Some(format!("  band          {}\n", band_brief(f)));
            for (i, l) in terms.lines().enumerate() {
                if i > 0 && !l.starts_with(&cont) {
                    out.push_str(&band.take().unwrap_or_default());
                }
                out.push_str(l);
                out.push('\n');
            }
            if let Some(best) = &f.search_best {
                let why = super::layout::why_loses(first, best);
                out.push_str(&parbench::term::wrap(
                    why.trim_end(),
                    "  ",
                    parbench::term::WIDTH,
                ));
            }
        }
        None => {
            out.push_str(&parbench::term::wrap_hanging(
                &format!("{}", first.layout),
                "Best layout: ",
                "  ",
                parbench::term::WIDTH,
            ));
            let mfu = first
                .mfu
                .map_or(String::new(), |m| format!(", MFU {}", units::percent(m)));
            out.push_str(&format!(
                "  {} tokens/s, step {}{mfu}; band: {}\n",
                units::sig3(first.tokens_per_s),
                ms(first.step_s),
                band_brief(f)
            ));
            if f.tight(first) {
                let (lo, hi) = first.memory.range();
                out.push_str(&format!(
                    "  memory tight: {} to {} against {} GiB; it may not fit\n",
                    units::bytes(lo),
                    units::bytes(hi),
                    f.memory_gib.unwrap_or_default()
                ));
                if let Some(sure) = &f.best_sure {
                    out.push_str(&parbench::term::wrap_hanging(
                        &format!(
                            "{} ({} tokens/s, {} fewer; {})",
                            sure.layout,
                            units::sig3(sure.tokens_per_s),
                            units::percent(1.0 - sure.tokens_per_s / first.tokens_per_s),
                            units::bytes(sure.memory.total())
                        ),
                        "  the best that fits by both counts: ",
                        "    ",
                        parbench::term::WIDTH,
                    ));
                }
            }
        }
    }
    out.push('\n');
    out
}

/// The legend line for `tight`, where a row of the table is.
fn tight_legend(f: &PlanFile) -> &'static str {
    if f.top.iter().any(|c| f.tight(c)) {
        "tight: the device lies between the memory model's two counts (ours and Megatron-LM's formula);\n  the layout may not fit\n"
    } else {
        ""
    }
}

/// The table of the best layouts with every column, as `-v` prints it.
fn full_table(f: &PlanFile) -> String {
    let mut out = String::new();
    // An MoE plan adds its all-to-all after the tensor-parallel column.
    let moe = f.top.iter().any(|c| c.ep_comm_s > 0.0);
    let at = LAYOUT_COLUMNS
        .iter()
        .position(|c| *c == "tp comm")
        .map_or(0, |i| i + 1);
    let mut header: Vec<&str> = LAYOUT_COLUMNS.to_vec();
    if moe {
        header.insert(at, "ep a2a");
    }
    let mut t = Table::new(
        header
            .into_iter()
            .chain(["MFU", "token lat", "wires tp/dp/pp"]),
    );
    for (i, c) in f.top.iter().enumerate() {
        let l = &c.layout;
        let share = |x: f64| format!("{} {}", ms(x), units::percent(x / c.step_s));
        let mut cells = vec![
            (i + 1).to_string(),
            l.dp.to_string(),
            l.tp.to_string(),
            l.pp.to_string(),
            schedule_cell(l),
            l.micro_batch.to_string(),
            l.microbatches.to_string(),
            units::sig3(c.tokens_per_s),
            ms(c.step_s),
            share(c.compute_s),
            share(c.tp_comm_s),
            share(c.bubble_s),
            share(c.dp_comm_s),
            f.memory_cell(c),
            c.mfu.map_or("-".into(), units::percent),
            ms(c.token_latency_s),
            format!(
                "{}/{}/{}",
                wire_letter(c.tp_wire),
                wire_letter(c.dp_wire),
                wire_letter(c.pp_wire)
            ),
        ];
        if moe {
            cells.insert(at, share(c.ep_comm_s));
        }
        t.row(cells);
    }
    out.push_str(&t.text());
    out.push_str(tight_legend(f));
    if moe {
        out.push_str(&parbench::term::wrap("ep a2a: the experts' all-to-all, dispatch and combine forward and backward, exposed; it adds to the step beside tp comm.", "", parbench::term::WIDTH));
    }
    out.push_str(&parbench::term::wrap(
        STEP_LEGEND,
        "",
        parbench::term::WIDTH,
    ));
    out
}

const STEP_LEGEND: &str = "step = compute + tp comm + cp comm + bubble + dp comm + optimizer (the busiest pipeline rank; cp comm only with context parallelism, in the layout's terms; the bubble includes waits for point-to-point messages; tp comm and dp comm are what the step waits for: all of the tensor-parallel collectives unless the stack overlaps them, the part of the data-parallel reduction no compute hides, and the compute the overlapped collectives slow). b: sequences per microbatch; M: microbatches per step per pipeline. MFU: model FLOPs per second over the devices' dense peak (bf16's; FP8's with --precision fp8; needs --device). token lat: one decode step (b new tokens) through the layout, compute-bound.";

/// The table of the best layouts as the first screen shows it: the
/// layout, the answer's figures, and the exposed overheads as shares of
/// the step.
fn short_table(f: &PlanFile) -> String {
    let moe = f.top.iter().any(|c| c.ep_comm_s > 0.0);
    // No step column: at a fixed global batch it is tokens/s again.
    let mut header = vec!["layout (dp x tp x pp)", "tokens/s", "MFU", "memory", "tp"];
    if moe {
        header.push("ep");
    }
    header.extend(["bubble", "dp"]);
    let mut t = Table::new(header);
    // What every row shares is said once, under the table.
    let shared = |word: fn(&parbench::model::plan::Layout) -> String| {
        let first = word(&f.top.first()?.layout);
        let every = f.top.len() > 1 && f.top.iter().all(|c| word(&c.layout) == first);
        (every && !first.is_empty()).then_some(first)
    };
    let (etp, shard) = (shared(etp_word), shared(shard_word));
    for c in &f.top {
        let share = |x: f64| units::percent(x / c.step_s);
        let l = &c.layout;
        let cell = schedule_cell_with(l, etp.is_none(), shard.is_none());
        let mut cells = vec![
            format!(
                "{}x{}x{} {cell} b={} M={}",
                l.dp, l.tp, l.pp, l.micro_batch, l.microbatches
            ),
            units::sig3(c.tokens_per_s),
            c.mfu.map_or("-".into(), units::percent),
            f.memory_cell(c),
            share(c.tp_comm_s),
        ];
        if moe {
            cells.push(share(c.ep_comm_s));
        }
        cells.extend([share(c.bubble_s), share(c.dp_comm_s)]);
        t.row(cells);
    }
    let mut out = t.text();
    let shard = shard.map(|w| format!("shard={}", w.trim()));
    let every: Vec<String> = [etp, shard]
        .into_iter()
        .flatten()
        .map(|w| w.trim().to_string())
        .collect();
    if !every.is_empty() {
        out.push_str(&format!("every row: {}\n", every.join(" ")));
    }
    out.push_str(tight_legend(f));
    out.push_str("b: sequences per microbatch; M: microbatches per step; the last columns: shares of the step\n");
    out.push_str(if moe {
        "exposed tensor-parallel comm (tp), experts' all-to-all (ep), pipeline idle, data-parallel comm\n"
    } else {
        "exposed tensor-parallel comm (tp), pipeline idle (bubble), data-parallel comm (dp)\n"
    });
    out.push_str(
        "(-v: the step and each term's time, token latency, wires, and the terms explained)\n",
    );
    out
}

/// Why the others lose: a table with `-v`, else each reason on a line
/// with its count, its example and detail beneath.
fn losses(f: &PlanFile, verbose: bool) -> String {
    let mut out = String::from("\nWhy the others lose\n\n");
    if verbose {
        let mut t = Table::new(["reason", "layouts", "example", "detail"]);
        for g in &f.losses {
            t.row([
                g.group.clone(),
                g.count.to_string(),
                g.example.to_string(),
                g.detail.clone(),
            ]);
        }
        out.push_str(&t.text());
    } else {
        for g in &f.losses {
            out.push_str(&format!("{:>6}  {}\n", g.count, g.group));
            out.push_str(&parbench::term::wrap(
                &format!("{}: {}", g.example, g.detail),
                "        ",
                parbench::term::WIDTH,
            ));
        }
    }
    out.push_str("Splits that break a rule are counted per (dp, tp, pp); every other line per layout (schedule, b, M).\n");
    out
}

/// What the plan was costed on: the device, compute, stack, band and
/// wires, each beside its source (its name; `verbose`: in full).
fn costed_on(f: &PlanFile, verbose: bool) -> String {
    let mut out = String::from("Costed on\n");
    let mut shortened = false;
    let mut source = |from: &str, cut: fn(&str) -> &str| -> String {
        if verbose {
            return from.to_string();
        }
        let brief = cut(from);
        shortened |= brief.len() < from.len();
        brief.to_string()
    };
    let mut lines_of: Vec<(&str, String)> = Vec::new();
    if let Some(d) = &f.device {
        lines_of.push((
            "device",
            format!("{} ({})", d.value, source(&d.from, source_brief)),
        ));
    }
    lines_of.push((
        "compute",
        format!(
            "{} TFLOP/s per device, from {}",
            units::sig3(f.compute.value / 1e12),
            // In full: the rate, its share and the FP8 rate are the figure's reference.
            source(&f.compute.from, |all| all)
        ),
    ));
    if let Some(s) = &f.stack {
        lines_of.push((
            "stack",
            format!("{} ({})", s.value, source(&s.from, source_brief)),
        ));
    }
    if verbose && !f.software.is_empty() {
        lines_of.push(("the step", f.software.clone()));
    }
    lines_of.push(("band", band_words(f)));
    for (name, wire) in [("intra-node", &f.intra), ("inter-node", &f.inter)] {
        let from = source(&wire.from, source_arithmetic);
        lines_of.push((name, format!("{}, from {from}", wire_words(&wire.value))));
    }
    for (name, text) in lines_of {
        out.push_str(&parbench::term::wrap_hanging(
            &text,
            &format!("  {:<12}", format!("{name}:")),
            &" ".repeat(14),
            parbench::term::WIDTH,
        ));
    }
    out.push_str(&format!(
        "  {} layouts enumerated, {} fit\n",
        f.enumerated, f.fitting
    ));
    if shortened || (!verbose && !f.software.is_empty()) {
        out.push_str("  (-v: the sources in full and how the step runs)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_cut_to_its_name_and_a_fit_keeps_its_warnings() {
        let device = "NVIDIA H100 datasheet (SXM): 989 TFLOP/s; Hopper whitepaper: 132 SMs";
        assert_eq!(source_brief(device), "NVIDIA H100 datasheet (SXM)");
        let fit = "fit of all_reduce tcp/lo (9 sizes, rms error 3%); NOISY: measure again";
        assert_eq!(source_brief(fit), fit);
        assert_eq!(source_brief("--intra 400,2"), "--intra 400,2");
        let compute = "h100's GEMM rate: 780 TFLOP/s x 0.916 (clock: held); GEMMs by shape";
        assert_eq!(
            source_arithmetic(compute),
            "h100's GEMM rate: 780 TFLOP/s x 0.916 (clock: held)"
        );
    }
}
