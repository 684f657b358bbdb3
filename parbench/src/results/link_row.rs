//! One ordered pair of ranks of `bench-collectives links`: a row of links.csv.

use super::Record;
use serde::{Deserialize, Serialize};

/// A pair below this share of the median pair's one-way bandwidth is slow.
pub const SLOW_SHARE: f64 = 0.70;

/// One ordered pair's figures: a row of links.csv.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    pub world: usize,
    pub from: usize,
    pub to: usize,
    /// Half the median 8-byte round trip, us.
    pub latency_us: f64,
    /// Bytes of each one-way and both-way message.
    pub bytes: u64,
    /// `from` -> `to` alone, GB/s.
    pub one_way_gbps: f64,
    /// Both directions at once: bytes moved each way per second, GB/s.
    pub both_ways_gbps: f64,
}

impl Record for LinkRow {
    const FILE: &'static str = "links.csv";
    const MAY_BE_NAN: &'static [&'static str] = &[];
    fn key(&self) -> String {
        format!(
            "{}/{}/np{}/{}->{}/{}B",
            self.backend, self.wire, self.world, self.from, self.to, self.bytes
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// The verdict on the matrix: the slow pairs and the rank on all of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub median_gbps: f64,
    /// `(from, to, share of the median)`, slowest first.
    pub slow: Vec<(usize, usize, f64)>,
    /// The rank on every slow pair, when exactly one is.
    pub culprit: Option<usize>,
    /// Pairs of ranks (either direction) judged: fewer than
    /// [`MIN_JUDGED_PAIRS`] and none is judged.
    pub pairs: usize,
    /// The measurement's own noise: the median gap between the two
    /// directions of the pairs that are not slow, as a share of the faster
    /// (one link measured twice). When it reaches the shortfall a slow pair
    /// is flagged for (`1 - SLOW_SHARE`), no pair is judged.
    pub noise: f64,
}

/// With fewer pairs of ranks than this, no pair is judged: with one pair
/// the median is that pair's own two directions, and a difference between
/// them (on 2-rank loopback runs, 0.28-0.61x) is the measurement's noise,
/// not a slow link; with two, the median lies between them.
pub const MIN_JUDGED_PAIRS: usize = 3;

/// Judges the one-way bandwidths: pairs under [`SLOW_SHARE`] of the median.
/// Linear in the rows (bar the sorts): the pairs are found through one
/// index, and the culprit among the ranks of the slow pairs, never among
/// every rank a row's `world` claims.
pub fn verdict(rows: &[LinkRow]) -> Verdict {
    let mut bws: Vec<f64> = rows.iter().map(|r| r.one_way_gbps).collect();
    let median_gbps = crate::stats::median(&mut bws).unwrap_or(0.0);
    let mut by_pair = std::collections::HashMap::with_capacity(rows.len());
    for r in rows {
        by_pair.entry((r.from, r.to)).or_insert(r);
    }
    let mut pairs: Vec<(usize, usize)> = rows
        .iter()
        .map(|r| (r.from.min(r.to), r.from.max(r.to)))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let is_slow = |r: &LinkRow| median_gbps > 0.0 && r.one_way_gbps < SLOW_SHARE * median_gbps;
    // One link measured both ways: how far its directions differ is the
    // measurement's noise, read on the pairs that are not slow.
    let mut gaps: Vec<f64> = pairs
        .iter()
        .filter_map(|&(a, b)| {
            let ab = by_pair.get(&(a, b))?;
            let ba = by_pair.get(&(b, a))?;
            if is_slow(ab) || is_slow(ba) {
                return None;
            }
            let hi = ab.one_way_gbps.max(ba.one_way_gbps);
            (hi > 0.0).then(|| (ab.one_way_gbps - ba.one_way_gbps).abs() / hi)
        })
        .collect();
    let noise = crate::stats::median(&mut gaps).unwrap_or(0.0);
    let judged = pairs.len() >= MIN_JUDGED_PAIRS && noise < 1.0 - SLOW_SHARE;
    let mut slow: Vec<(usize, usize, f64)> = rows
        .iter()
        .filter(|r| judged && is_slow(r))
        .map(|r| (r.from, r.to, r.one_way_gbps / median_gbps))
        .collect();
    slow.sort_by(|a, b| a.2.total_cmp(&b.2));
    // A rank on every slow pair is on the first one.
    let mut on_all: Vec<usize> = slow
        .first()
        .map(|&(f, t, _)| vec![f, t])
        .unwrap_or_default();
    on_all.dedup();
    on_all.retain(|&k| slow.iter().all(|&(f, t, _)| f == k || t == k));
    Verdict {
        median_gbps,
        slow,
        culprit: if on_all.len() == 1 {
            Some(on_all[0])
        } else {
            None
        },
        pairs: pairs.len(),
        noise,
    }
}

impl Verdict {
    /// The verdict in words, one line each (the table's and the report's):
    /// the median, each slow pair, the likely culprit.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "Median pair: {:.3} GB/s one way; slow means below {:.0}% of it",
            self.median_gbps,
            SLOW_SHARE * 100.0
        )];
        if self.pairs < MIN_JUDGED_PAIRS {
            out.push(format!(
                "Slow pairs: not judged ({} pair(s) of ranks; at least {MIN_JUDGED_PAIRS} are needed for a median that a slow pair stands apart from)",
                self.pairs
            ));
        } else if self.noise >= 1.0 - SLOW_SHARE {
            out.push(format!(
                "Slow pairs: not judged (the two directions of one link differ by {:.0}% at the median pair: as much as a slow pair falls short, {:.0}%; measure again on a quieter machine)",
                100.0 * self.noise,
                100.0 * (1.0 - SLOW_SHARE)
            ));
        } else if self.slow.is_empty() {
            out.push("Slow pairs: none".into());
        }
        for (f, t, share) in &self.slow {
            out.push(format!(
                "slow: rank {f} -> rank {t} at {share:.2}x the median pair"
            ));
        }
        match self.culprit {
            Some(k) => out.push(format!("Likely culprit: rank {k} (on every slow pair)")),
            None if !self.slow.is_empty() => {
                out.push("Likely culprit: none (no single rank is on every slow pair)".into())
            }
            None => {}
        }
        out
    }
}

#[cfg(test)]
mod noise_tests {
    use super::*;

    fn row(from: usize, to: usize, gbps: f64) -> LinkRow {
        LinkRow {
            schema: 1,
            run_id: "r".into(),
            backend: "tcp".into(),
            wire: "tcp".into(),
            world: 4,
            from,
            to,
            latency_us: 10.0,
            bytes: 1 << 20,
            one_way_gbps: gbps,
            both_ways_gbps: gbps,
        }
    }

    /// Four ranks: one pair at 0.6x the median, flagged while the links'
    /// two directions agree; not judged when they differ by as much.
    #[test]
    fn a_pair_within_the_measurements_own_noise_is_not_flagged() {
        let mut quiet = Vec::new();
        let mut noisy = Vec::new();
        for a in 0..4 {
            for b in 0..4 {
                if a == b {
                    continue;
                }
                let slow = (a, b) == (0, 1);
                quiet.push(row(a, b, if slow { 6.0 } else { 10.0 }));
                // Each link's reverse direction 40% below its forward one.
                let base = if a < b { 10.0 } else { 6.5 };
                noisy.push(row(a, b, if slow { 3.0 } else { base }));
            }
        }
        let q = verdict(&quiet);
        assert_eq!(q.slow.len(), 1, "{q:?}");
        assert!(q.noise < 0.01);
        let n = verdict(&noisy);
        assert!(n.slow.is_empty(), "{n:?}");
        assert!(n.noise >= 0.3, "{n:?}");
        assert!(n
            .lines()
            .iter()
            .any(|l| l.contains("two directions of one link differ")));
    }
}
