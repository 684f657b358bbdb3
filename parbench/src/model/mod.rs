//! The analytical model: alpha-beta costs per algorithm, bus-bandwidth
//! factors, tensor-parallel traffic, bubble fractions, the schedule simulator, fits.
//!
//! Pure functions with no I/O: the benches call them per row (`model_us`,
//! `busbw_gbps`, the fit table), `report` draws them beside the
//! measurements, and the planner composes them. Every formula names its
//! source; `docs/model.md` lists them all with their units.
//!
//! - [`algo`]: [`ModelAlgo`], an algorithm name as the model reads it.
//! - [`alpha_beta`]: the cost of each collective algorithm, [`predict`].
//! - [`busbw`]: nccl-tests' algbw and busbw.
//! - [`mod@fit`]: the least-squares alpha-beta fit of measured times.
//! - [`tensor_parallel`]: Megatron's per-layer, per-token traffic.
//! - [`bubble`]: pipeline bubble closed forms and microbatch counts.
//! - [`presets`]: named transformer shapes.
//! - [`moe`]: mixture-of-experts shapes, their FLOPs and the all-to-all.
//! - [`context`]: context parallelism's exchange of keys and values.
//! - [`precision`]: FP8 linear layers as Transformer Engine runs them.
//! - [`footprint`]: FLOPs and memory of a step (for the planner).
//! - [`sim`]: the schedule simulator (makespan, idle time, bubble of any schedule).
//! - [`plan`]: the capacity planner, which composes all of the above.
//! - [`ladder`]: [`ladder::Ladder`], a bandwidth at a ladder of working
//!   sets, read at a row's own ([`ladder::working_set_bytes`]).
//!
//! ```
//! use parbench::comm::Collective;
//! use parbench::model::{self, LinkParams, RingFactor, TpTraffic, WORKED_EXAMPLE_LAYERS};
//!
//! // A bench row: predicted time and bus bandwidth of a ring all-reduce.
//! let link = LinkParams::from_gbps_us(46.0, 3.5);
//! let ring = model::ModelAlgo::of("ring");
//! let t = model::predict(Collective::AllReduce, &ring, 8, 1 << 20, &link).unwrap();
//! let busbw = model::busbw_gbps(Collective::AllReduce, 8, 1 << 20, t);
//! assert!(busbw > 0.0 && busbw < 46.0);
//!
//! // The worked example: 160 all-reduces of 0.5 MiB per token at TP = 8.
//! let w = TpTraffic::worked_example();
//! assert_eq!(w.calls_per_step(WORKED_EXAMPLE_LAYERS), 160);
//! let per_token = w.wire_bytes_per_step(WORKED_EXAMPLE_LAYERS, RingFactor::Exact);
//! assert_eq!(per_token, 140.0 * 1024.0 * 1024.0);
//!
//! // Pipeline: 8 stages need 63 microbatches to be busy 90% of the step.
//! assert_eq!(model::microbatches_for_utilisation(8, 1, 0.9), Some(63));
//! ```

pub mod algo;
pub mod alpha_beta;
pub mod bubble;
pub mod busbw;
pub mod context;
pub mod device;
pub mod fit;
pub mod footprint;
pub mod ladder;
pub mod moe;
pub mod opcost;
pub mod plan;
pub mod precision;
pub mod presets;
pub mod priced;
pub mod sim;
pub mod stack;
pub mod tensor_parallel;

pub use algo::ModelAlgo;
pub use alpha_beta::{
    predict, predict_textbook, terms, textbook_terms, AlphaBetaTerms, LinkParams,
};
pub use bubble::{
    bubble_fraction_of_ideal, bubble_fraction_of_step, microbatches_for_utilisation,
    BubbleSchedule, PassTimes,
};
pub use busbw::{algbw_gbps, busbw_factor, busbw_gbps};
pub use fit::{fit, AlphaBetaFit, FitError};
pub use presets::{Preset, SplitError};
pub use tensor_parallel::{
    transfer_seconds, RingFactor, TpMode, TpTraffic, NETWORK_REFERENCE_GBPS, NVLINK_REFERENCE_GBPS,
    WORKED_EXAMPLE_LAYERS,
};
