//! GFLOP/s of the shard GEMMs of a tensor-parallel block through
//! `CpuCompute` (the device bench-layers and bench-pipeline compute on), one
//! line per shape: the Rust side of `scripts/compare-gemm.sh`.
//!
//! `cargo run --release -p bench-layers --example gemm_rate -- [--threads N]
//! [--samples S] [--dtype float|half|bfloat16] [--list] [--only NAME]
//! PRESET:TP:TOKENS...`
//!
//! Each spec names a preset, a tensor-parallel degree and the tokens of one
//! block call; its shapes are the four forward projections of one rank's
//! shard, as `TpBlock::forward` issues them (row-major `C = A B`, `m` =
//! tokens): `qkv` (n = 3h/t, k = h), `proj` (n = h, k = h/t), `mlp1`
//! (n = ffn/t, k = h), `mlp2` (n = h, k = ffn/t).
//!
//! Timing: two untimed calls, then `S` samples; each sample times enough
//! back-to-back calls to last about 50 ms (one call for the large shapes),
//! and the line gives the median, min and max sample in GFLOP/s (2 m n k per
//! call). `--list` prints the shapes only (`name m n k`), so that the numpy
//! side times exactly the same ones; `--only NAME` times that shape alone.

use parbench::comm::DType;
use parbench::compute::cpu::CpuCompute;
use parbench::compute::{Compute, Gemm};
use parbench::layers::{BlockConfig, BlockShape, Mode};
use parbench::model::Preset;
use std::time::{Duration, Instant};

/// Wall time one sample aims at, so short products are not timed one by one.
const SAMPLE_TARGET: Duration = Duration::from_millis(50);

struct Args {
    threads: usize,
    samples: usize,
    dtype: DType,
    list: bool,
    only: Option<String>,
    specs: Vec<String>,
}

/// One shard product: its name and (m, n, k).
struct Shape {
    name: String,
    m: usize,
    n: usize,
    k: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        threads: CpuCompute::threads_per_rank(1),
        samples: 5,
        dtype: DType::F32,
        list: false,
        only: None,
        specs: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--threads" => {
                a.threads = value("--threads")?
                    .parse()
                    .map_err(|_| "--threads: expected a whole number".to_string())?
            }
            "--samples" => {
                a.samples = value("--samples")?
                    .parse()
                    .ok()
                    .filter(|&s| s >= 1)
                    .ok_or("--samples: expected a whole number >= 1")?
            }
            "--dtype" => {
                a.dtype = value("--dtype")?
                    .parse()
                    .map_err(|e| format!("--dtype: {e}"))?
            }
            "--list" => a.list = true,
            "--only" => a.only = Some(value("--only")?),
            s if s.starts_with('-') => return Err(format!("unknown flag {s}")),
            s => a.specs.push(s.to_string()),
        }
    }
    if a.specs.is_empty() {
        return Err("expected at least one PRESET:TP:TOKENS (e.g. tiny:2:128)".into());
    }
    Ok(a)
}

/// The four forward projections of one rank's shard of `spec`.
fn shapes_of(spec: &str) -> Result<Vec<Shape>, String> {
    let bad = || format!("{spec}: expected PRESET:TP:TOKENS (e.g. tiny:2:128)");
    let mut parts = spec.split(':');
    let (Some(name), Some(tp), Some(tokens), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let preset = Preset::by_name(name).ok_or_else(|| {
        format!(
            "{spec}: unknown preset '{name}' (expected one of {})",
            Preset::names().join(", ")
        )
    })?;
    let tp: usize = tp.parse().map_err(|_| bad())?;
    let tokens: usize = tokens.parse().ok().filter(|&t| t >= 1).ok_or_else(bad)?;
    let size = |v: u64| usize::try_from(v).map_err(|_| format!("{spec}: preset too large"));
    let cfg = BlockConfig {
        shape: BlockShape {
            hidden: size(preset.hidden)?,
            heads: size(preset.heads)?,
            ffn: size(preset.ffn)?,
            seq: tokens,
            batch: 1,
        },
        mode: Mode::Forward,
        decode: false,
        seq_parallel: false,
    };
    cfg.validate(tp).map_err(|e| format!("{spec}: {e}"))?;
    let (h, f, m) = (cfg.shape.hidden, cfg.shape.ffn, cfg.tokens());
    let shape = |part: &str, n, k| Shape {
        name: format!("{}_tp{tp}_{part}", preset.name),
        m,
        n,
        k,
    };
    Ok(vec![
        shape("qkv", 3 * h / tp, h),
        shape("proj", h, h / tp),
        shape("mlp1", f / tp, h),
        shape("mlp2", h, f / tp),
    ])
}

/// A deterministic operand in [-0.5, 0.5).
fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// Samples of `s`'s GFLOP/s on `dev`, sorted.
fn time_shape(dev: &CpuCompute, s: &Shape, samples: usize) -> Result<(Vec<f64>, usize), String> {
    let e = |e: parbench::compute::ComputeError| format!("{}: {e}", s.name);
    let g = Gemm::dense(s.m, s.n, s.k);
    let mut a = dev.alloc(s.m * s.k).map_err(e)?;
    let mut b = dev.alloc(s.k * s.n).map_err(e)?;
    let mut c = dev.alloc(s.m * s.n).map_err(e)?;
    dev.upload(&values(s.m * s.k), &mut a).map_err(e)?;
    dev.upload(&values(s.k * s.n), &mut b).map_err(e)?;
    dev.gemm(&g, &a, &b, &mut c).map_err(e)?;
    let t0 = Instant::now();
    dev.gemm(&g, &a, &b, &mut c).map_err(e)?;
    let one = t0.elapsed().max(Duration::from_nanos(1));
    let calls = (SAMPLE_TARGET.as_secs_f64() / one.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let mut rates = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        for _ in 0..calls {
            dev.gemm(&g, &a, &b, &mut c).map_err(e)?;
        }
        rates.push(g.flops() * calls as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    Ok((rates, calls))
}

fn run(a: &Args) -> Result<(), String> {
    let mut shapes = Vec::new();
    for spec in &a.specs {
        shapes.extend(shapes_of(spec)?);
    }
    if let Some(only) = &a.only {
        shapes.retain(|s| &s.name == only);
        if shapes.is_empty() {
            return Err(format!("--only {only}: no such shape in the specs"));
        }
    }
    if a.list {
        for s in &shapes {
            println!("{} {} {} {}", s.name, s.m, s.n, s.k);
        }
        return Ok(());
    }
    let dev = CpuCompute::new(a.dtype, a.threads).map_err(|e| e.to_string())?;
    println!(
        "# {} | {} storage, {}",
        dev.name(),
        a.dtype,
        dev.gemm_math()
    );
    println!("# name m n k gflops_median gflops_min gflops_max samples calls_per_sample");
    for s in &shapes {
        let (r, calls) = time_shape(&dev, s, a.samples)?;
        println!(
            "{} {} {} {} {:.1} {:.1} {:.1} {} {calls}",
            s.name,
            s.m,
            s.n,
            s.k,
            parbench::stats::median(&mut r.clone()).unwrap_or(0.0),
            r[0],
            r[r.len() - 1],
            r.len()
        );
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gemm_rate: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("gemm_rate: {e}");
        std::process::exit(2);
    }
}
