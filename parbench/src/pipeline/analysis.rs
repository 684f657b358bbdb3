//! From per-action timings to what a pipeline run reports: step time, busy
//! and idle time per rank, the measured bubble, the per-action costs, and
//! the simulator's prediction from those costs.
//!
//! The measured bubble of one step is `sum_r idle_r / (R x step)`: `step` is
//! the longest rank's time from the common start (a barrier) to the end of
//! its last action, `idle_r = step - busy_r`, and `busy_r` is the time rank
//! `r` spent running its actions (work and sends; waits in `recv` are idle).
//! It is the same quantity the simulator and the closed forms give, so the
//! three can be put side by side.

use super::{median, RunRecord};
use crate::model::bubble::{bubble_rate, BubbleSchedule, PassTimes};
use crate::model::sim::{simulate, simulate_with, SimCosts, SimError, SimResult, StageCosts};
use crate::schedule::{peak_in_flight, ActionKind, Schedule, ScheduleKind};
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
    /// part of idle spent inside `recv` (waiting and transfer together).
    pub busy_us: Vec<f64>,
    pub idle_us: Vec<f64>,
    pub recv_us: Vec<f64>,
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
    let steps: Vec<f64> = rec
        .steps
        .iter()
        .map(|st| {
            st.iter()
                .filter_map(|r| r.actions.last().map(|a| a.end_us))
                .fold(0.0, f64::max)
        })
        .collect();
    let n = steps.len().max(1) as f64;
    let mut busy_us = vec![0.0; ranks];
    let mut idle_us = vec![0.0; ranks];
    let mut recv_us = vec![0.0; ranks];
    let mut bubble = 0.0;
    for (st, &step) in rec.steps.iter().zip(&steps) {
        let mut idle_sum = 0.0;
        for (r, rs) in st.iter().enumerate().take(ranks) {
            let busy: f64 = rs.actions.iter().map(|a| a.busy_us()).sum();
            let recv: f64 = rs.actions.iter().map(|a| a.start_us - a.wait_us).sum();
            busy_us[r] += busy / n;
            idle_us[r] += (step - busy) / n;
            recv_us[r] += recv / n;
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
        step_us: median(&mut steps.clone()),
        step_min_us: steps.iter().copied().fold(f64::INFINITY, f64::min),
        step_max_us: steps.iter().copied().fold(0.0, f64::max),
        median_step,
        busy_us,
        idle_us,
        recv_us,
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
            f: median(&mut k[ActionKind::F.index()]),
            b: median(&mut k[ActionKind::B.index()]),
            i: median(&mut k[ActionKind::I.index()]),
            w: median(&mut k[ActionKind::W.index()]),
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
    let which = match kind {
        ScheduleKind::GPipe => BubbleSchedule::GPipe,
        ScheduleKind::OneFOneB => BubbleSchedule::OneFOneB,
        ScheduleKind::Interleaved => BubbleSchedule::Interleaved {
            chunks: schedule.chunks() as u64,
        },
        ScheduleKind::ZbH1 => BubbleSchedule::ZbH1,
    };
    bubble_rate(
        which,
        schedule.ranks() as u64,
        schedule.microbatches as u64,
        &passes,
    )
}

#[cfg(test)]
mod tests {
    use super::super::{ActionTiming, RankStep};
    use super::*;
    use crate::schedule::generate;

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
                        wait_us: sl.start,
                        start_us: sl.start,
                        work_end_us: sl.end,
                        end_us: sl.end,
                    })
                    .collect(),
                peak_activations: 0,
                peak_activation_bytes: 0,
            })
            .collect();
        RunRecord {
            steps: vec![step.clone(), step],
            grad_max_err: None,
            message_us: 0.0,
        }
    }

    #[test]
    fn a_run_that_matches_the_simulation_measures_its_bubble() {
        for kind in ScheduleKind::ALL {
            let v = if kind == ScheduleKind::Interleaved {
                2
            } else {
                1
            };
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

    #[test]
    fn hand_written_schedules_have_no_closed_form() {
        let s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
        assert_eq!(closed_form(None, &s, &[]), None);
    }
}
