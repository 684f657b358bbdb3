//! FP8 products (`--dtype fp8`): bf16 storage, each unbatched product's
//! operands cast to E4M3 with a per-tensor scale, multiplied by cuBLASLt's
//! FP8 kernels in f32 and written in bf16; attention's products stay bf16,
//! as Transformer Engine runs them.
//!
//! Scale: amax (max |x| of the operand, on the device) maps to E4M3's
//! largest finite value, 448, so the operand uses E4M3's whole range;
//! cuBLASLt multiplies the product by both operands' 1/scale (its A and B
//! scale pointers). This is the current-scaling recipe (the amax of this
//! very tensor), not Transformer Engine's delayed scaling from an amax
//! history.
//!
//! Accumulation: split by default (cuBLASLt's `FAST_ACCUM` off: partial
//! sums promoted to f32 as the mainloop runs), as Transformer Engine runs
//! its dgrad and wgrad products; [`super::CudaCompute::set_fp8_fast_accumulation`]
//! turns fast accumulation on, as TE runs its forward (`_2X_ACC_FPROP`).
//!
//! Layout: cuBLASLt's FP8 kernels take only "TN" (its A transposed, its B
//! not) and K a multiple of 16, so the cast writes each operand packed in
//! that layout whatever the product's transposes: our A as `op(A)` row-major
//! (m x k), our B as `op(B)^T` row-major (n x k); column-major, cuBLASLt
//! reads the first as its B (k x m, not transposed) and the second as its
//! A (k x n, transposed).

use super::cublaslt::{Desc, Layout};
use super::{alignment, to_i64, CudaCompute, GemmKey};
use crate::compute::{ComputeError, ComputeResult, Gemm};
use crate::gpu::{DeviceBuffer, Gpu, GpuError};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::PushKernelArg;

/// The oldest architecture with FP8 tensor cores: Ada (sm_89); Hopper is sm_90.
pub const FP8_ARCH: (i32, i32) = (8, 9);

/// K of an FP8 product must be a multiple of this (cuBLASLt's FP8 kernels).
pub const FP8_K_MULTIPLE: usize = 16;

/// Why `gpu` cannot run FP8 products, or `None` where it can.
pub fn fp8_refusal(gpu: &Gpu) -> Option<String> {
    let (major, minor) = gpu.compute_capability()?;
    ((major, minor) < FP8_ARCH).then(|| {
        format!(
            "fp8 GEMMs need a GPU of sm_89 or newer; GPU {} ({}) is sm_{major}{minor}",
            gpu.ordinal(),
            gpu.name()
        )
    })
}

/// The FP8 operands of the last product, grown as products need.
pub(super) struct Fp8Scratch {
    a: Option<DeviceBuffer>,
    b: Option<DeviceBuffer>,
    /// `[amax A, amax B]` as float bits, then `[1/scale A, 1/scale B]`.
    scales: DeviceBuffer,
    /// cuBLASLt's `FAST_ACCUM`: no promotion of partial sums (see the module).
    pub(super) fast_accumulation: bool,
}

impl Fp8Scratch {
    pub(super) fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Fp8Scratch {
            a: None,
            b: None,
            scales: gpu.alloc(16)?,
            fast_accumulation: false,
        })
    }
}

/// A buffer of at least `bytes` in `slot`, replaced when too small.
fn at_least<'a>(
    gpu: &Gpu,
    slot: &'a mut Option<DeviceBuffer>,
    bytes: usize,
) -> Result<&'a DeviceBuffer, GpuError> {
    if slot.as_ref().is_none_or(|b| b.len() < bytes) {
        *slot = Some(gpu.alloc(bytes.max(1))?);
    }
    slot.as_ref()
        .ok_or_else(|| GpuError::InvalidArgument("fp8 scratch".into()))
}

impl CudaCompute {
    /// Whether `g` runs in FP8 on this device: FP8 products asked for, one
    /// product (not a batch) and not attention's.
    pub(super) fn runs_in_fp8(&self, g: &Gemm) -> bool {
        self.fp8.is_some() && !g.attention && g.batch <= 1
    }

    /// The stored operand at device address `p` (rows x cols, row stride
    /// `lds`), cast to E4M3 into `out` (transposed when `transpose`) with
    /// its amax at `amax` and its 1/scale at `descale`.
    #[allow(clippy::too_many_arguments)]
    fn cast_operand(
        &self,
        p: u64,
        (rows, cols, lds): (u64, u64, u64),
        transpose: bool,
        amax: u64,
        out: u64,
        descale: u64,
    ) -> ComputeResult<()> {
        let k = &self.kernels;
        let one = 1u64;
        self.launch(&k.zero_u32, 1, |l| {
            l.arg(&amax).arg(&one);
        })?;
        self.launch(&k.amax, rows * cols, |l| {
            l.arg(&p).arg(&rows).arg(&cols).arg(&lds).arg(&amax);
        })?;
        let t = transpose as i32;
        self.launch(&k.cast_e4m3, rows * cols, |l| {
            l.arg(&p)
                .arg(&rows)
                .arg(&cols)
                .arg(&lds)
                .arg(&t)
                .arg(&amax)
                .arg(&out)
                .arg(&descale);
        })
    }

    /// `C = alpha op(A) op(B) + beta C` with E4M3 operands (see the module):
    /// `pa`, `pb`, `pc` the device addresses of the operands' first
    /// elements, already checked against their buffers.
    pub(super) fn gemm_fp8(&self, g: &Gemm, pa: u64, pb: u64, pc: u64) -> ComputeResult<()> {
        if !g.k.is_multiple_of(FP8_K_MULTIPLE) {
            return Err(ComputeError::InvalidArgument(format!(
                "fp8 GEMMs need K a multiple of {FP8_K_MULTIPLE} (cuBLASLt's FP8 kernels): m={} n={} k={}",
                g.m, g.n, g.k
            )));
        }
        let Some(scratch) = &self.fp8 else {
            return Err(ComputeError::InvalidArgument(
                "this device was not opened for fp8 GEMMs".into(),
            ));
        };
        let mut s = scratch
            .lock()
            .map_err(|_| ComputeError::Device("the fp8 scratch's lock is poisoned".into()))?;
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        let a8 = at_least(&self.gpu, &mut s.a, g.m * g.k)?.ptr();
        let b8 = at_least(&self.gpu, &mut s.b, g.n * g.k)?.ptr();
        let sc = s.scales.ptr();
        let (amax_a, amax_b, descale_a, descale_b) = (sc, sc + 4, sc + 8, sc + 12);
        // A stored m x k (or k x m): packed as op(A), m x k.
        let a_shape = if g.trans_a { (k, m) } else { (m, k) };
        self.cast_operand(
            pa,
            (a_shape.0, a_shape.1, g.lda as u64),
            g.trans_a,
            amax_a,
            a8,
            descale_a,
        )?;
        // B stored k x n (or n x k): packed as op(B)^T, n x k.
        let b_shape = if g.trans_b { (n, k) } else { (k, n) };
        self.cast_operand(
            pb,
            (b_shape.0, b_shape.1, g.ldb as u64),
            !g.trans_b,
            amax_b,
            b8,
            descale_b,
        )?;

        let e4m3 = lt::cudaDataType_t::CUDA_R_8F_E4M3;
        let ki = to_i64(g.k, "k")?;
        let key = GemmKey {
            dims: [n, m, k],
            trans: (true, false),
            lds: [ki, ki, to_i64(g.ldc.max(g.n), "ldc")?],
            strides: [0, 0, 0],
            batch: 1,
            align: [alignment(b8), alignment(a8), alignment(pc)],
            fp8: Some(s.fast_accumulation),
        };
        let lay1 = Layout::new(e4m3, (k, n), ki, 1, 0)?;
        let lay2 = Layout::new(e4m3, (k, m), ki, 1, 0)?;
        let lay_c = Layout::new(self.data_type(), (n, m), key.lds[2], 1, 0)?;
        let desc = Desc::new(key.trans)?;
        use lt::cublasLtMatmulDescAttributes_t as A;
        // cuBLASLt's A is our B, its B our A.
        for (attr, ptr) in [
            (A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, descale_b),
            (A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, descale_a),
        ] {
            // SAFETY: the attribute is a device pointer to one f32 (a
            // `void*`), which lives in the scratch while the call runs.
            unsafe { desc.set(attr, &ptr, "setting an fp8 scale pointer")? };
        }
        let fast = i8::from(s.fast_accumulation);
        // SAFETY: the attribute is one int8_t.
        unsafe {
            desc.set(
                A::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                &fast,
                "setting fp8 fast accumulation",
            )?
        };
        // SAFETY: the FP8 operands hold m x k and n x k bytes (cast above on
        // this stream), C was checked against its buffer by the caller; the
        // scratch stays locked until after the call is issued.
        unsafe { self.matmul(g, &key, &desc, [&lay1, &lay2, &lay_c], [b8, a8, pc]) }
    }
}
