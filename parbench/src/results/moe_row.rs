//! One phase (dispatch or combine) of `bench-collectives moe`: a row of moe.csv.

use super::Record;
use serde::{Deserialize, Serialize};

/// One phase of one MoE exchange: a row of moe.csv.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    pub world: usize,
    /// `dispatch` or `combine`.
    pub phase: String,
    /// Tokens per rank.
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    pub topk: usize,
    /// `uniform` or `zipf:S`.
    pub routing: String,
    /// Groups (ranks) a token's experts may span; 0: no limit.
    pub node_limit: usize,
    /// Megatron-Core's capacity factor; NaN: no token dropped.
    pub capacity_factor: f64,
    /// The dispatched payload: `bf16` or `fp8` (combine is bf16).
    pub payload: String,
    /// `dedup` (one copy per rank) or `k` (one per expert).
    pub copies: String,
    /// Expert choices the capacity dropped, over every rank.
    pub dropped: u64,
    /// Mean bytes a rank sends in this phase (nccl-tests' alltoall size).
    pub bytes: u64,
    /// Largest bytes a rank receives over the mean.
    pub imbalance: f64,
    pub iters: u64,
    pub time_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Mean bytes sent per rank / time, GB/s.
    pub algbw_gbps: f64,
    /// algbw x (n-1)/n, nccl-tests' alltoall bus bandwidth.
    pub busbw_gbps: f64,
    /// Tokens of every rank through this phase per second.
    pub tokens_per_s: f64,
    /// Wrong bytes (dispatch) or tokens (combine), summed over ranks.
    pub wrong: u64,
    /// The model's all_to_all time at `bytes`, us.
    pub model_us: f64,
    /// The wire's ceiling at this working set, GB/s.
    pub ceiling_gbps: f64,
}

impl Record for MoeRow {
    const FILE: &'static str = "moe.csv";
    const MAY_BE_NAN: &'static [&'static str] = &["capacity_factor", "model_us", "ceiling_gbps"];
    fn key(&self) -> String {
        format!(
            "{}/{}/np{}/{}/T{}/H{}/E{}/k{}/{}/m{}/cf{}/{}/{}",
            self.backend,
            self.wire,
            self.world,
            self.phase,
            self.tokens,
            self.hidden,
            self.experts,
            self.topk,
            self.routing,
            self.node_limit,
            self.capacity_factor,
            self.payload,
            self.copies
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}
