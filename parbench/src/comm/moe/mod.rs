//! Expert parallelism's exchange: a mixture-of-experts layer's dispatch
//! (each token's hidden state to the ranks holding its top-k experts) and
//! combine (the experts' outputs back, summed per token), over
//! [`super::Communicator::all_to_all_v`] on any backend.
//!
//! Everything a rank sends and must receive is a function of the seed and
//! the [`MoeShape`] alone ([`routing`]: which experts each token of each
//! rank chose and kept; [`exchange`]: the bytes), so every rank checks
//! what it received byte for byte without extra communication.
//!
//! What is modelled, after the systems users compare against:
//! - routing: top-k distinct experts per token, uniform or Zipf-skewed
//!   popularity, optionally node-limited as DeepSeek-V3 routes (each
//!   token's experts on at most M groups; a group is one rank's experts);
//! - token dropping: Megatron-Core's capacity factor (per expert and
//!   source rank, capacity `ceil(T x k / E x cf)`; tokens over it are
//!   dropped, the first ones kept);
//! - payload: bf16, or fp8 E4M3 with one f32 scale per 128 channels as
//!   DeepEP's dispatch sends it; combine is bf16;
//! - copies: one per destination rank (DeepEP's normal kernels, the rank
//!   sums its experts' outputs before combine) or one per expert (its
//!   low-latency kernels).
//!
//! Not sent: the routing metadata (expert indices, gate weights) DeepEP
//! sends beside the hidden states; the bytes counted are the payload's.

pub mod exchange;
pub mod routing;

use std::fmt;
use std::str::FromStr;

/// How popular each expert is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Skew {
    /// Every expert equally likely.
    Uniform,
    /// The expert of popularity rank i (a seeded order) drawn with weight
    /// `1 / (i + 1)^s`.
    Zipf(f64),
}

impl FromStr for Skew {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        if t == "uniform" {
            return Ok(Skew::Uniform);
        }
        let bad = || {
            format!("'{s}': expected uniform or zipf:S (S an exponent from 0 to 4, e.g. zipf:1.2)")
        };
        let exp = t.strip_prefix("zipf:").ok_or_else(bad)?;
        match exp.parse::<f64>() {
            Ok(x) if x.is_finite() && (0.0..=4.0).contains(&x) => Ok(Skew::Zipf(x)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skew::Uniform => f.write_str("uniform"),
            Skew::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

/// The dispatched hidden states' type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    Bf16,
    /// E4M3 with one f32 scale per [`FP8_GROUP`] channels (DeepEP's dispatch).
    Fp8,
}

/// Channels sharing one fp8 scale.
pub const FP8_GROUP: usize = 128;

impl Payload {
    pub const ALL: [Payload; 2] = [Payload::Bf16, Payload::Fp8];
    pub fn name(self) -> &'static str {
        match self {
            Payload::Bf16 => "bf16",
            Payload::Fp8 => "fp8",
        }
    }
    /// Bytes of one token's hidden state of `hidden` channels.
    pub fn token_bytes(self, hidden: usize) -> usize {
        match self {
            Payload::Bf16 => 2 * hidden,
            Payload::Fp8 => hidden + 4 * hidden.div_ceil(FP8_GROUP),
        }
    }
}

impl FromStr for Payload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Payload::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("'{s}': expected bf16 or fp8"))
    }
}

/// How many copies of a token a dispatch sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copies {
    /// One per destination rank (DeepEP's normal kernels).
    Dedup,
    /// One per chosen expert (DeepEP's low-latency kernels).
    PerExpert,
}

impl Copies {
    pub const ALL: [Copies; 2] = [Copies::Dedup, Copies::PerExpert];
    pub fn name(self) -> &'static str {
        match self {
            Copies::Dedup => "dedup",
            Copies::PerExpert => "k",
        }
    }
}

impl FromStr for Copies {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Copies::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!("'{s}': expected dedup (one copy per rank) or k (one per expert)")
            })
    }
}

/// One MoE layer's exchange, as every rank sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeShape {
    /// Tokens per rank (T).
    pub tokens: usize,
    /// Hidden size (H, channels).
    pub hidden: usize,
    /// Experts in all (E), E / R on each rank.
    pub experts: usize,
    /// Experts per token (k).
    pub topk: usize,
    pub skew: Skew,
    /// At most this many groups (ranks) per token, DeepSeek-V3's
    /// node-limited routing; `None`: no limit.
    pub node_limit: Option<usize>,
    /// Megatron-Core's capacity factor; `None`: no token dropped.
    pub capacity_factor: Option<f64>,
    pub payload: Payload,
    pub copies: Copies,
    pub seed: u64,
}

/// The largest hidden size, experts and top-k a run takes: bounds that
/// keep every count within memory's reach before anything is allocated.
pub const MAX_HIDDEN: usize = 1 << 16;
pub const MAX_EXPERTS: usize = 1 << 12;
pub const MAX_TOPK: usize = 64;

impl MoeShape {
    /// Why this shape cannot run on `world` ranks, in one line naming the
    /// flag, or `None`.
    pub fn refusal(&self, world: usize) -> Option<String> {
        let (e, k) = (self.experts, self.topk);
        if self.tokens == 0 {
            return Some("--tokens 0: at least 1".into());
        }
        if self.hidden == 0 || self.hidden > MAX_HIDDEN {
            return Some(format!("--hidden {}: 1 to {MAX_HIDDEN}", self.hidden));
        }
        if e == 0 || e > MAX_EXPERTS {
            return Some(format!("--experts {e}: 1 to {MAX_EXPERTS}"));
        }
        if k == 0 || k > e.min(MAX_TOPK) {
            return Some(format!(
                "--topk {k}: 1 to --experts ({e}), at most {MAX_TOPK}"
            ));
        }
        if world == 0 || e % world != 0 {
            return Some(format!(
                "--experts {e} on {world} ranks: the experts must divide evenly over the ranks"
            ));
        }
        if self.payload == Payload::Fp8 && !self.hidden.is_multiple_of(FP8_GROUP) {
            return Some(format!(
                "--payload fp8 with --hidden {}: a multiple of {FP8_GROUP} (one scale per {FP8_GROUP} channels)",
                self.hidden
            ));
        }
        if let Some(m) = self.node_limit {
            let per_rank = e / world;
            if m == 0 || m > world {
                return Some(format!("--node-limit {m}: 1 to the ranks ({world})"));
            }
            if k > m * per_rank {
                return Some(format!(
                    "--node-limit {m} with --topk {k}: {m} rank(s) hold only {} experts",
                    m * per_rank
                ));
            }
        }
        if let Some(cf) = self.capacity_factor {
            if !(cf.is_finite() && (1e-3..=1000.0).contains(&cf)) {
                return Some(format!(
                    "--capacity-factor {}: 0.001 to 1000",
                    crate::units::number_text(cf)
                ));
            }
        }
        None
    }

    /// Experts on each rank.
    pub fn experts_per_rank(&self, world: usize) -> usize {
        self.experts / world.max(1)
    }

    /// The rank holding expert `e`.
    pub fn rank_of(&self, e: usize, world: usize) -> usize {
        e / self.experts_per_rank(world).max(1)
    }

    /// Tokens per expert and source rank that are kept: Megatron-Core's
    /// `ceil(T x k / E x cf)`, or every token without a factor.
    pub fn capacity(&self) -> usize {
        match self.capacity_factor {
            None => usize::MAX,
            Some(cf) => {
                let per_expert = (self.tokens * self.topk) as f64 / self.experts as f64;
                (per_expert * cf).ceil() as usize
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn shape() -> MoeShape {
        MoeShape {
            tokens: 64,
            hidden: 256,
            experts: 8,
            topk: 2,
            skew: Skew::Uniform,
            node_limit: None,
            capacity_factor: None,
            payload: Payload::Bf16,
            copies: Copies::Dedup,
            seed: 1,
        }
    }

    #[test]
    fn values_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!("uniform".parse(), Ok(Skew::Uniform));
        assert_eq!("zipf:1.2".parse(), Ok(Skew::Zipf(1.2)));
        for bad in ["zipf", "zipf:", "zipf:-1", "zipf:nan", "zipf:9", "normal"] {
            let e = bad.parse::<Skew>().unwrap_err();
            assert!(e.contains("uniform or zipf:S"), "{e}");
        }
        assert_eq!("FP8".parse(), Ok(Payload::Fp8));
        assert!("fp16".parse::<Payload>().is_err());
        assert_eq!("k".parse(), Ok(Copies::PerExpert));
        assert!("all".parse::<Copies>().is_err());
        assert_eq!(Payload::Fp8.token_bytes(7168), 7168 + 4 * 56);
    }

    #[test]
    fn shapes_that_cannot_run_are_named() {
        let ok = shape();
        assert_eq!(ok.refusal(4), None);
        let cases = [
            (
                MoeShape {
                    experts: 6,
                    ..ok.clone()
                },
                "divide evenly",
            ),
            (
                MoeShape {
                    topk: 9,
                    ..ok.clone()
                },
                "--topk 9",
            ),
            (
                MoeShape {
                    hidden: 100,
                    payload: Payload::Fp8,
                    ..ok.clone()
                },
                "multiple of 128",
            ),
            (
                MoeShape {
                    node_limit: Some(1),
                    topk: 3,
                    ..ok.clone()
                },
                "hold only 2",
            ),
            (
                MoeShape {
                    node_limit: Some(5),
                    ..ok.clone()
                },
                "--node-limit 5",
            ),
            (
                MoeShape {
                    capacity_factor: Some(0.0),
                    ..ok.clone()
                },
                "--capacity-factor",
            ),
            (
                MoeShape {
                    tokens: 0,
                    ..ok.clone()
                },
                "--tokens 0",
            ),
        ];
        for (s, want) in cases {
            let why = s.refusal(4).unwrap_or_default();
            assert!(why.contains(want), "{why} (wanted {want})");
        }
    }

    #[test]
    fn capacity_is_megatrons() {
        let s = MoeShape {
            capacity_factor: Some(1.0),
            ..shape()
        };
        // 64 tokens x 2 / 8 experts = 16 per expert.
        assert_eq!(s.capacity(), 16);
        let s = MoeShape {
            capacity_factor: Some(1.1),
            ..shape()
        };
        assert_eq!(s.capacity(), 18);
        assert_eq!(shape().capacity(), usize::MAX);
    }
}
