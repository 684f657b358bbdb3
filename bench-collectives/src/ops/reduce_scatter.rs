//! reduce_scatter: `count x world` elements in, block `rank` of the
//! reduction out. nccl-tests' size is the whole input.

coll_op! {
    ReduceScatter: ReduceScatter;
    expected<T>(inp, op, _, rank, count) {
        Some(inp.reduced(op, rank * count, count))
    }
}
