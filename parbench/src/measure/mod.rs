//! Warm-up and timed loops, per-rank timings, histograms, cross-rank statistics,
//! and the wire-ceiling measurements every bench puts its figures against.
//!
//! Layers, each with one job:
//! - [`timing`]: runs warm-up and timed iterations of one operation on one
//!   rank, with one clock pair around the whole loop (nccl-tests' time) and
//!   one read per iteration of [`clock::IterClock`] (for percentiles and
//!   stragglers).
//! - [`combine`]: brings every rank's timings to every rank through the
//!   communicator itself and reduces them: the reported time (`-a`), the
//!   per-iteration times (each the slowest rank's), percentiles, stragglers.
//! - [`ceiling`]: what the wire can do at best, measured in the same run
//!   (memory-copy bandwidth, one-stream throughput, ping-pong latency,
//!   reduction-kernel throughput).
//! - [`compute_reference`]: the machine's compute speed in the same run
//!   (one fixed matrix product on every CPU at once), beside the figures
//!   of a suite whose times are compute.
//! - [`placement`]: one CPU per rank, so the scheduler does not stack the
//!   ranks of a job on one core while another idles.
//! - [`ladder`]: copy, reduction and stream bandwidth at a ladder of
//!   working sets.
//! - [`wire`]: the wire's figures a sweep's rows are held against, measured
//!   once before it (the ceiling ladder, alpha, beta and gamma).
//!
//! Nothing here prints: binaries do.

pub mod busy;
pub mod ceiling;
pub mod clock;
pub mod clock_sync;
pub mod combine;
pub mod compute_reference;
pub mod ladder;
pub mod noise;
pub mod placement;
pub mod timing;
pub mod wire;

pub use ceiling::{
    exchange_latency, memcpy_bandwidth, ping_pong, ping_pong_latency, reduce_throughput,
    round_trip, stream_throughput, Ceiling, PingPong,
};
pub use combine::{
    gather_f64, gather_f64_any_len, Average, LoopStats, StragglerTally, StragglerVerdict,
};
pub use compute_reference::ComputeReference;
pub use ladder::{
    copy_ladder, reduce_ladder, stream_ladder, working_sets, Ladder, Rung, StreamLadders,
};
pub use timing::{time_loop, LoopSpec, RankTimes};

#[cfg(test)]
mod tests;
