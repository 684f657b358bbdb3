//! Charts as inline SVG, drawn with plotters' SVG backend: no scripts, no
//! fonts to fetch, readable in any browser and in a printed page.
//!
//! Bar and timeline charts keep their legend in a column at their right so
//! that no legend covers data; a line chart's legend is HTML above it
//! (`html::page::line_figure`). Every text plotters writes is escaped by
//! plotters itself.

mod bars;
mod line;
mod timeline;

pub use bars::{stacked_bars, BarStack, Bars};
pub use line::{band_points, line_chart, Axis, LegendItem, LineChart, LineStyle, Marker, Series};
pub use timeline::{timeline_chart, TimelineChart};

use plotters::prelude::*;

/// The colours of series, in order (Tableau 10: distinct, print-safe).
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The `i`th colour of the palette (wrapping).
pub fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Width of the legend column at the right of each chart, pixels.
pub const LEGEND_W: u32 = 300;
const FONT: &str = "sans-serif";

/// One line of a legend: a sample of the line or marker and its label.
pub(crate) struct LegendEntry {
    pub label: String,
    pub color: RGBColor,
    pub line: LineStyle,
    pub marker: Marker,
    /// Draw a filled box instead of a line sample (bars, timeline slices).
    pub swatch: bool,
}

/// Characters of a legend line that fit the legend column.
const LEGEND_CHARS: usize = 30;

/// A label broken into lines that fit the legend column, at spaces where
/// it can (a word longer than a line is cut into pieces): every word of a
/// label stays, so the words that tell two curves apart are never cut off.
pub(crate) fn wrap_label(label: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in label.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > LEGEND_CHARS {
            if !cur.is_empty() {
                lines.push(std::mem::take(&mut cur));
            }
            lines.push(word.drain(..LEGEND_CHARS).collect());
        }
        let word: String = word.into_iter().collect();
        let len = cur.chars().count();
        if len > 0 && len + 1 + word.chars().count() > LEGEND_CHARS {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(&word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

/// Pixel height of one legend line of text, and between entries.
const LEGEND_LINE: i32 = 18;
const LEGEND_GAP: i32 = 6;

/// Draws `entries` top-down in `area` (the legend column), each label
/// wrapped onto as many lines as it needs ([`wrap_label`]).
pub(crate) fn draw_legend(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    title: &str,
    entries: &[LegendEntry],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
    let text = TextStyle::from((FONT, 16).into_font()).color(&BLACK);
    let mut y = 46;
    if !title.is_empty() {
        area.draw(&Text::new(
            title.to_string(),
            (8, y - 18),
            TextStyle::from((FONT, 16).into_font().style(FontStyle::Bold)).color(&BLACK),
        ))
        .map_err(err)?;
    }
    for e in entries {
        let (x0, x1, ym) = (8, 38, y + 6);
        if e.swatch || e.line == LineStyle::Band {
            area.draw(&Rectangle::new(
                [(x0 + 6, y), (x1 - 6, y + 12)],
                e.color.filled(),
            ))
            .map_err(err)?;
        } else {
            let style = e.color.stroke_width(2);
            match e.line {
                LineStyle::Solid => area
                    .draw(&PathElement::new(vec![(x0, ym), (x1, ym)], style))
                    .map_err(err)?,
                LineStyle::Dashed => {
                    for (a, b) in [(x0, x0 + 7), (x0 + 11, x0 + 18), (x0 + 22, x1)] {
                        area.draw(&PathElement::new(vec![(a, ym), (b, ym)], style))
                            .map_err(err)?;
                    }
                }
                LineStyle::Dotted => {
                    for a in (x0..x1).step_by(5) {
                        area.draw(&PathElement::new(vec![(a, ym), (a + 2, ym)], style))
                            .map_err(err)?;
                    }
                }
                LineStyle::None | LineStyle::Band => {}
            }
            line::draw_marker_px(area, e.marker, ((x0 + x1) / 2, ym), e.color).map_err(err)?;
        }
        let lines = wrap_label(&e.label);
        for (k, line) in lines.iter().enumerate() {
            area.draw(&Text::new(
                line.clone(),
                (x1 + 8, y + k as i32 * LEGEND_LINE),
                text.clone(),
            ))
            .map_err(err)?;
        }
        y += lines.len() as i32 * LEGEND_LINE + LEGEND_GAP;
    }
    Ok(())
}

/// Pixel height a legend of `n` one-line entries needs.
pub(crate) fn legend_height(n: usize) -> u32 {
    70 + 24 * n as u32
}

/// Pixel height a legend of these labels needs, each wrapped ([`wrap_label`]).
pub(crate) fn legend_height_of<'a>(labels: impl IntoIterator<Item = &'a str>) -> u32 {
    70 + labels
        .into_iter()
        .map(|l| wrap_label(l).len() as u32 * LEGEND_LINE as u32 + LEGEND_GAP as u32)
        .sum::<u32>()
}

/// Key points for a log2 axis from 2^lo to 2^hi: both ends and the powers
/// between them at a step that keeps about ten labels.
pub(crate) fn log2_key_points(lo: f64, hi: f64) -> Vec<f64> {
    let (lo_i, hi_i) = (lo.ceil() as i64, hi.floor() as i64);
    let span = (hi_i - lo_i).max(0);
    let step = [1, 2, 5, 10]
        .into_iter()
        .find(|s| span / s <= 11)
        .unwrap_or(10);
    let mut pts: Vec<f64> = vec![lo_i as f64];
    let mut k = lo_i + 1;
    while k < hi_i {
        if k % step == 0 && k - lo_i >= step.min(2) && hi_i - k >= step.min(2) {
            pts.push(k as f64);
        }
        k += 1;
    }
    if hi_i > lo_i {
        pts.push(hi_i as f64);
    }
    pts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_wrap_at_words_and_keep_every_word() {
        let l = "ceiling 5.38 GB/s: results local/shm ring np2 run 2026-12-01T11:10:18Z";
        let lines = wrap_label(l);
        assert!(lines.len() >= 2, "{lines:?}");
        assert!(
            lines.iter().all(|x| x.chars().count() <= LEGEND_CHARS),
            "{lines:?}"
        );
        assert_eq!(lines.join(" "), l, "no word lost");
        assert_eq!(wrap_label("short"), ["short"]);
        assert_eq!(wrap_label(""), [""]);
        let long = "x".repeat(70);
        assert_eq!(wrap_label(&long).concat(), long);
        assert!(legend_height_of([l, "short"]) > legend_height_of(["short"]));
    }

    #[test]
    fn log2_labels_cover_the_range() {
        let pts = log2_key_points(3.0, 26.0);
        assert_eq!(pts.first(), Some(&3.0));
        assert_eq!(pts.last(), Some(&26.0));
        assert!(pts.contains(&10.0) && pts.contains(&20.0), "{pts:?}");
        assert!(pts.len() <= 14, "{pts:?}");
        assert_eq!(
            log2_key_points(0.0, 5.0),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
    }
}

/// A linear f64 axis whose ticks are exactly the given key points (plotters'
/// own `with_key_points` lacks the formatter bound that `configure_mesh`
/// needs on f64 axes).
#[derive(Clone, Debug)]
pub(crate) struct Keyed {
    lo: f64,
    hi: f64,
    keys: Vec<f64>,
}

impl Keyed {
    /// The range lo..hi (widened to lo..lo+1 when empty) ticked at `keys`.
    pub(crate) fn new(lo: f64, hi: f64, keys: Vec<f64>) -> Self {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        Keyed { lo, hi, keys }
    }
}

impl plotters::coord::ranged1d::Ranged for Keyed {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let f = (value - self.lo) / (self.hi - self.lo);
        limit.0 + (f * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.keys.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}
