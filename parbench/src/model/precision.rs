//! FP8 training as Transformer Engine runs it (`report plan --precision
//! fp8`): which work moves to the FP8 tensor cores, and what FP8 adds.
//!
//! - **FP8 GEMMs**: the four linear layers of a block (QKV, the attention
//!   projection, the MLP's two), forward and both backward products, as TE's
//!   `Linear`, `LayerNormLinear` and `LayerNormMLP` run them under
//!   `fp8_autocast` (the HYBRID recipe: E4M3 activations and weights, E5M2
//!   gradients, bf16 output). Each reads one byte an input element and
//!   writes two an output element, at the device's FP8 rate.
//! - **What stays bf16**: the attention core (TE's FP8 attention,
//!   `fp8_dpa`, is off by default), the output layer and its loss
//!   (Megatron-Core's `output_layer` is its own `ColumnParallelLinear`,
//!   outside TE), the embedding, the norms and activations, the optimizer
//!   (fp32 master weights and moments).
//! - **Casts** ([`CAST_TRANSPOSE_BYTES`]): an FP8 GEMM's input is cast,
//!   and transposed for the weight-gradient product, in one pass (TE's
//!   `fp8_cast_transpose_fused`). Where TE fuses the cast into the kernel
//!   that produces the tensor (the norm before QKV and the MLP's first
//!   layer, the activation before its second, the activation's backward
//!   before the first's weight gradient) the producer writes its FP8 output
//!   and transpose (2 bytes) instead of its bf16 output (2): nothing added.
//!   The rest is added: forward the projection's input (the attention's
//!   output); backward the output gradients of QKV, the projection and
//!   the MLP's second layer.
//! - **Weights** are cast and transposed once a step, at the first
//!   microbatch (TE's `is_first_microbatch`), and the FP8 copy and its
//!   transpose stay for the step: [`FP8_WEIGHT_COPY_BYTES`] a parameter of
//!   the linear layers.
//! - **Delayed scaling** (TE's `DelayedScaling`, the recipe of NVIDIA's
//!   published Megatron-Core and NeMo FP8 runs of 2024): each FP8 tensor's
//!   amax is taken inside the kernel that casts it; once a step the amax
//!   histories roll and the scales are recomputed, reading and writing
//!   each history ([`AMAX_HISTORY_LEN`] fp32 values).

/// Bytes per element of a cast and transpose that is its own pass: read
/// the bf16 tensor (2), write its FP8 copy (1) and FP8 transpose (1).
pub const CAST_TRANSPOSE_BYTES: f64 = 4.0;

/// Bytes per linear-layer parameter TE holds in FP8 through a step: the
/// weight's FP8 copy and its FP8 transpose.
pub const FP8_WEIGHT_COPY_BYTES: f64 = 2.0;

/// The amax history TE keeps per FP8 tensor (`DelayedScaling`'s default
/// `amax_history_len`, as NeMo's FP8 recipes set it).
pub const AMAX_HISTORY_LEN: f64 = 1024.0;

/// FP8 tensors with scaling state per linear layer: the input, the weight
/// and the output gradient (TE's `fp8_meta` forward and backward slots).
pub const FP8_TENSORS_PER_GEMM: f64 = 3.0;

/// The numeric format of the linear layers' GEMMs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// bf16 everywhere (fp32 master weights).
    #[default]
    Bf16,
    /// FP8 linear layers, Transformer Engine's recipe.
    Fp8,
}

impl Precision {
    pub const ALL: [(&'static str, Precision); 2] =
        [("bf16", Precision::Bf16), ("fp8", Precision::Fp8)];

    pub fn by_name(name: &str) -> Option<Precision> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, p)| p)
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }
}

/// Elements of one block's tensors on one of `t` ranks, microbatch of
/// `tokens` tokens: what the casts of [`Precision::Fp8`] stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CastElements {
    /// Forward: the inputs of FP8 GEMMs cast on their own.
    pub forward: f64,
    /// Backward: the output gradients cast on their own.
    pub backward: f64,
}

/// The unfused casts of one block (hidden `h`, key/value width `kv`,
/// over `t` tensor ranks): forward the projection's input (`tokens h/t`);
/// backward the QKV output's gradient (`tokens (h + 2 kv)/t`) and the
/// projection's and second MLP layer's (`tokens h` each, gathered whole
/// as their GEMMs read them).
pub fn block_casts(tokens: f64, h: f64, kv: f64, t: f64) -> CastElements {
    let t = t.max(1.0);
    CastElements {
        forward: tokens * h / t,
        backward: tokens * (h + 2.0 * kv) / t + 2.0 * tokens * h,
    }
}

/// Activation bytes per layer FP8 saves on one of `t` ranks, microbatch
/// of `tokens` tokens: TE keeps a linear layer's input for its weight
/// gradient as the FP8 transpose (1 byte an element, not 2): the two
/// norms' outputs (QKV's and the MLP's input, `h` each, split by `t`
/// under sequence parallelism), the projection's input (`h / t`) and the
/// second MLP layer's (`ffn / t`).
pub fn saved_input_savings(tokens: f64, h: f64, ffn: f64, t: f64, sequence_parallel: bool) -> f64 {
    let t = t.max(1.0);
    let norm_split = if sequence_parallel { t } else { 1.0 };
    tokens * (2.0 * h / norm_split + h / t + ffn / t)
}

/// Bytes a step streams for FP8's once-a-step work on a rank holding
/// `linear_params` linear-layer parameters in `layers` layers: the
/// weights' cast and transpose, and the amax histories' roll and scale
/// update (read and write each).
pub fn step_bytes(linear_params: f64, layers: f64) -> f64 {
    let histories = layers * 4.0 * FP8_TENSORS_PER_GEMM * AMAX_HISTORY_LEN * 4.0 * 2.0;
    linear_params * CAST_TRANSPOSE_BYTES + histories
}

/// The device's FP8 GEMM rate, FLOP/s: its dense FP8 peak at the share
/// of its peak its 16-bit GEMMs sustain (`gemm_flops` of `peak_flops`).
/// No FP8 GEMM was measured here; the same share is the assumption.
pub fn fp8_gemm_flops(gemm_flops: f64, peak_flops: f64, fp8_peak_flops: f64) -> f64 {
    fp8_peak_flops * gemm_flops / peak_flops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (n, p) in Precision::ALL {
            assert_eq!(Precision::by_name(n), Some(p));
            assert_eq!(p.name(), n);
        }
        assert_eq!(Precision::by_name("fp4"), None);
    }

    #[test]
    fn casts_count_what_te_does_not_fuse() {
        let c = block_casts(4096.0, 4096.0, 1024.0, 1.0);
        assert_eq!(c.forward, 4096.0 * 4096.0);
        assert_eq!(c.backward, 4096.0 * 6144.0 + 2.0 * 4096.0 * 4096.0);
        // An H100's 780 of 989 dense bf16 is 1561 of 1979 FP8.
        let f = fp8_gemm_flops(780e12, 989e12, 1979e12);
        assert!((f / 1e12 - 1560.8).abs() < 0.1, "{f}");
        assert!(step_bytes(1e9, 32.0) > 4e9);
    }
}
