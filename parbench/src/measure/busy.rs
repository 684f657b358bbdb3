//! A compute stand-in of known length on a host core: a fixed count of
//! dependent multiply-adds, its rate calibrated once on this core. The
//! work is fixed, not a wait on the clock, so a thread that loses its core
//! takes longer, as real compute would.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Steps per calibration sample: long enough to dwarf the clock's reads.
const SAMPLE_STEPS: u64 = 1 << 16;
/// How long calibration samples the rate.
const CALIBRATION: Duration = Duration::from_millis(20);

/// This core's rate of the stand-in's steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BusyLoop {
    /// Steps per microsecond, the fastest sample's (the one least disturbed).
    pub steps_per_us: f64,
}

impl BusyLoop {
    /// Samples the rate for [`CALIBRATION`] on the calling thread.
    pub fn calibrate() -> BusyLoop {
        let start = Instant::now();
        let mut best = 0f64;
        while start.elapsed() < CALIBRATION || best == 0.0 {
            let t0 = Instant::now();
            busy_steps(SAMPLE_STEPS);
            let us = t0.elapsed().as_secs_f64() * 1e6;
            if us > 0.0 {
                best = best.max(SAMPLE_STEPS as f64 / us);
            }
        }
        BusyLoop { steps_per_us: best }
    }

    /// The steps that take `us` microseconds at this rate (0 for none).
    pub fn steps_for(&self, us: f64) -> u64 {
        if us.is_finite() && us > 0.0 {
            (us * self.steps_per_us).round() as u64
        } else {
            0
        }
    }
}

/// `steps` dependent multiply-adds (a linear congruential generator's),
/// each through `black_box`: unhidden, an optimiser merges several steps
/// into one multiply-add, and a step is no longer one unit of work.
pub fn busy_steps(steps: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..steps {
        x = black_box(x)
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
    }
    black_box(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_positive_and_scales_the_steps() {
        let b = BusyLoop::calibrate();
        assert!(b.steps_per_us > 0.0 && b.steps_per_us.is_finite(), "{b:?}");
        assert_eq!(b.steps_for(0.0), 0);
        assert_eq!(b.steps_for(f64::NAN), 0);
        let fixed = BusyLoop {
            steps_per_us: 500.0,
        };
        assert_eq!(fixed.steps_for(10.0), 5000);
    }

    #[test]
    fn the_steps_are_work_not_a_constant() {
        assert_ne!(busy_steps(1), busy_steps(2));
        assert_eq!(busy_steps(0), 0x9E37_79B9_7F4A_7C15);
    }
}
