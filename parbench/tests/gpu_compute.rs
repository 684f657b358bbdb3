//! CudaCompute against naive f64 references, within each storage type's
//! rounding, for every kernel and for GEMMs with transposes, offsets, padded
//! leading dimensions and batches; FP8 products (E4M3 operands, bf16 out)
//! where the GPU has them; the bf16 GEMM throughput at 8192^3 and the FP8
//! one beside it (printed, never asserted); CUDA-graph capture and replay.
//! Run with `--features cuda` and `PARBENCH_GPU=1` (scripts/gpu-check.sh).
#![cfg(feature = "cuda")]

mod common;

use common::*;
use parbench::comm::DType;
use parbench::compute::cuda::CudaCompute;
use parbench::compute::{Compute, Gemm};
use parbench::gpu::timing::{CapturedLoop, EventTimer};
use std::time::Duration;

/// Relative tolerance per storage type: a few units of the output's rounding.
fn rtol(d: DType) -> f64 {
    match d {
        DType::BF16 => 1.6e-2,
        DType::F16 => 2e-3,
        _ => 2e-5,
    }
}

const TYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Uploads `v` and returns the buffer and the values as stored (rounded).
fn put(dev: &CudaCompute, v: &[f32]) -> (parbench::gpu::DeviceBuffer, Vec<f32>) {
    let mut b = dev.alloc(v.len()).unwrap();
    dev.upload(v, &mut b).unwrap();
    let mut r = vec![0.0; v.len()];
    dev.download(&b, &mut r).unwrap();
    (b, r)
}

fn get(dev: &CudaCompute, b: &parbench::gpu::DeviceBuffer, n: usize) -> Vec<f32> {
    let mut r = vec![0.0; n];
    dev.sync().unwrap();
    dev.download(b, &mut r).unwrap();
    r
}

fn check(what: &str, d: DType, got: &[f32], want: &[f32], scale: &[f64]) {
    let t = rtol(d);
    if let Some(m) = mismatch(got, want, scale, t, t) {
        panic!("{what} ({d}): {m}");
    }
}

#[test]
fn gpu_compute_kernels_match_reference() {
    if !gpu_enabled("gpu_compute_kernels_match_reference") {
        return;
    }
    for d in TYPES {
        let dev = CudaCompute::new(0, d).unwrap();
        let (rows, cols) = (37, 300);
        let n = rows * cols;
        let (xb, x) = put(&dev, &values(n, 1));
        let (bb, bias) = put(&dev, &values(cols, 2));
        let (dyb, dy) = put(&dev, &values(n, 3));

        // add_bias
        let mut xb2 = dev.alloc(n).unwrap();
        dev.copy(&xb, 0, &mut xb2, 0, n).unwrap();
        dev.add_bias(&mut xb2, &bb, rows, cols).unwrap();
        let want: Vec<f32> = (0..n).map(|i| x[i] + bias[i % cols]).collect();
        check("add_bias", d, &get(&dev, &xb2, n), &want, &[]);

        // bias_grad: scale is the sum of |terms|
        let mut db = dev.alloc(cols).unwrap();
        dev.bias_grad(&dyb, &mut db, rows, cols).unwrap();
        let want: Vec<f32> = (0..cols)
            .map(|c| (0..rows).map(|r| dy[r * cols + c]).sum())
            .collect();
        let scale: Vec<f64> = (0..cols)
            .map(|c| (0..rows).map(|r| dy[r * cols + c].abs() as f64).sum())
            .collect();
        check("bias_grad", d, &get(&dev, &db, cols), &want, &scale);

        // gelu and its backward
        let mut yb = dev.alloc(n).unwrap();
        dev.gelu(&xb, &mut yb, n).unwrap();
        let want: Vec<f32> = x.iter().map(|&v| ref_gelu(v)).collect();
        check("gelu", d, &get(&dev, &yb, n), &want, &[]);
        let mut dxb = dev.alloc(n).unwrap();
        dev.gelu_backward(&xb, &dyb, &mut dxb, n).unwrap();
        let want: Vec<f32> = (0..n).map(|i| dy[i] * ref_gelu_grad(x[i])).collect();
        check("gelu_backward", d, &get(&dev, &dxb, n), &want, &[]);

        // add
        let mut sb = dev.alloc(n).unwrap();
        dev.copy(&xb, 0, &mut sb, 0, n).unwrap();
        dev.add(&mut sb, &dyb, n).unwrap();
        let want: Vec<f32> = (0..n).map(|i| x[i] + dy[i]).collect();
        check("add", d, &get(&dev, &sb, n), &want, &[]);

        // softmax at an offset, plain and causal (rows beyond cols wrap), and its backward
        for causal in [false, true] {
            let (r, c, off) = (12, 5, 7);
            let (mut pb, mut p) = put(&dev, &values(off + r * c + 3, 4));
            dev.softmax(&mut pb, off, r, c, causal).unwrap();
            ref_softmax(&mut p, off, r, c, causal);
            let got = get(&dev, &pb, p.len());
            check(&format!("softmax causal={causal}"), d, &got, &p, &[]);
            let (mut gb, mut g) = put(&dev, &values(p.len(), 5));
            dev.softmax_backward(&pb, &mut gb, off, r, c).unwrap();
            ref_softmax_backward(&got, &mut g, off, r, c);
            check("softmax_backward", d, &get(&dev, &gb, g.len()), &g, &[]);
        }
        // A wide row, wider than one block of threads.
        let (mut wb, mut w) = put(&dev, &values(2 * 1000, 6));
        dev.softmax(&mut wb, 0, 2, 1000, false).unwrap();
        ref_softmax(&mut w, 0, 2, 1000, false);
        check("softmax wide", d, &get(&dev, &wb, w.len()), &w, &[]);
    }
}

/// One product compared with the reference.
fn gemm_case(dev: &CudaCompute, d: DType, g: &Gemm, seed: u64) {
    gemm_within(dev, g, seed, rtol(d), &format!("{d}"));
}

/// One product compared with the reference within `t` of each element's
/// magnitude (the sum of |a b| over k).
fn gemm_within(dev: &CudaCompute, g: &Gemm, seed: u64, t: f64, what: &str) {
    let (ea, eb, ec) = g.extents();
    let (ab, a) = put(dev, &values(ea + 5, seed));
    let (bb, b) = put(dev, &values(eb + 3, seed + 1));
    let (mut cb, mut c) = put(dev, &values(ec + 2, seed + 2));
    dev.gemm(g, &ab, &bb, &mut cb).unwrap();
    let scale = ref_gemm(g, &a, &b, &mut c);
    let got = get(dev, &cb, c.len());
    // Elements outside C's matrices must be untouched: the reference keeps them too.
    if let Some(m) = mismatch(&got, &c, &scale, t, 1e-6) {
        panic!("gemm {g:?} ({what}): {m}");
    }
}

/// The FP8 device, or `None` (after checking its refusal names the
/// architecture) on a GPU older than sm_89.
fn fp8_device() -> Option<CudaCompute> {
    match CudaCompute::new(0, DType::F8E4M3) {
        Ok(dev) => Some(dev),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("sm_89"), "{e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn gpu_compute_fp8_gemm_matches_reference() {
    if !gpu_enabled("gpu_compute_fp8_gemm_matches_reference") {
        return;
    }
    let Some(dev) = fp8_device() else {
        return;
    };
    assert_eq!(dev.gemm_math().multiply, DType::F8E4M3);
    assert_eq!(dev.dtype(), DType::BF16);
    // Each operand off by up to E4M3's step 2^-4: 2 x 2^-4 of each term.
    let fp8 = parbench::layers::check::FP8_TOLERANCE;
    let mut seed = 300;
    // m and n multiples of 16 as the block's are (C's rows are 16-byte aligned).
    for (m, n, k) in [(64, 48, 32), (32, 80, 16), (128, 96, 256)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut g = Gemm::dense(m, n, k);
            g.trans_a = ta;
            g.trans_b = tb;
            g.lda = if ta { m } else { k } + 3;
            g.ldb = if tb { k } else { n } + 1;
            g.a_offset = 2;
            g.alpha = 0.5;
            g.beta = 0.25;
            gemm_within(&dev, &g, seed, fp8, "fp8");
            seed += 3;
        }
    }
    // Batched and attention's products stay bf16, to bf16's rounding.
    let mut g = Gemm::dense(16, 16, 32);
    g.batch = 2;
    g.stride_a = 16 * 32;
    g.stride_b = 32 * 16;
    g.stride_c = 16 * 16;
    gemm_within(&dev, &g, 400, rtol(DType::BF16), "fp8 device, batched");
    let mut g = Gemm::dense(16, 16, 32);
    g.attention = true;
    gemm_within(&dev, &g, 401, rtol(DType::BF16), "fp8 device, attention");
    // K off cuBLASLt's FP8 multiple: refused by name.
    let g = Gemm::dense(8, 8, 24);
    let (a, _) = put(&dev, &values(64 * 3, 1));
    let (b, _) = put(&dev, &values(64 * 3, 2));
    let mut c = dev.alloc(64).unwrap();
    let e = dev.gemm(&g, &a, &b, &mut c).unwrap_err().to_string();
    assert!(e.contains("multiple of 16"), "{e}");
}

#[test]
fn gpu_compute_gemm_matches_reference() {
    if !gpu_enabled("gpu_compute_gemm_matches_reference") {
        return;
    }
    for d in TYPES {
        let dev = CudaCompute::new(0, d).unwrap();
        let mut seed = 10;
        for (m, n, k) in [(1, 1, 1), (7, 5, 3), (64, 48, 32), (33, 65, 17)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut g = Gemm::dense(m, n, k);
                g.trans_a = ta;
                g.trans_b = tb;
                g.lda = if ta { m } else { k };
                g.ldb = if tb { k } else { n };
                gemm_case(&dev, d, &g, seed);
                seed += 3;
            }
        }
        // Offsets, padded leading dimensions, alpha and beta, strided batches.
        let mut g = Gemm::dense(9, 6, 11);
        g.trans_b = true;
        g.a_offset = 3;
        g.lda = 13;
        g.b_offset = 5;
        g.ldb = 12;
        g.c_offset = 1;
        g.ldc = 8;
        g.alpha = 0.5;
        g.beta = 0.25;
        g.batch = 3;
        g.stride_a = 9 * 13 + 4;
        g.stride_b = 6 * 12 + 2;
        g.stride_c = 9 * 8 + 1;
        gemm_case(&dev, d, &g, 100);
        // k = 0: C = beta C.
        let mut g = Gemm::dense(4, 3, 0);
        g.beta = 0.5;
        gemm_case(&dev, d, &g, 200);
    }
}

#[test]
fn gpu_gemm_bf16_throughput_8192() {
    if !gpu_enabled("gpu_gemm_bf16_throughput_8192") {
        return;
    }
    let n = 8192;
    let dev = CudaCompute::new(0, DType::BF16).unwrap();
    let g = Gemm::dense(n, n, n);
    let s = seconds_per_product(&dev, n, n);
    let tflops = g.flops() / s / 1e12;
    println!(
        "GEMM bf16 {n}x{n}x{n} (cuBLASLt, f32 accumulation) on {}: {:.1} TFLOP/s ({:.3} ms per product)",
        dev.name(),
        tflops,
        s * 1e3
    );
    assert!(tflops.is_finite() && tflops > 0.0);
}

/// Seconds per `n x n x k` product on `dev`: 20 timed between two events,
/// after 3 untimed.
fn seconds_per_product(dev: &CudaCompute, n: usize, k: usize) -> f64 {
    let g = Gemm::dense(n, n, k);
    let (a, _) = put(dev, &values(n * k, 1));
    let (b, _) = put(dev, &values(k * n, 2));
    let mut c = dev.alloc(n * n).unwrap();
    for _ in 0..3 {
        dev.gemm(&g, &a, &b, &mut c).unwrap();
    }
    let iters = 20;
    let mut t = EventTimer::new(dev.gpu(), 2).unwrap();
    t.mark().unwrap();
    for _ in 0..iters {
        dev.gemm(&g, &a, &b, &mut c).unwrap();
    }
    t.mark().unwrap();
    t.intervals(Duration::from_secs(60)).unwrap()[0] / iters as f64
}

/// FP8 beside bf16 at 8192 x 8192 and K = 8192 and 2048, in both of
/// cuBLASLt's FP8 accumulations: split (Transformer Engine's dgrad and
/// wgrad) and fast (its forward). The planner prices every FP8 product
/// at tilelang's ratio by K (docs/report.md, FP8), a kernel without
/// promotion: these rows say what the split products cost beside it.
#[test]
fn gpu_gemm_fp8_throughput_beside_bf16_8192() {
    if !gpu_enabled("gpu_gemm_fp8_throughput_beside_bf16_8192") {
        return;
    }
    let Some(fp8) = fp8_device() else {
        return;
    };
    let bf16 = CudaCompute::new(0, DType::BF16).unwrap();
    let n = 8192;
    for k in [8192, 2048] {
        let flops = Gemm::dense(n, n, k).flops();
        let tflops = |s: f64| flops / s / 1e12;
        let b = seconds_per_product(&bf16, n, k);
        fp8.set_fp8_fast_accumulation(false).unwrap();
        let split = seconds_per_product(&fp8, n, k);
        fp8.set_fp8_fast_accumulation(true).unwrap();
        let fast = seconds_per_product(&fp8, n, k);
        println!(
            "GEMM {n}x{n}x{k} on {}: bf16 {:.1} TFLOP/s; fp8 (casts and amax included) split accumulation {:.1} (x{:.2}), fast {:.1} (x{:.2}); fast over split x{:.2}",
            fp8.name(),
            tflops(b),
            tflops(split),
            b / split,
            tflops(fast),
            b / fast,
            split / fast
        );
        assert!([b, split, fast].iter().all(|s| s.is_finite() && *s > 0.0));
    }
}

#[test]
fn gpu_graph_replays_captured_loop() {
    if !gpu_enabled("gpu_graph_replays_captured_loop") {
        return;
    }
    let dev = CudaCompute::new(0, DType::F32).unwrap();
    let n = 1000;
    let (mut x, x0) = put(&dev, &values(n, 1));
    let (y, y0) = put(&dev, &values(n, 2));
    let graph = CapturedLoop::capture(dev.gpu(), 5, || {
        dev.add(&mut x, &y, n)
            .map_err(|e| parbench::gpu::GpuError::call("add", e))
    })
    .unwrap();
    // Capturing records without running.
    assert_eq!(get(&dev, &x, n), x0);
    let mut t = EventTimer::new(dev.gpu(), 3).unwrap();
    t.mark().unwrap();
    graph.replay().unwrap();
    t.mark().unwrap();
    graph.replay().unwrap();
    t.mark().unwrap();
    let times = t.intervals(Duration::from_secs(10)).unwrap();
    assert_eq!(times.len(), 2);
    assert!(times.iter().all(|s| s.is_finite() && *s >= 0.0));
    let want: Vec<f32> = (0..n).map(|i| x0[i] + 10.0 * y0[i]).collect();
    if let Some(m) = mismatch(&get(&dev, &x, n), &want, &[], 1e-5, 1e-5) {
        panic!("graph replay: {m}");
    }
}

/// Every operation once on `dev`, on inputs made from seeds; returns each
/// output downloaded, by name, with the magnitude its error scales with.
fn outputs<C: Compute>(dev: &C) -> Vec<(String, Vec<f32>, f32)> {
    let mut out = Vec::new();
    let up = |v: &[f32]| {
        let mut b = dev.alloc(v.len()).unwrap();
        dev.upload(v, &mut b).unwrap();
        b
    };
    let down = |b: &C::Buf, n: usize| {
        dev.sync().unwrap();
        let mut v = vec![0.0; n];
        dev.download(b, &mut v).unwrap();
        v
    };
    let (rows, cols) = (19, 70);
    let n = rows * cols;
    let x = up(&values(n, 1));
    let bias = up(&values(cols, 2));
    let dy = up(&values(n, 3));
    let mut t = up(&values(n, 1));
    dev.add_bias(&mut t, &bias, rows, cols).unwrap();
    out.push(("add_bias".into(), down(&t, n), 1.0));
    let mut db = dev.alloc(cols).unwrap();
    dev.bias_grad(&dy, &mut db, rows, cols).unwrap();
    out.push(("bias_grad".into(), down(&db, cols), rows as f32));
    let mut y = dev.alloc(n).unwrap();
    dev.gelu(&x, &mut y, n).unwrap();
    out.push(("gelu".into(), down(&y, n), 1.0));
    let mut dx = dev.alloc(n).unwrap();
    dev.gelu_backward(&x, &dy, &mut dx, n).unwrap();
    out.push(("gelu_backward".into(), down(&dx, n), 1.0));
    let mut s = up(&values(n, 1));
    dev.add(&mut s, &dy, n).unwrap();
    out.push(("add".into(), down(&s, n), 1.0));
    for causal in [false, true] {
        let mut p = up(&values(n + 4, 4));
        dev.softmax(&mut p, 4, rows, cols, causal).unwrap();
        out.push((format!("softmax causal={causal}"), down(&p, n + 4), 1.0));
        let mut g = up(&values(n + 4, 5));
        dev.softmax_backward(&p, &mut g, 4, rows, cols).unwrap();
        out.push((
            format!("softmax_backward causal={causal}"),
            down(&g, n + 4),
            1.0,
        ));
    }
    for (ta, tb, batch) in [
        (false, false, 1),
        (true, false, 2),
        (false, true, 3),
        (true, true, 1),
    ] {
        let (m, nn, k) = (13, 11, 24);
        let mut g = Gemm::dense(m, nn, k);
        g.trans_a = ta;
        g.trans_b = tb;
        g.lda = if ta { m } else { k };
        g.ldb = if tb { k } else { nn };
        g.batch = batch;
        g.stride_a = m * k;
        g.stride_b = k * nn;
        g.stride_c = m * nn;
        g.beta = 0.5;
        let (ea, eb, ec) = g.extents();
        let a = up(&values(ea, 6));
        let b = up(&values(eb, 7));
        let mut c = up(&values(ec, 8));
        dev.gemm(&g, &a, &b, &mut c).unwrap();
        out.push((
            format!("gemm ta={ta} tb={tb} batch={batch}"),
            down(&c, ec),
            k as f32,
        ));
    }
    out
}

#[test]
fn gpu_compute_matches_cpu_compute() {
    if !gpu_enabled("gpu_compute_matches_cpu_compute") {
        return;
    }
    for d in TYPES {
        let gpu = outputs(&CudaCompute::new(0, d).unwrap());
        let cpu = outputs(&parbench::compute::cpu::CpuCompute::new(d, 2).unwrap());
        for ((name, g, scale), (_, c, _)) in gpu.iter().zip(&cpu) {
            // Both round their outputs to the storage type: allow a unit on each side.
            let t = 2.0 * rtol(d);
            if let Some(m) = mismatch(g, c, &[], t, t * *scale as f64) {
                panic!("{name} ({d}): CUDA vs CPU: {m}");
            }
        }
    }
}

#[test]
fn gpu_compute_loads_the_cubin_of_its_architecture() {
    if !gpu_enabled("gpu_compute_loads_the_cubin_of_its_architecture") {
        return;
    }
    let dev = CudaCompute::new(0, DType::F32).unwrap();
    let (major, minor) = dev.gpu().compute_capability().unwrap();
    println!(
        "kernels on {} (sm_{major}{minor}): {}",
        dev.name(),
        dev.kernel_image()
    );
    assert_eq!(
        dev.kernel_image(),
        format!("CUBIN sm_{major}{minor}"),
        "the driver should load NVRTC's machine code, not fall back to PTX"
    );
}

#[test]
fn gpu_alloc_is_refused_while_capturing() {
    if !gpu_enabled("gpu_alloc_is_refused_while_capturing") {
        return;
    }
    let dev = CudaCompute::new(0, DType::F32).unwrap();
    let r = CapturedLoop::capture(dev.gpu(), 1, || dev.gpu().alloc(64).map(|_| ()));
    let e = r.err().expect("an allocation inside a capture is an error");
    assert!(e.to_string().contains("capturing"), "{e}");
    // The stream is usable again afterwards.
    let (x, _) = put(&dev, &values(8, 1));
    assert_eq!(x.len(), 32);
}
