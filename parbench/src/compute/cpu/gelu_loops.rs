//! The element loops of GELU, each written once and compiled for the
//! build's baseline and for AVX2 and AVX-512 (chosen at run time). Rust
//! does not fuse multiplies and adds on its own, so every variant computes
//! the same bits.

/// Megatron's GELU, `0.5 x (1 + tanh(u))` with `u = sqrt(2/pi) (x +
/// 0.044715 x^3)`, is computed as `x sigmoid(2u)`: the same function
/// (`0.5 (1 + tanh u) = 1 / (1 + e^(-2u))`) with one exponential, which
/// [`exp_f32`] computes in plain arithmetic that the compiler vectorises. A
/// libm `tanhf` call per element took a third of a tiny block's forward
/// once the products ran at the AVX-512 rate.
const GELU_C: f32 = 0.797_884_6; // sqrt(2 / pi)
const GELU_A: f32 = 0.044_715;

/// `e^x`, relative error below 1e-6 over f32's range (tested against f64);
/// arguments are clamped to [-87, 88], so results stay normal and finite.
/// `e^x = 2^k e^r` with `k = round(x / ln 2)`, `|r| <= ln(2) / 2`, `ln 2`
/// split in two for an exact `r` (Cody and Waite), `e^r` by Cephes' expf
/// polynomial; `2^k` is built in the exponent bits. No branches, no calls.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to an integer, which then sits in the low
    // mantissa bits of the sum.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let k = t - ROUND;
    let r = x - k * 0.693_359_4 - k * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    let two_k = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    (p * r * r + r + 1.0) * two_k
}

#[inline(always)]
fn gelu_f32(x: f32) -> f32 {
    let u2 = 2.0 * GELU_C * (x + GELU_A * x * x * x);
    x / (1.0 + exp_f32(-u2))
}

/// The derivative: with `s = sigmoid(2u)`, `d/dx x s = s + 2 x s (1 - s) u'`.
#[inline(always)]
fn gelu_grad_f32(x: f32) -> f32 {
    let u2 = 2.0 * GELU_C * (x + GELU_A * x * x * x);
    let s = 1.0 / (1.0 + exp_f32(-u2));
    s + 2.0 * x * s * (1.0 - s) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

/// `y = gelu(x)` (equal lengths).
pub fn forward(x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { forward_avx512(x, y) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { forward_avx2(x, y) };
        }
    }
    forward_plain(x, y)
}

/// `dx = dy * gelu'(x)` (equal lengths).
pub fn backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { backward_avx512(x, dy, dx) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { backward_avx2(x, dy, dx) };
        }
    }
    backward_plain(x, dy, dx)
}

#[inline(always)]
pub(super) fn forward_plain(x: &[f32], y: &mut [f32]) {
    for (o, &i) in y.iter_mut().zip(x) {
        *o = gelu_f32(i);
    }
}

#[inline(always)]
pub(super) fn backward_plain(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((o, &xi), &g) in dx.iter_mut().zip(x).zip(dy) {
        *o = g * gelu_grad_f32(xi);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn forward_avx2(x: &[f32], y: &mut [f32]) {
    forward_plain(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn forward_avx512(x: &[f32], y: &mut [f32]) {
    forward_plain(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn backward_avx2(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    backward_plain(x, dy, dx)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn backward_avx512(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    backward_plain(x, dy, dx)
}
