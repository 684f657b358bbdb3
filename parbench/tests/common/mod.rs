//! Shared by the GPU tests: the gate, deterministic inputs, and naive f64
//! references of every `Compute` operation (written from the trait's docs).
#![allow(dead_code)]

use parbench::compute::Gemm;

/// Whether GPU tests run: feature `cuda` (these files compile only with it)
/// and `PARBENCH_GPU=1`. Prints one skip line otherwise.
pub fn gpu_enabled(test: &str) -> bool {
    let on = std::env::var("PARBENCH_GPU").is_ok_and(|v| v == "1");
    if !on {
        eprintln!("skipped {test}: set PARBENCH_GPU=1 on a machine with a GPU (scripts/gpu-check.sh does)");
    }
    on
}

/// Deterministic values in [-1, 1) from a seed (an LCG: no dependency).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `C = alpha op(A) op(B) + beta C`, row-major, per the `Gemm` docs; also
/// returns, per element of C, the sum of |terms| (the scale of rounding error).
pub fn ref_gemm(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) -> Vec<f64> {
    let mut mag = vec![0.0f64; c.len()];
    for bi in 0..g.batch.max(1) {
        let (ao, bo, co) = (
            g.a_offset + bi * g.stride_a,
            g.b_offset + bi * g.stride_b,
            g.c_offset + bi * g.stride_c,
        );
        for i in 0..g.m {
            for j in 0..g.n {
                let mut s = 0.0f64;
                let mut m = 0.0f64;
                for p in 0..g.k {
                    let av = if g.trans_a {
                        a[ao + p * g.lda + i]
                    } else {
                        a[ao + i * g.lda + p]
                    } as f64;
                    let bv = if g.trans_b {
                        b[bo + j * g.ldb + p]
                    } else {
                        b[bo + p * g.ldb + j]
                    } as f64;
                    s += av * bv;
                    m += (av * bv).abs();
                }
                let ci = co + i * g.ldc + j;
                let old = c[ci] as f64;
                c[ci] = (g.alpha as f64 * s + g.beta as f64 * old) as f32;
                mag[ci] = g.alpha.abs() as f64 * m + (g.beta as f64 * old).abs();
            }
        }
    }
    mag
}

pub fn ref_gelu(x: f32) -> f32 {
    let x = x as f64;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())) as f32
}

pub fn ref_gelu_grad(x: f32) -> f32 {
    let x = x as f64;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let t = (k * (x + 0.044715 * x * x * x)).tanh();
    (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)) as f32
}

/// Row-wise softmax in place; with `causal`, row r (mod cols) keeps columns 0..=r.
pub fn ref_softmax(x: &mut [f32], offset: usize, rows: usize, cols: usize, causal: bool) {
    for r in 0..rows {
        let row = &mut x[offset + r * cols..offset + (r + 1) * cols];
        let valid = if causal { r % cols + 1 } else { cols };
        let m = row[..valid]
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let s: f64 = row[..valid].iter().map(|&v| (v as f64 - m).exp()).sum();
        for (c, v) in row.iter_mut().enumerate() {
            *v = if c < valid {
                ((*v as f64 - m).exp() / s) as f32
            } else {
                0.0
            };
        }
    }
}

/// `dy = y * (dy - sum(dy * y))` per row.
pub fn ref_softmax_backward(y: &[f32], dy: &mut [f32], offset: usize, rows: usize, cols: usize) {
    for r in 0..rows {
        let o = offset + r * cols;
        let s: f64 = (0..cols).map(|c| dy[o + c] as f64 * y[o + c] as f64).sum();
        for c in 0..cols {
            dy[o + c] = (y[o + c] as f64 * (dy[o + c] as f64 - s)) as f32;
        }
    }
}

/// Largest violation of `|got - want| <= rtol * scale + atol`, as a message, or None.
pub fn mismatch(got: &[f32], want: &[f32], scale: &[f64], rtol: f64, atol: f64) -> Option<String> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(i, (g, w))| {
            let s = scale
                .get(*i)
                .copied()
                .unwrap_or(w.abs() as f64)
                .max(w.abs() as f64);
            let err = (**g as f64 - **w as f64).abs();
            // NaN fails the first test too.
            err.is_nan() || err > rtol * s + atol || !g.is_finite()
        })
        .map(|(i, (g, w))| format!("element {i}: got {g}, want {w}"))
}
