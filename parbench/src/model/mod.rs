//! The analytical model: alpha-beta costs per algorithm, bus-bandwidth
//! factors, tensor-parallel traffic, bubble fractions, the schedule simulator, fits.

pub mod sim;
