//! Timelines of one step, on the run's common time base: a Chrome trace
//! (one track per rank; per action a slice for its work and send, before
//! it a slice for waiting for the peer and one for the transfer, and a flow
//! arrow from each send to its receive; open it in Perfetto or
//! chrome://tracing) and a terminal drawing.

use super::{RankStep, RunRecord};
use crate::schedule::{ActionKind, Message, Schedule};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;

/// Waits and transfers shorter than this (microseconds) get no slice of
/// their own: they are the executor's bookkeeping, not the schedule's shape.
const MIN_SLICE_US: f64 = 1.0;

/// The Chrome trace JSON of step `step` of `rec`, a run of `schedule`,
/// named `title`. `otherData` records the time base: each rank's clock
/// offset to rank 0, before and after the run, and its uncertainty.
pub fn chrome_trace(title: &str, schedule: &Schedule, rec: &RunRecord, step: usize) -> Value {
    let ranks: &[RankStep] = rec.steps.get(step).map(Vec::as_slice).unwrap_or(&[]);
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "pid": 0, "tid": 0,
        "args": { "name": title }
    })];
    // One flow id per message of the step.
    let mut flows = Flows::default();
    for (r, rs) in ranks.iter().enumerate() {
        let unc = rec.uncertainty_us(r);
        let name = format!("rank {r} (clock +/- {unc:.1} us)");
        thread_events(&mut events, 0, r, &name);
        action_events(&mut events, &mut flows, (0, r, 0), schedule, rs);
    }
    let base = rec
        .clocks
        .first()
        .map(|c| c.base.name())
        .unwrap_or("unknown");
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "time_base": base,
            "time_origin": "the step's first work start, on rank 0's clock",
            "clock": clocks_json(rec),
        }
    })
}

/// Flow ids of a trace: one per (pipeline, message).
#[derive(Default)]
struct Flows(HashMap<(usize, Message), usize>);

impl Flows {
    fn id(&mut self, pipeline: usize, m: Message) -> usize {
        let next = self.0.len();
        *self.0.entry((pipeline, m)).or_insert(next)
    }
}

/// A track's name and place.
fn thread_events(events: &mut Vec<Value>, pid: usize, tid: usize, name: &str) {
    events.push(json!({
        "name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
        "args": { "name": name }
    }));
    events.push(json!({
        "name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
        "args": { "sort_index": tid }
    }));
}

/// One rank's actions on track (`pid`, `tid`): per action its slice, the
/// waiting and transfer before it, and the flow arrows of its messages
/// (ids per `pipeline`, so that two pipelines' messages never join).
fn action_events(
    events: &mut Vec<Value>,
    flows: &mut Flows,
    (pid, tid, pipeline): (usize, usize, usize),
    schedule: &Schedule,
    rs: &RankStep,
) {
    for a in &rs.actions {
        if let Some(sent) = a.input_sent_us {
            let wait = a.waiting_us();
            if wait >= MIN_SLICE_US {
                events.push(json!({
                    "name": format!("wait {}", a.action), "cat": "wait", "ph": "X",
                    "pid": pid, "tid": tid, "ts": a.asked_us, "dur": wait,
                    "cname": "grey"
                }));
            }
            let transfer = a.transfer_us();
            if transfer >= MIN_SLICE_US {
                events.push(json!({
                    "name": format!("transfer {}", a.action), "cat": "transfer", "ph": "X",
                    "pid": pid, "tid": tid, "ts": sent.max(a.asked_us), "dur": transfer,
                    "cname": "yellow"
                }));
            }
            if let Some((m, _)) = schedule.input_of(a.action) {
                events.push(json!({
                    "name": "message", "cat": "message", "ph": "f", "bp": "e",
                    "id": flows.id(pipeline, m), "pid": pid, "tid": tid, "ts": a.start_us
                }));
            }
        }
        if let (Some(sent), Some((m, _))) = (a.sent_us, schedule.output_of(a.action)) {
            events.push(json!({
                "name": "message", "cat": "message", "ph": "s",
                "id": flows.id(pipeline, m), "pid": pid, "tid": tid, "ts": sent
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
            "pid": pid, "tid": tid, "ts": a.start_us, "dur": a.end_us - a.start_us,
            "args": {
                "stage": a.action.stage, "microbatch": a.action.mb,
                "work_us": a.work_end_us - a.start_us,
                "send_us": a.end_us - a.work_end_us,
                "recv_us": a.recv_us(),
                "wait_us": a.waiting_us(),
                "transfer_us": a.transfer_us(),
            }
        }));
    }
}

/// The Chrome trace of step `step` of a composed run: one process per
/// pipeline stage rank, one track per world rank in it, named with its
/// mesh coordinate (`rank 5 (d 0, t 1, p 1)`); each track holds its
/// actions (as [`chrome_trace`]), and inside them the tensor-parallel
/// collectives (`tp comm`) and after them the data-parallel buckets
/// (`dp bucket`; with overlap on a track of their own, the rank's
/// reduction thread), each placed from its action's work start. Every track
/// is on world rank 0's clock, from the world's first work start in the
/// step (`otherData`), so a group's collective lines up across pipelines.
pub fn composed_trace(
    title: &str,
    schedule: &Schedule,
    rec: &super::ComposedRecord,
    step: usize,
) -> Value {
    use super::SpanGroup;
    let mut events = Vec::new();
    for p in 0..rec.mesh.pp {
        events.push(json!({
            "name": "process_name", "ph": "M", "pid": p, "tid": 0,
            "args": { "name": format!("{title}: pipeline rank {p}") }
        }));
        events.push(json!({
            "name": "process_sort_index", "ph": "M", "pid": p, "tid": 0,
            "args": { "sort_index": p }
        }));
    }
    let mut flows = Flows::default();
    for r in &rec.ranks {
        let c = r.coords;
        let Some((pi, pipe)) = rec.pipelines.iter().enumerate().find(|(_, p)| {
            rec.ranks
                .get(p.head)
                .is_some_and(|h| h.coords.dp == c.dp && h.coords.tp == c.tp)
        }) else {
            continue;
        };
        let Some(rs) = pipe.steps.get(step).and_then(|s| s.get(c.pp)) else {
            continue;
        };
        let unc = pipe.uncertainty_us.get(c.pp).copied().unwrap_or(0.0);
        let name = format!(
            "rank {} (d {}, t {}, p {}; clock +/- {unc:.1} us)",
            r.rank, c.dp, c.tp, c.pp
        );
        thread_events(&mut events, c.pp, r.rank, &name);
        action_events(&mut events, &mut flows, (c.pp, r.rank, pi), schedule, rs);
        let spans = r.spans.get(step).map(Vec::as_slice).unwrap_or(&[]);
        // The overlapped reduction's thread: a track of its own, after the ranks'.
        let reduction_tid = rec.mesh.world() + r.rank;
        if spans.iter().any(|s| s.group == SpanGroup::DpThread) {
            let name = format!("rank {} dp reduction thread", r.rank);
            thread_events(&mut events, c.pp, reduction_tid, &name);
        }
        // Sharded data parallel's gathers and scatters: a track of their own.
        let shard_tid = 2 * rec.mesh.world() + r.rank;
        if spans
            .iter()
            .any(|s| matches!(s.group, SpanGroup::ShardGather | SpanGroup::ShardScatter))
        {
            let name = format!("rank {} sharded data parallel", r.rank);
            thread_events(&mut events, c.pp, shard_tid, &name);
        }
        for s in spans {
            let Some(a) = rs.actions.get(s.action) else {
                continue;
            };
            let (name, colour, tid) = match s.group {
                SpanGroup::Tp => ("tp comm", "olive", r.rank),
                SpanGroup::Dp => ("dp bucket", "rail_response", r.rank),
                SpanGroup::DpThread => ("dp bucket", "rail_response", reduction_tid),
                SpanGroup::ShardGather => ("shard all-gather", "thread_state_iowait", shard_tid),
                SpanGroup::ShardScatter => ("shard reduce-scatter", "rail_load", shard_tid),
            };
            events.push(json!({
                "name": name, "cat": name, "ph": "X", "pid": c.pp, "tid": tid,
                "ts": a.start_us + s.offset_us, "dur": s.dur_us, "cname": colour,
                "args": { "action": a.action.to_string() }
            }));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "time_base": rec.record.clocks.first().map(|c| c.base.name()).unwrap_or("unknown"),
            "time_origin": "the step's first work start on any rank of the world, on world rank 0's clock",
            "mesh": rec.mesh.to_string(),
            "clock": clocks_json(&rec.record),
            "world_clock": rec.world_clocks.iter().map(|c| clock_json(c, c.uncertainty_us())).collect::<Vec<_>>(),
        }
    })
}

/// Writes [`composed_trace`] to `path` atomically.
pub fn write_composed_trace(
    path: &Path,
    title: &str,
    schedule: &Schedule,
    rec: &super::ComposedRecord,
    step: usize,
) -> Result<(), crate::results::ResultsError> {
    let bytes = serde_json::to_vec(&composed_trace(title, schedule, rec, step)).unwrap_or_default();
    crate::results::write_atomic(path, &bytes)
}

/// Each rank's clock as traces and run.json record it: the offset to rank 0
/// and its bound before and after the timed steps, the drift, and the
/// bound applied to the rank's times (0 on a shared clock, plus a device
/// stream's anchor).
pub fn clocks_json(rec: &RunRecord) -> Vec<Value> {
    rec.clocks
        .iter()
        .map(|c| clock_json(c, rec.uncertainty_us(c.rank)))
        .collect()
}

/// One rank's clock, with the bound applied to its times.
fn clock_json(c: &crate::measure::clock_sync::RankClock, applied_us: f64) -> Value {
    json!({
        "rank": c.rank,
        "offset_us": c.before.offset_us,
        "uncertainty_us": c.before.uncertainty_us,
        "offset_after_us": c.after.offset_us,
        "uncertainty_after_us": c.after.uncertainty_us,
        "drift_us": c.drift_us(),
        "applied_uncertainty_us": applied_us,
    })
}

/// Writes [`chrome_trace`] to `path` atomically.
pub fn write_chrome_trace(
    path: &Path,
    title: &str,
    schedule: &Schedule,
    rec: &RunRecord,
    step: usize,
) -> Result<(), crate::results::ResultsError> {
    let bytes = serde_json::to_vec(&chrome_trace(title, schedule, rec, step)).unwrap_or_default();
    crate::results::write_atomic(path, &bytes)
}

/// Per rank, `width` characters for the step: a line with the kind letter
/// (F, B, I, W) of the action running at that time, `.` for idle, and
/// under it the action's microbatch, one line per digit, most significant
/// first (read each column downwards: `1`/`2` over each other is 12):
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
    let most = step
        .iter()
        .flat_map(|r| r.actions.iter().map(|a| a.action.mb))
        .max()
        .unwrap_or(0);
    let digits = most.to_string().len();
    let mut out = String::new();
    for (r, rs) in step.iter().enumerate() {
        let mut kinds = vec!['.'; width];
        let mut mbs = vec![vec!['.'; width]; digits];
        if end > 0.0 {
            for a in &rs.actions {
                let from = ((a.start_us / end) * width as f64).floor().max(0.0) as usize;
                let to = ((a.end_us / end) * width as f64).ceil().max(0.0) as usize;
                let number: Vec<char> = format!("{:0digits$}", a.action.mb).chars().collect();
                for i in from.min(width)..to.min(width) {
                    kinds[i] = a.action.kind.letter();
                    for (row, &c) in mbs.iter_mut().zip(&number) {
                        row[i] = c;
                    }
                }
            }
        }
        let label = format!("rank{r}: ");
        out.push_str(&label);
        out.extend(kinds);
        out.push('\n');
        for row in mbs {
            out.push_str(&" ".repeat(label.len()));
            out.extend(row);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::ActionTiming;
    use super::*;
    use crate::measure::clock_sync::{OffsetEstimate, RankClock, TimeBase};
    use crate::schedule::{generate, Action, ScheduleKind};

    fn timing(st: usize, k: ActionKind, mb: usize, s: f64, e: f64) -> ActionTiming {
        ActionTiming {
            action: Action::new(st, k, mb),
            asked_us: s - 2.0,
            arrived_us: None,
            input_sent_us: None,
            start_us: s,
            work_end_us: e,
            sent_us: None,
            end_us: e,
        }
    }

    /// GPipe, 2 ranks, 1 microbatch: 0F0 sends at 10, 1F0 asked at 5 and
    /// started at 12 (5 waiting, 2 transfer), 1B0 sends at 30, 0B0 asked at
    /// 28 runs at 30 (2 waiting, no transfer).
    fn record() -> RunRecord {
        let wire = |mut a: ActionTiming, sent: Option<f64>, input: Option<f64>| {
            a.sent_us = sent;
            a.input_sent_us = input;
            a.arrived_us = input.map(|_| a.start_us);
            a
        };
        let mut f1 = timing(1, ActionKind::F, 0, 12.0, 20.0);
        f1.asked_us = 5.0;
        let step = vec![
            RankStep {
                actions: vec![
                    wire(timing(0, ActionKind::F, 0, 0.0, 10.0), Some(10.0), None),
                    wire(timing(0, ActionKind::B, 0, 30.0, 40.0), None, Some(30.0)),
                ],
                ..Default::default()
            },
            RankStep {
                actions: vec![
                    wire(f1, None, Some(10.0)),
                    wire(timing(1, ActionKind::B, 0, 20.0, 30.0), Some(30.0), None),
                ],
                ..Default::default()
            },
        ];
        let e = |unc| OffsetEstimate {
            offset_us: 0.5,
            uncertainty_us: unc,
            at_us: 0.0,
        };
        RunRecord {
            steps: vec![step],
            grad_max_err: None,
            message_us: 0.0,
            clocks: vec![
                RankClock {
                    rank: 0,
                    base: TimeBase::Estimated,
                    before: e(0.0),
                    after: e(0.0),
                },
                RankClock {
                    rank: 1,
                    base: TimeBase::Estimated,
                    before: e(3.0),
                    after: e(4.0),
                },
            ],
            origins_us: vec![0.0],
        }
    }

    #[test]
    fn the_trace_has_a_track_per_rank_a_slice_per_action_and_its_waits() {
        let s = generate(ScheduleKind::GPipe, 2, 1, 1).unwrap();
        let v = chrome_trace("t", &s, &record(), 0);
        let ev = v["traceEvents"].as_array().unwrap();
        let of = |cat: &str| ev.iter().filter(|e| e["cat"] == cat).collect::<Vec<_>>();
        let actions: Vec<&Value> = ev
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] != "wait" && e["cat"] != "transfer")
            .collect();
        assert_eq!(actions.len(), 4);
        assert!(actions
            .iter()
            .any(|e| e["name"] == "1B0" && e["tid"] == 1 && e["ts"] == 20.0));
        let wait = of("wait");
        assert_eq!(wait.len(), 2, "{wait:?}");
        let w1 = wait.iter().find(|e| e["name"] == "wait 1F0").unwrap();
        assert_eq!((&w1["ts"], &w1["dur"]), (&json!(5.0), &json!(5.0)));
        let transfer = of("transfer");
        assert_eq!(transfer.len(), 1, "0B0's transfer is empty: no slice");
        assert_eq!(transfer[0]["name"], "transfer 1F0");
        assert_eq!(
            (&transfer[0]["ts"], &transfer[0]["dur"]),
            (&json!(10.0), &json!(2.0))
        );
        // Two messages, each a flow from its send to its receive.
        let flows = of("message");
        assert_eq!(flows.len(), 4);
        for id in [0, 1] {
            let ends: Vec<&str> = flows
                .iter()
                .filter(|e| e["id"] == id)
                .map(|e| e["ph"].as_str().unwrap())
                .collect();
            assert!(ends.contains(&"s") && ends.contains(&"f"), "{id}: {ends:?}");
        }
        let clock = &v["otherData"]["clock"];
        assert_eq!(clock[1]["applied_uncertainty_us"], 4.0);
        assert_eq!(clock[1]["uncertainty_us"], 3.0);
        assert_eq!(clock[1]["offset_us"], 0.5);
        let names: Vec<&Value> = ev.iter().filter(|e| e["name"] == "thread_name").collect();
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn the_terminal_timeline_draws_kinds_and_idle() {
        let s = terminal_timeline(&record().steps[0], 4);
        assert_eq!(s, "rank0: F..B\n       0..0\nrank1: .FB.\n       .00.\n");
    }

    #[test]
    fn microbatches_from_10_print_one_digit_per_line() {
        let step = vec![RankStep {
            actions: vec![
                timing(0, ActionKind::F, 1, 0.0, 10.0),
                timing(0, ActionKind::F, 12, 10.0, 20.0),
            ],
            ..Default::default()
        }];
        let s = terminal_timeline(&step, 4);
        assert_eq!(s, "rank0: FFFF\n       0011\n       1122\n");
    }
}
