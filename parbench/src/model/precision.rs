//! FP8 training as Transformer Engine runs it (`report plan --precision
//! fp8`): which work moves to the FP8 tensor cores, and what FP8 adds.
//!
//! - **FP8 GEMMs**: the four linear layers of a block (QKV, the attention
//!   projection, the MLP's two), forward and both backward products, as TE's
//!   `Linear`, `LayerNormLinear` and `LayerNormMLP` run them under
//!   `fp8_autocast` (the HYBRID recipe: E4M3 activations and weights, E5M2
//!   gradients, bf16 output). Each reads one byte an input element and
//!   writes two an output element, at the device's 16-bit GEMM rate times
//!   the FP8 GEMM's measured speedup at its K ([`fp8_speedup`]).
//! - **What stays bf16**: the attention core (TE's FP8 attention,
//!   `fp8_dpa`, is off by default), the output layer and its loss
//!   (Megatron-Core's `output_layer` is its own `ColumnParallelLinear`,
//!   outside TE), the embedding, the norms and activations, the optimizer
//!   (fp32 master weights and moments).
//! - **Casts and transposes** ([`block_cast_bytes`]), as Transformer
//!   Engine 1.10 (NeMo 24.07 to 24.11) runs them, at HBM bandwidth: an
//!   FP8 GEMM's input that no kernel before it casts is cast and
//!   transposed in one pass (`fp8_cast_transpose_fused`: read 2 bytes,
//!   write 1 + 1): forward the projection's input; backward the output
//!   gradients of QKV, the projection and the MLP's second layer, and the
//!   activation's gradient where its backward is not GELU's
//!   (`layernorm_mlp.py`: only `dgelu` has a fused cast-transpose). The
//!   norms and the forward activation write FP8 (1 byte, not 2); their
//!   transposes for the weight gradients are made in the backward
//!   (`tex.fp8_transpose` of `ln_out_total` and `gelu_out`: read 1,
//!   write 1).
//! - **Weights** are cast and transposed once a step, at the first
//!   microbatch (TE's `is_first_microbatch`, which Megatron-Core's
//!   `TELinear` passes), and the FP8 copy and its transpose stay for the
//!   step: [`FP8_WORKSPACE_BYTES`] a parameter of the linear layers. With
//!   FP8 primary weights (`fp8_params`) the FP8 weight and its transpose
//!   replace the 16-bit weight: [`weight_bytes_added`].
//! - **Delayed scaling** (TE's `DelayedScaling`, the recipe of NVIDIA's
//!   published Megatron-Core and NeMo FP8 runs of 2024): each FP8 tensor's
//!   amax is taken inside the kernel that casts it. At every exit of the
//!   outermost `fp8_autocast` (Megatron-Core r0.8 wraps each model chunk's
//!   forward in one) and at the end of the chunk's backward, TE all-reduces
//!   (MAX) the chunk's amaxes over the amax group, which Megatron-Core
//!   makes the tensor x data x context-parallel ranks of the stage
//!   (`get_amax_reduction_group(with_context_parallel=True)`), and one
//!   fused kernel rolls every history and recomputes the scales
//!   (`fp8.py`: `reduce_and_update_fp8_tensors`): [`autocast_exit`].

/// Bytes per element of a cast and transpose that is its own pass: read
/// the bf16 tensor (2), write its FP8 copy (1) and FP8 transpose (1).
pub const CAST_TRANSPOSE_BYTES: f64 = 4.0;

/// Bytes per linear-layer parameter TE 1.10 holds through a step beside
/// the 16-bit weight: its FP8 copy and FP8 transpose (`Linear.forward`:
/// `get_fp8_workspace(cache_name="weight", with_transpose=True)`, kept
/// while Megatron-Core's `TELinear` passes `is_first_microbatch`; Hopper's
/// FP8 GEMM is TN only (`fp8_gemm`), so the dgrad reads the transpose).
pub const FP8_WORKSPACE_BYTES: f64 = 2.0 * FP8_BYTES;

/// Bytes of an FP8 element (E4M3 or E5M2).
pub const FP8_BYTES: f64 = 1.0;

/// Bytes of a 16-bit weight element.
const BF16_BYTES: f64 = 2.0;

/// Bytes per linear-layer parameter FP8 adds to the 16-bit weight's 2.
/// With FP8 primary weights (NeMo's `fp8_params`, built under TE's
/// `fp8_model_init`) the weight is a `Float8Tensor` (1 byte) with its
/// transpose cache (1, `transpose_2d(fill_cache=True)` at the first
/// microbatch) in place of the 16-bit weight and the workspace: nothing
/// added. Without, [`FP8_WORKSPACE_BYTES`].
pub fn weight_bytes_added(fp8_params: bool) -> f64 {
    if fp8_params {
        FP8_WORKSPACE_BYTES - BF16_BYTES
    } else {
        FP8_WORKSPACE_BYTES
    }
}

/// The amax history TE keeps per FP8 tensor (`DelayedScaling`'s default
/// `amax_history_len`, as NeMo's FP8 recipes set it).
pub const AMAX_HISTORY_LEN: f64 = 1024.0;

/// FP8 tensors with scaling state per linear layer in the forward: the
/// input, the weight and the output (`fp8_meta["scaling_fwd"]`).
pub const FWD_SLOTS_PER_GEMM: f64 = 3.0;

/// FP8 tensors with scaling state per linear layer in the backward: the
/// output gradient and the input gradient (`fp8_meta["scaling_bwd"]`).
pub const BWD_SLOTS_PER_GEMM: f64 = 2.0;

/// FP8 GEMMs a block runs: QKV, the projection, the MLP's two.
pub const GEMMS_PER_LAYER: f64 = 4.0;

/// Bytes per element of a transpose of an FP8 tensor: read 1, write 1.
pub const TRANSPOSE_BYTES: f64 = 2.0;

/// Dense 16-bit peak of the GPU [`HOPPER_GEMM_BY_K`] was measured on
/// (H800 SXM: the H100's compute), TFLOP/s.
pub const HOPPER_16BIT_TFLOPS: f64 = 989.0;

/// FP8 (E4M3) and FP16 GEMM throughput on one H800 SXM (the H100's
/// compute and clocks), M = N = 8192, by K: `(K, FP8 TFLOP/s, FP16
/// TFLOP/s)`, from tilelang's benchmarks of both, one autotuned kernel
/// each (tile-ai/tilelang as forked in xwhzz/tilelang at b2acfc37:
/// `benchmark/matmul_fp8/README.md` and `benchmark/matmul/README.md`).
/// At K = 8192 FP8 runs 1.99x the FP16 rate (76% of either peak); at small
/// K less, the tile's fixed cost weighing twice on a mainloop half as long.
/// The FP16 column alone is the 16-bit GEMM's rate by K
/// ([`hopper_16bit_k_share`]): the same fixed cost over a shorter mainloop.
pub const HOPPER_GEMM_BY_K: [(f64, f64, f64); 7] = [
    (256.0, 569.0, 386.0),
    (512.0, 858.0, 520.0),
    (1024.0, 1129.0, 628.0),
    (2048.0, 1343.0, 705.0),
    (4096.0, 1467.0, 736.0),
    (8192.0, 1507.0, 758.0),
    (16384.0, 1541.0, 766.0),
];

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

/// Bytes a block's FP8 casts and transposes stream on one rank, a
/// microbatch, forward and backward ([`block_cast_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CastBytes {
    pub forward: f64,
    pub backward: f64,
}

/// One block's shape on one of `t` tensor ranks, microbatch of `tokens`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockShape {
    pub tokens: f64,
    /// Hidden size.
    pub h: f64,
    /// Key/value width (`kv heads x head dim`).
    pub kv: f64,
    /// The MLP's inner width on the rank (`ffn / t`).
    pub ffn_t: f64,
    /// The first MLP layer's output on the rank (`2 ffn / t` gated).
    pub up_t: f64,
    pub t: f64,
    pub sequence_parallel: bool,
    /// GELU: its backward casts and transposes its output in one kernel.
    pub gelu: bool,
}

/// The casts and transposes of one block in FP8 beyond what its bf16
/// kernels stream (module doc): forward the projection's input cast and
/// transposed (`tokens h/t`, 4 bytes), less a byte an element the two
/// norms (`tokens h`, split by `t` under sequence parallelism) and the
/// activation (`tokens ffn/t`) write in FP8; backward the output
/// gradients of QKV (`tokens (h + 2 kv)/t`), the projection and the last
/// MLP layer (`tokens h` each, gathered whole as their GEMMs read them)
/// cast and transposed (4 bytes), the activation's gradient
/// (`tokens up/t`) where its backward is not GELU's (4), and the norms'
/// gathered outputs (`tokens h` each) and the activation's output
/// transposed (2 bytes).
pub fn block_cast_bytes(b: BlockShape) -> CastBytes {
    let t = b.t.max(1.0);
    let norm_split = if b.sequence_parallel { t } else { 1.0 };
    let written_fp8 = 2.0 * b.tokens * b.h / norm_split + b.tokens * b.ffn_t;
    let forward = CAST_TRANSPOSE_BYTES * b.tokens * b.h / t - written_fp8;
    let grads = b.tokens * (b.h + 2.0 * b.kv) / t + 2.0 * b.tokens * b.h;
    let activation_grad = if b.gelu { 0.0 } else { b.tokens * b.up_t };
    let transposed = 2.0 * b.tokens * b.h + b.tokens * b.ffn_t;
    CastBytes {
        forward,
        backward: CAST_TRANSPOSE_BYTES * (grads + activation_grad) + TRANSPOSE_BYTES * transposed,
    }
}

/// Activation bytes per layer FP8 saves on one of `t` ranks, microbatch
/// of `tokens` tokens, against the 16-bit block's. TE 1.10 keeps what a
/// kernel writes in FP8 as the only copy, 1 byte an element, not 2: the
/// two norms' outputs (`ln_out` of `LayerNormLinear` and `LayerNormMLP`,
/// `h` each, split by `t` under sequence parallelism) and the activation's
/// output (`gelu_out`, the second MLP layer's input, `ffn / t`). The
/// projection's input is the attention's output, which the attention
/// keeps in bf16 for its own backward (`FusedAttnFunc` and
/// `AttnFuncWithCPAndKVP2P` save `out`; FP8 attention is off): the
/// projection's FP8 copy (`Linear` saves `inputmat_t`, or `inputmat`
/// under sequence parallelism) is a byte an element more (`h / t`).
pub fn saved_input_savings(tokens: f64, h: f64, ffn: f64, t: f64, sequence_parallel: bool) -> f64 {
    let t = t.max(1.0);
    let norm_split = if sequence_parallel { t } else { 1.0 };
    tokens * (2.0 * h / norm_split + ffn / t - h / t)
}

/// Bytes a step streams for FP8's once-a-step work on a rank holding
/// `linear_params` linear-layer parameters, at the first microbatch:
/// each 16-bit weight cast and transposed, or with FP8 primary weights
/// (`fp8_params`: the optimizer writes the FP8 weight) each FP8 weight's
/// transpose cache refilled (read 1, write 1).
pub fn step_bytes(linear_params: f64, fp8_params: bool) -> f64 {
    let per_param = if fp8_params {
        TRANSPOSE_BYTES
    } else {
        CAST_TRANSPOSE_BYTES
    };
    linear_params * per_param
}

/// One exit of an `fp8_autocast` region (a model chunk's forward) or the
/// end of its backward, for `layers` layers: the bytes of amaxes the
/// all-reduce carries (fp32, one a tensor) and the bytes the fused
/// history roll and scale update stream (each history read and written).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutocastExit {
    pub amax_bytes: f64,
    pub update_bytes: f64,
}

/// [`AutocastExit`] of the forward (`forward`: input, weight and output
/// slots a GEMM) or the backward (two gradient slots a GEMM) of a chunk
/// of `layers` layers, [`GEMMS_PER_LAYER`] FP8 GEMMs each.
pub fn autocast_exit(layers: f64, forward: bool) -> AutocastExit {
    let slots = if forward {
        FWD_SLOTS_PER_GEMM
    } else {
        BWD_SLOTS_PER_GEMM
    };
    let tensors = layers * GEMMS_PER_LAYER * slots;
    AutocastExit {
        amax_bytes: 4.0 * tensors,
        update_bytes: 2.0 * 4.0 * AMAX_HISTORY_LEN * tensors,
    }
}

/// The K of the GEMM a device's 16-bit rate is measured on (`gemm_tflops`:
/// 8192^3), where [`fp8_speedup`] sets the device's FP8 rate.
pub const REFERENCE_K: f64 = 8192.0;

/// An FP8 GEMM of inner dimension `k` at this share of the device's FP8
/// rate, beside the 16-bit share at `k` ([`hopper_16bit_k_share`]):
/// [`fp8_speedup`] at `k` over at [`REFERENCE_K`] (the peaks cancel).
pub fn fp8_k_share(k: f64) -> f64 {
    fp8_speedup(k, 1.0) / fp8_speedup(REFERENCE_K, 1.0)
}

/// A 16-bit GEMM of inner dimension `k` on Hopper at this share of the
/// rate at [`REFERENCE_K`]: the FP16 column of [`HOPPER_GEMM_BY_K`] (0.93
/// at K = 2048, 0.83 at 1024, 1.01 at 16,384).
pub fn hopper_16bit_k_share(k: f64) -> f64 {
    let fp16 = |k: f64| read_by_k(k, |row| row.2);
    fp16(k) / fp16(REFERENCE_K)
}

/// A FP8 GEMM's speed over the 16-bit GEMM of the same shape, by its inner
/// dimension `k`, on a device whose dense FP8 peak is `fp8_over_16bit_peak`
/// times its 16-bit one: [`HOPPER_GEMM_BY_K`]'s ratio read in log `k`,
/// scaled by that peak ratio over the H800's.
pub fn fp8_speedup(k: f64, fp8_over_16bit_peak: f64) -> f64 {
    let measured = read_by_k(k, |row| row.1 / row.2);
    measured * fp8_over_16bit_peak / (super::device::HOPPER_FP8_TFLOPS / HOPPER_16BIT_TFLOPS)
}

/// `value` of [`HOPPER_GEMM_BY_K`]'s rows at `k`: linear in log `k`
/// between the rows, held beyond them.
fn read_by_k(k: f64, value: impl Fn(&(f64, f64, f64)) -> f64) -> f64 {
    let table = HOPPER_GEMM_BY_K;
    let k = k.max(1.0);
    let last = table.len() - 1;
    if k <= table[0].0 {
        return value(&table[0]);
    }
    if k >= table[last].0 {
        return value(&table[last]);
    }
    let i = table.iter().position(|r| r.0 >= k).unwrap_or(last).max(1);
    let (k0, k1) = (table[i - 1].0.ln(), table[i].0.ln());
    let f = (k.ln() - k0) / (k1 - k0);
    value(&table[i - 1]) + f * (value(&table[i]) - value(&table[i - 1]))
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
        let shape = BlockShape {
            tokens: 4096.0,
            h: 4096.0,
            kv: 1024.0,
            ffn_t: 14336.0,
            up_t: 28672.0,
            t: 1.0,
            sequence_parallel: false,
            gelu: false,
        };
        let (n, h, ffn) = (4096.0, 4096.0, 14336.0);
        let c = block_cast_bytes(shape);
        // The projection's input cast and transposed, less a byte an
        // element the two norms and the activation write in FP8.
        assert_eq!(c.forward, 4.0 * n * h - (2.0 * n * h + n * ffn));
        // Gradients cast and transposed (SwiGLU's too), norms' outputs and
        // the activation's transposed.
        let grads = n * 6144.0 + 2.0 * n * h + n * 28672.0;
        assert_eq!(c.backward, 4.0 * grads + 2.0 * (2.0 * n * h + n * ffn));
        // GELU's backward casts its own output.
        let gelu = block_cast_bytes(BlockShape {
            gelu: true,
            ..shape
        });
        assert_eq!(c.backward - gelu.backward, 4.0 * n * 28672.0);
        assert_eq!(step_bytes(1e9, false), 4e9);
        assert_eq!(step_bytes(1e9, true), 2e9);
        assert_eq!(weight_bytes_added(false), 2.0);
        assert_eq!(weight_bytes_added(true), 0.0);
        // A chunk of 4 layers: 48 forward amaxes, 32 backward ones.
        assert_eq!(autocast_exit(4.0, true).amax_bytes, 4.0 * 48.0);
        assert_eq!(autocast_exit(4.0, false).amax_bytes, 4.0 * 32.0);
        assert_eq!(autocast_exit(1.0, true).update_bytes, 12.0 * 1024.0 * 8.0);
    }

    /// The FP8 speedup is tilelang's measured ratio: 1507 / 758 at K =
    /// 8192 on the H800's peaks, read between the rows in log K, held
    /// beyond them, and scaled by another device's FP8-to-16-bit peaks.
    #[test]
    fn fp8_speedup_is_the_measured_ratio() {
        let hopper = 1979.0 / 989.0;
        assert!((fp8_speedup(8192.0, hopper) - 1507.0 / 758.0).abs() < 1e-12);
        assert!((fp8_speedup(64.0, hopper) - 569.0 / 386.0).abs() < 1e-12);
        assert!((fp8_speedup(1e6, hopper) - 1541.0 / 766.0).abs() < 1e-12);
        let mid = fp8_speedup(1448.15, hopper); // sqrt(1024 x 2048)
        let (lo, hi) = (1129.0 / 628.0, 1343.0 / 705.0);
        assert!((mid - (lo + hi) / 2.0).abs() < 1e-4, "{mid}");
        assert!((fp8_speedup(8192.0, hopper / 2.0) - 1507.0 / 758.0 / 2.0).abs() < 1e-12);
        assert!((fp8_k_share(8192.0) - 1.0).abs() < 1e-12);
        assert!((fp8_k_share(2048.0) - (1343.0 / 705.0) / (1507.0 / 758.0)).abs() < 1e-12);
    }

    /// The 16-bit share by K is tilelang's FP16 column over its K = 8192
    /// row, held beyond the table; with the FP8 share the FP8 GEMM lands
    /// on the FP8 column.
    #[test]
    fn the_16bit_rate_by_k_is_the_fp16_column() {
        assert!((hopper_16bit_k_share(8192.0) - 1.0).abs() < 1e-12);
        assert!((hopper_16bit_k_share(2048.0) - 705.0 / 758.0).abs() < 1e-12);
        assert!((hopper_16bit_k_share(64.0) - 386.0 / 758.0).abs() < 1e-12);
        assert!((hopper_16bit_k_share(1e6) - 766.0 / 758.0).abs() < 1e-12);
        let mid = hopper_16bit_k_share(1448.15); // sqrt(1024 x 2048)
        assert!((mid - (628.0 + 705.0) / 2.0 / 758.0).abs() < 1e-4, "{mid}");
        let fp8_at_1024 = hopper_16bit_k_share(1024.0) * fp8_k_share(1024.0);
        assert!(
            (fp8_at_1024 - 1129.0 / 1507.0).abs() < 1e-12,
            "{fp8_at_1024}"
        );
    }
}
