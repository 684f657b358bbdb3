//! The rules a schedule must keep before anything runs, and the grid that
//! shows where it breaks them.
//!
//! 1. Every action names a stage and microbatch that exist, on the rank that
//!    holds that stage, once.
//! 2. Every send has its receive: a forward on stage `s` (not the last) is
//!    matched by the forward of `s + 1`, a backward on `s > 0` by the backward
//!    of `s - 1`, and the other way round.
//! 3. Each stage runs each microbatch's forward once and its backward once,
//!    either whole (`B`) or split (`I` and `W`), never both.
//! 4. On its rank, `F` comes before `B`/`I` and `I` before `W`.
//! 5. It cannot deadlock: ranks run their lists in order, an action waits for
//!    the message it needs, and sends never wait (as every backend
//!    guarantees); if at some point every unfinished rank waits for a message
//!    no one will send, the schedule is refused.

use super::{Action, ActionKind, Message, Schedule, ScheduleError};
use std::collections::{HashMap, HashSet};

/// Checks every rule; the error names the first broken rule and shows the
/// grid with the offending actions in brackets.
pub fn validate(s: &Schedule) -> Result<(), ScheduleError> {
    check_structure(s)?;
    let places = places(s);
    check_unique(s, &places)?;
    check_messages(s, &places)?;
    check_complete(s, &places)?;
    check_order(s, &places)?;
    check_deadlock(s)
}

/// Where each action sits: (rank, step).
type Places = HashMap<Action, Vec<(usize, usize)>>;

fn places(s: &Schedule) -> Places {
    let mut p: Places = HashMap::new();
    for (r, row) in s.actions.iter().enumerate() {
        for (i, a) in row.iter().enumerate() {
            if let Some(a) = a {
                p.entry(*a).or_default().push((r, i));
            }
        }
    }
    p
}

fn invalid(s: &Schedule, reason: String, marks: &[(usize, usize)]) -> ScheduleError {
    ScheduleError::Invalid {
        name: s.name.clone(),
        reason,
        grid: render_grid(s, marks),
    }
}

fn check_structure(s: &Schedule) -> Result<(), ScheduleError> {
    if s.actions.is_empty() {
        return Err(invalid(s, "it has no ranks".into(), &[]));
    }
    let cells = s.actions.iter().map(Vec::len).sum();
    if let Err(why) = super::check_limits(s.ranks(), s.num_stages, s.microbatches, cells) {
        // No grid: a schedule past the limits is too large to draw.
        return Err(ScheduleError::Invalid {
            name: s.name.clone(),
            reason: why,
            grid: String::new(),
        });
    }
    if s.num_stages == 0 || s.microbatches == 0 {
        return Err(invalid(
            s,
            "it has no stages or no microbatches".into(),
            &[],
        ));
    }
    if s.stage_to_rank.len() != s.num_stages {
        return Err(invalid(
            s,
            format!(
                "it maps {} stages to ranks but has {} stages",
                s.stage_to_rank.len(),
                s.num_stages
            ),
            &[],
        ));
    }
    if let Some((st, r)) = s
        .stage_to_rank
        .iter()
        .enumerate()
        .find(|(_, &r)| r >= s.ranks())
    {
        return Err(invalid(
            s,
            format!(
                "stage {st} is mapped to rank {r}, but there are {} ranks",
                s.ranks()
            ),
            &[],
        ));
    }
    for (r, row) in s.actions.iter().enumerate() {
        for (i, a) in row.iter().enumerate() {
            let Some(a) = a else { continue };
            if a.stage >= s.num_stages {
                return Err(invalid(
                    s,
                    format!("{a} names stage {} of {} stages", a.stage, s.num_stages),
                    &[(r, i)],
                ));
            }
            if a.mb >= s.microbatches {
                return Err(invalid(
                    s,
                    format!("{a} names microbatch {} of {}", a.mb, s.microbatches),
                    &[(r, i)],
                ));
            }
            if s.stage_to_rank[a.stage] != r {
                return Err(invalid(
                    s,
                    format!(
                        "rank {r} runs {a}, but stage {} is held by rank {}",
                        a.stage, s.stage_to_rank[a.stage]
                    ),
                    &[(r, i)],
                ));
            }
        }
    }
    Ok(())
}

fn check_unique(s: &Schedule, p: &Places) -> Result<(), ScheduleError> {
    let mut dups: Vec<(&Action, &Vec<(usize, usize)>)> =
        p.iter().filter(|(_, v)| v.len() > 1).collect();
    dups.sort();
    if let Some((a, at)) = dups.first() {
        return Err(invalid(
            s,
            format!("{a} runs {} times (once expected)", at.len()),
            at,
        ));
    }
    // Whole and split backward of the same microbatch on one stage.
    let mut mixed: Vec<Action> = p
        .keys()
        .filter(|a| a.kind == ActionKind::B)
        .filter(|a| {
            p.contains_key(&Action::new(a.stage, ActionKind::I, a.mb))
                || p.contains_key(&Action::new(a.stage, ActionKind::W, a.mb))
        })
        .copied()
        .collect();
    mixed.sort();
    if let Some(a) = mixed.first() {
        let mut marks = p[a].clone();
        for k in [ActionKind::I, ActionKind::W] {
            if let Some(v) = p.get(&Action::new(a.stage, k, a.mb)) {
                marks.extend(v);
            }
        }
        return Err(invalid(
            s,
            format!(
                "stage {} runs microbatch {}'s backward both whole (B) and split (I/W)",
                a.stage, a.mb
            ),
            &marks,
        ));
    }
    Ok(())
}

/// Whether stage `stage` runs a backward of `mb` that produces the input gradient.
fn has_input_backward(p: &Places, stage: usize, mb: usize) -> bool {
    p.contains_key(&Action::new(stage, ActionKind::B, mb))
        || p.contains_key(&Action::new(stage, ActionKind::I, mb))
}

fn check_messages(s: &Schedule, p: &Places) -> Result<(), ScheduleError> {
    let mut acts: Vec<(&Action, &Vec<(usize, usize)>)> = p.iter().collect();
    acts.sort();
    for (a, at) in acts {
        let rank_of = |st: usize| s.stage_to_rank[st];
        match a.kind {
            ActionKind::F => {
                if !s.is_last(a.stage)
                    && !p.contains_key(&Action::new(a.stage + 1, ActionKind::F, a.mb))
                {
                    return Err(invalid(
                        s,
                        format!(
                            "{a} sends its activation to stage {} on rank {}, which never receives it (no {}F{})",
                            a.stage + 1,
                            rank_of(a.stage + 1),
                            a.stage + 1,
                            a.mb
                        ),
                        at,
                    ));
                }
                if a.stage > 0 && !p.contains_key(&Action::new(a.stage - 1, ActionKind::F, a.mb)) {
                    return Err(invalid(
                        s,
                        format!(
                            "{a} receives an activation from stage {} on rank {}, which never sends it (no {}F{})",
                            a.stage - 1,
                            rank_of(a.stage - 1),
                            a.stage - 1,
                            a.mb
                        ),
                        at,
                    ));
                }
            }
            ActionKind::B | ActionKind::I => {
                if a.stage > 0 && !has_input_backward(p, a.stage - 1, a.mb) {
                    return Err(invalid(
                        s,
                        format!(
                            "{a} sends its input gradient to stage {} on rank {}, which never receives it (no {}B{} or {}I{})",
                            a.stage - 1,
                            rank_of(a.stage - 1),
                            a.stage - 1,
                            a.mb,
                            a.stage - 1,
                            a.mb
                        ),
                        at,
                    ));
                }
                if !s.is_last(a.stage) && !has_input_backward(p, a.stage + 1, a.mb) {
                    return Err(invalid(
                        s,
                        format!(
                            "{a} receives a gradient from stage {} on rank {}, which never sends it (no {}B{} or {}I{})",
                            a.stage + 1,
                            rank_of(a.stage + 1),
                            a.stage + 1,
                            a.mb,
                            a.stage + 1,
                            a.mb
                        ),
                        at,
                    ));
                }
            }
            ActionKind::W => {}
        }
    }
    Ok(())
}

fn check_complete(s: &Schedule, p: &Places) -> Result<(), ScheduleError> {
    for st in 0..s.num_stages {
        for mb in 0..s.microbatches {
            let has = |k| p.contains_key(&Action::new(st, k, mb));
            let missing = if !has(ActionKind::F) {
                Some(format!("{st}F{mb}"))
            } else if has(ActionKind::I) && !has(ActionKind::W) {
                Some(format!("{st}W{mb} (it runs {st}I{mb})"))
            } else if has(ActionKind::W) && !has(ActionKind::I) {
                Some(format!("{st}I{mb} (it runs {st}W{mb})"))
            } else if !has(ActionKind::B) && !has(ActionKind::I) {
                Some(format!(
                    "a backward of microbatch {mb} ({st}B{mb}, or {st}I{mb} and {st}W{mb})"
                ))
            } else {
                None
            };
            if let Some(what) = missing {
                return Err(invalid(
                    s,
                    format!(
                        "stage {st} (rank {}) never runs {what}",
                        s.stage_to_rank[st]
                    ),
                    &[],
                ));
            }
        }
    }
    Ok(())
}

fn check_order(s: &Schedule, p: &Places) -> Result<(), ScheduleError> {
    let step = |a: Action| p.get(&a).and_then(|v| v.first()).map(|&(_, i)| i);
    let mut acts: Vec<(&Action, &Vec<(usize, usize)>)> = p.iter().collect();
    acts.sort();
    for (a, at) in acts {
        let before = match a.kind {
            ActionKind::B | ActionKind::I => ActionKind::F,
            ActionKind::W => ActionKind::I,
            ActionKind::F => continue,
        };
        let prior = Action::new(a.stage, before, a.mb);
        if let (Some(i), Some(j)) = (step(*a), step(prior)) {
            if i < j {
                let mut marks = at.clone();
                marks.extend(&p[&prior]);
                return Err(invalid(s, format!("{a} runs before {prior}"), &marks));
            }
        }
    }
    Ok(())
}

/// Runs the schedule with every action taking no time: each rank advances
/// while the message its next action needs has been sent.
fn check_deadlock(s: &Schedule) -> Result<(), ScheduleError> {
    let rows: Vec<Vec<(usize, Action)>> = s
        .actions
        .iter()
        .map(|row| {
            row.iter()
                .enumerate()
                .filter_map(|(i, a)| a.map(|a| (i, a)))
                .collect()
        })
        .collect();
    let mut next = vec![0usize; rows.len()];
    let mut sent: HashSet<Message> = HashSet::new();
    loop {
        let mut progressed = false;
        for (r, row) in rows.iter().enumerate() {
            while let Some(&(_, a)) = row.get(next[r]) {
                if let Some((m, _)) = s.input_of(a) {
                    if !sent.contains(&m) {
                        break;
                    }
                }
                if let Some((m, _)) = s.output_of(a) {
                    sent.insert(m);
                }
                next[r] += 1;
                progressed = true;
            }
        }
        if next.iter().zip(&rows).all(|(&n, row)| n >= row.len()) {
            return Ok(());
        }
        if !progressed {
            let mut marks = Vec::new();
            let mut waits = Vec::new();
            for (r, row) in rows.iter().enumerate() {
                if let Some(&(i, a)) = row.get(next[r]) {
                    marks.push((r, i));
                    let from = s
                        .input_of(a)
                        .map(|(_, st)| {
                            let producer = match a.kind {
                                ActionKind::F => format!("{st}F{}", a.mb),
                                _ => format!("{st}B{}/{st}I{}", a.mb, a.mb),
                            };
                            format!("{producer} on rank {}", s.stage_to_rank[st])
                        })
                        .unwrap_or_default();
                    waits.push(format!("rank {r} waits at {a} for {from}"));
                }
            }
            return Err(ScheduleError::Deadlock {
                name: s.name.clone(),
                reason: waits.join("; "),
                grid: render_grid(s, &marks),
            });
        }
    }
}

/// The rank x step grid of a schedule, one row per rank, with the actions
/// at `marks` (rank, step) in brackets: `rank1:  1F0  1F1 [1B3] ...`.
pub fn render_grid(s: &Schedule, marks: &[(usize, usize)]) -> String {
    let steps = s.actions.iter().map(Vec::len).max().unwrap_or(0);
    let cell = |r: usize, i: usize| -> String {
        let text = s
            .actions
            .get(r)
            .and_then(|row| row.get(i))
            .and_then(|a| a.map(|a| a.to_string()))
            .unwrap_or_else(|| ".".into());
        if marks.contains(&(r, i)) {
            format!("[{text}]")
        } else {
            format!(" {text} ")
        }
    };
    let width = (0..s.ranks())
        .flat_map(|r| (0..steps).map(move |i| (r, i)))
        .map(|(r, i)| cell(r, i).len())
        .chain([format!("{}", steps.saturating_sub(1)).len() + 2])
        .max()
        .unwrap_or(5);
    let label = format!("rank{}:", s.ranks().saturating_sub(1)).len() + 1;
    let mut out = format!("{:label$}", "step");
    let cols: Vec<String> = (0..steps).map(|i| format!("{:^width$}", i)).collect();
    out.push_str(cols.join(" ").trim_end());
    out.push('\n');
    for r in 0..s.ranks() {
        out.push_str(&format!("{:label$}", format!("rank{r}:")));
        let cols: Vec<String> = (0..steps)
            .map(|i| format!("{:^width$}", cell(r, i)))
            .collect();
        out.push_str(cols.join(" ").trim_end());
        out.push('\n');
    }
    out
}

/// The most microbatches each rank holds activations for at once: a forward
/// adds one, and the pass that ends the microbatch on that stage (`B`, or
/// `W` when the backward is split, since the weight gradient still reads
/// the stage's inputs) releases it. GPipe holds M; 1F1B at most S - rank;
/// ZB-H1 S on every rank.
pub fn peak_in_flight(s: &Schedule) -> Vec<usize> {
    s.actions
        .iter()
        .map(|row| {
            let (mut now, mut peak) = (0usize, 0usize);
            for a in row.iter().flatten() {
                match a.kind {
                    ActionKind::F => {
                        now += 1;
                        peak = peak.max(now);
                    }
                    ActionKind::B | ActionKind::W => now = now.saturating_sub(1),
                    ActionKind::I => {}
                }
            }
            peak
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{generate, ScheduleKind};
    use super::*;

    /// A schedule from one text row per rank (`.` for an idle step).
    fn sched(rows: &[&str], stages: usize, m: usize) -> Schedule {
        let actions: Vec<Vec<Option<Action>>> = rows
            .iter()
            .map(|r| {
                r.split_whitespace()
                    .map(|c| {
                        if c == "." {
                            None
                        } else {
                            Some(c.parse().unwrap())
                        }
                    })
                    .collect()
            })
            .collect();
        let ranks = actions.len();
        Schedule {
            name: "test".into(),
            num_stages: stages,
            microbatches: m,
            stage_to_rank: (0..stages).map(|s| s % ranks).collect(),
            actions,
        }
    }

    fn err(s: &Schedule) -> String {
        validate(s).unwrap_err().to_string()
    }

    #[test]
    fn a_correct_hand_written_schedule_passes() {
        let s = sched(&["0F0 0F1 . 0B0 0B1", "1F0 1F1 1B0 1B1"], 2, 2);
        validate(&s).unwrap();
    }

    #[test]
    fn a_duplicate_forward_is_refused_and_marked() {
        let s = sched(&["0F0 0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"], 2, 2);
        let e = err(&s);
        assert!(e.contains("0F0 runs 2 times"), "{e}");
        assert!(e.contains("[0F0]"), "{e}");
    }

    #[test]
    fn a_missing_backward_is_refused() {
        let s = sched(&["0F0 0F1 0B0 0B1", "1F0 1F1 1B0"], 2, 2);
        let e = err(&s);
        // Stage 0's 0B1 waits for a gradient stage 1 never sends.
        assert!(e.contains("0B1 receives a gradient from stage 1"), "{e}");
        let s = sched(&["0F0 0F1 0B0", "1F0 1F1 1B0 1B1"], 2, 2);
        let e = err(&s);
        assert!(e.contains("1B1 sends its input gradient to stage 0"), "{e}");
        assert!(e.contains("[1B1]"), "{e}");
        let s = sched(&["0F0 0B0"], 1, 2);
        assert!(err(&s).contains("never runs 0F1"), "{}", err(&s));
        let s = sched(&["0F0 0F1 0B0"], 1, 2);
        assert!(err(&s).contains("never runs a backward of microbatch 1"));
    }

    #[test]
    fn split_backward_needs_both_halves_and_not_b() {
        let s = sched(&["0F0 0I0"], 1, 1);
        assert!(err(&s).contains("never runs 0W0"), "{}", err(&s));
        let s = sched(&["0F0 0B0 0W0"], 1, 1);
        assert!(err(&s).contains("both whole (B) and split"), "{}", err(&s));
    }

    #[test]
    fn backward_before_forward_is_refused_and_marked() {
        let s = sched(&["0F0 0F1 0B0 0B1", "1B0 1F0 1F1 1B1"], 2, 2);
        let e = err(&s);
        assert!(e.contains("1B0 runs before 1F0"), "{e}");
        assert!(e.contains("[1B0]") && e.contains("[1F0]"), "{e}");
        let s = sched(&["0F0 0W0 0I0"], 1, 1);
        assert!(err(&s).contains("0W0 runs before 0I0"), "{}", err(&s));
    }

    #[test]
    fn a_send_without_its_receive_is_refused() {
        // Stage 1 never runs the forward of microbatch 1 that stage 0 sends it.
        let s = sched(&["0F0 0F1 0B0", "1F0 1B0"], 2, 2);
        let e = err(&s);
        assert!(
            e.contains("0F1 sends its activation to stage 1 on rank 1, which never receives it"),
            "{e}"
        );
        assert!(e.contains("[0F1]"), "{e}");
    }

    #[test]
    fn actions_on_the_wrong_rank_or_out_of_range_are_refused() {
        let s = sched(&["0F0 1F0 1B0 0B0", "."], 2, 1);
        assert!(err(&s).contains("rank 0 runs 1F0, but stage 1 is held by rank 1"));
        let s = sched(&["0F0 0B0 0F3"], 1, 1);
        assert!(err(&s).contains("names microbatch 3 of 1"));
    }

    #[test]
    fn a_deadlock_is_found_and_each_waiting_action_marked() {
        // Stage 0 waits for 0B0's gradient before it sends 0F1; stage 1 needs 1F1 first.
        let s = sched(&["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"], 2, 2);
        let e = validate(&s).unwrap_err();
        assert!(matches!(e, ScheduleError::Deadlock { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("rank 0 waits at 0B0 for 1B0/1I0 on rank 1"),
            "{e}"
        );
        assert!(e.contains("rank 1 waits at 1F1 for 0F1 on rank 0"), "{e}");
        assert!(e.contains("[0B0]") && e.contains("[1F1]"), "{e}");
    }

    #[test]
    fn sends_never_block_so_crossed_sends_pass() {
        // Both ranks send before they receive: fine with buffered sends.
        let s = sched(&["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], 2, 2);
        validate(&s).unwrap();
    }

    #[test]
    fn the_grid_shows_idle_steps_and_marks() {
        let s = sched(&["0F0 . 0B0", "1F0 1B0"], 2, 1);
        let g = render_grid(&s, &[(1, 1)]);
        let lines: Vec<&str> = g.lines().collect();
        assert_eq!(lines.len(), 3, "{g}");
        assert!(
            lines[1].starts_with("rank0:") && lines[1].contains(" . "),
            "{g}"
        );
        assert!(lines[2].contains("[1B0]"), "{g}");
    }

    #[test]
    fn interleaved_on_one_rank_is_still_valid() {
        let s = generate(ScheduleKind::Interleaved, 1, 3, 3).unwrap();
        validate(&s).unwrap();
    }
}
