//! One size of `bench-collectives cp-ring`: a row of cp-ring.csv.

use super::Record;
use serde::{Deserialize, Serialize};

/// One size of the context-parallel ring: its exchange alone, its compute
/// stand-in alone and the two overlapped, each per ring pass (C-1 steps).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpRingRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    pub world: usize,
    /// The block each rank sends (and receives) at each step.
    pub bytes: u64,
    /// Steps per ring pass: world - 1.
    pub steps: u64,
    pub iters: u64,
    /// `--compute-us` as given: `auto`, or microseconds.
    pub stand_in: String,
    /// The compute stand-in asked per step, us (`--compute-us`, or the
    /// exchange alone's step under `auto`).
    pub compute_step_us: f64,
    /// One pass of sendrecv steps alone, us.
    pub exchange_us: f64,
    /// One pass of the compute stand-in alone, us.
    pub compute_us: f64,
    /// One pass with each step's exchange beside its compute, us.
    pub overlapped_us: f64,
    pub overlapped_p50_us: f64,
    pub overlapped_p99_us: f64,
    /// (exchange + compute - overlapped) / exchange: the exchange's share
    /// hidden behind compute (1 all of it, 0 none; NaN: no exchange time).
    /// Never below 0 (then `lost_us` says by how much the overlap lost),
    /// never above 1 (an overlapped pass faster than both alone is noise).
    pub hidden: f64,
    /// overlapped - (exchange + compute) where the overlapped pass took
    /// longer than the two back to back, else 0, us.
    pub lost_us: f64,
    /// `bytes` / the exchange alone's step time, GB/s (sendrecv's busbw).
    pub busbw_gbps: f64,
    /// The alpha-beta model's pass: steps x sendrecv at `bytes`, us.
    pub model_us: f64,
    /// The wire's ceiling at this working set, GB/s.
    pub ceiling_gbps: f64,
    /// Wrong bytes of the blocks every rank collected, summed over ranks.
    pub wrong: u64,
}

impl Record for CpRingRow {
    const FILE: &'static str = "cp-ring.csv";
    const MAY_BE_NAN: &'static [&'static str] = &["model_us", "ceiling_gbps", "hidden"];
    fn key(&self) -> String {
        format!(
            "{}/{}/np{}/{}/c{}",
            self.backend, self.wire, self.world, self.bytes, self.stand_in
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}
