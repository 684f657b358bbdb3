//! Pipeline timelines as bench-pipeline writes them: Chrome trace JSON (the
//! format Perfetto opens), one track per rank, one complete ("X") slice per
//! action, named in PyTorch pipelining's text form (`2F0`, `1B3`, `1I3`, `1W3`),
//! and before an action that receives its input, a `wait 2F0` slice
//! (waiting for the peer to send) and a `transfer 2F0` slice (sent, not
//! yet here). Traces written before that split have one `recv 2F0` slice.
//!
//! A trace may hold several processes (one per schedule run); each becomes
//! its own chart. Errors name the file and the line where the JSON fails.

use anyhow::{bail, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// What an action computes, for its colour on the chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ActionKind {
    /// Forward.
    F,
    /// Full backward.
    B,
    /// Input-gradient backward (zero-bubble schedules).
    I,
    /// Weight-gradient backward (zero-bubble schedules).
    W,
    /// Waiting for the peer to send the input (`wait 1F0`).
    Wait,
    /// The input on its way: sent, not yet here (`transfer 1F0`).
    Transfer,
    /// Anything else on the track (older traces' `recv 1F0`: waiting and
    /// transfer together).
    Other,
}

impl ActionKind {
    /// The kind of an action named `2F0`, `1W3`, `F`, `forward`...: the
    /// letter after the stage number.
    pub fn of(name: &str) -> ActionKind {
        let name = name.trim();
        if name.starts_with("wait ") {
            return ActionKind::Wait;
        }
        if name.starts_with("transfer ") {
            return ActionKind::Transfer;
        }
        let rest = name.trim_start_matches(|c: char| c.is_ascii_digit());
        match rest.chars().next() {
            Some('F') => ActionKind::F,
            Some('B') => ActionKind::B,
            Some('I') => ActionKind::I,
            Some('W') => ActionKind::W,
            _ => match rest.to_ascii_lowercase().as_str() {
                "forward" => ActionKind::F,
                "backward" => ActionKind::B,
                _ => ActionKind::Other,
            },
        }
    }

    /// The legend's word for the kind.
    pub fn label(self) -> &'static str {
        match self {
            ActionKind::F => "F forward",
            ActionKind::B => "B backward",
            ActionKind::I => "I input grad",
            ActionKind::W => "W weight grad",
            ActionKind::Wait => "waiting for the peer",
            ActionKind::Transfer => "transfer",
            ActionKind::Other => "receive (older traces) or other",
        }
    }
}

/// One action on one rank's track.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub name: String,
    pub kind: ActionKind,
    pub start_us: f64,
    pub dur_us: f64,
}

/// One rank's track.
#[derive(Clone, Debug, PartialEq)]
pub struct Lane {
    pub name: String,
    pub slices: Vec<Slice>,
}

/// One process of a trace: the tracks of one pipeline run.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub title: String,
    pub lanes: Vec<Lane>,
}

/// Every run in one timeline file.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    pub runs: Vec<Run>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TraceFile {
    Object {
        #[serde(rename = "traceEvents")]
        trace_events: Vec<Event>,
    },
    Array(Vec<Event>),
}

/// A trace event; pid and tid may be numbers or strings in Chrome's format.
#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    name: String,
    ts: Option<f64>,
    dur: Option<f64>,
    #[serde(default)]
    pid: serde_json::Value,
    #[serde(default)]
    tid: serde_json::Value,
    #[serde(default)]
    args: serde_json::Map<String, serde_json::Value>,
}

/// A process or thread id as a sortable key: numbers by value, then strings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Id {
    Num(i64),
    Text(String),
}

fn id_of(v: &serde_json::Value) -> Id {
    match v {
        serde_json::Value::Number(n) => Id::Num(n.as_i64().unwrap_or(0)),
        serde_json::Value::String(s) => s.parse().map(Id::Num).unwrap_or(Id::Text(s.clone())),
        _ => Id::Num(0),
    }
}

fn id_text(id: &Id) -> String {
    match id {
        Id::Num(n) => n.to_string(),
        Id::Text(s) => s.clone(),
    }
}

/// Reads a Chrome trace file. A file with no complete ("X") events, or an
/// event without a time, is an error naming the file (and the event).
pub fn read_timeline(path: &Path) -> Result<Timeline> {
    let text = crate::text_file::read_text(path)?;
    parse_timeline(&text, &path.display().to_string())
}

/// Parses trace text; `name` is what errors call the file.
pub fn parse_timeline(text: &str, name: &str) -> Result<Timeline> {
    // A typed parse first, for the line and column of a syntax error.
    let events = match serde_json::from_str::<TraceFile>(text) {
        Ok(TraceFile::Object { trace_events }) => trace_events,
        Ok(TraceFile::Array(events)) => events,
        Err(e) => {
            // The untagged enum hides the inner error; parse as a value to
            // find where the text stops being JSON.
            if let Err(syntax) = serde_json::from_str::<serde_json::Value>(text) {
                bail!("{name}:{}: {syntax}", syntax.line());
            }
            bail!(
                "{name}:{}: not a Chrome trace (expected {{\"traceEvents\": [...]}} or a list of events with ph, name, ts, dur, pid, tid): {e}",
                e.line().max(1)
            );
        }
    };
    let mut process_names: BTreeMap<Id, String> = BTreeMap::new();
    let mut thread_names: BTreeMap<(Id, Id), String> = BTreeMap::new();
    let mut tracks: BTreeMap<Id, BTreeMap<Id, Vec<Slice>>> = BTreeMap::new();
    for (i, ev) in events.iter().enumerate() {
        let (pid, tid) = (id_of(&ev.pid), id_of(&ev.tid));
        let arg_name = || {
            ev.args
                .get("name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        match ev.ph.as_str() {
            "M" if ev.name == "process_name" => {
                if let Some(n) = arg_name() {
                    process_names.insert(pid, n);
                }
            }
            "M" if ev.name == "thread_name" => {
                if let Some(n) = arg_name() {
                    thread_names.insert((pid, tid), n);
                }
            }
            "X" => {
                let (Some(ts), Some(dur)) = (ev.ts, ev.dur) else {
                    bail!(
                        "{name}: traceEvents[{i}] ({:?}) is a complete event without ts or dur",
                        ev.name
                    );
                };
                if !ts.is_finite() || !dur.is_finite() || dur < 0.0 {
                    bail!(
                        "{name}: traceEvents[{i}] ({:?}) has ts {ts}, dur {dur}",
                        ev.name
                    );
                }
                tracks
                    .entry(pid)
                    .or_default()
                    .entry(tid)
                    .or_default()
                    .push(Slice {
                        kind: ActionKind::of(&ev.name),
                        name: ev.name.clone(),
                        start_us: ts,
                        dur_us: dur,
                    });
            }
            _ => {}
        }
    }
    if tracks.is_empty() {
        bail!("{name}: no complete (\"ph\": \"X\") events: nothing to draw");
    }
    let runs = tracks
        .into_iter()
        .map(|(pid, threads)| {
            let title = process_names
                .get(&pid)
                .cloned()
                .unwrap_or_else(|| format!("process {}", id_text(&pid)));
            let lanes = threads
                .into_iter()
                .map(|(tid, mut slices)| {
                    slices.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
                    Lane {
                        name: thread_names
                            .get(&(pid.clone(), tid.clone()))
                            .cloned()
                            .unwrap_or_else(|| format!("rank {}", id_text(&tid))),
                        slices,
                    }
                })
                .collect();
            Run { title, lanes }
        })
        .collect();
    Ok(Timeline { runs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_pytorch_action_names() {
        assert_eq!(ActionKind::of("2F0"), ActionKind::F);
        assert_eq!(ActionKind::of("1B3"), ActionKind::B);
        assert_eq!(ActionKind::of("11I3"), ActionKind::I);
        assert_eq!(ActionKind::of("0W12"), ActionKind::W);
        assert_eq!(ActionKind::of("send"), ActionKind::Other);
        assert_eq!(ActionKind::of("recv 0F3"), ActionKind::Other);
        assert_eq!(ActionKind::of("wait 1F3"), ActionKind::Wait);
        assert_eq!(ActionKind::of("transfer 0B12"), ActionKind::Transfer);
    }

    #[test]
    fn reads_lanes_per_rank() {
        let text = r#"{"traceEvents":[
          {"ph":"M","name":"process_name","pid":1,"args":{"name":"1f1b S2 M2"}},
          {"ph":"M","name":"thread_name","pid":1,"tid":0,"args":{"name":"rank 0"}},
          {"ph":"X","name":"0F0","pid":1,"tid":0,"ts":0,"dur":10},
          {"ph":"X","name":"1F0","pid":1,"tid":1,"ts":10,"dur":10},
          {"ph":"X","name":"1B0","pid":1,"tid":1,"ts":20,"dur":20}
        ]}"#;
        let t = parse_timeline(text, "t.json").unwrap();
        assert_eq!(t.runs.len(), 1);
        assert_eq!(t.runs[0].title, "1f1b S2 M2");
        assert_eq!(t.runs[0].lanes.len(), 2);
        assert_eq!(t.runs[0].lanes[1].slices[1].kind, ActionKind::B);
    }

    #[test]
    fn errors_name_file_and_line() {
        let err = parse_timeline("{\"traceEvents\": [\n{\"ph\":\"X\",\n", "t.json")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.json:3:"), "{err}");
        let err = parse_timeline("[{\"ph\":\"X\",\"name\":\"0F0\",\"ts\":1}]", "t.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.json") && err.contains("without ts or dur"),
            "{err}"
        );
        let err = parse_timeline("{\"traceEvents\": []}", "t.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no complete"), "{err}");
    }
}
