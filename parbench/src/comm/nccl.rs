//! Backend `nccl` (feature `cuda`).
