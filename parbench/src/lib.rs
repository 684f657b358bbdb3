//! parbench: measure how the wire between accelerators shapes distributed
//! training and inference, and hold every measurement against the analytical
//! model that predicts it.
//!
//! The library holds everything the binaries share; it never parses flags
//! and never prints tables (binaries do). See `DESIGN.md` in the shared
//! folder for the contracts between the parts.

pub mod comm;
pub mod compute;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod launch;
pub mod layers;
pub mod limits;
pub mod measure;
pub mod model;
pub mod pipeline;
pub mod published;
pub mod results;
pub mod schedule;
pub mod seed;
pub mod stats;
pub mod term;
pub mod units;
