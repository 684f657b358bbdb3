//! The schedules users know, generated as data.
//!
//! - GPipe (Huang et al. 2019): all forwards, then all backwards.
//! - 1F1B (PipeDream-Flush; Narayanan et al. 2021): `S - 1 - rank` warm-up
//!   forwards, then one forward and one backward in turn, then the remaining
//!   backwards; at most `S - rank` activations in flight.
//! - Interleaved 1F1B (Megatron-LM, Narayanan et al. SC21): `v` stages per
//!   rank, stage `s` on rank `s % S`, microbatches in groups of `S`; Megatron's
//!   warm-up count `2 (S - rank - 1) + (v - 1) S`.
//! - ZB-H1 (Qi et al. 2024): 1F1B with the backward split into `I` and `W`;
//!   rank `r` postpones its first `r` weight-gradient passes so that every
//!   rank holds `S` microbatches in flight and the deferred `W`s fill the
//!   drain bubble.

use super::registry::ScheduleKind;
use super::{Action, ActionKind, Schedule, ScheduleError};

/// Generates `kind` for `ranks` ranks, `microbatches` microbatches and
/// `chunks` stages per rank (only interleaved takes `chunks` > 1).
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
    if !kind.chunked() && chunks != 1 {
        return Err(fail(format!(
            "takes one stage per rank; --chunks {chunks} applies to interleaved only"
        )));
    }
    // Forward and backward (three actions with a split backward) of every
    // microbatch on every stage, in u128: checked before anything is built.
    let stages = (ranks as u128) * (chunks as u128);
    let actions = stages * (microbatches as u128) * 3;
    let clamp = |v: u128| usize::try_from(v).unwrap_or(usize::MAX);
    super::check_limits(ranks, clamp(stages), microbatches, clamp(actions)).map_err(fail)?;
    let rows: Vec<Vec<Action>> = match kind {
        ScheduleKind::GPipe => (0..ranks).map(|r| gpipe(r, microbatches)).collect(),
        ScheduleKind::OneFOneB => (0..ranks)
            .map(|r| one_f_one_b(r, ranks, microbatches))
            .collect(),
        ScheduleKind::ZbH1 => (0..ranks).map(|r| zb_h1(r, ranks, microbatches)).collect(),
        ScheduleKind::Interleaved => {
            if !microbatches.is_multiple_of(ranks) {
                return Err(fail(format!(
                    "Megatron's interleaved schedule runs microbatches in groups of S = {ranks}: \
                     M = {microbatches} must be a multiple of {ranks}"
                )));
            }
            (0..ranks)
                .map(|r| interleaved(r, ranks, microbatches, chunks))
                .collect()
        }
    };
    let num_stages = ranks * chunks;
    Ok(Schedule {
        name: kind.name().to_string(),
        num_stages,
        microbatches,
        stage_to_rank: (0..num_stages).map(|s| s % ranks).collect(),
        actions: rows
            .into_iter()
            .map(|row| row.into_iter().map(Some).collect())
            .collect(),
    })
}

fn gpipe(rank: usize, m: usize) -> Vec<Action> {
    let f = (0..m).map(|i| Action::new(rank, ActionKind::F, i));
    let b = (0..m).map(|i| Action::new(rank, ActionKind::B, i));
    f.chain(b).collect()
}

fn one_f_one_b(rank: usize, s: usize, m: usize) -> Vec<Action> {
    let warmup = (s - 1 - rank).min(m);
    let mut out: Vec<Action> = (0..warmup)
        .map(|i| Action::new(rank, ActionKind::F, i))
        .collect();
    for k in 0..m - warmup {
        out.push(Action::new(rank, ActionKind::F, warmup + k));
        out.push(Action::new(rank, ActionKind::B, k));
    }
    out.extend((m - warmup..m).map(|k| Action::new(rank, ActionKind::B, k)));
    out
}

fn zb_h1(rank: usize, s: usize, m: usize) -> Vec<Action> {
    let warmup = (s - 1 - rank).min(m);
    // Rank r defers its first r weight-gradient passes: with the warm-up
    // forwards that keeps S microbatches in flight on every rank.
    let deferred = rank;
    let mut out: Vec<Action> = (0..warmup)
        .map(|i| Action::new(rank, ActionKind::F, i))
        .collect();
    let mut next_w = 0;
    for k in 0..m - warmup {
        out.push(Action::new(rank, ActionKind::F, warmup + k));
        out.push(Action::new(rank, ActionKind::I, k));
        if k >= deferred {
            out.push(Action::new(rank, ActionKind::W, next_w));
            next_w += 1;
        }
    }
    // Drain: each I is followed by a deferred W, which fills the wait for
    // the next gradient; what is left runs at the end.
    for k in m - warmup..m {
        out.push(Action::new(rank, ActionKind::I, k));
        if next_w <= k {
            out.push(Action::new(rank, ActionKind::W, next_w));
            next_w += 1;
        }
    }
    out.extend((next_w..m).map(|k| Action::new(rank, ActionKind::W, k)));
    out
}

fn interleaved(rank: usize, s: usize, m: usize, v: usize) -> Vec<Action> {
    let total = m * v;
    let warmup = if m == s {
        total
    } else {
        (2 * (s - rank - 1) + (v - 1) * s).min(total)
    };
    // Unit k of the rank's forward order: chunks advance every S units,
    // microbatches come in groups of S.
    let unit = |k: usize, backward: bool| {
        let c = (k / s) % v;
        let chunk = if backward { v - 1 - c } else { c };
        let mb = (k / (s * v)) * s + k % s;
        (chunk * s + rank, mb)
    };
    let f = |k: usize| {
        let (stage, mb) = unit(k, false);
        Action::new(stage, ActionKind::F, mb)
    };
    let b = |k: usize| {
        let (stage, mb) = unit(k, true);
        Action::new(stage, ActionKind::B, mb)
    };
    let mut out: Vec<Action> = (0..warmup).map(f).collect();
    for i in 0..total - warmup {
        out.push(f(warmup + i));
        out.push(b(i));
    }
    out.extend((total - warmup..total).map(b));
    out
}

#[cfg(test)]
mod tests {
    use super::super::{peak_in_flight, validate};
    use super::*;

    fn row(s: &Schedule, r: usize) -> String {
        s.compute_actions(r)
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn gpipe_runs_all_forwards_then_all_backwards() {
        let s = generate(ScheduleKind::GPipe, 2, 3, 1).unwrap();
        assert_eq!(row(&s, 1), "1F0 1F1 1F2 1B0 1B1 1B2");
    }

    #[test]
    fn one_f_one_b_warms_up_s_minus_one_minus_rank() {
        let s = generate(ScheduleKind::OneFOneB, 4, 6, 1).unwrap();
        assert_eq!(
            row(&s, 0),
            "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5"
        );
        assert_eq!(
            row(&s, 3),
            "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5"
        );
    }

    #[test]
    fn interleaved_matches_megatron_order() {
        // S = 2, v = 2, M = 4: rank 0 holds stages 0 and 2; warm-up 2(2-0-1) + 2 = 4.
        let s = generate(ScheduleKind::Interleaved, 2, 4, 2).unwrap();
        assert_eq!(
            row(&s, 0),
            "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"
        );
        let err = generate(ScheduleKind::Interleaved, 4, 6, 2).unwrap_err();
        assert!(err.to_string().contains("multiple of 4"), "{err}");
    }

    #[test]
    fn zb_h1_defers_rank_many_weight_passes() {
        let s = generate(ScheduleKind::ZbH1, 3, 4, 1).unwrap();
        assert_eq!(
            row(&s, 0),
            "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3"
        );
        assert_eq!(
            row(&s, 2),
            "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3"
        );
    }

    #[test]
    fn every_generated_schedule_is_valid() {
        for kind in ScheduleKind::ALL {
            for stages in 1..=5 {
                for m in 1..=9 {
                    for v in 1..=3 {
                        let s = match generate(kind, stages, m, v) {
                            Ok(s) => s,
                            Err(_) => continue,
                        };
                        validate(&s).unwrap_or_else(|e| panic!("{kind} S={stages} M={m}: {e}"));
                    }
                }
            }
        }
    }

    #[test]
    fn peak_activations_match_the_papers() {
        let (st, m) = (4, 8);
        let g = generate(ScheduleKind::GPipe, st, m, 1).unwrap();
        assert_eq!(peak_in_flight(&g), vec![m; st]);
        let o = generate(ScheduleKind::OneFOneB, st, m, 1).unwrap();
        assert_eq!(peak_in_flight(&o), vec![4, 3, 2, 1]);
        let z = generate(ScheduleKind::ZbH1, st, m, 1).unwrap();
        assert_eq!(peak_in_flight(&z), vec![st; st]);
    }

    #[test]
    fn names_parse() {
        for k in ScheduleKind::ALL {
            assert_eq!(k.name().parse::<ScheduleKind>().unwrap(), k);
        }
        assert!("pipedream".parse::<ScheduleKind>().is_err());
    }
}
