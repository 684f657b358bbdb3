//! One file per collective, saying only what differs between them (as
//! nccl-tests does): how a swept size becomes a per-rank count, the buffer
//! sizes, where the input and output sit in place, the expected output, and
//! the call. Sweeping, timing, checking and printing live once, in
//! `crate::sweep`. Each file is one [`coll_op!`]. Adding an operation means
//! adding a file here and a line to [`with_op!`] (see docs/architecture.md,
//! "Checklist: add a collective", for the library's side).

/// Writes one collective's [`CollOp`] from what differs: its type, its
/// `Collective` variant (and `in_place = false` without an in-place form),
/// the body of `expected` and, where the call is not the communicator's
/// one collective entry, the body of `call`, each after the names (or `_`)
/// of its arguments in [`CollOp`]'s order. The signatures live here once.
macro_rules! coll_op {
    (
        $ty:ident: $coll:ident $(, in_place = $in_place:expr)?;
        expected<$t:ident>($inp:pat, $op:pat, $root:pat, $rank:pat, $count:pat) $expected:block
        $(call($c:ident, $io:pat, $args:pat) $call:block)?
    ) => {
        pub struct $ty;

        impl $crate::ops::CollOp for $ty {
            const COLL: parbench::comm::Collective = parbench::comm::Collective::$coll;
            $(const IN_PLACE: bool = $in_place;)?

            fn expected<$t: parbench::comm::Element>(
                $inp: &$crate::data::Inputs,
                $op: parbench::comm::ReduceOp,
                $root: usize,
                $rank: usize,
                $count: usize,
            ) -> Option<Vec<$t>> $expected

            $(fn call<C: parbench::comm::Communicator>(
                $c: &mut C,
                $io: parbench::comm::Io<'_, C::Buffer>,
                $args: parbench::comm::CollArgs,
            ) -> parbench::comm::CommResult<()> $call)?
        }
    };
}

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod broadcast;
pub mod reduce;
pub mod reduce_scatter;
pub mod sendrecv;

use crate::data::Inputs;
use parbench::comm::{CollArgs, CommResult, Communicator, DType, Element, Io, ReduceOp};

/// What one collective's benchmark says about itself. Counts are per rank
/// (the communicator's convention); sizes are nccl-tests' `size` column.
pub trait CollOp {
    /// The collective.
    const COLL: parbench::comm::Collective;
    /// Whether the communicator offers an in-place form.
    const IN_PLACE: bool = true;

    // The buffer rule is the collective's own (`Collective::send_blocks`
    // and the rest): one rule for the benches, the communicators and the model.

    /// Per-rank count for a swept size of `bytes` (nccl-tests' meaning).
    fn count_for(bytes: u64, dtype: DType, world: usize) -> usize {
        Self::COLL.count_for(bytes, dtype.size(), world)
    }
    /// nccl-tests' size (bytes) of a call with per-rank `count`.
    fn size_of(count: usize, dtype: DType, world: usize) -> u64 {
        Self::COLL.size_of(count, dtype.size(), world)
    }
    /// Elements of the send buffer.
    fn send_elems(count: usize, world: usize) -> usize {
        Self::COLL.send_elems(count, world)
    }
    /// Elements of the receive buffer (the output, whole).
    fn recv_elems(count: usize, world: usize) -> usize {
        Self::COLL.recv_elems(count, world)
    }
    /// Where (elements) the input starts in the one in-place buffer.
    fn in_place_input(count: usize, rank: usize) -> usize {
        Self::COLL.in_place_input(count, rank)
    }
    /// Where (elements) the output starts in the one in-place buffer.
    fn in_place_output(count: usize, rank: usize) -> usize {
        Self::COLL.in_place_output(count, rank)
    }
    /// The output rank `rank` must hold (`recv_elems` elements), or `None`
    /// where the collective leaves it undefined.
    fn expected<T: Element>(
        inputs: &Inputs,
        op: ReduceOp,
        root: usize,
        rank: usize,
        count: usize,
    ) -> Option<Vec<T>>;
    /// The call: the communicator's collective entry.
    fn call<C: Communicator>(
        comm: &mut C,
        io: Io<'_, C::Buffer>,
        args: CollArgs,
    ) -> CommResult<()> {
        comm.collective(Self::COLL, io, args)
    }
}

/// Runs `$body` with `$O` bound to the [`CollOp`] of collective `$coll`.
macro_rules! with_op {
    ($coll:expr, $O:ident => $body:expr) => {{
        use parbench::comm::Collective;
        match $coll {
            Collective::AllReduce => {
                type $O = $crate::ops::all_reduce::AllReduce;
                $body
            }
            Collective::AllGather => {
                type $O = $crate::ops::all_gather::AllGather;
                $body
            }
            Collective::ReduceScatter => {
                type $O = $crate::ops::reduce_scatter::ReduceScatter;
                $body
            }
            Collective::Broadcast => {
                type $O = $crate::ops::broadcast::Broadcast;
                $body
            }
            Collective::Reduce => {
                type $O = $crate::ops::reduce::Reduce;
                $body
            }
            Collective::AllToAll => {
                type $O = $crate::ops::all_to_all::AllToAll;
                $body
            }
            Collective::SendRecv => {
                type $O = $crate::ops::sendrecv::SendRecv;
                $body
            }
        }
    }};
}
pub(crate) use with_op;
