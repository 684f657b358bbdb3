//! Timelines of one step: a Chrome trace (one track per rank, one slice per
//! action, plus a slice for each wait in `recv`; open it in Perfetto or
//! chrome://tracing) and a one-line-per-rank terminal drawing.

use super::RankStep;
use crate::schedule::ActionKind;
use serde_json::{json, Value};
use std::path::Path;

/// Waits shorter than this (microseconds) are left out of the trace: they
/// are the executor's own bookkeeping, not the schedule's shape.
const MIN_WAIT_US: f64 = 1.0;

/// The Chrome trace JSON of one step (`step[rank]`), named `title`.
pub fn chrome_trace(title: &str, step: &[RankStep]) -> Value {
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "pid": 0, "tid": 0,
        "args": { "name": title }
    })];
    for (r, rs) in step.iter().enumerate() {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": r,
            "args": { "name": format!("rank {r}") }
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": 0, "tid": r,
            "args": { "sort_index": r }
        }));
        for a in &rs.actions {
            let wait = a.start_us - a.wait_us;
            if wait >= MIN_WAIT_US {
                events.push(json!({
                    "name": format!("recv {}", a.action), "cat": "recv", "ph": "X",
                    "pid": 0, "tid": r, "ts": a.wait_us, "dur": wait,
                    "cname": "grey"
                }));
            }
            let kind = match a.action.kind {
                ActionKind::F => "forward",
                ActionKind::B => "backward",
                ActionKind::I => "input-grad",
                ActionKind::W => "weight-grad",
            };
            events.push(json!({
                "name": a.action.to_string(), "cat": kind, "ph": "X",
                "pid": 0, "tid": r, "ts": a.start_us, "dur": a.end_us - a.start_us,
                "args": {
                    "stage": a.action.stage, "microbatch": a.action.mb,
                    "work_us": a.work_end_us - a.start_us,
                    "send_us": a.end_us - a.work_end_us,
                    "recv_us": wait,
                }
            }));
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

/// Writes [`chrome_trace`] to `path` atomically.
pub fn write_chrome_trace(
    path: &Path,
    title: &str,
    step: &[RankStep],
) -> Result<(), crate::results::ResultsError> {
    let bytes = serde_json::to_vec(&chrome_trace(title, step)).unwrap_or_default();
    crate::results::write_atomic(path, &bytes)
}

/// Two lines per rank, `width` characters for the step: the kind letter
/// (F, B, I, W) of the action running at that time, `.` for idle, and
/// under it the action's microbatch (its last digit):
///
/// ```text
/// rank0: FFFF....BBBB
///        0123....0123
/// ```
pub fn terminal_timeline(step: &[RankStep], width: usize) -> String {
    let end = step
        .iter()
        .filter_map(|r| r.actions.last().map(|a| a.end_us))
        .fold(0.0, f64::max);
    let width = width.max(1);
    let mut out = String::new();
    for (r, rs) in step.iter().enumerate() {
        let mut kinds = vec!['.'; width];
        let mut mbs = vec!['.'; width];
        if end > 0.0 {
            for a in &rs.actions {
                let from = ((a.start_us / end) * width as f64).floor() as usize;
                let to = ((a.end_us / end) * width as f64).ceil() as usize;
                let digit = char::from_digit((a.action.mb % 10) as u32, 10).unwrap_or('?');
                for i in from.min(width)..to.min(width) {
                    kinds[i] = a.action.kind.letter();
                    mbs[i] = digit;
                }
            }
        }
        let label = format!("rank{r}: ");
        out.push_str(&label);
        out.extend(kinds);
        out.push('\n');
        out.push_str(&" ".repeat(label.len()));
        out.extend(mbs);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::ActionTiming;
    use super::*;
    use crate::schedule::Action;

    fn step() -> Vec<RankStep> {
        let t = |st, k, mb, s: f64, e: f64| ActionTiming {
            action: Action::new(st, k, mb),
            wait_us: s - 2.0,
            start_us: s,
            work_end_us: e,
            end_us: e,
        };
        vec![
            RankStep {
                actions: vec![
                    t(0, ActionKind::F, 0, 0.0, 10.0),
                    t(0, ActionKind::B, 0, 30.0, 40.0),
                ],
                ..Default::default()
            },
            RankStep {
                actions: vec![
                    t(1, ActionKind::F, 0, 10.0, 20.0),
                    t(1, ActionKind::B, 0, 20.0, 30.0),
                ],
                ..Default::default()
            },
        ]
    }

    #[test]
    fn the_trace_has_a_track_per_rank_and_a_slice_per_action() {
        let v = chrome_trace("t", &step());
        let ev = v["traceEvents"].as_array().unwrap();
        let slices: Vec<&Value> = ev
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] != "recv")
            .collect();
        assert_eq!(slices.len(), 4);
        assert!(slices
            .iter()
            .any(|e| e["name"] == "1B0" && e["tid"] == 1 && e["ts"] == 20.0));
        let names: Vec<&Value> = ev.iter().filter(|e| e["name"] == "thread_name").collect();
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn the_terminal_timeline_draws_kinds_and_idle() {
        let s = terminal_timeline(&step(), 4);
        assert_eq!(s, "rank0: F..B\n       0..0\nrank1: .FB.\n       .00.\n");
    }
}
