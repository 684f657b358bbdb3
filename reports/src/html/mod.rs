//! `report html`: one self-contained HTML file (inline SVG, inline style,
//! no scripts, nothing fetched) from one or more results folders.

mod capacity;
mod collectives;
mod cp_moe;
pub mod escape;
mod layers;
mod links;
pub mod page;
mod pipeline;
mod plan;
mod runs;
mod summary;

use crate::load::{load_sources, Source};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The sections, in page order: (id, navigation name). A section with
/// nothing to show is left out, and so is its menu entry.
pub const SECTIONS: [(&str, &str); 8] = [
    ("summary", "Summary"),
    ("collectives", "Collectives"),
    ("links", "Links and references"),
    ("layers", "Layers"),
    ("cp-moe", "CP and MoE"),
    ("pipeline", "Pipeline"),
    ("plan", "Planning"),
    ("runs", "Runs"),
];

/// The whole page for already loaded sources.
pub fn render(sources: &[Source], title: &str) -> String {
    let mut subtitle = vec![format!(
        "Generated {} by report {} from {} results folder{}.",
        parbench::results::iso8601_utc(std::time::SystemTime::now()),
        env!("CARGO_PKG_VERSION"),
        sources.len(),
        if sources.len() == 1 { "" } else { "s" }
    )];
    for s in sources {
        subtitle.push(format!(
            "{}: {} ({} collective rows, {} layer rows, {} CP rows, {} CP ring rows, {} pipeline rows, {} runs)",
            s.label,
            s.dir.display(),
            s.collectives.len(),
            s.layers.len(),
            s.cp.len(),
            s.cp_ring.len(),
            s.pipeline.len(),
            s.runs.len()
        ));
    }
    let bodies = [
        summary::section(sources),
        collectives::section(sources),
        links::section(sources),
        layers::section(sources),
        cp_moe::section(sources),
        pipeline::section(sources),
        plan::section(sources),
        runs::section(sources),
    ];
    let shown: Vec<(&str, &str)> = SECTIONS
        .iter()
        .zip(&bodies)
        .filter(|(_, b)| b.is_some())
        .map(|(s, _)| *s)
        .collect();
    let mut html = page::head(title, &subtitle, &shown);
    for b in bodies.into_iter().flatten() {
        html.push_str(&b);
    }
    if shown.is_empty() {
        html.push_str(&page::empty(
            "Nothing to show: these folders hold no collectives, layers, pipeline, plan or run records.",
        ));
    }
    html.push_str(page::tail());
    html
}

/// Runs `report html`.
pub fn run(dirs: &[PathBuf], output: &Path, title: &str) -> Result<()> {
    // Before reading: an output that may not be replaced is refused first.
    parbench::results::check_output(output, Some(page::DOCTYPE.as_bytes()))?;
    let sources = load_sources(dirs, true)?;
    plan::check(&sources)?;
    let html = render(&sources, title);
    parbench::results::write_atomic(output, html.as_bytes())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("cannot write the report")?;
    eprintln!(
        "report: wrote {} ({} KiB)",
        output.display(),
        html.len() / 1024
    );
    Ok(())
}
