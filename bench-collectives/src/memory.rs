//! The memory a sweep's flags imply, checked before anything is allocated.
//!
//! At its largest size a rank holds, per collective: the send and receive
//! buffers of the communicator, the host input (built once as typed values
//! and once as bytes), the expected output and, while it is built, one
//! slice of the collective's meaning (`crate::expected`: at most a send
//! and a receive buffer), the read-back copy and the check's sentinel: at
//! most `3 x send + 4 x recv` bytes (in place the one buffer is the larger
//! of the two), and with `-o mulsum` on a reducing collective one send
//! buffer more (an odd rank's scaled copy of its input,
//! `parbench::comm::collective::premul`). The host's share is that times
//! the ranks on this host.

use crate::config::SweepConfig;
use parbench::comm::{Collective, DType, ReduceOp};
use parbench::limits::{bytes_text, LimitError};

/// Host buffers of one rank at the sweep's largest size, the worst
/// collective and type, and which one that is.
pub fn per_rank(cfg: &SweepConfig, world: usize) -> (u128, String) {
    let Some(&largest) = cfg.sizes.last() else {
        return (0, String::new());
    };
    let mut worst = (0u128, String::new());
    for &coll in &cfg.collectives {
        for &dtype in &cfg.dtypes {
            let (send, recv) = buffer_bytes(coll, largest, dtype, world);
            let scaled_copy = if coll.reduces() && cfg.ops.contains(&ReduceOp::MulSum) {
                send
            } else {
                0
            };
            let need = 3 * send + 4 * recv + scaled_copy;
            if need > worst.0 {
                worst = (
                    need,
                    format!(
                        "{} of {} per rank at {}",
                        coll.name(),
                        bytes_text(send.max(recv)),
                        bytes_text(largest as u128)
                    ),
                );
            }
        }
    }
    worst
}

/// Bytes of one rank's send and receive buffers of `coll` at nccl-tests
/// size `size`.
fn buffer_bytes(coll: Collective, size: u64, dtype: DType, world: usize) -> (u128, u128) {
    let count = parbench::measure::wire::row_count(coll, size, dtype, world);
    let elem = dtype.size() as u128;
    (
        elems(coll.send_elems(count.min(1), world), count) * elem,
        elems(coll.recv_elems(count.min(1), world), count) * elem,
    )
}

/// `per_one` elements for a count of one, scaled to `count` in u128 (the
/// collectives' buffers are linear in the count; a huge count must not
/// overflow `usize` before it is refused).
fn elems(per_one: usize, count: usize) -> u128 {
    per_one as u128 * count as u128
}

/// Refuses a sweep whose buffers on this host (`ranks_here` ranks) do not
/// fit the memory available now; the error names `-e/--max-bytes`.
pub fn check_host(cfg: &SweepConfig, world: usize, ranks_here: usize) -> Result<(), LimitError> {
    let (rank, what) = per_rank(cfg, world);
    let need = rank * ranks_here.max(1) as u128;
    parbench::limits::check_host_memory(
        need,
        &format!(
            "-e/--max-bytes {}",
            bytes_text(cfg.sizes.last().copied().unwrap_or(0) as u128)
        ),
        &format!(
            "{ranks_here} rank(s) on this host x {}: {what}",
            bytes_text(rank)
        ),
    )
}

/// Host bytes one rank of `bench-collectives links` holds: its send and
/// receive buffers of `bytes` (the pair's message, `-e`) and the host copy
/// the send buffer is filled from.
pub fn per_rank_links(bytes: u64) -> u128 {
    3 * u128::from(bytes.max(8))
}

/// Refuses a pair sweep whose buffers on this host (`ranks_here` ranks)
/// do not fit the memory available now; the error names `-e/--max-bytes`.
pub fn check_links(bytes: u64, ranks_here: usize) -> Result<(), LimitError> {
    let rank = per_rank_links(bytes);
    parbench::limits::check_host_memory(
        rank * ranks_here.max(1) as u128,
        &format!("links -e/--max-bytes {}", bytes_text(u128::from(bytes))),
        &format!(
            "{ranks_here} rank(s) on this host x {}: two buffers of the pair's message and its host copy",
            bytes_text(rank)
        ),
    )
}

/// Device memory of one rank at the sweep's largest size: its send and
/// receive buffers (the larger of the two in place), the worst collective
/// and type.
pub fn per_gpu(cfg: &SweepConfig, world: usize) -> u128 {
    let Some(&largest) = cfg.sizes.last() else {
        return 0;
    };
    let mut worst = 0u128;
    for &coll in &cfg.collectives {
        for &dtype in &cfg.dtypes {
            let (send, recv) = buffer_bytes(coll, largest, dtype, world);
            let need = send + recv;
            worst = worst.max(need);
        }
    }
    worst
}

/// Refuses a sweep whose device buffers do not fit GPU `ordinal`'s memory
/// (one rank per GPU under NCCL). A GPU that cannot be asked
/// passes (the device call will say what is wrong).
pub fn check_gpu(cfg: &SweepConfig, world: usize, ordinal: usize) -> Result<(), LimitError> {
    let Some(have) = parbench::launch::ranks::gpu_memory(ordinal) else {
        return Ok(());
    };
    let need = per_gpu(cfg, world);
    parbench::limits::check_memory(
        need,
        have as u128,
        &format!(
            "-e/--max-bytes {}",
            bytes_text(cfg.sizes.last().copied().unwrap_or(0) as u128)
        ),
        "each rank's send and receive buffers on its GPU",
        &format!("GPU {ordinal}'s memory"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse_args;

    #[test]
    fn the_largest_size_sets_the_need() {
        let p = parse_args(["b", "all_gather", "-b", "1M", "-e", "64M"])
            .unwrap()
            .job()
            .unwrap();
        let (n, what) = per_rank(&p.sweep, 4);
        // all_gather's output is the swept size, its input a quarter of it.
        assert_eq!(n, 3 * (16 << 20) + 4 * (64 << 20));
        assert!(what.starts_with("all_gather"), "{what}");
        let huge = parse_args(["b", "-b", "64G", "-e", "64G"])
            .unwrap()
            .job()
            .unwrap();
        let e = check_host(&huge.sweep, 4, 4).unwrap_err().0;
        assert!(
            e.starts_with("-e/--max-bytes 64.0 GiB: the run needs about"),
            "{e}"
        );
    }

    #[test]
    fn mulsum_counts_the_scaled_copy_of_the_input() {
        let need = |op: &str| {
            let p = parse_args(["b", "reduce_scatter", "-e", "64M", "-o", op])
                .unwrap()
                .job()
                .unwrap();
            per_rank(&p.sweep, 4).0
        };
        // reduce_scatter's input is the swept size.
        assert_eq!(need("sum,mulsum") - need("sum"), 64 << 20);
    }
}
