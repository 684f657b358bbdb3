//! One ordered pair of ranks of `bench-collectives links`: a row of links.csv.

use super::Record;
use serde::{Deserialize, Serialize};

/// One ordered pair's figures: a row of links.csv.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    pub world: usize,
    pub from: usize,
    pub to: usize,
    /// Half the median 8-byte round trip, us.
    pub latency_us: f64,
    /// Bytes of each one-way and both-way message.
    pub bytes: u64,
    /// `from` -> `to` alone, GB/s.
    pub one_way_gbps: f64,
    /// Both directions at once: bytes moved each way per second, GB/s.
    pub both_ways_gbps: f64,
}

impl Record for LinkRow {
    const FILE: &'static str = "links.csv";
    fn key(&self) -> String {
        format!(
            "{}/{}/np{}/{}->{}/{}B",
            self.backend, self.wire, self.world, self.from, self.to, self.bytes
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}
