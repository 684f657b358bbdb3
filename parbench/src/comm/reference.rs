//! The plain sequential meanings collectives are built from, given every
//! rank's input: what each rank must hold afterwards. Each collective's
//! file says its own meaning with these (`Spec::expected`), which the
//! conformance suite checks every backend against; bench code can use them
//! to check results. Inputs and outputs are raw bytes of whole `dtype`
//! elements with NCCL's layouts (see the table in [`super`]); reductions go
//! in rank order through the same element kernels the backends use, so with
//! inputs whose reductions are exact in any order (small integers, see
//! [`input`]) the comparison can be exact.

use super::{finish_avg, premultiply, reduce_bytes, DType, Element, ReduceOp};

/// The reduction of every rank's `inputs[r]` (all the same length), as
/// all_reduce leaves on every rank and reduce leaves on the root; `Avg`
/// divides by the number of inputs, and `MulSum` multiplies input `r` by
/// rank `r`'s scalar ([`ReduceOp::mulsum_scalar`]) before summing.
pub fn all_reduce(inputs: &[&[u8]], dtype: DType, op: ReduceOp) -> Vec<u8> {
    let scaled = |r: usize, b: &[u8]| {
        let mut v = b.to_vec();
        if op == ReduceOp::MulSum {
            premultiply(&mut v, dtype, ReduceOp::mulsum_scalar(r));
        }
        v
    };
    let mut acc = inputs.first().map(|b| scaled(0, b)).unwrap_or_default();
    for (r, src) in inputs.iter().enumerate().skip(1) {
        reduce_bytes(&mut acc, &scaled(r, src), dtype, op);
    }
    if op == ReduceOp::Avg {
        finish_avg(&mut acc, dtype, inputs.len());
    }
    acc
}

/// What reduce leaves on the root: the same as [`all_reduce`].
pub fn reduce(inputs: &[&[u8]], dtype: DType, op: ReduceOp) -> Vec<u8> {
    all_reduce(inputs, dtype, op)
}

/// All contributions in rank order, as all_gather leaves on every rank.
pub fn all_gather(inputs: &[&[u8]]) -> Vec<u8> {
    inputs.concat()
}

/// Block `rank` (of `block_bytes`) of the reduction of `inputs` (each
/// world x block_bytes), as reduce_scatter leaves on `rank`.
pub fn reduce_scatter(
    inputs: &[&[u8]],
    block_bytes: usize,
    dtype: DType,
    op: ReduceOp,
    rank: usize,
) -> Vec<u8> {
    let blocks: Vec<&[u8]> = inputs.iter().map(|b| block(b, rank, block_bytes)).collect();
    all_reduce(&blocks, dtype, op)
}

/// The root's input, as broadcast leaves on every rank.
pub fn broadcast(inputs: &[&[u8]], root: usize) -> Vec<u8> {
    inputs.get(root).map(|b| b.to_vec()).unwrap_or_default()
}

/// Block `rank` of every rank's input, in rank order, as all_to_all leaves
/// on `rank` (each input holds world blocks of `block_bytes`).
pub fn all_to_all(inputs: &[&[u8]], block_bytes: usize, rank: usize) -> Vec<u8> {
    inputs
        .iter()
        .flat_map(|b| block(b, rank, block_bytes).iter().copied())
        .collect()
}

/// Block `j` of `b`, or as much of it as `b` holds.
fn block(b: &[u8], j: usize, block_bytes: usize) -> &[u8] {
    let start = (j * block_bytes).min(b.len());
    let end = (start + block_bytes).min(b.len());
    &b[start..end]
}

/// A deterministic input of `count` elements for `rank`, whose reductions by
/// `op` over up to 8 ranks are exact in every type and any order: small
/// integers (-2..=2, or 0..=4 for unsigned types) for sum, avg, mulsum, min
/// and max; 1 and 2 for prod (at most 2^8 = 256, exact in f16 and bf16 and
/// wrapping in u8 as the reference does). The 8-bit floats hold every
/// integer only up to 8 (E5M2) or 16 (E4M3), so for them a sum's element is
/// non-zero on one rank in four (at most two of 8 ranks, each at most 4
/// after mulsum's scalar: partial sums stay within 8), and a product has
/// at most two factors of 2 (4, exact in both). `salt` varies the
/// pattern between calls.
pub fn input(rank: usize, count: usize, dtype: DType, op: ReduceOp, salt: usize) -> Vec<u8> {
    input_at(rank, 0, count, dtype, op, salt)
}

/// Elements `first..first + count` of the input [`input`] makes for `rank`
/// (the value of an element depends only on its rank, index and salt), so
/// that a check can build just the blocks it needs.
pub fn input_at(
    rank: usize,
    first: usize,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    salt: usize,
) -> Vec<u8> {
    crate::with_dtype!(dtype, T => typed_input::<T>(rank, first, count, op, salt))
}

fn typed_input<T: Element>(
    rank: usize,
    first: usize,
    count: usize,
    op: ReduceOp,
    salt: usize,
) -> Vec<u8> {
    let unsigned = matches!(T::DTYPE, DType::U8 | DType::U32 | DType::U64);
    let offset = if unsigned { 0.0 } else { 2.0 };
    // Five small values (or 1 and 2 for prod) in a cycle that shifts with
    // rank and salt, converted once: the loop only indexes the table.
    let table: Vec<T> = (0..15)
        .map(|k| {
            T::from_f64(match op {
                ReduceOp::Prod => 1.0 + (k % 3 == 0) as u8 as f64,
                _ => (k % 5) as f64 - offset,
            })
        })
        .collect();
    let start = rank.wrapping_mul(7).wrapping_add(salt) % 15;
    let sparse = T::DTYPE.is_fp8() && !matches!(op, ReduceOp::Min | ReduceOp::Max);
    let one = T::from_f64(1.0);
    let values: Vec<T> = (first..first + count)
        .map(|i| {
            let v = table[(start + i % 15) % 15];
            // Zero (or 1 for prod) where the element is not one of this
            // rank's: rank + i + salt picks one rank in four per element.
            if sparse && !(rank + i + salt).is_multiple_of(4) {
                if op == ReduceOp::Prod {
                    one
                } else {
                    T::from_f64(0.0)
                }
            } else {
                v
            }
        })
        .collect();
    bytemuck::cast_slice(&values).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::F8E4M3;

    #[test]
    fn references_follow_nccl_layouts() {
        let a: Vec<u8> = bytemuck::cast_slice(&[1i32, 2, 3, 4]).to_vec();
        let b: Vec<u8> = bytemuck::cast_slice(&[10i32, 20, 30, 40]).to_vec();
        let ins = [a.as_slice(), b.as_slice()];
        let sum = all_reduce(&ins, DType::I32, ReduceOp::Sum);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&sum), &[11, 22, 33, 44]);
        let avg = all_reduce(&ins, DType::I32, ReduceOp::Avg);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&avg), &[5, 11, 16, 22]);
        let rs1 = reduce_scatter(&ins, 8, DType::I32, ReduceOp::Max, 1);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&rs1), &[30, 40]);
        let a2a0 = all_to_all(&ins, 8, 0);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&a2a0), &[1, 2, 10, 20]);
        assert_eq!(all_gather(&ins).len(), 32);
        assert_eq!(broadcast(&ins, 1), b);
    }

    #[test]
    fn mulsum_scales_odd_ranks_by_two_before_the_sum() {
        let ins: Vec<Vec<u8>> = [[1i32, -3], [10, 20], [100, 200], [5, 7]]
            .iter()
            .map(|v| bytemuck::cast_slice(v).to_vec())
            .collect();
        let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
        let got = all_reduce(&refs, DType::I32, ReduceOp::MulSum);
        // nccl-tests' scalars: 1, 2, 1, 2.
        assert_eq!(
            bytemuck::cast_slice::<u8, i32>(&got),
            &[1 + 20 + 100 + 10, -3 + 40 + 200 + 14]
        );
        let e4m3: Vec<u8> = [1.5f64, 3.0].map(|v| F8E4M3::from_f64(v).0).to_vec();
        let got = all_reduce(&[&e4m3, &e4m3], DType::F8E4M3, ReduceOp::MulSum);
        let want: Vec<u8> = [4.5f64, 9.0].map(|v| F8E4M3::from_f64(v).0).to_vec();
        assert_eq!(got, want);
    }

    /// The inputs' promise, for the types whose exact range is smallest:
    /// every reduction of every world up to 8 gives the same bits in rank
    /// order and in reverse.
    #[test]
    fn fp8_inputs_reduce_exactly_in_any_order() {
        for dtype in [DType::F8E4M3, DType::F8E5M2, DType::I8] {
            for op in ReduceOp::ALL {
                for world in 1..=8 {
                    let ins: Vec<Vec<u8>> =
                        (0..world).map(|r| input(r, 60, dtype, op, 3)).collect();
                    let fwd: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
                    let want = all_reduce(&fwd, dtype, op);
                    // Reverse order, each input scaled by its own rank's scalar.
                    let mut acc: Option<Vec<u8>> = None;
                    for r in (0..world).rev() {
                        let mut x = ins[r].clone();
                        if op == ReduceOp::MulSum {
                            premultiply(&mut x, dtype, ReduceOp::mulsum_scalar(r));
                        }
                        match acc.as_mut() {
                            None => acc = Some(x),
                            Some(a) => reduce_bytes(a, &x, dtype, op),
                        }
                    }
                    let mut got = acc.unwrap_or_default();
                    if op == ReduceOp::Avg {
                        finish_avg(&mut got, dtype, world);
                    }
                    assert_eq!(got, want, "{dtype} {op} world {world}");
                }
            }
        }
    }

    #[test]
    fn inputs_keep_products_small() {
        let x = input(3, 100, DType::F16, ReduceOp::Prod, 0);
        for v in bytemuck::cast_slice::<u8, half::f16>(&x) {
            assert!(v.to_f64() == 1.0 || v.to_f64() == 2.0);
        }
    }
}
