//! broadcast: the root's `count` elements out on every rank.

coll_op! {
    Broadcast: Broadcast;
    expected<T>(inp, _, root, _, count) {
        Some(inp.range(root, 0, count))
    }
}
