//! The output a rank must hold after one call: the collective's own
//! meaning (`Spec::expected`, the one the conformance suite holds every
//! backend to) over the bench's [`Inputs`], so the bench knows nothing
//! per collective.
//!
//! A meaning reads every rank's blocks at once (all_reduce on 64 ranks
//! holds 64 buffers), which the sweep's memory check (`crate::memory`)
//! does not budget. So it is asked a slice at a time: every output
//! element depends only on the same element of the input blocks it comes
//! from (blocks of `count` elements, the byte rule's unit), so the meaning
//! of a call of `slice` elements per block, over elements
//! `start..start + slice` of every block, is that slice of every output
//! block. A test checks that for every sliceable collective; all_to_all_v,
//! whose counts depend on `count`, is asked whole (one block per rank).

use crate::data::Inputs;
use parbench::comm::collective::Expect;
use parbench::comm::{CollArgs, Collective};

/// What rank `rank` must hold in its whole receive buffer after `coll`
/// with `args` over `inputs`, or `None` where the collective leaves it
/// undefined.
pub fn expected(coll: Collective, inputs: &Inputs, args: CollArgs, rank: usize) -> Option<Vec<u8>> {
    let slice = if coll.spec().sliceable() {
        slice_elems(coll, args.count, inputs.world)
    } else {
        // Its meaning reads one block per rank: the receive buffer's bytes.
        args.count.max(1)
    };
    expected_in_slices(coll, inputs, args, rank, slice)
}

/// Elements per block of one slice: what the slice's every block, read
/// and written, takes is at most one send and one receive buffer (the
/// typed copies of the input and the output the check no longer builds:
/// `crate::memory`'s budget), and at least one element.
fn slice_elems(coll: Collective, count: usize, world: usize) -> usize {
    let held = coll.send_elems(count, world) + coll.recv_elems(count, world);
    // Each rank's input blocks and a copy of them, and the output blocks twice.
    let per_elem = 2 * world.max(1) * coll.send_blocks(world) + 2 * coll.recv_blocks(world);
    (held / per_elem.max(1)).clamp(1, count.max(1))
}

fn expected_in_slices(
    coll: Collective,
    inputs: &Inputs,
    args: CollArgs,
    rank: usize,
    slice: usize,
) -> Option<Vec<u8>> {
    let (count, size) = (args.count, args.dtype.size());
    let blocks = coll.recv_blocks(inputs.world);
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let len = slice.min(count - start);
        // Element `i` of the sliced call's input is element `i % len` of
        // block `i / len` of the slice: `start + i % len` of that block.
        let input = |r: usize, first: usize, n: usize| -> Vec<u8> {
            let mut bytes = Vec::with_capacity(n * size);
            let (mut at, end) = (first, first + n);
            while at < end {
                let (j, k) = (at / len.max(1), at % len.max(1));
                let take = (len - k).min(end - at).max(1);
                bytes.extend(inputs.bytes(r, j * count + start + k, take));
                at += take;
            }
            bytes
        };
        let part = coll.spec().expected(&Expect {
            world: inputs.world,
            rank,
            args: CollArgs { count: len, ..args },
            input: &input,
        })?;
        if out.is_empty() {
            out = vec![0u8; blocks * count * size];
        }
        for b in 0..blocks {
            let to = (b * count + start) * size;
            let from = b * len * size;
            let n = (len * size).min(part.len().saturating_sub(from));
            out[to..to + n].copy_from_slice(&part[from..from + n]);
        }
        start += len;
        if start >= count {
            return Some(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parbench::comm::{DType, ReduceOp};

    fn inputs(dtype: DType, op: Option<ReduceOp>, world: usize) -> Inputs {
        Inputs {
            seed: 11,
            dtype,
            op,
            world,
        }
    }

    #[test]
    fn every_collective_means_the_same_a_slice_at_a_time() {
        for coll in Collective::ALL.into_iter().filter(|c| c.spec().sliceable()) {
            for dtype in [
                DType::F32,
                DType::BF16,
                DType::U8,
                DType::I64,
                DType::F8E5M2,
            ] {
                let ops: Vec<Option<ReduceOp>> = if coll.reduces() {
                    ReduceOp::ALL.into_iter().map(Some).collect()
                } else {
                    vec![None]
                };
                for op in ops {
                    for world in 1..=4 {
                        let inp = inputs(dtype, op, world);
                        for count in [0, 1, 7, 13] {
                            for root in [0, world - 1] {
                                let args = CollArgs::new(count, dtype)
                                    .op(op.unwrap_or(ReduceOp::Sum))
                                    .root(root);
                                for rank in 0..world {
                                    let whole =
                                        expected_in_slices(coll, &inp, args, rank, count.max(1));
                                    for slice in [1, 2, 3, 5] {
                                        assert_eq!(
                                            expected_in_slices(coll, &inp, args, rank, slice),
                                            whole,
                                            "{coll} {dtype} {op:?} world {world} count {count} \
                                             root {root} rank {rank} slice {slice}"
                                        );
                                    }
                                    if let Some(w) = &whole {
                                        let n = coll.recv_elems(count, world) * dtype.size();
                                        assert_eq!(w.len(), n, "{coll} {dtype} count {count}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The library reduces bytes through the backends' kernels; the
    /// bench's inputs reduce to the same bits in any order (`crate::data`),
    /// so its meaning is the bench's typed reduction, in every type.
    #[test]
    fn reductions_are_the_benchs_typed_ones() {
        fn typed<T: parbench::comm::Element>(dtype: DType) {
            for op in ReduceOp::ALL {
                for world in [1, 3, 8] {
                    let inp = inputs(dtype, Some(op), world);
                    let args = CollArgs::new(100, dtype).op(op);
                    let want: Vec<u8> =
                        bytemuck::cast_slice(&inp.reduced::<T>(op, 0, 100)).to_vec();
                    let got = expected(Collective::AllReduce, &inp, args, 0);
                    assert_eq!(got, Some(want), "{dtype} {op} world {world}");
                }
            }
        }
        typed::<f32>(DType::F32);
        typed::<f64>(DType::F64);
        typed::<half::f16>(DType::F16);
        typed::<half::bf16>(DType::BF16);
        typed::<i32>(DType::I32);
        typed::<i64>(DType::I64);
        typed::<u8>(DType::U8);
        typed::<i8>(DType::I8);
        typed::<u32>(DType::U32);
        typed::<u64>(DType::U64);
        typed::<parbench::comm::F8E4M3>(DType::F8E4M3);
        typed::<parbench::comm::F8E5M2>(DType::F8E5M2);
    }

    /// A backend that summed without mulsum's scalar would be caught: the
    /// meanings differ wherever an odd rank holds a non-zero element.
    #[test]
    fn mulsum_means_more_than_sum() {
        for dtype in [DType::F32, DType::I8, DType::F8E4M3] {
            let args = CollArgs::new(64, dtype);
            let mulsum = inputs(dtype, Some(ReduceOp::MulSum), 3);
            let want = expected(Collective::AllReduce, &mulsum, args.op(ReduceOp::MulSum), 0);
            let unscaled = expected(Collective::AllReduce, &mulsum, args.op(ReduceOp::Sum), 0);
            assert_ne!(want, unscaled, "{dtype}");
        }
    }

    #[test]
    fn data_movers_return_the_inputs_they_move() {
        let inp = inputs(DType::F32, None, 3);
        let args = CollArgs::new(5, DType::F32).root(2);
        let gathered: Vec<u8> = (0..3).flat_map(|r| inp.bytes(r, 0, 5)).collect();
        assert_eq!(
            expected(Collective::AllGather, &inp, args, 1),
            Some(gathered)
        );
        assert_eq!(
            expected(Collective::Broadcast, &inp, args, 0),
            Some(inp.bytes(2, 0, 5))
        );
        assert_eq!(
            expected(Collective::SendRecv, &inp, args, 0),
            Some(inp.bytes(2, 0, 5))
        );
        let a2a: Vec<u8> = (0..3).flat_map(|r| inp.bytes(r, 5, 5)).collect();
        assert_eq!(expected(Collective::AllToAll, &inp, args, 1), Some(a2a));
        assert_eq!(expected(Collective::Reduce, &inp, args, 0), None);
    }

    #[test]
    fn a_slice_fits_the_typed_copies_it_replaces() {
        // all_reduce on 64 ranks: a slice of every rank's block (and a copy)
        // and the output twice stay within one send and one receive buffer.
        let n = slice_elems(Collective::AllReduce, 1 << 20, 64);
        assert!(n >= 1 && (2 * 64 + 2) * n <= 2 << 20, "{n}");
        assert_eq!(slice_elems(Collective::AllReduce, 0, 64), 1);
        // One rank: its block, a copy and the output twice are two buffers'
        // worth at half the count.
        assert_eq!(slice_elems(Collective::Broadcast, 10, 1), 5);
    }
}
