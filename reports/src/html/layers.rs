//! The layers section: per tensor-parallel degree, compute and
//! communication time of one block stacked, with the model's communication
//! on top of the compute, and the per-token cost table.

use super::page::{self, num, Cell, CHART_H, CHART_W};
use crate::charts::{self, BarStack, Bars};
use crate::load::Source;
use crate::units;
use parbench::results::LayerRow;
use std::collections::BTreeMap;

fn config_name(source: &str, r: &LayerRow) -> String {
    format!(
        "{source}: {}/{} {}{} {} (h{} heads {} ffn {} seq {} b {}) {}",
        r.backend,
        r.wire,
        parbench::layers::record_mode_name(&r.mode, r.decode),
        if r.seq_parallel {
            " sequence-parallel"
        } else {
            ""
        },
        r.preset,
        r.hidden,
        r.heads,
        r.ffn,
        r.seq,
        r.batch,
        r.dtype
    )
}

/// A check error as recorded: NaN means the run skipped the check
/// (`--no-check`); the bench judges the tolerance, so no colour here.
pub fn check_cell(err: f64) -> Cell {
    if err.is_nan() {
        Cell::Text("not checked".into())
    } else {
        num(format!("{err:.1e}"))
    }
}

/// The section's HTML; none without layer rows.
pub fn section(sources: &[Source]) -> Option<String> {
    let mut configs: BTreeMap<String, Vec<&LayerRow>> = BTreeMap::new();
    for s in sources {
        for r in &s.layers {
            configs.entry(config_name(&s.label, r)).or_default().push(r);
        }
    }
    if configs.is_empty() {
        return None;
    }
    let mut body = page::note(
        "One Megatron block (attention and MLP, column- then row-parallel) per tensor-parallel degree: compute, communication and the wait for a slower peer before each collective per block, stacked; the red tick is compute plus the communication the model predicts (comm_model_us, from the wire's alpha-beta fit). Communication is drawn again on its own scale, beside the model's figure, because on a fast wire it is too thin to read on the stacked bars. Per-token cost divides the block's time by the tokens it processed.",
    );
    for (i, (name, mut rows)) in configs.into_iter().enumerate() {
        rows.sort_by_key(|r| r.tp);
        // Several runs of one degree: keep the last (rows are in run order).
        let mut by_tp: BTreeMap<usize, &LayerRow> = BTreeMap::new();
        for r in rows {
            by_tp.insert(r.tp, r);
        }
        let rows: Vec<&LayerRow> = by_tp.into_values().collect();
        body.push_str(&page::h3(&name));
        let bars = Bars {
            title: "time per block by tensor-parallel degree".into(),
            y_desc: "time per block".into(),
            categories: rows.iter().map(|r| format!("TP={}", r.tp)).collect(),
            stacks: vec![
                BarStack {
                    label: "compute (measured)".into(),
                    color: 0,
                    values: rows.iter().map(|r| r.compute_us).collect(),
                },
                BarStack {
                    label: "communication (measured)".into(),
                    color: 1,
                    values: rows.iter().map(|r| r.comm_us).collect(),
                },
                BarStack {
                    label: "waiting for a peer (measured)".into(),
                    color: 2,
                    values: rows.iter().map(|r| r.wait_us).collect(),
                },
            ],
            markers: vec![BarStack {
                label: "compute + model communication".into(),
                color: 3,
                values: rows
                    .iter()
                    .map(|r| {
                        if r.tp > 1 {
                            r.compute_us + r.comm_model_us
                        } else {
                            f64::NAN
                        }
                    })
                    .collect(),
            }],
            legend_title: String::new(),
        };
        body.push_str(&page::figure(
            &format!("layers-{i}"),
            charts::stacked_bars(&bars, CHART_W, CHART_H.min(380)),
            &format!("{name}: compute and communication per block."),
        ));
        let parallel: Vec<&&LayerRow> = rows.iter().filter(|r| r.tp > 1).collect();
        if !parallel.is_empty() {
            let comm = Bars {
                title: "communication per block: measured and model".into(),
                y_desc: "communication per block".into(),
                categories: parallel.iter().map(|r| format!("TP={}", r.tp)).collect(),
                stacks: vec![BarStack {
                    label: "communication (measured)".into(),
                    color: 1,
                    values: parallel.iter().map(|r| r.comm_us).collect(),
                }],
                markers: vec![BarStack {
                    label: "model communication".into(),
                    color: 3,
                    values: parallel.iter().map(|r| r.comm_model_us).collect(),
                }],
                legend_title: String::new(),
            };
            body.push_str(&page::figure(
                &format!("layers-comm-{i}"),
                charts::stacked_bars(&comm, CHART_W, 300),
                &format!(
                    "{name}: measured communication per block against the model's prediction."
                ),
            ));
        }
        let table: Vec<Vec<Cell>> = rows
            .iter()
            .map(|r| {
                vec![
                    num(r.tp.to_string()),
                    num(units::micros(r.compute_us)),
                    num(units::micros(r.comm_us)),
                    num(units::micros(r.wait_us)),
                    num(units::micros(r.comm_model_us)),
                    num(if r.comm_model_us > 0.0 {
                        format!("{}x", units::sig3(r.comm_us / r.comm_model_us))
                    } else {
                        "-".into()
                    }),
                    num(units::micros(r.total_us)),
                    num(units::micros(r.per_token_us)),
                    num(units::bytes(r.bytes_per_call as f64)),
                    num(r.calls_per_block.to_string()),
                    num(units::bytes(r.bytes_per_token)),
                    num(format!("{}x", units::sig3(r.speedup))),
                    num(units::percent(r.efficiency)),
                    check_cell(r.check_max_err),
                    num(units::sig3(r.compute_gflops)),
                    Cell::Text(if r.comm_algo.is_empty() {
                        "-".into()
                    } else {
                        r.comm_algo.clone()
                    }),
                    Cell::Text(if r.link_alpha_us.is_finite() && r.link_gbps.is_finite() {
                        format!(
                            "{}: {}, {} GB/s",
                            r.link_source,
                            units::micros(r.link_alpha_us),
                            units::sig3(r.link_gbps)
                        )
                    } else {
                        r.link_source.clone()
                    }),
                ]
            })
            .collect();
        body.push_str(&page::table(
            &[
                "TP",
                "compute",
                "communication",
                "waiting",
                "model comm.",
                "measured / model",
                "total per block",
                "per token",
                "bytes per call",
                "calls per block",
                "bytes per token",
                "speed-up over TP=1",
                "of ideal",
                "check error",
                "compute GF/s",
                "collectives",
                "model's link",
            ],
            &table,
        ));
    }
    Some(page::section("layers", "Tensor-parallel layers", &body))
}
