//! The wire's figures, measured before the sweep on every rank: the ceiling
//! ladder each row is held against, the calibrated model's link, the
//! latency jitter and clock resolution behind the compare gate's floor,
//! and the noise of the measurement window.

use crate::cli::SweepConfig;
use crate::core_state::{same_state, state_probe, wait_for_state, WaitBudget, STATE_RATIO};
use parbench::comm::{Collective, CommResult, Communicator, DType, LinkStats, ReduceOp};
use parbench::measure::clock::IterClock;
use parbench::measure::noise::{CpuSnapshot, ForeignCpu};
use parbench::measure::placement::Placement;
use parbench::measure::{self, CoreState, Ladder, PingPong, Rung};
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
    /// The cores' state these figures were measured in
    /// ([`measure::core_state_probe`]; `None` where it is not tracked:
    /// [`crate::core_state::tracks_state`]).
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
pub(crate) fn largest_set(cfg: &SweepConfig, world: usize) -> u64 {
    let top = cfg.sizes.last().copied().unwrap_or(0);
    cfg.collectives
        .iter()
        .flat_map(|&c| [false, true].map(|ip| working_set_bytes(c, world, top, ip)))
        .max()
        .unwrap_or(top)
}

/// The working sets (the call's and its ring slice's, per rank) of every
/// row `cfg` sweeps, sorted, each once.
fn row_working_sets<C: Communicator>(comm: &C, cfg: &SweepConfig) -> Vec<u64> {
    let world = comm.world();
    let mut out = Vec::new();
    for &coll in &cfg.collectives {
        for &dtype in &cfg.dtypes {
            for &size in &cfg.sizes {
                let count = crate::sweep::row_count(coll, size, dtype, world);
                let bytes = coll.size_of(count, dtype.size(), world);
                let algo = ModelAlgo::of(
                    &comm.algo_for(coll, coll.send_elems(count, world) * dtype.size()),
                );
                for in_place in [false, true] {
                    let (ws, slice) = working_sets_of(coll, &algo, world, bytes, in_place);
                    out.extend([ws, slice]);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// How far apart two neighbouring rungs of a ladder may lie before a row's
/// working set between them is measured as a rung of its own.
const STEEP: f64 = 1.5;
/// Rungs added between the doubling ones at most.
const MOST_ADDED_RUNGS: usize = 16;

/// The rows' working sets that lie between two neighbouring rungs of any
/// of `ladders` whose figures are more than [`STEEP`]x apart: where the
/// memory system changes regime (a peer's private cache spilling into the
/// shared one, the shared one into memory) between two doublings, and a
/// rung interpolated in between can be 2-3x off (the EPYC VM's claim
/// ladder: 13 GB/s at 1 MiB, 42 at 2 MiB, while an out-of-place
/// all_gather of 1 MiB, working set 1.5 MiB, ran as the 1 MiB rung).
/// Those are measured too, the largest steps first, at most
/// [`MOST_ADDED_RUNGS`].
fn steep_sets(ladders: &[&Ladder], rows: &[u64]) -> Vec<u64> {
    let mut wanted: Vec<(f64, u64)> = Vec::new();
    for &ws in rows {
        let step = ladders
            .iter()
            .filter_map(|l| {
                let hi = l.rungs.iter().position(|r| r.working_set >= ws)?;
                let (a, b) = (l.rungs.get(hi.checked_sub(1)?)?, &l.rungs[hi]);
                (b.working_set != ws && a.gbps > 0.0 && b.gbps > 0.0)
                    .then(|| (a.gbps / b.gbps).max(b.gbps / a.gbps))
            })
            .fold(0.0, f64::max);
        if step > STEEP {
            wanted.push((step, ws));
        }
    }
    wanted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut sets: Vec<u64> = wanted
        .into_iter()
        .take(MOST_ADDED_RUNGS)
        .map(|(_, ws)| ws)
        .collect();
    sets.sort_unstable();
    sets
}

/// Shared memory's ladders, measured rung by rung in one state of the cores.
struct StateLadders {
    copy: Ladder,
    reduce: Ladder,
    fresh: measure::FreshLadders,
    fused: measure::FusedLadders,
    /// From [`FAR_FROM`] up: a sliced ring's all-gather steps
    /// ([`measure::far_ladders`]; empty below, and with one rank).
    far: measure::FarLadders,
    /// The working sets of the rungs whose probes never both matched the state.
    off_state: Vec<u64>,
}

/// The smallest working set the far-destination ladder is measured at: a
/// ring of 2 ranks slices a message from 1 MiB up, and the model reads the
/// ladder only for sliced calls.
const FAR_FROM: u64 = 1 << 20;

impl StateLadders {
    fn all(&self) -> [&Ladder; 10] {
        let f = &self.fresh;
        [
            &self.copy,
            &self.reduce,
            &f.clean,
            &f.pull,
            &f.claim,
            &f.both,
            &self.fused.into,
            &self.fused.from,
            &self.far.both,
            &self.far.pull,
        ]
    }

    /// Each ladder joined with `more`'s by `join` (the off-state sets of both).
    fn joined(self, more: &StateLadders, join: fn(&Ladder, &Ladder) -> Ladder) -> StateLadders {
        let (f, m) = (&self.fresh, &more.fresh);
        StateLadders {
            copy: join(&self.copy, &more.copy),
            reduce: join(&self.reduce, &more.reduce),
            fresh: measure::FreshLadders {
                clean: join(&f.clean, &m.clean),
                pull: join(&f.pull, &m.pull),
                claim: join(&f.claim, &m.claim),
                both: join(&f.both, &m.both),
                latency_taken_off_s: f.latency_taken_off_s.max(m.latency_taken_off_s),
            },
            fused: join_fused(&self.fused, &more.fused, join),
            far: measure::FarLadders {
                both: join(&self.far.both, &more.far.both),
                pull: join(&self.far.pull, &more.far.pull),
            },
            off_state: {
                let mut v = self.off_state;
                v.extend(&more.off_state);
                v.sort_unstable();
                v.dedup();
                v
            },
        }
    }

    /// These ladders with `more`'s rungs put in at their working sets.
    fn merged(self, more: &StateLadders) -> StateLadders {
        self.joined(more, Ladder::merged)
    }
}

impl RungSet for StateLadders {
    fn ladders(&self) -> Vec<&Ladder> {
        self.all().to_vec()
    }
    fn better_rungs(self, again: &Self) -> Self {
        self.joined(again, Ladder::better_rungs)
    }
}

fn join_fused(
    a: &measure::FusedLadders,
    b: &measure::FusedLadders,
    join: fn(&Ladder, &Ladder) -> Ladder,
) -> measure::FusedLadders {
    measure::FusedLadders {
        into: join(&a.into, &b.into),
        from: join(&a.from, &b.from),
    }
}

/// Ladders measured together at each working set, whose rungs can be
/// measured again ([`again_where_dipped`]).
trait RungSet: Sized {
    fn ladders(&self) -> Vec<&Ladder>;
    /// At each working set `again` measured, each ladder's better rung.
    fn better_rungs(self, again: &Self) -> Self;
}

/// How far below both neighbours a rung must lie to be measured again
/// ([`Ladder::dipped_sets`]): as far as two states of the cores lie apart.
const DIP_SHARE: f64 = 1.0 / STATE_RATIO;

/// `got` with the working sets where any ladder dipped below both its
/// neighbours measured again by `measure` (all its ladders there, while a
/// dip remains, at most [`RUNG_TRIES`] tries in all), each ladder keeping
/// the better rung; and those working sets. A dip that is real stays: it
/// comes back each time. Every rank must call it with the same ladders
/// (they are means over ranks), so every rank measures the same sets.
fn again_where_dipped<L: RungSet>(
    mut got: L,
    mut measure: impl FnMut(&[u64]) -> CommResult<L>,
) -> CommResult<(L, Vec<u64>)> {
    let mut again: Vec<u64> = Vec::new();
    for _ in 1..RUNG_TRIES {
        let mut dips: Vec<u64> = got
            .ladders()
            .iter()
            .flat_map(|l| l.dipped_sets(DIP_SHARE))
            .collect();
        dips.sort_unstable();
        dips.dedup();
        if dips.is_empty() {
            break;
        }
        let more = measure(&dips)?;
        got = got.better_rungs(&more);
        again.extend(dips);
    }
    again.sort_unstable();
    again.dedup();
    Ok((got, again))
}

/// The transport's reducing receives at `sets` (the sweep's f32 sums);
/// empty where it has none to time ([`measure::fused_reduce_ladders`]).
fn fused_ladders<C: Communicator>(comm: &mut C, sets: &[u64]) -> CommResult<measure::FusedLadders> {
    Ok(measure::fused_reduce_ladders(comm, sets, DType::F32, ReduceOp::Sum)?.unwrap_or_default())
}

/// Tries per rung at most.
const RUNG_TRIES: usize = 3;

/// The copy, reduction and cache-state ladders at `sets`, each working set
/// measured once the cores are in `state` ([`wait_for_state`]) and again
/// (at most [`RUNG_TRIES`] times) while the core-state probes before and
/// after it do not both find `state`; a rung still out of it is kept and
/// counted. While no rung has been kept, a wait that ends in another state
/// makes that state `state`: the one probe before the measurement may
/// have caught a passing one. On the 2-core EPYC VM the host moved the
/// cores during a wire measurement of 2 s in about a third of the runs:
/// the copy ladder came out in one state and the cache-state ladders in
/// another (shared lines at 25-29 GB/s where the probes after them moved
/// them at 6-8), and every row's model was 2-3x off.
fn ladders_in_state<C: Communicator>(
    comm: &mut C,
    sets: &[u64],
    state: &mut Option<CoreState>,
    budget: &mut WaitBudget,
) -> CommResult<StateLadders> {
    let world = comm.world();
    let mut out: Option<StateLadders> = None;
    for &ws in sets {
        let (rung, in_state) = rung_in_state(comm, state, budget, out.is_none(), |comm| {
            let one = [ws];
            Ok(StateLadders {
                copy: measure::copy_ladder(comm, &one)?,
                reduce: measure::reduce_ladder(comm, &one, DType::F32, ReduceOp::Sum)?,
                fresh: if world > 1 {
                    measure::fresh_ladders(comm, &one, true)?
                } else {
                    measure::FreshLadders::default()
                },
                fused: fused_ladders(comm, &one)?,
                far: if world > 1 && ws >= FAR_FROM {
                    measure::far_ladders(comm, &one)?.unwrap_or_default()
                } else {
                    measure::FarLadders::default()
                },
                off_state: Vec::new(),
            })
        })?;
        let rung = if in_state {
            rung
        } else {
            StateLadders {
                off_state: vec![ws],
                ..rung
            }
        };
        out = Some(match out {
            None => rung,
            Some(o) => o.merged(&rung),
        });
    }
    Ok(out.unwrap_or(StateLadders {
        copy: Ladder::default(),
        reduce: Ladder::default(),
        fresh: measure::FreshLadders::default(),
        fused: measure::FusedLadders::default(),
        far: measure::FarLadders::default(),
        off_state: Vec::new(),
    }))
}

/// One rung measured by `measure` once the wire is in `state`
/// ([`wait_for_state`]) and again (at most [`RUNG_TRIES`] times) while the
/// probes before and after it do not both find `state`; and whether the
/// last try did. With `may_adopt` (no rung kept yet), a wait that ends in
/// another state makes that state `state`. Where the state is not tracked
/// it measures once.
fn rung_in_state<C: Communicator, L>(
    comm: &mut C,
    state: &mut Option<CoreState>,
    budget: &mut WaitBudget,
    may_adopt: bool,
    mut measure: impl FnMut(&mut C) -> CommResult<L>,
) -> CommResult<(L, bool)> {
    let mut tries = 0;
    loop {
        tries += 1;
        let (before, _) = wait_for_state(comm, state.as_ref(), budget)?;
        if may_adopt && !same_state(state.as_ref(), before.as_ref()) {
            *state = before;
        }
        let rung = measure(comm)?;
        let after = state_probe(comm)?;
        let in_state = same_state(state.as_ref(), before.as_ref())
            && same_state(state.as_ref(), after.as_ref());
        if in_state || tries >= RUNG_TRIES {
            return Ok((rung, in_state));
        }
    }
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
    state: &mut Option<CoreState>,
    off_state: &mut Vec<u64>,
) -> CommResult<(SocketLadders, Vec<u64>)> {
    let mut s = measure::StreamLadders::default();
    let mut step = Ladder::default();
    let mut fused = measure::FusedLadders::default();
    let mut held_from = None;
    let mut budget = WaitBudget::default();
    for (i, &ws) in sets.iter().enumerate() {
        let (one, in_state) = rung_in_state(comm, state, &mut budget, i == 0, |comm| {
            socket_rungs(comm, &[ws])
        })?;
        if !in_state {
            off_state.push(ws);
        }
        for (to, from) in [
            (&mut s.one_way, one.stream.one_way),
            (&mut s.duplex, one.stream.duplex),
            (&mut step, one.step),
            (&mut fused.into, one.fused.into),
            (&mut fused.from, one.fused.from),
        ] {
            to.method = from.method;
            to.rungs.extend(from.rungs);
        }
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
    let measured = SocketLadders {
        stream: s,
        step,
        fused,
    };
    let (measured, again) = again_where_dipped(measured, |sets| {
        let mut got: Option<SocketLadders> = None;
        for &ws in sets {
            let (one, _) = rung_in_state(comm, state, &mut budget, false, |comm| {
                socket_rungs(comm, &[ws])
            })?;
            got = Some(match got {
                None => one,
                Some(g) => g.joined(&one, Ladder::merged),
            });
        }
        Ok(got.unwrap_or_default())
    })?;
    let SocketLadders {
        stream: mut s,
        mut step,
        mut fused,
    } = measured;
    if let Some(i) = held_from {
        let note = format!(
            "; link-bound from {} B (memory copies {LINK_BOUND}x faster there): larger working sets hold that rung",
            sets[i]
        );
        let (into, from) = (&mut fused.into, &mut fused.from);
        for l in [&mut s.one_way, &mut s.duplex, &mut step, into, from] {
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
    // A reducing receive moves its bytes through the same socket as a ring
    // step and reduces them too: it cannot outrun the step. Its samples end
    // after 10 ms (`measure::fused`), and on a shaped link a sample that
    // short rides the token bucket's burst: measured through 1 Gbit/s
    // (0.125 GB/s), rungs of 0.26 and 2.4 GB/s, and a model of in-place
    // all_reduce 30% under every row from 1 MiB.
    let note = "; held at most at the ring-step ladder's figure (a reducing receive crosses the same socket)";
    fused.into = fused.into.capped_by(&step, note);
    fused.from = fused.from.capped_by(&step, note);
    Ok((
        SocketLadders {
            stream: s,
            step,
            fused,
        },
        again,
    ))
}

/// A socket wire's ladders, measured together at each working set.
#[derive(Default)]
struct SocketLadders {
    stream: measure::StreamLadders,
    step: Ladder,
    fused: measure::FusedLadders,
}

impl RungSet for SocketLadders {
    fn ladders(&self) -> Vec<&Ladder> {
        vec![
            &self.stream.one_way,
            &self.stream.duplex,
            &self.step,
            &self.fused.into,
            &self.fused.from,
        ]
    }
    fn better_rungs(self, again: &Self) -> Self {
        self.joined(again, Ladder::better_rungs)
    }
}

impl SocketLadders {
    /// Each ladder joined with `more`'s by `join`.
    fn joined(&self, more: &SocketLadders, join: fn(&Ladder, &Ladder) -> Ladder) -> SocketLadders {
        SocketLadders {
            stream: measure::StreamLadders {
                one_way: join(&self.stream.one_way, &more.stream.one_way),
                duplex: join(&self.stream.duplex, &more.stream.duplex),
            },
            step: join(&self.step, &more.step),
            fused: join_fused(&self.fused, &more.fused, join),
        }
    }
}

/// Every ladder of a socket wire at `sets`.
fn socket_rungs<C: Communicator>(comm: &mut C, sets: &[u64]) -> CommResult<SocketLadders> {
    let (stream, step) = socket_ladders(comm, sets)?;
    Ok(SocketLadders {
        stream,
        step,
        fused: fused_ladders(comm, sets)?,
    })
}

/// A socket-like wire's stream ladders (one way, both ways) and ring-step
/// ladder at `sets`, as its ceiling and model measure them. Every rank
/// must call it.
pub(crate) fn socket_ladders<C: Communicator>(
    comm: &mut C,
    sets: &[u64],
) -> CommResult<(measure::StreamLadders, Ladder)> {
    let s = measure::stream_ladder(comm, sets, STREAM_SAMPLE, STREAM_MESSAGE, STREAM_SAMPLES)?;
    let step = measure::ring_step_ladder(comm, sets, RING_SLICE_BYTES)?;
    Ok((s, step))
}

/// A socket-like wire's ceiling: the best of its three ladders at each
/// working set.
pub(crate) fn socket_ceiling(s: &measure::StreamLadders, step: &Ladder) -> Ladder {
    s.one_way.best_of(&s.duplex).best_of(step)
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
    mut state: Option<CoreState>,
) -> CommResult<WireFigures> {
    let t = Instant::now();
    let link_start = comm.link_stats();
    let noise_start = CpuSnapshot::now();
    let world = comm.world();
    let sets = measure::working_sets(SMALLEST_SET, largest_set(cfg, world).max(SMALLEST_SET));
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
        let added = steep_sets(&first.all(), &row_working_sets(comm, cfg));
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
            ..WireModel::default()
        };
        (ceiling, model, comm.backend() == "local")
    } else {
        let (
            SocketLadders {
                stream: s,
                step,
                fused,
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
    cfg: &SweepConfig,
    placement: &Placement,
) -> CommResult<WireFigures> {
    let now = state_probe(comm)?;
    measure_wire(comm, cfg, placement, now)
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

    /// One ladder measured at a time, for [`again_where_dipped`].
    struct One(Ladder);

    impl RungSet for One {
        fn ladders(&self) -> Vec<&Ladder> {
            vec![&self.0]
        }
        fn better_rungs(self, again: &Self) -> Self {
            One(self.0.better_rungs(&again.0))
        }
    }

    /// The rung of `full` at each of `sets`, as a measurement of those alone.
    fn at_sets(full: &Ladder, sets: &[u64]) -> One {
        One(Ladder {
            method: full.method.clone(),
            rungs: full
                .rungs
                .iter()
                .filter(|r| sets.contains(&r.working_set))
                .cloned()
                .collect(),
        })
    }

    /// A stall during one rung's samples (as recorded on the EPYC VM: the
    /// 2 MiB rung of a far-destination ladder at 2.0 GB/s between 13.8 and
    /// 12.5) is measured again and the better rung kept; a dip that comes
    /// back every time is the wire's and stays; a ladder without a dip is
    /// not measured again.
    #[test]
    fn a_rung_far_below_both_neighbours_is_measured_again() {
        let stalled = ladder(&[13.8, 2.0, 12.5, 13.0]);
        let steady = ladder(&[13.8, 13.1, 12.5, 13.0]);
        let mut asked = Vec::new();
        let (got, again) = again_where_dipped(One(stalled.clone()), |sets| {
            asked.push(sets.to_vec());
            Ok(at_sets(&steady, sets))
        })
        .unwrap();
        assert_eq!(asked, vec![vec![8192]]);
        assert_eq!(again, vec![8192]);
        assert_eq!(got.0, steady);

        let mut tries = 0;
        let (got, again) = again_where_dipped(One(stalled.clone()), |sets| {
            tries += 1;
            Ok(at_sets(&stalled, sets))
        })
        .unwrap();
        assert_eq!(tries, RUNG_TRIES - 1);
        assert_eq!(again, vec![8192]);
        assert_eq!(got.0, stalled);

        let (got, again) = again_where_dipped(One(steady.clone()), |_| -> CommResult<One> {
            panic!("a ladder without a dip was measured again")
        })
        .unwrap();
        assert!(again.is_empty());
        assert_eq!(got.0, steady);
    }

    /// Figures as recorded here: a 1 Gbit/s shaped link (0.12 GB/s against
    /// a 6 GB/s copy out of cache) is link-bound; tcp loopback (2.7 against
    /// 6) is not; nothing measured says nothing.
    #[test]
    fn working_sets_between_rungs_far_apart_are_measured_too() {
        let l = |rungs: &[(u64, f64)]| Ladder {
            method: String::new(),
            rungs: rungs
                .iter()
                .map(|&(working_set, gbps)| Rung {
                    working_set,
                    bytes: working_set / 2,
                    gbps,
                    median_gbps: gbps,
                })
                .collect(),
        };
        // claim: a step of 3x between 1 and 2 MiB, a gentle one between 2
        // and 4; copy flat.
        let claim = l(&[(1 << 20, 13.0), (2 << 20, 40.0), (4 << 20, 45.0)]);
        let copy = l(&[(1 << 20, 50.0), (2 << 20, 48.0), (4 << 20, 47.0)]);
        let rows = [1 << 20, 3 << 19, 3 << 20, 4 << 20];
        // 1.5 MiB lies in the step; 1 and 4 MiB are rungs; 3 MiB in a gentle stretch.
        assert_eq!(steep_sets(&[&copy, &claim], &rows), vec![3 << 19]);
        assert!(steep_sets(&[&copy], &rows).is_empty());
        // Beyond the ends nothing is between two rungs.
        assert!(steep_sets(&[&claim], &[1 << 10, 1 << 30]).is_empty());
    }

    #[test]
    fn a_link_is_told_apart_from_memory_by_its_ladders() {
        let copy = ladder(&[100.0, 40.0, 6.2]);
        assert!(link_bound(&ladder(&[0.15, 0.13, 0.12]), &copy));
        assert!(!link_bound(&ladder(&[9.8, 5.0, 2.74]), &copy));
        assert!(!link_bound(&Ladder::default(), &copy));
        assert!(!link_bound(&ladder(&[0.0]), &copy));
    }
}
