//! NCCL's reduction operators, `mulsum` among them, and which types this
//! NCCL and GPU reduce.
//!
//! `mulsum` is NCCL's PreMulSum, an operator made per communicator and
//! type (`ncclRedOpCreatePreMulSum`) with this rank's scalar, as
//! nccl-tests makes it (`ncclScalarHostImmediate`, the scalar of
//! `ReduceOp::mulsum_scalar`). NCCL numbers the operators it makes from
//! `ncclNumOps` up; cudarc's `ncclRedOp_t` is a Rust enum that names only
//! `ncclNumOps` itself, so one operator lives at a time (made again when
//! the type changes, destroyed with the communicator), which NCCL then
//! numbers `ncclNumOps`, checked as a plain integer before it is named.

use super::transfer::nccl_type;
use super::NcclComm;
use crate::comm::{CollArgs, CommError, CommResult, DType, ReduceOp};
use cudarc::nccl::sys;

/// The NCCL operator of `a.op` for this call (making `mulsum`'s when needed).
impl NcclComm {
    pub(super) fn red_op(&mut self, a: &CollArgs) -> CommResult<sys::ncclRedOp_t> {
        use sys::ncclRedOp_t as O;
        Ok(match a.op {
            ReduceOp::Sum => O::ncclSum,
            ReduceOp::Prod => O::ncclProd,
            ReduceOp::Min => O::ncclMin,
            ReduceOp::Max => O::ncclMax,
            ReduceOp::Avg => O::ncclAvg,
            ReduceOp::MulSum => self.premul_op(a.dtype)?,
        })
    }

    fn premul_op(&mut self, dtype: DType) -> CommResult<sys::ncclRedOp_t> {
        if self.premul == Some(dtype) {
            return Ok(sys::ncclRedOp_t::ncclNumOps);
        }
        self.release_premul();
        self.live()?;
        self.gpu.bind()?;
        // The scalar in the type's own bits, as NCCL reads a host immediate.
        let mut scalar = [0u8; 8];
        let bits = premul_scalar_bytes(dtype, ReduceOp::mulsum_scalar(self.rank));
        scalar[..bits.len()].copy_from_slice(&bits);
        let mut raw: u32 = u32::MAX;
        // SAFETY: `raw` is the 4 bytes of the C enum NCCL writes, read back
        // as an integer; `scalar` holds one element of `dtype`; the
        // communicator is live.
        let r = unsafe {
            sys::ncclRedOpCreatePreMulSum(
                &mut raw as *mut u32 as *mut sys::ncclRedOp_t,
                scalar.as_mut_ptr().cast(),
                nccl_type(dtype),
                sys::ncclScalarResidence_t::ncclScalarHostImmediate,
                self.comm,
            )
        };
        if r != sys::ncclResult_t::ncclSuccess {
            return Err(CommError::InvalidArgument(format!(
                "rank {}: ncclRedOpCreatePreMulSum for {dtype} failed: {}",
                self.rank,
                super::nccl_text(r)
            )));
        }
        if raw != sys::ncclRedOp_t::ncclNumOps as u32 {
            // Not nameable through cudarc's enum; left to the communicator's end.
            return Err(CommError::Device(format!(
                "rank {}: NCCL numbered its PreMulSum operator {raw}, not ncclNumOps ({})",
                self.rank,
                sys::ncclRedOp_t::ncclNumOps as u32
            )));
        }
        self.premul = Some(dtype);
        Ok(sys::ncclRedOp_t::ncclNumOps)
    }

    /// Destroys the PreMulSum operator, if one was made (before the
    /// communicator is destroyed, or when the type changes).
    pub(super) fn release_premul(&mut self) {
        if self.premul.take().is_some() && !self.comm.is_null() && self.aborted.is_none() {
            // SAFETY: the operator NCCL made on this live communicator, destroyed once.
            unsafe {
                let _ = sys::ncclRedOpDestroy(sys::ncclRedOp_t::ncclNumOps, self.comm);
            }
        }
    }

    /// Why this NCCL and GPU cannot reduce `dtype`, if they cannot.
    pub(super) fn type_refusal(&self, dtype: DType) -> Option<String> {
        if !dtype.is_fp8() {
            return None;
        }
        let version = cudarc::nccl::result::get_nccl_version().ok();
        fp8_refusal(dtype, version, self.gpu.compute_capability())
    }
}

/// `scalar` as one element of `dtype`, in its bytes.
fn premul_scalar_bytes(dtype: DType, scalar: f64) -> Vec<u8> {
    crate::with_dtype!(dtype, T => {
        bytemuck::bytes_of(&<T as crate::comm::Element>::from_f64(scalar)).to_vec()
    })
}

/// nccl-tests' rule for the 8-bit floats: NCCL has them from 2.24, and
/// nccl-tests runs them only on compute capability 9.0 or newer (it drops
/// them from its types on older GPUs).
pub(super) fn fp8_refusal(
    dtype: DType,
    nccl_version: Option<i32>,
    capability: Option<(i32, i32)>,
) -> Option<String> {
    let version = nccl_version.unwrap_or(0);
    if version < 22400 {
        return Some(format!(
            "-d {dtype}: NCCL's 8-bit floats need NCCL 2.24 or newer; this NCCL is {}.{}.{}",
            version / 10000,
            (version / 100) % 100,
            version % 100
        ));
    }
    match capability {
        Some((major, minor)) if major < 9 => Some(format!(
            "-d {dtype}: NCCL reduces 8-bit floats on compute capability 9.0 or newer (nccl-tests drops them below); this GPU is {major}.{minor}"
        )),
        None => Some(format!(
            "-d {dtype}: the GPU's compute capability could not be read (NCCL's 8-bit floats need 9.0 or newer)"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_needs_nccl_2_24_and_hopper() {
        let d = DType::F8E4M3;
        assert_eq!(fp8_refusal(d, Some(22400), Some((9, 0))), None);
        assert_eq!(fp8_refusal(d, Some(22703), Some((10, 0))), None);
        let old = fp8_refusal(d, Some(22304), Some((9, 0))).unwrap();
        assert!(old.contains("2.24") && old.contains("2.23.4"), "{old}");
        let ampere = fp8_refusal(DType::F8E5M2, Some(22600), Some((8, 0))).unwrap();
        assert!(
            ampere.contains("f8e5m2") && ampere.contains("8.0"),
            "{ampere}"
        );
        assert!(fp8_refusal(d, None, Some((9, 0))).is_some());
    }

    #[test]
    fn the_scalar_is_one_element_of_the_type() {
        assert_eq!(premul_scalar_bytes(DType::F32, 2.0), 2.0f32.to_le_bytes());
        assert_eq!(premul_scalar_bytes(DType::U64, 2.0), 2u64.to_le_bytes());
        assert_eq!(premul_scalar_bytes(DType::F8E4M3, 2.0), vec![0x40]);
        assert_eq!(premul_scalar_bytes(DType::I8, 1.0), vec![1]);
    }
}
