//! Which wire joins the GPUs of one process (NVLink, PCIe, host).

use cudarc::driver::{result as cu, sys as cusys};

/// The wire between GPUs of one process: NVLink when every pair has native
/// peer atomics (which PCIe peer-to-peer lacks), `pcie` with plain peer
/// access, `host` without it, `local` for one GPU.
pub(super) fn local_wire(ordinals: &[usize]) -> String {
    if ordinals.len() < 2 {
        return "local".into();
    }
    let mut all_p2p = true;
    let mut all_atomic = true;
    for &a in ordinals {
        for &b in ordinals {
            if a == b {
                continue;
            }
            let (Ok(da), Ok(db)) = (cu::device::get(a as i32), cu::device::get(b as i32)) else {
                return "unknown".into();
            };
            let mut v = 0;
            // SAFETY: valid devices and out-pointer.
            let ok = unsafe {
                cusys::cuDeviceGetP2PAttribute(
                    &mut v,
                    cusys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                    da,
                    db,
                )
            } == cusys::CUresult::CUDA_SUCCESS;
            all_p2p &= ok && v == 1;
            let mut atomic = 0;
            // SAFETY: as above.
            let ok = unsafe {
                cusys::cuDeviceGetP2PAttribute(
                    &mut atomic,
                    cusys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                    da,
                    db,
                )
            } == cusys::CUresult::CUDA_SUCCESS;
            all_atomic &= ok && atomic == 1;
        }
    }
    match (all_p2p, all_atomic) {
        (true, true) => "nvlink",
        (true, false) => "pcie",
        _ => "host",
    }
    .into()
}
