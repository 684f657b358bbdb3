//! The page around the sections: the head with its inline style, tables,
//! figures and the plain "no data" note. Every string passed in as text is
//! escaped here; only SVG produced by `charts` goes in unescaped.

use super::escape::{esc, id};
use crate::charts::{self, LegendItem, LineChart, LineStyle, Marker};

/// Width of a chart, pixels (a bar or timeline chart's legend column
/// included); it shrinks to the page's width (`max-width: 100%`).
pub const CHART_W: u32 = 1120;
/// Most entries a line chart's legend holds: a chart of more curves is
/// drawn as several charts of at most this many.
pub const LEGEND_MAX: usize = 6;
/// Default height of a chart, pixels (taller when its legend needs it).
pub const CHART_H: u32 = 430;

const STYLE: &str = r#"
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       margin: 0; background: #f6f7f9; color: #1d2330; line-height: 1.45; }
header { background: #1d2330; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px; font-size: 24px; }
header p { margin: 2px 0; color: #c9d1e0; font-size: 14px; }
nav { background: #fff; border-bottom: 1px solid #dde1e8; padding: 8px 32px; position: sticky; top: 0; }
nav a { margin-right: 18px; color: #1f5fbf; text-decoration: none; font-weight: 600; }
main { padding: 8px 24px 40px; max-width: 1340px; }
section { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 4px 20px 18px; margin: 18px 0; }
h2 { font-size: 21px; border-bottom: 2px solid #e7eaf0; padding-bottom: 6px; }
h3 { font-size: 17px; margin: 22px 0 6px; }
p.note, p.empty { color: #4a5263; font-size: 14px; max-width: 900px; }
p.empty { background: #fff8e5; border-left: 4px solid #f0b400; padding: 8px 12px; }
figure.chart { margin: 10px 0 16px; }
figure.chart svg { display: block; max-width: 100%; height: auto; border: 1px solid #eceef2; }
figure.chart figcaption { font-size: 13px; color: #4a5263; margin-top: 4px; max-width: 1100px; }
/* No table wider than the page: cells wrap (numbers at their spaces,
   long words anywhere) instead of running off the right edge. */
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 14px; max-width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid #e7eaf0; text-align: right; overflow-wrap: anywhere; }
th { background: #f0f2f6; font-weight: 600; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
tbody tr:nth-child(even) { background: #fafbfc; }
td.text { text-align: left; min-width: 8em; max-width: 420px; }
td.bad { color: #b00020; font-weight: 600; }
td details summary { cursor: pointer; color: #1f5fbf; }
td details div { margin: 1px 0; }
.scroll { max-width: 100%; }
ul.summary { font-size: 14px; padding-left: 22px; max-width: 1100px; }
ul.summary li { margin: 3px 0; }
table.answers { font-size: 14px; width: 100%; }
table.answers th { text-align: left; }
table.answers td.text { max-width: none; }
div.legend { font-size: 13px; margin: 6px 0 2px; }
div.legend ul { list-style: none; padding: 0; margin: 0; display: flex; flex-wrap: wrap; gap: 2px 18px; }
div.legend li { display: flex; align-items: center; gap: 6px; }
div.legend p.key { color: #4a5263; margin: 4px 0 0; }
span.swatch { display: inline-block; width: 28px; height: 0; border-top-width: 3px; vertical-align: middle; }
span.mark { font-size: 14px; }
code { background: #f0f2f6; padding: 1px 4px; border-radius: 3px; }
/* On paper nothing scrolls: wide tables wrap their cells instead of being cut at the margin. */
@media print {
  body { background: #fff; }
  nav { position: static; }
  main { max-width: none; padding: 0; }
  section { border: none; padding: 0; break-inside: auto; }
  table { font-size: 9px; width: 100%; table-layout: auto; }
  th, td { padding: 2px 4px; }
  td.text { min-width: 0; max-width: none; }
  figure.chart { break-inside: avoid; }
}
"#;

/// The first line of every page the report writes (html, trend).
pub const DOCTYPE: &str = "<!DOCTYPE html>";

/// The document's beginning: head, style, header and navigation.
pub fn head(title: &str, subtitle: &[String], sections: &[(&str, &str)]) -> String {
    let mut s = format!(
        "{DOCTYPE}\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<header><h1>{}</h1>\n",
        esc(title),
        esc(title)
    );
    for line in subtitle {
        s.push_str(&format!("<p>{}</p>\n", esc(line)));
    }
    s.push_str("</header>\n<nav>");
    for (sid, name) in sections {
        s.push_str(&format!("<a href=\"#{}\">{}</a>", id(sid), esc(name)));
    }
    s.push_str("</nav>\n<main>\n");
    s
}

/// The document's end.
pub fn tail() -> &'static str {
    "</main>\n</body>\n</html>\n"
}

/// A section with an id, a heading and its body (already HTML); a body
/// with nothing to show gives no section at all (`None`).
pub fn section_if(sid: &str, title: &str, body: &str) -> Option<String> {
    (!body.trim().is_empty()).then(|| section(sid, title, body))
}

/// A section with an id, a heading and its body (already HTML).
pub fn section(sid: &str, title: &str, body: &str) -> String {
    format!(
        "<section id=\"{}\">\n<h2>{}</h2>\n{body}</section>\n",
        id(sid),
        esc(title)
    )
}

/// A sub-heading.
pub fn h3(text: &str) -> String {
    format!("<h3>{}</h3>\n", esc(text))
}

/// A paragraph of explanation.
pub fn note(text: &str) -> String {
    format!("<p class=\"note\">{}</p>\n", esc(text))
}

/// The plain statement that a section has nothing to show, and why.
pub fn empty(text: &str) -> String {
    format!("<p class=\"empty\">{}</p>\n", esc(text))
}

/// A chart (SVG from `charts`) with its caption; a chart that could not be
/// drawn becomes a note saying why, not an empty frame.
pub fn figure(fid: &str, svg: Result<String, String>, caption: &str) -> String {
    match svg {
        Ok(svg) => format!(
            "<figure class=\"chart\" id=\"{}\">\n{}\n<figcaption>{}</figcaption>\n</figure>\n",
            id(fid),
            strip_xml_decl(&svg),
            esc(caption)
        ),
        Err(e) => empty(&format!("Chart not drawn ({caption}): {e}")),
    }
}

fn strip_xml_decl(svg: &str) -> &str {
    match svg.strip_prefix("<?xml") {
        Some(rest) => rest.find("?>").map_or(svg, |i| rest[i + 2..].trim_start()),
        None => svg,
    }
}

/// A cell: text (escaped), with a class for left-aligned text or a warning.
#[derive(Clone, Debug)]
pub enum Cell {
    Num(String),
    Text(String),
    Bad(String),
    /// A one-line summary; its lines one click away (`<details>`).
    Folded(String, Vec<String>),
}

/// A table from a header and rows of cells.
pub fn table(header: &[&str], rows: &[Vec<Cell>]) -> String {
    table_of("", header, rows)
}

/// [`table`] with a class on the table element (`answers`).
pub fn table_of(class: &str, header: &[&str], rows: &[Vec<Cell>]) -> String {
    let mut s = if class.is_empty() {
        String::from("<table>\n<thead><tr>")
    } else {
        format!("<table class=\"{}\">\n<thead><tr>", esc(class))
    };
    for h in header {
        s.push_str(&format!("<th>{}</th>", esc(h)));
    }
    s.push_str("</tr></thead>\n<tbody>\n");
    for r in rows {
        s.push_str("<tr>");
        for c in r {
            match c {
                Cell::Num(t) => s.push_str(&format!("<td>{}</td>", esc(t))),
                Cell::Text(t) => s.push_str(&format!("<td class=\"text\">{}</td>", esc(t))),
                Cell::Bad(t) => s.push_str(&format!("<td class=\"bad\">{}</td>", esc(t))),
                Cell::Folded(summary, ls) => {
                    s.push_str(&format!(
                        "<td class=\"text\"><details><summary>{}</summary>",
                        esc(summary)
                    ));
                    for l in ls {
                        s.push_str(&format!("<div>{}</div>", esc(l)));
                    }
                    s.push_str("</details></td>");
                }
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>\n");
    s
}

/// Shorthand for a number cell.
pub fn num(s: impl Into<String>) -> Cell {
    Cell::Num(s.into())
}

/// Shorthand for a text cell.
pub fn text(s: impl Into<String>) -> Cell {
    Cell::Text(s.into())
}

/// One entry of a chart's shared key: what a line style or marker means
/// for every curve of the chart.
pub struct KeyItem {
    pub line: LineStyle,
    pub marker: Marker,
    pub text: String,
}

fn hex(c: usize) -> String {
    let plotters::style::RGBColor(r, g, b) = charts::color(c);
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// A sample of a line style and marker in `color` (CSS, no image).
fn sample(line: LineStyle, marker: Marker, color: &str) -> String {
    let mut s = match line {
        LineStyle::Solid | LineStyle::Dashed | LineStyle::Dotted => {
            let style = match line {
                LineStyle::Solid => "solid",
                LineStyle::Dashed => "dashed",
                _ => "dotted",
            };
            format!("<span class=\"swatch\" style=\"border-top-style: {style}; border-top-color: {color}\"></span>")
        }
        LineStyle::Band => format!(
            "<span class=\"swatch\" style=\"height: 10px; background: {color}; opacity: 0.3\"></span>"
        ),
        LineStyle::None => String::new(),
    };
    if let Some(m) = mark(marker) {
        s.push_str(&format!(
            "<span class=\"mark\" style=\"color: {color}\">{m}</span>"
        ));
    }
    s
}

/// The character that stands for a marker in HTML.
pub fn mark(marker: Marker) -> Option<&'static str> {
    match marker {
        Marker::None => None,
        Marker::Circle => Some("\u{25cf}"),
        Marker::Square => Some("\u{25a0}"),
        Marker::Triangle => Some("\u{25b2}"),
    }
}

/// A line chart with its legend above it in HTML: one entry per curve
/// (colour), and the shared `key` (line styles, markers) for the rest. A
/// chart of more than [`LEGEND_MAX`] curves becomes several charts of at
/// most that many, so that no legend grows past it.
pub fn line_figure(fid: &str, chart: &LineChart, caption: &str, key: &[KeyItem]) -> String {
    let items = chart.legend_items();
    let parts: Vec<&[LegendItem]> = if items.is_empty() {
        vec![&[]]
    } else {
        items.chunks(LEGEND_MAX).collect()
    };
    let mut out = String::new();
    for (k, part) in parts.iter().enumerate() {
        let (fid, mut chart) = if parts.len() == 1 {
            (fid.to_string(), chart.clone())
        } else {
            let colors: Vec<usize> = part.iter().map(|l| l.color).collect();
            let mut c = chart.only_colors(&colors);
            c.legend = part.to_vec();
            c.title = format!("{} ({} of {})", c.title, k + 1, parts.len());
            (format!("{fid}-{}", k + 1), c)
        };
        chart.legend = part.to_vec();
        let svg = charts::line_chart(&chart, CHART_W, CHART_H);
        if let Err(e) = &svg {
            out.push_str(&empty(&format!("Chart not drawn ({caption}): {e}")));
            continue;
        }
        let mut legend = String::from("<div class=\"legend\"><ul>");
        for l in part.iter() {
            legend.push_str(&format!(
                "<li>{}<span>{}</span></li>",
                sample(l.line, l.marker, &hex(l.color)),
                esc(&l.label)
            ));
        }
        legend.push_str("</ul>");
        if !key.is_empty() {
            legend.push_str("<p class=\"key\">");
            for (i, e) in key.iter().enumerate() {
                if i > 0 {
                    legend.push_str("; ");
                }
                legend.push_str(&format!(
                    "{} {}",
                    sample(e.line, e.marker, "#4a5263"),
                    esc(&e.text)
                ));
            }
            legend.push_str("</p>");
        }
        legend.push_str("</div>");
        out.push_str(&format!(
            "<figure class=\"chart\" id=\"{}\">\n{legend}\n{}\n<figcaption>{}</figcaption>\n</figure>\n",
            id(&fid),
            strip_xml_decl(&svg.unwrap_or_default()),
            esc(caption)
        ));
    }
    out
}
