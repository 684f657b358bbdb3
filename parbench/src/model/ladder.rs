//! A bandwidth at a ladder of working sets: the calibrated model's
//! coefficients ([`super::wire`]) and the ceiling a row is held against.
//!
//! A CPU's memory is not one wire: a copy whose buffers stay in L1 runs
//! several times faster than one out of the last-level cache, so each
//! figure is measured at working sets from inside the caches to past the
//! largest swept size (`crate::measure::ladder`) and read at a row's own.

/// One working set of a [`Ladder`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rung {
    /// Bytes each rank touches per transfer (source + destination of a
    /// copy; the message buffer of a stream).
    pub working_set: u64,
    /// Bytes moved per transfer (a copy's length, a message's length).
    pub bytes: u64,
    /// Best sample, GB/s per rank (1e9 B/s), mean over the ranks measured.
    pub gbps: f64,
    /// Median sample, GB/s: `1 - median / best` is the rung's noise.
    pub median_gbps: f64,
}

impl Rung {
    /// Relative spread of the rung's samples: `1 - median / best` (0 when unknown).
    pub fn noise(&self) -> f64 {
        let n = 1.0 - self.median_gbps / self.gbps;
        if n.is_finite() && n > 0.0 {
            n
        } else {
            0.0
        }
    }
}

/// Bandwidth at a ladder of working sets, by increasing working set, and
/// how it was measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ladder {
    /// How each rung was measured, in words.
    pub method: String,
    pub rungs: Vec<Rung>,
}

impl Ladder {
    /// A ladder of exact figures `(working set, GB/s)`, each rung moving
    /// half its working set per transfer (a copy's source and
    /// destination) with no spread between its samples: a figure known
    /// from elsewhere, or a test's wire.
    pub fn exact(method: impl Into<String>, rates: &[(u64, f64)]) -> Self {
        Ladder {
            method: method.into(),
            rungs: rates
                .iter()
                .map(|&(working_set, gbps)| Rung {
                    working_set,
                    bytes: working_set / 2,
                    gbps,
                    median_gbps: gbps,
                })
                .collect(),
        }
    }

    /// Bandwidth at `working_set` bytes per rank, GB/s: log-log
    /// interpolation between the two rungs around it, the end rung's figure
    /// beyond the ends; `None` for an empty ladder.
    pub fn at(&self, working_set: u64) -> Option<f64> {
        self.interpolate(working_set, |r| r.gbps)
    }

    /// The noise (see [`Rung::noise`]) at `working_set`, interpolated as [`Self::at`].
    pub fn noise_at(&self, working_set: u64) -> f64 {
        self.interpolate(working_set, Rung::noise).unwrap_or(0.0)
    }

    fn interpolate(&self, working_set: u64, f: impl Fn(&Rung) -> f64) -> Option<f64> {
        let rungs: Vec<&Rung> = self
            .rungs
            .iter()
            .filter(|r| r.gbps.is_finite() && r.gbps > 0.0 && r.working_set > 0)
            .collect();
        let (first, last) = (rungs.first()?, rungs.last()?);
        let ws = working_set.max(1);
        if ws <= first.working_set {
            return Some(f(first));
        }
        if ws >= last.working_set {
            return Some(f(last));
        }
        let hi = rungs.iter().position(|r| r.working_set >= ws)?;
        let (a, b) = (rungs[hi - 1], rungs[hi]);
        let t = ((ws as f64).ln() - (a.working_set as f64).ln())
            / ((b.working_set as f64).ln() - (a.working_set as f64).ln());
        let (fa, fb) = (f(a), f(b));
        Some(if fa > 0.0 && fb > 0.0 {
            (fa.ln() + t * (fb.ln() - fa.ln())).exp()
        } else {
            fa + t * (fb - fa)
        })
    }

    /// The fastest rung, GB/s (in cache).
    pub fn peak_gbps(&self) -> Option<f64> {
        self.rungs.iter().map(|r| r.gbps).reduce(f64::max)
    }

    /// The slowest rung, GB/s (out of cache, when the ladder reaches it).
    pub fn floor_gbps(&self) -> Option<f64> {
        self.rungs.iter().map(|r| r.gbps).reduce(f64::min)
    }

    /// Whether the ladder reaches `working_set` (its last rung is at least that large).
    pub fn covers(&self, working_set: u64) -> bool {
        self.rungs
            .last()
            .is_some_and(|r| r.working_set >= working_set)
    }

    /// This ladder with `here`'s rungs put in: at a working set this ladder
    /// has, the better of the two figures; between its rungs, `here`'s rung
    /// goes in at its place (or this ladder's figure there, when better).
    /// How a row's ceiling measured again at the row joins the pre-sweep
    /// one (bench-collectives on shared memory).
    pub fn with_rungs_from(&self, here: &Ladder) -> Ladder {
        let mut out = self.clone();
        for h in &here.rungs {
            match out
                .rungs
                .iter_mut()
                .find(|r| r.working_set == h.working_set)
            {
                Some(r) if h.gbps > r.gbps => *r = h.clone(),
                Some(_) => {}
                None => {
                    let at = out
                        .rungs
                        .iter()
                        .position(|r| r.working_set > h.working_set)
                        .unwrap_or(out.rungs.len());
                    let rung = match self.at(h.working_set) {
                        Some(b) if b > h.gbps => Rung {
                            gbps: b,
                            median_gbps: b,
                            ..h.clone()
                        },
                        _ => h.clone(),
                    };
                    out.rungs.insert(at, rung);
                }
            }
        }
        out.method = format!(
            "{}; at each row's working sets the better of that and the same ladder measured again just before the row",
            self.method
        );
        out
    }

    /// This ladder with `more`'s rungs put in at their working sets (in
    /// place of a rung at the same working set): a ladder measured at more
    /// working sets after its first pass. Its method is this ladder's, or
    /// `more`'s where this one has none (a ladder measured only from some
    /// working set up, such as the far ladders from 1 MiB, starts empty).
    pub fn merged(&self, more: &Ladder) -> Ladder {
        let mut out = self.clone();
        if out.method.is_empty() {
            out.method.clone_from(&more.method);
        }
        for m in &more.rungs {
            out.rungs.retain(|r| r.working_set != m.working_set);
            let at = out
                .rungs
                .iter()
                .position(|r| r.working_set > m.working_set)
                .unwrap_or(out.rungs.len());
            out.rungs.insert(at, m.clone());
        }
        out
    }

    /// This ladder with each rung held at most at `cap`'s figure at its
    /// working set (both its best and its median), `note` added to the
    /// method where a rung was held: a transfer that does more than
    /// another over the same path cannot outrun it.
    pub fn capped_by(&self, cap: &Ladder, note: &str) -> Ladder {
        let mut out = self.clone();
        let mut held = false;
        for r in &mut out.rungs {
            if let Some(c) = cap.at(r.working_set) {
                if r.gbps > c {
                    r.gbps = c;
                    r.median_gbps = r.median_gbps.min(c);
                    held = true;
                }
            }
        }
        if held {
            out.method.push_str(note);
        }
        out
    }

    /// The rungs whose transfer took at least `secs` (bytes / rate): where a
    /// ladder's samples had a latency of `secs` taken off each transfer, a
    /// rung whose transfer lasted less than that is mostly the subtraction's
    /// remainder. On the EPYC VM the clean-exchange ladder's 4 KiB rung
    /// (2 KiB moved in about 0.2 us, less an 8 B exchange's 0.18 us) read
    /// 290 to 11600 GB/s from run to run, and the ceiling's "in cache"
    /// figure with it. The method says what was left out.
    pub fn where_bytes_outlast(&self, secs: f64) -> Ladder {
        let long = |r: &Rung| r.gbps > 0.0 && r.bytes as f64 / (r.gbps * 1e9) >= secs;
        let left = self.rungs.iter().filter(|r| !long(r)).count();
        Ladder {
            method: if left == 0 {
                self.method.clone()
            } else {
                format!(
                    "{}; {left} rung(s) whose bytes took less than the {:.2} us taken off them left out",
                    self.method,
                    secs * 1e6
                )
            },
            rungs: self.rungs.iter().filter(|r| long(r)).cloned().collect(),
        }
    }

    /// The working sets of the rungs that lie below `share` of both their
    /// neighbours' figures. A cache boundary makes a ladder fall by a step
    /// and stay down; it never makes one rung fall alone and the next climb
    /// back. A rung that does was timed through a stall: its samples are
    /// taken back to back, so a stall of a few milliseconds covers them all
    /// and its best sample is the stall's. On the EPYC VM one run in two
    /// had such a rung (a 2 MiB rung at 2.0 GB/s between 13.8 and 12.5),
    /// and the model of every row priced from it 3-4.6x too slow.
    pub fn dipped_sets(&self, share: f64) -> Vec<u64> {
        self.rungs
            .windows(3)
            .filter(|w| w[1].gbps < share * w[0].gbps.min(w[2].gbps))
            .map(|w| w[1].working_set)
            .collect()
    }

    /// This ladder with each rung that `again` measured at the same working
    /// set replaced by `again`'s where that one is better: a rung keeps its
    /// best sample, and a rung measured again has more samples.
    pub fn better_rungs(&self, again: &Ladder) -> Ladder {
        let mut out = self.clone();
        for r in &mut out.rungs {
            if let Some(a) = again.rungs.iter().find(|a| a.working_set == r.working_set) {
                if a.gbps > r.gbps {
                    *r = a.clone();
                }
            }
        }
        out
    }

    /// The rung-wise larger of two ladders over the same working sets (one
    /// stream, and both directions at once: the best either gives).
    pub fn best_of(&self, other: &Ladder) -> Ladder {
        let rungs = self
            .rungs
            .iter()
            .map(
                |r| match other.rungs.iter().find(|o| o.working_set == r.working_set) {
                    Some(o) if o.gbps > r.gbps => o.clone(),
                    _ => r.clone(),
                },
            )
            .collect();
        Ladder {
            method: format!("the better of ({}) and ({})", self.method, other.method),
            rungs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(working_set: u64, gbps: f64) -> Rung {
        Rung {
            working_set,
            bytes: working_set / 2,
            gbps,
            median_gbps: gbps,
        }
    }

    #[test]
    fn a_merge_keeps_the_method_or_takes_the_one_measured_later() {
        let later = Ladder {
            method: "far".into(),
            rungs: vec![rung(2 << 20, 10.0)],
        };
        let got = Ladder::default().merged(&later);
        assert_eq!((got.method.as_str(), got.rungs.len()), ("far", 1));
        let first = Ladder {
            method: "first".into(),
            rungs: vec![rung(1 << 20, 20.0)],
        };
        let got = first.merged(&later);
        assert_eq!((got.method.as_str(), got.rungs.len()), ("first", 2));
    }

    #[test]
    fn rungs_shorter_than_the_latency_taken_off_them_are_left_out() {
        // 2 KiB at 11600 GB/s took 0.18 ns; 512 KiB at 50 GB/s took 10 us.
        let l = Ladder {
            method: "exchanges".into(),
            rungs: vec![rung(4 << 10, 11600.0), rung(1 << 20, 50.0)],
        };
        let kept = l.where_bytes_outlast(0.18e-6);
        assert_eq!(kept.rungs, vec![rung(1 << 20, 50.0)]);
        assert!(kept.method.contains("1 rung(s)"), "{}", kept.method);
        // The better of a copy and the kept rungs: the copy's where none is left.
        let copy = Ladder {
            method: "copy".into(),
            rungs: vec![rung(4 << 10, 150.0), rung(1 << 20, 40.0)],
        };
        let ceiling = copy.best_of(&kept);
        assert_eq!(ceiling.at(4 << 10), Some(150.0));
        assert_eq!(ceiling.at(1 << 20), Some(50.0));
        // Nothing taken off: every rung stays, the method unchanged.
        assert_eq!(l.where_bytes_outlast(0.0), l);
    }

    #[test]
    fn a_rung_below_both_neighbours_is_a_dip_and_a_step_is_not() {
        let l = Ladder {
            method: "both_far".into(),
            rungs: vec![
                rung(1 << 20, 12.7),
                rung(2 << 20, 2.0),
                rung(4 << 20, 13.5),
                // A cache boundary: down by a step and staying down.
                rung(8 << 20, 4.0),
                rung(16 << 20, 3.9),
                rung(32 << 20, 4.1),
            ],
        };
        assert_eq!(l.dipped_sets(0.67), vec![2 << 20]);
        // Ends have one neighbour: never judged.
        let ends = Ladder {
            method: "x".into(),
            rungs: vec![rung(1 << 20, 1.0), rung(2 << 20, 10.0), rung(4 << 20, 1.0)],
        };
        assert!(ends.dipped_sets(0.67).is_empty());
        // Measured again: the better rung stays at each working set.
        let again = Ladder {
            method: "again".into(),
            rungs: vec![rung(2 << 20, 13.1), rung(8 << 20, 3.0)],
        };
        let better = l.better_rungs(&again);
        assert_eq!(better.rungs[1], rung(2 << 20, 13.1));
        assert_eq!(better.rungs[3], rung(8 << 20, 4.0));
        assert_eq!(better.rungs.len(), l.rungs.len());
        assert_eq!(better.method, l.method);
        assert!(better.dipped_sets(0.67).is_empty());
    }
}
