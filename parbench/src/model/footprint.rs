//! FLOPs and memory of a transformer step: what a planner needs beside the
//! traffic ([`super::tensor_parallel`]) and the bubble ([`super::bubble`]).
//!
//! - FLOPs: every matrix multiply counts `2 m n k`. Per layer forward,
//!   `2 b s W + 4 b s^2 h`, with `W` the layer's matrix weights (`12 h^2`
//!   for a GPT block with a `4h` MLP) and `4 b s^2 h` the attention scores
//!   and their weighted sum (no saving for the causal mask); the logits add
//!   `2 b s V h`. A training step runs the layers 3 times (forward, and a
//!   backward of twice the forward), 4 with full activation recomputation,
//!   and the logits 3 times. For GPT this is Narayanan et al. SC21's
//!   `72 B s l h^2 (1 + s/(6h) + V/(12 l h))`, or with recomputation
//!   `96 B s l h^2 (1 + s/(6h) + V/(16 l h))` (their appendix).
//! - Activation memory per layer: Korthikanti et al. 2022, Table 2, for a
//!   GPT block with 16-bit activations, `a` heads, tensor-parallel degree `t`.
//! - Weights, gradients and Adam state in mixed precision: 16 bytes per
//!   parameter (Rajbhandari et al., ZeRO, SC20: `2 + 2 + 12`).

use super::presets::{Arch, Preset};

/// Bytes per parameter for fp16/bf16 weights and gradients and fp32 Adam
/// state (master weights, momentum, variance): `2 + 2 + 12 = 16`
/// (Rajbhandari et al., ZeRO, SC20, section 3.1).
pub const MIXED_PRECISION_ADAM_BYTES_PER_PARAM: u64 = 16;

/// What a training step keeps of each layer's activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    /// Everything the backward pass needs is stored.
    None,
    /// Korthikanti et al.'s selective recomputation: the attention's
    /// `s x s` parts are recomputed, the rest stored.
    Selective,
    /// Only each layer's input is stored; the layer is recomputed.
    Full,
}

impl Preset {
    /// Weights in one layer's matrices (no biases or norms): QKV and output
    /// projections, and the MLP's two (GELU) or three (SwiGLU) matrices.
    /// `12 h^2` for a GPT block with a `4h` MLP.
    pub fn matmul_params_per_layer(&self) -> u64 {
        // An MoE layer's: what a token activates, the layers' mean.
        if let Some((_, active)) = self.moe_params() {
            return active.saturating_sub(self.embedding_params()) / self.layers.max(1);
        }
        let h = self.hidden;
        let kv = self.kv_heads.saturating_mul(self.head_dim());
        let attn = h
            .saturating_mul(h.saturating_add(kv.saturating_mul(2)))
            .saturating_add(h.saturating_mul(h));
        let mlp_mats = match self.arch {
            Arch::Gpt => 2,
            Arch::Llama => 3,
        };
        attn.saturating_add(h.saturating_mul(self.ffn).saturating_mul(mlp_mats))
    }

    /// Forward FLOPs of one layer for `batch` sequences of `seq` tokens:
    /// `2 b s W + 4 b s^2 h`.
    pub fn forward_flops_per_layer(&self, batch: u64, seq: u64) -> f64 {
        let (b, s, w) = (batch as f64, seq as f64, self.attention_core_width() as f64);
        2.0 * b * s * self.matmul_params_per_layer() as f64 + 4.0 * b * s * s * w
    }

    /// Forward FLOPs of the output logits: `2 b s V h`.
    pub fn logit_flops(&self, batch: u64, seq: u64) -> f64 {
        2.0 * batch as f64 * seq as f64 * self.vocab as f64 * self.hidden as f64
    }

    /// Forward FLOPs of the whole model (inference prefill).
    pub fn forward_flops(&self, batch: u64, seq: u64) -> f64 {
        self.layers as f64 * self.forward_flops_per_layer(batch, seq) + self.logit_flops(batch, seq)
    }

    /// FLOPs of one training step over `batch` sequences of `seq` tokens:
    /// layers 3x forward (4x with full recomputation), logits 3x.
    /// An MoE model's are Megatron-LM's count ([`Preset::moe_train_flops`]).
    pub fn train_flops(&self, batch: u64, seq: u64, full_recompute: bool) -> f64 {
        if let Some(f) = self.moe_train_flops(batch, seq, full_recompute) {
            return f;
        }
        let passes = if full_recompute { 4.0 } else { 3.0 };
        passes * self.layers as f64 * self.forward_flops_per_layer(batch, seq)
            + 3.0 * self.logit_flops(batch, seq)
    }
}

/// Activation bytes one transformer layer keeps for the backward pass
/// (Korthikanti et al. 2022, Table 2; 16-bit activations, a GPT block):
///
/// | | no SP | SP |
/// |---|---|---|
/// | none | `sbh (10 + 24/t + 5as/(ht))` | `sbh (34/t + 5as/(ht))` |
/// | selective | `sbh (10 + 24/t)` | `sbh (34/t)` |
/// | full | `2 sbh` | `2 sbh` |
///
/// At `t = 1` the first row is the unparallelised `sbh (34 + 5as/h)`.
/// `None` for `tp = 0`.
pub fn activation_bytes_per_layer(
    seq: u64,
    batch: u64,
    hidden: u64,
    heads: u64,
    tp: u64,
    sequence_parallel: bool,
    recompute: Recompute,
) -> Option<f64> {
    if tp == 0 || hidden == 0 {
        return None;
    }
    let (s, b, h, a, t) = (
        seq as f64,
        batch as f64,
        hidden as f64,
        heads as f64,
        tp as f64,
    );
    let sbh = s * b * h;
    let attention = 5.0 * a * s / (h * t);
    let rest = if sequence_parallel {
        34.0 / t
    } else {
        10.0 + 24.0 / t
    };
    Some(match recompute {
        Recompute::None => sbh * (rest + attention),
        Recompute::Selective => sbh * rest,
        Recompute::Full => 2.0 * sbh,
    })
}

/// Activation bytes one layer of `m` keeps for the backward pass, by
/// what each tensor of the block is (Korthikanti et al. 2022, section 4.1,
/// generalised; 16-bit activations, 1-byte dropout masks), per `s b h`:
///
/// - split over `t` with or without sequence parallelism: Q (2), K and V
///   (`4 kv/h`: grouped-query attention keeps fewer), the output
///   projection's input (2); the MLP's inner tensors: GELU's input and
///   output (`4 ffn/h`), or SwiGLU's gate and up (`4 ffn/h`) and their
///   product (`2 ffn/h`);
/// - split over `t` only under sequence parallelism: the two norms' inputs
///   (4), the QKV and first MLP projections' inputs (2 each), and GPT's
///   two dropout masks (1 each);
/// - without FlashAttention and without selective recomputation, the
///   scores, softmax and its dropout: `5 a s / (h t)`.
///
/// A GPT block with a `4h` MLP gives Korthikanti's Table 2 (`34` with
/// sequence parallelism, `10 + 24/t` without); full recomputation keeps
/// the layer's input, `2 s b h`.
pub fn activation_bytes_of(
    m: &Preset,
    seq: u64,
    batch: u64,
    tp: u64,
    sequence_parallel: bool,
    recompute: Recompute,
    flash: bool,
) -> Option<f64> {
    if tp == 0 || m.hidden == 0 {
        return None;
    }
    let (s, b, h, a, t) = (
        seq as f64,
        batch as f64,
        m.hidden as f64,
        m.heads as f64,
        tp as f64,
    );
    let sbh = s * b * h;
    if recompute == Recompute::Full {
        return Some(2.0 * sbh);
    }
    let kv = (m.kv_heads.saturating_mul(m.head_dim())) as f64 / h;
    let f = m.ffn as f64 / h;
    let (mlp_inner, masks) = match m.arch {
        Arch::Gpt => (4.0 * f, 2.0),
        Arch::Llama => (6.0 * f, 0.0),
    };
    let split = 2.0 + 4.0 * kv + 2.0 + mlp_inner;
    let unsplit = 4.0 + 2.0 + 2.0 + masks;
    let per_sbh = if sequence_parallel {
        (split + unsplit) / t
    } else {
        unsplit + split / t
    };
    let scores = if flash || recompute == Recompute::Selective {
        0.0
    } else {
        5.0 * a * s / (h * t)
    };
    Some(sbh * (per_sbh + scores))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    #[test]
    fn gpt_matrices_are_12_h_squared() {
        let g = Preset::by_name("gpt3-175b").unwrap();
        assert_eq!(g.matmul_params_per_layer(), 12 * 12288 * 12288);
        // Llama 2 70B: 2h^2 + 2 h (8 x 128) + 3 h ffn.
        let l = Preset::by_name("llama2-70b").unwrap();
        let h = 8192u64;
        assert_eq!(
            l.matmul_params_per_layer(),
            2 * h * h + 2 * h * 1024 + 3 * h * 28672
        );
    }

    #[test]
    fn train_flops_match_narayanan_sc21() {
        // 72 B s l h^2 (1 + s/(6h) + V/(12 l h)); with recomputation
        // 96 B s l h^2 (1 + s/(6h) + V/(16 l h)). GPT-3 175B, B = 1536.
        let g = Preset::by_name("gpt3-175b").unwrap();
        let (bb, s, l, h, v) = (1536.0, 2048.0, 96.0, 12288.0, 50257.0);
        let plain = 72.0 * bb * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let recomp = 96.0 * bb * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
        assert!(close(g.train_flops(1536, 2048, false), plain));
        assert!(close(g.train_flops(1536, 2048, true), recomp));
        // Close to the 6 N per token rule: within 10% here (attention and
        // logits make up the difference).
        let six_n = 6.0 * g.params() as f64 * 1536.0 * 2048.0;
        let r = g.train_flops(1536, 2048, false) / six_n;
        assert!(r > 1.0 && r < 1.1, "{r}");
    }

    #[test]
    fn forward_flops_hand_computed() {
        // tiny: W = 12 x 512^2; per layer, b = 1, s = 128:
        // 2 x 128 x 3,145,728 + 4 x 128^2 x 512.
        let t = Preset::by_name("tiny").unwrap();
        let per_layer = 2.0 * 128.0 * 3_145_728.0 + 4.0 * 16384.0 * 512.0;
        assert!(close(t.forward_flops_per_layer(1, 128), per_layer));
        let logits = 2.0 * 128.0 * 1024.0 * 512.0;
        assert!(close(t.forward_flops(1, 128), 2.0 * per_layer + logits));
    }

    #[test]
    fn activation_memory_korthikanti_table_2() {
        let (s, b, h, a) = (2048u64, 1u64, 12288u64, 96u64);
        let sbh = (s * b * h) as f64;
        let att = 5.0 * 96.0 * 2048.0 / 12288.0; // 5as/h = 80
                                                 // No parallelism: sbh (34 + 5as/h), with or without "SP" at t = 1.
        for sp in [false, true] {
            let m = activation_bytes_per_layer(s, b, h, a, 1, sp, Recompute::None).unwrap();
            assert!(close(m, sbh * (34.0 + att)));
        }
        // t = 8: sbh (10 + 3 + 10) without SP; sbh (4.25 + 10) with SP.
        let tp = activation_bytes_per_layer(s, b, h, a, 8, false, Recompute::None).unwrap();
        assert!(close(tp, sbh * (10.0 + 3.0 + att / 8.0)));
        let sp = activation_bytes_per_layer(s, b, h, a, 8, true, Recompute::None).unwrap();
        assert!(close(sp, sbh * (34.0 / 8.0 + att / 8.0)));
        let sel = activation_bytes_per_layer(s, b, h, a, 8, true, Recompute::Selective).unwrap();
        assert!(close(sel, sbh * 34.0 / 8.0));
        let full = activation_bytes_per_layer(s, b, h, a, 8, true, Recompute::Full).unwrap();
        assert!(close(full, 2.0 * sbh));
        assert_eq!(
            activation_bytes_per_layer(s, b, h, a, 0, true, Recompute::None),
            None
        );
    }

    /// The generalised count is Table 2 for a GPT block with a 4h MLP, and
    /// Llama 3 405B's block (SwiGLU, 8 of 128 heads for K and V, no
    /// dropout) keeps 31.75 s b h over t with sequence parallelism.
    #[test]
    fn activations_by_tensor_meet_table_2() {
        let g = Preset::by_name("gpt3-175b").unwrap();
        for (t, sp) in [(1, false), (8, false), (8, true)] {
            for r in [Recompute::None, Recompute::Selective, Recompute::Full] {
                let table = activation_bytes_per_layer(2048, 1, g.hidden, g.heads, t, sp, r);
                let ours = activation_bytes_of(&g, 2048, 1, t, sp, r, false);
                let (a, b) = (table.unwrap(), ours.unwrap());
                assert!(close(a, b), "t {t} sp {sp} {r:?}: {a} {b}");
            }
        }
        let l = Preset::by_name("llama3-405b").unwrap();
        let sbh = 8192.0 * 16384.0;
        let got = activation_bytes_of(&l, 8192, 1, 8, true, Recompute::None, true).unwrap();
        assert!(close(got, sbh * 31.75 / 8.0), "{}", got / sbh);
    }

    #[test]
    fn adam_state_is_16_bytes_per_parameter() {
        // Llama 2 70B: about 1.1 TB of weights, gradients and Adam state.
        let l = Preset::by_name("llama2-70b").unwrap();
        let bytes = l.params() * MIXED_PRECISION_ADAM_BYTES_PER_PARAM;
        assert_eq!(bytes, 68_976_648_192 * 16);
    }
}
