//! From per-action timings to what a pipeline run reports: step time, busy
//! and idle time per rank, the measured bubble, the per-action costs, and
//! the simulator's prediction from those costs.
//!
//! Every time is on one base (rank 0's clock, see [`super::exec`]). The
//! measured bubble of one step is `sum_r idle_r / (R x step)`: `step` runs
//! from the first action's work start on any rank to the last action's end
//! on any rank, `idle_r = step - busy_r`, and `busy_r` is the time rank `r`
//! spent running its actions (work and sends). Idle time splits into
//! waiting for a peer (asked for an input the peer had not yet sent),
//! transfer (the input was sent, not yet here) and the rest (the
//! executor's own time between actions). It is the same quantity the
//! simulator and the closed forms give, so the three can be put side by
//! side.

use super::RunRecord;
use crate::model::bubble::{bubble_rate, PassTimes};
use crate::model::sim::{simulate, simulate_with, SimCosts, SimError, SimResult, StageCosts};
use crate::schedule::{peak_in_flight, Action, ActionKind, Message, Schedule, ScheduleKind};
use crate::stats::median;
use std::collections::HashMap;

/// What one run reports (times in microseconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Median, fastest and slowest timed step.
    pub step_us: f64,
    pub step_min_us: f64,
    pub step_max_us: f64,
    /// Index of the median step in the record (the one traces draw).
    pub median_step: usize,
    /// Per rank, mean over steps: time running actions, time idle, and the
    /// part of idle spent receiving (waiting and transfer together).
    pub busy_us: Vec<f64>,
    pub idle_us: Vec<f64>,
    pub recv_us: Vec<f64>,
    /// Per rank, mean over steps: the part of idle spent waiting for a peer
    /// that had not yet sent, and the part spent on transfers under way.
    pub wait_us: Vec<f64>,
    pub transfer_us: Vec<f64>,
    /// Per rank, mean over steps: the part of idle after the rank's last
    /// action, until the step's end (its drain: nothing left to run).
    pub done_us: Vec<f64>,
    /// Mean over steps of the measured bubble fraction.
    pub bubble_measured: f64,
    /// Median cost of each action kind on each stage (work and send).
    pub costs_us: Vec<StageCosts>,
    /// One-way time of one activation message (link probe).
    pub message_us: f64,
    /// The simulation of the schedule with `costs_us` and `message_us`.
    pub sim: SimResult,
    /// Mean over steps of the bubble of a replay: each step simulated with
    /// the time each of its own actions took. What remains between this and
    /// the measured bubble is waiting that no dependency forced (wake-ups,
    /// the executor's own overhead).
    pub bubble_replayed: f64,
    /// Per rank: the most microbatches (and bytes) of activations held at once, over steps.
    pub peak_activations: Vec<usize>,
    pub peak_activation_bytes: Vec<usize>,
    /// Per rank: what the schedule implies (forwards not yet released).
    pub expected_peak_activations: Vec<usize>,
}

/// Summarises a run of `schedule`.
pub fn summarize(schedule: &Schedule, rec: &RunRecord) -> Result<Summary, SimError> {
    let ranks = schedule.ranks();
    let steps: Vec<f64> = rec.steps.iter().map(|st| step_span(st)).collect();
    let n = steps.len().max(1) as f64;
    let mut busy_us = vec![0.0; ranks];
    let mut idle_us = vec![0.0; ranks];
    let mut recv_us = vec![0.0; ranks];
    let mut wait_us = vec![0.0; ranks];
    let mut transfer_us = vec![0.0; ranks];
    let mut done_us = vec![0.0; ranks];
    let mut bubble = 0.0;
    for (st, &step) in rec.steps.iter().zip(&steps) {
        let mut idle_sum = 0.0;
        for (r, rs) in st.iter().enumerate().take(ranks) {
            let busy: f64 = rs.actions.iter().map(|a| a.busy_us()).sum();
            let sum = |f: fn(&super::ActionTiming) -> f64| rs.actions.iter().map(f).sum::<f64>();
            busy_us[r] += busy / n;
            idle_us[r] += (step - busy) / n;
            recv_us[r] += sum(|a| a.recv_us()) / n;
            wait_us[r] += sum(|a| a.waiting_us()) / n;
            transfer_us[r] += sum(|a| a.transfer_us()) / n;
            if let (Some(last), Some(end)) = (rs.actions.last(), step_end(st)) {
                done_us[r] += (end - last.end_us).max(0.0) / n;
            }
            idle_sum += step - busy;
        }
        if step > 0.0 {
            bubble += idle_sum / (ranks as f64 * step) / n;
        }
    }
    let mut order: Vec<usize> = (0..steps.len()).collect();
    order.sort_by(|&a, &b| steps[a].total_cmp(&steps[b]));
    let median_step = order.get(order.len() / 2).copied().unwrap_or(0);
    let costs_us = stage_costs(schedule, rec);
    let links = SimCosts {
        stages: costs_us.clone(),
        latency: rec.message_us,
        bandwidth: f64::INFINITY,
        message_bytes: 0.0,
    };
    let sim = simulate(schedule, &links)?;
    let mut bubble_replayed = 0.0;
    for st in &rec.steps {
        let took: HashMap<_, f64> = st
            .iter()
            .flat_map(|rs| rs.actions.iter().map(|a| (a.action, a.busy_us())))
            .collect();
        let replay = simulate_with(schedule, |a| took.get(&a).copied().unwrap_or(0.0), &links)?;
        bubble_replayed += replay.bubble / n;
    }
    let peak = |f: fn(&super::RankStep) -> usize| -> Vec<usize> {
        (0..ranks)
            .map(|r| {
                rec.steps
                    .iter()
                    .filter_map(|st| st.get(r).map(f))
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    };
    Ok(Summary {
        step_us: median(&mut steps.clone()).unwrap_or(0.0),
        step_min_us: steps.iter().copied().fold(f64::INFINITY, f64::min),
        step_max_us: steps.iter().copied().fold(0.0, f64::max),
        median_step,
        busy_us,
        idle_us,
        recv_us,
        wait_us,
        transfer_us,
        done_us,
        bubble_measured: bubble,
        costs_us,
        message_us: rec.message_us,
        sim,
        bubble_replayed,
        peak_activations: peak(|r| r.peak_activations),
        peak_activation_bytes: peak(|r| r.peak_activation_bytes),
        expected_peak_activations: peak_in_flight(schedule),
    })
}

/// A dependent action whose work started before the work producing its
/// input ended, by more than the two ranks' clock uncertainty together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Acausal {
    /// Index of the timed step.
    pub step: usize,
    pub action: Action,
    pub producer: Action,
    /// How much earlier than the producer's end it started.
    pub early_us: f64,
    /// The two ranks' recorded uncertainty, summed.
    pub uncertainty_us: f64,
}

/// Every dependent action of every step of `rec` that starts before its
/// producer's work ended, beyond the recorded clock uncertainty. Empty for
/// a record on one time base: a message cannot arrive before it is sent.
pub fn acausal(schedule: &Schedule, rec: &RunRecord) -> Vec<Acausal> {
    let mut out = Vec::new();
    for (i, step) in rec.steps.iter().enumerate() {
        let produced: HashMap<Message, (usize, Action, f64)> = step
            .iter()
            .enumerate()
            .flat_map(|(r, rs)| rs.actions.iter().map(move |a| (r, a)))
            .filter_map(|(r, a)| {
                let (m, _) = schedule.output_of(a.action)?;
                Some((m, (r, a.action, a.work_end_us)))
            })
            .collect();
        for (r, rs) in step.iter().enumerate() {
            for a in &rs.actions {
                let Some((m, _)) = schedule.input_of(a.action) else {
                    continue;
                };
                let Some(&(pr, producer, end)) = produced.get(&m) else {
                    continue;
                };
                let uncertainty_us = rec.uncertainty_us(r) + rec.uncertainty_us(pr);
                let early_us = end - a.start_us;
                if early_us > uncertainty_us {
                    out.push(Acausal {
                        step: i,
                        action: a.action,
                        producer,
                        early_us,
                        uncertainty_us,
                    });
                }
            }
        }
    }
    out
}

/// When the last action of a step ended, on any rank.
fn step_end(step: &[super::RankStep]) -> Option<f64> {
    step.iter()
        .flat_map(|r| r.actions.iter().map(|a| a.end_us))
        .reduce(f64::max)
}

/// One step's time: from the first work start on any rank to the last end.
pub fn step_span(step: &[super::RankStep]) -> f64 {
    let acts = || step.iter().flat_map(|r| r.actions.iter());
    let start = acts().map(|a| a.start_us).fold(f64::INFINITY, f64::min);
    let end = acts().map(|a| a.end_us).fold(f64::NEG_INFINITY, f64::max);
    if start.is_finite() && end > start {
        end - start
    } else {
        0.0
    }
}

/// One step's idle time summed over the ranks, and its parts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IdleSplit {
    pub idle_us: f64,
    /// Waiting for a peer that had not yet sent.
    pub wait_us: f64,
    /// Transfers under way: sent, not yet in hand.
    pub transfer_us: f64,
    /// After each rank's last action (the drain).
    pub done_us: f64,
}

impl IdleSplit {
    /// The rest: the executor's own time between actions.
    pub fn other_us(&self) -> f64 {
        (self.idle_us - self.wait_us - self.transfer_us - self.done_us).max(0.0)
    }
}

impl Summary {
    /// Idle time of one step summed over the ranks, and its parts.
    pub fn idle_split(&self) -> IdleSplit {
        IdleSplit {
            idle_us: self.idle_us.iter().sum(),
            wait_us: self.wait_us.iter().sum(),
            transfer_us: self.transfer_us.iter().sum(),
            done_us: self.done_us.iter().sum(),
        }
    }
}

/// Median cost of each action kind on each stage, over every timed step.
fn stage_costs(schedule: &Schedule, rec: &RunRecord) -> Vec<StageCosts> {
    let mut samples = vec![[Vec::new(), Vec::new(), Vec::new(), Vec::new()]; schedule.num_stages];
    for st in &rec.steps {
        for rs in st {
            for a in &rs.actions {
                if let Some(slot) = samples.get_mut(a.action.stage) {
                    slot[a.action.kind.index()].push(a.busy_us());
                }
            }
        }
    }
    samples
        .into_iter()
        .map(|mut k| StageCosts {
            f: median(&mut k[ActionKind::F.index()]).unwrap_or(0.0),
            b: median(&mut k[ActionKind::B.index()]).unwrap_or(0.0),
            i: median(&mut k[ActionKind::I.index()]).unwrap_or(0.0),
            w: median(&mut k[ActionKind::W.index()]).unwrap_or(0.0),
        })
        .collect()
}

/// The closed-form bubble fraction of the step (`parbench::model::bubble`)
/// for a generated schedule, with the pass times averaged over stages (the
/// forms assume equal stages); `None` for hand-written schedules.
pub fn closed_form(
    kind: Option<ScheduleKind>,
    schedule: &Schedule,
    costs: &[StageCosts],
) -> Option<f64> {
    let kind = kind?;
    let n = costs.len().max(1) as f64;
    let mean = |f: fn(&StageCosts) -> f64| costs.iter().map(f).sum::<f64>() / n;
    let (f, b, i, w) = (mean(|c| c.f), mean(|c| c.b), mean(|c| c.i), mean(|c| c.w));
    let passes = if schedule.splits_backward() {
        PassTimes { f, b: i, w }
    } else {
        PassTimes { f, b, w: 0.0 }
    };
    let which = kind.closed_form(schedule.chunks() as u64);
    bubble_rate(
        which,
        schedule.ranks() as u64,
        schedule.microbatches as u64,
        &passes,
    )
}

/// Points of the step by which a measured bubble may differ from its
/// simulation before the run says so.
pub const BUBBLE_PARTS: f64 = 0.10;

/// Whether `ranks` computing ranks share `cores` cores (0: unknown), so
/// that they wait for a core, which no simulation of the schedule sees.
pub fn oversubscribed(ranks: usize, cores: usize, sleep_work: bool) -> bool {
    cores > 0 && ranks > cores && !sleep_work
}

/// Why a measured bubble parts from its simulation by more than
/// [`BUBBLE_PARTS`], in words, or `None` when it does not: more compute
/// ranks than cores first (ranks wait for a core, which the simulator,
/// fed each action's own time, does not see), then sleeps that wake late.
pub fn bubble_parts(
    measured: f64,
    simulated: f64,
    ranks: usize,
    cores: usize,
    sleep_work: bool,
) -> Option<String> {
    let gap = (measured - simulated).abs();
    if gap.is_nan() || gap <= BUBBLE_PARTS {
        return None;
    }
    Some(if oversubscribed(ranks, cores, sleep_work) {
        format!("likely cause: {ranks} compute ranks on {cores} cores, so ranks waited for a core, not for the pipeline (run fewer stages, or --work sleep:US)")
    } else if sleep_work {
        "likely cause: sleeps waking late or the host's scheduler (see the noise guard's figure in run.json)".into()
    } else {
        "likely cause: other processes on the host (see the noise guard's figure in run.json) or the executor's own time between actions".into()
    })
}

#[cfg(test)]
mod tests {
    use super::super::{ActionTiming, RankStep};
    use super::*;
    use crate::schedule::{generate, Action};

    /// A record in which every action runs exactly when the simulator says.
    fn record_from_sim(s: &Schedule, c: StageCosts) -> RunRecord {
        let sim = simulate(s, &SimCosts::uniform(s.num_stages, c)).unwrap();
        let step: Vec<RankStep> = sim
            .timeline
            .iter()
            .map(|row| RankStep {
                actions: row
                    .iter()
                    .map(|sl| ActionTiming {
                        action: sl.action,
                        asked_us: sl.start,
                        arrived_us: None,
                        input_sent_us: None,
                        start_us: sl.start,
                        work_end_us: sl.end,
                        sent_us: None,
                        end_us: sl.end,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        RunRecord {
            steps: vec![step.clone(), step],
            grad_max_err: None,
            message_us: 0.0,
            clocks: Vec::new(),
            origins_us: Vec::new(),
        }
    }

    #[test]
    fn a_run_that_matches_the_simulation_measures_its_bubble() {
        for kind in ScheduleKind::ALL {
            let v = if kind.chunked() { 2 } else { 1 };
            let s = generate(kind, 4, 8, v).unwrap();
            let c = StageCosts::split(10.0, 10.0, 10.0);
            let sum = summarize(&s, &record_from_sim(&s, c)).unwrap();
            assert!(
                (sum.bubble_measured - sum.sim.bubble).abs() < 1e-12,
                "{kind}"
            );
            assert!((sum.step_us - sum.sim.makespan).abs() < 1e-9);
            let formula = closed_form(Some(kind), &s, &sum.costs_us).unwrap();
            assert!(
                (formula - sum.sim.bubble).abs() < 1e-12,
                "{kind}: {formula} vs {}",
                sum.sim.bubble
            );
            assert_eq!(sum.costs_us[0].f, 10.0);
            for r in 0..4 {
                assert!((sum.busy_us[r] + sum.idle_us[r] - sum.step_us).abs() < 1e-9);
            }
        }
    }

    /// GPipe, 2 ranks, 1 microbatch, on one base. Rank 0: F 0..10 (sent
    /// at 10), asks for B's input at 10, has it at 32 (sent at 30), B
    /// 32..40. Rank 1: asks at 0, sent at 10, in hand at 12, F 12..20, B
    /// 20..30 (sent at 30); done at 30, the step ends at 40.
    #[test]
    fn idle_splits_into_waiting_transfer_and_drain() {
        let s = generate(ScheduleKind::GPipe, 2, 1, 1).unwrap();
        let t = |st, k, asked, input: Option<f64>, start, end, sent: Option<f64>| ActionTiming {
            action: Action::new(st, k, 0),
            asked_us: asked,
            arrived_us: input.map(|_| start),
            input_sent_us: input,
            start_us: start,
            work_end_us: end,
            sent_us: sent,
            end_us: end,
        };
        let step = vec![
            RankStep {
                actions: vec![
                    t(0, ActionKind::F, 0.0, None, 0.0, 10.0, Some(10.0)),
                    t(0, ActionKind::B, 10.0, Some(30.0), 32.0, 40.0, None),
                ],
                ..Default::default()
            },
            RankStep {
                actions: vec![
                    t(1, ActionKind::F, 0.0, Some(10.0), 12.0, 20.0, None),
                    t(1, ActionKind::B, 20.0, None, 20.0, 30.0, Some(30.0)),
                ],
                ..Default::default()
            },
        ];
        let rec = RunRecord {
            steps: vec![step],
            grad_max_err: None,
            message_us: 0.0,
            clocks: Vec::new(),
            origins_us: Vec::new(),
        };
        let sum = summarize(&s, &rec).unwrap();
        assert_eq!(sum.step_us, 40.0);
        assert_eq!(
            (sum.wait_us[0], sum.transfer_us[0], sum.done_us[0]),
            (20.0, 2.0, 0.0)
        );
        assert_eq!(
            (sum.wait_us[1], sum.transfer_us[1], sum.done_us[1]),
            (10.0, 2.0, 10.0)
        );
        let split = sum.idle_split();
        assert_eq!(split.idle_us, 22.0 + 22.0);
        assert_eq!(split.other_us(), 0.0);
        assert!(acausal(&s, &rec).is_empty());
        // Rank 1 starting before rank 0's forward ended is caught.
        let mut bad = rec.clone();
        bad.steps[0][1].actions[0].start_us = 8.0;
        let found = acausal(&s, &bad);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].action.to_string(), found[0].early_us),
            ("1F0".into(), 2.0)
        );
    }

    #[test]
    fn hand_written_schedules_have_no_closed_form() {
        let s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
        assert_eq!(closed_form(None, &s, &[]), None);
    }
}

#[cfg(test)]
mod bubble_parts_tests {
    use super::*;

    #[test]
    fn a_bubble_that_parts_names_its_likely_cause() {
        assert_eq!(bubble_parts(0.20, 0.15, 4, 2, false), None);
        let crowded = bubble_parts(0.80, 0.15, 4, 2, false).unwrap();
        assert!(crowded.contains("4 compute ranks on 2 cores"), "{crowded}");
        let sleepy = bubble_parts(0.40, 0.15, 4, 2, true).unwrap();
        assert!(sleepy.contains("sleeps waking late"), "{sleepy}");
        let other = bubble_parts(0.40, 0.15, 2, 8, false).unwrap();
        assert!(other.contains("other processes"), "{other}");
        assert!(bubble_parts(f64::NAN, 0.1, 2, 2, false).is_none());
    }
}
