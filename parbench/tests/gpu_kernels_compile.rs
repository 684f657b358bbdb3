//! The NVRTC kernels compile for every storage type, as the CUBIN of an
//! architecture (what the driver loads as it is) and as PTX (the fallback),
//! and the probe accepts this NVRTC. Needs NVRTC only (no GPU, no driver):
//! runs wherever libnvrtc loads, and says it skipped where it does not (as
//! in CI without CUDA).
#![cfg(feature = "cuda")]

use parbench::comm::DType;
use parbench::compute::cuda::{compile_kernels, image_plan, nvrtc_archs, nvrtc_version, ImageKind};
use parbench::gpu::{probe, Lib};

/// Whether this is the GPU check (scripts/gpu-check.sh), where a missing
/// NVRTC is a failure, not a skip.
fn gpu_check() -> bool {
    std::env::var("PARBENCH_GPU").is_ok_and(|v| v == "1")
}

#[test]
fn gpu_kernels_compile_with_nvrtc() {
    if let Err(e) = probe::probe(Lib::Nvrtc) {
        assert!(!gpu_check(), "PARBENCH_GPU=1 but {e}");
        eprintln!("skipped: {e}");
        return;
    }
    let archs = nvrtc_archs().unwrap();
    eprintln!("NVRTC {} compiles for {archs:?}", nvrtc_version().unwrap());
    // Hopper (the H200) when this NVRTC has it, else the newest it has.
    let arch = if archs.contains(&90) {
        90
    } else {
        *archs.last().expect("NVRTC lists architectures")
    };
    let plan = image_plan(arch, &archs);
    assert_eq!(plan, vec![(ImageKind::Cubin, arch), (ImageKind::Ptx, arch)]);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let cubin = compile_kernels(dtype, ImageKind::Cubin, arch)
            .unwrap_or_else(|e| panic!("{dtype} CUBIN sm_{arch}: {e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{dtype}: a CUBIN is an ELF file");
        // e_machine (bytes 18-19, little-endian) is EM_CUDA, 190.
        assert_eq!(u16::from_le_bytes([cubin[18], cubin[19]]), 190, "{dtype}");
        let ptx = compile_kernels(dtype, ImageKind::Ptx, arch)
            .unwrap_or_else(|e| panic!("{dtype} PTX compute_{arch}: {e}"));
        assert_eq!(ptx.last(), Some(&0), "{dtype}: PTX ends in its NUL");
        let text = String::from_utf8_lossy(&ptx);
        assert!(
            text.contains(&format!(".target sm_{arch}")),
            "{dtype}: PTX for compute_{arch}"
        );
        for kernel in ["pb_add_bias", "pb_softmax", "pb_scale_matrix"] {
            assert!(text.contains(kernel), "{dtype}: {kernel} in the PTX");
        }
    }
}

#[test]
fn an_architecture_nvrtc_lacks_is_one_line() {
    if let Err(e) = probe::probe(Lib::Nvrtc) {
        assert!(!gpu_check(), "PARBENCH_GPU=1 but {e}");
        eprintln!("skipped: no NVRTC");
        return;
    }
    let e = compile_kernels(DType::F32, ImageKind::Cubin, 1).unwrap_err();
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(msg.contains("sm_1"), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
}
