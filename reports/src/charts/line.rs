//! Line and point charts on linear or logarithmic axes (message-size sweeps,
//! bubble against microbatches, per-token cost against TP degree).

use super::{color, log2_key_points, FONT};
use crate::units;
use plotters::prelude::*;

/// How an axis maps values and writes its labels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Axis {
    /// Bytes on a log2 scale, labelled 8 B, 1 KiB, 1 MiB...
    Log2Bytes,
    /// A count on a log2 scale (microbatches, TP degree), labelled 1, 2, 4...
    Log2Count,
    /// Microseconds on a log10 scale, labelled 1 us, 10 us, 1 ms...
    Log10Micros,
    /// A positive number on a log10 scale (bandwidths spanning decades:
    /// from a latency-bound 8 B to an in-cache ceiling), labelled 0.1, 1, 10...
    Log10,
    /// A plain number from zero (`report trend`'s nights and figures).
    Linear,
    /// A fraction from zero, labelled in percent.
    Fraction,
}

impl Axis {
    fn to_plot(self, v: f64) -> Option<f64> {
        match self {
            Axis::Log2Bytes | Axis::Log2Count => (v > 0.0).then(|| v.log2()),
            Axis::Log10Micros | Axis::Log10 => (v > 0.0).then(|| v.log10()),
            Axis::Linear | Axis::Fraction => Some(v),
        }
        .filter(|x| x.is_finite())
    }

    fn label(self, x: f64) -> String {
        match self {
            Axis::Log2Bytes => units::bytes(2f64.powf(x).round()),
            Axis::Log2Count => format!("{}", 2f64.powf(x).round()),
            Axis::Log10Micros => units::micros_tick(10f64.powf(x)),
            Axis::Log10 => units::short(10f64.powf(x)),
            Axis::Linear => units::short(x),
            Axis::Fraction => format!("{:.0}%", x * 100.0),
        }
    }

    /// Plot range and key points from the data's extent in plot space.
    fn layout(self, lo: f64, hi: f64) -> (f64, f64, Vec<f64>) {
        match self {
            Axis::Log2Bytes | Axis::Log2Count => {
                let (lo, hi) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
                (lo - 0.3, hi + 0.3, log2_key_points(lo, hi))
            }
            Axis::Log10Micros | Axis::Log10 => {
                // Whole decades at both ends, so every chart has labelled ticks
                // above and below its data.
                let (a, b) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
                let dense = b - a <= 2.0;
                let mut pts = Vec::new();
                let mut k = a;
                while k <= b {
                    pts.push(k);
                    if dense && k < b {
                        pts.push(k + 2f64.log10());
                        pts.push(k + 5f64.log10());
                    }
                    k += 1.0;
                }
                (a, b, pts)
            }
            Axis::Linear | Axis::Fraction => {
                let hi = if hi > 0.0 { hi * 1.1 } else { 1.0 };
                let hi = if self == Axis::Fraction {
                    hi.clamp(0.05, 1.0)
                } else {
                    hi
                };
                let step = nice_step(hi / 6.0);
                let pts = (0..=((hi / step).floor() as usize))
                    .map(|i| i as f64 * step)
                    .collect();
                (0.0, hi, pts)
            }
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// How a series' points are joined.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LineStyle {
    Solid,
    Dashed,
    Dotted,
    None,
    /// A translucent filled band: the points run along its lower edge and
    /// back along its upper edge (a min..max range; see [`band_points`]).
    Band,
}

/// The outline of a band from `(x, low, high)` triples: the lower edge
/// left to right, then the upper edge right to left.
pub fn band_points(range: &[(f64, f64, f64)]) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = range.iter().map(|&(x, lo, _)| (x, lo)).collect();
    pts.extend(range.iter().rev().map(|&(x, _, hi)| (x, hi)));
    pts
}

/// What marks each point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Marker {
    None,
    Circle,
    Square,
    Triangle,
}

/// One labelled line or set of points, in data units.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub color: usize,
    pub line: LineStyle,
    pub marker: Marker,
    pub points: Vec<(f64, f64)>,
}

/// One entry of a line chart's legend: what a colour (a curve) is. The
/// legend is HTML above the chart (report's `page::line_figure`), not SVG.
#[derive(Clone, Debug, PartialEq)]
pub struct LegendItem {
    pub label: String,
    pub color: usize,
    pub line: LineStyle,
    pub marker: Marker,
}

/// A chart of series on two axes.
#[derive(Clone, Debug)]
pub struct LineChart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub x: Axis,
    pub y: Axis,
    pub series: Vec<Series>,
    /// One entry per curve; empty: one per labelled series.
    pub legend: Vec<LegendItem>,
}

impl LineChart {
    /// The legend's entries: the chart's own, or one per labelled series.
    pub fn legend_items(&self) -> Vec<LegendItem> {
        if !self.legend.is_empty() {
            return self.legend.clone();
        }
        self.series
            .iter()
            .filter(|s| !s.label.is_empty())
            .map(|s| LegendItem {
                label: s.label.clone(),
                color: s.color,
                line: s.line,
                marker: s.marker,
            })
            .collect()
    }

    /// The same chart with only the series (and legend entries) of these colours.
    pub fn only_colors(&self, colors: &[usize]) -> LineChart {
        let mut c = self.clone();
        c.series.retain(|s| colors.contains(&s.color));
        c.legend.retain(|l| colors.contains(&l.color));
        c
    }
}

/// Draws one marker at a pixel position (legend samples).
pub(crate) fn draw_marker_px(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    marker: Marker,
    at: (i32, i32),
    c: RGBColor,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    match marker {
        Marker::None => Ok(()),
        Marker::Circle => area.draw(&Circle::new(at, 4, c.filled())),
        Marker::Square => area.draw(&Rectangle::new(
            [(at.0 - 4, at.1 - 4), (at.0 + 4, at.1 + 4)],
            c.filled(),
        )),
        Marker::Triangle => area.draw(&TriangleMarker::new(at, 5, c.filled())),
    }
}

/// Draws `chart` as an SVG document `width` pixels wide.
pub fn line_chart(chart: &LineChart, width: u32, height: u32) -> Result<String, String> {
    let series: Vec<(usize, Vec<(f64, f64)>)> = chart
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let pts = s
                .points
                .iter()
                .filter_map(|&(x, y)| Some((chart.x.to_plot(x)?, chart.y.to_plot(y)?)))
                .collect();
            (i, pts)
        })
        .collect();
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.is_empty() {
        return Err("no points to draw".into());
    }
    let (xmin, xmax) = extent(all.iter().map(|p| p.0));
    let (ymin, ymax) = extent(all.iter().map(|p| p.1));
    let (x0, x1, xkeys) = chart.x.layout(xmin, xmax);
    let (y0, y1, ykeys) = chart.y.layout(ymin, ymax);
    let mut svg = String::new();
    {
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut c = ChartBuilder::on(&root)
            .caption(&chart.title, (FONT, 22).into_font())
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(
                super::Keyed::new(x0, x1, xkeys),
                super::Keyed::new(y0, y1, ykeys),
            )
            .map_err(err)?;
        let (xa, ya) = (chart.x, chart.y);
        c.configure_mesh()
            .x_desc(chart.x_desc.as_str())
            .y_desc(chart.y_desc.as_str())
            .x_label_formatter(&|v| xa.label(*v))
            .y_label_formatter(&|v| ya.label(*v))
            .label_style((FONT, 15).into_font())
            .axis_desc_style((FONT, 16).into_font())
            .bold_line_style(RGBColor(225, 225, 225).stroke_width(1))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (i, pts) in &series {
            let s = &chart.series[*i];
            let col = color(s.color);
            let style = col.stroke_width(2);
            match s.line {
                LineStyle::Solid => {
                    c.draw_series(LineSeries::new(pts.iter().copied(), style))
                        .map_err(err)?;
                }
                LineStyle::Dashed => {
                    c.draw_series(DashedLineSeries::new(pts.iter().copied(), 7, 5, style))
                        .map_err(err)?;
                }
                LineStyle::Dotted => {
                    c.draw_series(DashedLineSeries::new(pts.iter().copied(), 2, 4, style))
                        .map_err(err)?;
                }
                LineStyle::Band => {
                    c.draw_series(std::iter::once(Polygon::new(
                        pts.clone(),
                        col.mix(0.18).filled(),
                    )))
                    .map_err(err)?;
                }
                LineStyle::None => {}
            }
            match s.marker {
                Marker::None => {}
                Marker::Circle => {
                    c.draw_series(pts.iter().map(|p| Circle::new(*p, 4, col.filled())))
                        .map_err(err)?;
                }
                Marker::Square => {
                    c.draw_series(pts.iter().map(|p| {
                        EmptyElement::at(*p) + Rectangle::new([(-4, -4), (4, 4)], col.filled())
                    }))
                    .map_err(err)?;
                }
                Marker::Triangle => {
                    c.draw_series(pts.iter().map(|p| TriangleMarker::new(*p, 5, col.filled())))
                        .map_err(err)?;
                }
            }
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn extent(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(label: &str) -> LineChart {
        LineChart {
            title: "busbw".into(),
            x_desc: "message size".into(),
            y_desc: "GB/s".into(),
            x: Axis::Log2Bytes,
            y: Axis::Linear,
            series: vec![Series {
                label: label.into(),
                color: 0,
                line: LineStyle::Solid,
                marker: Marker::Circle,
                points: vec![(8.0, 0.01), (1024.0, 1.0), (67108864.0, 10.0)],
            }],
            legend: Vec::new(),
        }
    }

    #[test]
    fn draws_svg_with_readable_size_labels_and_escaped_title() {
        // The legend is HTML (the report's page escapes it); the title is SVG.
        let mut c = chart("x");
        c.title = "<script>&".into();
        let svg = line_chart(&c, 900, 400).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        for label in ["8 B", "1 KiB", "1 MiB", "64 MiB"] {
            assert!(
                svg.contains(&format!(">\n{label}\n</text>")),
                "no {label} label"
            );
        }
        assert!(svg.contains("&lt;script&gt;&amp;"));
        assert!(!svg.contains("<script>"));
    }

    #[test]
    fn refuses_an_empty_chart() {
        let mut c = chart("x");
        c.series[0].points.clear();
        assert!(line_chart(&c, 900, 400).is_err());
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(0.9), 1.0);
        assert_eq!(nice_step(1.7), 2.0);
        assert_eq!(nice_step(3.1), 5.0);
    }
}
