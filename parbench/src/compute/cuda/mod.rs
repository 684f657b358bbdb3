//! The CUDA compute device (feature `cuda`): [`CudaCompute`] implements
//! [`Compute`] with cuBLASLt for the products (f32 accumulation; f32, f16 or
//! bf16 storage) and NVRTC-compiled kernels for bias, GELU, softmax and add.
//!
//! Its buffers are [`DeviceBuffer`]s, the NCCL communicator's own type, and
//! [`CudaCompute::on`] shares a communicator's GPU and stream, so a layer's
//! products and all-reduces are ordered on one stream without host staging.
//!
//! cuBLAS is column-major and parbench row-major: a row-major `C = op(A) op(B)`
//! is the column-major `C^T = op(B)^T op(A)^T`, so the call swaps A and B
//! and m and n, and keeps each operand's transpose flag (see [`CudaCompute::gemm`]).
//! f32 products use `CUBLAS_COMPUTE_32F` (no TF32), so tests can compare tightly.

use super::{matrix_len, Compute, ComputeError, ComputeResult, Gemm, GemmMath};
use crate::comm::{DType, DEFAULT_TIMEOUT};
use crate::gpu::{self, DeviceBuffer, Gpu, GpuError, Lib};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{result as cu, CudaFunction, CudaModule, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod compile;
mod cublaslt;
mod fp8;

use compile::compiled;
use cublaslt::{Desc, Layout, LtHandle, Pref};

pub use compile::{compile_kernels, image_plan, nvrtc_archs, nvrtc_version, ImageKind};
pub use fp8::{fp8_refusal, FP8_ARCH, FP8_K_MULTIPLE};

/// The kernels' source; compiled once per storage type per process.
const KERNELS: &str = include_str!("../cuda_kernels.cu");
/// Threads per block of every kernel (the softmax reductions assume it).
const BLOCK: u32 = 256;
/// Upper bound on blocks of the grid-stride kernels.
const MAX_BLOCKS: u64 = 65_535 * 4;
/// cuBLASLt workspace: NVIDIA recommends 32 MiB on Hopper, enough elsewhere.
const WORKSPACE: usize = 32 << 20;

/// A GPU that computes in one storage type.
pub struct CudaCompute {
    gpu: Gpu,
    dtype: DType,
    lt: LtHandle,
    workspace: DeviceBuffer,
    kernels: Kernels,
    /// The algorithm cuBLASLt's heuristic chose, per product shape.
    algos: Mutex<HashMap<GemmKey, lt::cublasLtMatmulAlgo_t>>,
    timeout: Duration,
    /// FP8 products (`DType::F8E4M3` asked for): their E4M3 operands.
    fp8: Option<Mutex<fp8::Fp8Scratch>>,
}

impl CudaCompute {
    /// The arithmetic of a product on `dtype` storage: cuBLASLt with
    /// `CUBLAS_COMPUTE_32F` feeds f16 and bf16 operands to the tensor cores
    /// as they are and sums in f32; f32 operands multiply in f32 (no TF32).
    /// `F8E4M3` is bf16 storage whose unbatched products multiply in E4M3
    /// (`fp8.rs`).
    pub fn gemm_math_of(dtype: DType) -> GemmMath {
        if dtype == DType::F8E4M3 {
            return GemmMath {
                storage: DType::BF16,
                multiply: DType::F8E4M3,
                accumulate: DType::F32,
            };
        }
        GemmMath {
            storage: dtype,
            multiply: dtype,
            accumulate: DType::F32,
        }
    }

    /// Opens GPU `ordinal` with its own stream, storing tensors as `dtype`
    /// (`float`, `half` or `bfloat16`; `f8e4m3`: bfloat16 with FP8 products,
    /// on sm_89 or newer).
    pub fn new(ordinal: usize, dtype: DType) -> ComputeResult<CudaCompute> {
        gpu::require(&[Lib::Driver, Lib::CublasLt, Lib::Nvrtc])?;
        CudaCompute::on(Gpu::open(ordinal)?, dtype)
    }

    /// Computes on `gpu`'s stream, e.g. the one an NCCL communicator uses
    /// (`NcclComm::gpu`), so products and collectives are ordered together.
    pub fn on(gpu: Gpu, dtype: DType) -> ComputeResult<CudaCompute> {
        let fp8 = dtype == DType::F8E4M3;
        let dtype = if fp8 { DType::BF16 } else { dtype };
        let dtype_code = match dtype {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            other => {
                return Err(ComputeError::Unsupported(format!(
                    "CUDA compute stores float, half or bfloat16, not {other}"
                )))
            }
        };
        gpu::require(&[Lib::Driver, Lib::CublasLt, Lib::Nvrtc])?;
        if let Some(why) = fp8.then(|| fp8_refusal(&gpu)).flatten() {
            return Err(ComputeError::Unsupported(why));
        }
        gpu::guarded("creating the CUDA compute device", || {
            gpu.bind()?;
            let lt = LtHandle::new()?;
            let workspace = gpu.alloc(WORKSPACE)?;
            let kernels = Kernels::load(&gpu, dtype_code)?;
            let fp8 = if fp8 {
                Some(Mutex::new(fp8::Fp8Scratch::new(&gpu)?))
            } else {
                None
            };
            Ok(CudaCompute {
                gpu,
                dtype,
                lt,
                workspace,
                kernels,
                algos: Mutex::new(HashMap::new()),
                timeout: DEFAULT_TIMEOUT,
                fp8,
            })
        })
        .map_err(ComputeError::from)
    }

    /// FP8 products with cuBLASLt's fast accumulation (`on`) or split
    /// accumulation (the default; `fp8.rs`). Refused on a device not
    /// opened for FP8 products.
    pub fn set_fp8_fast_accumulation(&self, on: bool) -> ComputeResult<()> {
        let Some(scratch) = &self.fp8 else {
            return Err(ComputeError::InvalidArgument(
                "fast accumulation is a setting of fp8 products; this device was not opened for them"
                    .into(),
            ));
        };
        scratch
            .lock()
            .map_err(|_| ComputeError::Device("the fp8 scratch's lock is poisoned".into()))?
            .fast_accumulation = on;
        Ok(())
    }

    /// The GPU this device computes on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Which NVRTC image of the kernels the driver loaded: `CUBIN sm_90`, or
    /// `PTX compute_90 (after: ...)` with the reason the CUBIN was not used.
    pub fn kernel_image(&self) -> &str {
        &self.kernels.image
    }

    /// Sets how long [`Compute::sync`] waits before giving up.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        self.gpu.set_timeout(timeout);
    }

    fn size(&self) -> usize {
        self.dtype.size()
    }

    /// Launches the element-wise `kernel(x, y, n)` over `n` elements of
    /// `x` and `y` (GELU writes `y`, add writes `x`: the kernel decides).
    fn launch_on_two(
        &self,
        kernel: &CudaFunction,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
        n: usize,
    ) -> ComputeResult<()> {
        let (px, py) = (self.at(x, 0, n, "x")?, self.at(y, 0, n, "y")?);
        let n = n as u64;
        self.launch(kernel, n, |l| {
            l.arg(&px).arg(&py).arg(&n);
        })
    }

    /// Device address of element `off` of `buf`, checked to hold `len` elements.
    fn at(&self, buf: &DeviceBuffer, off: usize, len: usize, what: &str) -> ComputeResult<u64> {
        if buf.gpu().ordinal() != self.gpu.ordinal() {
            return Err(ComputeError::InvalidArgument(format!(
                "{what} is on GPU {}, this device is GPU {}",
                buf.gpu().ordinal(),
                self.gpu.ordinal()
            )));
        }
        let s = self.size();
        let (Some(o), Some(l)) = (off.checked_mul(s), len.checked_mul(s)) else {
            return Err(ComputeError::InvalidArgument(format!(
                "{what}: size overflows"
            )));
        };
        buf.ptr_at(o, l).map_err(|_| {
            ComputeError::InvalidArgument(format!(
                "{what} holds {} elements, the call needs {}",
                buf.len() / s,
                off.saturating_add(len)
            ))
        })
    }

    /// Launches `f` over a grid sized for `n` items (grid-stride kernels).
    fn launch<'a>(
        &'a self,
        f: &'a CudaFunction,
        n: u64,
        push: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
    ) -> ComputeResult<()> {
        if n == 0 {
            return Ok(());
        }
        let blocks = n.div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
        self.launch_grid(f, blocks, push)
    }

    fn launch_grid<'a>(
        &'a self,
        f: &'a CudaFunction,
        blocks: u32,
        push: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
    ) -> ComputeResult<()> {
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.gpu.stream().launch_builder(f);
        push(&mut b);
        // SAFETY: every pointer argument was bounds-checked by `at` for the
        // extent the kernel touches; scalars match the kernels' signatures.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::call("launching a kernel", e).into())
    }

    /// `C = beta C` over each batch's `m x n` matrix: a product with k = 0.
    fn scale_c(&self, g: &Gemm, c: &DeviceBuffer) -> ComputeResult<()> {
        for i in 0..g.batch.max(1) {
            let off = g.c_offset + i * g.stride_c;
            let p = self.at(c, off, (g.m - 1) * g.ldc + g.n, "C")?;
            let (rows, cols, ldc, beta) = (g.m as u64, g.n as u64, g.ldc as u64, g.beta);
            self.launch(&self.kernels.scale_matrix, rows * cols, |l| {
                l.arg(&p).arg(&rows).arg(&cols).arg(&ldc).arg(&beta);
            })?;
        }
        Ok(())
    }

    /// cuBLASLt's `D = alpha op(1) op(2) + beta C` (D = C) with the
    /// algorithm its heuristic chose for `key` (cached): `ops` are the
    /// device addresses of operand 1, operand 2 and C, laid out as `lays`.
    ///
    /// # Safety
    /// Each address must hold what its layout describes, on this GPU.
    unsafe fn matmul(
        &self,
        g: &Gemm,
        key: &GemmKey,
        desc: &Desc,
        lays: [&Layout; 3],
        ops: [u64; 3],
    ) -> ComputeResult<()> {
        let [l1, l2, lc] = lays.map(|l| l.0);
        let cached = self.algos.lock().ok().and_then(|m| m.get(key).copied());
        let algo = match cached {
            Some(a) => a,
            None => {
                let pref = Pref::new(WORKSPACE, key.align)?;
                self.gpu.bind()?;
                // SAFETY: every descriptor is alive for the call.
                let h = unsafe {
                    cudarc::cublaslt::result::get_matmul_algo_heuristic(
                        self.lt.0, desc.0, l1, l2, lc, lc, pref.0,
                    )
                }
                .map_err(|e| GpuError::call(format!("cuBLASLt found no algorithm for {g:?}"), e))?;
                if let Ok(mut m) = self.algos.lock() {
                    m.insert(*key, h.algo);
                }
                h.algo
            }
        };
        let (alpha, beta) = (g.alpha, g.beta);
        let [p1, p2, pc] = ops;
        self.gpu.bind()?;
        // SAFETY: the caller vouches for the operands; the descriptors live
        // until after the call; alpha and beta are f32 as the scale type says.
        unsafe {
            cudarc::cublaslt::result::matmul(
                self.lt.0,
                desc.0,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                p1 as *const c_void,
                l1,
                p2 as *const c_void,
                l2,
                pc as *const c_void,
                lc,
                pc as *mut c_void,
                lc,
                &algo,
                self.workspace.ptr() as *mut c_void,
                WORKSPACE,
                self.gpu.stream().cu_stream() as lt::cudaStream_t,
            )
        }
        .map_err(|e| GpuError::call("cublasLtMatmul", e).into())
    }

    fn data_type(&self) -> lt::cudaDataType {
        match self.dtype {
            DType::F16 => lt::cudaDataType_t::CUDA_R_16F,
            DType::BF16 => lt::cudaDataType_t::CUDA_R_16BF,
            _ => lt::cudaDataType_t::CUDA_R_32F,
        }
    }
}

/// What identifies a product for the algorithm cache.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct GemmKey {
    dims: [u64; 3],
    trans: (bool, bool),
    lds: [i64; 3],
    strides: [i64; 3],
    batch: i32,
    align: [u32; 3],
    /// E4M3 operands, with fast accumulation or not (the same shape in
    /// bf16, or in the other accumulation, takes another algorithm).
    fp8: Option<bool>,
}

/// The largest power of two (up to 256) that divides `ptr`: what cuBLASLt
/// may assume about an operand's alignment (its default assumes 256).
fn alignment(ptr: u64) -> u32 {
    1u32 << ptr.trailing_zeros().min(8)
}

fn to_i64(v: usize, what: &str) -> ComputeResult<i64> {
    i64::try_from(v).map_err(|_| ComputeError::InvalidArgument(format!("{what} {v} too large")))
}

impl Compute for CudaCompute {
    type Buf = DeviceBuffer;

    fn name(&self) -> String {
        let fp8 = if self.fp8.is_some() {
            ", fp8 E4M3 GEMMs"
        } else {
            ""
        };
        format!("{} (cuBLASLt, {}{fp8})", self.gpu.name(), self.dtype)
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn gemm_math(&self) -> GemmMath {
        if self.fp8.is_some() {
            return Self::gemm_math_of(DType::F8E4M3);
        }
        Self::gemm_math_of(self.dtype)
    }

    fn alloc(&self, len: usize) -> ComputeResult<DeviceBuffer> {
        let bytes = len
            .checked_mul(self.size())
            .ok_or_else(|| ComputeError::InvalidArgument(format!("{len} elements overflow")))?;
        Ok(self.gpu.alloc(bytes)?)
    }

    fn upload(&self, src: &[f32], dst: &mut DeviceBuffer) -> ComputeResult<()> {
        self.at(dst, 0, src.len(), "upload destination")?;
        let bytes: Vec<u8> = match self.dtype {
            DType::F16 => src
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            DType::BF16 => src
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            _ => bytemuck::cast_slice(src).to_vec(),
        };
        Ok(dst.upload_at(0, &bytes)?)
    }

    fn download(&self, src: &DeviceBuffer, dst: &mut [f32]) -> ComputeResult<()> {
        self.at(src, 0, dst.len(), "download source")?;
        let mut bytes = vec![0u8; dst.len() * self.size()];
        src.download_at(0, &mut bytes)?;
        match self.dtype {
            DType::F16 => {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            DType::BF16 => {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            _ => {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
        Ok(())
    }

    fn copy(
        &self,
        src: &DeviceBuffer,
        s_off: usize,
        dst: &mut DeviceBuffer,
        d_off: usize,
        len: usize,
    ) -> ComputeResult<()> {
        let s = self.at(src, s_off, len, "copy source")?;
        let d = self.at(dst, d_off, len, "copy destination")?;
        if len == 0 {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: both ranges checked to hold `len` elements.
        unsafe { cu::memcpy_dtod_async(d, s, len * self.size(), self.gpu.stream().cu_stream()) }
            .map_err(|e| GpuError::call("device copy", e).into())
    }

    /// Row-major `C = alpha op(A) op(B) + beta C` as the column-major
    /// `C^T = alpha op(B)^T op(A)^T + beta C^T`: cuBLASLt's first operand is
    /// our B (its stored shape, read column-major, is B^T), its second our A,
    /// its m our n.
    fn gemm(
        &self,
        g: &Gemm,
        a: &DeviceBuffer,
        b: &DeviceBuffer,
        c: &mut DeviceBuffer,
    ) -> ComputeResult<()> {
        let s = self.size();
        let (ea, eb, ec) = g.check((a.len() / s, b.len() / s, c.len() / s))?;
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        if g.k == 0 {
            return self.scale_c(g, c);
        }
        let pa = self.at(a, 0, ea, "A")? + (g.a_offset * s) as u64;
        let pb = self.at(b, 0, eb, "B")? + (g.b_offset * s) as u64;
        let pc = self.at(c, 0, ec, "C")? + (g.c_offset * s) as u64;
        if self.runs_in_fp8(g) {
            return self.gemm_fp8(g, pa, pb, pc);
        }
        let batch = g.batch.max(1);
        // cuBLASLt wants ld >= the stored row length even for a single row,
        // whose ld addresses nothing (Gemm::check lets it be shorter).
        let a_cols = if g.trans_a { g.m } else { g.k };
        let b_cols = if g.trans_b { g.k } else { g.n };
        let key = GemmKey {
            dims: [g.n as u64, g.m as u64, g.k as u64],
            trans: (g.trans_b, g.trans_a),
            lds: [
                to_i64(g.ldb.max(b_cols), "ldb")?,
                to_i64(g.lda.max(a_cols), "lda")?,
                to_i64(g.ldc.max(g.n), "ldc")?,
            ],
            strides: [
                to_i64(g.stride_b, "stride_b")?,
                to_i64(g.stride_a, "stride_a")?,
                to_i64(g.stride_c, "stride_c")?,
            ],
            batch: i32::try_from(batch)
                .map_err(|_| ComputeError::InvalidArgument(format!("batch {batch} too large")))?,
            align: [alignment(pb), alignment(pa), alignment(pc)],
            fp8: None,
        };
        // cuBLASLt operand 1 = our B, operand 2 = our A; shapes as stored, column-major.
        let (n, m, k) = (g.n as u64, g.m as u64, g.k as u64);
        let l1 = if g.trans_b { (k, n) } else { (n, k) };
        let l2 = if g.trans_a { (m, k) } else { (k, m) };
        let dt = self.data_type();
        let lay1 = Layout::new(dt, l1, key.lds[0], key.batch, key.strides[0])?;
        let lay2 = Layout::new(dt, l2, key.lds[1], key.batch, key.strides[1])?;
        let lay_c = Layout::new(dt, (n, m), key.lds[2], key.batch, key.strides[2])?;
        let desc = Desc::new(key.trans)?;
        // SAFETY: operands were checked against their buffers (extents cover
        // every batch).
        unsafe { self.matmul(g, &key, &desc, [&lay1, &lay2, &lay_c], [pb, pa, pc]) }
    }

    fn add_bias(
        &self,
        x: &mut DeviceBuffer,
        bias: &DeviceBuffer,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        let n = matrix_len("add_bias", rows, cols)?;
        let px = self.at(x, 0, n, "x")?;
        let pb = self.at(bias, 0, cols, "bias")?;
        let (r, c) = (rows as u64, cols as u64);
        self.launch(&self.kernels.add_bias, n as u64, |l| {
            l.arg(&px).arg(&pb).arg(&r).arg(&c);
        })
    }

    fn bias_grad(
        &self,
        dy: &DeviceBuffer,
        db: &mut DeviceBuffer,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        let n = matrix_len("bias_grad", rows, cols)?;
        let pdy = self.at(dy, 0, n, "dy")?;
        let pdb = self.at(db, 0, cols, "db")?;
        let (r, c) = (rows as u64, cols as u64);
        self.launch(&self.kernels.bias_grad, c, |l| {
            l.arg(&pdy).arg(&pdb).arg(&r).arg(&c);
        })
    }

    fn gelu(&self, x: &DeviceBuffer, y: &mut DeviceBuffer, n: usize) -> ComputeResult<()> {
        self.launch_on_two(&self.kernels.gelu, x, y, n)
    }

    fn gelu_backward(
        &self,
        x: &DeviceBuffer,
        dy: &DeviceBuffer,
        dx: &mut DeviceBuffer,
        n: usize,
    ) -> ComputeResult<()> {
        let px = self.at(x, 0, n, "x")?;
        let pdy = self.at(dy, 0, n, "dy")?;
        let pdx = self.at(dx, 0, n, "dx")?;
        let n = n as u64;
        self.launch(&self.kernels.gelu_backward, n, |l| {
            l.arg(&px).arg(&pdy).arg(&pdx).arg(&n);
        })
    }

    fn softmax(
        &self,
        x: &mut DeviceBuffer,
        offset: usize,
        rows: usize,
        cols: usize,
        causal: bool,
    ) -> ComputeResult<()> {
        let n = matrix_len("softmax", rows, cols)?;
        let p = self.at(x, offset, n, "x")?;
        if n == 0 {
            return Ok(());
        }
        let (r, c, causal) = (rows as u64, cols as u64, causal as i32);
        let blocks = r.min(MAX_BLOCKS) as u32;
        self.launch_grid(&self.kernels.softmax, blocks, |l| {
            l.arg(&p).arg(&r).arg(&c).arg(&causal);
        })
    }

    fn softmax_backward(
        &self,
        y: &DeviceBuffer,
        dy: &mut DeviceBuffer,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        let n = matrix_len("softmax_backward", rows, cols)?;
        let py = self.at(y, offset, n, "y")?;
        let pdy = self.at(dy, offset, n, "dy")?;
        if n == 0 {
            return Ok(());
        }
        let (r, c) = (rows as u64, cols as u64);
        let blocks = r.min(MAX_BLOCKS) as u32;
        self.launch_grid(&self.kernels.softmax_backward, blocks, |l| {
            l.arg(&py).arg(&pdy).arg(&r).arg(&c);
        })
    }

    fn add(&self, x: &mut DeviceBuffer, y: &DeviceBuffer, n: usize) -> ComputeResult<()> {
        self.launch_on_two(&self.kernels.add, x, y, n)
    }

    fn sync(&self) -> ComputeResult<()> {
        Ok(self.gpu.wait("compute", self.timeout)?)
    }
}

/// The NVRTC-compiled kernels of one storage type, loaded into one context.
struct Kernels {
    /// What was loaded: `CUBIN sm_90`, or `PTX compute_90 (...)` when the
    /// CUBIN could not be made or loaded.
    image: String,
    add_bias: CudaFunction,
    bias_grad: CudaFunction,
    gelu: CudaFunction,
    gelu_backward: CudaFunction,
    softmax: CudaFunction,
    softmax_backward: CudaFunction,
    add: CudaFunction,
    scale_matrix: CudaFunction,
    zero_u32: CudaFunction,
    amax: CudaFunction,
    cast_e4m3: CudaFunction,
}

impl Kernels {
    /// Compiles (once per process) and loads the kernels for `gpu`'s compute
    /// capability: the CUBIN of its own architecture first, which the driver
    /// loads as it is, then PTX, which the driver compiles at load time and
    /// refuses when NVRTC is newer than the driver.
    fn load(gpu: &Gpu, dtype_code: u32) -> Result<Kernels, GpuError> {
        let (major, minor) = gpu.compute_capability().ok_or_else(|| {
            GpuError::call(
                format!("GPU {}: reading its compute capability", gpu.ordinal()),
                "cuDeviceGetAttribute failed",
            )
        })?;
        let device_arch = u32::try_from(major * 10 + minor).unwrap_or(0);
        let supported = nvrtc_archs()?;
        let plan = image_plan(device_arch, &supported);
        if plan.is_empty() {
            return Err(GpuError::call(
                "compiling the kernels with NVRTC",
                format!(
                    "NVRTC supports sm_{} to sm_{}, none at or below the device's sm_{device_arch}",
                    supported.first().copied().unwrap_or(0),
                    supported.last().copied().unwrap_or(0)
                ),
            ));
        }
        let mut failures = Vec::new();
        for (kind, arch) in plan {
            let label = kind.label(arch);
            let module = compiled(dtype_code, kind, arch).and_then(|image| {
                gpu.context()
                    .load_module(cudarc::nvrtc::Ptx::from_binary((*image).clone()))
                    .map_err(|e| GpuError::call(format!("loading the {label} module"), e))
            });
            match module {
                Ok(module) => {
                    let image = if failures.is_empty() {
                        label
                    } else {
                        format!("{label} (after: {})", failures.join("; "))
                    };
                    return Kernels::from_module(&module, image);
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(GpuError::call(
            format!("GPU {}: loading the NVRTC kernels", gpu.ordinal()),
            format!(
                "{} (the driver refuses PTX newer than itself: put an NVRTC of the driver's CUDA version, or older, first on LD_LIBRARY_PATH)",
                failures.join("; ")
            ),
        ))
    }

    fn from_module(module: &Arc<CudaModule>, image: String) -> Result<Kernels, GpuError> {
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| GpuError::call(format!("finding kernel {name}"), e))
        };
        Ok(Kernels {
            image,
            add_bias: f("pb_add_bias")?,
            bias_grad: f("pb_bias_grad")?,
            gelu: f("pb_gelu")?,
            gelu_backward: f("pb_gelu_backward")?,
            softmax: f("pb_softmax")?,
            softmax_backward: f("pb_softmax_backward")?,
            add: f("pb_add")?,
            scale_matrix: f("pb_scale_matrix")?,
            zero_u32: f("pb_zero_u32")?,
            amax: f("pb_amax")?,
            cast_e4m3: f("pb_cast_e4m3")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0x1000), 256);
        assert_eq!(alignment(0x1002), 2);
        assert_eq!(alignment(0x1010), 16);
    }
}
