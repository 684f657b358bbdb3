//! Device descriptions for the capacity planner: what one accelerator and
//! its node offer (tensor-core peak, the GEMM rate a microbenchmark
//! sustains, SMs, HBM, NVLink, NICs), from the vendors' datasheets, each
//! figure's source beside it. A user's own device comes as a JSON file of
//! the same fields ([`Device::from_json`]); measured figures (bench-layers'
//! GEMM rate, bench-collectives' fits) override these where given.
//!
//! The constants below are the same for every device: what share of a
//! datasheet figure a real kernel reaches. Each says where it comes from.

use super::alpha_beta::LinkParams;

/// The share of the datasheet HBM bandwidth a streaming kernel (a copy, a
/// norm, an optimizer step) reaches: one H200 in this project's GPU check
/// copied about 4.3 TB/s counting bytes read and written, of 4.8 TB/s
/// (`REFERENCES.md`, "Published figures").
pub const MEMORY_FRACTION: f64 = 0.9;

/// The share of a GPU's NVLink line rate (one direction) that NCCL's ring
/// all-reduce reaches as bus bandwidth: 8 x H100 SXM about 370 GB/s of
/// 450 GB/s (nccl-tests issues 212 and 290; `REFERENCES.md`).
pub const NVLINK_FRACTION: f64 = 0.82;

/// The share of a NIC's line rate that NCCL reaches across nodes: 400 Gb/s
/// NDR NICs measure 46-49 GB/s of 50 (nccl-tests issues 290 and 267).
pub const NIC_FRACTION: f64 = 0.94;

/// Latency of one ring step inside a node: an 8 B all-reduce over 8
/// H100s takes about 13.7 us, 14 ring steps (`REFERENCES.md`).
pub const NVLINK_STEP_US: f64 = 1.0;

/// Latency of one ring step across nodes (an RDMA write and NCCL's proxy
/// thread): an assumption, not a measurement here; a bench-collectives
/// fit with `--from` replaces it.
pub const NIC_STEP_US: f64 = 5.0;

/// The clock a GPU holds at its power limit under dense tensor-core work,
/// as a share of the clock its datasheet peak (and an isolated GEMM
/// benchmark) runs at: NVIDIA computes an A100's HPL peak at the 1305 MHz
/// it sustains at 400 W, of 1410 MHz boost (G. Lockwood, "Peak FLOPS",
/// on NVIDIA's TOP500 submissions). A training step is such work for its
/// whole length; a benchmark of 20 products is not.
pub const A100_SUSTAINED_CLOCK: f64 = 1305.0 / 1410.0;

/// The same for Hopper: an H200 NVL held 1635 MHz of its 1785 MHz boost
/// under sustained GEMMs at its power limit (the "bee" GPU benchmark's
/// clock-calibration notes, 2026-04-06). No figure for the SXM parts was
/// found; theirs is taken as the same share.
pub const HOPPER_SUSTAINED_CLOCK: f64 = 1635.0 / 1785.0;

/// Dense FP8 tensor-core peak of the H100 SXM5 and the H200 SXM: 1,979
/// TFLOP/s (the datasheets' 3,958 "with sparsity", halved: twice the
/// dense bf16 989).
pub const HOPPER_FP8_TFLOPS: f64 = 1979.0;

/// A GPU generation: what decides which published kernel rates (flash
/// attention's) apply to a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Generation {
    /// A100 (sm80).
    Ampere,
    /// H100, H200 (sm90: wgmma and TMA).
    Hopper,
}

/// One accelerator and its node.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// The name `--device` takes.
    pub name: String,
    /// Where the figures come from.
    #[serde(default)]
    pub source: String,
    /// Dense 16-bit tensor-core peak, TFLOP/s (no sparsity).
    pub peak_tflops: f64,
    /// What a large bf16/fp16 GEMM sustains on its own (cuBLAS, 8192^3 or
    /// so), TFLOP/s.
    pub gemm_tflops: f64,
    /// Streaming multiprocessors (a GEMM's tiles run in waves of this many).
    pub sms: u64,
    /// HBM bandwidth, GB/s.
    pub hbm_gbps: f64,
    /// HBM capacity, GiB.
    pub hbm_gib: f64,
    /// NVLink bandwidth of one GPU in one direction, GB/s.
    pub nvlink_gbps: f64,
    /// GPUs in one node (one NVLink domain).
    pub gpus_per_node: u64,
    /// Compute NICs in one node (rails).
    pub nics_per_node: u64,
    /// One NIC's rate in one direction, GB/s.
    pub nic_gbps: f64,
    /// The clock held through a training step over the clock of
    /// `gemm_tflops` (default [`A100_SUSTAINED_CLOCK`], the one vendor figure).
    #[serde(default)]
    pub sustained_clock_share: Option<f64>,
    /// Its generation; without one, attention is priced as on an A100
    /// ([`super::opcost::FLASH_SHARE`]).
    #[serde(default)]
    pub generation: Option<Generation>,
    /// Dense FP8 tensor-core peak, TFLOP/s (no sparsity); `None`: the
    /// device has no FP8 tensor cores.
    #[serde(default)]
    pub fp8_peak_tflops: Option<f64>,
}

/// Every preset.
pub fn presets() -> Vec<Device> {
    vec![
        Device {
            name: "a100-sxm4-80gb".into(),
            source: "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 312 TFLOP/s dense FP16/BF16, 2,039 GB/s HBM2e, 80 GB, NVLink 600 GB/s (both directions); Ampere GA100 whitepaper: 108 SMs; DGX A100 datasheet: 8 GPUs, 8 x 200 Gb/s HDR InfiniBand for compute; GEMM rate: what cuBLAS sustains on large bf16 GEMMs (issue 32: 260 TFLOP/s)".into(),
            peak_tflops: 312.0,
            gemm_tflops: 260.0,
            sms: 108,
            hbm_gbps: 2039.0,
            hbm_gib: 80.0,
            nvlink_gbps: 300.0,
            gpus_per_node: 8,
            nics_per_node: 8,
            nic_gbps: 25.0,
            sustained_clock_share: Some(A100_SUSTAINED_CLOCK),
            generation: Some(Generation::Ampere),
            fp8_peak_tflops: None,
        },
        Device {
            name: "h100-sxm5-80gb".into(),
            source: "NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16 (1,979 with sparsity), 1,979 dense FP8 (3,958 with sparsity), 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s (both directions); Hopper whitepaper: 132 SMs; DGX H100: 8 GPUs, 8 x 400 Gb/s ConnectX-7 for compute; GEMM rate: as measured on one H200 (the same GH100 compute at the same 700 W), bf16 8192^3 769-798 TFLOP/s (REFERENCES.md)".into(),
            peak_tflops: 989.0,
            gemm_tflops: 780.0,
            sms: 132,
            hbm_gbps: 3350.0,
            hbm_gib: 80.0,
            nvlink_gbps: 450.0,
            gpus_per_node: 8,
            nics_per_node: 8,
            nic_gbps: 50.0,
            sustained_clock_share: Some(HOPPER_SUSTAINED_CLOCK),
            generation: Some(Generation::Hopper),
            fp8_peak_tflops: Some(HOPPER_FP8_TFLOPS),
        },
        Device {
            name: "h200".into(),
            source: "NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16, 1,979 dense FP8 (3,958 with sparsity), 4.8 TB/s HBM3e, 141 GB (about 139 GiB usable on the GPU machine this project borrows), NVLink 900 GB/s (both directions); 132 SMs (GH100); HGX H200: 8 GPUs, 8 x 400 Gb/s NICs; GEMM rate: one H200, bf16 8192^3 769-798 TFLOP/s through torch (REFERENCES.md)".into(),
            peak_tflops: 989.0,
            gemm_tflops: 780.0,
            sms: 132,
            hbm_gbps: 4800.0,
            hbm_gib: 139.0,
            nvlink_gbps: 450.0,
            gpus_per_node: 8,
            nics_per_node: 8,
            nic_gbps: 50.0,
            sustained_clock_share: Some(HOPPER_SUSTAINED_CLOCK),
            generation: Some(Generation::Hopper),
            fp8_peak_tflops: Some(HOPPER_FP8_TFLOPS),
        },
        Device {
            name: "h800".into(),
            source: "NVIDIA H800 SXM5 (export part of the H100): the H100's compute and HBM (989 TFLOP/s dense BF16, 1,979 dense FP8, 132 SMs, 3.35 TB/s, 80 GB) with NVLink cut to 400 GB/s both directions, 200 a direction; DeepSeek-V3 Technical Report: 2048 H800, 8 a node on NVLink and NVSwitch, InfiniBand across (section 3.1), NVLink 160 GB/s and IB 50 GB/s achievable (section 3.2.2); DeepEP README: H800 with CX7 InfiniBand 400 Gb/s NICs, one a GPU".into(),
            peak_tflops: 989.0,
            gemm_tflops: 780.0,
            sms: 132,
            hbm_gbps: 3350.0,
            hbm_gib: 80.0,
            nvlink_gbps: 200.0,
            gpus_per_node: 8,
            nics_per_node: 8,
            nic_gbps: 50.0,
            sustained_clock_share: Some(HOPPER_SUSTAINED_CLOCK),
            generation: Some(Generation::Hopper),
            fp8_peak_tflops: Some(HOPPER_FP8_TFLOPS),
        },
    ]
}

/// The largest a JSON device file may be: a description is a few hundred bytes.
pub const DEVICE_FILE_MAX_BYTES: u64 = 64 * 1024;

impl Device {
    /// The preset called `name` (case-insensitive).
    pub fn by_name(name: &str) -> Option<Device> {
        presets()
            .into_iter()
            .find(|d| d.name.eq_ignore_ascii_case(name))
    }

    /// The preset names, for help and errors.
    pub fn names() -> Vec<String> {
        presets().into_iter().map(|d| d.name).collect()
    }

    /// A device from a JSON description (the fields of [`Device`]); the
    /// first wrong field is the error.
    pub fn from_json(text: &str) -> Result<Device, String> {
        let d: Device = serde_json::from_str(text).map_err(|e| e.to_string())?;
        d.check()?;
        Ok(d)
    }

    /// Every figure within what a device can be
    /// ([`crate::limits::Plausible`]), the GEMM rate within the peak.
    pub fn check(&self) -> Result<(), String> {
        use crate::limits::{Plausible, GBPS, GIB, TFLOPS};
        // One NIC beyond 100 TB/s is a typo in any unit.
        let nic = Plausible { max: 1e5, ..GBPS };
        let figures = [
            ("peak_tflops", self.peak_tflops, TFLOPS),
            ("gemm_tflops", self.gemm_tflops, TFLOPS),
            ("hbm_gbps", self.hbm_gbps, GBPS),
            ("hbm_gib", self.hbm_gib, GIB),
            ("nvlink_gbps", self.nvlink_gbps, GBPS),
            ("nic_gbps", self.nic_gbps, nic),
        ];
        for (what, v, range) in figures {
            range.check(what, v).map_err(|e| e.to_string())?;
        }
        for (what, v, max) in [
            ("sms", self.sms, 100_000),
            ("gpus_per_node", self.gpus_per_node, 4096),
            ("nics_per_node", self.nics_per_node, 4096),
        ] {
            if v == 0 || v > max {
                return Err(format!("{what} must be 1 to {max} (got {v})"));
            }
        }
        if let Some(c) = self.sustained_clock_share {
            if !(c.is_finite() && c > 0.0 && c <= 1.0) {
                return Err(format!(
                    "sustained_clock_share must be above 0 and at most 1 (got {})",
                    crate::units::number_text(c)
                ));
            }
        }
        if let Some(f) = self.fp8_peak_tflops {
            TFLOPS
                .check("fp8_peak_tflops", f)
                .map_err(|e| e.to_string())?;
        }
        if self.gemm_tflops > self.peak_tflops {
            return Err(format!(
                "gemm_tflops {} is above peak_tflops {}",
                self.gemm_tflops, self.peak_tflops
            ));
        }
        Ok(())
    }

    /// The share of `gemm_tflops` a training step sustains: its clock at
    /// the power limit.
    pub fn sustained_clock(&self) -> f64 {
        self.sustained_clock_share.unwrap_or(A100_SUSTAINED_CLOCK)
    }

    /// The wire inside a node: NVLink at the share NCCL's rings reach.
    pub fn intra_link(&self) -> LinkParams {
        LinkParams::from_gbps_us(self.nvlink_gbps * NVLINK_FRACTION, NVLINK_STEP_US)
    }

    /// The wire of one GPU across nodes: its share of the node's NICs (one
    /// rail per GPU on DGX/HGX nodes), at the share NCCL reaches.
    pub fn inter_link(&self) -> LinkParams {
        let per_gpu = self.nic_gbps * self.nics_per_node as f64 / self.gpus_per_node as f64;
        LinkParams::from_gbps_us(per_gpu * NIC_FRACTION, NIC_STEP_US)
    }

    /// HBM capacity, bytes.
    pub fn memory_bytes(&self) -> f64 {
        self.hbm_gib * 1024.0 * 1024.0 * 1024.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_found_by_name() {
        for d in presets() {
            d.check().unwrap_or_else(|e| panic!("{}: {e}", d.name));
            assert!(!d.source.is_empty());
        }
        assert_eq!(Device::by_name("A100-SXM4-80GB").unwrap().sms, 108);
        assert!(Device::by_name("tpu").is_none());
        // DGX A100: 8 HDR rails of 25 GB/s, one per GPU.
        let a = Device::by_name("a100-sxm4-80gb").unwrap();
        assert!((a.inter_link().bandwidth_gbps() - 25.0 * NIC_FRACTION).abs() < 1e-9);
        assert!((a.intra_link().bandwidth_gbps() - 300.0 * NVLINK_FRACTION).abs() < 1e-9);
    }

    #[test]
    fn a_json_description_is_read_and_checked() {
        let text = serde_json::to_string(&Device::by_name("h200").unwrap()).unwrap();
        assert_eq!(Device::from_json(&text).unwrap().name, "h200");
        let bad = text.replace("\"sms\":132", "\"sms\":0");
        assert!(Device::from_json(&bad).unwrap_err().contains("sms"));
        let over = text.replace("\"gemm_tflops\":780.0", "\"gemm_tflops\":1500.0");
        assert!(Device::from_json(&over).unwrap_err().contains("above peak"));
        let unknown = text.replace("\"sms\"", "\"sm_count\"");
        assert!(Device::from_json(&unknown).is_err());
        // A figure a million times too small is refused in one short line.
        let tiny = text.replace("\"hbm_gib\":139.0", "\"hbm_gib\":1e-300");
        assert_eq!(
            Device::from_json(&tiny).unwrap_err(),
            "hbm_gib 1e-300: expected 0.0009765625 to 100000 GiB"
        );
    }
}
