//! The reduction kernels every collective runs (`acc op= src`), in bytes of
//! one operand per second: `reduce_bytes` sum of f32 and bf16 slices at sizes
//! that sit in L2, in L3 and in memory, beside the per-element
//! `Element::combine` loop they replace, to show what vectorising buys.
//!
//! `cargo bench -p parbench --bench reduce -- --warm-up-time 1 --measurement-time 2`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use parbench::comm::{reduce_bytes, DType, Element, ReduceOp};
use std::hint::black_box;

const SIZES: [(usize, &str); 3] = [(64 << 10, "64KiB"), (1 << 20, "1MiB"), (16 << 20, "16MiB")];

/// Per-element loop through `Element::combine`, with the operator passed at
/// run time (what a collective would do without the dedicated kernels).
fn combine_loop<T: Element>(acc: &mut [T], src: &[T], op: ReduceOp) {
    for (a, &b) in acc.iter_mut().zip(src) {
        *a = T::combine(*a, b, black_box(op));
    }
}

fn bench_type<T: Element>(c: &mut Criterion, dtype: DType) {
    let mut group = c.benchmark_group(format!("reduce_sum_{}", dtype.name()));
    for (bytes, label) in SIZES {
        let n = bytes / dtype.size();
        let src: Vec<T> = (0..n).map(|i| T::from_f64((i % 7) as f64)).collect();
        let mut acc: Vec<T> = (0..n).map(|i| T::from_f64((i % 5) as f64)).collect();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::new("reduce_bytes", label), &bytes, |b, _| {
            let src_bytes: &[u8] = bytemuck::cast_slice(&src);
            let acc_bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut acc);
            b.iter(|| {
                reduce_bytes(
                    black_box(&mut *acc_bytes),
                    black_box(src_bytes),
                    dtype,
                    ReduceOp::Sum,
                )
            });
        });
        group.bench_with_input(BenchmarkId::new("combine_loop", label), &bytes, |b, _| {
            b.iter(|| combine_loop(black_box(&mut acc[..]), black_box(&src[..]), ReduceOp::Sum));
        });
    }
    group.finish();
}

fn kernels(c: &mut Criterion) {
    bench_type::<f32>(c, DType::F32);
    bench_type::<bf16>(c, DType::BF16);
}

criterion_group!(benches, kernels);
criterion_main!(benches);
