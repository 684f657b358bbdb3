//! The CPU compute device (gemm crate).
