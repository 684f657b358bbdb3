//! all_reduce: `count` elements in, the same `count` reduced over all ranks out.

coll_op! {
    AllReduce: AllReduce;
    expected<T>(inp, op, _, _, count) {
        Some(inp.reduced(op, 0, count))
    }
    call(c, io, count, dtype, op, _) {
        c.all_reduce(io, count, dtype, op)
    }
}
