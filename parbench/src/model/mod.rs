//! The analytical model: alpha-beta costs per algorithm, bus-bandwidth
//! factors, tensor-parallel traffic, bubble fractions, the schedule simulator, fits.
//!
//! Pure functions with no I/O: the benches call them per row (`model_us`,
//! `busbw_gbps`, the fit table), `report` draws them beside the
//! measurements, and the planner composes them. Every formula names its
//! source; `docs/model.md` lists them all with their units.
//!
//! - [`alpha_beta`]: the cost of each collective algorithm, [`predict`].
//! - [`busbw`]: nccl-tests' algbw and busbw.
//! - [`mod@fit`]: the least-squares alpha-beta fit of measured times.
//! - [`tensor_parallel`]: Megatron's per-layer, per-token traffic.
//! - [`bubble`]: pipeline bubble closed forms and microbatch counts.
//! - [`presets`]: named transformer shapes.
//! - [`sim`]: the schedule simulator (makespan, idle time, bubble of any schedule).

pub mod alpha_beta;
pub mod bubble;
pub mod busbw;
pub mod fit;
pub mod presets;
pub mod sim;
pub mod tensor_parallel;

pub use alpha_beta::{predict, terms, AlphaBetaTerms, LinkParams};
pub use bubble::{
    bubble_fraction_of_ideal, bubble_fraction_of_step, microbatches_for_utilisation,
    BubbleSchedule, PassTimes,
};
pub use busbw::{algbw_gbps, busbw_factor, busbw_gbps};
pub use fit::{fit, AlphaBetaFit, FitError};
pub use presets::Preset;
pub use tensor_parallel::{
    transfer_seconds, RingFactor, TpMode, TpTraffic, NETWORK_REFERENCE_GBPS, NVLINK_REFERENCE_GBPS,
    WORKED_EXAMPLE_LAYERS,
};
