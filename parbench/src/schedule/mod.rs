//! Pipeline schedules as data: one list of actions per rank, in PyTorch
//! pipelining's text form (`2F0`, `1B3`, `1I3`, `1W3`).
//!
//! The same [`Schedule`] is generated ([`generate`]), loaded from or saved to
//! PyTorch's compute-only CSV ([`load_csv`], [`save_csv`]), checked
//! ([`validate`]), simulated ([`crate::model::sim`]), executed by
//! `bench-pipeline`, and drawn by the report.
//!
//! Communication is implicit, as in PyTorch's compute-only form: a forward on
//! stage `s` (not the last) sends its output activation to the rank of stage
//! `s + 1`; a backward (`B` or `I`) on stage `s > 0` sends the gradient of its
//! input to the rank of stage `s - 1`. Between stages on the same rank
//! nothing crosses a wire. [`Schedule::input_of`] and [`Schedule::output_of`]
//! say which message an action needs and which it produces.

mod csv_file;
mod generate;
mod looped;
mod registry;
mod v_shape;
mod validate;

pub use csv_file::{load_csv, parse_csv, save_csv, to_csv};
pub use registry::{
    Accepts, BubbleSchedule, Generator, Placement, ScheduleEntry, ScheduleKind, SCHEDULES,
};
pub use validate::{peak_in_flight, render_grid, validate};

use std::fmt;
use std::str::FromStr;

/// What an action computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ActionKind {
    /// Forward of one microbatch through one stage.
    F,
    /// Full backward: input gradient and weight gradient together.
    B,
    /// Input-gradient half of the backward (on the critical path).
    I,
    /// Weight-gradient half of the backward (off the critical path).
    W,
}

impl ActionKind {
    /// The letter of the text form.
    pub fn letter(self) -> char {
        match self {
            ActionKind::F => 'F',
            ActionKind::B => 'B',
            ActionKind::I => 'I',
            ActionKind::W => 'W',
        }
    }

    /// Every kind, in the order tables list them.
    pub const ALL: [ActionKind; 4] = [ActionKind::F, ActionKind::B, ActionKind::I, ActionKind::W];

    /// Position in [`ActionKind::ALL`], for per-kind arrays.
    pub fn index(self) -> usize {
        match self {
            ActionKind::F => 0,
            ActionKind::B => 1,
            ActionKind::I => 2,
            ActionKind::W => 3,
        }
    }

    /// Whether this is a backward that produces the input gradient (`B` or `I`).
    pub fn is_input_backward(self) -> bool {
        matches!(self, ActionKind::B | ActionKind::I)
    }
}

/// One computation: `stage` runs `kind` on microbatch `mb`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Action {
    pub stage: usize,
    pub kind: ActionKind,
    pub mb: usize,
}

impl Action {
    /// An action (shorthand for generators and tests).
    pub fn new(stage: usize, kind: ActionKind, mb: usize) -> Self {
        Action { stage, kind, mb }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.stage, self.kind.letter(), self.mb)
    }
}

impl FromStr for Action {
    type Err = String;
    /// Parses `[stage][F|B|I|W][microbatch]`, e.g. `2F0`, surrounding spaces allowed.
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let bad = || {
            format!("invalid action '{t}': expected [stage][F|B|I|W][microbatch], e.g. 2F0 or 1W3")
        };
        let pos = t
            .find(|c: char| !c.is_ascii_digit())
            .filter(|&p| p > 0)
            .ok_or_else(bad)?;
        let (stage, rest) = t.split_at(pos);
        let mut chars = rest.chars();
        let kind = match chars.next() {
            Some('F') => ActionKind::F,
            Some('B') => ActionKind::B,
            Some('I') => ActionKind::I,
            Some('W') => ActionKind::W,
            _ => return Err(bad()),
        };
        let mb = chars.as_str();
        if mb.is_empty() || !mb.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        Ok(Action {
            stage: stage.parse().map_err(|_| bad())?,
            kind,
            mb: mb.parse().map_err(|_| bad())?,
        })
    }
}

/// Checks a schedule's size against the stated limits
/// ([`crate::limits::MAX_PIPELINE_RANKS`], [`crate::limits::MAX_STAGES`],
/// [`crate::limits::MAX_MICROBATCHES`], [`crate::limits::MAX_ACTIONS`])
/// before anything is built from it; the error says which limit.
pub fn check_limits(
    ranks: usize,
    stages: usize,
    microbatches: usize,
    actions: usize,
) -> Result<(), String> {
    use crate::limits::{MAX_ACTIONS, MAX_MICROBATCHES, MAX_PIPELINE_RANKS, MAX_STAGES};
    if ranks > MAX_PIPELINE_RANKS {
        return Err(format!(
            "{ranks} ranks: at most {MAX_PIPELINE_RANKS} stage ranks"
        ));
    }
    if stages > MAX_STAGES {
        return Err(format!("{stages} stages: at most {MAX_STAGES}"));
    }
    if microbatches > MAX_MICROBATCHES {
        return Err(format!(
            "{microbatches} microbatches: at most {MAX_MICROBATCHES}"
        ));
    }
    if actions > MAX_ACTIONS {
        return Err(format!(
            "{actions} actions: at most {MAX_ACTIONS} over all ranks"
        ));
    }
    Ok(())
}

/// A message between stages, named by the action that produces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    /// The output activation of stage `stage`'s forward of `mb` (to stage + 1).
    Activation { stage: usize, mb: usize },
    /// The input gradient of stage `stage`'s backward of `mb` (to stage - 1).
    Gradient { stage: usize, mb: usize },
}

/// A schedule: for each rank, the actions it runs, in order.
///
/// `None` entries are idle steps, as in PyTorch's lock-step grids and CSV
/// files; executors and the simulator skip them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Name as recorded (a registry name such as `1f1b` or `zb-v`, or `csv:<file>`).
    pub name: String,
    /// Number of stages (S x v for interleaved schedules).
    pub num_stages: usize,
    /// Number of microbatches.
    pub microbatches: usize,
    /// `stage_to_rank[s]` is the rank that holds stage `s`.
    pub stage_to_rank: Vec<usize>,
    /// `actions[rank]`: that rank's actions, in order.
    pub actions: Vec<Vec<Option<Action>>>,
}

impl Schedule {
    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.actions.len()
    }

    /// Stages per rank (`v` of interleaved schedules; 1 otherwise).
    pub fn chunks(&self) -> usize {
        let r = self.ranks().max(1);
        self.num_stages.div_ceil(r).max(1)
    }

    /// The stages rank `rank` holds, in increasing order.
    pub fn stages_of(&self, rank: usize) -> Vec<usize> {
        (0..self.num_stages)
            .filter(|&s| self.stage_to_rank.get(s) == Some(&rank))
            .collect()
    }

    /// The rank of stage `stage`, if the stage exists.
    pub fn rank_of(&self, stage: usize) -> Option<usize> {
        self.stage_to_rank.get(stage).copied()
    }

    /// Whether `stage` is the last one (its forward feeds the loss).
    pub fn is_last(&self, stage: usize) -> bool {
        stage + 1 == self.num_stages
    }

    /// The message `action` needs before it can run, and the stage that sends it.
    /// `W` needs none; neither does the first stage's forward or the last stage's
    /// backward (which starts from the loss of its own forward).
    pub fn input_of(&self, a: Action) -> Option<(Message, usize)> {
        match a.kind {
            ActionKind::F if a.stage > 0 => Some((
                Message::Activation {
                    stage: a.stage - 1,
                    mb: a.mb,
                },
                a.stage - 1,
            )),
            ActionKind::B | ActionKind::I if !self.is_last(a.stage) => Some((
                Message::Gradient {
                    stage: a.stage + 1,
                    mb: a.mb,
                },
                a.stage + 1,
            )),
            _ => None,
        }
    }

    /// The message `action` sends when it ends, and the stage that receives it.
    pub fn output_of(&self, a: Action) -> Option<(Message, usize)> {
        match a.kind {
            ActionKind::F if !self.is_last(a.stage) => Some((
                Message::Activation {
                    stage: a.stage,
                    mb: a.mb,
                },
                a.stage + 1,
            )),
            ActionKind::B | ActionKind::I if a.stage > 0 => Some((
                Message::Gradient {
                    stage: a.stage,
                    mb: a.mb,
                },
                a.stage - 1,
            )),
            _ => None,
        }
    }

    /// The messages rank `from` sends to rank `to`, in the order it sends them.
    /// Receivers use this to know what the k-th message on a link is, since
    /// links deliver in order and carry no tags.
    pub fn link_order(&self, from: usize, to: usize) -> Vec<Message> {
        let Some(row) = self.actions.get(from) else {
            return Vec::new();
        };
        row.iter()
            .flatten()
            .filter_map(|&a| self.output_of(a))
            .filter(|&(_, dst)| self.rank_of(dst) == Some(to))
            .map(|(m, _)| m)
            .collect()
    }

    /// Every action of every rank, without idle steps.
    pub fn compute_actions(&self, rank: usize) -> Vec<Action> {
        self.actions
            .get(rank)
            .map(|row| row.iter().flatten().copied().collect())
            .unwrap_or_default()
    }

    /// Whether the schedule splits backwards into `I` and `W`.
    pub fn splits_backward(&self) -> bool {
        self.actions
            .iter()
            .flatten()
            .flatten()
            .any(|a| matches!(a.kind, ActionKind::I | ActionKind::W))
    }
}

/// What can be wrong with a schedule or its file.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The generator cannot build this schedule (bad S, M or v).
    #[error("cannot generate {schedule}: {reason}")]
    Generate {
        schedule: &'static str,
        reason: String,
    },
    /// A file or cell does not parse.
    #[error("{path}: {detail}")]
    Parse { path: String, detail: String },
    /// Reading or writing a file failed.
    /// The OS error is printed, not chained as a source (a report of the
    /// chain would print it twice).
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    /// The schedule breaks a rule; `grid` shows it with the offending actions in brackets.
    #[error("invalid schedule {name}: {reason}\n{grid}")]
    Invalid {
        name: String,
        reason: String,
        grid: String,
    },
    /// The schedule cannot finish: every unfinished rank waits for a message never sent.
    #[error("schedule {name} deadlocks: {reason}\n{grid}")]
    Deadlock {
        name: String,
        reason: String,
        grid: String,
    },
}

/// Generates `kind` for `ranks` ranks, `microbatches` microbatches and
/// `chunks` stages per rank: the user's `v` for the looped schedules
/// (interleaved, looped-bfs, interleaved-zb); the V schedules take their
/// two whatever `chunks` says, the others one.
pub fn generate(
    kind: ScheduleKind,
    ranks: usize,
    microbatches: usize,
    chunks: usize,
) -> Result<Schedule, ScheduleError> {
    let fail = |reason: String| ScheduleError::Generate {
        schedule: kind.name(),
        reason,
    };
    if ranks == 0 {
        return Err(fail("needs at least one stage".into()));
    }
    if microbatches == 0 {
        return Err(fail("needs at least one microbatch".into()));
    }
    if chunks == 0 {
        return Err(fail("needs at least one chunk per rank".into()));
    }
    if kind.placement() == registry::Placement::One && chunks != 1 {
        return Err(fail(format!(
            "takes one stage per rank; --chunks {chunks} applies to the looped schedules only"
        )));
    }
    let per_rank = kind.stages_per_rank(chunks);
    // Forward and backward (three actions with a split backward) of every
    // microbatch on every stage, in u128: checked before anything is built.
    let stages = (ranks as u128) * (per_rank as u128);
    let actions = stages * (microbatches as u128) * 3;
    let clamp = |v: u128| usize::try_from(v).unwrap_or(usize::MAX);
    check_limits(ranks, clamp(stages), microbatches, clamp(actions)).map_err(fail)?;
    (kind.entry().accepts)(ranks, microbatches, per_rank).map_err(fail)?;
    let rows = (kind.entry().generate)(ranks, microbatches, per_rank);
    let num_stages = ranks * per_rank;
    let placement = kind.placement();
    Ok(Schedule {
        name: kind.name().to_string(),
        num_stages,
        microbatches,
        stage_to_rank: (0..num_stages)
            .map(|s| placement.rank_of(s, ranks, per_rank).unwrap_or(0))
            .collect(),
        actions: rows
            .into_iter()
            .map(|row| row.into_iter().map(Some).collect())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_round_trip_through_text() {
        for s in ["0F0", "2F0", "1B3", "1I3", "1W3", "12F105"] {
            let a: Action = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
        let a: Action = " 3W7 ".parse().unwrap();
        assert_eq!(a, Action::new(3, ActionKind::W, 7));
    }

    #[test]
    fn malformed_actions_are_refused() {
        for s in [
            "", "F0", "0X1", "0F", "0F1x", "-1F0", "0UNSHARD", "1SEND_F0",
        ] {
            assert!(s.parse::<Action>().is_err(), "{s} parsed");
        }
    }

    #[test]
    fn messages_follow_the_stage_chain() {
        let s = generate(ScheduleKind::Interleaved, 2, 4, 2).unwrap();
        assert_eq!(s.num_stages, 4);
        assert_eq!(s.stage_to_rank, vec![0, 1, 0, 1]);
        let f = Action::new(1, ActionKind::F, 2);
        assert_eq!(
            s.input_of(f),
            Some((Message::Activation { stage: 0, mb: 2 }, 0))
        );
        assert_eq!(
            s.output_of(f),
            Some((Message::Activation { stage: 1, mb: 2 }, 2))
        );
        assert_eq!(s.input_of(Action::new(3, ActionKind::B, 0)), None);
        assert_eq!(s.output_of(Action::new(0, ActionKind::B, 0)), None);
        assert_eq!(s.output_of(Action::new(3, ActionKind::W, 0)), None);
        // Rank 0 sends to rank 1 the activations of stages 0 and 2 and the gradients of stage 2.
        let link = s.link_order(0, 1);
        assert_eq!(link.len(), 4 * 2 + 4);
    }
}
