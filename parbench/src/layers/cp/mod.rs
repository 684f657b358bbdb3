//! Context parallelism: causal attention with the sequence split over `C`
//! ranks, three ways, as Megatron-Core and DeepSpeed run it.
//!
//! - `p2p` (Megatron-Core's ring): each rank keeps its queries and passes
//!   its K/V chunk around the ring, C-1 steps; at each step it attends to
//!   the chunk it holds while that chunk travels on to the next rank and
//!   the next one arrives (a thread of its own on a second communicator
//!   where the backend has one). Partial results merge by their
//!   log-sum-exp (online softmax), as ring attention does.
//! - `all_gather`: every rank gathers all K/V once, then attends; no overlap.
//! - `a2a` (DeepSpeed-Ulysses): an all-to-all turns Q/K/V from
//!   sequence-sharded to head-sharded, each rank attends over the whole
//!   sequence for `heads / C` heads, and a second all-to-all turns the
//!   output back.
//!
//! Causal balance is Megatron-Core's: the sequence is cut into 2C chunks
//! and rank i holds chunks i and 2C-1-i, so every rank has as many
//! unmasked query-key pairs as any other (without the causal mask the
//! same layout, balanced anyway).
//!
//! Training adds each method's backward ([`backward`]). With tensor
//! parallelism (`tp` > 1) the world is tp x cp ranks, TP fastest as
//! Megatron orders them: each TP rank holds `heads / tp` heads, as the
//! dense block's attention does, and its CP group (the ranks with its
//! heads) splits the sequence. The attention core has no TP
//! communication; that lives in the projections around it.
//!
//! The attention runs on the host in f32 (whatever the backend), so the
//! three methods and the unsharded reference share one arithmetic; the
//! communicator moves the same f32 values on its own buffers.
//!
//! Parts: this file (sizes, method, which tokens a rank holds, seeded
//! inputs); [`attend`] (the kernels); [`ring`] (the transfers);
//! [`forward`] and [`backward`] (the three methods with their clock);
//! [`run`] (check against the unsharded attention, timing).

pub mod attend;
pub mod backward;
pub mod forward;
mod ring;
pub mod run;

pub use backward::{cp_backward, CpGrads};
pub use forward::{cp_forward, CpClock, CpForward, CpInputs};
pub use run::{check_cp, run_cp, CpOutcome, CpPlan};

use super::{LayerError, LayerResult};

/// How K/V (or Q/K/V) reach the ranks that need them: the planner's names.
pub use crate::model::context::CpComm;

/// The sizes of one context-parallel attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpConfig {
    /// Tokens per sequence (the whole sequence, before the split).
    pub seq: usize,
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Sequences per call.
    pub batch: usize,
    pub method: CpComm,
    /// Each query sees only the keys at or before it.
    pub causal: bool,
}

impl CpConfig {
    /// Checks that the heads split over `tp` ranks and the sequence (and
    /// for `a2a` each TP rank's heads) over `cp`; the error names what
    /// does not divide.
    pub fn validate_grid(&self, tp: usize, cp: usize) -> LayerResult<()> {
        if tp == 0 {
            return Err(LayerError::Config(
                "tensor-parallel degree must be at least 1".into(),
            ));
        }
        if !self.heads.is_multiple_of(tp) {
            return Err(LayerError::Config(format!(
                "tp {tp} does not divide heads {}",
                self.heads
            )));
        }
        self.validate(cp)?;
        self.shard(tp).validate(cp)
    }

    /// What each of `tp` ranks runs: `heads / tp` of the heads.
    pub fn shard(&self, tp: usize) -> CpConfig {
        CpConfig {
            heads: self.heads / tp.max(1),
            ..*self
        }
    }

    /// Checks that the sequence (and for `a2a` the heads) split over `cp`
    /// ranks; the error names what does not divide.
    pub fn validate(&self, cp: usize) -> LayerResult<()> {
        let bad = |m: String| Err(LayerError::Config(m));
        if cp == 0 {
            return bad("context-parallel degree must be at least 1".into());
        }
        for (name, v) in [
            ("seq", self.seq),
            ("heads", self.heads),
            ("head width", self.head_dim),
            ("batch", self.batch),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        let w = |v: usize| v as u128;
        let qkv = w(self.batch) * w(self.seq) * w(self.heads) * w(self.head_dim) * 8;
        if qkv > (isize::MAX as u128) / 8 {
            return bad("sizes overflow the address space".into());
        }
        if !self.seq.is_multiple_of(2 * cp) {
            return bad(format!(
                "seq {} is not a multiple of 2 x cp = {} (causal balance cuts it into 2 x cp chunks)",
                self.seq,
                2 * cp
            ));
        }
        if self.method == CpComm::A2a && !self.heads.is_multiple_of(cp) {
            return bad(format!(
                "a2a gives each rank heads / cp heads, and cp {cp} does not divide heads {}",
                self.heads
            ));
        }
        Ok(())
    }

    /// Values per token of one of Q, K, V: heads x head width.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Tokens each of `cp` ranks holds per sequence.
    pub fn local_seq(&self, cp: usize) -> usize {
        self.seq / cp.max(1)
    }

    /// Bytes one rank holds at once (f32): its Q, K, V and output, the
    /// gathered K/V or the received chunks (in training as much again for
    /// the gradients), and on rank 0 with `check` the whole sequence's
    /// tensors (and gradients) and one query row's probabilities. For
    /// refusing sizes a machine cannot hold before anything is allocated.
    pub fn memory_bytes(&self, cp: usize, check: bool, train: bool) -> u128 {
        let w = |v: usize| v as u128;
        let local = w(self.batch) * w(self.local_seq(cp)) * w(self.width());
        let whole = w(self.batch) * w(self.seq) * w(self.width());
        let exchange = match self.method {
            CpComm::P2p => 4 * local,
            CpComm::AllGather => 2 * whole,
            CpComm::A2a => 8 * local,
        };
        let rank = (6 * local + exchange) * if train { 2 } else { 1 };
        let tensors = if train { 10 } else { 6 };
        let reference = if check {
            tensors * whole + 2 * w(self.seq)
        } else {
            0
        };
        (rank + reference) * 4
    }

    /// Bytes one of `cp` ranks sends per call (f32). Forward: K and V of
    /// its tokens to each of the others (the ring's C-1 steps, or the
    /// all-gather's share), or for `a2a` the (C-1)/C of its Q, K, V and
    /// output that leave it. Training adds the backward's: the ring's K/V
    /// again and dK/dV C times, the gather's K/V again and the
    /// reduce-scatter's dK/dV, or for `a2a` the output's gradient and
    /// dQ/dK/dV.
    pub fn bytes_sent(&self, cp: usize, train: bool) -> u64 {
        let cp = cp.max(1) as u64;
        let local = (self.batch * self.local_seq(cp as usize) * self.width()) as u64 * 4;
        let forward = match self.method {
            CpComm::P2p | CpComm::AllGather => (cp - 1) * 2 * local,
            CpComm::A2a => 4 * local * (cp - 1) / cp,
        };
        let backward = match self.method {
            _ if cp == 1 => 0,
            CpComm::P2p => (cp - 1) * 2 * local + cp * 2 * local,
            CpComm::AllGather => 2 * (cp - 1) * 2 * local,
            CpComm::A2a => 4 * local * (cp - 1) / cp,
        };
        forward + if train { backward } else { 0 }
    }

    /// Matrix-product FLOPs of one forward on all ranks: QK^T and PV over
    /// the unmasked query-key pairs.
    pub fn flops(&self) -> f64 {
        let s = self.seq as f64;
        let pairs = if self.causal {
            s * (s + 1.0) / 2.0
        } else {
            s * s
        };
        4.0 * self.batch as f64 * pairs * self.width() as f64
    }
}

/// The global positions, in order, of the tokens rank `rank` of `cp` holds
/// in each sequence: chunks `rank` and `2 cp - 1 - rank` of 2 cp.
pub fn positions(seq: usize, cp: usize, rank: usize) -> Vec<usize> {
    let chunk = seq / (2 * cp.max(1));
    let head = rank * chunk;
    let tail = (2 * cp - 1 - rank) * chunk;
    (head..head + chunk).chain(tail..tail + chunk).collect()
}

/// Which of Q, K, V and the output's gradient a seeded tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qkv {
    Q = 0,
    K = 1,
    V = 2,
    DOut = 3,
}

/// The seeded value of `which` at (sequence `b`, token `pos`, column
/// `col`): the same on every rank and in the reference, in [-1, 1).
pub fn value(seed: u64, which: Qkv, cfg: &CpConfig, b: usize, pos: usize, col: usize) -> f32 {
    let index = ((b * cfg.seq + pos) * cfg.width() + col) as u64;
    let z = crate::seed::splitmix64(seed ^ ((which as u64 + 1) << 56) ^ index);
    ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// `which` for the tokens at `pos` of every sequence and the heads
/// `heads`: `[batch][pos][heads][head width]`.
pub fn seeded(
    seed: u64,
    which: Qkv,
    cfg: &CpConfig,
    pos: &[usize],
    heads: std::ops::Range<usize>,
) -> Vec<f32> {
    let cols = heads.start * cfg.head_dim..heads.end * cfg.head_dim;
    let mut out = Vec::with_capacity(cfg.batch * pos.len() * cols.len());
    for b in 0..cfg.batch {
        for &p in pos {
            out.extend(cols.clone().map(|c| value(seed, which, cfg, b, p, c)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(seq: usize, heads: usize, method: CpComm) -> CpConfig {
        CpConfig {
            seq,
            heads,
            head_dim: 4,
            batch: 1,
            method,
            causal: true,
        }
    }

    #[test]
    fn ranks_hold_a_head_and_a_tail_chunk_and_cover_the_sequence() {
        assert_eq!(positions(8, 2, 0), vec![0, 1, 6, 7]);
        assert_eq!(positions(8, 2, 1), vec![2, 3, 4, 5]);
        let mut all: Vec<usize> = (0..4).flat_map(|r| positions(32, 4, r)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..32).collect::<Vec<_>>());
    }

    /// Causal balance: every rank's queries see as many keys (at or before
    /// them) as any other rank's; a plain split in C pieces would not.
    #[test]
    fn every_rank_has_the_same_causal_work() {
        let work = |pos: &[usize]| pos.iter().map(|p| p + 1).sum::<usize>();
        for cp in [2, 4, 8] {
            let per_rank: Vec<usize> = (0..cp).map(|r| work(&positions(64, cp, r))).collect();
            assert!(per_rank.iter().all(|&w| w == per_rank[0]), "{per_rank:?}");
            let plain: Vec<usize> = (0..64 / cp).map(|i| i + 1).collect();
            assert!(work(&plain) < per_rank[0], "cp {cp}");
        }
    }

    #[test]
    fn validation_names_what_does_not_divide() {
        assert!(cfg(16, 4, CpComm::P2p).validate(4).is_ok());
        let e = cfg(12, 4, CpComm::P2p).validate(4).unwrap_err().to_string();
        assert!(e.contains("seq 12"), "{e}");
        let e = cfg(16, 6, CpComm::A2a).validate(4).unwrap_err().to_string();
        assert!(e.contains("heads 6"), "{e}");
        assert!(cfg(16, 6, CpComm::AllGather).validate(4).is_ok());
        assert!(cfg(16, 4, CpComm::P2p).validate(0).is_err());
        assert!("ring".parse::<CpComm>().is_err());
        assert_eq!("all_gather".parse::<CpComm>(), Ok(CpComm::AllGather));
    }
}
