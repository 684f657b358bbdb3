//! NCCL's reduction operators, `mulsum` among them, and which types this
//! NCCL and GPU reduce.
//!
//! `mulsum` is NCCL's PreMulSum, an operator made per communicator and
//! type (`ncclRedOpCreatePreMulSum`) with this rank's scalar, as
//! nccl-tests makes it (`ncclScalarHostImmediate`, the scalar of
//! `ReduceOp::mulsum_scalar`); one lives at a time, made again when the
//! type changes and destroyed with the communicator.
//!
//! The value NCCL gives a made operator is NCCL's own: its index above
//! `ncclNumOps`, scrambled with the communicator's address (2.28.3 on an
//! H200 answered 1475191311). cudarc's `ncclRedOp_t` is a Rust enum that
//! can hold only its named values, so every call that takes an operator
//! passes a [`RedOp`], a plain integer, to NCCL's entry point as
//! [`op_calls`] looked it up in the NCCL cudarc loaded, typed with the C
//! enum's integer.

use super::transfer::nccl_type;
use super::NcclComm;
use crate::comm::{CollArgs, CommError, CommResult, DType, ReduceOp};
use cudarc::nccl::sys;
use std::ffi::c_void;
use std::sync::OnceLock;

/// An NCCL reduction operator as the C library numbers it: a built-in one
/// or one NCCL made (any number NCCL chose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RedOp(u32);

impl RedOp {
    pub(super) const SUM: RedOp = RedOp(sys::ncclRedOp_t::ncclSum as u32);

    fn builtin(op: sys::ncclRedOp_t) -> RedOp {
        RedOp(op as u32)
    }

    /// The number as NCCL's calls take it.
    pub(super) fn raw(self) -> u32 {
        self.0
    }
}

type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    u32,
    sys::ncclComm_t,
    sys::cudaStream_t,
) -> sys::ncclResult_t;
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    u32,
    i32,
    sys::ncclComm_t,
    sys::cudaStream_t,
) -> sys::ncclResult_t;
type CreatePreMulSumFn = unsafe extern "C" fn(
    *mut u32,
    *mut c_void,
    sys::ncclDataType_t,
    sys::ncclScalarResidence_t,
    sys::ncclComm_t,
) -> sys::ncclResult_t;
type DestroyFn = unsafe extern "C" fn(u32, sys::ncclComm_t) -> sys::ncclResult_t;

/// NCCL's entry points that take an operator, typed with its integer.
pub(super) struct OpCalls {
    pub(super) all_reduce: AllReduceFn,
    pub(super) reduce_scatter: AllReduceFn,
    pub(super) reduce: ReduceFn,
    create_premul_sum: CreatePreMulSumFn,
    destroy: DestroyFn,
}

/// The entry points, looked up once in the NCCL cudarc loaded (the probe
/// has checked that every one is exported before any communicator exists).
pub(super) fn op_calls() -> CommResult<&'static OpCalls> {
    static CALLS: OnceLock<Result<OpCalls, String>> = OnceLock::new();
    CALLS
        .get_or_init(|| {
            // SAFETY: each symbol is NCCL's C function of that name, whose
            // signature is the type given (the operator argument is a C
            // enum, passed as its underlying unsigned int); the library
            // stays loaded for the process's life (cudarc's static).
            unsafe {
                let lib = sys::culib();
                let get = |name: &[u8]| -> Result<*const c_void, String> {
                    lib.get::<*const c_void>(name)
                        .map(|s| *s)
                        .map_err(|e| format!("NCCL lacks {}: {e}", String::from_utf8_lossy(name)))
                };
                Ok(OpCalls {
                    all_reduce: std::mem::transmute::<*const c_void, AllReduceFn>(get(
                        b"ncclAllReduce\0",
                    )?),
                    reduce_scatter: std::mem::transmute::<*const c_void, AllReduceFn>(get(
                        b"ncclReduceScatter\0",
                    )?),
                    reduce: std::mem::transmute::<*const c_void, ReduceFn>(get(b"ncclReduce\0")?),
                    create_premul_sum: std::mem::transmute::<*const c_void, CreatePreMulSumFn>(
                        get(b"ncclRedOpCreatePreMulSum\0")?,
                    ),
                    destroy: std::mem::transmute::<*const c_void, DestroyFn>(get(
                        b"ncclRedOpDestroy\0",
                    )?),
                })
            }
        })
        .as_ref()
        .map_err(|e| CommError::Device(e.clone()))
}

/// The NCCL operator of `a.op` for this call (making `mulsum`'s when needed).
impl NcclComm {
    pub(super) fn red_op(&mut self, a: &CollArgs) -> CommResult<RedOp> {
        use sys::ncclRedOp_t as O;
        Ok(match a.op {
            ReduceOp::Sum => RedOp::builtin(O::ncclSum),
            ReduceOp::Prod => RedOp::builtin(O::ncclProd),
            ReduceOp::Min => RedOp::builtin(O::ncclMin),
            ReduceOp::Max => RedOp::builtin(O::ncclMax),
            ReduceOp::Avg => RedOp::builtin(O::ncclAvg),
            ReduceOp::MulSum => self.premul_op(a.dtype)?,
        })
    }

    fn premul_op(&mut self, dtype: DType) -> CommResult<RedOp> {
        if let Some((made_for, op)) = self.premul {
            if made_for == dtype {
                return Ok(op);
            }
        }
        self.release_premul();
        self.live()?;
        self.gpu.bind()?;
        let calls = op_calls()?;
        // The scalar in the type's own bits, as NCCL reads a host immediate.
        let mut scalar = [0u8; 8];
        let bits = premul_scalar_bytes(dtype, ReduceOp::mulsum_scalar(self.rank));
        scalar[..bits.len()].copy_from_slice(&bits);
        let mut raw: u32 = u32::MAX;
        // SAFETY: NCCL writes the operator's number into `raw`; `scalar`
        // holds one element of `dtype`; the communicator is live.
        let r = unsafe {
            (calls.create_premul_sum)(
                &mut raw,
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
        self.premul = Some((dtype, RedOp(raw)));
        Ok(RedOp(raw))
    }

    /// Destroys the PreMulSum operator, if one was made (before the
    /// communicator is destroyed, or when the type changes).
    pub(super) fn release_premul(&mut self) {
        if let Some((_, op)) = self.premul.take() {
            if !self.comm.is_null() && self.aborted.is_none() {
                if let Ok(calls) = op_calls() {
                    // SAFETY: the operator NCCL made on this live communicator, destroyed once.
                    unsafe {
                        let _ = (calls.destroy)(op.0, self.comm);
                    }
                }
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
