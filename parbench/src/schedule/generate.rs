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

use super::{Action, ActionKind};

/// Each rank's row from a function of the rank.
pub(super) fn per_rank(ranks: usize, row: impl Fn(usize) -> Vec<Action>) -> Vec<Vec<Action>> {
    (0..ranks).map(row).collect()
}

pub(super) fn gpipe(ranks: usize, m: usize, _: usize) -> Vec<Vec<Action>> {
    per_rank(ranks, |rank| {
        let f = (0..m).map(|i| Action::new(rank, ActionKind::F, i));
        let b = (0..m).map(|i| Action::new(rank, ActionKind::B, i));
        f.chain(b).collect()
    })
}

pub(super) fn one_f_one_b(s: usize, m: usize, _: usize) -> Vec<Vec<Action>> {
    per_rank(s, |rank| {
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
    })
}

pub(super) fn zb_h1(s: usize, m: usize, _: usize) -> Vec<Vec<Action>> {
    per_rank(s, |rank| zb_h1_row(rank, s, m))
}

fn zb_h1_row(rank: usize, s: usize, m: usize) -> Vec<Action> {
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

pub(super) fn interleaved_accepts(s: usize, m: usize, _: usize) -> Result<(), String> {
    if !m.is_multiple_of(s) {
        return Err(format!(
            "Megatron's interleaved schedule runs microbatches in groups of S = {s}: \
             M = {m} must be a multiple of {s}"
        ));
    }
    Ok(())
}

pub(super) fn interleaved(s: usize, m: usize, v: usize) -> Vec<Vec<Action>> {
    per_rank(s, |rank| interleaved_row(rank, s, m, v))
}

fn interleaved_row(rank: usize, s: usize, m: usize, v: usize) -> Vec<Action> {
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
    use super::super::{generate, peak_in_flight, validate, Schedule, ScheduleKind};

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
    fn peak_activations_match_their_closed_forms() {
        use crate::model::bubble::peak_activations;
        for kind in [
            ScheduleKind::LoopedBfs,
            ScheduleKind::ZbV,
            ScheduleKind::DualPipeV,
        ] {
            for r in 1..=6 {
                for m in 1..=14 {
                    let Ok(s) = generate(kind, r, m, 2) else {
                        continue;
                    };
                    let counted = peak_in_flight(&s).into_iter().max().unwrap() as u64;
                    let form = peak_activations(kind.closed_form(2), r as u64, m as u64);
                    assert_eq!(form, Some(counted), "{kind} R={r} M={m}");
                }
            }
        }
        // The sources' figures at R = 4, M = 8: ZB-V 1F1B's memory (2R chunks,
        // Qi et al.), DualPipeV PP + 1 with PP = 2R stages (DualPipe's README).
        let zbv = generate(ScheduleKind::ZbV, 4, 8, 2).unwrap();
        assert_eq!(peak_in_flight(&zbv), vec![8; 4]);
        let dpv = generate(ScheduleKind::DualPipeV, 4, 8, 2).unwrap();
        assert_eq!(peak_in_flight(&dpv), vec![9; 4]);
    }

    #[test]
    fn sizes_the_generators_refuse_say_why_in_one_line() {
        for (kind, r, m, v, want) in [
            (ScheduleKind::DualPipeV, 4, 6, 2, "M = 6 < 2R = 8"),
            (
                ScheduleKind::InterleavedZb,
                2,
                7,
                2,
                "M = 7 is not a multiple of 3",
            ),
            (ScheduleKind::Interleaved, 4, 6, 2, "multiple of 4"),
            (ScheduleKind::ZbV, 4, 8, 0, "at least one chunk"),
        ] {
            let e = generate(kind, r, m, v).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{kind}: {e}");
        }
        // The V schedules take two stages per rank whatever --chunks says.
        assert_eq!(generate(ScheduleKind::ZbV, 4, 8, 3).unwrap().num_stages, 8);
    }

    #[test]
    fn names_parse() {
        for k in ScheduleKind::ALL {
            assert_eq!(k.name().parse::<ScheduleKind>().unwrap(), k);
        }
        assert!("pipedream".parse::<ScheduleKind>().is_err());
    }
}
