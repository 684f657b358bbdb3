//! One time base for every rank of a run, so that a stamp taken on one rank
//! can be compared with a stamp taken on another.
//!
//! - Every rank stamps with [`host_now_us`], the host's monotonic clock
//!   (`CLOCK_MONOTONIC`, the clock [`std::time::Instant`] reads on Linux).
//!   Threads of one process read that one clock: their offset is zero by
//!   construction ([`TimeBase::Shared`]).
//! - Processes are treated as if their clocks were unrelated (they are on
//!   different hosts), whatever the host: [`estimate_offsets`] measures
//!   each rank's offset to rank 0 with ping-pongs through the communicator
//!   itself, NTP's way. Rank 0 stamps `t0`, sends; the peer stamps `t1` on
//!   arrival and replies with it; rank 0 stamps `t2` on the reply. The
//!   peer's `t1` happened between `t0` and `t2` on rank 0's clock, so the
//!   offset lies within `t1 - t2 ..= t1 - t0`: the estimate is the middle,
//!   `t1 - (t0 + t2) / 2`, and half the round trip bounds its error. Of many
//!   exchanges the one with the smallest round trip is kept. On one host
//!   the estimate must come out within its uncertainty of zero, which makes
//!   a check of the method.
//! - Estimating again after the run measures drift; a stamp is moved onto
//!   rank 0's clock with the offset interpolated between the two
//!   ([`RankClock::to_base`]).
//! - A device stream's clock (CUDA events) is put on the host base by an
//!   event recorded at a host-stamped moment on an idle stream
//!   ([`StreamAnchor`]).

use crate::comm::{CommBuffer, CommError, Communicator, DType};
use serde::{Deserialize, Serialize};

/// Microseconds on this host's monotonic clock. One clock for every thread
/// and every process of the host (on Unix); across hosts the offset is unknown.
pub fn host_now_us() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC exists on every
        // Unix this builds for, so the call cannot fail.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 * 1e-3 + test_skew_us()
    }
    #[cfg(not(unix))]
    {
        // A process-wide epoch: processes get unrelated clocks, which the
        // offset estimate measures as it would across hosts.
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        EPOCH
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f64()
            * 1e6
            + test_skew_us()
    }
}

#[cfg(test)]
thread_local! {
    /// Unit tests only: added to every stamp this thread takes, so that
    /// threads of one process can stand for hosts whose clocks differ.
    static TEST_SKEW_US: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Unit tests only: this thread's clock runs `us` microseconds ahead.
#[cfg(test)]
pub(crate) fn skew_this_threads_clock(us: f64) {
    TEST_SKEW_US.with(|c| c.set(us));
}

#[cfg(test)]
fn test_skew_us() -> f64 {
    TEST_SKEW_US.with(std::cell::Cell::get)
}

#[cfg(not(test))]
#[inline(always)]
fn test_skew_us() -> f64 {
    0.0
}

/// How the ranks of a run share a clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeBase {
    /// Threads of one process: one clock; the offsets are zero, and the
    /// ping-pong estimates are kept only as a check.
    Shared,
    /// Separate processes (maybe hosts): each rank's offset to rank 0 is
    /// estimated and applied.
    Estimated,
}

impl TimeBase {
    /// The name run.json and traces record.
    pub fn name(self) -> &'static str {
        match self {
            TimeBase::Shared => "shared clock (threads of one process)",
            TimeBase::Estimated => "offsets to rank 0 by ping-pong",
        }
    }
}

/// One estimate of a rank's clock against rank 0's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OffsetEstimate {
    /// This rank's clock minus rank 0's, microseconds: a stamp `t` taken
    /// here is `t - offset_us` on rank 0's clock.
    pub offset_us: f64,
    /// Half the round trip of the exchange it comes from: the true offset
    /// lies within this of `offset_us` (while the offset holds still).
    pub uncertainty_us: f64,
    /// When it was taken, on this rank's clock.
    pub at_us: f64,
}

impl OffsetEstimate {
    /// Rank 0 against itself.
    pub fn exact(at_us: f64) -> Self {
        OffsetEstimate {
            offset_us: 0.0,
            uncertainty_us: 0.0,
            at_us,
        }
    }

    /// From one exchange: rank 0 sent at `t0` and had the reply at `t2` (its
    /// clock); the peer stamped `t1` in between (the peer's clock).
    pub fn from_exchange(t0: f64, t1: f64, t2: f64) -> Self {
        OffsetEstimate {
            offset_us: t1 - (t0 + t2) / 2.0,
            uncertainty_us: ((t2 - t0) / 2.0).max(0.0),
            at_us: t1,
        }
    }
}

/// Exchanges per peer in one estimate; the one with the smallest round
/// trip is kept, so more exchanges only tighten the bound.
pub const EXCHANGES: usize = 24;

/// Estimates every rank's clock offset to rank 0 with `exchanges` ping-pongs
/// per rank, one rank after the other, through `comm`'s send and receive.
/// Every rank calls it; rank 0 gets one estimate per rank (its own exact),
/// the others `None`. Waits end at the communicator's deadline.
pub fn estimate_offsets<Cm: Communicator>(
    comm: &mut Cm,
    exchanges: usize,
) -> Result<Option<Vec<OffsetEstimate>>, CommError> {
    let exchanges = exchanges.max(1);
    let mut buf = comm.alloc(8)?;
    let rank = comm.rank();
    if rank != 0 {
        for _ in 0..exchanges {
            comm.recv(&mut buf, 1, DType::F64, 0)?;
            comm.sync()?;
            let t1 = host_now_us();
            buf.write_from_host(&t1.to_le_bytes())?;
            comm.send(&buf, 1, DType::F64, 0)?;
            comm.sync()?;
        }
        return Ok(None);
    }
    let mut out = vec![OffsetEstimate::exact(host_now_us())];
    for peer in 1..comm.world() {
        let mut best: Option<OffsetEstimate> = None;
        for _ in 0..exchanges {
            let t0 = host_now_us();
            comm.send(&buf, 1, DType::F64, peer)?;
            comm.recv(&mut buf, 1, DType::F64, peer)?;
            comm.sync()?;
            let t2 = host_now_us();
            let mut b = [0u8; 8];
            buf.read_to_host(&mut b)?;
            let t1 = f64::from_le_bytes(b);
            if !t1.is_finite() {
                return Err(CommError::Protocol {
                    rank,
                    peer,
                    detail: format!("clock reply {t1} is not a time"),
                });
            }
            let e = OffsetEstimate::from_exchange(t0, t1, t2);
            if best.is_none_or(|b| e.uncertainty_us < b.uncertainty_us) {
                best = Some(e);
            }
        }
        out.extend(best);
    }
    Ok(Some(out))
}

/// One rank's clock against rank 0's over a run: estimated before and
/// after, and how a stamp moves onto rank 0's clock.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankClock {
    pub rank: usize,
    pub base: TimeBase,
    pub before: OffsetEstimate,
    pub after: OffsetEstimate,
}

impl RankClock {
    /// The offset applied to a stamp `t` of this rank (zero on a shared
    /// clock): interpolated between the estimates before and after, held at
    /// the nearer one outside them.
    pub fn offset_at(&self, t: f64) -> f64 {
        if self.base == TimeBase::Shared {
            return 0.0;
        }
        let (b, a) = (self.before, self.after);
        let span = a.at_us - b.at_us;
        if span.is_nan() || span <= 0.0 {
            return b.offset_us;
        }
        let f = ((t - b.at_us) / span).clamp(0.0, 1.0);
        b.offset_us + f * (a.offset_us - b.offset_us)
    }

    /// Stamp `t` of this rank on rank 0's clock.
    pub fn to_base(&self, t: f64) -> f64 {
        t - self.offset_at(t)
    }

    /// How far a stamp moved onto the base may be off: zero on a shared
    /// clock, else the larger of the two estimates' bounds (an offset
    /// interpolated between two bounded estimates stays within the larger
    /// bound while the drift is steady).
    pub fn uncertainty_us(&self) -> f64 {
        match self.base {
            TimeBase::Shared => 0.0,
            TimeBase::Estimated => self.before.uncertainty_us.max(self.after.uncertainty_us),
        }
    }

    /// How much the offset moved during the run (after minus before).
    pub fn drift_us(&self) -> f64 {
        self.after.offset_us - self.before.offset_us
    }
}

#[cfg(test)]
impl RankClock {
    /// Unit tests only: a rank whose offset held still over the run,
    /// estimated within `uncertainty_us`.
    pub(crate) fn steady(rank: usize, offset_us: f64, uncertainty_us: f64) -> Self {
        let e = OffsetEstimate {
            offset_us,
            uncertainty_us,
            at_us: 0.0,
        };
        RankClock {
            rank,
            base: TimeBase::Estimated,
            before: e,
            after: e,
        }
    }
}

/// Pairs the estimates before and after a run into each rank's clock.
pub fn rank_clocks(
    base: TimeBase,
    before: &[OffsetEstimate],
    after: &[OffsetEstimate],
) -> Vec<RankClock> {
    before
        .iter()
        .zip(after)
        .enumerate()
        .map(|(rank, (&before, &after))| RankClock {
            rank,
            base,
            before,
            after,
        })
        .collect()
}

/// A device stream's clock on the host base: an event was recorded on an
/// idle stream between two host stamps, so it completed within them.
/// Later events' times after it (CUDA's elapsed times) become host times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamAnchor {
    /// The middle of the host window the anchor event completed in.
    pub host_us: f64,
    /// Half that window: how far every mapped time may be off.
    pub uncertainty_us: f64,
}

impl StreamAnchor {
    /// The anchor recorded after host stamp `before` and known complete at `after`.
    pub fn between(before: f64, after: f64) -> Self {
        StreamAnchor {
            host_us: (before + after) / 2.0,
            uncertainty_us: ((after - before) / 2.0).max(0.0),
        }
    }

    /// Host times of the events after the anchor, from the seconds between
    /// consecutive events (the anchor first), as the stream clock gives them.
    pub fn map(&self, intervals_s: &[f64]) -> Vec<f64> {
        intervals_s
            .iter()
            .scan(self.host_us, |t, dt| {
                *t += dt * 1e6;
                Some(*t)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{local, Algo};
    use std::time::Duration;

    #[test]
    fn an_exchange_bounds_the_offset_by_half_its_round_trip() {
        // The peer runs 100 us ahead; the message takes 3 us out and 5 back.
        let e = OffsetEstimate::from_exchange(1000.0, 1103.0, 1008.0);
        assert_eq!(e.offset_us, 99.0);
        assert_eq!(e.uncertainty_us, 4.0);
        assert!((e.offset_us - 100.0).abs() <= e.uncertainty_us);
    }

    #[test]
    fn offsets_interpolate_between_the_estimates() {
        let est = |offset_us, at_us| OffsetEstimate {
            offset_us,
            uncertainty_us: 2.0,
            at_us,
        };
        let mut c = RankClock {
            rank: 1,
            base: TimeBase::Estimated,
            before: est(10.0, 100.0),
            after: est(20.0, 200.0),
        };
        assert_eq!(c.to_base(150.0), 135.0);
        assert_eq!(c.offset_at(50.0), 10.0);
        assert_eq!(c.offset_at(250.0), 20.0);
        assert_eq!(c.drift_us(), 10.0);
        assert_eq!(c.uncertainty_us(), 2.0);
        c.base = TimeBase::Shared;
        assert_eq!((c.to_base(150.0), c.uncertainty_us()), (150.0, 0.0));
    }

    #[test]
    fn a_stream_anchor_maps_elapsed_times_onto_the_host() {
        let a = StreamAnchor::between(100.0, 104.0);
        assert_eq!((a.host_us, a.uncertainty_us), (102.0, 2.0));
        let t = a.map(&[10e-6, 5e-6]);
        assert!((t[0] - 112.0).abs() < 1e-9 && (t[1] - 117.0).abs() < 1e-9);
    }

    /// Threads read one clock: the true offset is zero, so every estimate
    /// must contain zero within its bound. This checks the method itself.
    #[test]
    fn on_one_clock_every_estimate_contains_zero() {
        let out = local::run(3, Algo::Auto, Duration::from_secs(30), |comm| {
            estimate_offsets(comm, 8)
        });
        let est = out.into_iter().next().unwrap().unwrap().unwrap();
        assert_eq!(est.len(), 3);
        assert_eq!(est[0].offset_us, 0.0);
        for e in &est {
            assert!(
                e.offset_us.abs() <= e.uncertainty_us + 1e-6,
                "{e:?} excludes zero"
            );
        }
    }
}
