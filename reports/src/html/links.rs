//! The links section: each `bench-collectives links` run as a heat map of
//! its one-way pair bandwidths (rank x rank, slow pairs marked), with the
//! slow pairs and the likely culprit named; and each collectives run's
//! reference ("is my busbw normal?") with the measured peak as its share.

use super::escape::esc;
use super::page::{self, num, text};
use crate::load::Source;
use parbench::results::{verdict, LinkRow, SLOW_SHARE};

/// Side of one cell of the heat map, pixels.
const CELL: usize = 64;
/// Room for the rank labels left and above.
const MARGIN: usize = 56;

/// The colour of a pair at `share` of the median pair: slow pairs red,
/// the rest from pale to deep blue as they approach and pass the median.
fn colour(share: f64) -> String {
    if share < SLOW_SHARE {
        return "#d9534f".into();
    }
    let t = ((share - SLOW_SHARE) / (1.2 - SLOW_SHARE)).clamp(0.0, 1.0);
    let (r, g, b) = (220.0 - 170.0 * t, 235.0 - 135.0 * t, 250.0 - 60.0 * t);
    format!("#{:02x}{:02x}{:02x}", r as u8, g as u8, b as u8)
}

/// The heat map of one run's one-way bandwidths, as inline SVG.
pub fn heat_map(rows: &[LinkRow]) -> String {
    let world = rows.first().map_or(0, |r| r.world);
    let median = verdict(rows).median_gbps;
    let side = MARGIN + world * CELL + 8;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{side}\" height=\"{side}\" viewBox=\"0 0 {side} {side}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    );
    svg.push_str("<text x=\"4\" y=\"14\">from \\ to</text>\n");
    for k in 0..world {
        let c = MARGIN + k * CELL + CELL / 2;
        svg.push_str(&format!(
            "<text x=\"{c}\" y=\"{}\" text-anchor=\"middle\">{k}</text>\n",
            MARGIN - 8
        ));
        svg.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{k}</text>\n",
            MARGIN - 8,
            c + 4
        ));
    }
    for from in 0..world {
        for to in 0..world {
            let (x, y) = (MARGIN + to * CELL, MARGIN + from * CELL);
            let (fill, label, title) = match rows.iter().find(|r| r.from == from && r.to == to) {
                Some(r) if median > 0.0 => (
                    colour(r.one_way_gbps / median),
                    format!("{:.3}", r.one_way_gbps),
                    format!(
                        "rank {from} -> rank {to}: {:.4} GB/s one way ({:.2}x the median pair), {:.4} GB/s both ways, {:.2} us latency",
                        r.one_way_gbps,
                        r.one_way_gbps / median,
                        r.both_ways_gbps,
                        r.latency_us
                    ),
                ),
                _ => ("#eceef2".to_string(), "-".to_string(), format!("rank {from} -> rank {to}")),
            };
            svg.push_str(&format!(
                "<g><title>{}</title><rect x=\"{x}\" y=\"{y}\" width=\"{CELL}\" height=\"{CELL}\" fill=\"{fill}\" stroke=\"#fff\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text></g>\n",
                esc(&title),
                x + CELL / 2,
                y + CELL / 2 + 4,
                esc(&label)
            ));
        }
    }
    svg.push_str("</svg>");
    svg
}

/// The section.
pub fn section(sources: &[Source]) -> String {
    let mut body = String::new();
    body.push_str(&page::h3("Pair links (bench-collectives links)"));
    let mut any = false;
    for s in sources {
        let mut ids: Vec<&str> = s.links.iter().map(|r| r.run_id.as_str()).collect();
        ids.dedup();
        for run in ids {
            any = true;
            let rows: Vec<LinkRow> = s
                .links
                .iter()
                .filter(|r| r.run_id == run)
                .cloned()
                .collect();
            let first = &rows[0];
            body.push_str(&page::note(&format!(
                "{}: run {run}, backend {}, wire {}, {} ranks, {} B per bandwidth message, pairs one at a time. Cells: one-way GB/s, row = from, column = to; red = below {:.0}% of the median pair.",
                s.label, first.backend, first.wire, first.world, first.bytes, 100.0 * SLOW_SHARE
            )));
            let svg = heat_map(&rows);
            body.push_str(&format!(
                "<figure class=\"chart\" id=\"links-{}\">\n{svg}\n<figcaption>{}</figcaption>\n</figure>\n",
                super::escape::id(run),
                esc(&(verdict(&rows).lines().join(". ") + "."))
            ));
        }
    }
    if !any {
        body.push_str(&page::empty("No links.csv in these folders: run `bench-collectives links` to measure every pair of ranks."));
    }
    body.push_str(&page::h3(
        "Is my busbw normal? The reference of each collectives run",
    ));
    let mut refs = Vec::new();
    for s in sources {
        for r in &s.runs {
            if let Some(v) = r.extra.get("reference") {
                let get = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("-").to_string();
                refs.push(vec![
                    text(s.label.clone()),
                    text(r.run_id.clone()),
                    num(get("kind")),
                    text(get("line")),
                    text(get("peak")),
                ]);
            }
        }
    }
    if refs.is_empty() {
        body.push_str(&page::empty("No collectives run in these folders recorded a reference (runs before this report's version did not)."));
    } else {
        body.push_str(&page::table(
            &[
                "folder",
                "run",
                "reference",
                "what it is",
                "measured peak beside it",
            ],
            &refs,
        ));
        body.push_str(&page::note("GPU runs are held against the published figure for the detected system (parbench/data/published_busbw.csv, every row with its source), or say that none matches; CPU wires have no published figure, so the ceiling measured in the same run is the reference."));
    }
    page::section("links", "Links and references", &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_pairs_are_red_and_named() {
        let mut rows = Vec::new();
        for f in 0..5 {
            for t in (0..5).filter(|&t| t != f) {
                let g = if f == 2 || t == 2 { 0.03 } else { 0.12 };
                rows.push(LinkRow {
                    schema: 1,
                    run_id: "r".into(),
                    backend: "tcp".into(),
                    wire: "w".into(),
                    world: 5,
                    from: f,
                    to: t,
                    latency_us: 10.0,
                    bytes: 1 << 20,
                    one_way_gbps: g,
                    both_ways_gbps: g,
                });
            }
        }
        let svg = heat_map(&rows);
        assert_eq!(svg.matches("fill=\"#d9534f\"").count(), 8, "{svg}");
        let words = verdict(&rows).lines().join(". ");
        assert!(words.contains("Likely culprit: rank 2"), "{words}");
    }
}
