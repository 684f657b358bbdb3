//! The page around the sections: the head with its inline style, tables,
//! figures and the plain "no data" note. Every string passed in as text is
//! escaped here; only SVG produced by `charts` goes in unescaped.

use super::escape::{esc, id};

/// Width of a chart, pixels (the legend column included): fits a 1400 px window.
pub const CHART_W: u32 = 1120;
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
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 14px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e7eaf0; text-align: right; white-space: nowrap; }
th { background: #f0f2f6; font-weight: 600; white-space: normal; max-width: 9em; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
tbody tr:nth-child(even) { background: #fafbfc; }
td.text { text-align: left; white-space: normal; min-width: 140px; max-width: 420px; word-break: break-word; }
td.bad { color: #b00020; font-weight: 600; }
.scroll { overflow-x: auto; }
ul.summary { font-size: 15px; padding-left: 22px; max-width: 1100px; }
ul.summary li { margin: 6px 0; }
code { background: #f0f2f6; padding: 1px 4px; border-radius: 3px; }
td.lines { text-align: left; white-space: normal; min-width: 220px; max-width: 520px; font-size: 12px; }
td.lines div { margin: 1px 0; word-break: break-word; }
/* On paper nothing scrolls: wide tables wrap their cells instead of being cut at the margin. */
@media print {
  body { background: #fff; }
  nav { position: static; }
  main { max-width: none; padding: 0; }
  section { border: none; padding: 0; break-inside: auto; }
  .scroll { overflow: visible; }
  table { font-size: 9px; width: 100%; table-layout: auto; }
  th, td { white-space: normal; word-break: break-word; padding: 2px 4px; }
  td.text, td.lines { min-width: 0; max-width: none; }
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
    /// Lines of text, one under the other (key/value lists).
    Lines(Vec<String>),
}

/// A table from a header and rows of cells.
/// Lines of a [`Cell::Lines`] shown before the rest fold away.
const LINES_SHOWN: usize = 6;

pub fn table(header: &[&str], rows: &[Vec<Cell>]) -> String {
    let mut s = String::from("<div class=\"scroll\"><table>\n<thead><tr>");
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
                Cell::Lines(ls) => {
                    // A few lines in view; the rest one click away, so
                    // that a run's many figures do not make a row taller
                    // than a screen.
                    s.push_str("<td class=\"lines\">");
                    for l in ls.iter().take(LINES_SHOWN) {
                        s.push_str(&format!("<div>{}</div>", esc(l)));
                    }
                    if ls.len() > LINES_SHOWN {
                        s.push_str(&format!(
                            "<details><summary>{} more</summary>",
                            ls.len() - LINES_SHOWN
                        ));
                        for l in &ls[LINES_SHOWN..] {
                            s.push_str(&format!("<div>{}</div>", esc(l)));
                        }
                        s.push_str("</details>");
                    }
                    s.push_str("</td>");
                }
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
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
