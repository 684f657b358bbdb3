//! The NVRTC kernels compile for every storage type, as the CUBIN of an
//! architecture (what the driver loads as it is) and as PTX (the fallback),
//! for each architecture the GPU check targets, and the probe accepts this
//! NVRTC. Needs NVRTC only (no GPU, no driver): runs wherever libnvrtc
//! loads, and says it skipped where it does not (a machine without the
//! wheels of scripts/gpu-libs.sh), except in CI and on the GPU check.
#![cfg(feature = "cuda")]

use parbench::comm::DType;
use parbench::compute::cuda::{compile_kernels, image_plan, nvrtc_archs, nvrtc_version, ImageKind};
use parbench::gpu::{probe, Lib};

/// Whether a missing NVRTC is a failure, not a skip: on the GPU check
/// (scripts/gpu-check.sh sets PARBENCH_GPU=1) and in CI (.ci/run installs
/// the wheels and sets PARBENCH_REQUIRE_GPU_LIBS=1), where a skip would
/// hide a kernel that stopped compiling.
fn required() -> bool {
    ["PARBENCH_GPU", "PARBENCH_REQUIRE_GPU_LIBS"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

/// Ampere (A100) and Hopper (H100, H200): the GPUs the check is meant for,
/// so an NVRTC without them fails here rather than on the GPU machine.
const TARGETS: [u32; 2] = [80, 90];

#[test]
fn gpu_kernels_compile_with_nvrtc() {
    if let Err(e) = probe::probe(Lib::Nvrtc) {
        assert!(!required(), "NVRTC required here but {e}");
        eprintln!("skipped: {e}");
        return;
    }
    let archs = nvrtc_archs().unwrap();
    let version = nvrtc_version().unwrap();
    eprintln!("NVRTC {version} compiles for {archs:?}");
    // scripts/gpu-libs.sh's env.sh names the wheel it installed (12.9.86
    // for NVRTC 12.9): the one loaded must be it.
    if let Ok(wheel) = std::env::var("PARBENCH_NVRTC_VERSION") {
        assert!(
            wheel.starts_with(&format!("{version}.")),
            "loaded NVRTC {version}, installed {wheel}"
        );
    }
    let newest = *archs.last().expect("NVRTC lists architectures");
    let mut targets = TARGETS.to_vec();
    for arch in &targets {
        assert!(archs.contains(arch), "NVRTC {version} lacks sm_{arch}");
    }
    if !targets.contains(&newest) {
        targets.push(newest);
    }
    for &arch in &targets {
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
            for kernel in [
                "pb_add_bias",
                "pb_softmax",
                "pb_scale_matrix",
                "pb_amax",
                "pb_cast_e4m3",
            ] {
                assert!(text.contains(kernel), "{dtype}: {kernel} in the PTX");
            }
        }
    }
    let names: Vec<String> = targets.iter().map(|a| format!("sm_{a}")).collect();
    eprintln!(
        "NVRTC {version}: f32, f16, bf16 kernels compiled as CUBIN and PTX for {}",
        names.join(", ")
    );
}

#[test]
fn an_architecture_nvrtc_lacks_is_one_line() {
    if let Err(e) = probe::probe(Lib::Nvrtc) {
        assert!(!required(), "NVRTC required here but {e}");
        eprintln!("skipped: {e}");
        return;
    }
    let e = compile_kernels(DType::F32, ImageKind::Cubin, 1).unwrap_err();
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(msg.contains("sm_1"), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
}
