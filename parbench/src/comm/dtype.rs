//! Element types and reduction operators, and the typed kernels behind them.
//!
//! Collectives move untyped bytes described by a [`DType`] (as NCCL and MPI
//! do), so that one sweep can cover every type; the reductions dispatch once
//! per call to a typed, vectorisable loop.

use super::fp8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use std::fmt;
use std::str::FromStr;

/// The element types every backend supports.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I32,
    I64,
    U8,
    I8,
    U32,
    U64,
    /// OCP E4M3 (NCCL's `ncclFloat8e4m3`, since NCCL 2.24).
    F8E4M3,
    /// OCP E5M2 (NCCL's `ncclFloat8e5m2`, since NCCL 2.24).
    F8E5M2,
}

impl DType {
    /// Every type, in the order parbench's own sweeps run them (the types
    /// it had first, then those nccl-tests added).
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::I8,
        DType::U32,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Every type in nccl-tests' order (its `test_types`, which `-d all`
    /// runs): int8 uint8 int32 uint32 int64 uint64 half float double
    /// bfloat16 f8e4m3 f8e5m2.
    pub const NCCL_TESTS_ORDER: [DType; 12] = [
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// nccl-tests' name for the type (`float`, `half`, ...), used in tables and records.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// Whether the type is one of the 8-bit floats, which NCCL reduces only
    /// from 2.24 and (as nccl-tests runs them) on compute capability 9.0
    /// or newer.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "float" | "f32" | "float32" => DType::F32,
            "double" | "f64" | "float64" => DType::F64,
            "half" | "f16" | "float16" | "fp16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "int32" | "i32" | "int" => DType::I32,
            "int64" | "i64" => DType::I64,
            "uint8" | "u8" => DType::U8,
            "int8" | "i8" | "char" => DType::I8,
            "uint32" | "u32" => DType::U32,
            "uint64" | "u64" => DType::U64,
            "f8e4m3" | "fp8e4m3" | "float8e4m3" | "e4m3" => DType::F8E4M3,
            "f8e5m2" | "fp8e5m2" | "float8e5m2" | "e5m2" => DType::F8E5M2,
            other => {
                return Err(format!(
                    "unknown dtype '{other}' (expected int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3 or f8e5m2)"
                ))
            }
        })
    }
}

/// Reduction operators. `Avg` reduces as a sum and divides by the world size
/// at the end, as NCCL's `ncclAvg` does. `MulSum` is nccl-tests' `mulsum`,
/// NCCL's PreMulSum: each rank's input multiplied by that rank's scalar,
/// then summed; the scalar is nccl-tests' (`ncclVerifiablePremulScalar`:
/// 1 on even ranks, 2 on odd ones, [`ReduceOp::mulsum_scalar`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
    MulSum,
}

impl ReduceOp {
    /// Every operator, in the order sweeps run them (nccl-tests' order).
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::MulSum,
    ];

    /// The scalar rank `rank` multiplies its input by under `MulSum`:
    /// nccl-tests' `ncclVerifiablePremulScalar`, 1 on even ranks and 2 on
    /// odd ones (exact in every type, so the check stays bit-exact).
    pub fn mulsum_scalar(rank: usize) -> f64 {
        if rank.is_multiple_of(2) {
            1.0
        } else {
            2.0
        }
    }

    /// nccl-tests' name for the operator.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::MulSum => "mulsum",
        }
    }
}

impl FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            "mulsum" | "premulsum" => ReduceOp::MulSum,
            other => {
                return Err(format!(
                    "unknown op '{other}' (expected sum, prod, min, max, avg or mulsum)"
                ))
            }
        })
    }
}

/// A Rust type that can travel through a collective.
pub trait Element: bytemuck::Pod + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// `a op b` for one element (`Avg` and `MulSum` combine as `Sum`; their
    /// division and multiplication happen around the reduction).
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
    /// Divides by the world size, for `Avg`.
    fn div_world(self, world: usize) -> Self;
    /// Converts from f64 (saturating or rounding as the type does), for building inputs.
    fn from_f64(v: f64) -> Self;
    /// Converts to f64, for checking and printing.
    fn to_f64(self) -> f64;
}

macro_rules! float_element {
    ($t:ty, $tag:expr, $from:expr, $to:expr) => {
        impl Element for $t {
            const DTYPE: DType = $tag;
            #[inline(always)]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => {
                        if b < a {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Max => {
                        if b > a {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
            fn div_world(self, world: usize) -> Self {
                $from($to(self) / world as f64)
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
        }
    };
}

float_element!(f32, DType::F32, |v: f64| v as f32, |x: f32| x as f64);
float_element!(f64, DType::F64, |v: f64| v, |x: f64| x);
float_element!(f16, DType::F16, f16::from_f64, |x: f16| x.to_f64());
float_element!(bf16, DType::BF16, bf16::from_f64, |x: bf16| x.to_f64());
// The 8-bit floats add and multiply exactly in f64 and round once (`fp8`).
float_element!(F8E4M3, DType::F8E4M3, F8E4M3::from_f64, F8E4M3::to_f64);
float_element!(F8E5M2, DType::F8E5M2, F8E5M2::from_f64, F8E5M2::to_f64);

macro_rules! int_element {
    ($t:ty, $tag:expr) => {
        impl Element for $t {
            const DTYPE: DType = $tag;
            #[inline(always)]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                // Wrapping arithmetic: integer collectives are exact modulo 2^bits,
                // as NCCL's are, so no input can make a reduction panic.
                match op {
                    ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            fn div_world(self, world: usize) -> Self {
                // Wide enough that no world (256 ranks of u8, 128 of i8)
                // becomes a zero or negative divisor.
                ((self as i128) / (world.max(1) as i128)) as $t
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}

int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
int_element!(u8, DType::U8);
int_element!(i8, DType::I8);
int_element!(u32, DType::U32);
int_element!(u64, DType::U64);

/// Calls `$body` with `$T` bound to the Rust type of `$dtype`.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::comm::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::comm::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::comm::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::comm::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::comm::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::comm::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::comm::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::comm::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::comm::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::comm::DType::U64 => {
                type $T = u64;
                $body
            }
            $crate::comm::DType::F8E4M3 => {
                type $T = $crate::comm::F8E4M3;
                $body
            }
            $crate::comm::DType::F8E5M2 => {
                type $T = $crate::comm::F8E5M2;
                $body
            }
        }
    };
}

/// `acc[i] = acc[i] op src[i]` over typed slices of equal length (the
/// shorter length if they differ).
///
/// The operator is dispatched once per call, so each loop is a plain
/// element-wise loop that the compiler vectorises; sums of f32 and bf16 (the
/// collectives' common case) go through dedicated kernels, compiled for AVX2
/// as well and picked at run time when the CPU has it.
#[inline]
pub fn reduce_typed<T: Element>(acc: &mut [T], src: &[T], op: ReduceOp) {
    let n = acc.len().min(src.len());
    let (acc, src) = (&mut acc[..n], &src[..n]);
    let sum = matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum);
    if sum {
        if let (Some(a), Some(s)) = (as_mut::<T, f32>(acc), as_ref::<T, f32>(src)) {
            return kernels::sum_f32(a, s);
        }
    }
    if sum {
        if let (Some(a), Some(s)) = (as_mut::<T, bf16>(acc), as_ref::<T, bf16>(src)) {
            return kernels::sum_bf16(bytemuck::cast_slice_mut(a), bytemuck::cast_slice(s));
        }
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => {
            zip_apply(acc, src, |a, b| T::combine(a, b, ReduceOp::Sum))
        }
        ReduceOp::Prod => zip_apply(acc, src, |a, b| T::combine(a, b, ReduceOp::Prod)),
        ReduceOp::Min => zip_apply(acc, src, |a, b| T::combine(a, b, ReduceOp::Min)),
        ReduceOp::Max => zip_apply(acc, src, |a, b| T::combine(a, b, ReduceOp::Max)),
    }
}

/// `acc` as a slice of `U` when `T` is `U`.
fn as_mut<T: Element, U: Element>(acc: &mut [T]) -> Option<&mut [U]> {
    (T::DTYPE == U::DTYPE).then(|| bytemuck::cast_slice_mut(acc))
}

/// `src` as a slice of `U` when `T` is `U`.
fn as_ref<T: Element, U: Element>(src: &[T]) -> Option<&[U]> {
    (T::DTYPE == U::DTYPE).then(|| bytemuck::cast_slice(src))
}

#[inline(always)]
fn zip_apply<T: Copy>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (a, &b) in acc.iter_mut().zip(src) {
        *a = f(*a, b);
    }
}

/// The sum kernels, each written once as a plain loop and compiled twice:
/// for the build's baseline and for AVX2 (chosen at run time).
mod kernels {
    /// `acc += src` for f32.
    pub fn sum_f32(acc: &mut [f32], src: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { sum_f32_avx2(acc, src) };
        }
        sum_f32_plain(acc, src)
    }

    #[inline(always)]
    fn sum_f32_plain(acc: &mut [f32], src: &[f32]) {
        for (a, &b) in acc.iter_mut().zip(src) {
            *a += b;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sum_f32_avx2(acc: &mut [f32], src: &[f32]) {
        sum_f32_plain(acc, src)
    }

    /// `acc += src` for bf16 held as raw bits: widen to f32 (a shift), add,
    /// and round back to nearest-even (NaN stays a quiet NaN), exactly as
    /// `half::bf16`'s own addition does, without a per-element call.
    pub fn sum_bf16(acc: &mut [u16], src: &[u16]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { sum_bf16_avx2(acc, src) };
        }
        sum_bf16_plain(acc, src)
    }

    #[inline(always)]
    pub(super) fn bf16_add(a: u16, b: u16) -> u16 {
        let x = f32::from_bits((a as u32) << 16) + f32::from_bits((b as u32) << 16);
        let bits = x.to_bits();
        let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
        let quiet_nan = ((bits >> 16) | 0x40) as u16;
        if x.is_nan() {
            quiet_nan
        } else {
            rounded
        }
    }

    #[inline(always)]
    fn sum_bf16_plain(acc: &mut [u16], src: &[u16]) {
        for (a, &b) in acc.iter_mut().zip(src) {
            *a = bf16_add(*a, b);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sum_bf16_avx2(acc: &mut [u16], src: &[u16]) {
        sum_bf16_plain(acc, src)
    }
}

/// `acc op= src` over byte slices holding `dtype` elements.
///
/// Both slices must hold the same whole number of elements; the caller (a
/// collective that computed the chunk bounds) guarantees it. Unaligned bytes
/// are handled by a copy so that no input can make this panic.
pub fn reduce_bytes(acc: &mut [u8], src: &[u8], dtype: DType, op: ReduceOp) {
    let n = acc.len().min(src.len());
    let (acc, src) = (&mut acc[..n], &src[..n]);
    with_dtype!(dtype, T => reduce_cast::<T>(acc, src, op))
}

fn reduce_cast<T: Element>(acc: &mut [u8], src: &[u8], op: ReduceOp) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(acc),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        (Ok(a), Ok(s)) => reduce_typed(a, s, op),
        _ => {
            // Misaligned views (only possible for odd offsets): go element by element.
            let size = std::mem::size_of::<T>();
            for (a, s) in acc.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
                let x: T = bytemuck::pod_read_unaligned(a);
                let y: T = bytemuck::pod_read_unaligned(s);
                a.copy_from_slice(bytemuck::bytes_of(&T::combine(x, y, op)));
            }
        }
    }
}

/// Multiplies every element by `scalar` in its own type (wrapping for
/// integers), as PreMulSum does to each rank's input before the sum.
pub fn premultiply(buf: &mut [u8], dtype: DType, scalar: f64) {
    if scalar == 1.0 {
        return;
    }
    with_dtype!(dtype, T => {
        let s = T::from_f64(scalar);
        let size = std::mem::size_of::<T>();
        for e in buf.chunks_exact_mut(size) {
            let x: T = bytemuck::pod_read_unaligned(e);
            e.copy_from_slice(bytemuck::bytes_of(&T::combine(x, s, ReduceOp::Prod)));
        }
    })
}

/// Divides every element by `world`, finishing an `Avg` reduction.
pub fn finish_avg(buf: &mut [u8], dtype: DType, world: usize) {
    with_dtype!(dtype, T => {
        let size = std::mem::size_of::<T>();
        for e in buf.chunks_exact_mut(size) {
            let x: T = bytemuck::pod_read_unaligned(e);
            e.copy_from_slice(bytemuck::bytes_of(&x.div_world(world)));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nccl_tests_names() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.name().parse::<ReduceOp>().unwrap(), o);
        }
        assert!("complex".parse::<DType>().is_err());
    }

    #[test]
    fn bf16_kernel_matches_half_addition() {
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            -1.5,
            3.0e38,
            -3.0e38,
            1.0e-40,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.1,
            7.0e-3,
        ];
        let mut values: Vec<bf16> = specials.iter().map(|&v| bf16::from_f32(v)).collect();
        // Pairs whose exact sum falls between two bf16 values, to exercise rounding.
        values.extend((0..200).map(|i| bf16::from_bits(0x3f80 + i as u16)));
        values.extend((0..200).map(|i| bf16::from_bits(0xbb00 + 7 * i as u16)));
        for &a in &values {
            for &b in &values {
                let want = a + b;
                let got = bf16::from_bits(kernels::bf16_add(a.to_bits(), b.to_bits()));
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{a} + {b}: got {got} want {want}"
                );
            }
        }
        // The slice kernel (vectorised, with a tail) against the same
        // additions: every value meets many others in every lane position.
        for shift in (0..values.len()).step_by(7) {
            let src: Vec<bf16> = values
                .iter()
                .cycle()
                .skip(shift)
                .take(values.len())
                .copied()
                .collect();
            let mut acc = values.clone();
            reduce_typed(&mut acc, &src, ReduceOp::Sum);
            for (i, ((&got, &a), &b)) in acc.iter().zip(&values).zip(&src).enumerate() {
                let want = a + b;
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "shift {shift}, element {i}: {a} + {b}: got {got} want {want}"
                );
            }
        }
    }

    #[test]
    fn every_op_matches_element_combine() {
        let a: Vec<f32> = (0..1000).map(|i| (i % 17) as f32 - 8.5).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i % 13) as f32 * 0.25 - 1.0).collect();
        for op in ReduceOp::ALL {
            let mut acc = a.clone();
            reduce_typed(&mut acc, &b, op);
            for i in 0..a.len() {
                assert_eq!(acc[i], f32::combine(a[i], b[i], op), "{op} at {i}");
            }
        }
    }

    /// Avg over more ranks than a narrow type counts divides by the world,
    /// never by a wrapped (zero or negative) divisor.
    #[test]
    fn integer_averages_divide_by_any_world() {
        assert_eq!(200u8.div_world(256), 0);
        assert_eq!((-128i8).div_world(128), -1);
        assert_eq!(100i8.div_world(300), 0);
        assert_eq!(u64::MAX.div_world(1), u64::MAX);
        assert_eq!(9u32.div_world(0), 9);
    }

    #[test]
    fn reduces_bytes_per_type() {
        let mut a: Vec<u8> = bytemuck::cast_slice(&[1.0f32, 5.0, -2.0]).to_vec();
        let b: Vec<u8> = bytemuck::cast_slice(&[2.0f32, 3.0, -7.0]).to_vec();
        reduce_bytes(&mut a, &b, DType::F32, ReduceOp::Max);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&a), &[2.0, 5.0, -2.0]);
        let mut x = vec![250u8, 3];
        reduce_bytes(&mut x, &[10, 4], DType::U8, ReduceOp::Sum);
        assert_eq!(x, vec![4, 7]);
    }
}
