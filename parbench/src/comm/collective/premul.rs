//! `MulSum` where the reduction itself cannot scale: NCCL's PreMulSum
//! multiplies each rank's input by the rank's scalar inside its reduction
//! kernel; the host algorithms (and MPI, which has no such operator) scale
//! the input first (in place, or into a copy when out of place, so the
//! caller's send buffer is never written) and then sum. Every host path
//! (`HostComm`, sub-groups, NCCL's and MPI's collectives over
//! point-to-point) runs through [`run`]; MPI's own calls through
//! [`premultiplied`].
//!
//! The scaling is one pass over the input on the odd ranks (the even
//! ranks' scalar is 1): time that NCCL spends inside its kernel and that
//! a host backend's `mulsum` row includes.

use super::Collective;
use crate::comm::host::HostRun;
use crate::comm::{nbytes, premultiply, CollArgs, CommResult, HostBuffer, Io, ReduceOp, Transport};

/// Runs `coll`'s host algorithm; a `MulSum` reduction first scales this
/// rank's input by [`ReduceOp::mulsum_scalar`], then sums.
pub(super) fn run<T: Transport>(coll: Collective, run: HostRun<'_, T>) -> CommResult<()> {
    if run.args.op != ReduceOp::MulSum || !coll.reduces() {
        return coll.run_spec_host(run);
    }
    let HostRun {
        io,
        mut args,
        t,
        scratch,
        deadline,
        plan,
    } = run;
    // Taken out of the scratch, which the algorithm uses during the call.
    let mut copy = std::mem::take(&mut scratch.premul);
    let io = premultiplied(coll, io, &mut args, t.rank(), t.world(), &mut copy)?;
    let result = coll.run_spec_host(HostRun {
        io,
        args,
        t,
        scratch: &mut *scratch,
        deadline,
        plan,
    });
    scratch.premul = copy;
    result
}

/// The buffers a `MulSum` call of `coll` reduces as a sum, `args.op` made
/// `Sum`: `rank`'s input scaled by its scalar, in place in the one buffer
/// (the result overwrites it), or out of place in `copy` (kept between
/// calls by the caller). Other calls, and the ranks whose scalar is 1,
/// are given back as they came. A buffer shorter than the input goes on
/// unscaled, for the collective to refuse by name.
pub(crate) fn premultiplied<'b>(
    coll: Collective,
    io: Io<'b, HostBuffer>,
    args: &mut CollArgs,
    rank: usize,
    world: usize,
    copy: &'b mut HostBuffer,
) -> CommResult<Io<'b, HostBuffer>> {
    if args.op != ReduceOp::MulSum || !coll.reduces() {
        return Ok(io);
    }
    args.op = ReduceOp::Sum;
    let scalar = ReduceOp::mulsum_scalar(rank);
    if scalar == 1.0 {
        return Ok(io);
    }
    let dtype = args.dtype;
    let input = nbytes(args.count, coll.send_blocks(world), dtype)?;
    Ok(match io {
        Io::InPlace(b) => {
            let at = coll.in_place_input(args.count, rank) * dtype.size();
            if let Some(region) = b.bytes_mut().get_mut(at..at.saturating_add(input)) {
                premultiply(region, dtype, scalar);
            }
            Io::InPlace(b)
        }
        Io::OutOfPlace { send, recv } if send.bytes().len() >= input => {
            // Only the input's bytes: the send buffer may be larger.
            if copy.bytes().len() < input {
                *copy = HostBuffer::zeroed(input);
            }
            let region = &mut copy.bytes_mut()[..input];
            region.copy_from_slice(&send.bytes()[..input]);
            premultiply(region, dtype, scalar);
            Io::OutOfPlace { send: copy, recv }
        }
        io => io,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::DType;

    fn buf(v: &[i32]) -> HostBuffer {
        HostBuffer::from_slice(v)
    }

    #[test]
    fn odd_ranks_sum_a_scaled_copy_and_leave_their_send_buffer() {
        let send = buf(&[1, 2, 3, 99]);
        let mut recv = buf(&[0; 3]);
        let mut copy = HostBuffer::default();
        let mut args = CollArgs::new(3, DType::I32).op(ReduceOp::MulSum);
        let io = Io::OutOfPlace {
            send: &send,
            recv: &mut recv,
        };
        let io = premultiplied(Collective::AllReduce, io, &mut args, 1, 2, &mut copy).unwrap();
        let Io::OutOfPlace { send: scaled, .. } = io else {
            panic!("out of place stays out of place");
        };
        assert_eq!(&scaled.as_slice::<i32>()[..3], &[2, 4, 6]);
        assert_eq!(args.op, ReduceOp::Sum);
        assert_eq!(send.as_slice::<i32>(), &[1, 2, 3, 99]);
    }

    #[test]
    fn in_place_scales_the_input_where_the_collective_reads_it() {
        // reduce_scatter in place: the whole buffer (world x count) is the input.
        let mut b = buf(&[1, 2, 3, 4]);
        let mut copy = HostBuffer::default();
        let mut args = CollArgs::new(2, DType::I32).op(ReduceOp::MulSum);
        let coll = Collective::ReduceScatter;
        let io = premultiplied(coll, Io::InPlace(&mut b), &mut args, 3, 2, &mut copy).unwrap();
        assert!(matches!(io, Io::InPlace(_)));
        assert_eq!(b.as_slice::<i32>(), &[2, 4, 6, 8]);
    }

    #[test]
    fn even_ranks_other_ops_and_data_movers_pass_through() {
        let mut b = buf(&[1, 2]);
        let mut copy = HostBuffer::default();
        for (coll, op, rank) in [
            (Collective::AllReduce, ReduceOp::MulSum, 0),
            (Collective::AllReduce, ReduceOp::Sum, 1),
            (Collective::AllGather, ReduceOp::MulSum, 1),
        ] {
            let mut args = CollArgs::new(2, DType::I32).op(op);
            premultiplied(coll, Io::InPlace(&mut b), &mut args, rank, 2, &mut copy).unwrap();
            assert_eq!(b.as_slice::<i32>(), &[1, 2], "{coll} {op} rank {rank}");
        }
    }
}
