//! The calibrated model of parbench's own CPU transports: link parameters
//! per cache regime, from ladders of working sets measured in the same run,
//! and what each algorithm really moves on a rank.
//!
//! The textbook alpha-beta forms ([`super::alpha_beta`]) charge every byte
//! one `beta`, whatever its size. A CPU's memory is not one wire: a copy
//! whose buffers stay in L1 runs several times faster than one out of the
//! last-level cache, so a beta measured out of cache overpredicts every
//! in-cache size (by up to 60x on this project's machines) and one measured
//! in cache underpredicts the large ones. Here each bandwidth is a
//! [`Ladder`]: GB/s at a set of working sets (the bytes each rank touches),
//! interpolated at the row's own working set ([`working_set_bytes`]).
//!
//! What a rank does ([`Moves`]), beyond the textbook terms: each part of a
//! call (a ring step's receive or reduction, a copy an algorithm makes
//! within the rank) with where its bytes' cache lines were ([`Part`]):
//!
//! - received bytes cost the transfer ladder's beta: for exchange steps
//!   (ring, recursive, pairwise: every rank sends while it receives) the
//!   duplex figure, for tree and chain steps the one-way figure; on shared
//!   memory the figure for the line's state: a byte whose line the
//!   receiver's cache already holds (an input left as it was since the last
//!   call), one the sender has just written (`pull`), one written into a
//!   buffer the peer read since (`claim`), or both (`both`);
//! - reduced bytes cost that plus gamma, the reduction kernel's rate;
//! - copies an algorithm makes within the rank (out-of-place all_gather's
//!   own block, recursive doubling's running result, the inputs of
//!   out-of-place non-ring all_reduce, broadcast and reduce, in-place
//!   all_to_all's buffer) cost the copy ladder's beta (`claim` when a peer
//!   reads the copy).
//!
//! Every coefficient is measured, before the sweep and (on parbench's own
//! transport, [`super::row_rungs`]) again just before a row: nothing here is fitted
//! to the sweep's own times. [`fit_on_wire`] is the fit that does that.

use super::algo::ModelAlgo;
use super::alpha_beta::{terms, AlphaBetaTerms, RING_SLICE_BYTES};
use crate::comm::algo::Algorithm;
use crate::comm::collective::CostForm;
use crate::comm::Collective;

pub use super::ladder::{Ladder, Rung};
pub use super::row_rungs::{model_of_record, rungs_of_record, LadderId, RowRungs};
pub use super::wire_fit::{fit_on_rows, fit_on_wire, fit_on_wire_at_rows, WireFit};

/// Bytes each rank's buffers hold in one call of `coll` on `p` ranks with
/// nccl-tests' size `n_bytes`: out of place the send and the receive
/// buffer, in place the one buffer. all_reduce, broadcast, reduce,
/// all_to_all, sendrecv: `2n` out of place, `n` in place; all_gather (`n`
/// the gathered output): `n + n/p` and `n`; reduce_scatter (`n` the whole
/// input): `n + n/p` and `n`. The algorithms' scratch (at most two ring
/// blocks of 512 KiB, or one buffer for recursive doubling) is left out.
pub fn working_set_bytes(coll: Collective, p: usize, n_bytes: u64, in_place: bool) -> u64 {
    if in_place {
        return n_bytes;
    }
    // The larger buffer is `n`; the other holds as many of its blocks as
    // the byte rule gives it (all_gather's send and reduce_scatter's
    // receive: one of p).
    let p = p.max(1);
    let (send, recv) = (coll.send_blocks(p) as u64, coll.recv_blocks(p) as u64);
    n_bytes + n_bytes * send.min(recv) / send.max(recv).max(1)
}

/// A call's working set per rank and its slice's: a ring runs a message of
/// more than p x [`RING_SLICE_BYTES`] as slices of that many bytes, whose
/// blocks are reduced and forwarded while they are still in cache; other
/// algorithms are one slice.
pub fn working_sets_of(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    n_bytes: u64,
    in_place: bool,
) -> (u64, u64) {
    let ws = working_set_bytes(coll, p, n_bytes, in_place);
    let slice = if algo.ran() == Some(Algorithm::Ring) {
        n_bytes.min((p.max(1) as u64).saturating_mul(RING_SLICE_BYTES))
    } else {
        n_bytes
    };
    (ws, working_set_bytes(coll, p, slice, in_place))
}

/// The working sets the model reads a call's ladders at, per rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallSets {
    /// The call's ([`working_set_bytes`]).
    pub ws: u64,
    /// Its ring slice's ([`working_sets_of`]).
    pub slice_ws: u64,
    /// A call that runs as one slice: the working set of a ladder whose
    /// transfer is one of its blocks (`2 n / p`: the ladders' working set
    /// is two buffers of one transfer each), where its cache-state figures
    /// are read when that is below `ws`. What a peer's cache holds of a
    /// block is the block it has just read or written, not the send
    /// buffer beside it: on the EPYC VM (512 KiB L2 per core) claiming a
    /// block of 512 KiB cost as the claim ladder's 1 MiB rung (13-14 GB/s)
    /// in an out-of-place all_gather or all_reduce of 1 MiB (working sets
    /// 1.5 and 2 MiB, where the ladder reads 25-40 GB/s). `None` for a
    /// sliced ring, whose blocks' lines a whole call of traffic has pushed
    /// out of the peer's private cache before they are claimed again.
    pub block_ws: Option<u64>,
}

/// The [`CallSets`] of `coll` with `algo` on `p` ranks, `n_bytes`, in or
/// out of place.
pub fn call_sets(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    n_bytes: u64,
    in_place: bool,
) -> CallSets {
    let (ws, slice_ws) = working_sets_of(coll, algo, p, n_bytes, in_place);
    let p = p.max(1) as u64;
    let one_slice = n_bytes <= p.saturating_mul(RING_SLICE_BYTES);
    CallSets {
        ws,
        slice_ws,
        block_ws: one_slice.then(|| 2 * (n_bytes / p)),
    }
}

/// What a part of a call does with its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// Received into place (a copy out of the sender's bytes).
    Receive,
    /// Received and reduced into place.
    Reduce,
    /// Copied within the rank (not over the wire).
    Copy,
}

/// One part of a call on one rank's critical path: bytes per byte of `n`,
/// and where their cache lines were. Only shared memory tells the states
/// apart ([`WireModel::cache_states`]): a byte the sender wrote during the
/// call sits modified in another core's cache (`fresh`), and a buffer the
/// peer read since this rank last wrote it must be taken back from the
/// peer's cache before it is written again (`claimed`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Part {
    pub op: Op,
    /// Bytes per byte of `n`.
    pub bytes: f64,
    /// The source was written by the sender during the call (a forwarded
    /// block, a partial sum, a block copied in just before), not an input
    /// left as it was since the last call.
    pub fresh: bool,
    /// The destination was read by a peer since this rank last wrote it.
    pub claimed: bool,
    /// The source was written within the current slice of a sliced
    /// algorithm (a ring's block reduced or forwarded a moment ago): its
    /// lines are priced at the slice's working set, where they still sit,
    /// not at the whole call's.
    pub near: bool,
    /// A near part whose destination a peer also read within the current
    /// slice (an in-place all-reduce's all-gather writes the blocks its
    /// reduce-scatter has just sent): both ends sit in the slice's lines,
    /// and the whole part is priced at the slice's working set. Measured
    /// on the EPYC VM (512 KiB L2 per core): the all-gather steps of an
    /// in-place all_reduce of 2 MiB took 83-89 us for 1 MiB received, the
    /// `both` ladder's rate at the slice's 1 MiB (13 GB/s), not the 54 us
    /// that half at the call's 2 MiB (37 GB/s) gives.
    #[serde(default)]
    pub dest_near: bool,
    /// An out-of-place ring all-gather's copy of its own block into the
    /// receive buffer, slice by slice just before the slice goes round:
    /// priced by its own walk ([`WireModel::claim_far`]) where measured.
    #[serde(default)]
    pub own_block: bool,
}

/// What one rank does on the critical path of one call.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Moves {
    /// Messages on the critical path (each costs `alpha`).
    pub latency_steps: f64,
    /// Whether the steps are exchanges (every rank sends while receiving:
    /// ring, recursive, pairwise, sendrecv) rather than one-way (trees, chains).
    pub duplex: bool,
    pub parts: Vec<Part>,
}

impl Moves {
    /// Bytes per byte of `n` the parts of `op` move.
    pub fn bytes(&self, op: Op) -> f64 {
        self.parts
            .iter()
            .filter(|p| p.op == op)
            .map(|p| p.bytes)
            .sum()
    }
}

fn part(op: Op, bytes: f64, fresh: bool, claimed: bool) -> Part {
    Part {
        op,
        bytes,
        fresh,
        claimed,
        near: false,
        dest_near: false,
        own_block: false,
    }
}

/// A part whose fresh source was written within the current slice.
fn near(p: Part) -> Part {
    Part { near: p.fresh, ..p }
}

/// The parts of a ring all-gather's p - 1 steps of `b` (per byte of n)
/// each, block by block as `comm/algo/ring.rs` runs them: step s receives
/// the block the left neighbour received at step s - 1 (the first step:
/// the left's own block, fresh when `first_fresh`) into a block this rank
/// forwards at step s + 1 (claimed: the right neighbour read it in the last
/// call) or, at the last step, one nobody reads (unless `last_claimed`:
/// in place the right neighbour read every block during the reduce-scatter).
fn ring_gather_parts(p: usize, b: f64, first_fresh: bool, last_claimed: bool) -> Vec<Part> {
    // Every fresh block of an all-gather was written in this slice (reduced,
    // copied in or received a step ago).
    (0..p.saturating_sub(1))
        .map(|s| {
            let last = s + 2 == p;
            near(part(
                Op::Receive,
                b,
                s > 0 || first_fresh,
                !last || last_claimed,
            ))
        })
        .collect()
}

/// The parts of a ring reduce-scatter's p - 1 steps: the first reduces the
/// left neighbour's block of its input (`first_fresh` when that input is
/// the last call's output, in place), later ones its partial sums; each
/// writes a buffer the right neighbour reads at the next step (claimed),
/// the last one the output (`last_claimed` when a peer reads it: in an
/// all-reduce's all-gather).
fn ring_scatter_parts(p: usize, b: f64, first_fresh: bool, last_claimed: bool) -> Vec<Part> {
    // Partial sums are a step old; the first step's fresh input (in place)
    // is the last call's output.
    (0..p.saturating_sub(1))
        .map(|s| {
            let last = s + 2 == p;
            let x = part(Op::Reduce, b, s > 0 || first_fresh, !last || last_claimed);
            if s > 0 {
                near(x)
            } else {
                x
            }
        })
        .collect()
}

/// [`Moves`] of `coll` run with `algo` (a name [`terms`] knows; not a
/// selector) on `p` ranks, `n_bytes`, in or out of place, as parbench's CPU
/// algorithms run it (`comm/collective/`, `comm/algo/`), by the cost form
/// the collective's file names for `algo`. Rings are followed
/// step by step (the default sweep's algorithms from 32 KiB); recursive
/// doubling and halving, trees, chains and pairwise exchanges are counted
/// from their textbook terms with the copies they make, sources as fresh
/// where the algorithm forwards what it received.
pub fn moves(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    n_bytes: u64,
    in_place: bool,
) -> Option<Moves> {
    let t: AlphaBetaTerms = terms(coll, algo, p, n_bytes)?;
    // terms() is Some only for an algorithm that ran.
    let algo = algo.ran()?;
    // The cost form says the structure (the collective's file names it).
    let form = coll.spec().form(algo)?;
    let duplex = !matches!(
        form,
        CostForm::TreeAllReduce | CostForm::BinomialTree { .. } | CostForm::Chain { .. }
    );
    let done = |parts: Vec<Part>| {
        Some(Moves {
            latency_steps: t.latency_steps,
            duplex,
            parts,
        })
    };
    if p <= 1 || n_bytes == 0 {
        return done(Vec::new());
    }
    let pf = p as f64;
    let b = 1.0 / pf;
    let out = !in_place;
    let received = (t.bytes_factor - t.reduce_factor).max(0.0);
    let reduced = t.reduce_factor;
    let parts = match form {
        CostForm::RingAllReduce => {
            // Out of place the first step reduces the peer's send buffer
            // where it lies; in place the buffer holds the last call's result.
            let mut v = ring_scatter_parts(p, b, in_place, true);
            // In place every block the all-gather writes was sent (read by
            // the right neighbour) in this slice's reduce-scatter.
            v.extend(
                ring_gather_parts(p, b, true, in_place)
                    .into_iter()
                    .map(|x| Part {
                        dest_near: in_place && x.near,
                        ..x
                    }),
            );
            v
        }
        CostForm::RingPass { reduced: true } => ring_scatter_parts(p, b, false, false),
        CostForm::RingPass { reduced: false } => {
            // Out of place each rank copies its own block into the receive
            // buffer (which the right neighbour read last call), then sends it.
            let mut v = if out {
                vec![Part {
                    own_block: true,
                    ..part(Op::Copy, b, false, true)
                }]
            } else {
                Vec::new()
            };
            v.extend(ring_gather_parts(p, b, out, false));
            v
        }
        CostForm::RecursiveDoublingAllReduce => {
            // Each step copies the running result (read by the partner) and
            // reduces the partner's copy into the buffer.
            let steps = t.latency_steps;
            let mut v = vec![
                part(Op::Copy, steps, false, true),
                part(Op::Reduce, reduced, true, false),
            ];
            if out {
                v.push(part(Op::Copy, 1.0, false, false));
            }
            v
        }
        CostForm::HalvingDoublingAllReduce | CostForm::TreeAllReduce => {
            let mut v = vec![
                part(Op::Reduce, reduced, true, true),
                part(Op::Receive, received, true, true),
            ];
            if out {
                v.push(part(Op::Copy, 1.0, false, false));
            }
            v
        }
        CostForm::RecursiveDoublingAllGather | CostForm::HalvingReduceScatter => vec![
            part(Op::Receive, received, true, true),
            part(Op::Reduce, reduced, true, true),
        ],
        CostForm::BinomialTree { reduced: false } | CostForm::Chain { reduced: false } => {
            let mut v = vec![part(
                Op::Receive,
                received,
                out || !matches!(form, CostForm::BinomialTree { .. }) || p > 2,
                p > 2,
            )];
            if out {
                v.push(part(Op::Copy, 1.0, false, true));
            }
            v
        }
        CostForm::BinomialTree { reduced: true } | CostForm::Chain { reduced: true } => vec![
            part(Op::Copy, 1.0, false, true),
            part(Op::Reduce, reduced, true, false),
        ],
        CostForm::Pairwise => vec![
            part(Op::Copy, if out { b } else { 1.0 }, false, false),
            part(Op::Receive, received, in_place, false),
        ],
        CostForm::SendRecv => vec![part(Op::Receive, received, false, false)],
    };
    done(parts.into_iter().filter(|p| p.bytes > 0.0).collect())
}

/// A wire measured before the sweep: its latencies, its transfer, copy and
/// reduction bandwidths per working set, and how its transport moves bytes.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WireModel {
    /// Seconds per one-way message (tree and chain steps): the median of
    /// timed ping-pong half round trips.
    pub alpha_s: f64,
    /// Seconds per exchange step (every rank sends while it receives: ring,
    /// recursive, pairwise, sendrecv): the median of timed 8-byte
    /// exchanges. 0: as `alpha_s`.
    #[serde(default)]
    pub alpha_exchange_s: f64,
    /// GB/s of a received byte when every rank sends while it receives
    /// (on shared memory: a byte whose line the receiver's cache already
    /// holds, an input left as it was since the last call).
    pub duplex: Ladder,
    /// GB/s of a received byte on a one-way path (one stream).
    pub one_way: Ladder,
    /// GB/s of a memory copy within a rank, every rank at once.
    pub copy: Ladder,
    /// GB/s of accumulator of the reduction kernel `acc op= src`.
    pub reduce: Ladder,
    /// Shared memory's cache states ([`Part`]): receiving a fresh byte into
    /// a private buffer, writing a claimed buffer, both in one pass. Empty
    /// ladders (sockets, whose bytes go through the kernel's own buffers):
    /// every received byte costs `duplex` or `one_way`.
    #[serde(default)]
    pub pull: Ladder,
    #[serde(default)]
    pub claim: Ladder,
    #[serde(default)]
    pub both: Ladder,
    /// The host transports' reducing receives, one pass over each operand
    /// (`crate::measure::fused_reduce_ladders`): `acc op= received` (an
    /// in-place ring's steps, partial sums) and `out = base op received`
    /// (an out-of-place ring's first step). Empty (a library's reductions,
    /// records from before them): a reduced byte costs its receive plus
    /// the reduction kernel's pass ([`Self::reduce`]).
    #[serde(default)]
    pub reduce_into: Ladder,
    #[serde(default)]
    pub reduce_from: Ladder,
    /// Shared memory and parbench's sockets: a fresh byte received into a
    /// block this rank last wrote a call ago and the peer has just read,
    /// after a reduce-scatter step, by the destination's bytes
    /// (`crate::measure::far_ladders`): the all-gather steps of a sliced
    /// in-place ring, whose destination lines have left the rank's cache.
    /// Empty (other backends, records from before it): those steps cost
    /// `both` (sockets: the ring step) at the slice's working set.
    #[serde(default)]
    pub both_far: Ladder,
    /// Shared memory and parbench's sockets: a fresh byte received into a
    /// block this rank last wrote a call ago and nobody read, after a step
    /// that received the peer's input into the block beside it
    /// (`crate::measure::far_ladders`): the all-gather steps of a sliced
    /// out-of-place ring. Empty: those steps cost `pull` (sockets: the ring
    /// step), half at the slice's working set, half at the call's.
    #[serde(default)]
    pub pull_far: Ladder,
    /// Shared memory: an out-of-place all-gather's copy of its own block
    /// into the receive buffer, whose lines the peer read a call ago, by
    /// the receive buffer's bytes (`crate::measure::far_ladders`), walked
    /// slice by slice as the ring copies it, each copy followed by the
    /// step that sends the block. A sliced call's copy costs the slower
    /// of this and `claim` at the call's working set (the whole buffer
    /// copied, then sent). Empty (sockets, records from before it): the
    /// copy costs `claim`.
    #[serde(default)]
    pub claim_far: Ladder,
}

/// Seconds per byte of a ladder at a working set (infinite when unknown).
fn secs_per_byte(l: &Ladder, ws: u64) -> f64 {
    match l.at(ws) {
        Some(g) if g > 0.0 => 1.0 / (g * 1e9),
        _ => f64::INFINITY,
    }
}

impl WireModel {
    /// Whether the wire tells cache states apart (shared memory: the
    /// `pull`, `claim` and `both` ladders were measured).
    pub fn cache_states(&self) -> bool {
        !(self.pull.rungs.is_empty() || self.claim.rungs.is_empty() || self.both.rungs.is_empty())
    }

    /// Whether a reduced part is priced by a reducing receive, and by
    /// which: `Some(true)` for `reduce_from`, `Some(false)` for
    /// `reduce_into`. A fresh source (a partial sum, an in-place ring's
    /// block) is reduced into the accumulator (`reduce_into`), the
    /// sender's untouched input into a third buffer (`reduce_from`). On
    /// shared memory both were measured into a buffer the peer had read,
    /// so they price claimed parts only; sockets' bytes cross the kernel's
    /// buffers whatever their lines' state. `None` where the ladder is
    /// empty.
    fn fused_for(&self, part: &Part) -> Option<bool> {
        let from = !part.fresh;
        let l = if from {
            &self.reduce_from
        } else {
            &self.reduce_into
        };
        let measured = part.claimed || !self.cache_states();
        (measured && !l.rungs.is_empty()).then_some(from)
    }

    /// Seconds per byte of one part at working set `ws`:
    /// - a receive: the wire's figure for its cache states (shared memory:
    ///   `duplex` for a line the receiver holds, `pull` for a fresh one
    ///   into a private buffer, `claim` into a claimed one, `both` for a
    ///   fresh one into a claimed one; sockets: `duplex`, or `one_way` for
    ///   one-way steps);
    /// - a reduction: the transport's reducing receive where it was
    ///   measured ([`Self::reduce_into`], [`Self::reduce_from`]), else that
    ///   receive plus gamma (the reduction's own pass over both operands);
    /// - a copy within the rank: `copy`, or `claim` into a claimed buffer.
    pub fn part_seconds_per_byte(&self, part: &Part, duplex: bool, ws: u64) -> f64 {
        self.part_seconds_at(part, duplex, ws, ws, &mut |id, at| {
            secs_per_byte(self.ladder(id), at)
        })
    }

    /// [`Self::part_seconds_per_byte`] with the cache-state figures at
    /// `state_ws`, each ladder read through `read` (seconds per byte of a
    /// ladder at a working set).
    fn part_seconds_at(
        &self,
        part: &Part,
        duplex: bool,
        ws: u64,
        state_ws: u64,
        read: &mut dyn FnMut(LadderId, u64) -> f64,
    ) -> f64 {
        let wire = if duplex {
            LadderId::Duplex
        } else {
            LadderId::OneWay
        };
        let states = self.cache_states();
        let mut move_cost = |fresh: bool, claimed: bool| -> f64 {
            let (l, at) = match (states, fresh, claimed) {
                (false, _, _) | (true, false, false) => (wire, ws),
                (true, true, false) => (LadderId::Pull, state_ws),
                (true, false, true) => (LadderId::Claim, state_ws),
                (true, true, true) => (LadderId::Both, state_ws),
            };
            read(l, at)
        };
        match part.op {
            Op::Receive => move_cost(part.fresh, part.claimed),
            Op::Reduce => match self.fused_for(part) {
                Some(from) => {
                    // A ladder's rung holds two (into) or four (from)
                    // buffers of one transfer: one slice's block is read
                    // at the working set its buffers make.
                    let (l, buffers) = if from {
                        (LadderId::ReduceFrom, 2)
                    } else {
                        (LadderId::ReduceInto, 1)
                    };
                    read(l, state_ws.saturating_mul(buffers).min(ws))
                }
                None => move_cost(part.fresh, part.claimed) + read(LadderId::Reduce, ws),
            },
            Op::Copy => {
                if states && part.claimed {
                    read(LadderId::Claim, state_ws)
                } else {
                    read(LadderId::Copy, ws)
                }
            }
        }
    }

    /// The bytes-dependent part of a call's cost, seconds: what `m` costs
    /// on this wire for `n_bytes`, at the call's working sets `at`
    /// ([`call_sets`]):
    /// - a part at the call's working set, or (a [`Part::near`] one) half
    ///   at the slice's and half at the call's: its source was written
    ///   within the slice and still sits in cache, while its destination is
    ///   the call's buffer, as far away as the call's working set puts it
    ///   (measured on the EPYC VM, 32 MiB L3: out-of-place all_gather from
    ///   8 MiB ran 1.4-1.8x slower than a model pricing the whole part at
    ///   the slice's working set);
    /// - the cache-state figures of a call that runs as one slice at most
    ///   at [`CallSets::block_ws`];
    /// - a sliced ring's all-gather steps at the far ladders where they
    ///   were measured, at the call's receive buffer: in place
    ///   ([`Part::dest_near`]) [`Self::both_far`], out of place (a fresh
    ///   byte into a block nobody read) [`Self::pull_far`]; their
    ///   destination blocks were written a call ago and have left the
    ///   rank's cache (on the Intel Xeon VM those steps ran at 10-11 and
    ///   12-13 GB/s where `both` and `pull` near the slice read 15-17);
    /// - a sliced out-of-place all-gather's copy of its own block at the
    ///   slower of [`Self::claim_far`] (at the call's receive buffer) and
    ///   `claim` at the call's working set.
    pub fn bytes_seconds(&self, m: &Moves, n_bytes: u64, at: &CallSets) -> f64 {
        self.bytes_seconds_read(m, n_bytes, at, &mut |id, ws| {
            secs_per_byte(self.ladder(id), ws)
        })
    }

    /// The ladders and working sets [`Self::bytes_seconds`] reads for `m`
    /// at `at`, each once, in order: what a row's model rests on, and what
    /// measuring them again at the row takes.
    pub fn reads(&self, m: &Moves, n_bytes: u64, at: &CallSets) -> Vec<(LadderId, u64)> {
        let mut seen = Vec::new();
        self.bytes_seconds_read(m, n_bytes, at, &mut |id, ws| {
            seen.push((id, ws));
            0.0
        });
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    fn bytes_seconds_read(
        &self,
        m: &Moves,
        n_bytes: u64,
        at: &CallSets,
        read: &mut dyn FnMut(LadderId, u64) -> f64,
    ) -> f64 {
        let n = n_bytes as f64;
        let state_at = |ws: u64| at.block_ws.map_or(ws, |b| ws.min(b));
        let sliced = at.block_ws.is_none();
        let mut total = 0.0;
        for p in &m.parts {
            let mut cost =
                |ws: u64| self.part_seconds_at(p, m.duplex, ws, state_at(ws), &mut *read);
            let far_pull = p.op == Op::Receive && p.fresh && !p.claimed;
            // The far ladders are read at the call's receive buffer,
            // n bytes for the rings that slice (all_reduce, all_gather).
            let secs = if p.dest_near && sliced && !self.both_far.rungs.is_empty() {
                read(LadderId::BothFar, n_bytes)
            } else if far_pull && sliced && !self.pull_far.rungs.is_empty() {
                read(LadderId::PullFar, n_bytes)
            } else if p.own_block && sliced && !self.claim_far.rungs.is_empty() {
                // Where either walk finds the lines still in the peer's
                // cache, the row's copy finds most of them there too.
                let whole = cost(at.ws);
                let in_slices = read(LadderId::ClaimFar, n_bytes);
                whole.max(in_slices)
            } else if p.dest_near {
                cost(at.slice_ws)
            } else if p.near {
                0.5 * cost(at.slice_ws) + 0.5 * cost(at.ws)
            } else {
                cost(at.ws)
            };
            total += p.bytes * n * secs;
        }
        total
    }

    /// Predicted seconds of one `coll` with `algo` on `p` ranks, `n_bytes`
    /// (nccl-tests' size), in or out of place: `L alpha` plus
    /// [`Self::bytes_seconds`] at the call's [`call_sets`]. `None` for a
    /// selector or an algorithm without a model, or when a ladder the call
    /// needs is empty.
    pub fn predict(
        &self,
        coll: Collective,
        algo: &ModelAlgo,
        p: usize,
        n_bytes: u64,
        in_place: bool,
    ) -> Option<f64> {
        let m = moves(coll, algo, p, n_bytes, in_place)?;
        let at = call_sets(coll, algo, p, n_bytes, in_place);
        let t = m.latency_steps * self.alpha_for(&m) + self.bytes_seconds(&m, n_bytes, &at);
        t.is_finite().then_some(t)
    }

    /// The latency of one of `m`'s steps: an exchange's, or a one-way message's.
    pub fn alpha_for(&self, m: &Moves) -> f64 {
        if m.duplex && self.alpha_exchange_s > 0.0 {
            self.alpha_exchange_s
        } else {
            self.alpha_s
        }
    }
}

/// The ceiling a row of `coll` with `algo` is held against: the `ceiling`
/// ladder at the working set of each byte it moves, combined over the
/// bytes (harmonic: the time the ceiling would take for each part, added).
/// A sliced ring moves half its bytes (those reduced or forwarded a moment
/// ago) out of a slice that is still in cache, so near a cache boundary it
/// can beat a copy of its whole working set; this ceiling knows that. A
/// selector or an algorithm without a model: the ladder at the call's
/// working set. `None` for an empty ladder.
pub fn ceiling_for(
    ceiling: &Ladder,
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    n_bytes: u64,
    in_place: bool,
) -> Option<f64> {
    let (ws, slice_ws) = working_sets_of(coll, algo, p, n_bytes, in_place);
    let whole = ceiling.at(ws)?;
    let Some(m) = moves(coll, algo, p, n_bytes, in_place) else {
        return Some(whole);
    };
    let (mut bytes, mut secs) = (0.0, 0.0);
    for part in m.parts.iter().filter(|x| x.op != Op::Copy) {
        let g = ceiling.at(if part.near { slice_ws } else { ws })?;
        bytes += part.bytes;
        secs += part.bytes / g;
    }
    Some(if bytes > 0.0 && secs > 0.0 {
        bytes / secs
    } else {
        whole
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(ws: u64, gbps: f64) -> Rung {
        Rung {
            working_set: ws,
            bytes: ws / 2,
            gbps,
            median_gbps: gbps * 0.9,
        }
    }

    fn ladder(rungs: &[(u64, f64)]) -> Ladder {
        Ladder {
            method: "test".into(),
            rungs: rungs.iter().map(|&(w, g)| rung(w, g)).collect(),
        }
    }

    #[test]
    fn interpolates_log_log_and_holds_the_ends() {
        let l = ladder(&[(1 << 10, 40.0), (4 << 10, 10.0)]);
        assert_eq!(l.at(1), Some(40.0));
        assert_eq!(l.at(1 << 20), Some(10.0));
        // Halfway in log space: the geometric mean.
        let mid = l.at(2 << 10).unwrap();
        assert!((mid - 20.0).abs() < 1e-9, "{mid}");
        assert!((l.noise_at(2 << 10) - 0.1).abs() < 1e-9);
        assert_eq!(Ladder::default().at(5), None);
        assert!(l.covers(4 << 10) && !l.covers(5 << 10));
        assert_eq!((l.peak_gbps(), l.floor_gbps()), (Some(40.0), Some(10.0)));
        let a = ladder(&[(1, 1.0), (2, 5.0)]);
        let b = ladder(&[(1, 2.0), (2, 4.0)]);
        let g: Vec<f64> = a.best_of(&b).rungs.iter().map(|r| r.gbps).collect();
        assert_eq!(g, [2.0, 5.0]);
    }

    #[test]
    fn rungs_measured_at_a_row_join_the_ladder_as_the_better_figure() {
        let base = ladder(&[(1 << 10, 40.0), (4 << 10, 10.0), (16 << 10, 5.0)]);
        // At a rung the ladder has: the better of the two.
        let up = base.with_rungs_from(&ladder(&[(4 << 10, 30.0)]));
        let down = base.with_rungs_from(&ladder(&[(4 << 10, 2.0)]));
        let near = |l: &Ladder, ws: u64, want: f64| (l.at(ws).unwrap() - want).abs() < 1e-9;
        assert!(near(&up, 4 << 10, 30.0) && near(&down, 4 << 10, 10.0));
        // Between rungs: put in at its place, so the ladder stays ordered.
        let between = base.with_rungs_from(&ladder(&[(8 << 10, 9.0)]));
        let sets: Vec<u64> = between.rungs.iter().map(|r| r.working_set).collect();
        assert_eq!(sets, [1 << 10, 4 << 10, 8 << 10, 16 << 10]);
        assert!(near(&between, 8 << 10, 9.0));
        // A slower figure between rungs keeps the ladder's own there.
        let slow = base.with_rungs_from(&ladder(&[(8 << 10, 1.0)]));
        assert!(near(&slow, 8 << 10, base.at(8 << 10).unwrap()));
        // Nothing measured again: the same figures.
        assert_eq!(base.with_rungs_from(&Ladder::default()).rungs, base.rungs);
    }

    #[test]
    fn a_sliced_ring_is_held_against_the_ceiling_of_each_part() {
        let c = ladder(&[(1 << 20, 40.0), (64 << 20, 8.0)]);
        let n = 64u64 << 20;
        // In place, half of an all_reduce (the all-gather of blocks just
        // reduced) comes out of a 1 MiB slice: 2 / (1/8 + 1/40).
        let g = ceiling_for(&c, Collective::AllReduce, &"ring".into(), 2, n, true).unwrap();
        assert!((g - 2.0 / (1.0 / 8.0 + 1.0 / 40.0)).abs() < 1e-9, "{g}");
        // In-place all_gather reads the peer's untouched input: the whole working set.
        let g = ceiling_for(&c, Collective::AllGather, &"ring".into(), 2, n, true).unwrap();
        assert!((g - 8.0).abs() < 1e-9, "{g}");
        // A selector: the ladder at the call's working set.
        assert_eq!(
            ceiling_for(&c, Collective::AllReduce, &"nccl".into(), 2, n, true),
            Some(8.0)
        );
        assert_eq!(
            ceiling_for(
                &Ladder::default(),
                Collective::AllReduce,
                &"ring".into(),
                2,
                n,
                true
            ),
            None
        );
    }

    #[test]
    fn working_sets_per_collective() {
        let n = 1 << 20;
        assert_eq!(working_set_bytes(Collective::AllReduce, 2, n, false), 2 * n);
        assert_eq!(working_set_bytes(Collective::AllReduce, 2, n, true), n);
        assert_eq!(
            working_set_bytes(Collective::AllGather, 4, n, false),
            n + n / 4
        );
        assert_eq!(
            working_set_bytes(Collective::ReduceScatter, 2, n, false),
            n + n / 2
        );
        assert_eq!(working_set_bytes(Collective::SendRecv, 2, n, false), 2 * n);
    }

    fn states(m: &Moves) -> Vec<(Op, bool, bool)> {
        m.parts.iter().map(|p| (p.op, p.fresh, p.claimed)).collect()
    }

    #[test]
    fn moves_follow_the_algorithms() {
        let n = 1 << 20;
        // Ring all_reduce on 2 ranks, out of place: the reduce-scatter step
        // reduces the peer's untouched input into the block the peer reads
        // next; the all-gather step pulls the peer's fresh block into one
        // nobody reads.
        let m = moves(Collective::AllReduce, &"ring".into(), 2, n, false).unwrap();
        assert_eq!(m.bytes(Op::Receive), 0.5);
        assert_eq!(m.bytes(Op::Reduce), 0.5);
        assert!(m.duplex && m.latency_steps == 2.0);
        assert_eq!(
            states(&m),
            [(Op::Reduce, false, true), (Op::Receive, true, false)]
        );
        // In place every byte is fresh and every destination claimed.
        let m = moves(Collective::AllReduce, &"ring".into(), 2, n, true).unwrap();
        assert_eq!(
            states(&m),
            [(Op::Reduce, true, true), (Op::Receive, true, true)]
        );
        // Out-of-place all_gather copies its own block in first (a block the
        // peer reads), then pulls the peer's fresh copy; in place it reads
        // the peer's untouched block.
        let m = moves(Collective::AllGather, &"ring".into(), 2, n, false).unwrap();
        assert_eq!(
            states(&m),
            [(Op::Copy, false, true), (Op::Receive, true, false)]
        );
        let m = moves(Collective::AllGather, &"ring".into(), 2, n, true).unwrap();
        assert_eq!(states(&m), [(Op::Receive, false, false)]);
        // Four ranks: three steps, forwarded blocks fresh and claimed but the last.
        let m = moves(Collective::AllGather, &"ring".into(), 4, n, true).unwrap();
        assert_eq!(m.bytes(Op::Receive), 0.75);
        assert_eq!(
            states(&m),
            [
                (Op::Receive, false, true),
                (Op::Receive, true, true),
                (Op::Receive, true, false)
            ]
        );
        // Recursive doubling on 2 ranks: one step, reduced, one copy of the result.
        let m = moves(Collective::AllReduce, &"rd".into(), 2, 1024, true).unwrap();
        assert_eq!((m.bytes(Op::Reduce), m.bytes(Op::Copy)), (1.0, 1.0));
        let m = moves(Collective::Broadcast, &"tree".into(), 2, 1024, false).unwrap();
        assert!(!m.duplex && m.bytes(Op::Copy) == 1.0);
        assert_eq!(
            moves(Collective::AllReduce, &"auto".into(), 2, 8, true),
            None
        );
        assert!(moves(Collective::AllReduce, &"ring".into(), 2, 0, true)
            .unwrap()
            .parts
            .is_empty());
    }

    fn flat(g: f64) -> Ladder {
        ladder(&[(1, g), (1 << 40, g)])
    }

    /// A wire of flat ladders: both links at `link`, the copy, the
    /// reduction kernel and the three cache states (pull, claim, both).
    fn flat_wire(link: f64, copy: f64, reduce: f64, [pull, claim, both]: [f64; 3]) -> WireModel {
        WireModel {
            duplex: flat(link),
            one_way: flat(link),
            copy: flat(copy),
            reduce: flat(reduce),
            pull: flat(pull),
            claim: flat(claim),
            both: flat(both),
            ..WireModel::default()
        }
    }

    #[test]
    fn each_part_costs_its_cache_states() {
        let mut wire = WireModel {
            alpha_s: 1e-6,
            alpha_exchange_s: 0.5e-6,
            duplex: flat(10.0),
            one_way: flat(10.0),
            copy: flat(20.0),
            reduce: flat(5.0),
            pull: Ladder::default(),
            claim: Ladder::default(),
            both: Ladder::default(),
            ..WireModel::default()
        };
        let n = 1u64 << 20;
        let h = 0.5 * n as f64;
        // Sockets (no cache states): 2 exchange steps, half received at
        // 10 GB/s, half received (10) and reduced (5).
        let want = 1e-6 + h / 10e9 + h / 10e9 + h / 5e9;
        let t = wire
            .predict(Collective::AllReduce, &"ring".into(), 2, n, false)
            .unwrap();
        assert!((t - want).abs() < 1e-15, "{t} {want}");
        // Shared memory: the reduction into a claimed block at the claim
        // rate, the fresh block pulled at the pull rate.
        wire.pull = flat(4.0);
        wire.claim = flat(2.0);
        wire.both = flat(1.0);
        let want = 1e-6 + h / 2e9 + h / 5e9 + h / 4e9;
        let t = wire
            .predict(Collective::AllReduce, &"ring".into(), 2, n, false)
            .unwrap();
        assert!((t - want).abs() < 1e-15, "{t} {want}");
        // In place: both steps at the `both` rate.
        let want = 1e-6 + h / 1e9 + h / 5e9 + h / 1e9;
        let t = wire
            .predict(Collective::AllReduce, &"ring".into(), 2, n, true)
            .unwrap();
        assert!((t - want).abs() < 1e-15, "{t} {want}");
        // In-place all_gather reads a line its cache holds: the duplex rate.
        let t = wire
            .predict(Collective::AllGather, &"ring".into(), 2, n, true)
            .unwrap();
        assert!((t - (0.5e-6 + h / 10e9)).abs() < 1e-15, "{t}");
        assert_eq!(
            WireModel::default().predict(Collective::AllReduce, &"ring".into(), 2, n, false),
            None
        );
    }

    #[test]
    fn a_reduced_byte_costs_the_transports_reducing_receive_where_measured() {
        let mut wire = WireModel {
            alpha_exchange_s: 1e-6,
            reduce_into: flat(3.0),
            reduce_from: flat(1.5),
            ..flat_wire(10.0, 20.0, 5.0, [4.0, 2.0, 1.0])
        };
        let ring = ModelAlgo::Ran(Algorithm::Ring);
        let n = 1u64 << 20;
        let h = 0.5 * n as f64;
        let t = |w: &WireModel, in_place: bool| {
            w.predict(Collective::AllReduce, &ring, 2, n, in_place)
                .unwrap()
        };
        // Out of place: the first step reduces the peer's untouched input
        // into a claimed block (reduce_from), then pulls the peer's sum.
        let want = 2e-6 + h / 1.5e9 + h / 4e9;
        assert!((t(&wire, false) - want).abs() < 1e-15);
        // In place: the peer's fresh block reduced into a claimed one
        // (reduce_into), then received at `both`.
        let want = 2e-6 + h / 3e9 + h / 1e9;
        assert!((t(&wire, true) - want).abs() < 1e-15);
        // A reduce_scatter's last step writes a block nobody reads: on
        // shared memory no fused ladder measured that state, so it costs
        // its receive (duplex: the peer's untouched input) plus gamma.
        let rs = wire
            .predict(Collective::ReduceScatter, &ring, 2, n, false)
            .unwrap();
        assert!((rs - (1e-6 + h / 10e9 + h / 5e9)).abs() < 1e-15, "{rs}");
        // Sockets (no cache states): the fused ladders price every
        // reduced byte, by the kernel the step runs.
        let mut sockets = wire.clone();
        (sockets.pull, sockets.claim, sockets.both) = Default::default();
        let rs = sockets
            .predict(Collective::ReduceScatter, &ring, 2, n, false)
            .unwrap();
        assert!((rs - (1e-6 + h / 1.5e9)).abs() < 1e-15, "{rs}");
        // Without them (a library's reductions, older records): receive + gamma.
        (wire.reduce_into, wire.reduce_from) = Default::default();
        let want = 2e-6 + h / 2e9 + h / 5e9 + h / 4e9;
        assert!((t(&wire, false) - want).abs() < 1e-15);
    }

    #[test]
    fn an_in_place_all_reduce_gathers_into_the_lines_of_its_slice() {
        // both: 10 GB/s up to the slice's 1 MiB, 40 from 4 MiB.
        let both = ladder(&[(1 << 20, 10.0), (4 << 20, 40.0)]);
        let wire = WireModel {
            both: both.clone(),
            reduce_into: flat(20.0),
            reduce_from: flat(20.0),
            ..flat_wire(50.0, 50.0, 50.0, [50.0; 3])
        };
        let ring = ModelAlgo::Ran(Algorithm::Ring);
        // 8 MiB in place on 2 ranks: slices of 1 MiB; the all-gather's
        // block was just reduced by the peer and just read by it from
        // this rank's buffer: wholly at the slice's rate.
        let n = 8u64 << 20;
        let at = call_sets(Collective::AllReduce, &ring, 2, n, true);
        assert_eq!((at.ws, at.slice_ws), (n, 1 << 20));
        let m = moves(Collective::AllReduce, &ring, 2, n, true).unwrap();
        assert_eq!(m.parts.iter().filter(|p| p.dest_near).count(), 1);
        let h = 0.5 * n as f64;
        let want = h / 20e9 + h / 10e9;
        let t = wire.bytes_seconds(&m, n, &at);
        assert!((t - want).abs() < 1e-12, "{t} {want}");
        // Out of place its all-gather writes the receive buffer, which no
        // peer read in the slice: half at the slice's, half at the call's.
        let m = moves(Collective::AllReduce, &ring, 2, n, false).unwrap();
        assert!(m.parts.iter().all(|p| !p.dest_near));

        // Where the far-destination ladder was measured, the sliced call's
        // all-gather costs it at the call's buffer (8 MiB: 5 GB/s); a call
        // of one slice (1 MiB) still costs `both`.
        let far = WireModel {
            both_far: ladder(&[(1 << 20, 8.0), (8 << 20, 5.0)]),
            ..wire.clone()
        };
        let m = moves(Collective::AllReduce, &ring, 2, n, true).unwrap();
        let want = h / 20e9 + h / 5e9;
        let t = far.bytes_seconds(&m, n, &at);
        assert!((t - want).abs() < 1e-12, "{t} {want}");
        let one = 1u64 << 20;
        let (m1, at1) = (
            moves(Collective::AllReduce, &ring, 2, one, true).unwrap(),
            call_sets(Collective::AllReduce, &ring, 2, one, true),
        );
        assert!(at1.block_ws.is_some());
        assert_eq!(
            far.bytes_seconds(&m1, one, &at1),
            wire.bytes_seconds(&m1, one, &at1)
        );

        // Out of place the all-gather's fresh byte into a block nobody read
        // costs `pull_far` at the call's receive buffer (8 MiB: 4 GB/s)
        // where measured; the reduce-scatter part is untouched.
        let out = WireModel {
            pull_far: ladder(&[(1 << 20, 8.0), (8 << 20, 4.0)]),
            ..far.clone()
        };
        let m = moves(Collective::AllReduce, &ring, 2, n, false).unwrap();
        let at = call_sets(Collective::AllReduce, &ring, 2, n, false);
        let fresh_private = |p: &Part| p.op == Op::Receive && p.fresh && !p.claimed;
        assert_eq!(m.parts.iter().filter(|p| fresh_private(p)).count(), 1);
        let rest: f64 = m
            .parts
            .iter()
            .filter(|p| !fresh_private(p))
            .map(|p| {
                wire.bytes_seconds(
                    &Moves {
                        parts: vec![*p],
                        ..m.clone()
                    },
                    n,
                    &at,
                )
            })
            .sum();
        let t = out.bytes_seconds(&m, n, &at);
        assert!((t - (rest + h / 4e9)).abs() < 1e-12, "{t}");
    }

    #[test]
    fn a_sliced_all_gathers_own_block_costs_the_slower_of_its_two_walks() {
        let ring = ModelAlgo::Ran(Algorithm::Ring);
        // claim 16 GB/s flat; the own block's walk 12 GB/s at 1 MiB, 4 at 8.
        let wire = flat_wire(10.0, 20.0, 5.0, [40.0, 16.0, 8.0]);
        let walked = WireModel {
            claim_far: ladder(&[(1 << 20, 12.0), (8 << 20, 4.0)]),
            ..wire.clone()
        };
        let ag = Collective::AllGather;
        let n = 8u64 << 20;
        let h = 0.5 * n as f64;
        let m = moves(ag, &ring, 2, n, false).unwrap();
        let at = call_sets(ag, &ring, 2, n, false);
        assert!(at.block_ws.is_none(), "8 MiB on 2 ranks runs in slices");
        assert_eq!(m.parts.iter().filter(|p| p.own_block).count(), 1);
        // The walk in slices reads 4 GB/s at 8 MiB, slower than the whole
        // buffer's 16: the copy costs it.
        let t = walked.bytes_seconds(&m, n, &at) - wire.bytes_seconds(&m, n, &at);
        let want = h / 4e9 - h / 16e9;
        assert!((t - want).abs() < 1e-12, "{t} {want}");
        let reads = walked.reads(&m, n, &at);
        assert!(reads.contains(&(LadderId::ClaimFar, n)));
        assert!(
            reads.contains(&(LadderId::Claim, at.ws)),
            "both walks measured at the row"
        );
        // Where the walk in slices is the faster (24 GB/s), the whole
        // buffer's 16 prices the copy.
        let faster = WireModel {
            claim_far: ladder(&[(1 << 20, 30.0), (8 << 20, 24.0)]),
            ..wire.clone()
        };
        assert_eq!(
            faster.bytes_seconds(&m, n, &at),
            wire.bytes_seconds(&m, n, &at)
        );
        // A call of one slice, an in-place all_gather and an out-of-place
        // all_reduce copy no own block in slices: priced as before.
        let one = 1u64 << 20;
        for (coll, bytes, in_place) in [
            (ag, one, false),
            (ag, n, true),
            (Collective::AllReduce, n, false),
        ] {
            let m = moves(coll, &ring, 2, bytes, in_place).unwrap();
            let at = call_sets(coll, &ring, 2, bytes, in_place);
            assert_eq!(
                walked.bytes_seconds(&m, bytes, &at),
                wire.bytes_seconds(&m, bytes, &at),
                "{coll:?} {bytes} in place {in_place}"
            );
            assert!(!walked
                .reads(&m, bytes, &at)
                .iter()
                .any(|(id, _)| *id == LadderId::ClaimFar));
        }
    }

    #[test]
    fn a_near_part_pays_half_at_the_slice_and_half_at_the_call() {
        // pull: 40 GB/s up to 2 MiB, 10 from 8 MiB; the rest flat.
        let pull = ladder(&[(2 << 20, 40.0), (8 << 20, 10.0)]);
        let wire = WireModel {
            pull: pull.clone(),
            ..flat_wire(10.0, 20.0, 5.0, [1.0, 2.0, 1.0])
        };
        let ring = ModelAlgo::Ran(Algorithm::Ring);
        // Out-of-place all_gather of 16 MiB on 2 ranks: the own block
        // copied into a claimed buffer, the peer's block (written in the
        // slice) received: half at the slice's working set, half at the call's.
        let n = 16u64 << 20;
        let at = call_sets(Collective::AllGather, &ring, 2, n, false);
        assert_eq!((at.ws, at.slice_ws, at.block_ws), (24 << 20, 3 << 19, None));
        let h = 0.5 * n as f64;
        let pull_s = 0.5 / (pull.at(at.slice_ws).unwrap() * 1e9) + 0.5 / (10.0 * 1e9);
        let want = h / 2e9 + h * pull_s;
        let t = wire.bytes_seconds(
            &moves(Collective::AllGather, &ring, 2, n, false).unwrap(),
            n,
            &at,
        );
        assert!((t - want).abs() < 1e-12, "{t} {want}");
    }

    #[test]
    fn a_call_of_one_slice_reads_its_cache_states_at_its_blocks() {
        // claim: 10 GB/s at 1 MiB, 40 at 2 MiB (a peer's private cache
        // spilling into the shared one between the two).
        let claim = ladder(&[(1 << 20, 10.0), (2 << 20, 40.0)]);
        let wire = WireModel {
            claim: claim.clone(),
            ..flat_wire(50.0, 50.0, 50.0, [50.0; 3])
        };
        let ring = ModelAlgo::Ran(Algorithm::Ring);
        // 1 MiB out of place on 2 ranks: one slice, blocks of 512 KiB, the
        // call's working set 1.5 MiB; the claimed copy at the 1 MiB rung.
        let n = 1u64 << 20;
        let at = call_sets(Collective::AllGather, &ring, 2, n, false);
        assert_eq!((at.ws, at.block_ws), (3 << 19, Some(1 << 20)));
        let m = moves(Collective::AllGather, &ring, 2, n, false).unwrap();
        let h = 0.5 * n as f64;
        let want = h / 10e9 + h / 50e9;
        let t = wire.bytes_seconds(&m, n, &at);
        assert!((t - want).abs() < 1e-12, "{t} {want}");
        // Read at the call's working set it would have been 2x faster.
        assert!(claim.at(at.ws).unwrap() > 19.0);
        // A sliced ring (4 MiB: two slices) reads them at its working sets.
        let at = call_sets(Collective::AllGather, &ring, 2, 4 << 20, false);
        assert_eq!(at.block_ws, None);
    }

    /// A rung above the cap at its working set is held at the cap (best
    /// and median), one below it is left as measured, and only a ladder
    /// that was held says so.
    #[test]
    fn a_capped_ladder_never_outruns_its_cap() {
        let fused = ladder(&[(1 << 20, 2.37), (4 << 20, 0.1)]);
        let step = ladder(&[(1 << 20, 0.126), (4 << 20, 0.126)]);
        let c = fused.capped_by(&step, "; held");
        let got: Vec<(f64, f64)> = c.rungs.iter().map(|r| (r.gbps, r.median_gbps)).collect();
        assert_eq!(got, vec![(0.126, 0.126), (0.1, 0.1 * 0.9)]);
        assert_eq!(c.method, "test; held");
        let under = ladder(&[(1 << 20, 0.1)]).capped_by(&step, "; held");
        assert_eq!(under.method, "test");
    }

    #[test]
    fn merged_rungs_go_in_at_their_places() {
        let l = ladder(&[(1 << 20, 10.0), (4 << 20, 40.0)]);
        let more = ladder(&[(2 << 20, 5.0), (4 << 20, 30.0)]);
        let m = l.merged(&more);
        let got: Vec<(u64, f64)> = m.rungs.iter().map(|r| (r.working_set, r.gbps)).collect();
        assert_eq!(got, vec![(1 << 20, 10.0), (2 << 20, 5.0), (4 << 20, 30.0)]);
    }

    #[test]
    fn a_wire_fit_recovers_alpha_and_a_scale_across_regimes() {
        // A wire 4x slower out of cache: one beta cannot fit it, the ladder can.
        let l = ladder(&[(1 << 20, 40.0), (8 << 20, 10.0)]);
        let wire = WireModel {
            alpha_s: 2e-6,
            alpha_exchange_s: 0.0,
            duplex: l.clone(),
            one_way: l.clone(),
            copy: l.clone(),
            reduce: l.clone(),
            pull: l.clone(),
            claim: l.clone(),
            both: l,
            ..WireModel::default()
        };
        let ring = ModelAlgo::Ran(Algorithm::Ring);
        let pts: Vec<(u64, f64)> = (18..=26)
            .map(|k| {
                let n = 1u64 << k;
                let m = moves(Collective::AllGather, &ring, 2, n, true).unwrap();
                let at = call_sets(Collective::AllGather, &ring, 2, n, true);
                // Measured: 1.25x the model's bytes term, alpha 3 us.
                (
                    n,
                    m.latency_steps * 3e-6 + 1.25 * wire.bytes_seconds(&m, n, &at),
                )
            })
            .collect();
        let f = fit_on_wire(Collective::AllGather, &ring, 2, true, &wire, &pts, false).unwrap();
        assert!(
            (f.alpha_s - 3e-6).abs() < 1e-12 && (f.scale - 1.25).abs() < 1e-9,
            "{f:?}"
        );
        assert!(
            f.rms_rel_err < 1e-9 && f.single_beta_rms.unwrap() > 0.1,
            "{f:?}"
        );
        assert_eq!(f.window, (1 << 18, 1 << 26));
        // Busbw in cache: 40 GB/s / 1.25 at the smallest size.
        assert!((f.busbw_gbps.0 - 32.0).abs() < 1e-6, "{f:?}");
        // With alpha fixed at the wire's (2 us, below the 3 us behind the
        // points) only the scale moves: near 1.25, the residue in the error.
        let f = fit_on_wire(Collective::AllGather, &ring, 2, true, &wire, &pts, true).unwrap();
        assert_eq!(f.alpha_s, 2e-6);
        assert!((f.scale - 1.25).abs() < 0.1 && f.rms_rel_err > 0.0, "{f:?}");
    }
}
