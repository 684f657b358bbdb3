//! Capacity planning: what tensor parallelism would cost per token on each
//! measured wire, from that wire's fitted all_reduce alpha and beta, beside
//! the NVLink and network reference figures of the worked example.

use super::collectives::curves;
use super::page::{self, num, text, Cell, CHART_H, CHART_W};
use crate::charts::{self, Axis, LineChart, LineStyle, Marker, Series};
use crate::load::Source;
use crate::predict::{self, Link};
use crate::units;

/// Reference wires: NVLink-class inside a node and a 200 Gb/s-class
/// network, bandwidth terms only (alpha 0), as the worked example uses.
const REFERENCES: [(&str, f64); 2] = [
    ("reference NVLink 400 GB/s", 400.0),
    ("reference network 25 GB/s", 25.0),
];
/// The decode step of the worked example: 32 sequences, one token each, fp16.
const BATCH: u64 = 32;
const SEQ: u64 = 1;
const DTYPE: &str = "fp16";
const TP_DEGREES: [usize; 3] = [2, 4, 8];

struct Wire {
    name: String,
    link: Link,
    measured: bool,
}

fn wires(sources: &[Source]) -> Vec<Wire> {
    let mut out: Vec<Wire> = curves(sources)
        .into_iter()
        .filter(|c| c.row.collective == "all_reduce")
        .filter_map(|c| {
            let pts: Vec<(f64, f64)> = c.by_size.iter().map(|p| (p.bytes, p.time_us)).collect();
            let fit = predict::fit("all_reduce", c.row.world, &pts)?;
            Some(Wire {
                name: format!(
                    "{}: {}/{} {} np{} {}",
                    c.source, c.row.backend, c.row.wire, c.row.algo, c.row.world, c.row.dtype
                ),
                link: fit.link,
                measured: true,
            })
        })
        .collect();
    out.extend(REFERENCES.iter().map(|(name, gbps)| Wire {
        name: name.to_string(),
        link: Link {
            alpha_us: 0.0,
            gbps: *gbps,
        },
        measured: false,
    }));
    out
}

fn per_token_us(shape: &predict::Shape, link: Link, tp: usize) -> f64 {
    let bytes = predict::dtype_bytes(DTYPE).unwrap_or(2);
    let tr = predict::tp_traffic(BATCH, SEQ, shape.hidden, shape.layers, tp, bytes);
    tr.calls as f64 * predict::ring_all_reduce_us(link, tr.bytes_per_call, tp)
}

/// The section's HTML.
pub fn section(sources: &[Source]) -> String {
    let wires = wires(sources);
    let presets = predict::presets();
    let mut body = page::note(&format!(
        "Forward tensor-parallel communication per token step (batch {BATCH} sequences, one new token each, {DTYPE}; 2 ring all-reduces per layer of batch x hidden x 2 bytes). Each measured wire's alpha and beta come from the alpha-beta fit of its all_reduce curve, and are applied to t ranks as if every link behaved as measured. The reference wires count bandwidth only."
    ));
    if !wires.iter().any(|w| w.measured) {
        body.push_str(&page::empty(
            "No all_reduce measurement in these results folders: only the reference wires are shown. Run bench-collectives all_reduce --out DIR to plan on your own wire.",
        ));
    }
    let mut header = vec!["wire".to_string(), "alpha".into(), "link GB/s".into()];
    header.extend(presets.iter().map(|p| format!("{} at TP=8", p.name)));
    let rows: Vec<Vec<Cell>> = wires
        .iter()
        .map(|w| {
            let mut r = vec![
                text(w.name.clone()),
                num(units::micros(w.link.alpha_us)),
                num(units::sig3(w.link.gbps)),
            ];
            r.extend(
                presets
                    .iter()
                    .map(|p| num(units::micros(per_token_us(p, w.link, 8)))),
            );
            r
        })
        .collect();
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    body.push_str(&page::table(&header_refs, &rows));
    if let Some(shape) = presets
        .iter()
        .find(|p| p.layers == 80 && p.hidden == 8192)
        .or(presets.first())
    {
        let series = wires
            .iter()
            .enumerate()
            .map(|(i, w)| Series {
                label: w.name.clone(),
                color: i,
                line: if w.measured {
                    LineStyle::Solid
                } else {
                    LineStyle::Dashed
                },
                marker: if w.measured {
                    Marker::Circle
                } else {
                    Marker::None
                },
                points: TP_DEGREES
                    .iter()
                    .map(|&t| (t as f64, per_token_us(shape, w.link, t)))
                    .collect(),
            })
            .collect();
        let chart = LineChart {
            title: format!(
                "{}: tensor-parallel communication per token step",
                shape.name
            ),
            x_desc: "tensor-parallel degree".into(),
            y_desc: "communication per token step (log10)".into(),
            x: Axis::Log2Count,
            y: Axis::Log10Micros,
            series,
            legend_title: "solid measured wire, dashed reference".into(),
        };
        body.push_str(&page::figure(
            "capacity-chart",
            charts::line_chart(&chart, CHART_W, CHART_H),
            &format!(
                "{}: communication per token step against TP degree on each wire.",
                shape.name
            ),
        ));
    }
    page::section("capacity", "Capacity planning", &body)
}
