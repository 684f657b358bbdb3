//! reduce: `count` elements reduced over all ranks, out on the root only
//! (other ranks' output is undefined and not checked).

coll_op! {
    Reduce: Reduce;
    expected<T>(inp, op, root, rank, count) {
        (rank == root).then(|| inp.reduced(op, 0, count))
    }
}
