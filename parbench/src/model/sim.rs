//! The schedule simulator: how long a schedule takes, and how much of it each
//! rank idles, given what each action costs and what a message costs.
//!
//! Each rank runs its list in order. An action starts when its rank is free
//! and the message it needs has arrived; it sends its own message when it
//! ends, without waiting (as every backend's send does). A message between
//! two ranks occupies that link for `bytes / bandwidth` and arrives
//! `latency` later; one link carries one message at a time, in the order
//! they were sent. Between stages on the same rank a message costs nothing.
//!
//! The closed forms of the papers (GPipe, 1F1B, interleaved 1F1B, ZB-H1)
//! assume equal stages and free communication; with those inputs the
//! simulator reproduces them (see the tests), and with measured costs it
//! predicts what a real run should show.

use crate::schedule::{Action, ActionKind, Message, Schedule};
use std::collections::HashMap;

/// What each kind of action costs on one stage, in any time unit (the
/// results come back in the same unit).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageCosts {
    /// Forward.
    pub f: f64,
    /// Full backward (`B`).
    pub b: f64,
    /// Input-gradient backward (`I`).
    pub i: f64,
    /// Weight-gradient backward (`W`).
    pub w: f64,
}

impl StageCosts {
    /// The cost of one action kind.
    pub fn of(&self, kind: ActionKind) -> f64 {
        match kind {
            ActionKind::F => self.f,
            ActionKind::B => self.b,
            ActionKind::I => self.i,
            ActionKind::W => self.w,
        }
    }

    /// Forward `f`, input gradient `i`, weight gradient `w`, and `B = I + W`.
    pub fn split(f: f64, i: f64, w: f64) -> Self {
        StageCosts { f, b: i + w, i, w }
    }
}

/// Every input of a simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct SimCosts {
    /// Per stage (`stages[s]`), in the schedule's stage numbering.
    pub stages: Vec<StageCosts>,
    /// Time from a message's last byte leaving to its arrival.
    pub latency: f64,
    /// Bytes per time unit of each link; `f64::INFINITY` for free transfers.
    pub bandwidth: f64,
    /// Bytes of each activation or gradient message.
    pub message_bytes: f64,
}

impl SimCosts {
    /// Equal stages and free communication: the papers' assumptions.
    pub fn uniform(stages: usize, c: StageCosts) -> Self {
        SimCosts {
            stages: vec![c; stages],
            latency: 0.0,
            bandwidth: f64::INFINITY,
            message_bytes: 0.0,
        }
    }

    fn transfer(&self) -> f64 {
        if self.bandwidth.is_finite() && self.bandwidth > 0.0 {
            self.message_bytes / self.bandwidth
        } else {
            0.0
        }
    }
}

/// One action on the simulated timeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimSlice {
    pub action: Action,
    pub start: f64,
    pub end: f64,
}

/// What a simulation predicts.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    /// From the first action's start to the last action's end.
    pub makespan: f64,
    /// Per rank: time spent in actions.
    pub busy: Vec<f64>,
    /// Per rank: `makespan - busy`.
    pub idle: Vec<f64>,
    /// Idle time over rank-time: `sum(idle) / (ranks x makespan)`.
    pub bubble: f64,
    /// Per rank, its actions with start and end.
    pub timeline: Vec<Vec<SimSlice>>,
}

/// Why a simulation could not finish.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the simulation needs costs for {needed} stages, got {got}")]
    MissingCosts { needed: usize, got: usize },
    #[error("the schedule deadlocks: {0} (run schedule::validate for the grid)")]
    Deadlock(String),
}

/// Simulates `schedule` with `costs`.
pub fn simulate(schedule: &Schedule, costs: &SimCosts) -> Result<SimResult, SimError> {
    if costs.stages.len() < schedule.num_stages {
        return Err(SimError::MissingCosts {
            needed: schedule.num_stages,
            got: costs.stages.len(),
        });
    }
    simulate_with(schedule, |a| costs.stages[a.stage].of(a.kind), costs)
}

/// Simulates `schedule` with a cost for each action (for instance the
/// times one measured step took: a replay), and the links of `links`
/// (its stage costs are not used).
pub fn simulate_with(
    schedule: &Schedule,
    cost: impl Fn(Action) -> f64,
    links: &SimCosts,
) -> Result<SimResult, SimError> {
    let costs = links;
    let ranks = schedule.ranks();
    let rows: Vec<Vec<Action>> = (0..ranks).map(|r| schedule.compute_actions(r)).collect();
    let transfer = costs.transfer();
    let mut next = vec![0usize; ranks];
    let mut free = vec![0.0f64; ranks];
    let mut arrival: HashMap<Message, f64> = HashMap::new();
    let mut link_free: HashMap<(usize, usize), f64> = HashMap::new();
    let mut timeline: Vec<Vec<SimSlice>> = vec![Vec::new(); ranks];
    loop {
        let mut progressed = false;
        for r in 0..ranks {
            while let Some(&a) = rows[r].get(next[r]) {
                let ready = match schedule.input_of(a) {
                    None => 0.0,
                    Some((m, _)) => match arrival.get(&m) {
                        Some(&t) => t,
                        None => break,
                    },
                };
                let start = free[r].max(ready);
                let end = start + cost(a);
                if let Some((m, dst_stage)) = schedule.output_of(a) {
                    let dst = schedule.rank_of(dst_stage).unwrap_or(r);
                    let t = if dst == r {
                        end
                    } else {
                        let link = link_free.entry((r, dst)).or_insert(0.0);
                        let sent = link.max(end) + transfer;
                        *link = sent;
                        sent + costs.latency
                    };
                    arrival.insert(m, t);
                }
                timeline[r].push(SimSlice {
                    action: a,
                    start,
                    end,
                });
                free[r] = end;
                next[r] += 1;
                progressed = true;
            }
        }
        if (0..ranks).all(|r| next[r] >= rows[r].len()) {
            break;
        }
        if !progressed {
            let stuck: Vec<String> = (0..ranks)
                .filter_map(|r| rows[r].get(next[r]).map(|a| format!("rank {r} at {a}")))
                .collect();
            return Err(SimError::Deadlock(stuck.join(", ")));
        }
    }
    let makespan = free.iter().copied().fold(0.0, f64::max);
    let busy: Vec<f64> = timeline
        .iter()
        .map(|row| row.iter().map(|s| s.end - s.start).sum())
        .collect();
    let idle: Vec<f64> = busy.iter().map(|b| makespan - b).collect();
    let bubble = if makespan > 0.0 && ranks > 0 {
        idle.iter().sum::<f64>() / (ranks as f64 * makespan)
    } else {
        0.0
    };
    Ok(SimResult {
        makespan,
        busy,
        idle,
        bubble,
        timeline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::bubble::{bubble_fraction_of_step, bubble_time, BubbleSchedule, PassTimes};
    use crate::schedule::{generate, ScheduleKind};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    fn run(kind: ScheduleKind, s: usize, m: usize, v: usize, c: StageCosts) -> SimResult {
        let sch = generate(kind, s, m, v).unwrap();
        simulate(&sch, &SimCosts::uniform(sch.num_stages, c)).unwrap()
    }

    #[test]
    fn gpipe_and_1f1b_bubble_is_s_minus_1_over_s_plus_m_minus_1() {
        let c = StageCosts::split(1.0, 1.0, 1.0); // B = 2 F, as an MLP's backward
        for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
            for s in 1..=8 {
                for m in 1..=16 {
                    let r = run(kind, s, m, 1, c);
                    // (S-1)/(S+M-1), from the closed forms of model::bubble.
                    let expect = bubble_fraction_of_step(s as u64, m as u64).unwrap();
                    assert!(
                        close(r.bubble, expect),
                        "{kind} S={s} M={m}: {} vs {expect}",
                        r.bubble
                    );
                    assert!(close(r.makespan, (s + m - 1) as f64 * 3.0));
                    // Every rank idles the same (S-1)(t_f+t_b).
                    for idle in &r.idle {
                        assert!(close(*idle, (s - 1) as f64 * 3.0));
                    }
                }
            }
        }
    }

    #[test]
    fn the_table_in_references_holds() {
        // 4 stages: M=1 75% idle, M=4 43%, M=16 16%.
        let c = StageCosts::split(1.0, 1.0, 1.0);
        for (m, pct) in [(1, 75.0), (4, 42.857), (16, 15.789)] {
            let r = run(ScheduleKind::OneFOneB, 4, m, 1, c);
            assert!((r.bubble * 100.0 - pct).abs() < 0.01, "M={m}: {}", r.bubble);
        }
    }

    #[test]
    fn interleaving_divides_1f1b_bubble_time_by_v() {
        // Per-rank work t_f + t_b split into v chunks of (t_f + t_b)/v.
        let (tf, tb) = (1.0, 2.0);
        for s in [2, 3, 4] {
            for v in [1, 2, 3, 4] {
                for groups in [1, 2, 4] {
                    let m = s * groups;
                    let c =
                        StageCosts::split(tf / v as f64, tb / 2.0 / v as f64, tb / 2.0 / v as f64);
                    let r = run(ScheduleKind::Interleaved, s, m, v, c);
                    let ideal = m as f64 * (tf + tb);
                    // (S-1)(t_f+t_b)/v, from model::bubble.
                    let passes = PassTimes {
                        f: tf,
                        b: tb,
                        w: 0.0,
                    };
                    let chunks = BubbleSchedule::Interleaved { chunks: v as u64 };
                    let want = bubble_time(chunks, s as u64, &passes).unwrap();
                    assert!(
                        close(r.makespan - ideal, want),
                        "S={s} v={v} M={m}: bubble time {} vs (S-1)(t_f+t_b)/v = {want}",
                        r.makespan - ideal
                    );
                }
            }
        }
    }

    #[test]
    fn zb_h1_bubble_is_s_minus_1_times_f_plus_b_minus_w() {
        // The formula holds while T_W <= min(T_F, T_B): then every deferred W
        // fits in a wait for a gradient. The paper's figure is T_F = T_B = T_W,
        // where the bubble is one third of 1F1B's; M >= S so that every rank
        // reaches its steady state.
        for (f, b, w) in [
            (1.0, 1.0, 1.0),
            (1.0, 1.0, 0.5),
            (2.0, 1.0, 1.0),
            (1.0, 2.0, 1.0),
            (1.0, 1.2, 0.8),
        ] {
            for s in 2..=8 {
                for m in s..=3 * s {
                    let r = run(ScheduleKind::ZbH1, s, m, 1, StageCosts::split(f, b, w));
                    let ideal = m as f64 * (f + b + w);
                    // (S-1)(T_F+T_B-T_W), from model::bubble.
                    let passes = PassTimes { f, b, w };
                    let expect = bubble_time(BubbleSchedule::ZbH1, s as u64, &passes).unwrap();
                    assert!(
                        close(r.makespan - ideal, expect),
                        "F={f} B={b} W={w} S={s} M={m}: {} vs {expect}",
                        r.makespan - ideal
                    );
                    if f == b && b == w {
                        let one = run(ScheduleKind::OneFOneB, s, m, 1, StageCosts::split(f, b, w));
                        assert!(close(3.0 * (r.makespan - ideal), one.makespan - ideal));
                    }
                }
            }
        }
    }

    /// The bubble time of `kind` at chunk costs `(f, i, w)` on `s` ranks
    /// with `v` stages each, and the closed form fed each rank's passes
    /// (its `v` chunks'): (simulated, formula).
    fn against_form(
        kind: ScheduleKind,
        s: usize,
        m: usize,
        v: usize,
        (f, i, w): (f64, f64, f64),
    ) -> (f64, f64) {
        let sch = generate(kind, s, m, v).unwrap();
        let per_rank = sch.num_stages / s;
        let r = simulate(
            &sch,
            &SimCosts::uniform(sch.num_stages, StageCosts::split(f, i, w)),
        )
        .unwrap();
        let k = per_rank as f64;
        let passes = PassTimes {
            f: k * f,
            b: k * i,
            w: k * w,
        };
        let form = bubble_time(kind.closed_form(per_rank as u64), s as u64, &passes).unwrap();
        (r.makespan - m as f64 * k * (f + i + w), form)
    }

    #[test]
    fn looped_bfs_bubble_is_interleavings_once_m_reaches_s() {
        for (f, i, w) in [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 0.5)] {
            for s in 2..=6 {
                for v in 1..=3 {
                    for m in [s, s + 1, 2 * s, 3 * s + 1] {
                        let (sim, form) = against_form(ScheduleKind::LoopedBfs, s, m, v, (f, i, w));
                        assert!(close(sim, form), "S={s} v={v} M={m}: {sim} vs {form}");
                    }
                }
            }
        }
        // Below S microbatches the second loop waits: no closed form.
        let p = PassTimes {
            f: 1.0,
            b: 1.0,
            w: 1.0,
        };
        assert_eq!(
            crate::model::bubble::bubble_rate(BubbleSchedule::LoopedBfs { chunks: 2 }, 4, 3, &p),
            None
        );
    }

    #[test]
    fn interleaved_zero_bubble_is_zb_h1_over_v() {
        // ZB-H1's condition, T_W <= min(T_F, T_B); M in whole rounds of S.
        for (f, i, w) in [
            (1.0, 1.0, 1.0),
            (1.0, 2.0, 1.0),
            (1.0, 1.0, 0.5),
            (2.0, 1.0, 1.0),
            (1.0, 1.5, 0.5),
        ] {
            for s in 2..=6 {
                for v in 1..=3 {
                    for m in [s, 2 * s, 3 * s] {
                        let (sim, form) =
                            against_form(ScheduleKind::InterleavedZb, s, m, v, (f, i, w));
                        assert!(
                            close(sim, form),
                            "F={f} I={i} W={w} S={s} v={v} M={m}: {sim} vs {form}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn zb_v_and_dualpipev_idle_only_while_the_v_fills_at_equal_passes() {
        for kind in [ScheduleKind::ZbV, ScheduleKind::DualPipeV] {
            for s in 2..=8 {
                for m in [2 * s, 2 * s + 3, 4 * s] {
                    let (sim, form) = against_form(kind, s, m, 2, (1.0, 1.0, 1.0));
                    assert!(close(sim, form), "{kind} S={s} M={m}: {sim} vs {form}");
                    // At other times the form is a floor.
                    for t in [
                        (1.0, 2.0, 1.0),
                        (2.0, 1.0, 1.0),
                        (1.0, 1.0, 0.5),
                        (1.0, 1.5, 0.5),
                    ] {
                        let (sim, form) = against_form(kind, s, m, 2, t);
                        assert!(
                            sim >= form - 1e-9,
                            "{kind} S={s} M={m} {t:?}: {sim} < {form}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn zb_h1_beyond_its_condition_keeps_a_larger_bubble() {
        // With T_W > min(T_F, T_B) a deferred W no longer fits in the wait it
        // fills: the bubble is (S-1)(T_F + T_B - min(T_F, T_B, T_W)), above
        // the formula (which would even go negative for T_W > T_F + T_B).
        for (f, b, w) in [(1.0, 1.0, 1.5), (1.0, 0.5, 1.0), (1.0, 1.0, 2.5)] {
            for (s, m) in [(4, 4), (4, 16), (8, 24)] {
                let r = run(ScheduleKind::ZbH1, s, m, 1, StageCosts::split(f, b, w));
                let bubble_time = r.makespan - m as f64 * (f + b + w);
                let formula = (s - 1) as f64 * (f + b - w);
                let actual = (s - 1) as f64 * (f + b - f64::min(f, f64::min(b, w)));
                assert!(
                    close(bubble_time, actual),
                    "F={f} B={b} W={w}: {bubble_time}"
                );
                assert!(bubble_time > formula);
            }
        }
    }

    #[test]
    fn latency_adds_two_hops_per_stage_boundary_to_gpipe() {
        let sch = generate(ScheduleKind::GPipe, 4, 8, 1).unwrap();
        let mut c = SimCosts::uniform(4, StageCosts::split(1.0, 1.0, 1.0));
        let free = simulate(&sch, &c).unwrap().makespan;
        c.latency = 0.25;
        let slow = simulate(&sch, &c).unwrap().makespan;
        assert!(close(slow - free, 2.0 * 3.0 * 0.25), "{free} {slow}");
        // Bandwidth costs bytes / bandwidth per hop on top.
        c.bandwidth = 100.0;
        c.message_bytes = 10.0;
        let slower = simulate(&sch, &c).unwrap().makespan;
        assert!(close(slower - free, 2.0 * 3.0 * 0.35), "{free} {slower}");
    }

    #[test]
    fn the_slowest_stage_paces_the_pipeline() {
        let sch = generate(ScheduleKind::OneFOneB, 4, 32, 1).unwrap();
        let mut c = SimCosts::uniform(4, StageCosts::split(1.0, 1.0, 1.0));
        c.stages[2] = StageCosts::split(2.0, 2.0, 2.0);
        let r = simulate(&sch, &c).unwrap();
        // Steady state runs at the slow stage's 6 per microbatch.
        assert!(r.makespan >= 32.0 * 6.0);
        assert!(r.makespan <= 32.0 * 6.0 + 3.0 * 6.0);
    }

    #[test]
    fn per_action_costs_move_only_what_depends_on_them() {
        let sch = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
        let links = SimCosts::uniform(2, StageCosts::default());
        let slow = Action::new(0, ActionKind::F, 1);
        let r = simulate_with(&sch, |a| if a == slow { 5.0 } else { 1.0 }, &links).unwrap();
        // 0F0 [0,1], 0F1 [1,6]; 1F0 [1,2], 1F1 [6,7], 1B0 [7,8], 1B1 [8,9]; 0B0 [8,9], 0B1 [9,10].
        assert!(close(r.makespan, 10.0), "{}", r.makespan);
        assert!(close(r.busy[0], 8.0) && close(r.busy[1], 4.0));
    }

    #[test]
    fn costs_for_every_stage_are_required() {
        let sch = generate(ScheduleKind::GPipe, 3, 2, 1).unwrap();
        let c = SimCosts::uniform(2, StageCosts::split(1.0, 1.0, 1.0));
        assert!(matches!(
            simulate(&sch, &c),
            Err(SimError::MissingCosts { .. })
        ));
    }
}
