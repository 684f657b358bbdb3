//! Inputs built from (seed, rank, index) so that every reduction order gives
//! the same bits, as nccl-tests' are: the checker can then demand bit-exact
//! results from any algorithm.
//!
//! Per operator, every value is a small integer that the type holds exactly:
//! - sum: `0..=m`, with `m` small enough that the sum over all ranks (and so
//!   every partial sum, the values being non-negative) stays exact;
//! - avg: as sum, and for floats multiples of the world size, so that the
//!   average is an integer whether it is taken after the sum or before;
//! - mulsum: as sum, with room for the odd ranks' scalar 2 (nccl-tests'
//!   `ncclVerifiablePremulScalar`): `0..=m` with twice the world's sum exact;
//! - prod: 1 or 2, a 2 only on as many ranks as the type has exact
//!   doublings (the product is a power of two the type holds; integers
//!   wrap, which is associative);
//! - min, max, and the collectives that do not reduce: any exact value.

use parbench::comm::{DType, Element, ReduceOp};
use parbench::seed::splitmix64;
use parbench::with_dtype;

/// The inputs of one sweep row: which values rank `r` puts at index `i`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Inputs {
    pub seed: u64,
    pub dtype: DType,
    /// The reduction operator, `None` for collectives that only move data.
    pub op: Option<ReduceOp>,
    pub world: usize,
}

/// Largest integer `n` such that every integer in `0..=n` is exact in `dtype`
/// (integers wrap exactly, so their limit only guards `avg`).
fn exact_limit(dtype: DType) -> u64 {
    match dtype {
        DType::BF16 => 256,
        DType::F16 => 2048,
        DType::F32 => 1 << 24,
        DType::F64 => 1 << 53,
        DType::U8 => u8::MAX as u64,
        DType::I32 => i32::MAX as u64,
        DType::I64 => i64::MAX as u64,
        DType::I8 => i8::MAX as u64,
        DType::U32 => u32::MAX as u64,
        DType::U64 => u64::MAX,
        DType::F8E4M3 => 16,
        DType::F8E5M2 => 8,
    }
}

impl Inputs {
    /// The value rank `rank` holds at element `index` of its input.
    pub fn value(&self, rank: usize, index: usize) -> f64 {
        let h = splitmix64(self.seed ^ ((rank as u64) << 40) ^ index as u64);
        let world = self.world.max(1) as u64;
        let limit = exact_limit(self.dtype);
        let small = |m: u64| (h % (m + 1)) as f64;
        match self.op {
            None => small(limit.min(250)),
            Some(ReduceOp::Sum) => small((limit / world).min(8)),
            Some(ReduceOp::Avg) if self.dtype.is_float() => {
                (world * (h % ((limit / (world * world)).min(8) + 1))) as f64
            }
            Some(ReduceOp::Avg) => small((limit / world).min(8)),
            Some(ReduceOp::MulSum) => small((limit / (2 * world)).min(8)),
            Some(ReduceOp::Prod) => {
                if (rank as u64) < limit.ilog2() as u64 && h.is_multiple_of(4) {
                    2.0
                } else {
                    1.0
                }
            }
            Some(ReduceOp::Min | ReduceOp::Max) => small(limit.min(100)),
        }
    }

    /// Rank `rank`'s elements `start..start + len`.
    pub fn range<T: Element>(&self, rank: usize, start: usize, len: usize) -> Vec<T> {
        (start..start + len)
            .map(|i| T::from_f64(self.value(rank, i)))
            .collect()
    }

    /// Rank `rank`'s elements `start..start + len`, as the bytes a buffer holds.
    pub fn bytes(&self, rank: usize, start: usize, len: usize) -> Vec<u8> {
        with_dtype!(self.dtype, T => bytemuck::cast_slice(&self.range::<T>(rank, start, len)).to_vec())
    }

    /// Elements `start..start + len` reduced over every rank with `op`
    /// (`Avg` finished by the division), as any correct reduction gives
    /// them: what the tests hold the library's meanings to.
    #[cfg(test)]
    pub fn reduced<T: Element>(&self, op: ReduceOp, start: usize, len: usize) -> Vec<T> {
        let mut acc: Vec<T> = (start..start + len)
            .map(|i| self.contribution(op, 0, i))
            .collect();
        for r in 1..self.world {
            for (i, a) in acc.iter_mut().enumerate() {
                *a = T::combine(*a, self.contribution(op, r, start + i), op);
            }
        }
        if op == ReduceOp::Avg {
            for a in &mut acc {
                *a = a.div_world(self.world.max(1));
            }
        }
        acc
    }

    /// Rank `rank`'s value at `index` as it enters the reduction: times
    /// the rank's scalar under `MulSum`.
    #[cfg(test)]
    fn contribution<T: Element>(&self, op: ReduceOp, rank: usize, index: usize) -> T {
        let scalar = if op == ReduceOp::MulSum {
            ReduceOp::mulsum_scalar(rank)
        } else {
            1.0
        };
        T::from_f64(self.value(rank, index) * scalar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use parbench::comm::{F8E4M3, F8E5M2};

    /// Reduces in a scrambled order (reversed ranks, pairwise) and compares bits.
    fn order_independent<T: Element>(dtype: DType, op: ReduceOp, world: usize) {
        let inp = Inputs {
            seed: 7,
            dtype,
            op: Some(op),
            world,
        };
        let forward = inp.reduced::<T>(op, 0, 500);
        for (i, want) in forward.iter().enumerate() {
            let vals: Vec<T> = (0..world)
                .rev()
                .map(|r| inp.contribution(op, r, i))
                .collect();
            let mut level = vals;
            while level.len() > 1 {
                level = level
                    .chunks(2)
                    .map(|c| {
                        if c.len() == 2 {
                            T::combine(c[0], c[1], op)
                        } else {
                            c[0]
                        }
                    })
                    .collect();
            }
            let mut got = level[0];
            if op == ReduceOp::Avg {
                got = got.div_world(world);
            }
            assert_eq!(
                bytemuck::bytes_of(&got),
                bytemuck::bytes_of(want),
                "{dtype} {op} world {world} index {i}"
            );
            // Every value the type holds exactly.
            assert_eq!(T::from_f64(inp.value(0, i)).to_f64(), inp.value(0, i));
        }
    }

    #[test]
    fn every_type_and_op_reduces_exactly_in_any_order() {
        for world in [1, 2, 3, 5, 8, 16] {
            for op in ReduceOp::ALL {
                order_independent::<f32>(DType::F32, op, world);
                order_independent::<f64>(DType::F64, op, world);
                order_independent::<f16>(DType::F16, op, world);
                order_independent::<bf16>(DType::BF16, op, world);
                order_independent::<i32>(DType::I32, op, world);
                order_independent::<i64>(DType::I64, op, world);
                order_independent::<u8>(DType::U8, op, world);
                order_independent::<i8>(DType::I8, op, world);
                order_independent::<u32>(DType::U32, op, world);
                order_independent::<u64>(DType::U64, op, world);
                order_independent::<F8E4M3>(DType::F8E4M3, op, world);
                order_independent::<F8E5M2>(DType::F8E5M2, op, world);
            }
        }
    }

    #[test]
    fn ranks_and_indices_get_different_values() {
        let inp = Inputs {
            seed: 1,
            dtype: DType::F32,
            op: None,
            world: 4,
        };
        let a = inp.range::<f32>(0, 0, 64);
        let b = inp.range::<f32>(1, 0, 64);
        assert_ne!(a, b);
        assert!(a.windows(2).any(|w| w[0] != w[1]));
    }
}
