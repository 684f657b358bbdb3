//! The rule for one figure: each side's rounds as a median, a noise and a
//! range ([`side`]), and the verdict on the two ([`judge`]); the parent
//! module picks the rounds and states the rule in full.

use super::{Figure, Verdict, Worse};
use std::collections::BTreeMap;

/// `(value - low) / value`, or 0 when the spread is not recorded.
pub(super) fn spread_below(low: f64, value: f64) -> f64 {
    let n = (value - low) / value.abs();
    if n.is_finite() && n > 0.0 {
        n
    } else {
        0.0
    }
}

/// (max - min) over `value`, or 0 when unknown.
fn spread(min: f64, max: f64, value: f64) -> f64 {
    let n = (max - min) / value.abs();
    if n.is_finite() && n > 0.0 {
        n
    } else {
        0.0
    }
}

fn median(v: &mut [f64]) -> f64 {
    parbench::stats::median(v).unwrap_or(f64::NAN)
}

/// One side of one figure: its rounds' values, median, noise and range.
#[derive(Clone, Debug)]
pub(super) struct Side {
    pub(super) rounds: usize,
    pub(super) median: f64,
    noise: f64,
    low: f64,
    high: f64,
    time_us: Option<f64>,
}

/// Aggregates the figures of one key on one side, one entry per (run, figure).
pub(super) fn side(figs: &[(String, Figure)]) -> Option<Side> {
    let mut by_run: BTreeMap<&str, Vec<&Figure>> = BTreeMap::new();
    for (run, f) in figs.iter().filter(|(_, f)| f.value.is_finite()) {
        by_run.entry(run.as_str()).or_default().push(f);
    }
    if by_run.is_empty() {
        return None;
    }
    let first = by_run.values().next()?.first()?.worse;
    let mut values: Vec<f64> = Vec::new();
    let mut times: Vec<f64> = Vec::new();
    let mut own: f64 = 0.0;
    for fs in by_run.values() {
        let mut v: Vec<f64> = fs.iter().map(|f| f.value).collect();
        values.push(median(&mut v));
        own = own.max(fs.iter().map(|f| f.noise).fold(0.0, f64::max));
        let mut t: Vec<f64> = fs.iter().filter_map(|f| f.time_us).collect();
        if !t.is_empty() {
            times.push(median(&mut t));
        }
    }
    let rounds = values.len();
    let med = median(&mut values.clone());
    let (low, high) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let noise = if rounds >= 2 {
        match first {
            Worse::HigherFraction | Worse::LowerFraction => high - low,
            _ => spread(low, high, med),
        }
    } else {
        own
    };
    Some(Side {
        rounds,
        median: med,
        noise,
        low,
        high,
        time_us: (!times.is_empty()).then(|| median(&mut times)),
    })
}

/// How much worse `cur` is than `base` (negative: better). Equal figures
/// (two zero communication times at TP = 1) have not changed; a ratio to
/// a zero baseline is not finite, and [`judge`] cannot judge it.
fn worse_by(worse: Worse, base: f64, cur: f64) -> f64 {
    if base == cur {
        return 0.0;
    }
    match worse {
        Worse::Higher => cur / base - 1.0,
        Worse::Lower => 1.0 - cur / base,
        Worse::HigherFraction => cur - base,
        Worse::LowerFraction => base - cur,
    }
}

/// Whether every round of `a` is worse than every round of `b`.
fn all_worse(worse: Worse, a: &Side, b: &Side) -> bool {
    match worse {
        Worse::Higher | Worse::HigherFraction => a.low > b.high,
        Worse::Lower | Worse::LowerFraction => a.high < b.low,
    }
}

/// The verdict of one figure under the module's rule.
pub(super) fn judge(
    worse: Worse,
    b: &Side,
    c: &Side,
    threshold: f64,
    floor_us: f64,
) -> (f64, f64, Option<f64>, Verdict) {
    let by = worse_by(worse, b.median, c.median);
    let noise = b.noise.max(c.noise);
    let dt = match (b.time_us, c.time_us) {
        (Some(x), Some(y)) => Some(y - x),
        _ => None,
    };
    let above_floor = dt.is_none_or(|d| d.abs() > floor_us);
    let rounds = b.rounds >= 2 && c.rounds >= 2;
    let verdict = if !by.is_finite() {
        Verdict::CannotJudge
    } else if by > threshold && by > noise && above_floor && (!rounds || all_worse(worse, c, b)) {
        Verdict::Regression
    } else if -by > threshold && -by > noise && above_floor && (!rounds || all_worse(worse, b, c)) {
        Verdict::Improvement
    } else {
        Verdict::Unchanged
    };
    (by, noise, dt, verdict)
}

/// One figure judged on some rounds: both sides, how much worse, the
/// noise, the time change and the verdict ([`judge`]).
pub(super) type Judged = (Side, Side, f64, f64, Option<f64>, Verdict);

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(value: f64, noise: f64) -> Figure {
        Figure {
            name: "time_us",
            value,
            worse: Worse::Higher,
            noise,
            time_us: Some(value),
        }
    }

    fn rounds(values: &[f64], noise: f64) -> Vec<(String, Figure)> {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| (format!("run{i}"), fig(v, noise)))
            .collect()
    }

    #[test]
    fn rounds_give_the_noise_one_round_its_own_spread() {
        let s = side(&rounds(&[100.0, 110.0, 90.0], 0.01)).unwrap();
        assert_eq!((s.median, s.rounds, s.low, s.high), (100.0, 3, 90.0, 110.0));
        assert!((s.noise - 0.2).abs() < 1e-12, "{s:?}");
        let one = side(&rounds(&[100.0], 0.03)).unwrap();
        assert_eq!((one.rounds, one.noise), (1, 0.03));
        // Two rows of one run are one round.
        let mut two = rounds(&[100.0, 104.0], 0.0);
        two[1].0 = "run0".into();
        assert_eq!(side(&two).unwrap().rounds, 1);
    }

    #[test]
    fn the_rule_needs_threshold_noise_separation_and_floor() {
        let s = |v: &[f64]| side(&rounds(v, 0.0)).unwrap();
        let base = s(&[100.0, 101.0, 99.0]);
        // 10% slower in every round: called.
        let v = judge(Worse::Higher, &base, &s(&[110.0, 111.0, 109.5]), 0.05, 0.0).3;
        assert_eq!(v, Verdict::Regression);
        // Median 10% slower but one round overlaps the baseline's: not called.
        let v = judge(Worse::Higher, &base, &s(&[110.0, 111.0, 100.5]), 0.05, 0.0).3;
        assert_eq!(v, Verdict::Unchanged);
        // Beyond threshold, no overlap, but within the rounds' own spread
        // (current: 103..130 about 110, 25%): not called.
        let v = judge(Worse::Higher, &base, &s(&[103.0, 110.0, 130.0]), 0.05, 0.0).3;
        assert_eq!(v, Verdict::Unchanged);
        // Below the floor (11 us change, floor 20 us): not called.
        let v = judge(Worse::Higher, &base, &s(&[110.0, 111.0, 109.5]), 0.05, 20.0).3;
        assert_eq!(v, Verdict::Unchanged);
        // The mirror image is an improvement.
        let v = judge(Worse::Higher, &base, &s(&[90.0, 89.0, 90.5]), 0.05, 0.0).3;
        assert_eq!(v, Verdict::Improvement);
    }

    #[test]
    fn directions() {
        assert!((worse_by(Worse::Higher, 100.0, 120.0) - 0.2).abs() < 1e-12);
        assert!((worse_by(Worse::Lower, 10.0, 8.0) - 0.2).abs() < 1e-12);
        assert!((worse_by(Worse::HigherFraction, 0.10, 0.16) - 0.06).abs() < 1e-12);
        assert!(worse_by(Worse::Lower, 10.0, 12.0) < 0.0);
        // A hidden share: lower is worse, in points.
        assert!((worse_by(Worse::LowerFraction, 0.90, 0.50) - 0.40).abs() < 1e-12);
        assert!(worse_by(Worse::LowerFraction, 0.50, 0.90) < 0.0);
    }

    #[test]
    fn spreads() {
        assert_eq!(spread_below(9.0, 10.0), 0.1);
        assert_eq!(spread_below(11.0, 10.0), 0.0);
        assert_eq!(spread(9.0, 11.0, 10.0), 0.2);
        assert_eq!(spread(1.0, 2.0, 0.0), 0.0);
    }
}
