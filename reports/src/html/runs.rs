//! The run metadata table: what ran, where, with what, and when.

use super::page::{self, num, text, Cell};
use crate::load::Source;

/// The section's HTML.
pub fn section(sources: &[Source]) -> String {
    let rows: Vec<Vec<Cell>> = sources
        .iter()
        .flat_map(|s| {
            s.runs.iter().map(move |r| {
                let mut versions: Vec<String> = vec![format!("parbench {}", r.parbench_version)];
                versions.extend(r.versions.iter().map(|(k, v)| format!("{k} {v}")));
                let extra = if r.extra.is_empty() {
                    String::new()
                } else {
                    serde_json::Value::Object(r.extra.clone()).to_string()
                };
                vec![
                    text(s.label.clone()),
                    text(r.run_id.clone()),
                    text(r.suite.clone()),
                    text(r.host.clone()),
                    text(format!("{} ({} cores), {}", r.cpu, r.cores, r.os)),
                    text(if r.gpus.is_empty() {
                        "none".into()
                    } else {
                        r.gpus.join(", ")
                    }),
                    text(r.backend.clone()),
                    num(r.world.to_string()),
                    text(versions.join(", ")),
                    text(r.git_revision.clone()),
                    text(format!(
                        "{} .. {}",
                        r.start,
                        if r.end.is_empty() {
                            "(unfinished)"
                        } else {
                            &r.end
                        }
                    )),
                    text(r.command_line.join(" ")),
                    text(extra),
                ]
            })
        })
        .collect();
    let body = if rows.is_empty() {
        page::empty("No run metadata: the results folders have no run.json.")
    } else {
        page::table(
            &[
                "folder",
                "run",
                "suite",
                "host",
                "CPU",
                "GPUs",
                "backend",
                "ranks",
                "versions",
                "git",
                "start .. end",
                "command line",
                "extra",
            ],
            &rows,
        )
    };
    page::section("runs", "Runs", &body)
}
