//! The schedules on the V placement (rank `r` holds stages `r` and
//! `2R-1-r`, so a microbatch goes down the ranks and back up, and the
//! first and last stages share rank 0), action for action as
//! `torch.distributed.pipelining` builds them (checked against its own
//! output: `parbench/tests/pytorch_schedules.rs`).
//!
//! - ZB-V (`ScheduleZBVZeroBubble`; Qi et al. 2024, "Zero Bubble Pipeline
//!   Parallelism", section 6): zero bubble when F, I and W take the same
//!   time, with 1F1B's peak activations.
//! - DualPipeV (`ScheduleDualPipeV`; DeepSeek-V3's DualPipe cut in half, as
//!   the DualPipe repository's `DualPipeV`): forwards of one stage paired
//!   with backwards of the other, the last backwards split into `I` and `W`.
//!   PyTorch marks each pair as one `OVERLAP_F_B` action and runs it as its
//!   forward, then its backward, unless a custom function overlaps them;
//!   here the pair is those two actions in that order.

use super::generate::per_rank;
use super::{Action, ActionKind};
use std::collections::VecDeque;

pub(super) fn zb_v(r: usize, m: usize, _: usize) -> Vec<Vec<Action>> {
    per_rank(r, |rank| zb_v_row(rank, r, m))
}

/// Appends `stage`'s `kind` of microbatch `*next`, and counts it.
fn push(out: &mut Vec<Action>, stage: usize, kind: ActionKind, next: &mut usize) {
    out.push(Action::new(stage, kind, *next));
    *next += 1;
}

/// One rank's row of PyTorch's ZB-V. It is built for at least `2R - 1`
/// microbatches and the actions of microbatches past `M` are dropped, as
/// PyTorch does.
fn zb_v_row(rank: usize, r: usize, m: usize) -> Vec<Action> {
    use ActionKind::{F, I, W};
    let n = m.max(2 * r - 1);
    let (s0, s1) = (rank, 2 * r - 1 - rank);
    let mut out = Vec::new();
    // Next forward and next backward of each leg.
    let (mut f0, mut f1, mut b0, mut b1) = (0, 0, 0, 0);
    // A backward whole: its input and weight halves together.
    let split_backward = |out: &mut Vec<Action>, stage, next: &mut usize| {
        out.push(Action::new(stage, I, *next));
        push(out, stage, W, next);
    };
    // Warm-up: forwards down the first leg, then both legs in turn, then
    // the second leg's first backwards.
    for _ in 0..2 * (r - rank) - 1 {
        push(&mut out, s0, F, &mut f0);
    }
    for _ in 0..rank {
        push(&mut out, s1, F, &mut f1);
        push(&mut out, s0, F, &mut f0);
    }
    for _ in 0..r - rank {
        push(&mut out, s1, F, &mut f1);
        split_backward(&mut out, s1, &mut b1);
    }
    // Steady state: one forward and one whole backward on each leg.
    while f1 < f0 || f0 < n {
        if f0 < n {
            push(&mut out, s0, F, &mut f0);
        }
        split_backward(&mut out, s0, &mut b0);
        push(&mut out, s1, F, &mut f1);
        split_backward(&mut out, s1, &mut b1);
    }
    // Cool-down: input gradients first, the weight passes they leave after.
    let (mut w0, w1) = (b0, b1);
    for _ in 0..rank {
        push(&mut out, s0, I, &mut b0);
        push(&mut out, s1, I, &mut b1);
    }
    for _ in 0..r - rank {
        push(&mut out, s0, I, &mut b0);
        push(&mut out, s0, W, &mut w0);
    }
    out.extend((w1..b1).map(|mb| Action::new(s1, W, mb)));
    out.extend((w0..b0).map(|mb| Action::new(s0, W, mb)));
    out.retain(|a| a.mb < m);
    out
}

pub(super) fn dualpipe_v_accepts(r: usize, m: usize, _: usize) -> Result<(), String> {
    if m < 2 * r {
        return Err(format!(
            "DualPipeV needs at least as many microbatches as stages: M = {m} < 2R = {}",
            2 * r
        ));
    }
    Ok(())
}

pub(super) fn dualpipe_v(r: usize, m: usize, _: usize) -> Vec<Vec<Action>> {
    per_rank(r, |rank| DualPipeRow::new(rank, r).build(m))
}

/// One rank's DualPipeV row as PyTorch counts it: the next microbatch of
/// each (stage, forward / input gradient / weight gradient), and the
/// weight passes that split backwards left, oldest first.
struct DualPipeRow {
    rank: usize,
    ranks: usize,
    s0: usize,
    s1: usize,
    next: [[usize; 3]; 2],
    pending_w: VecDeque<(usize, usize)>,
    out: Vec<Action>,
}

impl DualPipeRow {
    fn new(rank: usize, ranks: usize) -> Self {
        DualPipeRow {
            rank,
            ranks,
            s0: rank,
            s1: 2 * ranks - 1 - rank,
            next: [[0; 3]; 2],
            pending_w: VecDeque::new(),
            out: Vec::new(),
        }
    }

    fn leg(&self, stage: usize) -> usize {
        usize::from(stage != self.s0)
    }

    fn forward(&mut self, stage: usize) {
        let leg = self.leg(stage);
        self.out
            .push(Action::new(stage, ActionKind::F, self.next[leg][0]));
        self.next[leg][0] += 1;
    }

    /// A whole backward (`B`) or its input half (`I`, its `W` queued).
    fn backward(&mut self, stage: usize, split: bool) {
        let leg = self.leg(stage);
        let mb = self.next[leg][1];
        self.next[leg][1] += 1;
        if split {
            self.out.push(Action::new(stage, ActionKind::I, mb));
            self.pending_w.push_back((stage, mb));
        } else {
            self.out.push(Action::new(stage, ActionKind::B, mb));
            self.next[leg][2] += 1;
        }
    }

    fn weight_if_pending(&mut self) {
        if let Some((stage, mb)) = self.pending_w.pop_front() {
            self.out.push(Action::new(stage, ActionKind::W, mb));
            let leg = self.leg(stage);
            self.next[leg][2] += 1;
        }
    }

    /// PyTorch's overlapped pair: the forward, then the backward.
    fn pair(&mut self, forward: usize, backward: usize) {
        self.forward(forward);
        self.backward(backward, false);
    }

    fn build(mut self, m: usize) -> Vec<Action> {
        let (r, rank, s0, s1) = (self.ranks, self.rank, self.s0, self.s1);
        for _ in 0..2 * (r - rank - 1) {
            self.forward(s0);
        }
        for _ in 0..rank + 1 {
            self.forward(s0);
            self.forward(s1);
        }
        for _ in 0..r - rank - 1 {
            self.backward(s1, true);
            self.weight_if_pending();
            self.forward(s1);
        }
        // Main phase: both legs' pairs; the last rank does not overlap its
        // first so as to start the way back sooner.
        for i in 0..m + rank + 1 - 2 * r {
            if i == 0 && rank == r - 1 {
                self.forward(s0);
                self.backward(s1, false);
            } else {
                self.pair(s0, s1);
            }
            self.pair(s1, s0);
        }
        for _ in 0..r - rank - 1 {
            self.backward(s1, false);
            self.pair(s1, s0);
        }
        // The last backwards: the second half of them split (zero bubble),
        // odd ranks switching one backward earlier than even ones.
        let mut split = false;
        let last_backwards = rank + 1;
        let half = last_backwards / 2;
        for i in 0..last_backwards {
            if i == half && rank % 2 == 1 {
                split = true;
            }
            self.backward(s1, split);
            if i == half && rank % 2 == 0 {
                split = true;
            }
            self.backward(s0, split);
        }
        for _ in 0..r - rank - 1 {
            self.weight_if_pending();
            self.backward(s0, split);
        }
        for _ in 0..rank + 1 {
            self.weight_if_pending();
        }
        self.out
    }
}
