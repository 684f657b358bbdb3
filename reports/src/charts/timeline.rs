//! A pipeline run drawn as a Gantt chart: one lane per rank, one box per
//! action, coloured by what it computes (F, B, I, W), named when it fits.

use super::{draw_legend, legend_height, LegendEntry, LineStyle, Marker, FONT, LEGEND_W};
use crate::timeline::{ActionKind, Lane};
use plotters::prelude::*;

/// A run's lanes and its title.
#[derive(Clone, Debug)]
pub struct TimelineChart<'a> {
    pub title: String,
    pub lanes: &'a [Lane],
}

/// The colour of an action kind: forward blue, backward orange, input
/// gradient red, weight gradient green, waiting light grey, transfer
/// yellow, anything else grey.
pub fn kind_color(kind: ActionKind) -> RGBColor {
    match kind {
        ActionKind::F => RGBColor(31, 119, 180),
        ActionKind::B => RGBColor(255, 127, 14),
        ActionKind::I => RGBColor(214, 39, 40),
        ActionKind::W => RGBColor(44, 160, 44),
        ActionKind::Wait => RGBColor(210, 210, 210),
        ActionKind::Transfer => RGBColor(230, 190, 40),
        ActionKind::Other => RGBColor(170, 170, 170),
    }
}

/// Draws the run as an SVG document; time starts at the first action.
pub fn timeline_chart(t: &TimelineChart, width: u32) -> Result<String, String> {
    let slices = || t.lanes.iter().flat_map(|l| l.slices.iter());
    let start = slices().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
    let end = slices()
        .map(|s| s.start_us + s.dur_us)
        .fold(f64::NEG_INFINITY, f64::max);
    if !start.is_finite() || !end.is_finite() {
        return Err("no actions to draw".into());
    }
    let span_ms = ((end - start) / 1e3).max(1e-6);
    let n = t.lanes.len();
    let mut kinds: Vec<ActionKind> = slices().map(|s| s.kind).collect();
    kinds.sort();
    kinds.dedup();
    let height = (90 + 34 * n as u32).max(legend_height(kinds.len()));
    let mut svg = String::new();
    {
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (plot, legend) = root.split_horizontally(width.saturating_sub(LEGEND_W));
        let lane_keys: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
        // Room for the longest lane name at the label font (about 8 px a
        // character): "rank 0 (clock +/- 0.0 us)" was cut to its tail.
        let longest = t
            .lanes
            .iter()
            .map(|l| l.name.chars().count())
            .max()
            .unwrap_or(0);
        let label_px = (8 * longest as u32 + 16).clamp(72, 360);
        let mut c = ChartBuilder::on(&plot)
            .caption(&t.title, (FONT, 20).into_font())
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(label_px)
            .build_cartesian_2d(0.0..span_ms, super::Keyed::new(0.0, n as f64, lane_keys))
            .map_err(err)?;
        let names: Vec<String> = t.lanes.iter().map(|l| l.name.clone()).collect();
        c.configure_mesh()
            .x_desc("time since the first action (ms)")
            .y_label_formatter(&|v| {
                // Lane 0 at the top.
                let i = (n as f64 - v).floor();
                if i >= 0.0 && (i as usize) < names.len() {
                    names[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .x_label_formatter(&|v| crate::units::short(*v))
            .label_style((FONT, 15).into_font())
            .axis_desc_style((FONT, 16).into_font())
            .bold_line_style(RGBColor(230, 230, 230).stroke_width(1))
            .light_line_style(WHITE.mix(0.0))
            .disable_y_mesh()
            .draw()
            .map_err(err)?;
        let plot_px = (width.saturating_sub(LEGEND_W) as f64 - label_px as f64 - 28.0).max(100.0);
        for (i, lane) in t.lanes.iter().enumerate() {
            let y = (n - 1 - i) as f64;
            for s in &lane.slices {
                let x0 = (s.start_us - start) / 1e3;
                let x1 = x0 + s.dur_us / 1e3;
                c.draw_series(std::iter::once(Rectangle::new(
                    [(x0, y + 0.12), (x1, y + 0.88)],
                    kind_color(s.kind).filled(),
                )))
                .map_err(err)?;
                c.draw_series(std::iter::once(Rectangle::new(
                    [(x0, y + 0.12), (x1, y + 0.88)],
                    WHITE.stroke_width(1),
                )))
                .map_err(err)?;
                let px = plot_px * (x1 - x0) / span_ms;
                if px >= 8.0 * s.name.chars().count() as f64 + 4.0 {
                    c.draw_series(std::iter::once(Text::new(
                        s.name.clone(),
                        (x0 + (x1 - x0) * 0.5, y + 0.5),
                        TextStyle::from((FONT, 13).into_font()).color(&WHITE).pos(
                            plotters::style::text_anchor::Pos::new(
                                plotters::style::text_anchor::HPos::Center,
                                plotters::style::text_anchor::VPos::Center,
                            ),
                        ),
                    )))
                    .map_err(err)?;
                }
            }
        }
        let entries: Vec<LegendEntry> = kinds
            .iter()
            .map(|k| LegendEntry {
                label: k.label().to_string(),
                color: kind_color(*k),
                line: LineStyle::None,
                marker: Marker::None,
                swatch: true,
            })
            .collect();
        draw_legend(&legend, "action", &entries)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
