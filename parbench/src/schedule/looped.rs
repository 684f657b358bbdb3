//! The looped schedules PyTorch adds to interleaved 1F1B, stage `s` on
//! rank `s % R`, `v` stages per rank, action for action as
//! `torch.distributed.pipelining` builds them (checked against its own
//! output: `parbench/tests/pytorch_schedules.rs`).
//!
//! - Looped BFS (`ScheduleLoopedBFS`; Lamy-Poirier 2023, "Breadth-First
//!   Pipeline Parallelism"): every microbatch's forward through the rank's
//!   first stage, then its next stage, and so on; then the backwards, last
//!   stage first and, as PyTorch orders them, the last microbatch first.
//! - Interleaved zero bubble (`ScheduleInterleavedZeroBubble`, PyTorch's
//!   ZB1P): interleaved 1F1B's order with one warm-up forward per hop
//!   instead of two, the backward split into `I` and `W`, and rank `r`
//!   holding back its first `r` weight passes, as ZB-H1 does.

use super::generate::per_rank;
use super::{Action, ActionKind};

pub(super) fn looped_bfs(r: usize, m: usize, v: usize) -> Vec<Vec<Action>> {
    per_rank(r, |rank| {
        let stages: Vec<usize> = (0..v).map(|c| c * r + rank).collect();
        let forwards = stages
            .iter()
            .flat_map(|&s| (0..m).map(move |mb| Action::new(s, ActionKind::F, mb)));
        let backwards = stages.iter().rev().flat_map(|&s| {
            (0..m)
                .rev()
                .map(move |mb| Action::new(s, ActionKind::B, mb))
        });
        forwards.chain(backwards).collect()
    })
}

/// PyTorch runs microbatches in `max(1, M / R)` rounds and needs M to
/// split into whole rounds.
fn rounds(r: usize, m: usize) -> usize {
    (m / r).max(1)
}

pub(super) fn interleaved_zb_accepts(r: usize, m: usize, _: usize) -> Result<(), String> {
    let rounds = rounds(r, m);
    if !m.is_multiple_of(rounds) {
        return Err(format!(
            "PyTorch's interleaved zero bubble runs M in max(1, M / R) = {rounds} rounds of equal size: \
             M = {m} is not a multiple of {rounds}"
        ));
    }
    Ok(())
}

pub(super) fn interleaved_zb(r: usize, m: usize, v: usize) -> Vec<Vec<Action>> {
    let per_round = m / rounds(r, m);
    per_rank(r, |rank| zb1p_row(rank, r, m, v, per_round))
}

/// One rank's row of PyTorch's interleaved zero bubble: `op` counts the
/// rank's forward slots; the stage of the k-th forward or backward slot
/// cycles through the rank's chunks every `per_round` slots.
fn zb1p_row(rank: usize, r: usize, m: usize, v: usize, per_round: usize) -> Vec<Action> {
    let total = m * v;
    let warmup = ((v - 1) * per_round + (r - 1 - rank)).min(total);
    let forward_stage = |op: usize| ((op / per_round) % v) * r + rank;
    let backward_stage = |op: usize| (v - 1 - ((op - warmup) / per_round) % v) * r + rank;
    // Next microbatch per stage, for each kind.
    let mut next = vec![[0usize; 3]; v * r];
    let mut take = |stage: usize, kind: ActionKind, slot: usize| {
        let mb = next[stage][slot];
        next[stage][slot] += 1;
        Action::new(stage, kind, mb)
    };
    let mut out = Vec::with_capacity(3 * total);
    let mut backward_ops: Vec<usize> = Vec::with_capacity(total);
    let mut weights_done = 0;
    for op in 0..total + warmup {
        if op < total {
            out.push(take(forward_stage(op), ActionKind::F, 0));
        }
        if op >= warmup {
            out.push(take(backward_stage(op), ActionKind::I, 1));
            backward_ops.push(op);
            if op - warmup >= rank {
                let stage = backward_stage(backward_ops[weights_done]);
                out.push(take(stage, ActionKind::W, 2));
                weights_done += 1;
            }
        }
    }
    for &op in &backward_ops[weights_done..] {
        out.push(take(backward_stage(op), ActionKind::W, 2));
    }
    out
}
