//! The CUDA compute device (feature `cuda`).
