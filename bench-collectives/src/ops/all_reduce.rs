//! all_reduce: `count` elements in, the same `count` reduced over all ranks out.

coll_op! {
    AllReduce: AllReduce;
    expected<T>(inp, op, _, _, count) {
        Some(inp.reduced(op, 0, count))
    }
}
