//! all_to_all: block j of `count` elements goes to rank j; block i of the
//! output comes from rank i. nccl-tests' size is one rank's whole send buffer.

coll_op! {
    AllToAll: AllToAll;
    expected<T>(inp, _, _, rank, count) {
        Some(
            (0..inp.world)
                .flat_map(|i| inp.range::<T>(i, rank * count, count))
                .collect(),
        )
    }
}
