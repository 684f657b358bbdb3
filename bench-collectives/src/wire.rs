//! The wire's figures for this sweep's rows: the library's measurement
//! ([`parbench::measure::wire`]) over the rows of a [`SweepConfig`].

use crate::config::SweepConfig;
use parbench::comm::{CommResult, Communicator};
use parbench::measure::placement::Placement;
use parbench::measure::wire;

pub use parbench::measure::wire::{retransmits_since, WireFigures};

/// The largest working set any row of the sweep touches, bytes per rank.
pub fn largest_set(cfg: &SweepConfig, world: usize) -> u64 {
    wire::largest_set(&cfg.rows(), world)
}

/// The wire measured before the sweep, in the state of the cores a probe
/// finds now ([`wire::measure_wire_in_one_state`]). Every rank calls it.
pub fn measure_wire_in_one_state<C: Communicator>(
    comm: &mut C,
    cfg: &SweepConfig,
    placement: &Placement,
) -> CommResult<WireFigures> {
    wire::measure_wire_in_one_state(comm, &cfg.rows(), placement)
}
