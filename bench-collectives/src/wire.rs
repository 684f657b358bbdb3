//! The wire's figures, measured before the sweep on every rank: the ceiling
//! ladder each row is held against, the calibrated model's link, the
//! latency jitter and clock resolution behind the compare gate's floor,
//! and the noise of the measurement window.

use crate::cli::SweepConfig;
use parbench::comm::{Collective, CommResult, Communicator, DType, LinkStats, ReduceOp};
use parbench::measure::clock::IterClock;
use parbench::measure::noise::{CpuSnapshot, ForeignCpu};
use parbench::measure::placement::Placement;
use parbench::measure::{self, Ladder, PingPong, Rung};
use parbench::model::alpha_beta::RING_SLICE_BYTES;
use parbench::model::wire::{ceiling_for, working_set_bytes, working_sets_of, WireModel};
use parbench::model::{self, LinkParams, ModelAlgo};
use std::time::Instant;

/// The smallest working set of the ladders: every row below it is held
/// against its first rung.
const SMALLEST_SET: u64 = 4 << 10;
/// Bytes each stream sample moves at least (the wire's own buffers, a
/// token bucket's burst, are then a small part of it).
const STREAM_SAMPLE: u64 = 4 << 20;
/// The longest message of the stream ladders: longer ones outran loopback's
/// socket buffers and were retransmitted (see [`measure::stream_ladder`]).
const STREAM_MESSAGE: u64 = 1 << 20;
/// Samples per stream rung (each direction).
const STREAM_SAMPLES: usize = 3;
/// Timed ping-pongs behind alpha (after the warm-up).
const PING_TRIPS: usize = 200;

/// What was measured before the sweep, the same on every rank.
#[derive(Clone, Debug)]
pub struct WireFigures {
    /// The ceiling every row is held against, at its own working set.
    pub ceiling: Ladder,
    /// The calibrated model's wire (alpha, ladders, how the transport reduces).
    pub model: WireModel,
    /// Whether the model is parbench's own transport model ([`WireModel`]);
    /// otherwise (a library's collectives: nccl, mpi) the textbook forms
    /// with the ladders' bandwidths.
    pub own_transport: bool,
    /// Ping-pong figures between ranks 0 and 1 (`None` with one rank).
    pub ping: Option<PingPong>,
    /// 8-byte exchanges, every rank at once (`None` with one rank).
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
    /// The model's alpha, us (0 with one rank).
    pub fn alpha_us(&self) -> f64 {
        self.model.alpha_s * 1e6
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
        ceiling: &Ladder,
    ) -> (f64, f64) {
        let secs = if self.own_transport && !algo.is_selector() {
            self.model.predict(coll, algo, world, bytes, in_place)
        } else {
            // A library's own algorithms: the textbook forms, with the
            // ladders' bandwidth and reduction rate at the row's working set.
            let ws = working_set_bytes(coll, world, bytes, in_place);
            let gbps = self.ceiling.at(ws).unwrap_or(0.0);
            let mut link = LinkParams::from_gbps_us(gbps, self.alpha_us());
            if let Some(g) = self.model.reduce.at(ws) {
                link = link.with_reduce_gbps(g);
            }
            model::predict_textbook(coll, algo, world, bytes, &link)
        };
        // A library's own algorithms are not parbench's: a selector, whose
        // ceiling is the ladder at the call's working set.
        let library = ModelAlgo::Selector("auto".into());
        let ceiling_algo = if self.own_transport { algo } else { &library };
        let ceiling = ceiling_for(ceiling, coll, ceiling_algo, world, bytes, in_place);
        (secs.map_or(f64::NAN, |s| s * 1e6), ceiling.unwrap_or(0.0))
    }

    /// Whether each row's ceiling is measured again just before the row:
    /// on shared memory, where the ceiling is the memory system's and the
    /// machine's state moves it (see [`Self::ceiling_at_row`]).
    pub fn ceilings_per_row(&self) -> bool {
        self.own_transport && self.model.cache_states()
    }

    /// The ladder a row is held against: the pre-sweep ceiling, with its
    /// rungs at the row's working sets (the call's and its ring slice's)
    /// measured again just before the row, each the better of the two.
    ///
    /// Why: on a shared virtual machine the speed of memory moves between
    /// states lasting from milliseconds to seconds (measured on the 2-core
    /// EPYC with a 32 MiB L3: the same row's p50 at 4-13 us or 23-46 us
    /// from one run to the next, the cache-state ladders 4x apart between
    /// runs a minute apart). A ceiling taken seconds before the row can sit
    /// in the slow state while the row runs in the fast one, and the row
    /// then "beats" it. Measured next to the row, the ceiling sees the
    /// state the row sees. Only on shared memory ([`Self::ceilings_per_row`]):
    /// elsewhere the pre-sweep ladder, unchanged. Every rank calls it.
    pub fn ceiling_at_row<C: Communicator>(
        &self,
        comm: &mut C,
        coll: Collective,
        algo: &ModelAlgo,
        bytes: u64,
        in_place: bool,
    ) -> CommResult<RowCeiling> {
        if !self.ceilings_per_row() || comm.world() < 2 || bytes == 0 {
            return Ok(RowCeiling::before_the_sweep(&self.ceiling));
        }
        let (ws, slice_ws) = working_sets_of(coll, algo, comm.world(), bytes, in_place);
        let mut sets = vec![ws.max(SMALLEST_SET)];
        if slice_ws.max(SMALLEST_SET) != sets[0] {
            sets.push(slice_ws.max(SMALLEST_SET));
        }
        // The copy ladder alone: the clean-exchange ladder takes an 8 B
        // exchange's time off each of its samples, which on small working
        // sets can leave next to nothing (a rung of thousands of GB/s), and
        // the state that moves is the memory system's, which a copy sees.
        let copy = measure::copy_ladder(comm, &sets)?;
        let before = self.model.copy.at(sets[0]).unwrap_or(0.0);
        let now = copy.at(sets[0]).unwrap_or(0.0);
        Ok(RowCeiling {
            ladder: self.ceiling.with_rungs_from(&copy),
            drift: (before > 0.0 && now > 0.0).then_some(Drift {
                working_set: sets[0],
                before_gbps: before,
                here_gbps: now,
                rungs: copy.rungs.clone(),
            }),
        })
    }
}

/// The ceiling a row is held against, and the copy rate measured at the
/// row beside the pre-sweep one at the row's working set (`None` when it
/// was not measured again).
#[derive(Clone, Debug)]
pub struct RowCeiling {
    pub ladder: Ladder,
    pub drift: Option<Drift>,
}

/// The copy ladder's rung at a row's working set, before the sweep and
/// just before the row.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Drift {
    pub working_set: u64,
    pub before_gbps: f64,
    pub here_gbps: f64,
    /// The rungs measured at the row (the call's working set and its
    /// ring slice's), as [`Ladder::with_rungs_from`] puts them in.
    pub rungs: Vec<Rung>,
}

impl Drift {
    pub fn ratio(&self) -> f64 {
        self.here_gbps / self.before_gbps
    }
}

impl RowCeiling {
    fn before_the_sweep(ceiling: &Ladder) -> RowCeiling {
        RowCeiling {
            ladder: ceiling.clone(),
            drift: None,
        }
    }
}

/// The largest working set any row of the sweep touches, bytes per rank.
fn largest_set(cfg: &SweepConfig, world: usize) -> u64 {
    let top = cfg.sizes.last().copied().unwrap_or(0);
    cfg.collectives
        .iter()
        .flat_map(|&c| [false, true].map(|ip| working_set_bytes(c, world, top, ip)))
        .max()
        .unwrap_or(top)
}

/// How much faster than the wire memory must copy at a working set before
/// larger working sets cannot make the wire faster: the ladder stops there.
const LINK_BOUND: f64 = 10.0;

/// Whether the wire is a link, not memory, out of cache: the copy ladder's
/// slowest rung [`LINK_BOUND`] times the wire ceiling's slowest or more (a
/// shaped or real network link; tcp loopback and shared memory are
/// memory-bound). What the run measured says it, whatever the wire's name.
pub fn link_bound(ceiling: &Ladder, copy: &Ladder) -> bool {
    match (ceiling.floor_gbps(), copy.floor_gbps()) {
        (Some(c), Some(m)) => c > 0.0 && m >= LINK_BOUND * c,
        _ => false,
    }
}

/// The stream ladders and the ring-step ladder of a socket
/// wire, rung by rung from the smallest working set, stopping once the wire
/// is link-bound: from 1 MiB up, two rungs in a row within 15% of each
/// other on every ladder and the copy ladder [`LINK_BOUND`] times faster.
/// The rungs beyond are the last measured one, held (the method says so):
/// on a shaped link the large rungs would take minutes, and the drops a
/// long stream provokes in the link's queue leave the connection's
/// congestion window small for the sweep's first sizes.
fn link_ladders<C: Communicator>(
    comm: &mut C,
    sets: &[u64],
    copy: &Ladder,
) -> CommResult<(measure::StreamLadders, Ladder)> {
    let mut s = measure::StreamLadders::default();
    let mut step = Ladder::default();
    let mut held_from = None;
    for (i, &ws) in sets.iter().enumerate() {
        let one =
            measure::stream_ladder(comm, &[ws], STREAM_SAMPLE, STREAM_MESSAGE, STREAM_SAMPLES)?;
        let x = measure::ring_step_ladder(comm, &[ws], RING_SLICE_BYTES)?;
        s.one_way.method = one.one_way.method;
        s.duplex.method = one.duplex.method;
        step.method = x.method;
        s.one_way.rungs.extend(one.one_way.rungs);
        s.duplex.rungs.extend(one.duplex.rungs);
        step.rungs.extend(x.rungs);
        let flat = |l: &Ladder| match l.rungs.as_slice() {
            [.., a, b] => (a.gbps - b.gbps).abs() <= 0.15 * a.gbps.max(b.gbps),
            _ => false,
        };
        let fastest = [&s.one_way, &s.duplex, &step]
            .iter()
            .filter_map(|l| l.rungs.last().map(|r| r.gbps))
            .fold(0.0, f64::max);
        let memory = copy.at(ws).unwrap_or(0.0);
        if ws >= 1 << 20
            && flat(&s.one_way)
            && flat(&s.duplex)
            && flat(&step)
            && memory > LINK_BOUND * fastest
        {
            held_from = Some(i);
            break;
        }
    }
    if let Some(i) = held_from {
        let note = format!(
            "; link-bound from {} B (memory copies {LINK_BOUND}x faster there): larger working sets hold that rung",
            sets[i]
        );
        for l in [&mut s.one_way, &mut s.duplex, &mut step] {
            let last = l.rungs.last().cloned();
            if let Some(last) = last {
                for &ws in &sets[i + 1..] {
                    l.rungs.push(Rung {
                        working_set: ws,
                        bytes: ws * last.bytes / last.working_set.max(1),
                        ..last.clone()
                    });
                }
            }
            l.method.push_str(&note);
        }
    }
    Ok((s, step))
}

/// Means over ranks of one figure each.
fn mean_over_ranks<C: Communicator>(comm: &mut C, v: f64) -> CommResult<f64> {
    let world = comm.world().max(1) as f64;
    let all = measure::gather_f64(comm, &[v])?;
    Ok(all.iter().filter_map(|x| x.first()).sum::<f64>() / world)
}

/// Measures the wire before the sweep (every rank calls it):
/// - `local`: the copy ladder (every rank copying at once) is both the
///   ceiling and the transfer bandwidth; reductions read the sender's bytes
///   in place;
/// - a device backend: its own copy figure (device or peer copy) as a
///   one-rung ceiling;
/// - any other (tcp, mpi): the stream ladders through the communicator's
///   send/recv, one way and both directions at once; the ceiling is the
///   better of the two at each working set;
/// - on every backend: the reduction ladder (gamma), the copy ladder
///   (copies within a rank), the ping-pong (alpha, jitter), the clock's
///   resolution, and the window's foreign CPU time.
pub fn measure_wire<C: Communicator>(
    comm: &mut C,
    cfg: &SweepConfig,
    placement: &Placement,
) -> CommResult<WireFigures> {
    let t = Instant::now();
    let link_start = comm.link_stats();
    let noise_start = CpuSnapshot::now();
    let world = comm.world();
    let sets = measure::working_sets(SMALLEST_SET, largest_set(cfg, world).max(SMALLEST_SET));
    let device = comm.device_ceiling()?;
    let copy = measure::copy_ladder(comm, &sets)?;
    let reduce = measure::reduce_ladder(comm, &sets, DType::F32, ReduceOp::Sum)?;
    let (ceiling, model, own_transport) = if let Some((method, gbps)) = device {
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
        let model = WireModel {
            duplex: rung.clone(),
            one_way: rung.clone(),
            copy: rung.clone(),
            // The device reduces at its copy speed or better: folded into beta.
            ..WireModel::default()
        };
        (rung, model, false)
    } else if comm.backend() == "local" || world < 2 {
        // Shared memory: where a byte's cache line was decides its cost.
        let fresh = if world > 1 {
            measure::fresh_ladders(comm, &sets, true)?
        } else {
            measure::FreshLadders::default()
        };
        // A received byte whose line the receiver can read where it is
        // (the sender's untouched input) moves at the clean-exchange rate;
        // the ceiling is the better of that and a copy within each rank.
        let (duplex, ceiling) = if world > 1 {
            (fresh.clean.clone(), copy.best_of(&fresh.clean))
        } else {
            (copy.clone(), copy.clone())
        };
        let model = WireModel {
            duplex: duplex.clone(),
            one_way: duplex,
            copy: copy.clone(),
            reduce: reduce.clone(),
            pull: fresh.pull,
            claim: fresh.claim,
            both: fresh.both,
            ..WireModel::default()
        };
        (ceiling, model, comm.backend() == "local")
    } else {
        let (s, step) = link_ladders(comm, &sets, &copy)?;
        // A ring step is an exchange after an exchange, not a stream, of at
        // most a slice block, walking through the call's buffers: its
        // transfer rate is the ring-step ladder's; the ceiling is the best
        // of the three.
        let ceiling = s.one_way.best_of(&s.duplex).best_of(&step);
        let model = WireModel {
            duplex: step,
            one_way: s.one_way.clone(),
            copy: copy.clone(),
            reduce: reduce.clone(),
            ..WireModel::default()
        };
        let own = comm.backend() == "tcp";
        (ceiling, model, own)
    };
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
        model: WireModel {
            alpha_s: ping.as_ref().map_or(0.0, |p| p.median_us * 1e-6),
            alpha_exchange_s: exchange.as_ref().map_or(0.0, |p| p.median_us * 1e-6),
            ..model
        },
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

    fn ladder(gbps: &[f64]) -> Ladder {
        Ladder {
            method: "test".into(),
            rungs: gbps
                .iter()
                .enumerate()
                .map(|(i, &g)| Rung {
                    working_set: 4096 << i,
                    bytes: 2048 << i,
                    gbps: g,
                    median_gbps: g,
                })
                .collect(),
        }
    }

    /// Figures as recorded here: a 1 Gbit/s shaped link (0.12 GB/s against
    /// a 6 GB/s copy out of cache) is link-bound; tcp loopback (2.7 against
    /// 6) is not; nothing measured says nothing.
    #[test]
    fn a_link_is_told_apart_from_memory_by_its_ladders() {
        let copy = ladder(&[100.0, 40.0, 6.2]);
        assert!(link_bound(&ladder(&[0.15, 0.13, 0.12]), &copy));
        assert!(!link_bound(&ladder(&[9.8, 5.0, 2.74]), &copy));
        assert!(!link_bound(&Ladder::default(), &copy));
        assert!(!link_bound(&ladder(&[0.0]), &copy));
    }
}
