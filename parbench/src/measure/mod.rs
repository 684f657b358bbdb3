//! Warm-up and timed loops, per-rank timings, histograms, cross-rank statistics.
