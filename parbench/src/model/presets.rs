//! Named transformer shapes, so that bench-layers, `report model` and the
//! planner speak of the same models. Each preset says where its numbers
//! come from.

use super::moe::{Mla, Moe, MoeAttention};
use super::tensor_parallel::{TpMode, TpTraffic};

/// The block and embedding conventions a family uses, which decide the
/// parameter count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// GPT-2/GPT-3: biases everywhere, two LayerNorms per layer (weight and
    /// bias), a GELU MLP of two matrices, learned positions, the output
    /// head tied to the token embedding.
    Gpt,
    /// LLaMA: no biases, two RMSNorms per layer (weight only), a SwiGLU MLP
    /// of three matrices, grouped-query attention, rotary positions (no
    /// parameters), an untied output head.
    Llama,
}

/// A transformer shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Preset {
    /// The name flags use (`--preset NAME`, `--model NAME`).
    pub name: &'static str,
    /// Where the figures come from.
    pub source: &'static str,
    /// Conventions of the family.
    pub arch: Arch,
    /// Transformer layers.
    pub layers: u64,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Attention (query) heads.
    pub heads: u64,
    /// Key/value heads (equal to `heads` without grouped-query attention).
    pub kv_heads: u64,
    /// MLP inner size.
    pub ffn: u64,
    /// Context length the model was trained with.
    pub seq: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// The expert layers of a mixture of experts (`ffn` is then its
    /// dense layers' MLP); `None`: dense.
    pub moe: Option<Moe>,
}

/// Every preset.
pub const PRESETS: [Preset; 11] = [
    Preset {
        name: "tiny",
        source: "parbench's own test shape (not a published model): small enough for CPU runs and tests",
        arch: Arch::Gpt,
        layers: 2,
        hidden: 512,
        heads: 8,
        kv_heads: 8,
        ffn: 2048,
        seq: 128,
        vocab: 1024,
        moe: None,
    },
    Preset {
        name: "gpt3-1.3b",
        source: "GPT-3 XL, Brown et al. 2020, Table 2.1: 24 layers, d_model 2048, d_head 128, context 2048 (the table's 24 heads do not multiply to 2048 with d_head 128; 16 heads do); vocabulary GPT-2's BPE, 50257",
        arch: Arch::Gpt,
        layers: 24,
        hidden: 2048,
        heads: 16,
        kv_heads: 16,
        ffn: 8192,
        seq: 2048,
        vocab: 50257,
        moe: None,
    },
    Preset {
        name: "llama2-70b",
        source: "Llama 2 70B, Touvron et al. 2023 and its released config (hidden 8192, 64 heads, 8 KV heads, 80 layers, ffn 28672, vocabulary 32000, context 4096): the 80-layer hidden-8192 model of the worked example",
        arch: Arch::Llama,
        layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        ffn: 28672,
        seq: 4096,
        vocab: 32000,
        moe: None,
    },
    Preset {
        name: "llama3-8b",
        source: "Llama 3 8B, Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3, and its released config: 32 layers, hidden 4096, 32 heads, 8 KV heads, FFN 14336, vocabulary 128256, pre-training context 8192",
        arch: Arch::Llama,
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ffn: 14336,
        seq: 8192,
        vocab: 128256,
        moe: None,
    },
    Preset {
        name: "llama3-70b",
        source: "Llama 3 70B, Dubey et al. 2024, Table 3, and its released config: 80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocabulary 128256, context 8192",
        arch: Arch::Llama,
        layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        ffn: 28672,
        seq: 8192,
        vocab: 128256,
        moe: None,
    },
    Preset {
        name: "llama3-405b",
        source: "Llama 3 405B, Dubey et al. 2024, Table 3, and its released config: 126 layers, hidden 16384, 128 heads, 8 KV heads, FFN 53248, vocabulary 128256, context 8192",
        arch: Arch::Llama,
        layers: 126,
        hidden: 16384,
        heads: 128,
        kv_heads: 8,
        ffn: 53248,
        seq: 8192,
        vocab: 128256,
        moe: None,
    },
    Preset {
        name: "gpt3-175b",
        source: "GPT-3 175B, Brown et al. 2020, Table 2.1; also Narayanan et al. SC21, Table 1 (vocabulary: GPT-2's BPE, 50257)",
        arch: Arch::Gpt,
        layers: 96,
        hidden: 12288,
        heads: 96,
        kv_heads: 96,
        ffn: 49152,
        seq: 2048,
        vocab: 50257,
        moe: None,
    },
    Preset {
        name: "mixtral-8x7b",
        source: "Mixtral 8x7B, Jiang et al. 2024 (Mixtral of Experts: 46.7B parameters, 12.9B active) and mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, 8 experts of SwiGLU 14336, top-2, vocabulary 32000, context 32768",
        arch: Arch::Llama,
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ffn: 14336,
        seq: 4096,
        vocab: 32000,
        moe: Some(Moe::new(8, 2, 14336)),
    },
    Preset {
        name: "mixtral-8x22b",
        source: "Mixtral 8x22B, Mistral AI's announcement (141B parameters, 39B active) and mistralai/Mixtral-8x22B-v0.1 config.json: 56 layers, hidden 6144, 48 heads, 8 KV heads, 8 experts of SwiGLU 16384, top-2, vocabulary 32768, context 65536",
        arch: Arch::Llama,
        layers: 56,
        hidden: 6144,
        heads: 48,
        kv_heads: 8,
        ffn: 16384,
        seq: 4096,
        vocab: 32768,
        moe: Some(Moe::new(8, 2, 16384)),
    },
    Preset {
        name: "qwen3-235b-a22b",
        source: "Qwen3-235B-A22B model card (235B parameters, 22B activated) and Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 heads of 128, 4 KV heads, 128 experts of SwiGLU 1536, top-8, no shared experts, vocabulary 151936, untied; context 4096 as Megatron-MoE-ModelZoo's H100 runs train it",
        arch: Arch::Llama,
        layers: 94,
        hidden: 4096,
        heads: 64,
        kv_heads: 4,
        ffn: 12288,
        seq: 4096,
        vocab: 151936,
        moe: Some(Moe {
            attention: MoeAttention::Gqa { head_dim: 128 },
            ..Moe::new(128, 8, 1536)
        }),
    },
    Preset {
        name: "deepseek-v3",
        source: "DeepSeek-V3 Technical Report, DeepSeek-AI 2024 (671B parameters, 37B activated; node-limited routing to M = 4 nodes) and deepseek-ai/DeepSeek-V3 config.json: 61 layers (the first 3 dense, MLP 18432), hidden 7168, 128 heads of MLA (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128), 256 routed experts of SwiGLU 2048 and 1 shared, top-8, vocabulary 129280, untied; context 4096 as pre-trained; the MTP module is not counted",
        arch: Arch::Llama,
        layers: 61,
        hidden: 7168,
        heads: 128,
        kv_heads: 128,
        ffn: 18432,
        seq: 4096,
        vocab: 129280,
        moe: Some(Moe {
            shared_experts: 1,
            dense_layers: 3,
            node_limit: 4,
            attention: MoeAttention::Mla(Mla {
                q_lora_rank: 1536,
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
            }),
            ..Moe::new(256, 8, 2048)
        }),
    },
];

impl Preset {
    /// The preset of the tensor-parallel worked example (80 layers, hidden 8192).
    pub const WORKED_EXAMPLE: &'static str = "llama2-70b";

    /// Every preset.
    pub fn all() -> &'static [Preset] {
        &PRESETS
    }

    /// The names, for help texts and error messages.
    pub fn names() -> Vec<&'static str> {
        PRESETS.iter().map(|p| p.name).collect()
    }

    /// The preset called `name` (case-insensitive).
    pub fn by_name(name: &str) -> Option<Preset> {
        PRESETS
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .copied()
    }

    /// Dimension of one attention head, `h / heads`.
    pub fn head_dim(&self) -> u64 {
        match self.moe.map(|m| m.attention) {
            Some(MoeAttention::Gqa { head_dim }) if head_dim > 0 => head_dim,
            _ => self.hidden.checked_div(self.heads).unwrap_or(0),
        }
    }

    /// Parameters of one transformer layer (attention, MLP, norms).
    /// Saturates at `u64::MAX` for absurd custom shapes rather than overflowing.
    pub fn params_per_layer(&self) -> u64 {
        // An MoE model's layers differ: their mean.
        if let Some((all, _)) = self.moe_params() {
            return all.saturating_sub(self.embedding_params()) / self.layers.max(1);
        }
        let h = u128::from(self.hidden);
        let ffn = u128::from(self.ffn);
        let kv = mul(&[u128::from(self.kv_heads), u128::from(self.head_dim())]);
        let n = match self.arch {
            // QKV (3h^2 + 3h) + output (h^2 + h) + MLP (2 h ffn + ffn + h)
            // + two LayerNorms (4h): 12h^2 + 13h when ffn = 4h.
            Arch::Gpt => add(&[
                mul(&[h, add(&[h, kv, kv])]),
                h,
                mul(&[2, kv]),
                mul(&[h, h]),
                h,
                mul(&[2, h, ffn]),
                ffn,
                h,
                mul(&[4, h]),
            ]),
            // Q and O (2h^2), K and V (2 h kv), SwiGLU (3 h ffn), two RMSNorms (2h).
            Arch::Llama => add(&[
                mul(&[2, h, h]),
                mul(&[2, h, kv]),
                mul(&[3, h, ffn]),
                mul(&[2, h]),
            ]),
        };
        saturate(n)
    }

    /// Parameters outside the layers: embeddings, learned positions, the
    /// final norm and (untied) the output head.
    pub fn embedding_params(&self) -> u64 {
        let (h, v, s) = (
            u128::from(self.hidden),
            u128::from(self.vocab),
            u128::from(self.seq),
        );
        saturate(match self.arch {
            Arch::Gpt => add(&[mul(&[v, h]), mul(&[s, h]), mul(&[2, h])]),
            Arch::Llama => add(&[mul(&[2, v, h]), h]),
        })
    }

    /// All parameters: GPT-3 175B gives 174.6e9, Llama 2 70B 68.98e9.
    pub fn params(&self) -> u64 {
        if let Some((all, _)) = self.moe_params() {
            return all;
        }
        saturate(add(&[
            mul(&[u128::from(self.layers), u128::from(self.params_per_layer())]),
            u128::from(self.embedding_params()),
        ]))
    }

    /// Whether the model splits `tp` ways by tensor and `pp` ways by pipeline
    /// with `chunks` model chunks per pipeline rank, as Megatron-LM requires:
    /// attention heads, key/value heads and the MLP's inner size divisible by
    /// `tp`; layers divisible by `pp x chunks`. The first rule broken is the
    /// error, which names the numbers.
    pub fn check_split(&self, tp: u64, pp: u64, chunks: u64) -> Result<(), SplitError> {
        let zero = [
            ("tensor-parallel degree", tp),
            ("pipeline stages", pp),
            ("chunks", chunks),
        ];
        if let Some((what, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Err(SplitError::Zero { what });
        }
        let rules = [
            ("attention heads", self.heads, tp, "tensor-parallel degree"),
            (
                "key/value heads",
                self.kv_heads,
                tp,
                "tensor-parallel degree",
            ),
            ("MLP inner size", self.ffn, tp, "tensor-parallel degree"),
            (
                "layers",
                self.layers,
                pp.saturating_mul(chunks),
                "pipeline stages x chunks",
            ),
        ];
        for (what, have, by, by_what) in rules {
            if have % by != 0 {
                return Err(SplitError::NotDivisible {
                    what,
                    have,
                    by,
                    by_what,
                });
            }
        }
        Ok(())
    }

    /// The tensor-parallel traffic of one of this model's layers at degree
    /// `tp` with microbatch `batch`, its own context length as the sequence,
    /// `dtype_bytes` per activation element.
    pub fn tp_traffic(
        &self,
        tp: u64,
        batch: u64,
        dtype_bytes: u64,
        mode: TpMode,
        sequence_parallel: bool,
    ) -> TpTraffic {
        TpTraffic::new(
            tp,
            batch,
            self.seq,
            self.hidden,
            dtype_bytes,
            mode,
            sequence_parallel,
        )
    }
}

/// Why a model cannot be split as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// A degree of 0.
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    /// A dimension that the degree does not divide.
    #[error("{what} ({have}) is not divisible by the {by_what} ({by})")]
    NotDivisible {
        what: &'static str,
        have: u64,
        by: u64,
        by_what: &'static str,
    },
}

// Saturating arithmetic: a custom shape from flags must never overflow
// into a panic; an absurd one reads as u64::MAX parameters.
fn saturate(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn mul(xs: &[u128]) -> u128 {
    xs.iter().fold(1u128, |a, &x| a.saturating_mul(x))
}

fn add(xs: &[u128]) -> u128 {
    xs.iter().fold(0u128, |a, &x| a.saturating_add(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tensor_parallel::{RingFactor, WORKED_EXAMPLE_LAYERS};

    #[test]
    fn lookup_and_names() {
        assert_eq!(
            Preset::names(),
            [
                "tiny",
                "gpt3-1.3b",
                "llama2-70b",
                "llama3-8b",
                "llama3-70b",
                "llama3-405b",
                "gpt3-175b",
                "mixtral-8x7b",
                "mixtral-8x22b",
                "qwen3-235b-a22b",
                "deepseek-v3"
            ]
        );
        assert_eq!(Preset::by_name("GPT3-175B").unwrap().layers, 96);
        assert!(Preset::by_name("gpt5").is_none());
        for p in Preset::all() {
            assert_eq!(p.qkv_widths().0 % p.heads, 0, "{}", p.name);
            assert_eq!(p.heads % p.kv_heads, 0, "{}", p.name);
        }
    }

    #[test]
    fn published_shapes() {
        let g = Preset::by_name("gpt3-175b").unwrap();
        assert_eq!(
            (g.layers, g.hidden, g.heads, g.head_dim(), g.ffn),
            (96, 12288, 96, 128, 49152)
        );
        let x = Preset::by_name("gpt3-1.3b").unwrap();
        assert_eq!(
            (x.layers, x.hidden, x.heads, x.head_dim()),
            (24, 2048, 16, 128)
        );
        let l = Preset::by_name(Preset::WORKED_EXAMPLE).unwrap();
        assert_eq!(
            (l.layers, l.hidden, l.heads, l.kv_heads, l.ffn),
            (80, 8192, 64, 8, 28672)
        );
        assert_eq!(l.layers, WORKED_EXAMPLE_LAYERS);
    }

    #[test]
    fn parameter_counts() {
        // GPT-3: 12 l h^2 + 13 l h + (V + s) h + 2h (Narayanan et al. SC21's
        // formula plus the final LayerNorm): 174.6e9, the "175B".
        let g = Preset::by_name("gpt3-175b").unwrap();
        let h = 12288u64;
        assert_eq!(g.params_per_layer(), 12 * h * h + 13 * h);
        assert_eq!(g.params(), 174_604_259_328);
        let published = [
            // GPT-3 XL: 1.316e9, the "1.3B".
            ("gpt3-1.3b", 1_315_723_264),
            // Llama 2 70B: its released checkpoint.
            ("llama2-70b", 68_976_648_192),
            // Llama 3: a SwiGLU MLP of three matrices and grouped-query
            // attention; 405B counts as 405.85e9 with its untied output layer.
            ("llama3-405b", 405_853_388_800),
            ("llama3-8b", 8_030_261_248),
            ("llama3-70b", 70_553_706_496),
        ];
        for (name, params) in published {
            assert_eq!(Preset::by_name(name).unwrap().params(), params, "{name}");
        }
        // tiny: 2 x (12 x 512^2 + 13 x 512) + (1024 + 128) x 512 + 1024.
        let t = Preset::by_name("tiny").unwrap();
        assert_eq!(
            t.params(),
            2 * (12 * 512 * 512 + 13 * 512) + 1152 * 512 + 1024
        );
    }

    #[test]
    fn splits_follow_megatron_rules() {
        let l = Preset::by_name("llama2-70b").unwrap();
        assert_eq!(l.check_split(8, 4, 1), Ok(()));
        assert_eq!(l.check_split(8, 8, 2), Ok(()));
        // 16-way TP cannot split 8 KV heads.
        assert_eq!(
            l.check_split(16, 1, 1),
            Err(SplitError::NotDivisible {
                what: "key/value heads",
                have: 8,
                by: 16,
                by_what: "tensor-parallel degree"
            })
        );
        // 80 layers over 3 stages.
        let e = l.check_split(8, 3, 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "layers (80) is not divisible by the pipeline stages x chunks (3)"
        );
        let g = Preset::by_name("gpt3-175b").unwrap();
        assert!(g.check_split(8, 16, 1).is_ok());
        assert!(matches!(
            g.check_split(5, 1, 1),
            Err(SplitError::NotDivisible {
                what: "attention heads",
                ..
            })
        ));
        assert_eq!(
            g.check_split(0, 1, 1),
            Err(SplitError::Zero {
                what: "tensor-parallel degree"
            })
        );
    }

    #[test]
    fn worked_example_from_the_preset() {
        let l = Preset::by_name(Preset::WORKED_EXAMPLE).unwrap();
        let mut w = l.tp_traffic(8, 32, 2, TpMode::Decode, false);
        assert_eq!(w.bytes_per_call(), 524_288);
        assert_eq!(w.calls_per_step(l.layers), 160);
        w.seq = 1;
        assert_eq!(w, TpTraffic::worked_example());
        assert_eq!(
            w.wire_bytes_per_step(l.layers, RingFactor::Limit),
            160.0 * 1024.0 * 1024.0
        );
    }
}
