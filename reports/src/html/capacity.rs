//! The planning section's tensor-parallel part: what tensor parallelism
//! would cost per token on each measured wire, from that wire's fitted all_reduce alpha and beta, beside
//! the NVLink and network reference figures of the worked example.

use super::collectives::{curve_fit, curves};
use super::page::{self, num, text, Cell, KeyItem};
use crate::charts::{Axis, LineChart, LineStyle, Marker, Series};
use crate::load::Source;
use crate::predict;
use crate::units;
use parbench::model::{LinkParams, Preset, TpMode, TpTraffic};

/// The decode step of the worked example: 32 sequences, one token each, fp16.
const BATCH: u64 = 32;
const DTYPE: &str = "fp16";
const TP_DEGREES: [u64; 3] = [2, 4, 8];

struct Wire {
    name: String,
    /// Ranks the wire was measured with (0 for a reference).
    world: usize,
    link: LinkParams,
    /// The algorithm to project the link with.
    algo: predict::ModelAlgo,
    measured: bool,
}

fn wires(sources: &[Source]) -> Vec<Wire> {
    let mut out: Vec<Wire> = curves(sources)
        .into_iter()
        .filter(|c| c.row.collective == "all_reduce")
        .filter_map(|c| {
            let fit = curve_fit(&c).ok()?;
            Some(Wire {
                name: format!(
                    "{}: {}/{} {} np{} {}",
                    c.source,
                    c.row.backend,
                    c.row.wire,
                    c.fit_algo(),
                    c.row.world,
                    c.row.dtype
                ),
                link: fit.link,
                world: c.row.world,
                algo: predict::projection_algo(&predict::ModelAlgo::of(c.fit_algo())),
                measured: true,
            })
        })
        .collect();
    for (name, gbps) in [
        ("reference NVLink", predict::NVLINK_REFERENCE_GBPS),
        ("reference network", predict::NETWORK_REFERENCE_GBPS),
    ] {
        out.push(Wire {
            name: format!("{name} {} GB/s", units::short(gbps)),
            link: predict::bandwidth_link(gbps),
            world: 0,
            algo: parbench::comm::algo::Algorithm::Ring.into(),
            measured: false,
        });
    }
    out
}

/// Communication per decode step of `preset` at degree `tp` over `wire`, microseconds.
fn per_token_us(preset: &Preset, wire: &Wire, tp: u64) -> f64 {
    let bytes = predict::dtype_bytes(DTYPE).unwrap_or(2);
    let tr = TpTraffic::new(tp, BATCH, 1, preset.hidden, bytes, TpMode::Decode, false);
    predict::comm_us_per_step(&tr, preset.layers, &wire.algo, &wire.link).unwrap_or(f64::NAN)
}

/// The planning section's tensor-parallel part; none without a measured
/// all_reduce (the reference wires alone say nothing of this machine).
pub fn body(sources: &[Source]) -> Option<String> {
    let wires = wires(sources);
    if !wires.iter().any(|w| w.measured) {
        return None;
    }
    let presets: Vec<&Preset> = predict::PRESETS.iter().filter(|p| p.layers >= 8).collect();
    let mut body = page::note(&format!(
        "Tensor-parallel communication per decode step (batch {BATCH} sequences, one new token each, {DTYPE}: the worked example's \"per token\"), for each model preset: 2 all-reduces per layer of batch x hidden x 2 bytes, timed with parbench::model's alpha-beta cost. A measured wire's alpha and beta come from the fit of its all_reduce curve and are projected to t ranks as if every link behaved as measured (ring for curves measured with auto). The reference wires count bandwidth only."
    ));
    let projected: Vec<String> = wires
        .iter()
        .filter(|w| w.measured && (w.world as u64) < TP_DEGREES[TP_DEGREES.len() - 1])
        .map(|w| w.name.clone())
        .collect();
    if !projected.is_empty() {
        body.push_str(&page::note(&format!(
            "Caveat: {} measured fewer ranks than the degrees projected here (up to TP={}). Their columns assume every added rank's link behaves as the measured ones; on one host (shared memory, loopback) a real TP=8 group would share the same cores and memory, so read them as a what-if of the wire's alpha and beta, not a prediction of that host.",
            projected.join("; "),
            TP_DEGREES[TP_DEGREES.len() - 1]
        )));
    }
    let mut header = vec!["wire".to_string(), "alpha".into(), "link GB/s".into()];
    header.extend(
        presets
            .iter()
            .map(|p| format!("{} ({} x {}) at TP=8", p.name, p.layers, p.hidden)),
    );
    let rows: Vec<Vec<Cell>> = wires
        .iter()
        .map(|w| {
            let mut r = vec![
                text(w.name.clone()),
                num(if w.measured {
                    units::micros(w.link.alpha_us())
                } else {
                    "0 (bandwidth only)".into()
                }),
                num(units::sig3(w.link.bandwidth_gbps())),
            ];
            r.extend(
                presets
                    .iter()
                    .map(|p| num(units::micros(per_token_us(p, w, 8)))),
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
                    .map(|&t| (t as f64, per_token_us(shape, w, t)))
                    .collect(),
            })
            .collect();
        let chart = LineChart {
            title: format!(
                "{} ({} x {}): communication per token step",
                shape.name, shape.layers, shape.hidden
            ),
            x_desc: "tensor-parallel degree".into(),
            y_desc: "communication per token step (log10)".into(),
            x: Axis::Log2Count,
            y: Axis::Log10Micros,
            series,
            legend: Vec::new(),
        };
        body.push_str(&page::line_figure(
            "capacity-chart",
            &chart,
            &format!(
                "{}: tensor-parallel communication per token step against TP degree on each wire.",
                shape.name
            ),
            &[
                KeyItem {
                    line: LineStyle::Solid,
                    marker: Marker::Circle,
                    text: "measured wire".into(),
                },
                KeyItem {
                    line: LineStyle::Dashed,
                    marker: Marker::None,
                    text: "reference wire".into(),
                },
            ],
        ));
    }
    Some(body)
}
