//! Context parallelism as the planner costs it: the sequence of each
//! microbatch split over `cp` ranks (Megatron-Core's
//! `--context-parallel-size`), each rank holding `s / cp` tokens of every
//! activation, and the keys and values exchanged so that every query
//! still attends to every earlier token. Three ways to exchange them,
//! Megatron-Core's `--cp-comm-type`:
//!
//! - **p2p** (Megatron-Core's default, Transformer Engine's
//!   `AttnFuncWithCPAndKVP2P`): a ring; in `cp` steps each rank computes
//!   its queries against one chunk of K and V while it sends that chunk to
//!   the next rank and receives the next one from the previous (`cp - 1`
//!   exchanges, each hidden behind a step's attention where the step is
//!   longer). The backward passes K and V again with their gradients dK
//!   and dV ("point-to-point communications of KV and dKV"), and the last
//!   dK, dV return to their owner after the last step.
//! - **all_gather** (`AttnFuncWithCPAndKVAllGather`): K and V all-gathered
//!   over the group before the attention, dK and dV reduce-scattered after
//!   its backward; nothing hidden.
//! - **a2a** (DeepSpeed-Ulysses, Jacobs et al. 2023): two all-to-alls swap
//!   the split from the sequence to the heads and back: Q, K and V before
//!   the attention and its output after it; backward the output's gradient
//!   before and dQ, dK, dV after. Needs the heads of a tensor rank to
//!   divide by `cp`.
//!
//! Causal masks are balanced as Megatron-Core does it: the sequence in
//! `2 cp` chunks, rank `r` holding chunks `r` and `2 cp - 1 - r`, so that
//! every rank computes `1 / cp` of the masked attention and every ring
//! step half a block of `(s / cp)^2` scores (the diagonal step half of its
//! own two chunks, every other step either half of the queries or half of
//! the keys). Without balancing the last rank would compute `2 cp - 1`
//! times the first's.

use crate::comm::Collective;
use crate::model::footprint::Recompute;
use crate::model::opcost::{BlockSeconds, OpModel};
use crate::model::presets::Preset;

/// How K and V reach the ranks that need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpComm {
    /// Ring of point-to-point exchanges overlapped with the attention.
    P2p,
    /// All-gather of K and V, reduce-scatter of their gradients.
    AllGather,
    /// DeepSpeed-Ulysses' all-to-alls.
    A2a,
}

impl CpComm {
    /// Every method with the name `--cp-comm-type` takes (Megatron-Core's).
    pub const ALL: [(&'static str, CpComm); 3] = [
        ("p2p", CpComm::P2p),
        ("all_gather", CpComm::AllGather),
        ("a2a", CpComm::A2a),
    ];

    pub fn by_name(name: &str) -> Option<CpComm> {
        Self::ALL
            .iter()
            .find(|(n, _)| {
                n.eq_ignore_ascii_case(name) || (name == "allgather" && *n == "all_gather")
            })
            .map(|&(_, c)| c)
    }

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, c)| *c == self)
            .map_or("p2p", |(n, _)| n)
    }
}

impl std::fmt::Display for CpComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CpComm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CpComm::by_name(s).ok_or_else(|| {
            let names: Vec<&str> = CpComm::ALL.iter().map(|(n, _)| *n).collect();
            format!("unknown method '{s}' (expected {})", names.join(", "))
        })
    }
}

/// Why `cp` ranks cannot split the sequence of a model with `heads`
/// query heads over `tp` tensor ranks: Megatron-Core's rule that the
/// sequence divides into `2 cp` balanced chunks, and for the all-to-all
/// that a tensor rank's heads divide over `cp`.
pub fn check(seq: u64, heads: u64, tp: u64, cp: u64, comm: CpComm) -> Result<(), String> {
    if cp <= 1 {
        return Ok(());
    }
    if !seq.is_multiple_of(2 * cp) {
        return Err(format!(
            "sequence {seq} does not split into 2 x cp = {} balanced chunks",
            2 * cp
        ));
    }
    let local_heads = heads / tp.max(1);
    if comm == CpComm::A2a && !local_heads.is_multiple_of(cp) {
        return Err(format!(
            "the all-to-all (Ulysses) splits a tensor rank's {local_heads} heads over cp={cp}: not a whole number each"
        ));
    }
    Ok(())
}

/// One block on one rank of `cp` (tensor rank of `t`), microbatch of `b`
/// sequences of `model`'s `s` tokens: every GEMM and memory-bound pass at the
/// rank's `s / cp` tokens, and the balanced causal attention at `1 / cp`
/// of the whole sequence's, which is `cp` times the attention of an
/// `s / cp`-token sequence. Returns the block and its attention core
/// (forward, backward) on the rank.
pub fn block(
    ops: &OpModel,
    model: &Preset,
    b: u64,
    t: u64,
    cp: u64,
    sequence_parallel: bool,
    recompute: Recompute,
) -> (BlockSeconds, (f64, f64)) {
    let cp = cp.max(1);
    let local = model.seq / cp;
    let mut blk = ops.block(model, b, local, t, sequence_parallel, recompute);
    let (af, ab, selective) = ops.attention_core(model, b, local, t);
    let k = (cp - 1) as f64;
    let again = match recompute {
        Recompute::None => 0.0,
        Recompute::Selective => selective,
        Recompute::Full => af,
    };
    blk.forward += k * af;
    blk.input_grad += k * ab;
    blk.recompute += k * again;
    blk.attention += k * (af + ab + again);
    (blk, (cp as f64 * af, cp as f64 * ab))
}

/// One layer's tensors on one rank of a context-parallel group, one
/// microbatch, bytes: its chunk of K and V together, and of Q (the
/// attention's output is Q's size).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpTensors {
    pub kv_bytes: f64,
    pub q_bytes: f64,
}

impl CpTensors {
    /// `b` sequences of `model`'s length split over `cp`, its heads over
    /// `tp` tensor ranks (a rank keeps at least one key/value head:
    /// Megatron replicates them when `tp` exceeds their count).
    pub fn of(model: &Preset, b: u64, cp: u64, tp: u64, dtype_bytes: u64) -> Self {
        let tokens = b as f64 * model.seq as f64 / cp.max(1) as f64;
        let t = tp.max(1);
        let q_heads = (model.heads / t).max(1) as f64;
        let kv = (model.kv_heads / t).max(1) as f64;
        let d = model.head_dim() as f64 * dtype_bytes as f64;
        CpTensors {
            kv_bytes: 2.0 * tokens * kv * d,
            q_bytes: tokens * q_heads * d,
        }
    }
}

/// One layer's exchange on one microbatch, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpExchange {
    /// What the forward and the backward wait for.
    pub exposed_f: f64,
    pub exposed_b: f64,
    /// What runs beside the attention, forward and backward (and takes
    /// SMs from it).
    pub hidden_f: f64,
    pub hidden_b: f64,
}

/// The exchange of `method` over `cp` ranks for one layer: `attention`
/// the layer's attention seconds on the rank (forward, backward),
/// `message` the seconds of one point-to-point message of so many bytes
/// to the ring's next rank, `collective` the seconds of a collective over
/// the group (nccl-tests' size convention).
pub fn exchange(
    method: CpComm,
    cp: u64,
    t: CpTensors,
    attention: (f64, f64),
    message: impl Fn(f64) -> f64,
    collective: impl Fn(Collective, f64) -> f64,
) -> CpExchange {
    if cp <= 1 {
        return CpExchange::default();
    }
    let c = cp as f64;
    match method {
        CpComm::P2p => {
            // Every step computes an equal share of the attention; each of
            // the cp - 1 exchanges runs beside one step.
            let (step_f, step_b) = (attention.0 / c, attention.1 / c);
            let kv = message(t.kv_bytes);
            let kv_dkv = message(2.0 * t.kv_bytes);
            let exposed_f = (c - 1.0) * (kv - step_f).max(0.0);
            // The last dK, dV go home after the last step: nothing beside them.
            let last = message(t.kv_bytes);
            let exposed_b = (c - 1.0) * (kv_dkv - step_b).max(0.0) + last;
            CpExchange {
                exposed_f,
                exposed_b,
                hidden_f: (c - 1.0) * kv.min(step_f),
                hidden_b: (c - 1.0) * kv_dkv.min(step_b),
            }
        }
        CpComm::AllGather => CpExchange {
            exposed_f: collective(Collective::AllGather, t.kv_bytes * c),
            exposed_b: collective(Collective::ReduceScatter, t.kv_bytes * c),
            ..CpExchange::default()
        },
        CpComm::A2a => {
            let qkv = collective(Collective::AllToAll, t.q_bytes + t.kv_bytes);
            let o = collective(Collective::AllToAll, t.q_bytes);
            CpExchange {
                exposed_f: qkv + o,
                exposed_b: o + qkv,
                ..CpExchange::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors() -> CpTensors {
        // Llama 3 405B at 128K over cp 16, tp 8: one KV head a rank.
        let mut m = Preset::by_name("llama3-405b").unwrap();
        m.seq = 131072;
        CpTensors::of(&m, 1, 16, 8, 2)
    }

    #[test]
    fn tensors_are_a_ranks_chunk() {
        let t = tensors();
        // 8192 tokens x 2 (K, V) x 1 head x 128 x 2 bytes.
        assert_eq!(t.kv_bytes, 8192.0 * 2.0 * 128.0 * 2.0);
        assert_eq!(t.q_bytes, 8192.0 * 16.0 * 128.0 * 2.0);
    }

    /// A ring hides each exchange behind a step that outlasts it, and
    /// exposes what a step cannot cover; the last dKV hop is always paid.
    #[test]
    fn the_ring_hides_behind_the_attention_steps() {
        let t = tensors();
        let gbps = 50e9;
        let msg = |b: f64| 5e-6 + b / gbps;
        let none = |_: Collective, _: f64| unreachable!();
        let long = exchange(CpComm::P2p, 16, t, (1.0, 2.5), msg, none);
        assert_eq!(long.exposed_f, 0.0);
        assert!((long.exposed_b - msg(t.kv_bytes)).abs() < 1e-15);
        let short = exchange(CpComm::P2p, 16, t, (0.0, 0.0), msg, none);
        assert!((short.exposed_f - 15.0 * msg(t.kv_bytes)).abs() < 1e-12);
        assert_eq!(short.hidden_f + short.hidden_b, 0.0);
        let one = exchange(CpComm::P2p, 1, t, (0.0, 0.0), msg, none);
        assert_eq!(one, CpExchange::default());
    }

    #[test]
    fn gathers_and_all_to_alls_are_exposed() {
        let t = tensors();
        let coll = |c: Collective, b: f64| match c {
            Collective::AllGather | Collective::ReduceScatter => b,
            Collective::AllToAll => 10.0 * b,
            _ => f64::NAN,
        };
        let g = exchange(CpComm::AllGather, 4, t, (1.0, 1.0), |_| 0.0, coll);
        assert_eq!(
            (g.exposed_f, g.exposed_b),
            (4.0 * t.kv_bytes, 4.0 * t.kv_bytes)
        );
        let a = exchange(CpComm::A2a, 4, t, (1.0, 1.0), |_| 0.0, coll);
        assert_eq!(a.exposed_f, 10.0 * (2.0 * t.q_bytes + t.kv_bytes));
        assert_eq!(a.exposed_f, a.exposed_b);
    }

    #[test]
    fn splits_follow_megatrons_rules() {
        assert!(check(131072, 128, 8, 16, CpComm::P2p).is_ok());
        assert!(check(8192, 32, 1, 1, CpComm::P2p).is_ok());
        assert!(check(100, 32, 1, 8, CpComm::P2p)
            .unwrap_err()
            .contains("balanced"));
        // 16 heads a rank over cp 16: fine; over 32: not whole.
        assert!(check(131072, 128, 8, 16, CpComm::A2a).is_ok());
        assert!(check(131072, 128, 8, 32, CpComm::A2a)
            .unwrap_err()
            .contains("heads"));
        for (n, c) in CpComm::ALL {
            assert_eq!(CpComm::by_name(n), Some(c));
            assert_eq!(c.name(), n);
        }
        assert_eq!(CpComm::by_name("allgather"), Some(CpComm::AllGather));
        assert_eq!(CpComm::by_name("ring"), None);
    }
}
