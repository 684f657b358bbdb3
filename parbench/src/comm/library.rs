//! What the library backends (NCCL, MPI) share: one call of their library
//! per collective it has, and for any other registered collective its
//! host algorithm over their own point-to-point calls
//! ([`group::run_over_point_to_point`]). A backend implements
//! [`LibraryCalls`]; its `Communicator::collective` is [`collective`].

use super::{
    collective as coll_file, group, Algo, CollArgs, Collective, CommBuffer, CommResult,
    Communicator, Io,
};

/// The collectives NCCL and MPI have a call for, and so run natively.
pub(crate) const LIBRARY_CALLS: [Collective; 8] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllToAll,
    Collective::AllToAllV,
    Collective::SendRecv,
];

/// A library's own call of each collective in [`LIBRARY_CALLS`] (sendrecv
/// is the backend's `send_recv`, all_to_all_v its `all_to_all_v`), with NCCL's buffer conventions.
pub(crate) trait LibraryCalls: Communicator {
    fn all_reduce_call(&mut self, io: Io<'_, Self::Buffer>, a: CollArgs) -> CommResult<()>;
    fn all_gather_call(&mut self, io: Io<'_, Self::Buffer>, a: CollArgs) -> CommResult<()>;
    fn reduce_scatter_call(&mut self, io: Io<'_, Self::Buffer>, a: CollArgs) -> CommResult<()>;
    fn broadcast_call(&mut self, io: Io<'_, Self::Buffer>, a: CollArgs) -> CommResult<()>;
    fn reduce_call(&mut self, io: Io<'_, Self::Buffer>, a: CollArgs) -> CommResult<()>;
    fn all_to_all_call(&mut self, io: Io<'_, Self::Buffer>, a: CollArgs) -> CommResult<()>;
}

/// Runs `coll` on a library backend: its library's call, or the
/// collective's host algorithm over the backend's point-to-point calls.
pub(crate) fn collective<L: LibraryCalls>(
    lib: &mut L,
    coll: Collective,
    io: Io<'_, L::Buffer>,
    a: CollArgs,
) -> CommResult<()> {
    match coll {
        Collective::AllReduce => lib.all_reduce_call(io, a),
        Collective::AllGather => lib.all_gather_call(io, a),
        Collective::ReduceScatter => lib.reduce_scatter_call(io, a),
        Collective::Broadcast => lib.broadcast_call(io, a),
        Collective::Reduce => lib.reduce_call(io, a),
        Collective::AllToAll => lib.all_to_all_call(io, a),
        Collective::AllToAllV => all_to_all_v(lib, io, a),
        Collective::SendRecv => coll_file::sendrecv::over_send_recv(lib, io, a),
        // A collective registered without a library call (every one
        // registered today has one, so this arm serves new ones).
        #[allow(unreachable_patterns)]
        other => group::run_over_point_to_point(lib, other, io, a),
    }
}

/// The registry's all_to_all_v (its per-pair counts from its file)
/// through the backend's own [`Communicator::all_to_all_v`]; in place, it
/// sends from a copy.
fn all_to_all_v<L: LibraryCalls>(
    lib: &mut L,
    io: Io<'_, L::Buffer>,
    a: CollArgs,
) -> CommResult<()> {
    let counts = coll_file::all_to_all_v::counts(a.count, lib.world(), lib.rank())?;
    match io {
        Io::OutOfPlace { send, recv } => lib.all_to_all_v(send, recv, &counts, a.dtype),
        Io::InPlace(buf) => {
            let mut copy = lib.alloc(buf.len_bytes())?;
            copy.copy_from(buf)?;
            lib.all_to_all_v(&copy, buf, &counts, a.dtype)
        }
    }
}

/// What a library backend records as the algorithm of `coll` when its
/// library has no call for it: the host algorithm it runs instead (`None`
/// for a collective the library runs, which says its own).
pub(crate) fn host_algo_for(coll: Collective, world: usize, bytes: usize) -> Option<String> {
    (!LIBRARY_CALLS.contains(&coll)).then(|| {
        coll.spec()
            .choose(Algo::Auto, world, bytes)
            .name()
            .to_string()
    })
}
