//! The links section: each `bench-collectives links` run as a heat map of
//! its one-way pair bandwidths (rank x rank, slow pairs marked), with the
//! slow pairs and the likely culprit named; and each collectives run's
//! reference ("is my busbw normal?") with the measured peak as its share.

use super::escape::esc;
use super::page::{self, num, text};
use crate::load::Source;
use parbench::results::{verdict, LinkRow, SLOW_SHARE};
use std::collections::HashMap;

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

/// The most ranks a heat map draws: 65,536 cells, a page of about 20 MB.
/// A larger matrix is summed up by its verdict alone.
pub const MAX_MAP_RANKS: usize = 256;

/// The ranks a heat map has rows and columns for: those the rows name
/// (never the `world` a row claims), in order; `None` when they are more
/// than [`MAX_MAP_RANKS`] or the rows fill under a quarter of their
/// matrix (not a pair sweep's matrix, so no map to draw).
pub fn map_ranks(rows: &[LinkRow]) -> Option<Vec<usize>> {
    let mut ranks: Vec<usize> = rows.iter().flat_map(|r| [r.from, r.to]).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let cells = ranks.len() * ranks.len();
    (ranks.len() <= MAX_MAP_RANKS && cells <= 4 * rows.len() + 16).then_some(ranks)
}

/// The heat map of one run's one-way bandwidths over `ranks` (from
/// [`map_ranks`]), as inline SVG: its size set by the ranks the rows
/// hold, each cell found through one index.
pub fn heat_map(rows: &[LinkRow], ranks: &[usize]) -> String {
    let median = verdict(rows).median_gbps;
    let by_pair: HashMap<(usize, usize), &LinkRow> =
        rows.iter().rev().map(|r| ((r.from, r.to), r)).collect();
    let side = MARGIN + ranks.len() * CELL + 8;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{side}\" height=\"{side}\" viewBox=\"0 0 {side} {side}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    );
    svg.push_str("<text x=\"4\" y=\"14\">from \\ to</text>\n");
    for (i, k) in ranks.iter().enumerate() {
        let c = MARGIN + i * CELL + CELL / 2;
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
    for (row, &from) in ranks.iter().enumerate() {
        for (col, &to) in ranks.iter().enumerate() {
            let (x, y) = (MARGIN + col * CELL, MARGIN + row * CELL);
            let (fill, label, title) = match by_pair.get(&(from, to)) {
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

/// The section; none when no folder holds pair links or a reference.
pub fn section(sources: &[Source]) -> Option<String> {
    let mut body = String::new();
    let mut any = false;
    for s in sources {
        // The rows of each run, in one pass (the runs in their first row's order).
        let mut order: Vec<&str> = Vec::new();
        let mut by_run: HashMap<&str, Vec<LinkRow>> = HashMap::new();
        for r in &s.links {
            by_run
                .entry(r.run_id.as_str())
                .or_insert_with(|| {
                    order.push(r.run_id.as_str());
                    Vec::new()
                })
                .push(r.clone());
        }
        for run in order {
            if !any {
                body.push_str(&page::h3("Pair links (bench-collectives links)"));
            }
            any = true;
            let rows = &by_run[run];
            let first = &rows[0];
            body.push_str(&page::note(&format!(
                "{}: run {run}, backend {}, wire {}, {} ranks, {} B per bandwidth message, pairs one at a time. Cells: one-way GB/s, row = from, column = to; red = below {:.0}% of the median pair.",
                s.label, first.backend, first.wire, first.world, first.bytes, 100.0 * SLOW_SHARE
            )));
            let words = esc(&(verdict(rows).lines().join(". ") + "."));
            let figure = match map_ranks(rows) {
                Some(ranks) => heat_map(rows, &ranks),
                None => format!(
                    "<p>No heat map: the rows hold {} pairs, not the matrix of a pair sweep of at most {MAX_MAP_RANKS} ranks.</p>",
                    rows.len()
                ),
            };
            body.push_str(&format!(
                "<figure class=\"chart\" id=\"links-{}\">\n{figure}\n<figcaption>{words}</figcaption>\n</figure>\n",
                super::escape::id(run)
            ));
        }
    }
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
    if !refs.is_empty() {
        body.push_str(&page::h3(
            "Is my busbw normal? The reference of each collectives run",
        ));
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
    page::section_if("links", "Links and references", &body)
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
        let svg = heat_map(&rows, &map_ranks(&rows).unwrap());
        assert_eq!(svg.matches("fill=\"#d9534f\"").count(), 8, "{svg}");
        let words = verdict(&rows).lines().join(". ");
        assert!(words.contains("Likely culprit: rank 2"), "{words}");
    }

    #[test]
    fn the_map_is_sized_by_the_rows_not_by_a_claimed_world() {
        // Was: one row with world=1500 drew a 405 MB page (1500 x 1500
        // cells); world=100000 never finished.
        let one = |from, to, world| LinkRow {
            schema: 1,
            run_id: "r".into(),
            backend: "tcp".into(),
            wire: "w".into(),
            world,
            from,
            to,
            latency_us: 1.0,
            bytes: 8,
            one_way_gbps: 1.0,
            both_ways_gbps: 1.0,
        };
        let rows = vec![one(0, 1, 100_000), one(1, 0, 100_000)];
        let ranks = map_ranks(&rows).unwrap();
        assert_eq!(ranks, vec![0, 1]);
        assert!(heat_map(&rows, &ranks).len() < 4096);
        // Rows scattered over far ranks are no matrix: no map, no blow-up.
        let sparse: Vec<LinkRow> = (0..300).map(|i| one(i, 1_000_000 - i, 5)).collect();
        assert!(map_ranks(&sparse).is_none());
        let v = verdict(&sparse);
        assert_eq!(v.pairs, 300);
    }
}
