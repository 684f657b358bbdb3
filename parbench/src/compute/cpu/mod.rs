//! The CPU compute device: matrix products with the gemm crate, element-wise
//! kernels in plain loops, tensors in [`HostBuffer`]s so that the very same
//! buffers go to the CPU communicators ([`crate::comm::HostComm`]).
//!
//! Kernels: the gemm crate's f32 kernels, chosen by the crate at run time:
//! AVX-512 where the CPU has it (the workspace enables gemm's `x86-v4`
//! feature, which compiles them in), else AVX2+FMA, else scalar; NEON on
//! aarch64. [`GemmKernels::detect`] says which set runs, and
//! [`Compute::name`] carries it into every record.
//!
//! Storage types:
//! - `f32`: the products run in f32.
//! - `f16` and `bf16`: storage only. Each product widens the operand regions
//!   it reads to f32 (exactly: every f16 and bf16 value is an f32), runs the
//!   same f32 kernels, sums in f32 and rounds C back once, so its result is
//!   the f32 product of the stored operands, rounded once
//!   ([`Compute::gemm_math`] records this). Neither the AVX512-FP16 nor the
//!   AVX512-BF16 (or AMX) instructions are used: the gemm crate has no such
//!   kernels (its f16 path converts to f32 as it packs, and rounds partial
//!   sums to f16 between depth blocks), and a 16-bit product therefore costs
//!   an f32 product plus the conversions. Element-wise kernels always
//!   compute in f32.
//!
//! Threads: each `CpuCompute` has a thread budget. Ranks that share a machine
//! must split its cores (see [`CpuCompute::threads_per_rank`]) or their GEMMs
//! oversubscribe the cores and every rank slows down unevenly.

use super::{matrix_len, Compute, ComputeError, ComputeResult, Gemm, GemmMath};
use crate::comm::{DType, Element, HostBuffer};
use gemm::Parallelism;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

mod gelu_loops;

/// A floating-point storage type the CPU kernels compute on, through f32.
trait Real: Element + Copy {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// `dst = src` widened (equal lengths).
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    /// `dst = src` rounded to nearest (equal lengths).
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(*s);
        }
    }
}

impl Real for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Real for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    // half's slice conversions use the CPU's conversion instructions (F16C)
    // where it has them, eight elements at a time.
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

impl Real for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Runs `$body` with `$T` bound to the storage type of `$self`.
macro_rules! with_real {
    ($self:expr, $T:ident => $body:expr) => {
        match $self.dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            other => Err(ComputeError::Unsupported(format!(
                "cpu compute stores f32, f16 or bf16, not {other}"
            ))),
        }
    };
}

/// The gemm crate's kernel sets, one of which it runs on a given CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernels {
    /// 512-bit AVX-512F kernels (compiled in by the workspace's `x86-v4`
    /// feature of gemm).
    Avx512,
    /// 256-bit AVX2 + FMA kernels.
    Avx2Fma,
    /// 128-bit NEON kernels (aarch64).
    Neon,
    /// Portable scalar loops.
    Scalar,
}

impl GemmKernels {
    /// The name records and tables use.
    pub fn name(self) -> &'static str {
        match self {
            GemmKernels::Avx512 => "avx512f",
            GemmKernels::Avx2Fma => "avx2+fma",
            GemmKernels::Neon => "neon",
            GemmKernels::Scalar => "scalar",
        }
    }

    /// The kernel set the gemm crate runs on this CPU, decided as the crate
    /// decides it (gemm-common 0.19, `init_gemm_fn`): AVX-512 where the CPU
    /// has avx512f, else AVX2+FMA where it has fma, else scalar; NEON on
    /// aarch64. An error where the crate's choice would abort: it picks the
    /// AVX-512 kernels on avx512f alone and then requires the whole x86-64-v4
    /// set (avx512bw, cd, dq, vl; a Xeon Phi has avx512f without them).
    pub fn detect() -> ComputeResult<GemmKernels> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let v4 = has!("avx512bw")
                && has!("avx512cd")
                && has!("avx512dq")
                && has!("avx512vl")
                && has!("avx2")
                && has!("fma")
                && has!("bmi1")
                && has!("bmi2")
                && has!("lzcnt");
            Self::x86_choice(has!("avx512f"), v4, has!("fma"))
        }
        #[cfg(target_arch = "aarch64")]
        {
            Ok(if std::arch::is_aarch64_feature_detected!("neon") {
                GemmKernels::Neon
            } else {
                GemmKernels::Scalar
            })
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Ok(GemmKernels::Scalar)
        }
    }

    /// The crate's x86 choice from the CPU's features (`v4`: the rest of
    /// the x86-64-v4 set beside avx512f).
    fn x86_choice(avx512f: bool, v4: bool, fma: bool) -> ComputeResult<GemmKernels> {
        match (avx512f, v4, fma) {
            (true, true, _) => Ok(GemmKernels::Avx512),
            (true, false, _) => Err(ComputeError::Unsupported(
                "this CPU has AVX-512F without the rest of x86-64-v4 (avx512bw/cd/dq/vl): \
                 the gemm crate would choose its AVX-512 kernels and abort"
                    .into(),
            )),
            (false, _, true) => Ok(GemmKernels::Avx2Fma),
            (false, _, false) => Ok(GemmKernels::Scalar),
        }
    }
}

/// The CPU device: gemm-crate products with a fixed thread budget.
#[derive(Clone, Debug)]
pub struct CpuCompute {
    dtype: DType,
    threads: usize,
    kernels: GemmKernels,
}

impl CpuCompute {
    /// A device storing `dtype` (f32, f16 or bf16) whose products use at most
    /// `threads` threads (0 or 1: the calling thread only).
    pub fn new(dtype: DType, threads: usize) -> ComputeResult<Self> {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => Ok(CpuCompute {
                dtype,
                threads: threads.max(1),
                kernels: GemmKernels::detect()?,
            }),
            other => Err(ComputeError::Unsupported(format!(
                "cpu compute stores f32, f16 or bf16, not {other}"
            ))),
        }
    }

    /// The thread budget of one of `local_ranks` ranks sharing this machine:
    /// the machine's cores divided evenly, at least one. Every bench that
    /// runs several ranks on one host (local threads or `--nprocs` processes)
    /// sizes its devices with this, so that the ranks together use each core
    /// once.
    pub fn threads_per_rank(local_ranks: usize) -> usize {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        (cores / local_ranks.max(1)).max(1)
    }

    /// The thread budget of each product.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The gemm crate's kernel set on this CPU.
    pub fn kernels(&self) -> GemmKernels {
        self.kernels
    }

    /// The arithmetic of a product on `dtype` storage: f32 multiply-adds
    /// whatever the storage type (see the module's documentation).
    pub fn gemm_math_of(dtype: DType) -> GemmMath {
        GemmMath {
            storage: dtype,
            multiply: DType::F32,
            accumulate: DType::F32,
        }
    }

    /// How the gemm crate may parallelise one product.
    pub fn parallelism(&self) -> Parallelism {
        if self.threads <= 1 {
            Parallelism::None
        } else {
            Parallelism::Rayon(self.threads)
        }
    }

    fn elems<'a, T: Real>(&self, buf: &'a HostBuffer) -> &'a [T] {
        buf.as_slice::<T>()
    }
}

/// Checks that `[off, off + len)` lies in a tensor of `have` elements.
fn check_range(what: &str, off: usize, len: usize, have: usize) -> ComputeResult<()> {
    match off.checked_add(len) {
        Some(end) if end <= have => Ok(()),
        _ => Err(ComputeError::InvalidArgument(format!(
            "{what}: elements {off}..{off}+{len} exceed the tensor's {have}"
        ))),
    }
}

/// Validates `g` against operands of `a`, `b`, `c` elements with the one
/// check every device shares ([`Gemm::check`]); returns the extents (one
/// past the last element touched) of A, B and C. Batches run one after
/// another, so batches whose C overlap (the heads of an attention,
/// interleaved in one row) are well defined; within one batch, ld >= cols
/// keeps every thread's elements apart.
fn check_gemm(g: &Gemm, a: usize, b: usize, c: usize) -> ComputeResult<(usize, usize, usize)> {
    g.check((a, b, c))
}

/// One f32 product on slices whose extents [`check_gemm`] has validated.
fn gemm_f32(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32], par: Parallelism) {
    // With beta = 0, C may hold anything (NaN included): never read it.
    let read_c = g.beta != 0.0;
    let (a_rs, a_cs) = if g.trans_a { (1, g.lda) } else { (g.lda, 1) };
    let (b_rs, b_cs) = if g.trans_b { (1, g.ldb) } else { (g.ldb, 1) };
    for i in 0..g.batch.max(1) {
        let (ao, bo, co) = (
            g.a_offset + i * g.stride_a,
            g.b_offset + i * g.stride_b,
            g.c_offset + i * g.stride_c,
        );
        // SAFETY: check_gemm proved that every element this batch reads or
        // writes lies inside `a`, `b` and `c` (ld >= cols, so the rows of C do
        // not overlap and no two threads write one element); `c` is a unique
        // borrow, so it aliases neither input. Slices never exceed
        // isize::MAX elements, so the strides fit in isize.
        unsafe {
            gemm::gemm(
                g.m,
                g.n,
                g.k,
                c.as_mut_ptr().add(co),
                1,
                g.ldc as isize,
                read_c,
                a.as_ptr().add(ao),
                a_cs as isize,
                a_rs as isize,
                b.as_ptr().add(bo),
                b_cs as isize,
                b_rs as isize,
                // The gemm crate computes dst = alpha dst + beta lhs rhs: its
                // alpha is our beta and the other way round.
                g.beta,
                g.alpha,
                false,
                false,
                false,
                par,
            );
        }
    }
}

/// Widens `src[lo..hi]` to f32.
fn widen<T: Real>(src: &[T], lo: usize, hi: usize) -> Vec<f32> {
    let mut out = vec![0f32; hi - lo];
    T::widen_slice(&src[lo..hi], &mut out);
    out
}

/// Elements an element-wise kernel widens to f32 at a time (on the stack).
const CHUNK: usize = 1024;

/// Number of leading columns of row `r` a softmax keeps.
#[inline]
fn kept(r: usize, cols: usize, causal: bool) -> usize {
    if causal {
        (r % cols) + 1
    } else {
        cols
    }
}

impl CpuCompute {
    fn gemm_typed<T: Real>(
        &self,
        g: &Gemm,
        a: &HostBuffer,
        b: &HostBuffer,
        c: &mut HostBuffer,
    ) -> ComputeResult<()> {
        let (av, bv) = (self.elems::<T>(a), self.elems::<T>(b));
        let cv = c.as_mut_slice::<T>();
        let (ea, eb, ec) = check_gemm(g, av.len(), bv.len(), cv.len())?;
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        let par = self.parallelism();
        if T::DTYPE == DType::F32 {
            let (av, bv) = (
                bytemuck::cast_slice::<T, f32>(av),
                bytemuck::cast_slice::<T, f32>(bv),
            );
            gemm_f32(g, av, bv, bytemuck::cast_slice_mut::<T, f32>(cv), par);
            return Ok(());
        }
        // f16 and bf16: widen exactly the regions the product touches, so the
        // cost is one pass over the operands; C is widened whole (not zeroed)
        // so that the columns between its rows survive the round trip
        // unchanged, and rounded back once, after the whole sum.
        let a32 = widen(av, g.a_offset, ea);
        let b32 = widen(bv, g.b_offset, eb);
        let mut c32 = widen(cv, g.c_offset, ec);
        let local = Gemm {
            a_offset: 0,
            b_offset: 0,
            c_offset: 0,
            ..*g
        };
        gemm_f32(&local, &a32, &b32, &mut c32, par);
        T::narrow_slice(&c32, &mut cv[g.c_offset..ec]);
        Ok(())
    }

    fn add_bias_typed<T: Real>(
        &self,
        x: &mut HostBuffer,
        bias: &HostBuffer,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        let bv = self.elems::<T>(bias);
        let xv = x.as_mut_slice::<T>();
        check_range("add_bias bias", 0, cols, bv.len())?;
        let n = matrix_len("add_bias", rows, cols)?;
        check_range("add_bias x", 0, n, xv.len())?;
        if cols == 0 {
            return Ok(());
        }
        for row in xv[..n].chunks_exact_mut(cols) {
            for (v, b) in row.iter_mut().zip(&bv[..cols]) {
                *v = T::from_f32(v.to_f32() + b.to_f32());
            }
        }
        Ok(())
    }

    fn bias_grad_typed<T: Real>(
        &self,
        dy: &HostBuffer,
        db: &mut HostBuffer,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        let dyv = self.elems::<T>(dy);
        let dbv = db.as_mut_slice::<T>();
        check_range("bias_grad db", 0, cols, dbv.len())?;
        let n = matrix_len("bias_grad", rows, cols)?;
        check_range("bias_grad dy", 0, n, dyv.len())?;
        let mut acc = vec![0f32; cols];
        if cols > 0 {
            for row in dyv[..n].chunks_exact(cols) {
                for (a, v) in acc.iter_mut().zip(row) {
                    *a += v.to_f32();
                }
            }
        }
        for (d, a) in dbv[..cols].iter_mut().zip(acc) {
            *d = T::from_f32(a);
        }
        Ok(())
    }

    fn gelu_typed<T: Real>(
        &self,
        x: &HostBuffer,
        y: &mut HostBuffer,
        n: usize,
    ) -> ComputeResult<()> {
        let xv = self.elems::<T>(x);
        let yv = y.as_mut_slice::<T>();
        check_range("gelu x", 0, n, xv.len())?;
        check_range("gelu y", 0, n, yv.len())?;
        let (mut xb, mut yb) = ([0f32; CHUNK], [0f32; CHUNK]);
        for (yc, xc) in yv[..n].chunks_mut(CHUNK).zip(xv[..n].chunks(CHUNK)) {
            let len = xc.len();
            T::widen_slice(xc, &mut xb[..len]);
            gelu_loops::forward(&xb[..len], &mut yb[..len]);
            T::narrow_slice(&yb[..len], yc);
        }
        Ok(())
    }

    fn gelu_backward_typed<T: Real>(
        &self,
        x: &HostBuffer,
        dy: &HostBuffer,
        dx: &mut HostBuffer,
        n: usize,
    ) -> ComputeResult<()> {
        let (xv, dyv) = (self.elems::<T>(x), self.elems::<T>(dy));
        let dxv = dx.as_mut_slice::<T>();
        check_range("gelu_backward x", 0, n, xv.len())?;
        check_range("gelu_backward dy", 0, n, dyv.len())?;
        check_range("gelu_backward dx", 0, n, dxv.len())?;
        let (mut xb, mut gb, mut ob) = ([0f32; CHUNK], [0f32; CHUNK], [0f32; CHUNK]);
        let chunks = xv[..n].chunks(CHUNK).zip(dyv[..n].chunks(CHUNK));
        for ((xc, gc), oc) in chunks.zip(dxv[..n].chunks_mut(CHUNK)) {
            let len = xc.len();
            T::widen_slice(xc, &mut xb[..len]);
            T::widen_slice(gc, &mut gb[..len]);
            gelu_loops::backward(&xb[..len], &gb[..len], &mut ob[..len]);
            T::narrow_slice(&ob[..len], oc);
        }
        Ok(())
    }

    fn softmax_typed<T: Real>(
        &self,
        x: &mut HostBuffer,
        offset: usize,
        rows: usize,
        cols: usize,
        causal: bool,
    ) -> ComputeResult<()> {
        let xv = x.as_mut_slice::<T>();
        let n = matrix_len("softmax", rows, cols)?;
        check_range("softmax x", offset, n, xv.len())?;
        if cols == 0 {
            return Ok(());
        }
        let mut buf = vec![0f32; cols];
        for (r, row) in xv[offset..offset + n].chunks_exact_mut(cols).enumerate() {
            let keep = kept(r, cols, causal);
            let mut max = f32::NEG_INFINITY;
            for (b, v) in buf[..keep].iter_mut().zip(&row[..keep]) {
                *b = v.to_f32();
                max = max.max(*b);
            }
            let mut sum = 0f32;
            for b in &mut buf[..keep] {
                *b = (*b - max).exp();
                sum += *b;
            }
            let inv = 1.0 / sum;
            for (v, b) in row[..keep].iter_mut().zip(&buf[..keep]) {
                *v = T::from_f32(b * inv);
            }
            for v in &mut row[keep..] {
                *v = T::from_f32(0.0);
            }
        }
        Ok(())
    }

    fn softmax_backward_typed<T: Real>(
        &self,
        y: &HostBuffer,
        dy: &mut HostBuffer,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        let yv = self.elems::<T>(y);
        let dyv = dy.as_mut_slice::<T>();
        let n = matrix_len("softmax_backward", rows, cols)?;
        check_range("softmax_backward y", offset, n, yv.len())?;
        check_range("softmax_backward dy", offset, n, dyv.len())?;
        if cols == 0 {
            return Ok(());
        }
        let ys = yv[offset..offset + n].chunks_exact(cols);
        for (yr, dr) in ys.zip(dyv[offset..offset + n].chunks_exact_mut(cols)) {
            let dot: f32 = yr
                .iter()
                .zip(dr.iter())
                .map(|(a, b)| a.to_f32() * b.to_f32())
                .sum();
            for (d, yi) in dr.iter_mut().zip(yr) {
                let yf = yi.to_f32();
                *d = T::from_f32(yf * (d.to_f32() - dot));
            }
        }
        Ok(())
    }

    fn add_typed<T: Real>(
        &self,
        x: &mut HostBuffer,
        y: &HostBuffer,
        n: usize,
    ) -> ComputeResult<()> {
        let yv = self.elems::<T>(y);
        let xv = x.as_mut_slice::<T>();
        check_range("add x", 0, n, xv.len())?;
        check_range("add y", 0, n, yv.len())?;
        for (a, b) in xv[..n].iter_mut().zip(&yv[..n]) {
            *a = T::from_f32(a.to_f32() + b.to_f32());
        }
        Ok(())
    }

    fn copy_typed<T: Real>(
        &self,
        src: &HostBuffer,
        s_off: usize,
        dst: &mut HostBuffer,
        d_off: usize,
        len: usize,
    ) -> ComputeResult<()> {
        let sv = self.elems::<T>(src);
        let dv = dst.as_mut_slice::<T>();
        check_range("copy src", s_off, len, sv.len())?;
        check_range("copy dst", d_off, len, dv.len())?;
        dv[d_off..d_off + len].copy_from_slice(&sv[s_off..s_off + len]);
        Ok(())
    }
}

impl Compute for CpuCompute {
    type Buf = HostBuffer;

    fn name(&self) -> String {
        format!(
            "cpu (gemm {} kernels, {} thread{})",
            self.kernels.name(),
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        )
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn gemm_math(&self) -> GemmMath {
        Self::gemm_math_of(self.dtype)
    }

    fn alloc(&self, len: usize) -> ComputeResult<HostBuffer> {
        let bytes = len.checked_mul(self.dtype.size()).ok_or_else(|| {
            ComputeError::InvalidArgument(format!("alloc: {len} elements overflow"))
        })?;
        Ok(HostBuffer::zeroed(bytes))
    }

    fn upload(&self, src: &[f32], dst: &mut HostBuffer) -> ComputeResult<()> {
        with_real!(self, T => {
            let dv = dst.as_mut_slice::<T>();
            check_range("upload", 0, src.len(), dv.len())?;
            for (d, s) in dv.iter_mut().zip(src) {
                *d = T::from_f32(*s);
            }
            Ok(())
        })
    }

    fn download(&self, src: &HostBuffer, dst: &mut [f32]) -> ComputeResult<()> {
        with_real!(self, T => {
            let sv = self.elems::<T>(src);
            check_range("download", 0, dst.len(), sv.len())?;
            for (d, s) in dst.iter_mut().zip(sv) {
                *d = s.to_f32();
            }
            Ok(())
        })
    }

    fn copy(
        &self,
        src: &HostBuffer,
        s_off: usize,
        dst: &mut HostBuffer,
        d_off: usize,
        len: usize,
    ) -> ComputeResult<()> {
        with_real!(self, T => self.copy_typed::<T>(src, s_off, dst, d_off, len))
    }

    fn gemm(
        &self,
        g: &Gemm,
        a: &HostBuffer,
        b: &HostBuffer,
        c: &mut HostBuffer,
    ) -> ComputeResult<()> {
        with_real!(self, T => self.gemm_typed::<T>(g, a, b, c))
    }

    fn add_bias(
        &self,
        x: &mut HostBuffer,
        bias: &HostBuffer,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        with_real!(self, T => self.add_bias_typed::<T>(x, bias, rows, cols))
    }

    fn bias_grad(
        &self,
        dy: &HostBuffer,
        db: &mut HostBuffer,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        with_real!(self, T => self.bias_grad_typed::<T>(dy, db, rows, cols))
    }

    fn gelu(&self, x: &HostBuffer, y: &mut HostBuffer, n: usize) -> ComputeResult<()> {
        with_real!(self, T => self.gelu_typed::<T>(x, y, n))
    }

    fn gelu_backward(
        &self,
        x: &HostBuffer,
        dy: &HostBuffer,
        dx: &mut HostBuffer,
        n: usize,
    ) -> ComputeResult<()> {
        with_real!(self, T => self.gelu_backward_typed::<T>(x, dy, dx, n))
    }

    fn softmax(
        &self,
        x: &mut HostBuffer,
        offset: usize,
        rows: usize,
        cols: usize,
        causal: bool,
    ) -> ComputeResult<()> {
        with_real!(self, T => self.softmax_typed::<T>(x, offset, rows, cols, causal))
    }

    fn softmax_backward(
        &self,
        y: &HostBuffer,
        dy: &mut HostBuffer,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> ComputeResult<()> {
        with_real!(self, T => self.softmax_backward_typed::<T>(y, dy, offset, rows, cols))
    }

    fn add(&self, x: &mut HostBuffer, y: &HostBuffer, n: usize) -> ComputeResult<()> {
        with_real!(self, T => self.add_typed::<T>(x, y, n))
    }
}

#[cfg(test)]
mod tests {
    use super::gelu_loops::exp_f32;
    use super::*;

    /// Deterministic values in [-1, 1) (xorshift), so tests need no RNG crate.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn buf(dev: &CpuCompute, data: &[f32]) -> HostBuffer {
        let mut b = dev.alloc(data.len()).unwrap();
        dev.upload(data, &mut b).unwrap();
        b
    }

    fn host(dev: &CpuCompute, b: &HostBuffer, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        dev.download(b, &mut out).unwrap();
        out
    }

    /// The product by definition, in f64.
    fn naive(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        for bi in 0..g.batch.max(1) {
            for i in 0..g.m {
                for j in 0..g.n {
                    let mut acc = 0f64;
                    for p in 0..g.k {
                        let av = if g.trans_a {
                            a[g.a_offset + bi * g.stride_a + p * g.lda + i]
                        } else {
                            a[g.a_offset + bi * g.stride_a + i * g.lda + p]
                        };
                        let bv = if g.trans_b {
                            b[g.b_offset + bi * g.stride_b + j * g.ldb + p]
                        } else {
                            b[g.b_offset + bi * g.stride_b + p * g.ldb + j]
                        };
                        acc += av as f64 * bv as f64;
                    }
                    let ci = g.c_offset + bi * g.stride_c + i * g.ldc + j;
                    let old = if g.beta == 0.0 { 0.0 } else { c[ci] as f64 };
                    c[ci] = (g.alpha as f64 * acc + g.beta as f64 * old) as f32;
                }
            }
        }
    }

    /// A descriptor exercising transposes, offsets, padded leading dimensions and batches.
    fn strided(m: usize, n: usize, k: usize, ta: bool, tb: bool, batch: usize) -> Gemm {
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        let (lda, ldb, ldc) = (ac + 3, bc + 1, n + 2);
        Gemm {
            m,
            n,
            k,
            trans_a: ta,
            trans_b: tb,
            a_offset: 5,
            lda,
            b_offset: 2,
            ldb,
            c_offset: 7,
            ldc,
            alpha: 0.75,
            beta: 0.5,
            batch,
            stride_a: ar * lda + 4,
            stride_b: br * ldb,
            stride_c: m * ldc + 1,
            attention: false,
        }
    }

    fn check_gemm_against_naive(dtype: DType, threads: usize, tol: f32) {
        let dev = CpuCompute::new(dtype, threads).unwrap();
        for &(m, n, k) in &[(1, 1, 1), (7, 5, 3), (33, 17, 40), (64, 70, 9)] {
            for ta in [false, true] {
                for tb in [false, true] {
                    for batch in [1, 3] {
                        let g = strided(m, n, k, ta, tb, batch);
                        let (ea, eb, ec) = g.extents();
                        let (a, b) = (values(ea, 1), values(eb, 2));
                        let c0 = values(ec + 3, 3);
                        // Round inputs to the storage type so only the product's error remains.
                        let (ab, bb, mut cb) = (buf(&dev, &a), buf(&dev, &b), buf(&dev, &c0));
                        let (a, b) = (host(&dev, &ab, ea), host(&dev, &bb, eb));
                        let mut want = host(&dev, &cb, ec + 3);
                        let before = want.clone();
                        naive(&g, &a, &b, &mut want);
                        dev.gemm(&g, &ab, &bb, &mut cb).unwrap();
                        let got = host(&dev, &cb, ec + 3);
                        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                            let scale = 1.0 + (k as f32).sqrt();
                            assert!(
                                (x - y).abs() <= tol * scale,
                                "{dtype} m{m} n{n} k{k} ta{ta} tb{tb} batch{batch} at {i}: {x} vs {y} (was {})",
                                before[i]
                            );
                        }
                    }
                }
            }
        }
    }

    /// With transposes, offsets and batches: f32 on one thread and on two,
    /// f16 within half precision, bf16 within bfloat precision.
    #[test]
    fn gemm_matches_naive_in_every_storage_type() {
        for (dtype, threads, tol) in [
            (DType::F32, 1, 1e-5),
            (DType::F32, 2, 1e-5),
            (DType::F16, 1, 8e-3),
            (DType::BF16, 1, 3e-2),
        ] {
            check_gemm_against_naive(dtype, threads, tol);
        }
    }

    /// f16 and bf16 are storage only: a product is the f32 product of the
    /// stored operands, rounded once. Bit for bit, with a depth (k = 1100)
    /// that spans several of the kernels' depth blocks, so that a partial sum
    /// rounded to the storage type between blocks would show.
    #[test]
    fn half_products_are_the_f32_product_of_the_stored_operands_rounded_once() {
        let f32_dev = CpuCompute::new(DType::F32, 1).unwrap();
        for dtype in [DType::F16, DType::BF16] {
            let dev = CpuCompute::new(dtype, 1).unwrap();
            assert_eq!(
                dev.gemm_math(),
                GemmMath {
                    storage: dtype,
                    multiply: DType::F32,
                    accumulate: DType::F32
                }
            );
            assert!(dev.gemm_math().storage_only());
            for g in [
                strided(19, 23, 1100, false, true, 2),
                Gemm::dense(40, 33, 1100),
            ] {
                let (ea, eb, ec) = g.extents();
                let (ab, bb) = (buf(&dev, &values(ea, 11)), buf(&dev, &values(eb, 12)));
                let mut cb = buf(&dev, &values(ec, 13));
                // The stored (rounded) operands, as f32.
                let (a, b, c0) = (
                    host(&dev, &ab, ea),
                    host(&dev, &bb, eb),
                    host(&dev, &cb, ec),
                );
                let mut want = buf(&f32_dev, &c0);
                f32_dev
                    .gemm(&g, &buf(&f32_dev, &a), &buf(&f32_dev, &b), &mut want)
                    .unwrap();
                let mut want = host(&f32_dev, &want, ec);
                dev.gemm(&g, &ab, &bb, &mut cb).unwrap();
                // Round the f32 product to the storage type once.
                let rounded = buf(&dev, &want);
                want = host(&dev, &rounded, ec);
                let got = host(&dev, &cb, ec);
                let differ = got
                    .iter()
                    .zip(&want)
                    .filter(|(x, y)| x.to_bits() != y.to_bits());
                assert_eq!(differ.count(), 0, "{dtype} m{} n{} k{}", g.m, g.n, g.k);
            }
        }
        assert!(!f32_dev.gemm_math().storage_only());
    }

    #[test]
    fn gemm_kernels_follow_the_crates_choice_and_refuse_where_it_would_abort() {
        use GemmKernels as K;
        assert_eq!(K::x86_choice(true, true, true).unwrap(), K::Avx512);
        assert_eq!(K::x86_choice(false, false, true).unwrap(), K::Avx2Fma);
        assert_eq!(K::x86_choice(false, false, false).unwrap(), K::Scalar);
        // avx512f without avx512bw/cd/dq/vl (Xeon Phi): an error, not an abort.
        assert!(matches!(
            K::x86_choice(true, false, true),
            Err(ComputeError::Unsupported(_))
        ));
        // Whatever this CPU has, the device names the set it runs.
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        assert!(dev.name().contains(dev.kernels().name()), "{}", dev.name());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            dev.kernels() == K::Avx512,
            std::arch::is_x86_feature_detected!("avx512f")
        );
    }

    #[test]
    fn gemm_leaves_elements_between_rows_untouched() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let dev = CpuCompute::new(dtype, 1).unwrap();
            let mut g = Gemm::dense(3, 2, 4);
            g.ldc = 5;
            g.beta = 0.0;
            let (a, b) = (buf(&dev, &values(12, 4)), buf(&dev, &values(8, 5)));
            let mut c = buf(&dev, &[9.0; 13]);
            dev.gemm(&g, &a, &b, &mut c).unwrap();
            let got = host(&dev, &c, 13);
            for row in 0..2 {
                assert_eq!(&got[row * 5 + 2..row * 5 + 5], &[9.0, 9.0, 9.0], "{dtype}");
            }
        }
    }

    #[test]
    fn gemm_rejects_bad_extents_without_panicking() {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let (a, b, mut c) = (
            dev.alloc(12).unwrap(),
            dev.alloc(20).unwrap(),
            dev.alloc(15).unwrap(),
        );
        assert!(dev.gemm(&Gemm::dense(3, 5, 4), &a, &b, &mut c).is_ok());
        let bad = [
            Gemm::dense(4, 5, 4),
            Gemm::dense(3, 6, 4),
            Gemm {
                a_offset: 1,
                ..Gemm::dense(3, 5, 4)
            },
            Gemm {
                ldc: 4,
                ..Gemm::dense(3, 5, 4)
            },
            Gemm {
                a_offset: usize::MAX,
                ..Gemm::dense(3, 5, 4)
            },
            Gemm {
                batch: usize::MAX,
                stride_a: usize::MAX,
                ..Gemm::dense(3, 5, 4)
            },
        ];
        for g in bad {
            match dev.gemm(&g, &a, &b, &mut c) {
                Err(ComputeError::InvalidArgument(_)) => {}
                other => panic!("{g:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn rejects_storage_types_it_cannot_compute() {
        assert!(matches!(
            CpuCompute::new(DType::I32, 1),
            Err(ComputeError::Unsupported(_))
        ));
    }

    #[test]
    fn elementwise_kernels_reject_short_tensors() {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let (mut x, y) = (dev.alloc(6).unwrap(), dev.alloc(5).unwrap());
        assert!(dev.add(&mut x, &y, 6).is_err());
        assert!(dev.add_bias(&mut x, &y, 2, 6).is_err());
        assert!(dev.add_bias(&mut x, &y, 2, 3).is_ok());
        assert!(dev.gelu(&y, &mut x, 6).is_err());
        assert!(dev.softmax(&mut x, 1, 2, 3, true).is_err());
        assert!(dev.softmax(&mut x, 0, usize::MAX, 2, true).is_err());
        assert!(dev.copy(&y, 3, &mut x, 0, 3).is_err());
        assert!(dev.copy(&y, 0, &mut x, usize::MAX, 3).is_err());
        assert!(dev.upload(&[0.0; 7], &mut x).is_err());
        let mut small = [0f32; 7];
        assert!(dev.download(&x, &mut small).is_err());
    }

    #[test]
    fn bias_add_and_grad_match_loops() {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let (rows, cols) = (4, 3);
        let xs = values(rows * cols, 6);
        let bs = values(cols, 7);
        let mut x = buf(&dev, &xs);
        dev.add_bias(&mut x, &buf(&dev, &bs), rows, cols).unwrap();
        let got = host(&dev, &x, rows * cols);
        let mut db = dev.alloc(cols).unwrap();
        dev.bias_grad(&buf(&dev, &xs), &mut db, rows, cols).unwrap();
        let dbv = host(&dev, &db, cols);
        for c in 0..cols {
            let mut sum = 0.0;
            for r in 0..rows {
                assert_eq!(got[r * cols + c], xs[r * cols + c] + bs[c]);
                sum += xs[r * cols + c];
            }
            assert!((dbv[c] - sum).abs() < 1e-6);
        }
    }

    #[test]
    fn gelu_matches_formula_and_its_backward_the_finite_difference() {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let xs: Vec<f32> = (0..41).map(|i| (i as f32 - 20.0) / 5.0).collect();
        let n = xs.len();
        let x = buf(&dev, &xs);
        let mut y = dev.alloc(n).unwrap();
        dev.gelu(&x, &mut y, n).unwrap();
        let yv = host(&dev, &y, n);
        let ones = buf(&dev, &vec![1.0; n]);
        let mut dx = dev.alloc(n).unwrap();
        dev.gelu_backward(&x, &ones, &mut dx, n).unwrap();
        let dxv = host(&dev, &dx, n);
        for i in 0..n {
            let v = xs[i] as f64;
            let f = |v: f64| {
                0.5 * v
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
            };
            assert!((yv[i] as f64 - f(v)).abs() < 1e-5, "gelu({v})");
            let h = 1e-4;
            let fd = (f(v + h) - f(v - h)) / (2.0 * h);
            assert!(
                (dxv[i] as f64 - fd).abs() < 1e-4,
                "gelu'({v}): {} vs {fd}",
                dxv[i]
            );
        }
        assert!(yv[0].abs() < 1e-3 && (yv[n - 1] - 4.0).abs() < 1e-3);
    }

    #[test]
    fn exp_is_within_a_millionth_over_the_f32_range_and_keeps_nan() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            worst = worst.max(((exp_f32(x) as f64 - want) / want).abs());
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(f32::NAN).is_nan());
        // Clamped, not overflowed or flushed: still finite and normal.
        assert!(exp_f32(1e4).is_finite() && exp_f32(-1e4).is_normal());
    }

    #[test]
    fn gelu_is_the_tanh_formula_far_out_and_each_simd_variant_gives_the_same_bits() {
        let xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) / 50.0).collect();
        let (mut y, mut dx) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        let ones = vec![1f32; xs.len()];
        gelu_loops::forward(&xs, &mut y);
        gelu_loops::backward(&xs, &ones, &mut dx);
        for (i, &x) in xs.iter().enumerate() {
            let v = x as f64;
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh();
            let want = 0.5 * v * (1.0 + t);
            assert!(
                (y[i] as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "gelu({x})"
            );
        }
        assert!(y[0].abs() < 1e-30 && y[4000] == 40.0 && (dx[4000] - 1.0).abs() < 1e-6);
        let (mut y0, mut dx0) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        gelu_loops::forward_plain(&xs, &mut y0);
        gelu_loops::backward_plain(&xs, &ones, &mut dx0);
        assert!(y.iter().zip(&y0).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(dx.iter().zip(&dx0).all(|(a, b)| a.to_bits() == b.to_bits()));
        let nan = [f32::NAN];
        let mut out = [0f32];
        gelu_loops::forward(&nan, &mut out);
        assert!(out[0].is_nan());
    }

    #[test]
    fn gelu_on_half_storage_rounds_the_f32_result_over_several_chunks() {
        let n = 2 * CHUNK + 7;
        let xs: Vec<f32> = (0..n)
            .map(|i| (i as f32 - n as f32 / 2.0) / 300.0)
            .collect();
        for dtype in [DType::F16, DType::BF16] {
            let dev = CpuCompute::new(dtype, 1).unwrap();
            let x = buf(&dev, &xs);
            let stored = host(&dev, &x, n);
            let mut y = dev.alloc(n).unwrap();
            dev.gelu(&x, &mut y, n).unwrap();
            let mut want = vec![0f32; n];
            gelu_loops::forward(&stored, &mut want);
            let want = host(&dev, &buf(&dev, &want), n);
            assert_eq!(host(&dev, &y, n), want, "{dtype}");
        }
    }

    #[test]
    fn causal_softmax_masks_the_future_and_rows_sum_to_one() {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let (rows, cols, off) = (8, 4, 3); // two heads of 4 x 4 scores after 3 other elements
        let xs = values(off + rows * cols, 8);
        let mut x = buf(&dev, &xs);
        dev.softmax(&mut x, off, rows, cols, true).unwrap();
        let got = host(&dev, &x, off + rows * cols);
        assert_eq!(&got[..off], &xs[..off]);
        for r in 0..rows {
            let row = &got[off + r * cols..off + (r + 1) * cols];
            let pos = r % cols;
            let z: f64 = (0..=pos)
                .map(|c| (xs[off + r * cols + c] as f64).exp())
                .sum();
            for (c, &v) in row.iter().enumerate() {
                let want = if c <= pos {
                    (xs[off + r * cols + c] as f64).exp() / z
                } else {
                    0.0
                };
                assert!((v as f64 - want).abs() < 1e-6, "row {r} col {c}");
            }
        }
    }

    #[test]
    fn softmax_backward_matches_the_finite_difference() {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let (rows, cols) = (3, 5);
        let xs = values(rows * cols, 9);
        let dys = values(rows * cols, 10);
        for causal in [false, true] {
            let mut y = buf(&dev, &xs);
            dev.softmax(&mut y, 0, rows, cols, causal).unwrap();
            let mut dx = buf(&dev, &dys);
            dev.softmax_backward(&y, &mut dx, 0, rows, cols).unwrap();
            let dxv = host(&dev, &dx, rows * cols);
            // loss = sum(dy * softmax(x)); its derivative by central differences.
            let loss = |x: &[f32]| -> f64 {
                let mut b = buf(&dev, x);
                dev.softmax(&mut b, 0, rows, cols, causal).unwrap();
                let s = host(&dev, &b, rows * cols);
                s.iter().zip(&dys).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            for i in 0..rows * cols {
                let h = 1e-2;
                let (mut p, mut m) = (xs.clone(), xs.clone());
                p[i] += h;
                m[i] -= h;
                let fd = (loss(&p) - loss(&m)) / (2.0 * h as f64);
                assert!(
                    (dxv[i] as f64 - fd).abs() < 2e-3,
                    "causal {causal} at {i}: {} vs {fd}",
                    dxv[i]
                );
            }
        }
    }

    #[test]
    fn add_and_copy_move_the_right_elements() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let dev = CpuCompute::new(dtype, 1).unwrap();
            let mut x = buf(&dev, &[1.0, 2.0, 3.0, 4.0]);
            dev.add(&mut x, &buf(&dev, &[0.5, 0.5, 0.5]), 3).unwrap();
            assert_eq!(host(&dev, &x, 4), vec![1.5, 2.5, 3.5, 4.0]);
            let src = buf(&dev, &[7.0, 8.0, 9.0]);
            dev.copy(&src, 1, &mut x, 2, 2).unwrap();
            assert_eq!(host(&dev, &x, 4), vec![1.5, 2.5, 8.0, 9.0]);
        }
    }

    #[test]
    fn thread_budget_splits_the_cores() {
        let all = CpuCompute::threads_per_rank(1);
        assert!(all >= 1);
        assert_eq!(CpuCompute::threads_per_rank(all * 4), 1);
        assert_eq!(CpuCompute::new(DType::F32, 0).unwrap().threads(), 1);
        assert!(matches!(
            CpuCompute::new(DType::F32, 1).unwrap().parallelism(),
            Parallelism::None
        ));
    }
}
