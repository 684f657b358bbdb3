//! sendrecv (nccl-tests' SendRecv): every rank sends `count` elements to the
//! next rank and receives as many from the previous one, at once. It is the
//! communicator's send_recv, which takes two buffers: no in-place form.

coll_op! {
    SendRecv: SendRecv, in_place = false;
    expected<T>(inp, _, _, rank, count) {
        let from = (rank + inp.world - 1) % inp.world.max(1);
        Some(inp.range(from, 0, count))
    }
    call(c, io, args) {
        // The communicator's send_recv to the next rank from the previous.
        parbench::comm::collective::sendrecv::over_send_recv(c, io, args)
    }
}
