//! The run metadata table: what ran, where, with what, and when, and how
//! much of the machine other processes took meanwhile.

use super::page::{self, num, text, Cell};
use crate::load::Source;
use crate::units;
use serde_json::Value;

/// Longest value text in the `extra` column; longer ones end in an ellipsis.
const VALUE_CHARS: usize = 160;
/// Most lines one `extra` key gets (a list of fits, a ladder's rungs).
const LINES_PER_KEY: usize = 8;

fn clip(s: &str) -> String {
    if s.chars().count() > VALUE_CHARS {
        s.chars().take(VALUE_CHARS - 1).collect::<String>() + "…"
    } else {
        s.to_string()
    }
}

fn scalar(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => "-".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => units::sig3(f),
            _ => n.to_string(),
        },
        Value::String(s) => clip(s),
        _ => return None,
    })
}

/// A ladder (`{method, rungs: [{working_set, gbps, ..}]}`) in one line.
fn ladder_line(v: &Value) -> Option<String> {
    let rungs = v.get("rungs")?.as_array()?;
    let ws: Vec<f64> = rungs
        .iter()
        .filter_map(|r| r.get("working_set")?.as_f64())
        .collect();
    let g: Vec<f64> = rungs
        .iter()
        .filter_map(|r| r.get("gbps")?.as_f64())
        .collect();
    let (lo, hi) = g
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    Some(format!(
        "{} rungs, {} .. {} per rank, {} .. {} GB/s ({})",
        rungs.len(),
        ws.first().map_or("-".into(), |&b| units::bytes(b)),
        ws.last().map_or("-".into(), |&b| units::bytes(b)),
        units::sig3(lo),
        units::sig3(hi),
        clip(v.get("method").and_then(Value::as_str).unwrap_or("")),
    ))
}

/// The scalars of an object as `a=1, b=2`, its ladders and objects summarised.
fn object_line(m: &serde_json::Map<String, Value>) -> String {
    m.iter()
        .map(|(k, v)| match (scalar(v), ladder_line(v)) {
            (Some(s), _) => format!("{k}={s}"),
            (None, Some(l)) => format!("{k}=[{l}]"),
            (None, None) => format!("{k}=(…)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `extra` as key/value lines: scalars as they are, ladders in one line
/// each, objects one level deep, lists one line per entry (at most
/// [`LINES_PER_KEY`]).
pub fn extra_lines(extra: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in extra {
        if let Some(s) = scalar(v) {
            out.push(format!("{k}: {s}"));
        } else if let Some(l) = ladder_line(v) {
            out.push(format!("{k}: {l}"));
        } else if let Value::Object(m) = v {
            for (lines, (sk, sv)) in m.iter().enumerate() {
                if lines == LINES_PER_KEY {
                    out.push(format!("{k}: … {} more", m.len() - lines));
                    break;
                }
                let val = match (scalar(sv), ladder_line(sv), sv) {
                    (Some(s), _, _) => s,
                    (None, Some(l), _) => l,
                    (None, None, Value::Object(o)) => object_line(o),
                    (None, None, Value::Array(a)) => format!("{} entries", a.len()),
                    _ => "-".into(),
                };
                out.push(format!("{k}.{sk}: {val}"));
            }
        } else if let Value::Array(a) = v {
            if a.is_empty() {
                out.push(format!("{k}: none"));
            }
            for (i, e) in a.iter().enumerate() {
                if i == LINES_PER_KEY {
                    out.push(format!("{k}: … {} more", a.len() - i));
                    break;
                }
                let val = match e {
                    Value::Object(o) => object_line(o),
                    other => scalar(other).unwrap_or_else(|| "(…)".into()),
                };
                out.push(format!("{k}[{i}]: {}", clip(&val)));
            }
        }
    }
    out
}

/// A run's details behind its one line: where, with what, how it was
/// called, and `extra` as key/value lines.
fn details(r: &parbench::results::RunMeta) -> Vec<String> {
    let mut versions: Vec<String> = vec![format!("parbench {}", r.parbench_version)];
    versions.extend(r.versions.iter().map(|(k, v)| format!("{k} {v}")));
    let mut extra = r.extra.clone();
    extra.remove(parbench::results::RunMeta::NOISE_KEY);
    let mut out = vec![
        format!("command line: {}", r.command_line.join(" ")),
        format!("CPU: {} ({} cores), {}", r.cpu, r.cores, r.os),
        format!(
            "GPUs: {}",
            if r.gpus.is_empty() {
                "none".into()
            } else {
                r.gpus.join(", ")
            }
        ),
        format!("versions: {}", versions.join(", ")),
        format!("git: {}", r.git_revision),
        format!(
            "end: {}",
            if r.end.is_empty() {
                "(unfinished)"
            } else {
                &r.end
            }
        ),
    ];
    out.extend(extra_lines(&extra));
    out
}

/// The section's HTML: one line a run, its details folded; none without
/// run metadata.
pub fn section(sources: &[Source]) -> Option<String> {
    let rows: Vec<Vec<Cell>> = sources
        .iter()
        .flat_map(|s| {
            s.runs.iter().map(move |r| {
                let noise = match r.noise() {
                    Some(n) if n.noisy() => {
                        Cell::Bad(format!("NOISY: {}", units::percent(n.fraction)))
                    }
                    Some(n) => num(units::percent(n.fraction)),
                    None => num("-"),
                };
                let lines = details(r);
                vec![
                    text(s.label.clone()),
                    // The run id starts with its suite.
                    text(r.run_id.clone()),
                    text(format!("{} on {}", r.backend, r.host)),
                    num(r.world.to_string()),
                    text(r.start.clone()),
                    noise,
                    Cell::Folded(format!("{} lines", lines.len()), lines),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let mut b = page::note("noise: CPU time other processes took while the run measured, as a share of the machine; above 10% the run is marked NOISY and report compare does not judge it. Details: the command line, CPU, GPUs, versions, git revision, end time and the run's extra figures.");
    b.push_str(&page::table(
        &[
            "folder",
            "run",
            "backend on host",
            "ranks",
            "start",
            "noise",
            "details",
        ],
        &rows,
    ));
    Some(page::section("runs", "Runs", &b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_becomes_short_key_value_lines() {
        let v: Value = serde_json::json!({
            "wire": "shm",
            "wrong": 0,
            "ceiling": {"method": "copy", "in_cache_gbps": 183.9,
                        "ladder": {"method": "copy", "rungs": [
                            {"working_set": 4096, "bytes": 2048, "gbps": 150.0, "median_gbps": 140.0},
                            {"working_set": 8192, "bytes": 4096, "gbps": 3.5, "median_gbps": 3.0}]}},
            "fits": [{"collective": "all_reduce", "alpha_us": 0.9}, {"collective": "all_gather"}],
            "long": "x".repeat(500),
        });
        let lines = extra_lines(v.as_object().unwrap());
        assert!(lines.contains(&"wire: shm".to_string()), "{lines:?}");
        assert!(lines.contains(&"wrong: 0".to_string()), "{lines:?}");
        assert!(
            lines.iter().any(|l| l
                .starts_with("ceiling.ladder: 2 rungs, 4 KiB .. 8 KiB per rank, 3.50 .. 150 GB/s")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l == "fits[0]: alpha_us=0.900, collective=all_reduce"),
            "{lines:?}"
        );
        assert!(lines.iter().all(|l| l.chars().count() < 260), "{lines:?}");
        assert!(
            !lines.iter().any(|l| l.contains('{')),
            "no raw JSON: {lines:?}"
        );
    }
}
