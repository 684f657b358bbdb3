//! The two 8-bit floating-point types NCCL reduces since 2.24
//! (`ncclFloat8e4m3`, `ncclFloat8e5m2`; OCP's E4M3 and E5M2), held as their
//! bits.
//!
//! Arithmetic is done in f64, where the sum or product of two such values
//! is exact, and rounded once to nearest-even, saturating to the largest
//! finite value: what CUDA's `__nv_fp8_e4m3` / `__nv_fp8_e5m2` constructors
//! do (`__NV_SATFINITE`), which NCCL's and nccl-tests' reductions go
//! through. A single rounding of the exact result is what NCCL's kernels
//! give wherever the intermediate they use (half or float) holds the exact
//! result, as it does for one sum or product of two 8-bit values.

/// The layout of one 8-bit float format.
struct Format {
    mantissa_bits: u32,
    bias: i32,
    /// The largest finite value (E4M3 gives its top code to NaN and has no
    /// infinity; E5M2 is IEEE-like).
    max_finite: f64,
    /// The bits of the largest finite value (sign clear).
    max_bits: u8,
    /// Whether an all-ones exponent means infinity or NaN (E5M2) rather
    /// than ordinary values (E4M3, where only S.1111.111 is NaN).
    ieee_specials: bool,
}

const E4M3: Format = Format {
    mantissa_bits: 3,
    bias: 7,
    max_finite: 448.0,
    max_bits: 0x7e,
    ieee_specials: false,
};

const E5M2: Format = Format {
    mantissa_bits: 2,
    bias: 15,
    max_finite: 57344.0,
    max_bits: 0x7b,
    ieee_specials: true,
};

/// The NaN both formats produce (a valid NaN code in each).
const NAN_BITS: u8 = 0x7f;

impl Format {
    fn exponent_mask(&self) -> u8 {
        (0xffu32 >> (1 + self.mantissa_bits)) as u8
    }

    fn decode(&self, bits: u8) -> f64 {
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = (bits >> self.mantissa_bits) & self.exponent_mask();
        let mant = bits & ((1u8 << self.mantissa_bits) - 1);
        let top = exp == self.exponent_mask();
        if self.ieee_specials && top {
            return if mant == 0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if !self.ieee_specials && top && mant == (1 << self.mantissa_bits) - 1 {
            return f64::NAN;
        }
        let m = self.mantissa_bits as i32;
        let value = if exp == 0 {
            mant as f64 * pow2(1 - self.bias - m)
        } else {
            (((1u32 << m) + mant as u32) as f64) * pow2(exp as i32 - self.bias - m)
        };
        sign * value
    }

    /// `v` rounded to nearest-even in this format, saturating to the
    /// largest finite value (infinities included), NaN to NaN.
    fn encode(&self, v: f64) -> u8 {
        if v.is_nan() {
            return NAN_BITS;
        }
        let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
        let a = v.abs();
        if a >= self.max_finite {
            return sign | self.max_bits;
        }
        let m = self.mantissa_bits as i32;
        let min_normal_exp = 1 - self.bias;
        // The spacing of representable values around `a`: fixed below the
        // smallest normal, one ulp of a's binade above it.
        let exp = if a < pow2(min_normal_exp) {
            min_normal_exp
        } else {
            ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023
        };
        let quantum = pow2(exp - m);
        // Exact: dividing by a power of two, and rounding an f64 to an integer.
        let steps = (a / quantum).round_ties_even();
        let rounded = steps * quantum;
        if rounded > self.max_finite {
            return sign | self.max_bits;
        }
        if rounded == 0.0 {
            return sign;
        }
        // Rounding may have carried into the next binade.
        let (exp, steps) = if steps >= (2u32 << m) as f64 {
            (exp + 1, steps / 2.0)
        } else {
            (exp, steps)
        };
        let steps = steps as u32;
        if steps < (1u32 << m) {
            // Subnormal (only possible at the smallest exponent).
            return sign | steps as u8;
        }
        let biased = (exp + self.bias) as u32;
        sign | ((biased << m) as u8) | ((steps - (1u32 << m)) as u8)
    }
}

/// 2^e for the small exponents these formats need.
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

macro_rules! fp8_type {
    ($(#[$doc:meta])* $name:ident, $format:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        // Compared and combined by value, as `half`'s types are (so -0 equals
        // +0 and NaN nothing), which lets the one float `Element` serve them.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.to_f64() == other.to_f64()
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                self.to_f64().partial_cmp(&other.to_f64())
            }
        }

        /// Exact in f64, then rounded once (see the module's note).
        impl std::ops::Add for $name {
            type Output = Self;
            fn add(self, other: Self) -> Self {
                Self::from_f64(self.to_f64() + other.to_f64())
            }
        }

        /// Exact in f64, then rounded once.
        impl std::ops::Mul for $name {
            type Output = Self;
            fn mul(self, other: Self) -> Self {
                Self::from_f64(self.to_f64() * other.to_f64())
            }
        }

        impl $name {
            /// `v` rounded to nearest-even, saturating to the largest finite value.
            pub fn from_f64(v: f64) -> Self {
                $name($format.encode(v))
            }
            /// The exact value.
            pub fn to_f64(self) -> f64 {
                $format.decode(self.0)
            }
            /// The largest finite value.
            pub const MAX: $name = $name($format.max_bits);
        }
    };
}

fp8_type!(
    /// OCP E4M3 (`ncclFloat8e4m3`, nccl-tests' `f8e4m3`): 4 exponent bits,
    /// 3 mantissa bits, no infinity, largest finite value 448.
    F8E4M3,
    E4M3
);
fp8_type!(
    /// OCP E5M2 (`ncclFloat8e5m2`, nccl-tests' `f8e5m2`): 5 exponent bits,
    /// 2 mantissa bits, largest finite value 57344.
    F8E5M2,
    E5M2
);

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn known_codes() {
        assert_eq!(F8E4M3::from_f64(1.0).0, 0x38);
        assert_eq!(F8E5M2::from_f64(1.0).0, 0x3c);
        assert_eq!(F8E4M3::from_f64(448.0), F8E4M3::MAX);
        assert_eq!(F8E5M2::from_f64(57344.0), F8E5M2::MAX);
        assert_eq!(F8E4M3(0x01).to_f64(), 2f64.powi(-9));
        assert_eq!(F8E5M2(0x01).to_f64(), 2f64.powi(-16));
        assert!(F8E4M3(0x7f).to_f64().is_nan());
        assert_eq!(F8E5M2(0x7c).to_f64(), f64::INFINITY);
        // Saturation, infinities included, and NaN kept.
        assert_eq!(F8E4M3::from_f64(1e9), F8E4M3::MAX);
        assert_eq!(F8E4M3::from_f64(f64::NEG_INFINITY).0, 0x80 | 0x7e);
        assert_eq!(F8E5M2::from_f64(f64::INFINITY), F8E5M2::MAX);
        assert!(F8E4M3::from_f64(f64::NAN).to_f64().is_nan());
        // Ties to even: 1.0625 lies halfway between 1.0 and 1.125.
        assert_eq!(F8E4M3::from_f64(1.0625).to_f64(), 1.0);
        assert_eq!(F8E4M3::from_f64(1.1875).to_f64(), 1.25);
        // Small integers are exact up to 16 (E4M3) and 8 (E5M2).
        for i in 0..=16 {
            assert_eq!(F8E4M3::from_f64(i as f64).to_f64(), i as f64);
        }
        assert_eq!(F8E5M2::from_f64(8.0).to_f64(), 8.0);
        assert_eq!(F8E5M2::from_f64(9.0).to_f64(), 8.0);
    }

    #[test]
    fn every_finite_code_round_trips() {
        for b in 0..=255u8 {
            for (v, back) in [
                (F8E4M3(b).to_f64(), F8E4M3::from_f64(F8E4M3(b).to_f64()).0),
                (F8E5M2(b).to_f64(), F8E5M2::from_f64(F8E5M2(b).to_f64()).0),
            ] {
                if v.is_finite() {
                    assert_eq!(back, b, "{b:#04x} = {v}");
                }
            }
        }
    }

    /// E5M2 is the top byte of IEEE half: rounding a half to it is rounding
    /// away its low 8 bits to nearest-even, an independent statement of
    /// the same rounding.
    #[test]
    fn e5m2_rounds_as_half_truncated_to_its_top_byte() {
        for bits in 0..=0xffffu16 {
            let h = f16::from_bits(bits);
            if !h.is_finite() || h.to_f64().abs() >= 57344.0 {
                continue;
            }
            let low = bits & 0xff;
            let mut top = bits >> 8;
            if low > 0x80 || (low == 0x80 && top & 1 == 1) {
                top += 1;
            }
            let want = if (top & 0x7f) >= 0x7c {
                (top as u8 & 0x80) | 0x7b
            } else {
                top as u8
            };
            assert_eq!(F8E5M2::from_f64(h.to_f64()).0, want, "half {bits:#06x}");
        }
    }

    /// Every E4M3 value is a half, so rounding any half to E4M3 must land
    /// on the nearest E4M3 value (the even one on a tie).
    #[test]
    fn e4m3_rounds_to_the_nearest_code() {
        let codes: Vec<(f64, u8)> = (0..0x7fu8).map(|b| (F8E4M3(b).to_f64(), b)).collect();
        for bits in 0..0x7c00u16 {
            let v = f16::from_bits(bits).to_f64();
            if v >= 448.0 {
                continue;
            }
            let best = codes
                .iter()
                .min_by(|x, y| {
                    let (dx, dy) = ((x.0 - v).abs(), (y.0 - v).abs());
                    dx.total_cmp(&dy).then((x.1 & 1).cmp(&(y.1 & 1)))
                })
                .map(|c| c.1);
            assert_eq!(Some(F8E4M3::from_f64(v).0), best, "half {bits:#06x} = {v}");
        }
    }
}
