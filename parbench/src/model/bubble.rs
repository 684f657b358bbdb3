//! Closed forms of the pipeline bubble, for equal stages.
//!
//! `S` stages (one per rank), `M` microbatches per step. Sources:
//! GPipe (Huang et al. 2019) and 1F1B / PipeDream-Flush (Narayanan et al.
//! 2021, "Memory-efficient pipeline-parallel DNN training"): the bubble is
//! `(S-1)` forward-and-backward slots of a step of `M + S - 1` slots, so
//! `(S-1)/(S+M-1)` of the step, or `(S-1)/M` of the ideal (bubble-free)
//! time (Narayanan et al. SC21, section 2.2.1). Interleaved 1F1B with `v`
//! model chunks per rank (SC21, section 2.2.2): bubble `(S-1)(t_f+t_b)/v`,
//! `(1/v)(S-1)/M` of the ideal time. Looped BFS (Lamy-Poirier 2023,
//! "Breadth-First Pipeline Parallelism"): the same `(S-1)(t_f+t_b)/v` once
//! `M >= S`. Zero bubble (Qi et al., "Zero Bubble Pipeline Parallelism",
//! ICLR 2024): with the backward split
//! into `B` (input gradient) and `W` (weight gradient), 1F1B's bubble is
//! `(S-1)(T_F+T_B+T_W)`, ZB-H1's `(S-1)(T_F+T_B-T_W)`, ZB-H2's
//! `(S-1)(T_F+T_B-2T_W)`. PyTorch's interleaved zero bubble: ZB-H1's form
//! over `v` (no paper states the product; the simulator holds PyTorch's
//! order to it). ZB-V (Qi et al., section 6) and DualPipeV (the DualPipe
//! repository's README) have no bubble after the start when `T_F = T_B =
//! T_W` (their stated condition); a step then idles only while the first
//! leg of the V fills, `(S-1)` chunk forwards, `(S-1) T_F / 2` with `T_F` a
//! rank's two chunks. That is a lower bound at other times (the last rank
//! cannot start sooner, nor do less); the simulator gives the rest.
//!
//! Every function returns `None` for zero stages or microbatches rather
//! than dividing by zero. The schedule simulator (`model::sim`) gives the
//! bubble of unequal stages and of any concrete action list; these forms
//! are what it must agree with on equal stages.

pub use crate::schedule::BubbleSchedule;

/// Time of one microbatch's passes through one rank's stage, seconds (or
/// any unit). `b` is the input-gradient pass and `w` the weight-gradient
/// pass; a schedule that does not split the backward runs `b + w` as one
/// pass. For interleaved 1F1B these are the times through all `v` of a
/// rank's chunks (`v` times one chunk's); [`bubble_rate`] depends only on
/// their ratios, [`bubble_time`] on their values.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PassTimes {
    /// Forward, `T_F`.
    pub f: f64,
    /// Backward for the input gradient, `T_B`.
    pub b: f64,
    /// Backward for the weight gradients, `T_W`.
    pub w: f64,
}

impl PassTimes {
    /// One microbatch through one stage, forward and full backward.
    pub fn total(&self) -> f64 {
        self.f + self.b + self.w
    }
}

/// Bubble of GPipe and 1F1B as a fraction of the step: `(S-1)/(S+M-1)`.
/// 4 stages: 75% idle at M = 1, 43% at M = 4, 16% at M = 16.
pub fn bubble_fraction_of_step(stages: u64, micro: u64) -> Option<f64> {
    interleaved_bubble_fraction_of_step(stages, micro, 1)
}

/// Bubble of GPipe and 1F1B as a fraction of the ideal time: `(S-1)/M`
/// (Megatron's form; above 1 when the bubble exceeds the work).
pub fn bubble_fraction_of_ideal(stages: u64, micro: u64) -> Option<f64> {
    interleaved_bubble_fraction_of_ideal(stages, micro, 1)
}

/// Bubble of interleaved 1F1B with `v` chunks as a fraction of the ideal
/// time: `(1/v)(S-1)/M` (Narayanan et al. SC21).
pub fn interleaved_bubble_fraction_of_ideal(stages: u64, micro: u64, v: u64) -> Option<f64> {
    if stages == 0 || micro == 0 || v == 0 {
        return None;
    }
    Some((stages - 1) as f64 / (v as f64 * micro as f64))
}

/// Bubble of interleaved 1F1B as a fraction of the step:
/// `((S-1)/v) / (M + (S-1)/v) = (S-1)/(vM + S - 1)`.
pub fn interleaved_bubble_fraction_of_step(stages: u64, micro: u64, v: u64) -> Option<f64> {
    if stages == 0 || micro == 0 || v == 0 {
        return None;
    }
    let idle = (stages - 1) as f64;
    Some(idle / (v as f64 * micro as f64 + idle))
}

/// Bubble time of one step, in the unit of `passes` (Qi et al. 2024 for
/// the zero-bubble forms; Narayanan et al. SC21 for interleaved):
/// GPipe and 1F1B `(S-1)(T_F+T_B+T_W)`; interleaved and looped BFS
/// `(S-1)(T_F+T_B+T_W)/v`; ZB-H1 `(S-1)(T_F+T_B-T_W)` and interleaved zero
/// bubble that over `v`; ZB-H2 `(S-1)(T_F+T_B-2T_W)`, all floored at 0
/// (a W pass longer than the formula allows does not give negative idle time;
/// the paper's forms assume `T_W` no larger than that); ZB-V and DualPipeV
/// `(S-1) T_F / 2`, the V's first leg (exact at `T_F = T_B = T_W`, a lower
/// bound otherwise).
pub fn bubble_time(schedule: BubbleSchedule, stages: u64, passes: &PassTimes) -> Option<f64> {
    if stages == 0 {
        return None;
    }
    let idle = (stages - 1) as f64;
    let PassTimes { f, b, w } = *passes;
    let t = match schedule {
        BubbleSchedule::GPipe | BubbleSchedule::OneFOneB => idle * (f + b + w),
        BubbleSchedule::Interleaved { chunks: 0 } => return None,
        BubbleSchedule::Interleaved { chunks } => idle * (f + b + w) / chunks as f64,
        BubbleSchedule::ZbH1 => idle * (f + b - w),
        BubbleSchedule::ZbH2 => idle * (f + b - 2.0 * w),
        BubbleSchedule::LoopedBfs { chunks: 0 } | BubbleSchedule::InterleavedZb { chunks: 0 } => {
            return None
        }
        BubbleSchedule::LoopedBfs { chunks } => idle * (f + b + w) / chunks as f64,
        BubbleSchedule::InterleavedZb { chunks } => idle * (f + b - w) / chunks as f64,
        BubbleSchedule::ZbV | BubbleSchedule::DualPipeV => idle * f / 2.0,
    };
    Some(t.max(0.0))
}

/// Bubble rate of a step as Qi et al. report it: bubble / (bubble + ideal),
/// the ideal being `M (T_F+T_B+T_W)`. With equal passes and 1F1B it equals
/// [`bubble_fraction_of_step`].
pub fn bubble_rate(
    schedule: BubbleSchedule,
    stages: u64,
    micro: u64,
    passes: &PassTimes,
) -> Option<f64> {
    if micro == 0 {
        return None;
    }
    // Looped BFS waits for its next loop when the first cannot fill the pipeline.
    if matches!(schedule, BubbleSchedule::LoopedBfs { .. }) && micro < stages {
        return None;
    }
    let bubble = bubble_time(schedule, stages, passes)?;
    let total = bubble + micro as f64 * passes.total();
    (total > 0.0).then(|| bubble / total)
}

/// The fewest microbatches that keep `S` stages busy at least `busy` of the
/// step (0 < busy < 1) with GPipe/1F1B (`v = 1`) or interleaved 1F1B with
/// `v` chunks: the smallest `M` with `vM / (vM + S - 1) >= busy`, that is
/// `M >= busy (S-1) / (v (1-busy))`. 8 stages need 63 for 90%.
/// `None` for `busy` outside (0, 1) with more than one stage, or `v = 0`.
pub fn microbatches_for_utilisation(stages: u64, v: u64, busy: f64) -> Option<u64> {
    if stages == 0 || v == 0 || !busy.is_finite() {
        return None;
    }
    if stages == 1 {
        return Some(1);
    }
    if busy <= 0.0 {
        return Some(1);
    }
    if busy >= 1.0 {
        return None;
    }
    let exact = busy * (stages - 1) as f64 / (v as f64 * (1.0 - busy));
    if exact > 1e15 {
        return None;
    }
    // Round down a hair before the ceiling so 62.99999999999999 or
    // 63.00000000000001 (0.9 is not exact in binary) both give 63, then
    // step up until the target is met within rounding.
    let mut m = ((exact * (1.0 - 1e-12)).ceil() as u64).max(1);
    let tol = 1e-12;
    while 1.0 - interleaved_bubble_fraction_of_step(stages, m, v)? < busy - tol {
        m += 1;
    }
    Some(m)
}

/// Peak in-flight microbatch activations of stage `rank` under 1F1B (and
/// ZB-H1, which keeps 1F1B's memory): `min(S - rank, M)`, ranks from 0.
/// Stage 0 holds the most: `S` where GPipe holds `M`.
pub fn peak_activations_1f1b(stages: u64, micro: u64, rank: u64) -> Option<u64> {
    (rank < stages && micro > 0).then(|| (stages - rank).min(micro))
}

/// Peak in-flight microbatch activations on the busiest rank (stage 0), in
/// units of one microbatch's activations of one stage (`M_B` in Qi et al.;
/// with chunks, of one chunk): GPipe `M`; 1F1B and ZB-H1 `min(S, M)`; ZB-H2
/// `min(2S-1, M)`; looped BFS `v M` (every forward before any backward);
/// ZB-V `2 min(S, M)` chunks, 1F1B's memory (Qi et al. section 6); DualPipeV
/// `2S + 1` chunks (the DualPipe README's `PP + 1`, `PP = 2S` stages; it
/// needs `M >= 2S`). `None` for interleaved and interleaved zero bubble
/// (their memory depends on the chunk order: `schedule::peak_in_flight`
/// counts it) and for zero stages or microbatches.
pub fn peak_activations(schedule: BubbleSchedule, stages: u64, micro: u64) -> Option<u64> {
    if stages == 0 || micro == 0 {
        return None;
    }
    match schedule {
        BubbleSchedule::GPipe => Some(micro),
        BubbleSchedule::OneFOneB | BubbleSchedule::ZbH1 => peak_activations_1f1b(stages, micro, 0),
        BubbleSchedule::ZbH2 => Some((2 * stages - 1).min(micro)),
        BubbleSchedule::LoopedBfs { chunks } => micro.checked_mul(chunks),
        BubbleSchedule::ZbV => Some(2 * stages.min(micro)),
        BubbleSchedule::DualPipeV => (micro >= 2 * stages).then_some(2 * stages + 1),
        BubbleSchedule::Interleaved { .. } | BubbleSchedule::InterleavedZb { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(x: Option<f64>) -> f64 {
        (x.unwrap() * 100.0).round()
    }

    #[test]
    fn four_stages_published_figures() {
        assert_eq!(bubble_fraction_of_step(4, 1), Some(0.75));
        assert_eq!(pct(bubble_fraction_of_step(4, 4)), 43.0);
        assert_eq!(bubble_fraction_of_step(4, 4), Some(3.0 / 7.0));
        assert_eq!(pct(bubble_fraction_of_step(4, 16)), 16.0);
        assert_eq!(bubble_fraction_of_step(4, 16), Some(3.0 / 19.0));
        // Of the ideal time (Megatron): (S-1)/M.
        assert_eq!(bubble_fraction_of_ideal(4, 1), Some(3.0));
        assert_eq!(bubble_fraction_of_ideal(4, 16), Some(3.0 / 16.0));
        // One stage never idles.
        assert_eq!(bubble_fraction_of_step(1, 1), Some(0.0));
        assert_eq!(bubble_fraction_of_step(0, 4), None);
        assert_eq!(bubble_fraction_of_step(4, 0), None);
    }

    #[test]
    fn eight_stages_need_63_for_90_percent() {
        assert_eq!(microbatches_for_utilisation(8, 1, 0.9), Some(63));
        // 63 reaches 90% exactly; 62 falls short.
        assert!((1.0 - bubble_fraction_of_step(8, 63).unwrap() - 0.9).abs() < 1e-15);
        assert!(1.0 - bubble_fraction_of_step(8, 62).unwrap() < 0.9);
        // The 4-stage figures read backwards.
        assert_eq!(microbatches_for_utilisation(4, 1, 0.25), Some(1));
        assert_eq!(microbatches_for_utilisation(4, 1, 4.0 / 7.0), Some(4));
        assert_eq!(microbatches_for_utilisation(4, 1, 16.0 / 19.0), Some(16));
        // Interleaving with v = 2 halves the need (rounded up): 8 stages, 90%: 31.5 -> 32.
        assert_eq!(microbatches_for_utilisation(8, 2, 0.9), Some(32));
        assert_eq!(microbatches_for_utilisation(1, 1, 0.99), Some(1));
        assert_eq!(microbatches_for_utilisation(8, 1, 1.0), None);
        assert_eq!(microbatches_for_utilisation(8, 1, f64::NAN), None);
        assert_eq!(microbatches_for_utilisation(8, 0, 0.9), None);
        assert_eq!(microbatches_for_utilisation(8, 1, 1.0 - 1e-17), None);
    }

    #[test]
    fn interleaved_divides_by_v() {
        assert_eq!(
            interleaved_bubble_fraction_of_ideal(8, 16, 2),
            Some(7.0 / 32.0)
        );
        assert_eq!(
            interleaved_bubble_fraction_of_step(8, 16, 2),
            Some(7.0 / 39.0)
        );
        assert_eq!(
            interleaved_bubble_fraction_of_step(8, 16, 1),
            bubble_fraction_of_step(8, 16)
        );
        assert_eq!(interleaved_bubble_fraction_of_ideal(8, 16, 0), None);
        let p = PassTimes {
            f: 1.0,
            b: 1.0,
            w: 1.0,
        };
        let v4 = bubble_time(BubbleSchedule::Interleaved { chunks: 4 }, 8, &p).unwrap();
        assert_eq!(v4, 7.0 * 3.0 / 4.0);
        assert_eq!(
            bubble_time(BubbleSchedule::Interleaved { chunks: 0 }, 8, &p),
            None
        );
    }

    #[test]
    fn zero_bubble_forms() {
        let p = PassTimes {
            f: 3.0,
            b: 2.0,
            w: 1.5,
        };
        // 1F1B (S-1)(T_F+T_B+T_W) = 7 x 6.5; ZB-H1 7 x 3.5; ZB-H2 7 x 2.
        assert_eq!(bubble_time(BubbleSchedule::OneFOneB, 8, &p), Some(45.5));
        assert_eq!(bubble_time(BubbleSchedule::GPipe, 8, &p), Some(45.5));
        assert_eq!(bubble_time(BubbleSchedule::ZbH1, 8, &p), Some(24.5));
        assert_eq!(bubble_time(BubbleSchedule::ZbH2, 8, &p), Some(14.0));
        // T_F = T_B = T_W: ZB-H2 has no bubble at all.
        let eq = PassTimes {
            f: 1.0,
            b: 1.0,
            w: 1.0,
        };
        assert_eq!(bubble_time(BubbleSchedule::ZbH2, 8, &eq), Some(0.0));
        // A W longer than the form allows floors at 0.
        let long_w = PassTimes {
            f: 1.0,
            b: 1.0,
            w: 5.0,
        };
        assert_eq!(bubble_time(BubbleSchedule::ZbH2, 8, &long_w), Some(0.0));
        assert_eq!(bubble_time(BubbleSchedule::ZbH1, 0, &eq), None);
    }

    #[test]
    fn bubble_rate_of_1f1b_with_equal_passes_is_the_step_fraction() {
        let eq = PassTimes {
            f: 1.0,
            b: 1.0,
            w: 1.0,
        };
        let r = bubble_rate(BubbleSchedule::OneFOneB, 8, 24, &eq).unwrap();
        assert!((r - bubble_fraction_of_step(8, 24).unwrap()).abs() < 1e-15);
        // ZB-H1, S = 8, M = 24, equal passes: 7 / (7 + 72).
        let r = bubble_rate(BubbleSchedule::ZbH1, 8, 24, &eq).unwrap();
        assert!((r - 7.0 / 79.0).abs() < 1e-15);
        assert_eq!(bubble_rate(BubbleSchedule::ZbH1, 8, 0, &eq), None);
    }

    #[test]
    fn qi_setting_with_equal_passes() {
        // S = 8, M = 24 with T_F = T_B = T_W: what docs/model.md quotes
        // beside Qi et al.'s measured rates (which these need not match).
        let eq = PassTimes {
            f: 1.0,
            b: 1.0,
            w: 1.0,
        };
        let rate = |s| bubble_rate(s, 8, 24, &eq).unwrap();
        assert!((rate(BubbleSchedule::OneFOneB) - 21.0 / 93.0).abs() < 1e-15);
        let v2 = rate(BubbleSchedule::Interleaved { chunks: 2 });
        assert!((v2 - 10.5 / 82.5).abs() < 1e-15);
        assert_eq!((v2 * 1000.0).round(), 127.0);
        assert_eq!((rate(BubbleSchedule::ZbH1) * 1000.0).round(), 89.0);
        assert_eq!(rate(BubbleSchedule::ZbH2), 0.0);
        // The interleaved rate equals the interleaved step fraction.
        let f = interleaved_bubble_fraction_of_step(8, 24, 2).unwrap();
        assert!((v2 - f).abs() < 1e-15);
    }

    #[test]
    fn peak_activations_per_schedule() {
        assert_eq!(peak_activations(BubbleSchedule::GPipe, 4, 16), Some(16));
        assert_eq!(peak_activations(BubbleSchedule::OneFOneB, 4, 16), Some(4));
        assert_eq!(peak_activations(BubbleSchedule::ZbH1, 4, 16), Some(4));
        assert_eq!(peak_activations(BubbleSchedule::ZbH2, 4, 16), Some(7));
        // Fewer microbatches than stages: nobody holds more than M.
        assert_eq!(peak_activations(BubbleSchedule::OneFOneB, 8, 3), Some(3));
        assert_eq!(peak_activations(BubbleSchedule::ZbH2, 8, 10), Some(10));
        assert_eq!(
            peak_activations(BubbleSchedule::Interleaved { chunks: 2 }, 4, 16),
            None
        );
        // Per rank: S - rank.
        let per_rank: Vec<_> = (0..4)
            .map(|r| peak_activations_1f1b(4, 16, r).unwrap())
            .collect();
        assert_eq!(per_rank, [4, 3, 2, 1]);
        assert_eq!(peak_activations_1f1b(4, 16, 4), None);
        assert_eq!(peak_activations(BubbleSchedule::GPipe, 0, 16), None);
    }
}
