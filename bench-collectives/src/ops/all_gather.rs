//! all_gather: `count` elements from each rank, all `count x world` out on
//! every rank. nccl-tests' size is the gathered output.

coll_op! {
    AllGather: AllGather;
    expected<T>(inp, _, _, _, count) {
        Some(
            (0..inp.world)
                .flat_map(|r| inp.range::<T>(r, 0, count))
                .collect(),
        )
    }
}
