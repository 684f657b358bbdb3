//! Reading a results CSV (`results::read_rows`) of 10,000, 30,000 and
//! 100,000 collectives rows: the time per file and per row. Linear reading
//! keeps the time per row the same at every size (issue 52: each record
//! once counted the file's lines from its start, so 16,000 rows took
//! 18-30 s). A benchmark, not a timed test: its figures are read, never
//! asserted.
//!
//! `cargo bench -p parbench --bench read_rows -- --warm-up-time 1 --measurement-time 5`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use parbench::results::{append_rows, read_rows, CollectiveRow};
use std::hint::black_box;
use std::path::PathBuf;

const ROWS: [usize; 3] = [10_000, 30_000, 100_000];

/// A results folder holding `n` rows, as sweeps of 60 sizes append them.
fn folder(n: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "parbench-bench-read-rows-{n}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let rows: Vec<CollectiveRow> = (0..n)
        .map(|i| CollectiveRow {
            time_us: 1.0 + (i % 97) as f64,
            ..CollectiveRow::for_tests(&format!("collectives-run-{}", i / 60), 8 << (i % 60 % 24))
        })
        .collect();
    append_rows(&dir, &rows).expect("writing the rows");
    dir
}

fn bench_read_rows(c: &mut Criterion) {
    let mut group = c.benchmark_group("read_rows_collectives");
    group.sample_size(10);
    for n in ROWS {
        let dir = folder(n);
        let path = dir.join("collectives.csv");
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &path, |b, path| {
            b.iter(|| {
                let rows: Vec<CollectiveRow> = read_rows(black_box(path)).expect("reading");
                assert_eq!(rows.len(), n);
                rows
            })
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    group.finish();
}

criterion_group!(benches, bench_read_rows);
criterion_main!(benches);
