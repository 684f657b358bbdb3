//! parbench: measure how the wire between accelerators shapes distributed
//! training and inference, and hold every measurement against the analytical
//! model that predicts it.
//!
//! The library holds everything the binaries share; it never parses a
//! command line and never prints tables (binaries do). The modules, which
//! way their dependencies point, and the contracts between the parts are
//! in the repository's `docs/architecture.md`; the records it writes in
//! `docs/records.md`.

pub mod comm;
pub mod compute;
pub mod error_line;
pub mod files;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod launch;
pub mod layers;
pub mod limits;
pub mod measure;
pub mod model;
pub mod pipeline;
pub mod progress;
pub mod published;
pub mod rendezvous;
pub mod results;
pub mod schedule;
pub mod seed;
pub mod stats;
pub mod term;
pub mod units;
pub mod vocab;
