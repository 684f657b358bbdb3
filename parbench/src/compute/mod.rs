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
    /// A product of attention (its scores or its context): kept in the
    /// storage type where the device multiplies the others in FP8, as
    /// Transformer Engine keeps it.
    pub attention: bool,
}

/// A GPU call that failed: a bad argument stays one, anything else is a
/// device error.
#[cfg(feature = "cuda")]
impl From<crate::gpu::GpuError> for ComputeError {
    fn from(e: crate::gpu::GpuError) -> Self {
        match e {
            crate::gpu::GpuError::InvalidArgument(m) => ComputeError::InvalidArgument(m),
            other => ComputeError::Device(other.to_string()),
        }
    }
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
            attention: false,
        }
    }

    /// Floating-point operations of the whole product (2 m n k per batch).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch.max(1) as f64
    }

    /// The number of elements each operand must hold for this product, as
    /// (a, b, c): one past the last element it touches, or the offset of its
    /// last batch when the operand has no elements (k = 0 leaves A and B empty). Every value
    /// is `usize::MAX` when the descriptor is invalid ([`Gemm::check`] says why).
    pub fn extents(&self) -> (usize, usize, usize) {
        self.ends()
            .map(|[a, b, c]| (a, b, c))
            .unwrap_or((usize::MAX, usize::MAX, usize::MAX))
    }

    /// Checks the descriptor against operands of `lens` elements (a, b, c)
    /// before any device touches memory, and returns [`Gemm::extents`]. The
    /// one check of every [`Compute`] device, so that the CPU and the GPU
    /// accept and refuse the same products.
    pub fn check(&self, lens: (usize, usize, usize)) -> ComputeResult<(usize, usize, usize)> {
        let [ea, eb, ec] = self.ends()?;
        for (name, need, have) in [("A", ea, lens.0), ("B", eb, lens.1), ("C", ec, lens.2)] {
            if need > have {
                return Err(ComputeError::InvalidArgument(format!(
                    "gemm {name}: the product touches {need} elements but the tensor holds {have} \
                     (m={} n={} k={} batch={})",
                    self.m, self.n, self.k, self.batch
                )));
            }
        }
        Ok((ea, eb, ec))
    }

    /// The stored (rows, cols) of A and of B.
    fn stored_shapes(&self) -> [(usize, usize); 2] {
        let a = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let b = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        [a, b]
    }

    /// One past the last element of each operand, with the leading-dimension
    /// and overflow checks.
    fn ends(&self) -> ComputeResult<[usize; 3]> {
        let last = self.batch.max(1) - 1;
        let [(ar, ac), (br, bc)] = self.stored_shapes();
        Ok([
            operand_end("A", self.a_offset, self.stride_a, last, (ar, ac), self.lda)?,
            operand_end("B", self.b_offset, self.stride_b, last, (br, bc), self.ldb)?,
            operand_end(
                "C",
                self.c_offset,
                self.stride_c,
                last,
                (self.m, self.n),
                self.ldc,
            )?,
        ])
    }
}

/// The elements of the `rows` x `cols` matrix `op` works on (both devices
/// check before they touch memory); a product past `usize` is bad input.
pub(crate) fn matrix_len(op: &str, rows: usize, cols: usize) -> ComputeResult<usize> {
    rows.checked_mul(cols)
        .ok_or_else(|| ComputeError::InvalidArgument(format!("{op}: size overflows")))
}

/// One past the last element a `rows x cols` operand with leading dimension
/// `ld` touches over `last + 1` batches `stride` apart, starting at `off`.
///
/// An empty operand (a zero extent: k = 0, n = 0) touches nothing, so its
/// leading dimension is not checked and its end is where its last batch
/// starts (a device may still form that address). Otherwise the
/// rows must not overlap (`ld >= cols`) where there is more than one row: a
/// single row's leading dimension addresses nothing (devices whose library
/// insists on `ld >= cols` pass `max(ld, cols)` for it).
fn operand_end(
    what: &str,
    off: usize,
    stride: usize,
    last: usize,
    (rows, cols): (usize, usize),
    ld: usize,
) -> ComputeResult<usize> {
    let last_start = last
        .checked_mul(stride)
        .and_then(|b| b.checked_add(off))
        .ok_or_else(|| ComputeError::InvalidArgument(format!("gemm {what}: extent overflows")))?;
    if rows == 0 || cols == 0 {
        return Ok(last_start);
    }
    if rows > 1 && ld < cols {
        return Err(ComputeError::InvalidArgument(format!(
            "gemm {what}: leading dimension {ld} is smaller than its {cols} columns"
        )));
    }
    (rows - 1)
        .checked_mul(ld)
        .and_then(|r| r.checked_add(last_start))
        .and_then(|x| x.checked_add(cols))
        .ok_or_else(|| ComputeError::InvalidArgument(format!("gemm {what}: extent overflows")))
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
    /// widened first, f8e4m3 where they are cast to FP8 first.
    pub multiply: DType,
    /// The type the products are summed in.
    pub accumulate: DType,
}

impl GemmMath {
    /// Whether the storage type is widened before the multiply (storage only).
    pub fn storage_only(&self) -> bool {
        self.multiply.size() > self.storage.size()
    }

    /// Whether the products multiply in a narrower type than is stored
    /// (FP8 products of bf16 tensors).
    pub fn narrowed(&self) -> bool {
        self.multiply.size() < self.storage.size()
    }
}

impl std::fmt::Display for GemmMath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.narrowed() {
            write!(
                f,
                "{} storage, products in {} (per-tensor scales), summed in {}",
                self.storage, self.multiply, self.accumulate
            )
        } else if self.storage_only() {
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
    type Buf: crate::comm::CommBuffer;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(r: ComputeResult<(usize, usize, usize)>) -> bool {
        matches!(r, Err(ComputeError::InvalidArgument(_)))
    }

    #[test]
    fn dense_extents_are_the_operand_sizes() {
        let g = Gemm::dense(4, 3, 2);
        assert_eq!(g.extents(), (8, 6, 12));
        assert_eq!(g.check((8, 6, 12)).unwrap(), (8, 6, 12));
        assert!(invalid(g.check((7, 6, 12))));
        assert!(invalid(g.check((8, 5, 12))));
        assert!(invalid(g.check((8, 6, 11))));
    }

    #[test]
    fn leading_dimensions_shorter_than_a_row_are_refused() {
        let mut g = Gemm::dense(4, 3, 2);
        g.lda = 1;
        assert!(invalid(g.check((100, 100, 100))));
        let mut g = Gemm::dense(4, 3, 2);
        g.ldc = 2;
        assert!(invalid(g.check((100, 100, 100))));
        // Transposed A is stored k x m: its rows are m long.
        let mut t = Gemm::dense(4, 3, 2);
        t.trans_a = true;
        t.lda = 4;
        assert_eq!(t.check((8, 6, 12)).unwrap(), (8, 6, 12));
        t.lda = 3;
        assert!(invalid(t.check((100, 100, 100))));
    }

    #[test]
    fn k_zero_checks_only_c_and_is_accepted() {
        // The gpu_compute test's last case: C = beta C with lda = k = 0.
        let g = Gemm::dense(4, 3, 0);
        assert_eq!((g.lda, g.ldb), (0, 3));
        assert_eq!(g.check((0, 0, 12)).unwrap(), (0, 0, 12));
        // A and B empty: their leading dimensions do not matter, C's does.
        let g = Gemm {
            lda: 0,
            ldb: 0,
            ..Gemm::dense(4, 3, 0)
        };
        assert!(g.check((0, 0, 12)).is_ok());
        let g = Gemm {
            ldc: 2,
            ..Gemm::dense(4, 3, 0)
        };
        assert!(invalid(g.check((0, 0, 100))));
        // An empty operand's offset must still lie within its tensor.
        let g = Gemm {
            a_offset: 5,
            ..Gemm::dense(4, 3, 0)
        };
        assert_eq!(g.extents().0, 5);
        assert!(invalid(g.check((4, 0, 12))));
        assert!(g.check((5, 0, 12)).is_ok());
        let g = Gemm {
            batch: 2,
            stride_a: 7,
            stride_c: 12,
            ..Gemm::dense(4, 3, 0)
        };
        assert_eq!(g.extents(), (7, 0, 24));
    }

    #[test]
    fn n_zero_and_m_zero_leave_c_unchecked() {
        let g = Gemm {
            ldb: 0,
            ldc: 0,
            ..Gemm::dense(4, 0, 2)
        };
        assert_eq!(g.check((8, 0, 0)).unwrap(), (8, 0, 0));
        let g = Gemm {
            ldc: 0,
            ..Gemm::dense(0, 3, 2)
        };
        assert_eq!(g.check((0, 6, 0)).unwrap(), (0, 6, 0));
    }

    #[test]
    fn a_single_row_needs_no_leading_dimension() {
        // m = 1 (decode): A's one row is addressed without lda.
        let g = Gemm {
            lda: 0,
            ldc: 1,
            ..Gemm::dense(1, 3, 2)
        };
        assert_eq!(g.check((2, 6, 3)).unwrap(), (2, 6, 3));
    }

    #[test]
    fn batches_and_overflow() {
        let g = Gemm {
            batch: 3,
            stride_a: 10,
            stride_b: 6,
            stride_c: 12,
            ..Gemm::dense(4, 3, 2)
        };
        assert_eq!(g.extents(), (28, 18, 36));
        let g = Gemm {
            batch: usize::MAX,
            stride_a: usize::MAX,
            ..Gemm::dense(3, 5, 4)
        };
        assert_eq!(g.extents(), (usize::MAX, usize::MAX, usize::MAX));
        assert!(invalid(g.check((usize::MAX, usize::MAX, usize::MAX))));
        let g = Gemm {
            a_offset: usize::MAX,
            ..Gemm::dense(3, 5, 4)
        };
        assert!(invalid(g.check((usize::MAX, usize::MAX, usize::MAX))));
    }

    #[test]
    fn the_cpu_device_runs_k_zero_as_c_equals_beta_c() {
        use crate::compute::cpu::CpuCompute;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let dev = CpuCompute::new(dtype, 1).unwrap();
            let g = Gemm {
                beta: 0.5,
                ..Gemm::dense(4, 3, 0)
            };
            let (a, b) = (dev.alloc(0).unwrap(), dev.alloc(0).unwrap());
            let mut c = dev.alloc(12).unwrap();
            let c0: Vec<f32> = (0..12).map(|i| i as f32).collect();
            dev.upload(&c0, &mut c).unwrap();
            dev.gemm(&g, &a, &b, &mut c).unwrap();
            let mut got = vec![0.0; 12];
            dev.download(&c, &mut got).unwrap();
            let want: Vec<f32> = c0.iter().map(|x| x * 0.5).collect();
            assert_eq!(got, want, "{dtype}");
        }
    }
}
