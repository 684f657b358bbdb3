//! The reference a run's busbw is held against, in one line: on GPUs the
//! published figure for the detected system (or "no match"), on CPU wires
//! the ceiling measured in this run (no published figure applies there).

use crate::wire::WireFigures;
use parbench::comm::Communicator;
use parbench::published::{self, System};

/// The line for this run (rank 0 prints it in the header).
pub fn describe<C: Communicator>(comm: &C, wire: &WireFigures) -> String {
    if comm.backend() != "nccl" {
        return match (wire.ceiling.peak_gbps(), wire.ceiling.rungs.last()) {
            (Some(hi), Some(lo)) => format!(
                "CPU wire ({}): the ceiling measured in this run, {hi:.2} GB/s in cache .. {:.2} GB/s out of cache; published GPU figures do not apply",
                comm.wire(),
                lo.gbps
            ),
            _ => format!("CPU wire ({}): no ceiling measured (one rank), so no reference", comm.wire()),
        };
    }
    let sys = System {
        gpus: gpu_names(),
        fabric: fabric(),
        nic_gbit: published::nic_speeds_gbit(),
    };
    let table = published::table();
    let mut line = published::describe(&table, &sys, "all_reduce", comm.world());
    let nics = published::nic_rows(&table, &sys, "all_reduce");
    if !nics.is_empty() {
        line.push_str(&format!(
            "; per NIC ({} Gbit/s): {:.0}-{:.0} GB/s ({})",
            nics[0].nic_gbit, nics[0].busbw_lo_gbps, nics[0].busbw_hi_gbps, nics[0].source
        ));
    }
    line
}

#[cfg(feature = "cuda")]
fn gpu_names() -> Vec<String> {
    parbench::gpu::device_names().unwrap_or_default()
}

#[cfg(not(feature = "cuda"))]
fn gpu_names() -> Vec<String> {
    Vec::new()
}

/// `nvlink` when `nvidia-smi nvlink --status` lists links with a speed,
/// `pcie` when it answers with none, `None` when it cannot be asked (5 s deadline).
fn fabric() -> Option<String> {
    let out = std::process::Command::new("timeout")
        .args(["5", "nvidia-smi", "nvlink", "--status"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        if text.contains("GB/s") {
            "nvlink"
        } else {
            "pcie"
        }
        .to_string(),
    )
}
