//! The machine's compute speed, measured beside a suite's own figures: one
//! fixed f32 matrix product on every allowed CPU at once, so that a gate
//! can tell a slower machine (a VM whose neighbours took its cores, a
//! lower clock) from slower code.
//!
//! The product calls the gemm crate directly, at a fixed shape, on one
//! thread per CPU, and so none of parbench's own compute code (the blocks'
//! products, their packing, their threads) is inside it: a change there
//! moves a suite's figures and not this one. What moves both is the
//! machine, or the gemm crate itself (its version is pinned in Cargo.lock;
//! an upgrade moves this reference like a machine would, and the record's
//! `kernel` names only the kernel set).

use crate::compute::cpu::GemmKernels;
use crate::measure::placement::{allowed_cpus, bind_slot};
use std::time::Instant;

/// The product's m = n = k: three 1 MiB f32 matrices, 268 MFLOP, a few
/// milliseconds a core; in the caches' range of the blocks' own products.
pub const REFERENCE_DIM: usize = 512;

/// Timed products per CPU at each sample (after one untimed).
const REPS: usize = 5;

/// The fixed product's timings over a run.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeReference {
    /// What runs: shape, kernel set and threads, in words; two records are
    /// comparable only when it is the same.
    pub kernel: String,
    /// CPUs that run it at once (one thread bound to each).
    pub threads: usize,
    /// One per sample: the slowest CPU's median product, microseconds.
    pub samples_us: Vec<f64>,
}

impl ComputeReference {
    /// A reference on every CPU this process may run on, nothing timed yet.
    pub fn on_allowed_cpus() -> Self {
        let threads = allowed_cpus().len().max(1);
        let kernels = GemmKernels::detect().map_or_else(|e| e.to_string(), |k| k.name().into());
        ComputeReference {
            kernel: format!(
                "gemm crate f32 {d}x{d}x{d}, {kernels}, one product per CPU on {threads} CPU(s) at once",
                d = REFERENCE_DIM
            ),
            threads,
            samples_us: Vec::new(),
        }
    }

    /// Times one sample: every thread its own product, [`REPS`] times after
    /// one untimed; the slowest thread's median is the sample.
    pub fn sample(&mut self) {
        let allowed = allowed_cpus();
        let medians: Vec<f64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.threads)
                .map(|slot| {
                    let allowed = &allowed;
                    s.spawn(move || {
                        bind_slot(slot, allowed, "compute reference");
                        product_median_us()
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        if let Some(slowest) = medians.into_iter().reduce(f64::max) {
            self.samples_us.push(slowest);
        }
    }

    /// The median sample, microseconds.
    pub fn median_us(&self) -> Option<f64> {
        crate::stats::median(&mut self.samples_us.clone())
    }

    /// One CPU's rate at the median sample, GFLOP/s.
    pub fn gflops_per_cpu(&self) -> Option<f64> {
        let flops = 2.0 * (REFERENCE_DIM as f64).powi(3);
        self.median_us().map(|us| flops / (us * 1e3))
    }

    /// The record in run.json (`extra.compute_reference`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "kernel": self.kernel,
            "threads": self.threads,
            "samples_us": self.samples_us,
            "median_us": self.median_us(),
            "gflops_per_cpu": self.gflops_per_cpu(),
        })
    }

    /// Reads a record written by [`Self::to_json`] (`None` when it is not one).
    pub fn from_json(v: &serde_json::Value) -> Option<Self> {
        Some(ComputeReference {
            kernel: v.get("kernel")?.as_str()?.to_string(),
            threads: v.get("threads")?.as_u64()? as usize,
            samples_us: v
                .get("samples_us")?
                .as_array()?
                .iter()
                .filter_map(serde_json::Value::as_f64)
                .filter(|x| x.is_finite() && *x > 0.0)
                .collect(),
        })
    }

    /// The samples' spread, (max - min) / median: the reference's own noise
    /// within the run.
    pub fn spread(&self) -> Option<f64> {
        let med = self.median_us()?;
        let (lo, hi) = self
            .samples_us
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        Some((hi - lo) / med)
    }
}

/// One thread's median of [`REPS`] fixed products, microseconds.
fn product_median_us() -> f64 {
    let n = REFERENCE_DIM;
    // Inputs of small integers and their halves: every product is exact,
    // and never a denormal or an infinity that would time another path.
    let a: Vec<f32> = (0..n * n).map(|i| ((i % 7) as f32) * 0.5).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i % 5) as f32) - 2.0).collect();
    let mut c = vec![0f32; n * n];
    let mut times: Vec<f64> = (0..=REPS)
        .map(|_| {
            let t = Instant::now();
            product(n, &a, &b, &mut c);
            t.elapsed().as_secs_f64() * 1e6
        })
        .skip(1)
        .collect();
    std::hint::black_box(&c);
    crate::stats::median(&mut times).unwrap_or(f64::NAN)
}

/// `c = a b` for row-major n x n matrices, on the calling thread.
fn product(n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() == n * n && b.len() == n * n && c.len() == n * n);
    // SAFETY: the three slices hold n x n elements each (checked above),
    // row-major with row stride n and column stride 1; `c` is a unique
    // borrow, so it aliases neither input.
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            n as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_product_is_the_product() {
        let n = 4;
        let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..16).map(|i| (i % 3) as f32 - 1.0).collect();
        let mut c = vec![f32::NAN; 16];
        product(n, &a, &b, &mut c);
        for i in 0..n {
            for j in 0..n {
                let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
                assert_eq!(c[i * n + j], want, "c[{i}][{j}]");
            }
        }
    }

    #[test]
    fn a_sample_per_call_and_the_record_reads_back() {
        let mut r = ComputeReference::on_allowed_cpus();
        assert!(r.median_us().is_none());
        r.sample();
        r.sample();
        assert_eq!(r.samples_us.len(), 2);
        assert!(r.samples_us.iter().all(|&us| us.is_finite() && us > 0.0));
        assert!(r.gflops_per_cpu().is_some_and(|g| g > 0.0));
        let back = ComputeReference::from_json(&r.to_json()).unwrap();
        assert_eq!(back, r);
        assert!(r.kernel.contains("512x512x512"));
    }
}
