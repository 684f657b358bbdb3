//! The a priori model held against what the rows measured, after the
//! sweep: how many rows it priced within [`WITHIN`] of their p50, the
//! range of model / measured, and in words which way it missed when it
//! missed on many rows. The model column is printed before the row is
//! timed; this says afterwards whether it can be trusted for this run.

use parbench::results::CollectiveRow;

pub use parbench::model::priced::{priced_well, FROM_BYTES, WITHIN};
/// The share of held rows that must miss for the footer to warn.
pub const WARN_SHARE: f64 = 0.25;
/// The misses the footer names, worst first.
const NAMED: usize = 4;

/// The model against the rows (those timed in the wire's state, of
/// [`FROM_BYTES`] and up, with a model figure).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelCheck {
    pub rows: usize,
    pub within: usize,
    /// Model / measured p50: median, smallest, largest.
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The rows beyond [`WITHIN`], worst first: label and model / measured.
    pub misses: Vec<(String, f64)>,
}

impl ModelCheck {
    /// `None` when no row qualifies.
    pub fn of(rows: &[CollectiveRow]) -> Option<ModelCheck> {
        let ratios: Vec<(String, f64)> = rows
            .iter()
            .filter(|r| r.bytes >= FROM_BYTES && r.p50_us > 0.0)
            .map(|r| (r.label(), r.model_us / r.p50_us))
            .filter(|(_, x)| x.is_finite() && *x > 0.0)
            .collect();
        let mut v: Vec<f64> = ratios.iter().map(|(_, x)| *x).collect();
        let median = parbench::stats::median(&mut v)?;
        let mut misses: Vec<(String, f64)> = ratios
            .into_iter()
            .filter(|(_, x)| !priced_well(*x))
            .collect();
        misses.sort_by(|a, b| miss(b.1).total_cmp(&miss(a.1)));
        Some(ModelCheck {
            rows: v.len(),
            within: v.len() - misses.len(),
            median,
            min: v[0],
            max: v[v.len() - 1],
            misses,
        })
    }

    /// Whether more than [`WARN_SHARE`] of the rows missed.
    pub fn warns(&self) -> bool {
        self.misses.len() as f64 > WARN_SHARE * self.rows as f64
    }

    /// Which way the model missed, in words (for a warning): by the misses
    /// themselves, not the median (a run whose cross-core ladders read
    /// slow misses the rows up to a few MiB one way while the larger rows,
    /// bound by memory, hold the median at x1.0).
    fn cause(&self) -> &'static str {
        let over = self.misses.iter().filter(|(_, x)| *x > 1.0).count();
        let under = self.misses.len() - over;
        let most = |n: usize| 4 * n >= 3 * self.misses.len();
        if most(over) {
            "the model priced them slower than they ran: the wire's ladders were measured slower than the rows then ran (on a shared VM, runs whose cross-core ladders read 1.3-1.5x below a quiet run's while the rows ran as in quiet runs); rerun before trusting the model column"
        } else if most(under) {
            "the rows ran slower than the ladders predict: a loaded host, or a regime of the memory or the link the ladders do not see"
        } else {
            "misses both ways: the rows' or the ladders' own noise"
        }
    }

    /// The summary's lines.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "# Model check (the model column against each row's p50, rows from {} timed in the wire's state): within {:.0}% on {} of {} (model/measured median x{:.2}, x{:.2}..x{:.2})",
            parbench::units::bytes(FROM_BYTES as f64),
            100.0 * WITHIN,
            self.within,
            self.rows,
            self.median,
            self.min,
            self.max
        )];
        if !self.misses.is_empty() {
            let named: Vec<String> = self
                .misses
                .iter()
                .take(NAMED)
                .map(|(row, x)| format!("{row} x{x:.2}"))
                .collect();
            let more = self.misses.len().saturating_sub(NAMED);
            out.push(format!(
                "#   beyond {:.0}%: {}{}",
                100.0 * WITHIN,
                named.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if self.warns() {
            out.push(format!(
                "# WARNING: the model missed by more than {:.0}% on {} of {} rows: {}",
                100.0 * WITHIN,
                self.misses.len(),
                self.rows,
                self.cause()
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "from_bytes": FROM_BYTES,
            "within": WITHIN,
            "rows": self.rows,
            "rows_within": self.within,
            "ratio_median": self.median,
            "ratio_min": self.min,
            "ratio_max": self.max,
            "warns": self.warns(),
            "misses": self.misses.iter().map(|(row, x)| serde_json::json!({"row": row, "model_over_measured": x})).collect::<Vec<_>>(),
        })
    }
}

/// How far a ratio lies from 1, the same either way (x0.5 as far as x2).
fn miss(ratio: f64) -> f64 {
    ratio.ln().abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bytes: u64, p50: f64, model: f64) -> CollectiveRow {
        CollectiveRow {
            collective: "all_reduce".into(),
            bytes,
            p50_us: p50,
            model_us: model,
            ..crate::test_rows::row()
        }
    }

    #[test]
    fn rows_from_64_kib_are_held_and_the_worst_miss_comes_first() {
        let rows = [
            row(8, 1.0, 5.0), // below 64 KiB: not held
            row(64 << 10, 10.0, 11.0),
            row(1 << 20, 100.0, 70.0),
            row(4 << 20, 100.0, 160.0),
            row(8 << 20, 100.0, f64::NAN), // no model: not held
        ];
        let c = ModelCheck::of(&rows).unwrap();
        assert_eq!((c.rows, c.within), (3, 1));
        assert_eq!(c.misses.len(), 2);
        assert!((c.misses[0].1 - 1.6).abs() < 1e-12, "{c:?}");
        assert!((c.median - 1.1).abs() < 1e-12);
        assert!(c.warns(), "two of three missed");
        let text = c.lines().join("\n");
        assert!(text.contains("within 25% on 1 of 3"), "{text}");
        assert!(text.contains("WARNING"), "{text}");
    }

    #[test]
    fn a_model_within_its_band_does_not_warn_and_a_slow_one_says_so() {
        let good: Vec<CollectiveRow> = (0..8)
            .map(|i| row((64 << 10) << i, 100.0, if i == 0 { 140.0 } else { 105.0 }))
            .collect();
        let c = ModelCheck::of(&good).unwrap();
        assert_eq!((c.rows, c.within), (8, 7));
        assert!(!c.warns());
        assert!(!c.lines().join("\n").contains("WARNING"));

        let slow: Vec<CollectiveRow> = (0..4).map(|i| row((64 << 10) << i, 100.0, 150.0)).collect();
        let text = ModelCheck::of(&slow).unwrap().lines().join("\n");
        assert!(text.contains("priced them slower than they ran"), "{text}");
        assert!(ModelCheck::of(&[row(8, 1.0, 1.0)]).is_none());

        // Small rows priced 1.5x slow, large ones right: the median is x1.0
        // and the misses still go one way.
        let mixed: Vec<CollectiveRow> = (0..8)
            .map(|i| row((64 << 10) << i, 100.0, if i < 3 { 150.0 } else { 100.0 }))
            .collect();
        let c = ModelCheck::of(&mixed).unwrap();
        assert!((c.median - 1.0).abs() < 1e-12 && c.warns());
        assert!(
            c.lines()
                .join("\n")
                .contains("priced them slower than they ran"),
            "{:?}",
            c.lines()
        );
    }
}
