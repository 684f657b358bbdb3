//! Stacked bars per category (compute and communication per TP degree),
//! with per-category markers for the model's figure.

use super::{color, draw_legend, legend_height_of, LegendEntry, LineStyle, Marker, FONT, LEGEND_W};
use crate::units;
use plotters::prelude::*;

/// One layer of the stack: a value per category.
#[derive(Clone, Debug)]
pub struct BarStack {
    pub label: String,
    pub color: usize,
    pub values: Vec<f64>,
}

/// A stacked bar chart in microseconds; `markers` are drawn as a bar-wide
/// tick at their value (a prediction to hold the bar against).
#[derive(Clone, Debug)]
pub struct Bars {
    pub title: String,
    pub y_desc: String,
    pub categories: Vec<String>,
    pub stacks: Vec<BarStack>,
    pub markers: Vec<BarStack>,
    pub legend_title: String,
}

/// Draws `bars` as an SVG document.
pub fn stacked_bars(bars: &Bars, width: u32, height: u32) -> Result<String, String> {
    let n = bars.categories.len();
    if n == 0 || bars.stacks.is_empty() {
        return Err("no bars to draw".into());
    }
    let value = |s: &BarStack, i: usize| {
        s.values
            .get(i)
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let top = (0..n)
        .map(|i| {
            let stacked: f64 = bars.stacks.iter().filter_map(|s| value(s, i)).sum();
            let marked = bars
                .markers
                .iter()
                .filter_map(|s| value(s, i))
                .fold(0.0, f64::max);
            stacked.max(marked)
        })
        .fold(0.0, f64::max);
    let ymax = if top > 0.0 { top * 1.15 } else { 1.0 };
    let height = height.max(legend_height_of(
        bars.stacks
            .iter()
            .map(|s| s.label.as_str())
            .chain(bars.markers.iter().map(|m| m.label.as_str())),
    ));
    let mut svg = String::new();
    {
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (plot, legend) = root.split_horizontally(width.saturating_sub(LEGEND_W));
        let keys: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let mut c = ChartBuilder::on(&plot)
            .caption(&bars.title, (FONT, 22).into_font())
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d(super::Keyed::new(-0.6, n as f64 - 0.4, keys), 0.0..ymax)
            .map_err(err)?;
        let cats = bars.categories.clone();
        c.configure_mesh()
            .y_desc(bars.y_desc.as_str())
            .x_label_formatter(&|v| {
                let i = v.round();
                if i >= 0.0 && (i as usize) < cats.len() {
                    cats[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| units::micros_tick(*v))
            .label_style((FONT, 15).into_font())
            .axis_desc_style((FONT, 16).into_font())
            .bold_line_style(RGBColor(225, 225, 225).stroke_width(1))
            .light_line_style(WHITE.mix(0.0))
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        for i in 0..n {
            let mut base = 0.0;
            let x = i as f64;
            for s in &bars.stacks {
                if let Some(v) = value(s, i) {
                    c.draw_series(std::iter::once(Rectangle::new(
                        [(x - 0.32, base), (x + 0.32, base + v)],
                        color(s.color).filled(),
                    )))
                    .map_err(err)?;
                    base += v;
                }
            }
            for m in &bars.markers {
                if let Some(v) = value(m, i) {
                    c.draw_series(std::iter::once(PathElement::new(
                        vec![(x - 0.42, v), (x + 0.42, v)],
                        color(m.color).stroke_width(3),
                    )))
                    .map_err(err)?;
                }
            }
        }
        let mut entries: Vec<LegendEntry> = bars
            .stacks
            .iter()
            .map(|s| LegendEntry {
                label: s.label.clone(),
                color: color(s.color),
                line: LineStyle::None,
                marker: Marker::None,
                swatch: true,
            })
            .collect();
        entries.extend(bars.markers.iter().map(|m| LegendEntry {
            label: m.label.clone(),
            color: color(m.color),
            line: LineStyle::Solid,
            marker: Marker::None,
            swatch: false,
        }));
        draw_legend(&legend, &bars.legend_title, &entries)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
