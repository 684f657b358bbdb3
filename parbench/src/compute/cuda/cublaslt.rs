//! cuBLASLt handles, layouts, descriptors and preferences, each destroyed
//! on drop.

use crate::gpu::GpuError;
use cudarc::cublaslt::sys as lt;
use std::ffi::c_void;

/// A cuBLASLt handle, destroyed on drop (cudarc's own panics on failure).
pub(super) struct LtHandle(pub(super) lt::cublasLtHandle_t);
// SAFETY: a cuBLASLt handle may move between threads; it is used by one at a time.
unsafe impl Send for LtHandle {}
impl LtHandle {
    pub(super) fn new() -> Result<Self, GpuError> {
        cudarc::cublaslt::result::create_handle()
            .map(LtHandle)
            .map_err(|e| GpuError::call("cublasLtCreate", e))
    }
}
impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_handle(self.0) };
    }
}

/// A matrix layout (column-major rows x cols, leading dimension, batch).
pub(super) struct Layout(pub(super) lt::cublasLtMatrixLayout_t);
impl Layout {
    pub(super) fn new(
        dt: lt::cudaDataType,
        (rows, cols): (u64, u64),
        ld: i64,
        batch: i32,
        stride: i64,
    ) -> Result<Self, GpuError> {
        let l = cudarc::cublaslt::result::create_matrix_layout(dt, rows, cols, ld)
            .map(Layout)
            .map_err(|e| GpuError::call("cublasLtMatrixLayoutCreate", e))?;
        if batch > 1 {
            use lt::cublasLtMatrixLayoutAttribute_t as A;
            // SAFETY: attribute types are int32 (count) and int64 (stride), as documented.
            unsafe {
                cudarc::cublaslt::result::set_matrix_layout_attribute(
                    l.0,
                    A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &batch as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
                .and_then(|_| {
                    cudarc::cublaslt::result::set_matrix_layout_attribute(
                        l.0,
                        A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        &stride as *const i64 as *const c_void,
                        std::mem::size_of::<i64>(),
                    )
                })
            }
            .map_err(|e| GpuError::call("setting the batch of a layout", e))?;
        }
        Ok(l)
    }
}
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_matrix_layout(self.0) };
    }
}

/// A matmul descriptor: f32 compute and scale, transposes of the two operands.
pub(super) struct Desc(pub(super) lt::cublasLtMatmulDesc_t);
impl Desc {
    pub(super) fn new((t1, t2): (bool, bool)) -> Result<Self, GpuError> {
        let d = cudarc::cublaslt::result::create_matmul_desc(
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt::cudaDataType_t::CUDA_R_32F,
        )
        .map(Desc)
        .map_err(|e| GpuError::call("cublasLtMatmulDescCreate", e))?;
        use lt::cublasLtMatmulDescAttributes_t as A;
        for (attr, t) in [
            (A::CUBLASLT_MATMUL_DESC_TRANSA, t1),
            (A::CUBLASLT_MATMUL_DESC_TRANSB, t2),
        ] {
            let op: i32 = t as i32; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                                    // SAFETY: the attribute is a cublasOperation_t (int32).
            unsafe { d.set(attr, &op, "setting a transpose")? };
        }
        Ok(d)
    }

    /// Sets `attr` to `value`; `what` names the call in an error.
    ///
    /// # Safety
    /// `T` is the attribute's documented type, and whatever `value` points
    /// to (a device pointer's target) lives while the descriptor is used.
    pub(super) unsafe fn set<T>(
        &self,
        attr: lt::cublasLtMatmulDescAttributes_t,
        value: &T,
        what: &str,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's contract; cuBLASLt copies the value.
        unsafe {
            cudarc::cublaslt::result::set_matmul_desc_attribute(
                self.0,
                attr,
                value as *const T as *const c_void,
                std::mem::size_of::<T>(),
            )
        }
        .map_err(|e| GpuError::call(what, e))
    }
}
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_matmul_desc(self.0) };
    }
}

/// Heuristic preferences: the workspace and the operands' true alignments.
pub(super) struct Pref(pub(super) lt::cublasLtMatmulPreference_t);
impl Pref {
    pub(super) fn new(workspace: usize, align: [u32; 3]) -> Result<Self, GpuError> {
        let p = cudarc::cublaslt::result::create_matmul_pref()
            .map(Pref)
            .map_err(|e| GpuError::call("cublasLtMatmulPreferenceCreate", e))?;
        use lt::cublasLtMatmulPreferenceAttributes_t as A;
        let ws = workspace as u64;
        // SAFETY: workspace bytes are uint64, alignments uint32, as documented.
        unsafe {
            cudarc::cublaslt::result::set_matmul_pref_attribute(
                p.0,
                A::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            )
            .map_err(|e| GpuError::call("setting the workspace", e))?;
            for (attr, a) in [
                (A::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]),
                (A::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]),
                (A::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]),
                (A::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]),
            ] {
                cudarc::cublaslt::result::set_matmul_pref_attribute(
                    p.0,
                    attr,
                    &a as *const u32 as *const c_void,
                    4,
                )
                .map_err(|e| GpuError::call("setting an alignment", e))?;
            }
        }
        Ok(p)
    }
}
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_matmul_pref(self.0) };
    }
}
