//! A collectives row for unit tests: 1 KiB all_reduce on local, 2 ranks,
//! every figure 1; tests set the fields they hold.

use parbench::results::CollectiveRow;

pub fn row() -> CollectiveRow {
    CollectiveRow {
        schema: 1,
        run_id: "r".into(),
        backend: "local".into(),
        wire: "shm".into(),
        algo: "ring".into(),
        collective: "all_reduce".into(),
        dtype: "float".into(),
        op: "sum".into(),
        root: -1,
        world: 2,
        bytes: 1024,
        count: 256,
        in_place: false,
        iters: 1,
        time_us: 1.0,
        time_min_us: 1.0,
        time_max_us: 1.0,
        p50_us: 1.0,
        p99_us: 1.0,
        algbw_gbps: 1.0,
        busbw_gbps: 1.0,
        wrong: 0,
        model_us: 1.0,
        ceiling_gbps: 1.0,
    }
}
