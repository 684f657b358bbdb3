//! When a model's figure counts as matching a measurement: bench-layers'
//! model warning.

/// A figure is priced well when model / measured lies within this share
/// of 1 either way.
pub const WITHIN: f64 = 0.25;

/// Whether `model / measured` is within [`WITHIN`] of 1.
pub fn priced_well(ratio: f64) -> bool {
    (ratio - 1.0).abs() <= WITHIN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_either_way() {
        assert!(priced_well(1.25) && priced_well(0.75) && priced_well(1.0));
        assert!(!priced_well(1.26) && !priced_well(0.74));
        assert!(!priced_well(f64::NAN));
    }
}
