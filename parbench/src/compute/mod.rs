//! What a layer or a pipeline stage computes, behind one small trait:
//! [`Compute`], implemented on the CPU with the gemm crate ([`cpu`]) and on
//! NVIDIA GPUs with cuBLASLt and NVRTC kernels (`cuda`, feature `cuda`).
//!
//! Tensors are flat buffers of the device's storage type ([`Compute::dtype`]),
//! row-major, addressed by element offsets and leading dimensions, so that a
//! head's slice of a fused QKV matrix is a view, not a copy. Host data crosses
//! the boundary as f32 and is rounded to the storage type on the way in.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::comm::DType;

/// Errors of a compute device.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("invalid compute arguments: {0}")]
    InvalidArgument(String),
    #[error("unsupported on this device: {0}")]
    Unsupported(String),
    #[error("device error: {0}")]
    Device(String),
}

/// Result of every compute call.
pub type ComputeResult<T> = Result<T, ComputeError>;

/// One (possibly strided-batched) matrix product,
/// `C = alpha * op(A) * op(B) + beta * C`, row-major, f32 accumulation.
///
/// `op(A)` is `m x k`, `op(B)` is `k x n`, `C` is `m x n`. With `trans_a`,
/// A is stored `k x m`; with `trans_b`, B is stored `n x k`. Leading
/// dimensions are the row strides of the matrices as stored; offsets are in
/// elements. Batch `i` adds `i * stride_*` to each offset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub a_offset: usize,
    pub lda: usize,
    pub b_offset: usize,
    pub ldb: usize,
    pub c_offset: usize,
    pub ldc: usize,
    pub alpha: f32,
    pub beta: f32,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl Gemm {
    /// A plain, dense, unbatched `C = A B` with no transposes.
    pub fn dense(m: usize, n: usize, k: usize) -> Self {
        Gemm {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            a_offset: 0,
            lda: k,
            b_offset: 0,
            ldb: n,
            c_offset: 0,
            ldc: n,
            alpha: 1.0,
            beta: 0.0,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        }
    }

    /// Floating-point operations of the whole product (2 m n k per batch).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch.max(1) as f64
    }

    /// The number of elements each operand must hold for this product, as
    /// (a, b, c); used to check arguments before touching memory.
    pub fn extents(&self) -> (usize, usize, usize) {
        let last = self.batch.max(1) - 1;
        let (ar, ac) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (br, bc) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        let span = |off: usize, stride: usize, rows: usize, cols: usize, ld: usize| {
            if rows == 0 || cols == 0 {
                0
            } else {
                off + last * stride + (rows - 1) * ld + cols
            }
        };
        (
            span(self.a_offset, self.stride_a, ar, ac, self.lda),
            span(self.b_offset, self.stride_b, br, bc, self.ldb),
            span(self.c_offset, self.stride_c, self.m, self.n, self.ldc),
        )
    }
}

/// The arithmetic a device's matrix products run in, for the records: a
/// bf16 row is bf16 arithmetic only where `multiply` is bf16; where it is
/// f32, bf16 was the storage type and the product ran at f32's rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GemmMath {
    /// The type tensors are stored in ([`Compute::dtype`]).
    pub storage: DType,
    /// The type the multiply units consume: the storage type where the
    /// hardware takes it as it is (tensor cores), f32 where operands are
    /// widened first.
    pub multiply: DType,
    /// The type the products are summed in.
    pub accumulate: DType,
}

impl GemmMath {
    /// Whether the storage type is widened before the multiply (storage only).
    pub fn storage_only(&self) -> bool {
        self.multiply != self.storage
    }
}

impl std::fmt::Display for GemmMath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.storage_only() {
            write!(
                f,
                "{} is storage only: products in {}, summed in {}",
                self.storage, self.multiply, self.accumulate
            )
        } else {
            write!(
                f,
                "{} products, summed in {}",
                self.multiply, self.accumulate
            )
        }
    }
}

/// A device that runs the arithmetic of a transformer block or an MLP stage.
///
/// Calls may be asynchronous on a GPU; [`Compute::sync`] waits for them, and
/// the buffers are the same type the device's communicator moves, so a block
/// computes and all-reduces without staging through the host.
pub trait Compute: Send {
    /// Device memory holding elements of [`Compute::dtype`].
    type Buf: Send;

    /// Human-readable device name (`cpu (gemm avx512f kernels, 2 threads)`, `NVIDIA H200`).
    fn name(&self) -> String;
    /// Storage type of every tensor.
    fn dtype(&self) -> DType;
    /// The arithmetic of [`Compute::gemm`] on this device and storage type.
    fn gemm_math(&self) -> GemmMath;
    /// A zeroed tensor of `len` elements.
    fn alloc(&self, len: usize) -> ComputeResult<Self::Buf>;
    /// Copies f32 host data into the start of `dst`, rounding to the storage type.
    fn upload(&self, src: &[f32], dst: &mut Self::Buf) -> ComputeResult<()>;
    /// Copies the start of `src` into f32 host memory.
    fn download(&self, src: &Self::Buf, dst: &mut [f32]) -> ComputeResult<()>;
    /// Copies `len` elements between tensors (`dst[d_off..] = src[s_off..]`).
    fn copy(
        &self,
        src: &Self::Buf,
        s_off: usize,
        dst: &mut Self::Buf,
        d_off: usize,
        len: usize,
    ) -> ComputeResult<()>;

    /// `C = alpha op(A) op(B) + beta C` (see [`Gemm`]); `c` must not alias `a` or `b`.
    fn gemm(&self, g: &Gemm, a: &Self::Buf, b: &Self::Buf, c: &mut Self::Buf) -> ComputeResult<()>;
    /// `x[r, :] += bias` for each of `rows` rows of `cols` columns.
    fn add_bias(
        &self,
        x: &mut Self::Buf,
        bias: &Self::Buf,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()>;
    /// `db = sum over rows of dy` (the bias gradient), `rows x cols`.
    fn bias_grad(
        &self,
        dy: &Self::Buf,
        db: &mut Self::Buf,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()>;
    /// `y = gelu(x)` over `n` elements (tanh approximation, as Megatron uses).
    fn gelu(&self, x: &Self::Buf, y: &mut Self::Buf, n: usize) -> ComputeResult<()>;
    /// `dx = dy * gelu'(x)` over `n` elements.
    fn gelu_backward(
        &self,
        x: &Self::Buf,
        dy: &Self::Buf,
        dx: &mut Self::Buf,
        n: usize,
    ) -> ComputeResult<()>;
    /// Row-wise softmax of `rows x cols` starting at `offset`, in place; with
    /// `causal`, row `r` (taken modulo `cols`) masks columns above `r`.
    fn softmax(
        &self,
        x: &mut Self::Buf,
        offset: usize,
        rows: usize,
        cols: usize,
        causal: bool,
    ) -> ComputeResult<()>;
    /// Given softmax output `y` and its gradient `dy`, `dx = y * (dy - sum(dy * y))` per row, in place into `dy`.
    fn softmax_backward(
        &self,
        y: &Self::Buf,
        dy: &mut Self::Buf,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()>;
    /// `x += y` over `n` elements.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, n: usize) -> ComputeResult<()>;
    /// Waits for every call issued so far.
    fn sync(&self) -> ComputeResult<()> {
        Ok(())
    }
}
