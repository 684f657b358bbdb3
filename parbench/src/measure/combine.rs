//! Cross-rank statistics: every rank's timings reach every rank through the
//! communicator under test, then reduce to the figures a bench reports.

use super::timing::RankTimes;
use crate::comm::{CommBuffer, CommError, CommResult, Communicator, DType, Io};
use hdrhistogram::Histogram;

/// How per-rank loop times combine into the reported time (nccl-tests' `-a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's time (`-a 0`).
    Rank0,
    /// Mean over ranks (`-a 1`, the default).
    Mean,
    /// Fastest rank (`-a 2`).
    Min,
    /// Slowest rank (`-a 3`).
    Max,
}

impl Average {
    /// nccl-tests' code for this choice.
    pub fn code(self) -> u8 {
        match self {
            Average::Rank0 => 0,
            Average::Mean => 1,
            Average::Min => 2,
            Average::Max => 3,
        }
    }

    /// The choice nccl-tests' `-a CODE` names, if any.
    pub fn from_code(code: u8) -> Option<Average> {
        match code {
            0 => Some(Average::Rank0),
            1 => Some(Average::Mean),
            2 => Some(Average::Min),
            3 => Some(Average::Max),
            _ => None,
        }
    }

    /// Combines one value per rank (in rank order); 0 for no ranks.
    pub fn combine(self, per_rank: &[f64]) -> f64 {
        let Some(&first) = per_rank.first() else {
            return 0.0;
        };
        match self {
            Average::Rank0 => first,
            Average::Mean => per_rank.iter().sum::<f64>() / per_rank.len() as f64,
            Average::Min => per_rank.iter().copied().fold(f64::INFINITY, f64::min),
            Average::Max => per_rank.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// Gathers `values` (the same length on every rank) from every rank to every
/// rank, through the communicator's own all_gather. Returns one vector per rank.
pub fn gather_f64<C: Communicator>(comm: &mut C, values: &[f64]) -> CommResult<Vec<Vec<f64>>> {
    let n = values.len();
    let world = comm.world();
    let bytes: &[u8] = bytemuck::cast_slice(values);
    let mut send = comm.alloc(bytes.len())?;
    send.write_from_host(bytes)?;
    let mut recv = comm.alloc(bytes.len() * world)?;
    comm.all_gather(
        Io::OutOfPlace {
            send: &send,
            recv: &mut recv,
        },
        n,
        DType::F64,
    )?;
    comm.sync()?;
    let mut all = vec![0f64; n * world];
    recv.read_to_host(bytemuck::cast_slice_mut(&mut all))?;
    Ok(all
        .chunks(n.max(1))
        .take(world)
        .map(<[f64]>::to_vec)
        .collect())
}

/// [`gather_f64`] for `values` of any length: every rank's length first,
/// then each rank's values padded to the longest; one vector per rank, at
/// its own length. A rank that announces more than `max_len` values is a
/// [`CommError::Protocol`] (nothing is allocated from its length).
pub fn gather_f64_any_len<C: Communicator>(
    comm: &mut C,
    values: &[f64],
    max_len: usize,
) -> CommResult<Vec<Vec<f64>>> {
    let lens = gather_f64(comm, &[values.len() as f64])?;
    let mut longest = 0;
    let mut own_len = Vec::with_capacity(lens.len());
    for (r, l) in lens.iter().enumerate() {
        let n = l.first().copied().unwrap_or(0.0);
        if !(0.0..=max_len as f64).contains(&n) {
            return Err(CommError::Protocol {
                rank: comm.rank(),
                peer: r,
                detail: format!("rank {r} announced {n} values"),
            });
        }
        own_len.push(n as usize);
        longest = longest.max(n as usize);
    }
    let mut padded = values.to_vec();
    padded.resize(longest, 0.0);
    let mut all = gather_f64(comm, &padded)?;
    for (v, n) in all.iter_mut().zip(own_len) {
        v.truncate(n);
    }
    Ok(all)
}

/// One loop's figures, the same on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopStats {
    /// Each rank's mean time per iteration (whole loop / iterations), us.
    pub rank_time_us: Vec<f64>,
    /// The reported time per iteration: `rank_time_us` combined by [`Average`].
    pub time_us: f64,
    /// Per-iteration times, each the slowest rank's, us: fastest iteration.
    pub iter_min_us: f64,
    /// Median iteration (hdrhistogram, 3 significant digits).
    pub p50_us: f64,
    /// 99th-percentile iteration (hdrhistogram, 3 significant digits).
    pub p99_us: f64,
    /// Slowest iteration.
    pub iter_max_us: f64,
    /// Wrong elements summed over ranks.
    pub wrong: u64,
    /// Ranks that found any wrong element (what nccl-tests' "out of
    /// bounds" count adds up).
    pub ranks_wrong: u64,
    /// Per iteration: the rank that arrived last (waited least inside the
    /// call), how much later than the first (ns), and the iteration's time (ns).
    pub last_arrivals: Vec<LastArrival>,
    /// Per rank, each timed iteration's time on that rank, us (what
    /// nccl-tests' `-J` writes as `per_process_max_times_us`).
    pub rank_iter_us: Vec<Vec<f64>>,
}

/// Who arrived last at one iteration, and by how much.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LastArrival {
    /// The rank that spent least time inside the call.
    pub rank: usize,
    /// Longest in-call time minus shortest (ns): how long the first rank waited for it.
    pub late_ns: f64,
    /// The iteration's time (slowest rank's), ns.
    pub iter_ns: f64,
}

impl LoopStats {
    /// Brings this rank's `times` and `wrong` count to every rank and reduces
    /// them. Every rank must call it with loops of the same length.
    pub fn gather<C: Communicator>(
        comm: &mut C,
        times: &RankTimes,
        wrong: u64,
        average: Average,
    ) -> CommResult<LoopStats> {
        let n = times.iter_ns.len();
        let mut packet = Vec::with_capacity(3 + 2 * n);
        packet.push(times.total.as_nanos() as f64);
        packet.push(wrong as f64);
        packet.push(n as f64);
        packet.extend(times.iter_ns.iter().map(|&t| t as f64));
        packet.extend(times.in_call_ns.iter().map(|&t| t as f64));
        let all = gather_f64(comm, &packet)?;
        for (r, p) in all.iter().enumerate() {
            if p.len() != packet.len() || p.get(2) != Some(&(n as f64)) {
                return Err(CommError::Protocol {
                    rank: comm.rank(),
                    peer: r,
                    detail: format!("timed loop length differs from rank {}'s", comm.rank()),
                });
            }
        }
        Ok(Self::from_packets(&all, n, average))
    }

    /// Reduces the gathered packets `[total_ns, wrong, n, iter_ns.., in_call_ns..]`.
    fn from_packets(all: &[Vec<f64>], n: usize, average: Average) -> LoopStats {
        let per_iter_ns = n.max(1) as f64 * 1e3;
        let rank_time_us: Vec<f64> = all.iter().map(|p| p[0] / per_iter_ns).collect();
        let wrong = all.iter().map(|p| p[1] as u64).sum();
        let ranks_wrong = all.iter().filter(|p| p[1] > 0.0).count() as u64;
        let mut slowest = vec![0f64; n];
        let mut last_arrivals = Vec::with_capacity(n);
        for (i, slot) in slowest.iter_mut().enumerate() {
            let mut longest = f64::NEG_INFINITY;
            let mut shortest = (f64::INFINITY, 0usize);
            for (r, p) in all.iter().enumerate() {
                *slot = slot.max(p[3 + i]);
                let in_call = p[3 + n + i];
                longest = longest.max(in_call);
                if in_call < shortest.0 {
                    shortest = (in_call, r);
                }
            }
            last_arrivals.push(LastArrival {
                rank: shortest.1,
                late_ns: (longest - shortest.0).max(0.0),
                iter_ns: *slot,
            });
        }
        let (p50_us, p99_us) = percentiles_us(&slowest);
        LoopStats {
            time_us: average.combine(&rank_time_us),
            rank_time_us,
            iter_min_us: if slowest.is_empty() {
                0.0
            } else {
                slowest.iter().copied().fold(f64::INFINITY, f64::min) / 1e3
            },
            iter_max_us: slowest.iter().copied().fold(0.0, f64::max) / 1e3,
            p50_us,
            p99_us,
            wrong,
            ranks_wrong,
            last_arrivals,
            rank_iter_us: all
                .iter()
                .map(|p| p[3..3 + n].iter().map(|t| t / 1e3).collect())
                .collect(),
        }
    }
}

/// Median and 99th percentile of `ns` in microseconds, through an
/// auto-resizing hdrhistogram (3 significant digits); zeros when empty.
fn percentiles_us(ns: &[f64]) -> (f64, f64) {
    let Ok(mut h) = Histogram::<u64>::new(3) else {
        return (0.0, 0.0);
    };
    for &t in ns {
        // The histogram cannot hold 0; one nanosecond is below any clock's resolution.
        if h.record((t as u64).max(1)).is_err() {
            return (0.0, 0.0);
        }
    }
    if h.is_empty() {
        return (0.0, 0.0);
    }
    (
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
    )
}

/// Tallies, over every loop of a run, which rank arrived last at each
/// iteration and by how much, to name a rank that persistently paces the others.
#[derive(Clone, Debug, Default)]
pub struct StragglerTally {
    iterations: u64,
    /// Per rank: lateness (ns) of every iteration it arrived last by a
    /// significant margin.
    late_ns: Vec<Vec<f64>>,
}

/// A rank that arrived last, by a significant margin, in most iterations.
#[derive(Clone, Debug, PartialEq)]
pub struct StragglerVerdict {
    /// The rank.
    pub rank: usize,
    /// Fraction of all timed iterations in which it arrived last by at least
    /// [`StragglerTally::SIGNIFICANT`] of the iteration's time.
    pub fraction: f64,
    /// Median of those margins, us: how long the others waited for it.
    pub median_late_us: f64,
    /// Timed iterations tallied.
    pub iterations: u64,
}

impl StragglerTally {
    /// A late arrival counts when the others waited at least this fraction of the iteration.
    pub const SIGNIFICANT: f64 = 0.2;
    /// A rank is named when it was significantly last in more than this fraction of iterations.
    pub const PERSISTENT: f64 = 0.5;
    /// Fewer tallied iterations than this name nobody.
    pub const MIN_ITERATIONS: u64 = 10;

    /// Adds one loop's iterations.
    pub fn add(&mut self, stats: &LoopStats) {
        for a in &stats.last_arrivals {
            self.iterations += 1;
            if a.iter_ns > 0.0 && a.late_ns >= Self::SIGNIFICANT * a.iter_ns {
                if self.late_ns.len() <= a.rank {
                    self.late_ns.resize(a.rank + 1, Vec::new());
                }
                self.late_ns[a.rank].push(a.late_ns);
            }
        }
    }

    /// Timed iterations tallied so far.
    pub fn iterations(&self) -> u64 {
        self.iterations
    }

    /// The persistently late rank, if one is.
    pub fn verdict(&self) -> Option<StragglerVerdict> {
        if self.iterations < Self::MIN_ITERATIONS {
            return None;
        }
        let (rank, lates) = self
            .late_ns
            .iter()
            .enumerate()
            .max_by_key(|(_, l)| l.len())?;
        let fraction = lates.len() as f64 / self.iterations as f64;
        if fraction <= Self::PERSISTENT {
            return None;
        }
        let mut sorted = lates.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        Some(StragglerVerdict {
            rank,
            fraction,
            median_late_us: median / 1e3,
            iterations: self.iterations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(total_ns: f64, wrong: f64, iter: &[f64], in_call: &[f64]) -> Vec<f64> {
        let mut p = vec![total_ns, wrong, iter.len() as f64];
        p.extend_from_slice(iter);
        p.extend_from_slice(in_call);
        p
    }

    #[test]
    fn averages_follow_nccl_tests_codes() {
        let t = [4.0, 2.0, 6.0];
        assert_eq!(Average::from_code(0).unwrap().combine(&t), 4.0);
        assert_eq!(Average::from_code(1).unwrap().combine(&t), 4.0);
        assert_eq!(Average::from_code(2).unwrap().combine(&t), 2.0);
        assert_eq!(Average::from_code(3).unwrap().combine(&t), 6.0);
        assert_eq!(Average::from_code(4), None);
        assert_eq!(Average::Max.combine(&[]), 0.0);
    }

    #[test]
    fn per_iteration_time_is_the_slowest_ranks() {
        // Rank 1 arrives late in every iteration: it spends least time inside.
        let r0 = packet(4000.0, 1.0, &[1000.0, 3000.0], &[900.0, 2900.0]);
        let r1 = packet(3000.0, 2.0, &[2000.0, 1000.0], &[100.0, 200.0]);
        let s = LoopStats::from_packets(&[r0, r1], 2, Average::Mean);
        assert_eq!(s.rank_time_us, vec![2.0, 1.5]);
        assert_eq!(s.time_us, 1.75);
        assert_eq!(s.wrong, 3);
        assert_eq!(s.iter_min_us, 2.0);
        assert_eq!(s.iter_max_us, 3.0);
        assert!((s.p50_us - 2.0).abs() < 0.01, "{}", s.p50_us);
        assert!((s.p99_us - 3.0).abs() < 0.01, "{}", s.p99_us);
        assert_eq!(s.last_arrivals[0].rank, 1);
        assert_eq!(s.last_arrivals[0].late_ns, 800.0);
        assert_eq!(s.last_arrivals[1].iter_ns, 3000.0);
    }

    #[test]
    fn names_a_persistent_straggler_only() {
        let late = |rank, late_ns| LastArrival {
            rank,
            late_ns,
            iter_ns: 1000.0,
        };
        let mut tally = StragglerTally::default();
        let mut stats = LoopStats::from_packets(&[], 0, Average::Mean);
        stats.last_arrivals = (0..20).map(|i| late(i % 2, 900.0)).collect();
        tally.add(&stats);
        assert_eq!(tally.verdict().map(|v| v.rank), None, "alternating ranks");

        let mut tally = StragglerTally::default();
        stats.last_arrivals = (0..20).map(|_| late(2, 50.0)).collect();
        tally.add(&stats);
        assert_eq!(tally.verdict(), None, "insignificant margins");

        let mut tally = StragglerTally::default();
        stats.last_arrivals = (0..20)
            .map(|i| {
                if i < 15 {
                    late(3, 800.0)
                } else {
                    late(0, 600.0)
                }
            })
            .collect();
        tally.add(&stats);
        let v = tally.verdict().unwrap();
        assert_eq!((v.rank, v.fraction, v.median_late_us), (3, 0.75, 0.8));
    }
}
