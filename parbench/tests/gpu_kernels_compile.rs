//! The NVRTC kernels compile for every storage type. Needs NVRTC only (no
//! GPU, no driver): runs wherever libnvrtc loads, and says it skipped where
//! it does not (as in CI without CUDA).
#![cfg(feature = "cuda")]

use parbench::comm::DType;
use parbench::gpu::{probe, Lib};

#[test]
fn gpu_kernels_compile_with_nvrtc() {
    if let Err(e) = probe::probe(Lib::Nvrtc) {
        eprintln!("skipped: {e}");
        return;
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        match parbench::compute::cuda::compile_kernels(dtype) {
            Ok(bytes) => assert!(bytes > 1000, "{dtype}: PTX of {bytes} bytes"),
            Err(e) => panic!("{dtype}: {e}"),
        }
    }
}
