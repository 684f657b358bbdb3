//! The wire's figures, measured once before a sweep on every rank: the
//! ceiling ladder each row is held against, the alpha-beta-gamma model's
//! coefficients (alpha from the 8 B exchange, beta from the ceiling ladder
//! at the row's working set, gamma from the reduction kernel's ladder), the
//! latency jitter and clock resolution behind the compare gate's floor,
//! and the noise of the measurement window. Any binary that times
//! collectives against the wire can use it: what it needs of the sweep is
//! the rows it will time ([`SweepRows`]).

mod rows;

pub use rows::{largest_set, row_count, SweepRows};

use crate::comm::{Collective, CommResult, Communicator, DType, LinkStats, ReduceOp};
use crate::measure::clock::IterClock;
use crate::measure::noise::{CpuSnapshot, ForeignCpu};
use crate::measure::placement::Placement;
use crate::measure::{self, Ladder, PingPong, Rung};
use crate::model::ladder::working_set_bytes;
use crate::model::{self, LinkParams, ModelAlgo};
use std::time::Instant;

/// The smallest working set of the ladders: every row below it is held
/// against its first rung.
const SMALLEST_SET: u64 = 4 << 10;
/// Timed ping-pongs and exchanges behind alpha (after the warm-up).
const PING_TRIPS: usize = 200;
/// Bytes each stream sample moves at least (a token bucket's burst is then
/// a small part of it).
const STREAM_SAMPLE: u64 = 4 << 20;
/// The longest message of the stream ladders: longer ones outran loopback's
/// socket buffers and were retransmitted ([`measure::stream_ladder`]).
const STREAM_MESSAGE: u64 = 1 << 20;
/// Samples per stream rung (each direction).
const STREAM_SAMPLES: usize = 3;
/// How much faster than the wire memory must copy before the stream
/// ladder stops: larger working sets cannot make a link faster.
const LINK_BOUND: f64 = 10.0;

/// What was measured before the sweep, the same on every rank.
#[derive(Clone, Debug)]
pub struct WireFigures {
    /// The ceiling every row is held against, at its own working set, and
    /// the model's beta there.
    pub ceiling: Ladder,
    /// A memory copy within each rank, every rank at once.
    pub copy: Ladder,
    /// The reduction kernel `acc += src` (float sum), every rank at once: gamma.
    pub reduce: Ladder,
    /// Whether the collectives are parbench's own algorithms (local, tcp:
    /// sliced rings, [`model::predict`]); otherwise a library's (nccl,
    /// mpi: the textbook forms, [`model::predict_textbook`]).
    pub own_transport: bool,
    /// Ping-pong figures between ranks 0 and 1 (`None` with one rank).
    pub ping: Option<PingPong>,
    /// 8-byte exchanges, every rank at once (`None` with one rank): alpha.
    pub exchange: Option<PingPong>,
    /// The per-iteration clock's resolution, us.
    pub clock_us: f64,
    /// Wall time these measurements took, seconds (rank 0's).
    pub cost_s: f64,
    /// Other processes' CPU time during these measurements.
    pub noise: Option<ForeignCpu>,
    /// Where each rank runs: its CPU, or `None` when unbound; and why (rank 0's words).
    pub cpus: Vec<Option<usize>>,
    pub placement_why: String,
    /// Rank 0's sockets (`None` without sockets) and the segments every
    /// rank's kernel retransmitted while the wire was measured.
    pub link: Option<LinkStats>,
}

impl WireFigures {
    /// A wire known by its ladders alone (parbench's own transport, one
    /// rank's figures: no latency, noise or placement measured), as a test
    /// or a reader of records builds one.
    pub fn of_ladders(ceiling: Ladder, copy: Ladder, reduce: Ladder) -> WireFigures {
        WireFigures {
            ceiling,
            copy,
            reduce,
            own_transport: true,
            ping: None,
            exchange: None,
            clock_us: 0.0,
            cost_s: 0.0,
            noise: None,
            cpus: Vec::new(),
            placement_why: String::new(),
            link: None,
        }
    }

    /// The model's alpha, us: the median 8 B exchange (every rank sending
    /// while it receives, as a collective's steps do), else the ping-pong's
    /// half trip; 0 with one rank.
    pub fn alpha_us(&self) -> f64 {
        self.exchange
            .as_ref()
            .or(self.ping.as_ref())
            .map_or(0.0, |p| p.median_us)
    }

    /// The floor below which a change of a time is never called a
    /// regression: the clock's resolution or the wire's latency jitter
    /// (p90 - p10 of the ping-pong half trips), the larger, us.
    pub fn floor_us(&self) -> f64 {
        let jitter = |p: &Option<PingPong>| p.as_ref().map_or(0.0, PingPong::jitter_us);
        self.clock_us
            .max(jitter(&self.ping))
            .max(jitter(&self.exchange))
    }

    /// The alpha-beta-gamma link at working set `ws`: alpha, beta from the
    /// ceiling ladder there, gamma from the reduction ladder there (folded
    /// into beta where it was not measured).
    pub fn link_at(&self, ws: u64) -> LinkParams {
        let gbps = self.ceiling.at(ws).unwrap_or(0.0);
        let link = LinkParams::from_gbps_us(gbps, self.alpha_us());
        match self.reduce.at(ws) {
            Some(g) => link.with_reduce_gbps(g),
            None => link,
        }
    }

    /// A row's two references: the model's time, us (NaN when there is no
    /// model), and the ceiling at its working set, GB/s (0 when none was
    /// measured).
    pub fn row_references(
        &self,
        coll: Collective,
        algo: &ModelAlgo,
        world: usize,
        bytes: u64,
        in_place: bool,
    ) -> (f64, f64) {
        let ws = working_set_bytes(coll, world, bytes, in_place);
        let link = self.link_at(ws);
        let secs = if self.own_transport {
            model::predict(coll, algo, world, bytes, &link)
        } else {
            model::predict_textbook(coll, algo, world, bytes, &link)
        };
        let ceiling = self.ceiling.at(ws).unwrap_or(0.0);
        (secs.map_or(f64::NAN, |s| s * 1e6), ceiling)
    }

    /// Whether the wire is a link, not memory, out of cache: the copy
    /// ladder's slowest rung [`LINK_BOUND`] times the ceiling's slowest or
    /// more (a shaped or real network link; loopback and shared memory are
    /// memory-bound).
    pub fn link_bound(&self) -> bool {
        match (self.ceiling.floor_gbps(), self.copy.floor_gbps()) {
            (Some(c), Some(m)) => c > 0.0 && m >= LINK_BOUND * c,
            _ => false,
        }
    }
}

/// Means over ranks of one figure each.
fn mean_over_ranks<C: Communicator>(comm: &mut C, v: f64) -> CommResult<f64> {
    let world = comm.world().max(1) as f64;
    let all = measure::gather_f64(comm, &[v])?;
    Ok(all.iter().filter_map(|x| x.first()).sum::<f64>() / world)
}

/// The ceiling of a socket-like wire (tcp, mpi): the better of one stream
/// and both directions at once through the communicator's send/recv, rung
/// by rung from the smallest working set, stopping once the wire is
/// link-bound (from 1 MiB up, two rungs in a row within 15% and memory
/// copying [`LINK_BOUND`] times faster): the rungs beyond hold the last
/// one, since on a shaped link the large rungs would take minutes.
fn socket_ceiling<C: Communicator>(
    comm: &mut C,
    sets: &[u64],
    copy: &Ladder,
) -> CommResult<Ladder> {
    let mut best = Ladder::default();
    for (i, &ws) in sets.iter().enumerate() {
        let s = measure::stream_ladder(comm, &[ws], STREAM_SAMPLE, STREAM_MESSAGE, STREAM_SAMPLES)?;
        let rung = s.one_way.best_of(&s.duplex);
        best.method = rung.method;
        best.rungs.extend(rung.rungs);
        let flat = match best.rungs.as_slice() {
            [.., a, b] => (a.gbps - b.gbps).abs() <= 0.15 * a.gbps.max(b.gbps),
            _ => false,
        };
        let fastest = best.rungs.last().map_or(0.0, |r| r.gbps);
        if ws >= 1 << 20 && flat && copy.at(ws).unwrap_or(0.0) > LINK_BOUND * fastest {
            if let Some(last) = best.rungs.last().cloned() {
                for &more in &sets[i + 1..] {
                    best.rungs.push(Rung {
                        working_set: more,
                        bytes: more * last.bytes / last.working_set.max(1),
                        ..last.clone()
                    });
                }
            }
            best.method.push_str(&format!(
                "; link-bound from {ws} B (memory copies {LINK_BOUND}x faster there): larger working sets hold that rung"
            ));
            break;
        }
    }
    Ok(best)
}

/// Measures the wire before the sweep (every rank calls it):
/// - a device backend: its own copy figure (device or peer copy) as a
///   one-rung ceiling;
/// - `local` (or one rank): the copy ladder, every rank copying at once;
/// - any other (tcp, mpi): the stream ladders through the communicator's
///   send/recv ([`socket_ceiling`]);
/// - on every backend: the reduction ladder (gamma), the ping-pong and the
///   8 B exchange (alpha, jitter), the clock's resolution, and the
///   window's foreign CPU time.
pub fn measure_wire<C: Communicator>(
    comm: &mut C,
    rows: &SweepRows<'_>,
    placement: &Placement,
) -> CommResult<WireFigures> {
    let t = Instant::now();
    let link_start = comm.link_stats();
    let noise_start = CpuSnapshot::now();
    let world = comm.world();
    let sets = measure::working_sets(SMALLEST_SET, largest_set(rows, world).max(SMALLEST_SET));
    let (ceiling, copy, reduce) = if let Some((method, gbps)) = comm.device_ceiling()? {
        let gbps = mean_over_ranks(comm, gbps)?;
        let rung = Ladder {
            method: format!("{method}, every rank at once, mean per rank"),
            rungs: vec![Rung {
                working_set: 256 << 20,
                bytes: 256 << 20,
                gbps,
                median_gbps: gbps,
            }],
        };
        // The device reduces at its copy speed or better: folded into beta.
        (rung.clone(), rung, Ladder::default())
    } else {
        let copy = measure::copy_ladder(comm, &sets)?;
        let reduce = measure::reduce_ladder(comm, &sets, DType::F32, ReduceOp::Sum)?;
        let ceiling = if comm.backend() == "local" || world < 2 {
            copy.clone()
        } else {
            socket_ceiling(comm, &sets, &copy)?
        };
        (ceiling, copy, reduce)
    };
    let own_transport = matches!(comm.backend(), "local" | "tcp");
    let ping = measure::ping_pong(comm, PING_TRIPS)?;
    let exchange = measure::exchange_latency(comm, PING_TRIPS)?;
    let clock_us = IterClock::get().resolution_ns() / 1e3;
    let clock_us = measure::gather_f64(comm, &[clock_us])?
        .iter()
        .filter_map(|v| v.first().copied())
        .fold(0.0, f64::max);
    let noise = ForeignCpu::across_ranks(comm, noise_start.as_ref())?;
    let cpus = measure::gather_f64(comm, &[placement.cpu.map_or(-1.0, |c| c as f64)])?
        .iter()
        .map(|v| v.first().filter(|c| **c >= 0.0).map(|&c| c as usize))
        .collect();
    let link = retransmits_since(comm, link_start)?;
    let cost_s = measure::gather_f64(comm, &[t.elapsed().as_secs_f64()])?
        .first()
        .and_then(|v| v.first().copied())
        .unwrap_or(0.0);
    Ok(WireFigures {
        ceiling,
        copy,
        reduce,
        own_transport,
        ping,
        exchange,
        clock_us,
        cost_s,
        noise,
        cpus,
        placement_why: placement.why.clone(),
        link,
    })
}

/// Rank 0's socket figures with the segments every rank's kernel
/// retransmitted since `start` (this rank's figures then), summed over ranks;
/// `None` without sockets. Every rank must call it.
pub fn retransmits_since<C: Communicator>(
    comm: &mut C,
    start: Option<LinkStats>,
) -> CommResult<Option<LinkStats>> {
    let now = comm.link_stats();
    let mine = match (&now, &start) {
        (Some(n), Some(s)) => n
            .retransmitted_segments
            .saturating_sub(s.retransmitted_segments),
        (Some(n), None) => n.retransmitted_segments,
        _ => 0,
    };
    let total: f64 = measure::gather_f64(comm, &[mine as f64])?
        .iter()
        .filter_map(|v| v.first())
        .sum();
    Ok(now.map(|n| LinkStats {
        retransmitted_segments: total as u64,
        ..n
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{local, Algo};
    use std::time::Duration;

    fn figures(ceiling: &[(u64, f64)], copy: &[(u64, f64)]) -> WireFigures {
        WireFigures::of_ladders(
            Ladder::exact("ceiling", ceiling),
            Ladder::exact("copy", copy),
            Ladder::exact("reduce", copy),
        )
    }

    /// A row's ceiling is the ladder at its working set, and its model the
    /// alpha-beta-gamma form priced there.
    #[test]
    fn a_row_is_priced_at_its_working_set() {
        let w = figures(&[(1 << 20, 40.0), (64 << 20, 10.0)], &[(1 << 20, 40.0)]);
        let ring = ModelAlgo::of("ring");
        let (model_us, ceiling) =
            w.row_references(Collective::AllReduce, &ring, 2, 32 << 20, false);
        assert_eq!(ceiling, 10.0);
        let link = w.link_at(64 << 20);
        let want = model::predict(Collective::AllReduce, &ring, 2, 32 << 20, &link).unwrap();
        assert!((model_us - want * 1e6).abs() < 1e-6, "{model_us} vs {want}");
        let (_, small) = w.row_references(Collective::AllReduce, &ring, 2, 1 << 10, true);
        assert_eq!(small, 40.0);
    }

    #[test]
    fn a_link_is_told_apart_from_memory_by_its_ladders() {
        let link = figures(&[(1 << 20, 0.12)], &[(1 << 20, 8.0)]);
        let memory = figures(&[(1 << 20, 3.0)], &[(1 << 20, 8.0)]);
        assert!(link.link_bound() && !memory.link_bound());
    }

    /// Every rank gets the same figures, and every ladder reaches the
    /// sweep's largest working set.
    #[test]
    fn the_wire_is_measured_alike_on_every_rank() {
        let colls = [Collective::AllReduce];
        let dtypes = [DType::F32];
        let sizes = [8u64, 1 << 20];
        let rows = SweepRows {
            collectives: &colls,
            dtypes: &dtypes,
            sizes: &sizes,
        };
        let placement = Placement {
            cpu: None,
            why: "test".into(),
        };
        let got = local::run(2, Algo::Auto, Duration::from_secs(20), |c| {
            measure_wire(c, &rows, &placement)
        });
        let all: Vec<WireFigures> = got.into_iter().map(Result::unwrap).collect();
        assert_eq!(all[0].ceiling, all[1].ceiling);
        for w in &all {
            assert!(w.ceiling.covers(2 << 20) && w.reduce.covers(2 << 20));
            assert!(w.alpha_us() > 0.0 && w.own_transport);
        }
    }
}
