//! What bench-collectives says on a terminal while it measures (through
//! `parbench::progress`, quiet elsewhere): before the wire's measurement,
//! which takes seconds and prints nothing, a line saying what it measures
//! and about how long it took the last time on this wire; during it, a
//! seconds counter; in a sweep, which size of how many runs now.

use parbench::progress;
use parbench::units;
use std::path::Path;

/// The seconds the last run on this backend and world in `out` spent
/// measuring the wire (run.json's `wire_measure_s`), if one did.
fn last_wire_seconds(out: &Path, backend: &str, world: usize) -> Option<f64> {
    let runs = parbench::results::read_runs(out).ok()?;
    runs.iter()
        .rev()
        .filter(|r| r.suite == "collectives" && r.backend == backend && r.world == world)
        .find_map(|r| r.extra.get("wire_measure_s").and_then(|v| v.as_f64()))
        .filter(|s| s.is_finite() && *s >= 0.0)
}

/// The line before the wire's measurement, and the counter that runs
/// through it (dropped when it ends). Rank 0 only.
pub fn wire_starts(out: &Path, backend: &str, world: usize) -> progress::Ticker {
    if progress::enabled() {
        let how_long = match last_wire_seconds(out, backend, world) {
            Some(s) => format!(
                "about {s:.0} s, as the last run on this wire in {} took",
                out.display()
            ),
            None => "no earlier run on this wire in the results folder to say how long".to_string(),
        };
        progress::note(&format!(
            "bench-collectives: measuring the {backend} wire on {world} ranks before the sweep (its ceiling at each working set, latency, the cores' state, noise): {how_long}"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_last_matching_runs() {
        let dir = std::env::temp_dir().join(format!("pb-progress-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(last_wire_seconds(&dir, "local", 2), None, "no run.json");
        let run = |backend: &str, world: usize, s: f64| {
            let mut m =
                parbench::results::RunMeta::start("collectives", &format!("r{s}"), backend, world);
            m.extra.insert("wire_measure_s".into(), s.into());
            parbench::results::record_run(&dir, &m).unwrap();
        };
        run("local", 2, 14.0);
        run("local", 2, 16.0);
        run("tcp", 2, 9.0);
        assert_eq!(last_wire_seconds(&dir, "local", 2), Some(16.0));
        assert_eq!(last_wire_seconds(&dir, "tcp", 2), Some(9.0));
        assert_eq!(last_wire_seconds(&dir, "local", 4), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
