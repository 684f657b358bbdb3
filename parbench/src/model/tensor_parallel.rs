//! Tensor-parallel traffic of a Megatron transformer block.
//!
//! Megatron-LM (Shoeybi et al. 2019, section 3; Narayanan et al. SC21,
//! sections 2.3 and 3.3) splits the attention's QKV projection and the MLP's first
//! matrix by columns and the output projection and second matrix by rows,
//! so each sub-block (attention, MLP) needs one all-reduce of its
//! `b x s x h` output in the forward pass (operator `g`) and one of its
//! input gradient in the backward pass (operator `f`): 2 all-reduces per
//! layer forward, 2 backward. A ring all-reduce makes each device send
//! `2(t-1)/t` of the buffer, so per device per layer per microbatch,
//! forward and backward, `4 x 2(t-1)/t x bsh = 8 bsh (t-1)/t` elements
//! (Narayanan et al. SC21, section 3.3).
//!
//! Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
//! Recomputation in Large Transformer Models", its "Sequence Parallelism" section) replaces
//! each all-reduce by an all-gather (`g`) and a reduce-scatter (`g-bar`)
//! of the same `b x s x h` buffer: twice the calls, each moving `(t-1)/t`
//! of the buffer per device, so the same total volume. Not counted here:
//! the all-gathers Megatron-LM repeats in the backward pass instead of
//! keeping the gathered input, overlapped with the GEMMs; the planner's
//! tensor-parallel overlap counts them (`plan/costs.rs`, `ub_pairs`).
//!
//! Units: elements and bytes are exact integers of the buffer each
//! collective is called with (nccl-tests' size convention, so the same `n`
//! goes to [`super::alpha_beta::predict`]); "wire bytes" are what each
//! device sends, a float because `(t-1)/t` need not divide the buffer.
//!
//! Per token: a decode step (`Decode`) processes one new token of each of
//! the `b` sequences, with `s = 1` in every buffer; that step is what the
//! field's worked example calls "per token" (the latency of one generated
//! token). [`TpTraffic::tokens_per_step`] divides throughput figures.

use super::algo::ModelAlgo;
use super::alpha_beta::{predict, LinkParams};
use crate::comm::Collective;

/// Which passes one step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TpMode {
    /// Forward over the whole sequence (inference prefill): 2 all-reduces per layer.
    Prefill,
    /// Forward over one new token per sequence (KV-cached decode), `s = 1`.
    Decode,
    /// Forward and backward (training): 2 + 2 all-reduces per layer.
    Train,
}

/// Which ring factor a figure uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingFactor {
    /// The exact factor for `t` devices: `2(t-1)/t` per all-reduce,
    /// `(t-1)/t` per all-gather or reduce-scatter.
    Exact,
    /// Its limit for large `t` (2, resp. 1): the "about 2x" of rules of thumb.
    Limit,
}

/// The tensor-parallel traffic of one transformer layer (block) at degree `tp`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TpTraffic {
    /// Tensor-parallel degree `t`.
    pub tp: u64,
    /// Microbatch size `b` (sequences).
    pub batch: u64,
    /// Sequence length `s` (tokens per sequence in one prefill or train step;
    /// ignored in decode, which processes one token per sequence).
    pub seq: u64,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Bytes per element of the activations (2 for fp16/bf16).
    pub dtype_bytes: u64,
    /// Which passes a step runs.
    pub mode: TpMode,
    /// Sequence parallelism: all-gather + reduce-scatter instead of all-reduce.
    pub sequence_parallel: bool,
}

/// Layers of the worked example's model (80, hidden 8192: a 70B-class model).
pub const WORKED_EXAMPLE_LAYERS: u64 = 80;

/// The worked example's fast wire: 400 GB/s per GPU (NVLink class).
pub const NVLINK_REFERENCE_GBPS: f64 = 400.0;

/// The worked example's network: 25 GB/s per GPU (a 200 Gb/s NIC class),
/// 16x slower than [`NVLINK_REFERENCE_GBPS`].
pub const NETWORK_REFERENCE_GBPS: f64 = 25.0;

impl TpTraffic {
    /// The traffic of one layer at degree `tp`, microbatch `batch`, `seq`
    /// tokens per sequence, hidden size `hidden`, `dtype_bytes` per element.
    pub fn new(
        tp: u64,
        batch: u64,
        seq: u64,
        hidden: u64,
        dtype_bytes: u64,
        mode: TpMode,
        sequence_parallel: bool,
    ) -> Self {
        TpTraffic {
            tp,
            batch,
            seq,
            hidden,
            dtype_bytes,
            mode,
            sequence_parallel,
        }
    }

    /// The worked example: TP = 8, batch 32, hidden 8192, fp16, decode
    /// (one token per sequence), no sequence parallelism. With
    /// [`WORKED_EXAMPLE_LAYERS`] layers it gives 0.5 MiB per all-reduce,
    /// 160 calls and about 160 MB per token.
    pub fn worked_example() -> Self {
        TpTraffic {
            tp: 8,
            batch: 32,
            seq: 1,
            hidden: 8192,
            dtype_bytes: 2,
            mode: TpMode::Decode,
            sequence_parallel: false,
        }
    }

    /// Tokens per sequence in each buffer: 1 in decode, `s` otherwise.
    fn tokens_per_sequence(&self) -> u64 {
        match self.mode {
            TpMode::Decode => 1,
            TpMode::Prefill | TpMode::Train => self.seq,
        }
    }

    /// Tokens one step processes: `b` in decode (one per sequence), `b s`
    /// otherwise. Divide a step's figure by it for a per-token throughput cost.
    pub fn tokens_per_step(&self) -> u64 {
        self.batch.saturating_mul(self.tokens_per_sequence())
    }

    /// Elements of each collective's buffer: `b x s x h` (`s = 1` in decode).
    pub fn elements_per_call(&self) -> u64 {
        self.tokens_per_step().saturating_mul(self.hidden)
    }

    /// Bytes of each collective's buffer (nccl-tests' size: the all-reduce
    /// buffer, the all-gather output, the reduce-scatter input).
    pub fn bytes_per_call(&self) -> u64 {
        self.elements_per_call().saturating_mul(self.dtype_bytes)
    }

    /// Passes per step: 1 (forward) or 2 (forward and backward).
    fn passes(&self) -> u64 {
        match self.mode {
            TpMode::Prefill | TpMode::Decode => 1,
            TpMode::Train => 2,
        }
    }

    /// The collectives of one layer and how many calls of each per step:
    /// `[(AllReduce, 2 per pass)]`, or with sequence parallelism
    /// `[(AllGather, 2 per pass), (ReduceScatter, 2 per pass)]`. Empty at `t <= 1`.
    pub fn collectives(&self) -> Vec<(Collective, u64)> {
        if self.tp <= 1 {
            return Vec::new();
        }
        let per_kind = 2 * self.passes();
        if self.sequence_parallel {
            vec![
                (Collective::AllGather, per_kind),
                (Collective::ReduceScatter, per_kind),
            ]
        } else {
            vec![(Collective::AllReduce, per_kind)]
        }
    }

    /// Collective calls per layer per step: 2 forward, 4 train; twice that
    /// with sequence parallelism; 0 at `t <= 1`.
    pub fn calls_per_block(&self) -> u64 {
        self.collectives().iter().map(|c| c.1).sum()
    }

    /// Collective calls of a step through `layers` layers (worked example: 2 x 80 = 160).
    pub fn calls_per_step(&self, layers: u64) -> u64 {
        self.calls_per_block().saturating_mul(layers)
    }

    /// Fraction of a buffer each device sends for one call of `coll` with a
    /// ring: `2(t-1)/t` for all-reduce, `(t-1)/t` for all-gather and
    /// reduce-scatter (or their limits 2 and 1).
    pub fn ring_factor(&self, coll: Collective, kind: RingFactor) -> f64 {
        let whole = if coll == Collective::AllReduce {
            2.0
        } else {
            1.0
        };
        match kind {
            _ if self.tp <= 1 => 0.0,
            RingFactor::Limit => whole,
            RingFactor::Exact => whole * (self.tp as f64 - 1.0) / self.tp as f64,
        }
    }

    /// Bytes each device sends per layer per step with a ring.
    /// Train without sequence parallelism: `8 b s h (t-1)/t` elements.
    pub fn wire_bytes_per_block(&self, kind: RingFactor) -> f64 {
        let n = self.bytes_per_call() as f64;
        self.collectives()
            .iter()
            .map(|&(c, calls)| calls as f64 * self.ring_factor(c, kind) * n)
            .sum()
    }

    /// Bytes each device sends per step through `layers` layers (in decode:
    /// per generated token of every sequence, the worked example's "per token").
    pub fn wire_bytes_per_step(&self, layers: u64, kind: RingFactor) -> f64 {
        self.wire_bytes_per_block(kind) * layers as f64
    }

    /// The alpha-beta time of one layer's collectives per step with
    /// algorithm `algo` over `link`, seconds; `None` when the algorithm has
    /// no model for one of them.
    pub fn comm_seconds_per_block(&self, algo: &ModelAlgo, link: &LinkParams) -> Option<f64> {
        let p = usize::try_from(self.tp).ok()?;
        self.collectives()
            .iter()
            .map(|&(c, calls)| {
                predict(c, algo, p, self.bytes_per_call(), link).map(|t| t * calls as f64)
            })
            .sum()
    }
}

/// Seconds to move `bytes` at `gbps` GB/s (1e9 B/s), bandwidth only:
/// the rule-of-thumb time of the worked example. Infinite at 0 GB/s.
pub fn transfer_seconds(bytes: f64, gbps: f64) -> f64 {
    bytes / (gbps * 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    #[test]
    fn worked_example_exactly() {
        let w = TpTraffic::worked_example();
        // 0.5 MB per all-reduce: 32 x 8192 x 2 B = 524,288 B = 0.5 MiB exactly
        // (the example's "MB" is a binary megabyte here).
        assert_eq!(w.elements_per_call(), 32 * 8192);
        assert_eq!(w.bytes_per_call(), 524_288);
        assert_eq!(w.bytes_per_call() as f64, 0.5 * MIB);
        // About 2x moved per call: 1 MiB with the limit factor 2; exactly
        // 1.75 x 0.5 MiB = 0.875 MiB with the ring factor at t = 8.
        let ar = Collective::AllReduce;
        assert_eq!(w.ring_factor(ar, RingFactor::Exact), 1.75);
        assert_eq!(w.ring_factor(ar, RingFactor::Limit), 2.0);
        assert_eq!(w.wire_bytes_per_block(RingFactor::Limit) / 2.0, MIB);
        assert_eq!(w.wire_bytes_per_block(RingFactor::Exact) / 2.0, 917_504.0);
        // 2 x 80 layers = 160 calls.
        assert_eq!(w.calls_per_block(), 2);
        assert_eq!(w.calls_per_step(WORKED_EXAMPLE_LAYERS), 160);
        // About 160 MB per token: 160 MiB = 167,772,160 B with the limit
        // factor (the example rounds 1 MiB to 1 MB), 140 MiB exactly.
        let limit = w.wire_bytes_per_step(WORKED_EXAMPLE_LAYERS, RingFactor::Limit);
        let exact = w.wire_bytes_per_step(WORKED_EXAMPLE_LAYERS, RingFactor::Exact);
        assert_eq!(limit, 160.0 * MIB);
        assert_eq!(exact, 140.0 * MIB);
        assert!((limit - 160e6).abs() / 160e6 < 0.05);
        // 0.4 ms per token at 400 GB/s and 6.4 ms at 25 GB/s: exactly so for
        // the example's round 160 MB, within 5% for 160 MiB.
        assert!(close(transfer_seconds(160e6, 400.0), 0.4e-3));
        assert!(close(transfer_seconds(160e6, 25.0), 6.4e-3));
        let (nv, net) = (
            transfer_seconds(limit, 400.0),
            transfer_seconds(limit, 25.0),
        );
        assert!((nv - 0.4e-3).abs() / 0.4e-3 < 0.05, "{nv}");
        assert!((net - 6.4e-3).abs() / 6.4e-3 < 0.05, "{net}");
        // 16x, whatever the factor.
        assert!(close(net / nv, 16.0));
        // The exact ring figures: 146,800,640 B -> 0.367 ms and 5.87 ms.
        assert!(close(transfer_seconds(exact, 400.0), 146_800_640.0 / 400e9));
        assert!((transfer_seconds(exact, 400.0) - 0.367e-3).abs() < 0.001e-3);
        assert!((transfer_seconds(exact, 25.0) - 5.872e-3).abs() < 0.001e-3);
    }

    #[test]
    fn train_moves_8bsh_times_t_minus_1_over_t() {
        for t in [2u64, 3, 4, 8] {
            let x = TpTraffic {
                tp: t,
                batch: 4,
                seq: 2048,
                hidden: 4096,
                dtype_bytes: 2,
                mode: TpMode::Train,
                sequence_parallel: false,
            };
            assert_eq!(x.calls_per_block(), 4);
            let bsh = 4.0 * 2048.0 * 4096.0;
            let want = 8.0 * bsh * (t as f64 - 1.0) / t as f64 * 2.0;
            assert!(
                close(x.wire_bytes_per_block(RingFactor::Exact), want),
                "t={t}"
            );
            // Sequence parallel: twice the calls, the same volume.
            let sp = TpTraffic {
                sequence_parallel: true,
                ..x
            };
            assert_eq!(sp.calls_per_block(), 8);
            assert_eq!(
                sp.collectives(),
                vec![(Collective::AllGather, 4), (Collective::ReduceScatter, 4)]
            );
            assert_eq!(sp.bytes_per_call(), x.bytes_per_call());
            assert!(close(sp.wire_bytes_per_block(RingFactor::Exact), want));
        }
    }

    #[test]
    fn prefill_decode_and_tp1() {
        let base = TpTraffic {
            tp: 4,
            batch: 2,
            seq: 128,
            hidden: 512,
            dtype_bytes: 4,
            mode: TpMode::Prefill,
            sequence_parallel: false,
        };
        assert_eq!(base.bytes_per_call(), 2 * 128 * 512 * 4);
        assert_eq!(base.tokens_per_step(), 256);
        assert_eq!(base.calls_per_block(), 2);
        let dec = TpTraffic {
            mode: TpMode::Decode,
            ..base
        };
        assert_eq!(dec.bytes_per_call(), 2 * 512 * 4);
        assert_eq!(dec.tokens_per_step(), 2);
        let one = TpTraffic { tp: 1, ..base };
        assert_eq!(one.calls_per_block(), 0);
        assert_eq!(one.wire_bytes_per_block(RingFactor::Exact), 0.0);
        let link = LinkParams::from_gbps_us(100.0, 5.0);
        assert_eq!(one.comm_seconds_per_block(&"ring".into(), &link), Some(0.0));
    }

    #[test]
    fn comm_time_from_the_alpha_beta_model() {
        // Worked example on a 400 GB/s, 0 us link: 2 ring all-reduces of
        // 0.5 MiB on 8 ranks = 2 x 1.75 x 524288 / 400e9 s per layer.
        let w = TpTraffic::worked_example();
        let link = LinkParams::from_gbps_us(400.0, 0.0);
        let t = w.comm_seconds_per_block(&"ring".into(), &link).unwrap();
        assert!(close(t, 2.0 * 917_504.0 / 400e9), "{t}");
        // With 5 us per step: + 2 x 14 x 5 us.
        let link = LinkParams::from_gbps_us(400.0, 5.0);
        let t = w.comm_seconds_per_block(&"ring".into(), &link).unwrap();
        assert!(close(t, 2.0 * 917_504.0 / 400e9 + 140e-6), "{t}");
        assert_eq!(w.comm_seconds_per_block(&"bogus".into(), &link), None);
        // Sequence parallel with rings: the same time, 2 all-gathers and 2
        // reduce-scatters of 7 steps and 0.875 n each = 2 all-reduces.
        let sp = TpTraffic {
            sequence_parallel: true,
            ..w
        };
        let t = sp.comm_seconds_per_block(&"ring".into(), &link).unwrap();
        assert!(close(t, 2.0 * 917_504.0 / 400e9 + 140e-6), "{t}");
    }
}
