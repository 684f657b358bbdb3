//! What bench-collectives says on a terminal while it measures (through
//! `parbench::progress`, quiet elsewhere): before the wire's measurement,
//! which prints nothing, a line saying what it measures; during it, a
//! seconds counter; in a sweep, which size of how many runs now.

use parbench::progress;
use parbench::units;

/// The counter that runs through the wire's measurement (dropped when it
/// ends), after a line saying what it measures. Rank 0 only.
pub fn wire_starts(backend: &str, world: usize) -> progress::Ticker {
    if progress::enabled() {
        progress::note(&format!(
            "bench-collectives: measuring the {backend} wire on {world} ranks (its ceiling by working set, latency, noise)"
        ));
    }
    progress::Ticker::start("measuring the wire")
}

/// The live line before one row of a table is measured.
pub fn row_starts(table: &str, size: u64, index: usize, sizes: usize) {
    progress::show(&format!(
        "{table}: size {} of {sizes} ({})",
        index + 1,
        units::bytes(size as f64)
    ));
}
