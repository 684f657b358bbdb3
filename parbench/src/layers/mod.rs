//! A Megatron-LM transformer block, split across `t` tensor-parallel ranks
//! and run for real: what `bench-layers` times and checks.
//!
//! The arrangement is Megatron's (Shoeybi et al. 2019): the attention's QKV
//! projection is column-parallel (each rank holds the Q, K and V columns of
//! its `heads / t` heads and runs their scaled-dot-product attention), its
//! output projection is row-parallel and ends in one all-reduce (operator
//! `g`) before the bias; the MLP's first matrix is column-parallel, GELU
//! needs no communication, the second matrix is row-parallel and ends in one
//! all-reduce. Backward runs the conjugate operator `f`: one all-reduce of
//! each input gradient, so training costs 2 all-reduces forward and 2
//! backward per block. With sequence parallelism (Korthikanti et al. 2022)
//! each all-reduce becomes a reduce-scatter after the row-parallel matrix and
//! an all-gather before the next column-parallel one, and the residual
//! stream lives sharded along the tokens.
//!
//! The block has residual connections but no LayerNorm or dropout: the
//! [`Compute`](crate::compute::Compute) trait has neither, and both are
//! element-wise work that moves no bytes between ranks.
//!
//! Parts, one job each:
//! - [`BlockConfig`]: sizes and mode, validated against `t`.
//! - [`layout`]: every tensor's global shape, how it is split across ranks,
//!   and its seeded values, so that any rank builds its shard alone.
//! - [`block`]: the sharded block's forward and backward on a device and a
//!   communicator, timing compute and communication apart.
//! - [`check`]: gathers the sharded results and compares them with the same
//!   block on one rank.
//! - [`moe`]: the mixture-of-experts block split by expert parallelism,
//!   with its own check and timed loop.
//! - [`run`]: the timed loop, cross-rank statistics, and the wire samples
//!   for the alpha-beta fit.
//! - [`cp`]: context-parallel attention (the sequence split over ranks),
//!   its check against the unsharded attention and its timed loop.

pub mod block;
pub mod check;
pub mod cp;
pub mod layout;
pub mod moe;
pub mod run;

pub use block::{BlockState, PhaseClock, TpBlock};
pub use check::{check_block, CheckReport};
pub use run::{
    run_tp, wire_samples, RunOptions, SampleConditions, TpOutcome, TpTiming, WireSample,
};

use crate::comm::{CommError, DType};
use crate::compute::ComputeError;
use crate::model::{TpMode, TpTraffic};
use std::fmt;
use std::str::FromStr;

/// What went wrong building or running a block.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The sizes do not split across the ranks, or the mode is not possible.
    #[error("invalid block: {0}")]
    Config(String),
    #[error(transparent)]
    Compute(#[from] ComputeError),
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// Result of every block operation.
pub type LayerResult<T> = Result<T, LayerError>;

/// The sizes of one transformer block and of the batch it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockShape {
    /// Model width `h`.
    pub hidden: usize,
    /// Attention heads `a`; the head width is `h / a`.
    pub heads: usize,
    /// MLP width (4 h in GPT-style models).
    pub ffn: usize,
    /// Sequence length: tokens per sequence in prefill, KV-cache length in decode.
    pub seq: usize,
    /// Sequences per batch.
    pub batch: usize,
}

/// Whether a block runs forward only or forward and backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Train,
}

/// A block's passes as `--mode` names them (prefill, decode or train):
/// records keep `mode` (forward or train) and `decode` apart, and every
/// printed label reads them back through this.
pub fn mode_name(mode: Mode, decode: bool) -> &'static str {
    match (mode, decode) {
        (Mode::Train, _) => "train",
        (Mode::Forward, true) => "decode",
        (Mode::Forward, false) => "prefill",
    }
}

/// [`mode_name`] of a record's `mode` and `decode` fields (an unknown
/// `mode` as written).
pub fn record_mode_name(mode: &str, decode: bool) -> &str {
    mode.parse::<Mode>().map_or(mode, |m| mode_name(m, decode))
}

impl Mode {
    /// The name in records (`mode`); printed labels use [`mode_name`].
    pub fn name(self) -> &'static str {
        match self {
            Mode::Forward => "forward",
            Mode::Train => "train",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "forward" | "fwd" | "inference" => Ok(Mode::Forward),
            "train" | "training" => Ok(Mode::Train),
            other => Err(format!(
                "unknown mode '{other}' (expected forward or train)"
            )),
        }
    }
}

/// One block configuration: sizes, mode, and how the activations are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockConfig {
    pub shape: BlockShape,
    pub mode: Mode,
    /// One new token per sequence, attending to a KV cache of `seq` earlier
    /// tokens (the per-token cost of generation), instead of a prefill of
    /// `seq` tokens.
    pub decode: bool,
    /// Sequence parallelism: all-gather and reduce-scatter in place of all-reduce.
    pub seq_parallel: bool,
}

impl BlockConfig {
    /// Tokens one block call processes: `batch x seq` in prefill, `batch` in decode.
    pub fn tokens(&self) -> usize {
        self.shape.batch * if self.decode { 1 } else { self.shape.seq }
    }

    /// Query rows per sequence: `seq` in prefill, 1 in decode.
    pub fn query_len(&self) -> usize {
        if self.decode {
            1
        } else {
            self.shape.seq
        }
    }

    /// Keys each query sees at most: `seq` in prefill, `seq + 1` (cache and
    /// the new token) in decode.
    pub fn kv_len(&self) -> usize {
        self.shape.seq + usize::from(self.decode)
    }

    /// Whether collectives run as all-gather/reduce-scatter: sequence
    /// parallelism at t > 1 (at t = 1 there is nothing to split).
    pub fn sequence_split(&self, tp: usize) -> bool {
        self.seq_parallel && tp > 1
    }

    /// Checks that the block splits across `tp` ranks; the error names the
    /// size that does not divide.
    pub fn validate(&self, tp: usize) -> LayerResult<()> {
        let s = &self.shape;
        let bad = |m: String| Err(LayerError::Config(m));
        if tp == 0 {
            return bad("tensor-parallel degree must be at least 1".into());
        }
        for (name, v) in [
            ("hidden", s.hidden),
            ("heads", s.heads),
            ("ffn", s.ffn),
            ("seq", s.seq),
            ("batch", s.batch),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        // Every buffer's length must fit comfortably in memory arithmetic:
        // check the largest products in u128 before anything multiplies in usize.
        let w = |v: usize| v as u128;
        let tokens = w(s.batch) * w(s.seq);
        let largest = [
            w(s.hidden) * w(s.hidden) * 3,
            w(s.hidden) * w(s.ffn),
            tokens * (w(s.ffn) + 3 * w(s.hidden)),
            w(s.batch) * w(s.heads) * w(s.seq) * (w(s.seq) + 1),
        ];
        if largest.iter().any(|&n| n > (isize::MAX as u128) / 8) {
            return bad("sizes overflow the address space".into());
        }
        if !s.hidden.is_multiple_of(s.heads) {
            return bad(format!(
                "hidden {} is not a multiple of heads {}",
                s.hidden, s.heads
            ));
        }
        if !s.heads.is_multiple_of(tp) {
            return bad(format!(
                "tp {tp} does not divide heads {}: each rank must hold whole heads",
                s.heads
            ));
        }
        if !s.ffn.is_multiple_of(tp) {
            return bad(format!("tp {tp} does not divide ffn {}", s.ffn));
        }
        if self.decode && self.mode == Mode::Train {
            return bad("decode runs forward only (--decode with --mode train)".into());
        }
        if self.sequence_split(tp) && !self.tokens().is_multiple_of(tp) {
            return bad(format!(
                "sequence parallelism splits the {} tokens of a block call across ranks: tp {tp} does not divide them",
                self.tokens()
            ));
        }
        Ok(())
    }

    /// The block's communication at `tp` ranks in elements of `dtype`, as
    /// the model counts it (one source for bytes per call and calls per block).
    pub fn tp_traffic(&self, tp: usize, dtype: DType) -> TpTraffic {
        TpTraffic {
            tp: tp as u64,
            batch: self.shape.batch as u64,
            seq: self.shape.seq as u64,
            hidden: self.shape.hidden as u64,
            dtype_bytes: dtype.size() as u64,
            mode: match (self.mode, self.decode) {
                (Mode::Train, _) => TpMode::Train,
                (Mode::Forward, true) => TpMode::Decode,
                (Mode::Forward, false) => TpMode::Prefill,
            },
            sequence_parallel: self.seq_parallel,
        }
    }

    /// Bytes one rank of `tp` holds at once running this block with
    /// `elem`-byte values, and what the check's unsharded block adds on
    /// rank 0 (when `check`): an estimate from the tensors the block
    /// allocates (weights, and in train mode their gradients; the QKV,
    /// score, context, MLP and output activations, kept for the backward
    /// and doubled by their gradients; the KV cache in decode), in u128 so
    /// that no size overflows before it is refused. For refusing flags a
    /// machine cannot hold before anything is allocated.
    pub fn memory_bytes(&self, tp: usize, elem: u128, check: bool) -> (u128, u128) {
        let one = |t: u128| -> u128 {
            let s = &self.shape;
            let w = |v: usize| v as u128;
            let (h, f, heads, b) = (w(s.hidden), w(s.ffn), w(s.heads), w(s.batch));
            let (q, kv, n) = (w(self.query_len()), w(self.kv_len()), w(self.tokens()));
            let t = t.max(1);
            let params = (4 * h * h + 2 * h * f) / t + 5 * h + f;
            let acts = n * 3 * h / t
                + 2 * b * heads.div_ceil(t) * q * kv
                + n * h / t
                + 4 * n * h
                + 2 * n * f / t;
            let cache = if self.decode { 2 * b * kv * h / t } else { 0 };
            let train = u128::from(self.mode == Mode::Train);
            ((params + acts) * (1 + train) + cache) * elem
        };
        let t = tp as u128;
        let rank = one(t);
        let extra = if check {
            // The unsharded block, and every rank's outputs and gradients gathered.
            let s = &self.shape;
            let gathered = (self.tokens() as u128) * (s.hidden as u128) * t
                + (4 * (s.hidden as u128) * (s.hidden as u128)
                    + 2 * (s.hidden as u128) * (s.ffn as u128))
                    * u128::from(self.mode == Mode::Train);
            one(1) + gathered * elem
        } else {
            0
        };
        (rank, extra)
    }

    /// Floating-point operations of one block call on all ranks together
    /// (matrix products only), for reporting achieved FLOP/s.
    pub fn flops(&self) -> f64 {
        let s = &self.shape;
        let (n, h, f) = (self.tokens() as f64, s.hidden as f64, s.ffn as f64);
        let proj = 2.0 * n * h * (3.0 * h + h + 2.0 * f);
        let attn = 2.0 * 2.0 * s.batch as f64 * self.query_len() as f64 * self.kv_len() as f64 * h;
        let fwd = proj + attn;
        match self.mode {
            Mode::Forward => fwd,
            Mode::Train => 3.0 * fwd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(hidden: usize, heads: usize, ffn: usize) -> BlockConfig {
        BlockConfig {
            shape: BlockShape {
                hidden,
                heads,
                ffn,
                seq: 8,
                batch: 2,
            },
            mode: Mode::Forward,
            decode: false,
            seq_parallel: false,
        }
    }

    #[test]
    fn validation_names_what_does_not_divide() {
        assert!(cfg(24, 6, 96).validate(3).is_ok());
        let e = cfg(24, 6, 96).validate(4).unwrap_err().to_string();
        assert!(e.contains("heads 6"), "{e}");
        let e = cfg(24, 4, 90).validate(4).unwrap_err().to_string();
        assert!(e.contains("ffn 90"), "{e}");
        let e = cfg(25, 4, 96).validate(1).unwrap_err().to_string();
        assert!(e.contains("hidden 25"), "{e}");
        let mut c = cfg(24, 6, 96);
        c.mode = Mode::Train;
        c.decode = true;
        assert!(c.validate(1).is_err());
        let mut c = cfg(24, 6, 96);
        c.seq_parallel = true;
        c.shape.seq = 5;
        c.shape.batch = 1;
        assert!(c.validate(1).is_ok());
        assert!(c.validate(3).unwrap_err().to_string().contains("tokens"));
        assert!(cfg(usize::MAX / 2, 1, 1).validate(1).is_err());
    }

    #[test]
    fn memory_grows_with_the_shape_and_shrinks_with_tp() {
        let c = cfg(64, 4, 256);
        let (one, check) = c.memory_bytes(1, 4, true);
        let (four, _) = c.memory_bytes(4, 4, false);
        assert!(four < one && check >= one, "{one} {four} {check}");
        // The weights alone of a 1e8-wide block: far beyond any machine, no overflow.
        let huge = cfg(100_000_000, 1, 400_000_000);
        let (bytes, _) = huge.memory_bytes(1, 4, false);
        assert!(bytes > 4 * 12 * 10u128.pow(16), "{bytes}");
    }

    #[test]
    fn traffic_matches_the_blocks_collectives() {
        let mut c = cfg(32, 4, 128);
        let t = c.tp_traffic(4, DType::BF16);
        assert_eq!(t.calls_per_block(), 2);
        assert_eq!(t.bytes_per_call(), 16 * 32 * 2);
        assert_eq!(t.tokens_per_step(), c.tokens() as u64);
        c.mode = Mode::Train;
        assert_eq!(c.tp_traffic(4, DType::F32).calls_per_block(), 4);
        c.seq_parallel = true;
        assert_eq!(c.tp_traffic(4, DType::F32).calls_per_block(), 8);
        assert_eq!(c.tp_traffic(1, DType::F32).calls_per_block(), 0);
        c.mode = Mode::Forward;
        c.decode = true;
        assert_eq!(c.tp_traffic(2, DType::F32).tokens_per_step(), 2);
    }
}

#[cfg(test)]
mod sharding_tests;

/// Runs `f` on `world` ranks of the local backend and returns each rank's
/// result; a failing rank fails the test with its error.
#[cfg(test)]
pub(crate) fn on_local_ranks<R: Send>(
    world: usize,
    f: impl Fn(&mut crate::comm::local::LocalComm) -> R + Sync,
) -> Vec<R> {
    crate::comm::local::run(
        world,
        crate::comm::Algo::Auto,
        std::time::Duration::from_secs(30),
        |c| Ok(f(c)),
    )
    .into_iter()
    .enumerate()
    .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
    .collect()
}
