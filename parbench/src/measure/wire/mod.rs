//! The wire's figures, measured before a sweep on every rank: the ceiling
//! ladder each row is held against, the calibrated model's link, the
//! latency jitter and clock resolution behind the compare gate's floor,
//! and the noise of the measurement window; the ceiling measured again at
//! a row ([`WireFigures::ceiling_at_row`]) and after the sweep
//! ([`recheck`]). Any binary that times collectives against the wire can
//! use it: what it needs of the sweep is the rows it will time
//! ([`SweepRows`]).

mod at_row;
pub mod recheck;
mod rows;
mod rungs;

pub use at_row::{MODEL_AT_ROW_FROM, MODEL_AT_ROW_LONGEST_CALL_S};
pub use rows::{largest_set, row_count, SweepRows};
pub use rungs::{link_bound, socket_ceiling, socket_ladders};

use crate::comm::{Collective, CommResult, Communicator, DType, LinkStats, ReduceOp};
use crate::measure::clock::IterClock;
use crate::measure::core_state::{state_probe, WaitBudget};
use crate::measure::noise::{CpuSnapshot, ForeignCpu};
use crate::measure::placement::Placement;
use crate::measure::{self, CoreState, Ladder, PingPong, Rung};
use crate::model::wire::{ceiling_for, working_set_bytes, working_sets_of, RowRungs, WireModel};
use crate::model::{self, LinkParams, ModelAlgo};
use rows::{row_working_sets, steep_sets};
use rungs::{again_where_dipped, ladders_in_state, link_ladders, SocketLadders};
use std::time::Instant;

/// The smallest working set of the ladders: every row below it is held
/// against its first rung.
const SMALLEST_SET: u64 = 4 << 10;
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
    /// The cores' state these figures were measured in
    /// ([`measure::core_state_probe`]; `None` where it is not tracked:
    /// [`measure::core_state::tracks_state`]).
    pub state: Option<CoreState>,
    /// The working sets of shared memory's rungs that stayed out of that
    /// state through every try ([`ladders_in_state`]).
    pub rungs_off_state: Vec<u64>,
    /// The working sets measured again because a rung there lay far below
    /// both its neighbours ([`again_where_dipped`]).
    pub rungs_dipped: Vec<u64>,
    /// Whether the ceiling is a socket-like wire's ([`socket_ladders`]:
    /// not shared memory, not a device's copy figure).
    pub socket: bool,
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
    /// model), priced with `rungs` where they were measured at the row
    /// ([`Self::rungs_at_row`]), and the ceiling at its working set, GB/s
    /// (0 when none was measured).
    pub fn row_references(
        &self,
        coll: Collective,
        algo: &ModelAlgo,
        world: usize,
        bytes: u64,
        in_place: bool,
        (ceiling, rungs): (&Ladder, &RowRungs),
    ) -> (f64, f64) {
        let secs = if self.own_transport && !algo.is_selector() {
            self.model
                .with_rungs(rungs)
                .predict(coll, algo, world, bytes, in_place)
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
    rows: &SweepRows<'_>,
    placement: &Placement,
    mut state: Option<CoreState>,
) -> CommResult<WireFigures> {
    let t = Instant::now();
    let link_start = comm.link_stats();
    let noise_start = CpuSnapshot::now();
    let world = comm.world();
    let sets = measure::working_sets(SMALLEST_SET, largest_set(rows, world).max(SMALLEST_SET));
    let device = comm.device_ceiling()?;
    let local = device.is_none() && (comm.backend() == "local" || world < 2);
    let (copy, reduce) = if local {
        (Ladder::default(), Ladder::default())
    } else {
        (
            measure::copy_ladder(comm, &sets)?,
            measure::reduce_ladder(comm, &sets, DType::F32, ReduceOp::Sum)?,
        )
    };
    let mut rungs_off_state = Vec::new();
    let mut rungs_dipped = Vec::new();
    let socket = device.is_none() && !local;
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
    } else if local {
        // Shared memory: where a byte's cache line was decides its cost.
        // Shared memory: every rung in one state of the cores.
        let mut budget = WaitBudget::default();
        let first = ladders_in_state(comm, &sets, &mut state, &mut budget)?;
        let (first, again) = again_where_dipped(first, |sets| {
            ladders_in_state(comm, sets, &mut state, &mut budget)
        })?;
        rungs_dipped = again;
        let added = steep_sets(&first.all(), &row_working_sets(comm, rows));
        let lad = if added.is_empty() {
            first
        } else {
            let merged = first.merged(&ladders_in_state(comm, &added, &mut state, &mut budget)?);
            let (lad, again) = again_where_dipped(merged, |sets| {
                ladders_in_state(comm, sets, &mut state, &mut budget)
            })?;
            rungs_dipped.extend(again);
            lad
        };
        rungs_off_state = lad.off_state;
        let (copy, reduce, fresh, fused, far) =
            (lad.copy, lad.reduce, lad.fresh, lad.fused, lad.far);
        // A received byte whose line the receiver can read where it is
        // (the sender's untouched input) moves at the clean-exchange rate;
        // the ceiling is the better of that and a copy within each rank.
        let (duplex, ceiling) = if world > 1 {
            let clean = fresh.clean.where_bytes_outlast(fresh.latency_taken_off_s);
            (fresh.clean.clone(), copy.best_of(&clean))
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
            reduce_into: fused.into,
            reduce_from: fused.from,
            both_far: far.both,
            pull_far: far.pull,
            claim_far: far.claim,
            ..WireModel::default()
        };
        (ceiling, model, comm.backend() == "local")
    } else {
        let (
            SocketLadders {
                stream: s,
                step,
                fused,
                far,
            },
            again,
        ) = link_ladders(comm, &sets, &copy, &mut state, &mut rungs_off_state)?;
        rungs_dipped = again;
        // A ring step is an exchange after an exchange, not a stream, of at
        // most a slice block, walking through the call's buffers: its
        // transfer rate is the ring-step ladder's; the ceiling is the best
        // of the three.
        let ceiling = socket_ceiling(&s, &step);
        let model = WireModel {
            duplex: step,
            one_way: s.one_way.clone(),
            copy: copy.clone(),
            reduce: reduce.clone(),
            reduce_into: fused.into,
            reduce_from: fused.from,
            both_far: far.both,
            pull_far: far.pull,
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
        state,
        rungs_off_state,
        rungs_dipped: {
            rungs_dipped.sort_unstable();
            rungs_dipped.dedup();
            rungs_dipped
        },
        socket,
    })
}

/// [`measure_wire`] in the state of the cores a probe finds now (where it
/// is tracked), each shared-memory rung measured in it
/// ([`ladders_in_state`]).
pub fn measure_wire_in_one_state<C: Communicator>(
    comm: &mut C,
    rows: &SweepRows<'_>,
    placement: &Placement,
) -> CommResult<WireFigures> {
    let now = state_probe(comm)?;
    measure_wire(comm, rows, placement, now)
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
