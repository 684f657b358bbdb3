//! Alpha-beta (Hockney) cost of each collective algorithm.
//!
//! A transfer of `m` bytes costs `alpha + m beta`; reducing `m` bytes costs
//! `m gamma`. An algorithm's cost on `p` ranks and `n` bytes is then
//!
//! ```text
//! t = latency_steps * alpha + bytes_factor * n * beta + reduce_factor * n * gamma
//! ```
//!
//! and [`AlphaBetaTerms`] holds the three coefficients, so that a fit can
//! solve for alpha and beta and a report can show which term dominates.
//!
//! Sources: Thakur, Rabenseifner and Gropp, "Optimization of Collective
//! Communication Operations in MPICH", IJHPCA 19(1), 2005 (ring,
//! recursive doubling, recursive halving, Rabenseifner, binomial trees);
//! Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
//! clusters of workstations", JPDC 69(2), 2009 (ring all-reduce);
//! Pjesivac-Grbovic et al., "Performance analysis of MPI collective
//! operations", Cluster Computing 10, 2007 (pipelined chain broadcast and
//! reduce); Hensgen, Finkel and Manber, "Two algorithms for barrier
//! synchronization", IJPP 17(1), 1988 (dissemination barrier).
//!
//! **What `n` is** (the `size` column of nccl-tests, so a record's `bytes`
//! goes straight in):
//!
//! | collective      | n                                                    |
//! |-----------------|------------------------------------------------------|
//! | all_reduce      | the buffer, `count x size`                           |
//! | all_gather      | the gathered output, `S = count x p x size`          |
//! | reduce_scatter  | the full input, `S = count x p x size`               |
//! | broadcast       | the buffer                                           |
//! | reduce          | the buffer                                           |
//! | all_to_all      | one rank's send buffer, `count x p x size`           |
//! | sendrecv        | the message one rank sends                           |
//!
//! **Non-powers of two** for recursive doubling (`rd`) and halving-doubling
//! (`rhd`): the standard fold of Thakur et al. 2005. With `p' = 2^floor(lg p)`
//! and `r = p - p'`, `r` ranks first hand their whole input to a partner
//! (one step of `n` bytes, reduced), the `p'` remaining ranks run the
//! power-of-two algorithm, and the partners hand the result back (one step
//! of `n` bytes): two extra latency steps, `2n` extra bytes on the critical
//! path and `n` extra reduced bytes (this is what parbench's `rd` and `rhd`
//! all-reduces do). For all_gather by doubling and reduce_scatter by
//! halving (modelled, not run by parbench's CPU backends, which use rings
//! for those) the folded steps carry one block or the rest of the buffer
//! instead (see [`rd_all_gather`], [`rh_reduce_scatter`]).
//!
//! **Slicing**: parbench's ring cuts large messages into slices of
//! [`RING_SLICE_BYTES`] per block that run the ring one after another, and
//! its chain broadcast cuts them into chunks of [`CHUNK_BYTES`]; [`terms`] models both as run
//! ([`sliced_ring`], [`chain_terms`]), and the textbook forms stay
//! available ([`ring_all_reduce`], [`ring_gather_scatter`]). Each
//! algorithm has one function here: the one place to change should an
//! implementation change.

use super::algo::ModelAlgo;
use crate::comm::algo::Algorithm;
use crate::comm::collective::CostForm;
use crate::comm::Collective;

/// The cost of the wire: per-message latency, per-byte transfer time and
/// per-byte reduction time.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkParams {
    /// Seconds per message (start-up latency), `alpha`.
    pub alpha_s: f64,
    /// Seconds per byte sent, `beta` (the inverse of the link bandwidth).
    pub beta_s_per_byte: f64,
    /// Seconds per byte reduced, `gamma` (0 when reduction is free or
    /// folded into `beta`, as a fit does).
    pub gamma_s_per_byte: f64,
}

impl LinkParams {
    /// A link of `gbps` GB/s (1 GB = 1e9 bytes, the unit of nccl-tests'
    /// algbw/busbw) and `us` microseconds of latency per message; reduction
    /// cost zero. Used by `--link GBPS,US` flags.
    pub fn from_gbps_us(gbps: f64, us: f64) -> Self {
        LinkParams {
            alpha_s: us * 1e-6,
            beta_s_per_byte: if gbps > 0.0 {
                1.0 / (gbps * 1e9)
            } else {
                f64::INFINITY
            },
            gamma_s_per_byte: 0.0,
        }
    }

    /// The same link with a reduction cost of `gbps` GB/s of reduced bytes.
    pub fn with_reduce_gbps(self, gbps: f64) -> Self {
        LinkParams {
            gamma_s_per_byte: if gbps > 0.0 {
                1.0 / (gbps * 1e9)
            } else {
                f64::INFINITY
            },
            ..self
        }
    }

    /// Latency in microseconds.
    pub fn alpha_us(&self) -> f64 {
        self.alpha_s * 1e6
    }

    /// Bandwidth in GB/s (1e9 bytes), `1/beta`; infinite when `beta` is 0.
    pub fn bandwidth_gbps(&self) -> f64 {
        1.0 / (self.beta_s_per_byte * 1e9)
    }
}

/// The coefficients of an algorithm's cost:
/// `t = latency_steps alpha + bytes_factor n beta + reduce_factor n gamma`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AlphaBetaTerms {
    /// Messages on the critical path (multiplies `alpha`).
    pub latency_steps: f64,
    /// Bytes on the critical path per byte of `n` (multiplies `n beta`).
    pub bytes_factor: f64,
    /// Bytes reduced on the critical path per byte of `n` (multiplies `n gamma`).
    pub reduce_factor: f64,
}

impl AlphaBetaTerms {
    /// No communication at all (one rank).
    pub const ZERO: AlphaBetaTerms = AlphaBetaTerms {
        latency_steps: 0.0,
        bytes_factor: 0.0,
        reduce_factor: 0.0,
    };

    fn new(latency_steps: f64, bytes_factor: f64, reduce_factor: f64) -> Self {
        AlphaBetaTerms {
            latency_steps,
            bytes_factor,
            reduce_factor,
        }
    }

    /// `k` repetitions of one message of `n` bytes (reduced when `reduced`).
    fn steps_of_whole(k: f64, reduced: bool) -> Self {
        AlphaBetaTerms::new(k, k, if reduced { k } else { 0.0 })
    }

    /// The latency term, seconds.
    pub fn latency_s(&self, link: &LinkParams) -> f64 {
        self.latency_steps * link.alpha_s
    }

    /// The transfer term for `n` bytes, seconds.
    pub fn bandwidth_s(&self, n_bytes: f64, link: &LinkParams) -> f64 {
        // 0 x inf (a zero-byte message on an infinitely slow link) is 0 here.
        if self.bytes_factor == 0.0 || n_bytes == 0.0 {
            0.0
        } else {
            self.bytes_factor * n_bytes * link.beta_s_per_byte
        }
    }

    /// The reduction term for `n` bytes, seconds.
    pub fn reduce_s(&self, n_bytes: f64, link: &LinkParams) -> f64 {
        if self.reduce_factor == 0.0 || n_bytes == 0.0 {
            0.0
        } else {
            self.reduce_factor * n_bytes * link.gamma_s_per_byte
        }
    }

    /// The whole cost of `n` bytes on `link`, seconds.
    pub fn seconds(&self, n_bytes: f64, link: &LinkParams) -> f64 {
        self.latency_s(link) + self.bandwidth_s(n_bytes, link) + self.reduce_s(n_bytes, link)
    }

    fn plus(self, o: AlphaBetaTerms) -> Self {
        AlphaBetaTerms::new(
            self.latency_steps + o.latency_steps,
            self.bytes_factor + o.bytes_factor,
            self.reduce_factor + o.reduce_factor,
        )
    }
}

/// The chunk size of parbench's chain broadcast and reduce,
/// [`crate::comm::algo::CHUNK_BYTES`] (128 KiB). [`terms`] models parbench's
/// own algorithms with it; [`chain_terms`] takes any chunk.
pub const CHUNK_BYTES: u64 = crate::comm::algo::CHUNK_BYTES as u64;

/// The slice size of parbench's rings,
/// [`crate::comm::algo::RING_SLICE_BYTES`] (512 KiB per block). [`terms`]
/// models parbench's own rings with it; [`sliced_ring`] takes any slice.
pub const RING_SLICE_BYTES: u64 = crate::comm::algo::RING_SLICE_BYTES as u64;

/// `ceil(lg p)`: rounds of a binomial tree or dissemination on `p` ranks.
pub fn ceil_log2(p: usize) -> u32 {
    if p <= 1 {
        0
    } else {
        usize::BITS - (p - 1).leading_zeros()
    }
}

/// `floor(lg p)` for `p >= 1` (0 for 0).
fn floor_log2(p: usize) -> u32 {
    if p == 0 {
        0
    } else {
        usize::BITS - 1 - p.leading_zeros()
    }
}

/// Ring all_gather or reduce_scatter: `(p-1) alpha + (p-1)/p n beta`
/// (`+ (p-1)/p n gamma` when reducing). Thakur et al. 2005.
pub fn ring_gather_scatter(p: usize, reduced: bool) -> AlphaBetaTerms {
    if p <= 1 {
        return AlphaBetaTerms::ZERO;
    }
    let pf = p as f64;
    let f = (pf - 1.0) / pf;
    AlphaBetaTerms::new(pf - 1.0, f, if reduced { f } else { 0.0 })
}

/// Ring all_reduce (reduce-scatter then all-gather):
/// `2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma`. Patarasuk and Yuan
/// 2009; Thakur et al. 2005.
pub fn ring_all_reduce(p: usize) -> AlphaBetaTerms {
    ring_gather_scatter(p, true).plus(ring_gather_scatter(p, false))
}

/// Ring as parbench's CPU backends run it: a message of `n` bytes is cut
/// into `s = ceil(n / (p chunk))` slices (each block's share at most
/// `chunk` bytes) that run the whole ring one after another, so the
/// latency term is `s` times the textbook one and the byte terms are the
/// textbook ones: all_reduce `2(p-1)s alpha + 2(p-1)/p n beta + (p-1)/p n gamma`;
/// all_gather / reduce_scatter (`all_reduce = false`) `(p-1)s alpha + (p-1)/p n beta`
/// (`+ (p-1)/p n gamma` when `reduced`). A message of up to `p chunk` bytes
/// is one slice: the textbook ring.
pub fn sliced_ring(
    p: usize,
    n_bytes: u64,
    chunk_bytes: u64,
    all_reduce: bool,
    reduced: bool,
) -> AlphaBetaTerms {
    let textbook = if all_reduce {
        ring_all_reduce(p)
    } else {
        ring_gather_scatter(p, reduced)
    };
    let per_slice = (p as u64).saturating_mul(chunk_bytes);
    let slices = if per_slice == 0 {
        1
    } else {
        n_bytes.div_ceil(per_slice).max(1)
    };
    AlphaBetaTerms {
        latency_steps: textbook.latency_steps * slices as f64,
        ..textbook
    }
}

/// The fold of Thakur et al. for a non-power-of-two `p`: the largest power
/// of two `p' <= p`, and whether `p` had extra ranks to fold in.
fn fold(p: usize) -> (usize, bool) {
    let p2 = 1usize << floor_log2(p);
    (p2, p2 != p)
}

/// An algorithm of the fold: `core(p', lg p')` on the largest power of
/// two `p' <= p`, plus the fold's `extra` when `p` is not one. One rank
/// (or none) costs nothing.
fn with_fold(
    p: usize,
    core: impl FnOnce(f64, f64) -> AlphaBetaTerms,
    extra: AlphaBetaTerms,
) -> AlphaBetaTerms {
    if p <= 1 {
        return AlphaBetaTerms::ZERO;
    }
    let (p2, folded) = fold(p);
    let core = core(p2 as f64, floor_log2(p2) as f64);
    if folded {
        core.plus(extra)
    } else {
        core
    }
}

/// Recursive doubling all_reduce: `lg p (alpha + n beta + n gamma)`
/// (Thakur et al. 2005). Non-power-of-two: `lg p'` such steps plus the
/// fold, `2 alpha + 2 n beta + n gamma`.
pub fn rd_all_reduce(p: usize) -> AlphaBetaTerms {
    with_fold(
        p,
        |_, k| AlphaBetaTerms::steps_of_whole(k, true),
        AlphaBetaTerms::new(2.0, 2.0, 1.0),
    )
}

/// Recursive halving-doubling (Rabenseifner) all_reduce: recursive-halving
/// reduce-scatter then recursive-doubling all-gather,
/// `2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma` (Thakur et al. 2005).
/// Non-power-of-two: that on `p'` ranks plus the fold, `2 alpha + 2 n beta + n gamma`.
pub fn rhd_all_reduce(p: usize) -> AlphaBetaTerms {
    with_fold(
        p,
        |p2, k| {
            let f = (p2 - 1.0) / p2;
            AlphaBetaTerms::new(2.0 * k, 2.0 * f, f)
        },
        AlphaBetaTerms::new(2.0, 2.0, 1.0),
    )
}

/// Recursive doubling all_gather: `lg p alpha + (p-1)/p n beta` (Thakur et
/// al. 2005), `n` the gathered bytes. Non-power-of-two (fold): each extra
/// rank first hands its block to a partner (`alpha + n/p beta`), the `p'`
/// ranks double (`lg p' alpha + (p-1)/p n beta`, the bytes a one-block rank
/// still lacks), and the partners send the extra ranks everything they lack
/// (`alpha + (p-1)/p n beta`).
pub fn rd_all_gather(p: usize) -> AlphaBetaTerms {
    let pf = p as f64;
    let f = (pf - 1.0) / pf;
    with_fold(
        p,
        |_, k| AlphaBetaTerms::new(k, f, 0.0),
        AlphaBetaTerms::new(2.0, 1.0 / pf + f, 0.0),
    )
}

/// Recursive halving reduce_scatter: `lg p alpha + (p-1)/p n (beta + gamma)`
/// (Thakur et al. 2005), `n` the whole input. Non-power-of-two (fold): each
/// extra rank hands its whole input to a partner (`alpha + n beta + n gamma`),
/// the `p'` ranks halve (`lg p' alpha + (p'-1)/p' n (beta + gamma)`) and each
/// partner sends its extra rank's block back (`alpha + n/p beta`).
pub fn rh_reduce_scatter(p: usize) -> AlphaBetaTerms {
    with_fold(
        p,
        |p2, k| {
            let f2 = (p2 - 1.0) / p2;
            AlphaBetaTerms::new(k, f2, f2)
        },
        AlphaBetaTerms::new(2.0, 1.0 + 1.0 / p as f64, 1.0),
    )
}

/// Binomial-tree broadcast: `ceil(lg p) (alpha + n beta)`; binomial-tree
/// reduce: `ceil(lg p) (alpha + n beta + n gamma)` (Thakur et al. 2005).
pub fn binomial_tree(p: usize, reduced: bool) -> AlphaBetaTerms {
    AlphaBetaTerms::steps_of_whole(ceil_log2(p) as f64, reduced)
}

/// Tree all_reduce as a binomial reduce followed by a binomial broadcast:
/// `2 ceil(lg p) (alpha + n beta) + ceil(lg p) n gamma`.
pub fn tree_all_reduce(p: usize) -> AlphaBetaTerms {
    binomial_tree(p, true).plus(binomial_tree(p, false))
}

/// Pipelined chain (broadcast, or reduce when `reduced`) of `n` bytes cut
/// into `m = ceil(n / chunk)` chunks: the last chunk leaves the root after
/// `m - 1` chunk times and needs `p - 1` hops, so
/// `t = (p + m - 2)(alpha + n/m beta (+ n/m gamma))`
/// (Pjesivac-Grbovic et al. 2007). The structure of a message that is sent
/// (n > 0; [`terms`] makes an empty one free).
pub fn chain_terms(p: usize, n_bytes: u64, chunk_bytes: u64, reduced: bool) -> AlphaBetaTerms {
    if p <= 1 {
        return AlphaBetaTerms::ZERO;
    }
    let m = if chunk_bytes == 0 {
        1
    } else {
        n_bytes.div_ceil(chunk_bytes).max(1)
    } as f64;
    let steps = p as f64 + m - 2.0;
    let per_byte = steps / m;
    AlphaBetaTerms::new(steps, per_byte, if reduced { per_byte } else { 0.0 })
}

/// Pairwise-exchange all_to_all: `(p-1)(alpha + n/p beta)`, `n` one rank's
/// whole send buffer (Thakur et al. 2005).
pub fn pairwise_all_to_all(p: usize) -> AlphaBetaTerms {
    if p <= 1 {
        return AlphaBetaTerms::ZERO;
    }
    let pf = p as f64;
    AlphaBetaTerms::new(pf - 1.0, (pf - 1.0) / pf, 0.0)
}

/// Send/receive (each rank sends `n` bytes to its neighbour while receiving
/// from the other): `alpha + n beta`. One rank has no peer: zero.
pub fn sendrecv(p: usize) -> AlphaBetaTerms {
    if p <= 1 {
        AlphaBetaTerms::ZERO
    } else {
        AlphaBetaTerms::new(1.0, 1.0, 0.0)
    }
}

/// Dissemination barrier: `ceil(lg p) alpha` (Hensgen, Finkel and Manber 1988).
pub fn barrier(p: usize) -> AlphaBetaTerms {
    AlphaBetaTerms::new(ceil_log2(p) as f64, 0.0, 0.0)
}

/// The cost structure of collective `coll` run with algorithm `algo` on `p`
/// ranks for `n_bytes` (see the module's table for what `n` is), as
/// parbench's CPU algorithms run it:
///
/// | collective | algorithms |
/// |---|---|
/// | all_reduce | `ring` ([`sliced_ring`]), `rd`, `rhd`, `tree` |
/// | all_gather | `ring` ([`sliced_ring`]), `rd` |
/// | reduce_scatter | `ring` ([`sliced_ring`]), `rhd` (recursive halving) |
/// | broadcast | `tree`, `chain` (also `ring`, which NCCL and parbench run as a chain) |
/// | reduce | `tree`, `chain` (also `ring`) |
/// | all_to_all | `pairwise` (also `ring`) |
/// | sendrecv | `p2p` (also any other algorithm) |
///
/// Ring slices are [`RING_SLICE_BYTES`], chain chunks [`CHUNK_BYTES`]. An empty buffer (`n_bytes = 0`)
/// costs nothing, as NCCL and parbench's backends return at once without a
/// message. `None` when the pair has no model
/// (a selector such as `auto`, which has no fixed structure: see [`predict`];
/// an unknown name; an algorithm that does not apply to the collective) or
/// `p` is 0. One rank costs nothing.
pub fn terms(coll: Collective, algo: &ModelAlgo, p: usize, n_bytes: u64) -> Option<AlphaBetaTerms> {
    terms_with(coll, algo.ran()?, p, n_bytes, RING_SLICE_BYTES)
}

/// The literature's forms, for algorithms that parbench's CPU backends do
/// not run (NCCL's and MPI's pipelined rings): as [`terms`], but the ring
/// is the textbook one, with no slices ([`ring_all_reduce`],
/// [`ring_gather_scatter`]).
pub fn textbook_terms(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    n_bytes: u64,
) -> Option<AlphaBetaTerms> {
    terms_with(coll, algo.ran()?, p, n_bytes, u64::MAX)
}

/// [`terms`] with rings sliced at `ring_chunk` bytes per block (`u64::MAX`:
/// never).
fn terms_with(
    coll: Collective,
    algo: Algorithm,
    p: usize,
    n_bytes: u64,
    ring_chunk: u64,
) -> Option<AlphaBetaTerms> {
    if p == 0 {
        return None;
    }
    let t = match coll.spec().form(algo)? {
        CostForm::RingAllReduce => sliced_ring(p, n_bytes, ring_chunk, true, true),
        CostForm::RingPass { reduced } => sliced_ring(p, n_bytes, ring_chunk, false, reduced),
        CostForm::RecursiveDoublingAllReduce => rd_all_reduce(p),
        CostForm::HalvingDoublingAllReduce => rhd_all_reduce(p),
        CostForm::TreeAllReduce => tree_all_reduce(p),
        CostForm::RecursiveDoublingAllGather => rd_all_gather(p),
        CostForm::HalvingReduceScatter => rh_reduce_scatter(p),
        CostForm::BinomialTree { reduced } => binomial_tree(p, reduced),
        CostForm::Chain { reduced } => chain_terms(p, n_bytes, CHUNK_BYTES, reduced),
        CostForm::Pairwise => pairwise_all_to_all(p),
        CostForm::SendRecv => sendrecv(p),
    };
    Some(if n_bytes == 0 {
        AlphaBetaTerms::ZERO
    } else {
        t
    })
}

/// The algorithms modelled for `coll`: what `auto` chooses among.
pub fn algos_for(coll: Collective) -> &'static [Algorithm] {
    coll.spec().modelled()
}

/// Predicted time in seconds of one `coll` with algorithm `algo` on `p`
/// ranks and `n_bytes` (nccl-tests' size) over `link`: what
/// bench-collectives writes as `model_us` (times 1e6).
///
/// An algorithm (`ring`, `tree`, `rd`, `rhd`, `chain`, `pairwise`,
/// `p2p`) is modelled as parbench's CPU backends run it ([`terms`]). A
/// selector ([`ModelAlgo::Selector`]: `auto`, `nccl`, `mpi`) predicts the fastest
/// of the textbook algorithms ([`textbook_terms`]) at that size: what an
/// ideal selector achieves with those algorithms (a real one that switches
/// at another size is above it near the crossover; NCCL's NVLS and
/// CollNet, which these forms do not describe, can beat it). `None` when
/// there is no model (see [`terms`]).
pub fn predict(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    n_bytes: u64,
    link: &LinkParams,
) -> Option<f64> {
    let n = n_bytes as f64;
    if algo.is_selector() {
        return algos_for(coll)
            .iter()
            .filter_map(|&a| terms_with(coll, a, p, n_bytes, u64::MAX))
            .map(|t| t.seconds(n, link))
            .min_by(f64::total_cmp);
    }
    terms(coll, algo, p, n_bytes).map(|t| t.seconds(n, link))
}

/// [`predict`] with the textbook forms for a named algorithm too: for a
/// library's ring (NCCL with `NCCL_ALGO=Ring`, an MPI's), which pipelines
/// its chunks instead of running parbench's slices one after another.
pub fn predict_textbook(
    coll: Collective,
    algo: &ModelAlgo,
    p: usize,
    n_bytes: u64,
    link: &LinkParams,
) -> Option<f64> {
    if algo.is_selector() {
        return predict(coll, algo, p, n_bytes, link);
    }
    textbook_terms(coll, algo, p, n_bytes).map(|t| t.seconds(n_bytes as f64, link))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
    }

    fn assert_terms(t: AlphaBetaTerms, l: f64, b: f64, r: f64) {
        assert!(
            close(t.latency_steps, l) && close(t.bytes_factor, b) && close(t.reduce_factor, r),
            "{t:?} != ({l}, {b}, {r})"
        );
    }

    #[test]
    fn link_units_are_gb_1e9_and_microseconds() {
        let l = LinkParams::from_gbps_us(400.0, 2.0);
        assert!(close(l.alpha_s, 2e-6));
        assert!(close(l.beta_s_per_byte, 1.0 / 400e9));
        assert!(close(l.bandwidth_gbps(), 400.0));
        assert!(close(l.alpha_us(), 2.0));
        assert_eq!(l.gamma_s_per_byte, 0.0);
        assert!(close(l.with_reduce_gbps(100.0).gamma_s_per_byte, 1e-11));
    }

    #[test]
    fn logs() {
        let c: Vec<u32> = (0..10).map(ceil_log2).collect();
        assert_eq!(c, [0, 0, 1, 2, 2, 3, 3, 3, 3, 4]);
        assert_eq!(fold(8), (8, false));
        assert_eq!(fold(6), (4, true));
        assert_eq!(fold(1), (1, false));
    }

    #[test]
    fn ring_formulas_thakur() {
        // all_gather p=8: 7 alpha + 7/8 n beta.
        assert_terms(ring_gather_scatter(8, false), 7.0, 0.875, 0.0);
        // reduce_scatter adds (p-1)/p n gamma.
        assert_terms(ring_gather_scatter(8, true), 7.0, 0.875, 0.875);
        // all_reduce p=8: 14 alpha + 1.75 n beta + 0.875 n gamma.
        assert_terms(ring_all_reduce(8), 14.0, 1.75, 0.875);
        // p=3: 4 alpha + 4/3 n beta + 2/3 n gamma.
        assert_terms(ring_all_reduce(3), 4.0, 4.0 / 3.0, 2.0 / 3.0);
        assert_terms(ring_all_reduce(1), 0.0, 0.0, 0.0);
    }

    #[test]
    fn recursive_doubling_and_halving_doubling() {
        // Powers of two: lg p (alpha + n beta + n gamma).
        assert_terms(rd_all_reduce(8), 3.0, 3.0, 3.0);
        assert_terms(rd_all_reduce(2), 1.0, 1.0, 1.0);
        // Rabenseifner: 2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma.
        assert_terms(rhd_all_reduce(8), 6.0, 1.75, 0.875);
        assert_terms(rhd_all_reduce(2), 2.0, 1.0, 0.5);
        // p = 6 folds onto p' = 4: two more steps of n, one more reduction.
        assert_terms(rd_all_reduce(6), 4.0, 4.0, 3.0);
        assert_terms(rhd_all_reduce(6), 6.0, 1.5 + 2.0, 0.75 + 1.0);
        // p = 3 folds onto 2.
        assert_terms(rd_all_reduce(3), 3.0, 3.0, 2.0);
        // all_gather / reduce_scatter by doubling / halving, p = 8.
        assert_terms(rd_all_gather(8), 3.0, 0.875, 0.0);
        assert_terms(rh_reduce_scatter(8), 3.0, 0.875, 0.875);
        // p = 6: all_gather 2 + 2 steps; 1/6 + 5/6 + 5/6 n.
        assert_terms(rd_all_gather(6), 4.0, 1.0 / 6.0 + 2.0 * 5.0 / 6.0, 0.0);
        // p = 6: reduce_scatter 2 + 2 steps; (1 + 3/4 + 1/6) n beta, (1 + 3/4) n gamma.
        assert_terms(rh_reduce_scatter(6), 4.0, 1.0 + 0.75 + 1.0 / 6.0, 1.75);
    }

    #[test]
    fn trees_and_chains() {
        // Binomial broadcast on 8 ranks: 3 (alpha + n beta); on 5 ranks: 3.
        assert_terms(binomial_tree(8, false), 3.0, 3.0, 0.0);
        assert_terms(binomial_tree(5, true), 3.0, 3.0, 3.0);
        assert_terms(tree_all_reduce(8), 6.0, 6.0, 3.0);
        // Chain of 4 ranks, 1 MiB in 256 KiB chunks: m = 4, 6 steps of n/4.
        assert_terms(chain_terms(4, 1 << 20, 256 << 10, false), 6.0, 1.5, 0.0);
        assert_terms(chain_terms(4, 1 << 20, 256 << 10, true), 6.0, 1.5, 1.5);
        // One chunk: a plain store-and-forward chain, p-1 whole steps.
        assert_terms(chain_terms(4, 100, 1 << 20, false), 3.0, 3.0, 0.0);
        // chain_terms treats an empty message as one chunk (terms makes it free).
        assert_terms(chain_terms(4, 0, 1 << 20, false), 3.0, 3.0, 0.0);
        // A partial last chunk: 1 MiB + 1 in 512 KiB chunks is 3 chunks.
        let t = chain_terms(2, (1 << 20) + 1, 512 << 10, false);
        assert_terms(t, 3.0, 1.0, 0.0);
    }

    #[test]
    fn every_plan_the_cpu_backends_run_has_a_model() {
        // Records carry Algorithm::name(); each one must have a structure here,
        // whatever the user asked for, the size and the world.
        use crate::comm::algo::Algorithm;
        use crate::comm::Algo;
        for coll in Collective::ALL {
            for algo in Algo::ALL {
                for p in [1usize, 2, 3, 4, 5, 8] {
                    for bytes in [1u64, 8, 4096, 300 << 10, 2 << 20, 64 << 20] {
                        let plan = Algorithm::choose(coll, algo, p, bytes as usize);
                        assert!(
                            terms(coll, &plan.into(), p, bytes).is_some(),
                            "{coll} {algo} p={p} {bytes} B -> {}",
                            plan.name()
                        );
                    }
                }
            }
        }
        assert_eq!(CHUNK_BYTES, 128 * 1024);
        assert_eq!(RING_SLICE_BYTES, 512 * 1024);
    }

    #[test]
    fn sliced_ring_multiplies_only_the_latency() {
        let c = 128 * 1024;
        // Up to p x chunk bytes: one slice, the textbook ring.
        assert_eq!(sliced_ring(8, 8 * c, c, true, true), ring_all_reduce(8));
        assert_eq!(sliced_ring(8, 0, c, true, true), ring_all_reduce(8));
        // 8 x chunk + 1 bytes: two slices of 14 steps.
        assert_terms(sliced_ring(8, 8 * c + 1, c, true, true), 28.0, 1.75, 0.875);
        // 64 MiB on 2 ranks in 128 KiB blocks: 256 slices of 2 steps.
        assert_terms(sliced_ring(2, 64 << 20, c, true, true), 512.0, 1.0, 0.5);
        // all_gather / reduce_scatter: (p-1) steps per slice.
        assert_terms(sliced_ring(4, 4 * c * 3, c, false, false), 9.0, 0.75, 0.0);
        assert_terms(sliced_ring(4, 4 * c * 3, c, false, true), 9.0, 0.75, 0.75);
        assert_eq!(sliced_ring(1, 1 << 30, c, true, true), AlphaBetaTerms::ZERO);
        // terms() models parbench's ring with RING_SLICE_BYTES.
        let big = 1u64 << 30;
        assert_eq!(
            terms(Collective::AllReduce, &"ring".into(), 8, big),
            Some(sliced_ring(8, big, RING_SLICE_BYTES, true, true))
        );
        assert_eq!(
            terms(Collective::ReduceScatter, &"ring".into(), 8, big),
            Some(sliced_ring(8, big, RING_SLICE_BYTES, false, true))
        );
    }

    #[test]
    fn pairwise_sendrecv_barrier() {
        // all_to_all p=4: 3 alpha + 3/4 n beta, i.e. 3 (alpha + n/4 beta).
        assert_terms(pairwise_all_to_all(4), 3.0, 0.75, 0.0);
        assert_terms(sendrecv(2), 1.0, 1.0, 0.0);
        assert_terms(sendrecv(1), 0.0, 0.0, 0.0);
        assert_terms(barrier(8), 3.0, 0.0, 0.0);
        assert_terms(barrier(9), 4.0, 0.0, 0.0);
    }

    #[test]
    fn terms_select_by_record_names() {
        use crate::comm::Algo;
        let n = 1 << 20;
        for a in [
            Algo::Ring,
            Algo::Tree,
            Algo::RecursiveDoubling,
            Algo::HalvingDoubling,
        ] {
            assert!(
                terms(Collective::AllReduce, &a.name().into(), 8, n).is_some(),
                "{a}"
            );
        }
        assert_eq!(
            terms(Collective::AllReduce, &"RING".into(), 8, n),
            Some(ring_all_reduce(8))
        );
        assert_eq!(terms(Collective::AllReduce, &"auto".into(), 8, n), None);
        assert_eq!(terms(Collective::AllReduce, &"nonsense".into(), 8, n), None);
        assert_eq!(terms(Collective::AllToAll, &"tree".into(), 8, n), None);
        assert_eq!(terms(Collective::AllReduce, &"ring".into(), 0, n), None);
        assert_eq!(
            terms(Collective::Broadcast, &"ring".into(), 4, 2 * CHUNK_BYTES),
            Some(chain_terms(4, 2 * CHUNK_BYTES, CHUNK_BYTES, false))
        );
        assert_eq!(
            terms(Collective::SendRecv, &"ring".into(), 2, n),
            Some(sendrecv(2))
        );
        assert_eq!(terms(Collective::SendRecv, &"bogus".into(), 2, n), None);
        for c in Collective::ALL {
            for a in algos_for(c) {
                assert!(terms(c, &(*a).into(), 4, n).is_some(), "{c} {a:?}");
            }
        }
    }

    #[test]
    fn predict_hand_computed() {
        // Ring all_reduce, 8 ranks, 1 MB at 100 GB/s, 5 us, no gamma:
        // one slice (1e6 <= 8 x 512 KiB): 14 x 5 us + 1.75 x 1e6 / 100e9 s
        // = 70 us + 17.5 us.
        let link = LinkParams::from_gbps_us(100.0, 5.0);
        let t = predict(Collective::AllReduce, &"ring".into(), 8, 1_000_000, &link).unwrap();
        assert!(close(t, 70e-6 + 17.5e-6), "{t}");
        // With gamma at 50 GB/s: + 0.875 x 1e6 / 50e9 = 17.5 us more.
        let t = predict(
            Collective::AllReduce,
            &"ring".into(),
            8,
            1_000_000,
            &link.with_reduce_gbps(50.0),
        )
        .unwrap();
        assert!(close(t, 70e-6 + 35e-6), "{t}");
        // 1 GB: ceil(1e9 / 4 MiB) = 239 slices of 14 steps.
        let t = predict(
            Collective::AllReduce,
            &"ring".into(),
            8,
            1_000_000_000,
            &link,
        )
        .unwrap();
        assert!(close(t, 239.0 * 14.0 * 5e-6 + 17.5e-3), "{t}");
        // One byte: latency of 3 steps, plus 3 bytes at 100 GB/s.
        let t = predict(Collective::AllReduce, &"rd".into(), 8, 1, &link).unwrap();
        assert!(close(t, 15e-6 + 3.0 / 100e9));
        // An empty buffer sends no message: free, but still modelled.
        assert_eq!(
            predict(Collective::AllReduce, &"rd".into(), 8, 0, &link),
            Some(0.0)
        );
        assert_eq!(
            predict(Collective::AllReduce, &"auto".into(), 8, 0, &link),
            Some(0.0)
        );
        assert_eq!(
            predict(Collective::AllReduce, &"bogus".into(), 8, 0, &link),
            None
        );
        // sendrecv 1 MB at 10 GB/s, 1 us: 1 us + 100 us.
        let l10 = LinkParams::from_gbps_us(10.0, 1.0);
        let t = predict(Collective::SendRecv, &"p2p".into(), 2, 1_000_000, &l10).unwrap();
        assert!(close(t, 101e-6));
    }

    #[test]
    fn auto_is_the_best_modelled_algorithm() {
        let link = LinkParams::from_gbps_us(100.0, 5.0);
        // Small: recursive doubling (3 steps) beats ring (14 steps).
        let small = predict(Collective::AllReduce, &"auto".into(), 8, 8, &link).unwrap();
        let rd = predict(Collective::AllReduce, &"rd".into(), 8, 8, &link).unwrap();
        assert_eq!(small, rd);
        // Large: ring and rhd tie on bandwidth; rhd has fewer steps.
        let big = predict(Collective::AllReduce, &"auto".into(), 8, 1 << 30, &link).unwrap();
        let rhd = predict(Collective::AllReduce, &"rhd".into(), 8, 1 << 30, &link).unwrap();
        assert_eq!(big, rhd);
        assert_eq!(
            predict(Collective::AllReduce, &"bogus".into(), 8, 8, &link),
            None
        );
    }

    #[test]
    fn selectors_and_textbook_forms() {
        let link = LinkParams::from_gbps_us(100.0, 5.0);
        for sel in ["auto", "nccl", "NCCL", "mpi", "mpi(staged-in-place)"] {
            assert!(ModelAlgo::of(sel).is_selector(), "{sel}");
        }
        for alg in [
            "ring", "tree", "rd", "rhd", "chain", "pairwise", "p2p", "Ring",
        ] {
            assert!(!ModelAlgo::of(alg).is_selector(), "{alg}");
        }
        // A large message: parbench's sliced ring has 256 x 14 latency
        // steps; the textbook ring 14; a selector gets rhd's 6.
        let n = 1u64 << 30;
        let sliced = predict(Collective::AllReduce, &"ring".into(), 8, n, &link).unwrap();
        let book = predict_textbook(Collective::AllReduce, &"ring".into(), 8, n, &link).unwrap();
        let bw = 1.75 * n as f64 / 100e9;
        assert!(close(sliced, 256.0 * 14.0 * 5e-6 + bw), "{sliced}");
        assert!(close(book, 14.0 * 5e-6 + bw), "{book}");
        let nccl = predict(Collective::AllReduce, &"nccl".into(), 8, n, &link).unwrap();
        assert!(close(nccl, 6.0 * 5e-6 + bw), "{nccl}");
        assert_eq!(
            textbook_terms(Collective::AllGather, &"ring".into(), 8, n),
            Some(ring_gather_scatter(8, false))
        );
        // Algorithms without slices are the same either way.
        assert_eq!(
            textbook_terms(Collective::Broadcast, &"tree".into(), 8, n),
            terms(Collective::Broadcast, &"tree".into(), 8, n)
        );
        assert_eq!(
            predict_textbook(Collective::AllReduce, &"nvls".into(), 8, n, &link),
            None
        );
    }
}
