//! `report html`: one self-contained HTML file (inline SVG, inline style,
//! no scripts, nothing fetched) from one or more results folders.

mod capacity;
mod collectives;
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
use std::io::Write;
use std::path::{Path, PathBuf};

/// The sections, in page order: (id, navigation name).
pub const SECTIONS: [(&str, &str); 8] = [
    ("summary", "Summary"),
    ("collectives", "Collectives"),
    ("links", "Links and references"),
    ("layers", "Layers"),
    ("pipeline", "Pipeline"),
    ("capacity", "Capacity planning"),
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
            "{}: {} ({} collective rows, {} layer rows, {} pipeline rows, {} runs)",
            s.label,
            s.dir.display(),
            s.collectives.len(),
            s.layers.len(),
            s.pipeline.len(),
            s.runs.len()
        ));
    }
    let mut html = page::head(title, &subtitle, &SECTIONS);
    html.push_str(&summary::section(
        sources,
        &capacity::worked_example(sources),
    ));
    html.push_str(&collectives::section(sources));
    html.push_str(&links::section(sources));
    html.push_str(&layers::section(sources));
    html.push_str(&pipeline::section(sources));
    html.push_str(&capacity::section(sources));
    html.push_str(&plan::section(sources));
    html.push_str(&runs::section(sources));
    html.push_str(page::tail());
    html
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename,
/// so a reader never sees half a report.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report.html".into());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("{}: cannot write the report", path.display()))
}

/// Runs `report html`.
pub fn run(dirs: &[PathBuf], output: &Path, title: &str) -> Result<()> {
    let sources = load_sources(dirs, true)?;
    plan::check(&sources)?;
    let html = render(&sources, title);
    write_atomic(output, html.as_bytes())?;
    eprintln!(
        "report: wrote {} ({} KiB)",
        output.display(),
        html.len() / 1024
    );
    Ok(())
}
