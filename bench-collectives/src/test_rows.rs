//! A collectives row for unit tests: 1 KiB all_reduce on local, 2 ranks,
//! every figure 1; tests set the fields they hold.

use parbench::results::CollectiveRow;

pub fn row() -> CollectiveRow {
    CollectiveRow {
        schema: 1,
        ..CollectiveRow::for_tests("r", 1024)
    }
}
