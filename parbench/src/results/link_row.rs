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
}

/// With fewer pairs of ranks than this, no pair is judged: with one pair
/// the median is that pair's own two directions, and a difference between
/// them (on 2-rank loopback runs, 0.28-0.61x) is the measurement's noise,
/// not a slow link; with two, the median lies between them.
pub const MIN_JUDGED_PAIRS: usize = 3;

/// Judges the one-way bandwidths: pairs under [`SLOW_SHARE`] of the median.
pub fn verdict(rows: &[LinkRow]) -> Verdict {
    let mut bws: Vec<f64> = rows.iter().map(|r| r.one_way_gbps).collect();
    let median_gbps = crate::stats::median(&mut bws).unwrap_or(0.0);
    let mut pairs: Vec<(usize, usize)> = rows
        .iter()
        .map(|r| (r.from.min(r.to), r.from.max(r.to)))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let judged = pairs.len() >= MIN_JUDGED_PAIRS;
    let mut slow: Vec<(usize, usize, f64)> = rows
        .iter()
        .filter(|r| judged && median_gbps > 0.0 && r.one_way_gbps < SLOW_SHARE * median_gbps)
        .map(|r| (r.from, r.to, r.one_way_gbps / median_gbps))
        .collect();
    slow.sort_by(|a, b| a.2.total_cmp(&b.2));
    let world = rows.first().map_or(0, |r| r.world);
    let on_all: Vec<usize> = (0..world)
        .filter(|&k| !slow.is_empty() && slow.iter().all(|&(f, t, _)| f == k || t == k))
        .collect();
    Verdict {
        median_gbps,
        slow,
        culprit: if on_all.len() == 1 {
            Some(on_all[0])
        } else {
            None
        },
        pairs: pairs.len(),
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
