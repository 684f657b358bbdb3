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
        if l.etp != l.tp {
            cell.push_str(&format!(" etp={}", l.etp));
        }
    }
    if l.shard != Shard::None {
        cell.push_str(&format!(" {}", l.shard.name()));
        if l.shard_group > 1 && l.shard_group < l.dp {
            cell.push_str(&format!("/{}", l.shard_group));
        }
    }
    cell
}

/// What the plan's figures are worth: its stack's error over the
/// published runs it is held to.
pub fn band_words(f: &PlanFile) -> String {
    match (&f.stack, &f.band) {
        (_, Some(b)) => b.line(),
        (Some(s), None) => format!(
            "{}: no published run in the validation table yet; the figures are the model's alone",
            s.value
        ),
        (None, None) => "none: without --stack the step is held to no published run (--stack megatron-core, megatron-2021 or torchtitan)".into(),
    }
}

/// The printed plan.
pub fn render(f: &PlanFile) -> String {
    let mut out = String::new();
    out.push_str(&format!("Plan: {}\n", f.model));
    out.push_str(&format!(
        "  global batch {} sequences on {} devices ({} per node), {}\n",
        f.global_batch,
        f.gpus,
        f.gpus_per_node,
        f.memory_gib
            .map_or("no memory limit".to_string(), |m| format!(
                "{} GiB each",
                units::short(m)
            ))
    ));
    if let Some(d) = &f.device {
        out.push_str(&format!("  device:     {} ({})\n", d.value, d.from));
    }
    out.push_str(&format!(
        "  compute:    {} TFLOP/s per device, from {}\n",
        units::sig3(f.compute.value / 1e12),
        f.compute.from
    ));
    if let Some(s) = &f.stack {
        out.push_str(&format!("  stack:      {}: {}\n", s.value, s.from));
    }
    if !f.software.is_empty() {
        out.push_str(&format!("  the step:   {}\n", f.software));
    }
    out.push_str(&format!("  band:       {}\n", band_words(f)));
    out.push_str(&format!(
        "  intra-node: {}, from {}\n",
        wire_words(&f.intra.value),
        f.intra.from
    ));
    out.push_str(&format!(
        "  inter-node: {}, from {}\n",
        wire_words(&f.inter.value),
        f.inter.from
    ));
    out.push_str(&format!(
        "  {} layouts enumerated, {} fit\n\n",
        f.enumerated, f.fitting
    ));
    if !f.families.is_empty() {
        out.push_str(&super::layout::render_families(&f.families));
        out.push('\n');
    }
    if let (Some(spec), Some(named)) = (&f.layout_query, f.top.first()) {
        out.push_str(&format!("Layout {spec}: {}\n", named.layout));
        out.push_str(&super::layout::render_terms(named, f.gpus, f.memory_gib));
        if let Some(best) = &f.search_best {
            out.push_str(&super::layout::why_loses(named, best));
        }
        out.push('\n');
    }
    if f.top.is_empty() {
        out.push_str("No layout fits.\n");
    } else {
        out.push_str(&format!(
            "Best layouts by tokens/s (of {} that fit)\n\n",
            f.fitting
        ));
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
                units::bytes(c.memory.total()),
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
        if moe {
            out.push_str("ep a2a: the experts' all-to-all, dispatch and combine forward and backward, exposed; it adds to the step beside tp comm.\n");
        }
        out.push_str("step = compute + tp comm + cp comm + bubble + dp comm + optimizer (the busiest pipeline rank; cp comm only with context parallelism, in the layout's terms; the bubble includes waits for point-to-point messages; tp comm and dp comm are what the step waits for: all of the tensor-parallel collectives unless the stack overlaps them, the part of the data-parallel reduction no compute hides, and the compute the overlapped collectives slow). b: sequences per microbatch; M: microbatches per step per pipeline. MFU: model FLOPs per second over the devices' dense peak (bf16's; FP8's with --precision fp8; needs --device). token lat: one decode step (b new tokens) through the layout, compute-bound.\n");
    }
    if !f.losses.is_empty() {
        out.push_str("\nWhy the others lose\n\n");
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
        out.push_str("Splits that break a rule are counted per (dp, tp, pp); every other line per layout (schedule, b, M).\n");
    }
    out
}
