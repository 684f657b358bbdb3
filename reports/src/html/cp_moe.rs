//! The context-parallel and MoE section: bench-layers `--cp` attention
//! rows (layers_cp.csv) beside each method's cp 1 row, the MoE block's
//! layouts (run.json `extra.moe_rows`) beside the unsplit layout and the
//! model, `bench-collectives moe` phases (moe.csv) beside the model and
//! the ceiling, and `bench-collectives cp-ring` sizes beside the exchange
//! alone and the model. Tables only: each holds a handful of rows.

use super::layers::check_cell;
use super::page::{self, num, text, Cell};
use crate::load::Source;
use crate::units;
use parbench::results::{CpRingRow, CpRow, MoeRow, RunMeta};
use serde_json::Value;
use std::collections::BTreeMap;

/// A share (0..1) in words, or "-" when not measured (NaN at cp 1).
fn share(v: f64) -> String {
    if v.is_finite() {
        units::percent(v)
    } else {
        "-".into()
    }
}

/// `value` against `reference`: "1.80x of 120 us", or "-" without one.
fn times_of(ratio: f64, reference: Option<f64>) -> String {
    match reference {
        Some(r) if ratio.is_finite() => format!("{}x of {}", units::sig3(ratio), units::micros(r)),
        _ => "-".into(),
    }
}

/// A bandwidth beside the wire's ceiling ("5.09 of 66.6"), or alone
/// where none was measured.
fn of_ceiling(gbps: f64, ceiling: f64) -> String {
    if ceiling.is_finite() {
        format!("{} of {}", units::sig3(gbps), units::sig3(ceiling))
    } else {
        units::sig3(gbps)
    }
}

/// Wrong bytes (or elements) a check found: red when any.
fn wrong_cell(wrong: u64) -> Cell {
    if wrong > 0 {
        Cell::Bad(format!("{wrong} WRONG"))
    } else {
        num("0")
    }
}

fn cp_config(label: &str, r: &CpRow) -> String {
    format!(
        "{label}: {}/{} {} {} (heads {} x {}, seq {}, b {}) tp {}",
        r.backend,
        r.wire,
        r.mode,
        if r.causal { "causal" } else { "full mask" },
        r.heads,
        r.head_dim,
        r.seq,
        r.batch,
        r.tp
    )
}

/// The CP attention tables, one per configuration; empty without rows.
fn cp_attention(sources: &[Source]) -> String {
    let mut configs: BTreeMap<String, BTreeMap<(String, usize), &CpRow>> = BTreeMap::new();
    for s in sources {
        for r in &s.cp {
            // Several runs of one (method, degree): the last, in run order.
            configs
                .entry(cp_config(&s.label, r))
                .or_default()
                .insert((r.method.clone(), r.cp), r);
        }
    }
    let mut body = String::new();
    for (name, rows) in configs {
        body.push_str(&page::h3(&format!("Context-parallel attention: {name}")));
        let table: Vec<Vec<Cell>> = rows
            .values()
            .map(|r| {
                let cp1 = rows.get(&(r.method.clone(), 1)).map(|b| b.total_us);
                vec![
                    text(r.method.clone()),
                    num(r.cp.to_string()),
                    num(units::micros(r.total_us)),
                    num(if r.cp > 1 {
                        times_of(r.speedup, cp1)
                    } else {
                        "reference".into()
                    }),
                    num(units::micros(r.compute_us)),
                    num(units::micros(r.wait_us)),
                    num(units::micros(r.transfer_us)),
                    num(share(r.hidden_share)),
                    num(units::bytes(r.bytes_sent as f64)),
                    check_cell(r.check_max_err),
                ]
            })
            .collect();
        body.push_str(&page::table(
            &[
                "method",
                "cp",
                "total per call",
                "speed-up over cp 1",
                "compute",
                "stood still",
                "transfers",
                "hidden",
                "sent per rank",
                "check error",
            ],
            &table,
        ));
    }
    body
}

/// A figure of one `extra.moe_rows` entry (NaN where null or absent).
fn field(row: &Value, name: &str) -> f64 {
    row.get(name).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// The MoE block runs of a source: (run, its layouts).
fn moe_runs(s: &Source) -> Vec<(&RunMeta, &Vec<Value>)> {
    s.runs
        .iter()
        .filter_map(|r| Some((r, r.extra.get("moe_rows")?.as_array()?)))
        .filter(|(_, rows)| !rows.is_empty())
        .collect()
}

fn moe_config(label: &str, run: &RunMeta) -> String {
    let b = run.extra.get("block");
    let get = |k: &str| {
        b.and_then(|b| b.get(k))
            .map(|v| v.as_str().map_or(v.to_string(), str::to_string))
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "{label}: {} {} on {} (hidden {}, {} experts, top-{}, {}) {}",
        get("preset"),
        get("mode"),
        run.backend,
        get("hidden"),
        get("experts"),
        get("topk"),
        get("dtype"),
        run.run_id
    )
}

/// The MoE block tables, one per run; empty without `moe_rows`.
fn moe_block(sources: &[Source]) -> String {
    let mut body = String::new();
    for s in sources {
        for (run, rows) in moe_runs(s) {
            body.push_str(&page::h3(&format!(
                "MoE block: {}",
                moe_config(&s.label, run)
            )));
            let unsplit = rows
                .iter()
                .find(|r| field(r, "ep") * field(r, "etp") * field(r, "tp") == 1.0)
                .map(|r| field(r, "total_us"));
            let table: Vec<Vec<Cell>> = rows
                .iter()
                .map(|r| {
                    let total = field(r, "total_us");
                    let layout =
                        format!("{}/{}/{}", field(r, "ep"), field(r, "etp"), field(r, "tp"));
                    let err = field(r, "check_max_err");
                    let tol = field(r, "check_tolerance");
                    vec![
                        num(layout.clone()),
                        num(units::micros(total)),
                        num(if layout == "1/1/1" {
                            "reference".into()
                        } else {
                            times_of(unsplit.map_or(f64::NAN, |u| u / total), unsplit)
                        }),
                        num(units::micros(field(r, "compute_us"))),
                        num(format!(
                            "{} (model {})",
                            units::micros(field(r, "a2a_us")),
                            units::micros(field(r, "a2a_model_us"))
                        )),
                        num(units::micros(field(r, "etp_us") + field(r, "tp_us"))),
                        num(units::micros(field(r, "wait_us"))),
                        num(format!("{}x", units::sig3(field(r, "imbalance")))),
                        if err.is_finite() && tol.is_finite() && err > tol {
                            Cell::Bad(format!("{err:.1e} > {tol:.1e}"))
                        } else {
                            check_cell(err)
                        },
                    ]
                })
                .collect();
            body.push_str(&page::table(
                &[
                    "ep/etp/tp",
                    "total per call",
                    "speed-up over 1/1/1",
                    "compute",
                    "all-to-all",
                    "etp + tp exchanges",
                    "waiting",
                    "imbalance",
                    "check error",
                ],
                &table,
            ));
        }
    }
    body
}

fn dispatch_config(label: &str, r: &MoeRow) -> String {
    format!(
        "{label}: {}/{}, {} ranks, {} tokens a rank x hidden {}, {} experts top-{}{}{}",
        r.backend,
        r.wire,
        r.world,
        r.tokens,
        r.hidden,
        r.experts,
        r.topk,
        if r.node_limit > 0 {
            format!(", node limit {}", r.node_limit)
        } else {
            String::new()
        },
        if r.capacity_factor.is_finite() {
            format!(", capacity factor {}", r.capacity_factor)
        } else {
            String::new()
        }
    )
}

/// The moe.csv tables, one per shape; empty without rows.
fn moe_dispatch(sources: &[Source]) -> String {
    // Dispatch before combine within one routing, payload and copies.
    type Phase = (String, String, String, bool, String);
    let mut configs: BTreeMap<String, BTreeMap<Phase, &MoeRow>> = BTreeMap::new();
    for s in sources {
        for r in &s.moe {
            // Several runs of one phase: the last, in run order.
            let phase = (
                r.routing.clone(),
                r.payload.clone(),
                r.copies.clone(),
                r.phase != "dispatch",
                r.phase.clone(),
            );
            configs
                .entry(dispatch_config(&s.label, r))
                .or_default()
                .insert(phase, r);
        }
    }
    let mut body = String::new();
    for (name, rows) in configs {
        body.push_str(&page::h3(&format!("MoE dispatch and combine: {name}")));
        let table: Vec<Vec<Cell>> = rows
            .values()
            .map(|r| {
                vec![
                    text(format!("{} {} {}", r.routing, r.payload, r.copies)),
                    text(r.phase.clone()),
                    num(units::bytes(r.bytes as f64)),
                    num(units::micros(r.time_us)),
                    num(units::micros(r.model_us)),
                    num(of_ceiling(r.busbw_gbps, r.ceiling_gbps)),
                    num(format!("{}x", units::sig3(r.imbalance))),
                    num(r.dropped.to_string()),
                    wrong_cell(r.wrong),
                ]
            })
            .collect();
        body.push_str(&page::table(
            &[
                "routing, payload, copies",
                "phase",
                "sent per rank",
                "time",
                "model (balanced)",
                "busbw GB/s of ceiling",
                "imbalance",
                "dropped",
                "wrong",
            ],
            &table,
        ));
    }
    body
}

fn ring_config(label: &str, r: &CpRingRow) -> String {
    format!(
        "{label}: {}/{}, {} ranks, compute stand-in {}",
        r.backend, r.wire, r.world, r.stand_in
    )
}

/// The cp-ring rows of one configuration, the last run of each size.
fn ring_runs(sources: &[Source]) -> BTreeMap<String, BTreeMap<u64, &CpRingRow>> {
    let mut configs: BTreeMap<String, BTreeMap<u64, &CpRingRow>> = BTreeMap::new();
    for s in sources {
        for r in &s.cp_ring {
            configs
                .entry(ring_config(&s.label, r))
                .or_default()
                .insert(r.bytes, r);
        }
    }
    configs
}

/// The cp-ring tables, one per configuration; empty without rows.
fn cp_ring(sources: &[Source]) -> String {
    let mut body = String::new();
    for (name, rows) in ring_runs(sources) {
        body.push_str(&page::h3(&format!("CP ring beside compute: {name}")));
        let table: Vec<Vec<Cell>> = rows
            .values()
            .map(|r| {
                vec![
                    num(units::bytes(r.bytes as f64)),
                    num(share(r.hidden)),
                    num(units::micros(r.exchange_us)),
                    num(units::micros(r.model_us)),
                    num(units::micros(r.compute_us)),
                    num(units::micros(r.overlapped_us)),
                    num(units::micros(r.lost_us)),
                    num(of_ceiling(r.busbw_gbps, r.ceiling_gbps)),
                    wrong_cell(r.wrong),
                ]
            })
            .collect();
        body.push_str(&page::table(
            &[
                "block",
                "hidden",
                "exchange alone",
                "model",
                "compute alone",
                "overlapped",
                "lost",
                "GB/s of ceiling",
                "wrong bytes",
            ],
            &table,
        ));
    }
    body
}

/// One answer per cp-ring configuration: the share hidden at its largest
/// size, against the exchange alone and the model.
pub fn ring_answers(sources: &[Source]) -> Vec<(String, String, String)> {
    ring_runs(sources)
        .into_iter()
        .filter_map(|(name, rows)| {
            let (_, r) = rows.last_key_value()?;
            Some((
                name,
                format!(
                    "{} hidden at {}",
                    share(r.hidden),
                    units::bytes(r.bytes as f64)
                ),
                format!(
                    "exchange alone {}, model {}",
                    units::micros(r.exchange_us),
                    units::micros(r.model_us)
                ),
            ))
        })
        .collect()
}

/// The section's HTML; none when no folder holds any of these records.
pub fn section(sources: &[Source]) -> Option<String> {
    // Each part with the sentence that says how to read it.
    let parts = [
        (
            cp_attention(sources),
            "Context-parallel attention per method and degree against the same method at cp 1 (stood still: the time the attention waited on transfers; hidden: the transfers' share behind compute).",
        ),
        (
            moe_block(sources),
            "The MoE block per ep/etp/tp layout against the unsplit layout, its all-to-alls beside the model's.",
        ),
        (
            moe_dispatch(sources),
            "The MoE dispatch and combine alone (bench-collectives moe) per routing beside the model's balanced all-to-all and the wire's ceiling.",
        ),
        (
            cp_ring(sources),
            "The CP ring per block size: the share of the exchange hidden behind a compute stand-in, beside the exchange alone and the model's pass.",
        ),
    ];
    let shown: Vec<&(String, &str)> = parts.iter().filter(|(b, _)| !b.is_empty()).collect();
    if shown.is_empty() {
        return None;
    }
    let words: Vec<&str> = shown.iter().map(|(_, w)| *w).collect();
    let mut html = page::note(&words.join(" "));
    for (body, _) in shown {
        html.push_str(body);
    }
    page::section_if("cp-moe", "Context parallelism and MoE", &html)
}
