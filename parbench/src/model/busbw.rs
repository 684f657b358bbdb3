//! Algorithm and bus bandwidth exactly as nccl-tests defines them
//! (NVIDIA/nccl-tests, `doc/PERFORMANCE.md`), so parbench's figures can be
//! laid beside nccl-tests' own.
//!
//! `algbw = S / t` with `S` the size column (see [`super::alpha_beta`]) and
//! GB = 1e9 bytes; `busbw = algbw x factor`, where the factor turns the
//! algorithm bandwidth into the bandwidth each rank's link carries under a
//! bandwidth-optimal algorithm, so that it compares with the hardware's
//! peak whatever the collective and rank count.

use crate::comm::Collective;

/// nccl-tests' bus-bandwidth factor for `coll` on `world` ranks:
/// all_reduce `2(n-1)/n`; all_gather, reduce_scatter and all_to_all
/// `(n-1)/n`; broadcast, reduce and sendrecv 1. One rank (or none) gives
/// 0 for the `(n-1)/n` collectives, as nccl-tests prints.
pub fn busbw_factor(coll: Collective, world: usize) -> f64 {
    coll.spec().busbw_factor(world)
}

/// Algorithm bandwidth in GB/s (1e9 bytes per second): `bytes / seconds`.
/// 0 when `seconds` is not a positive finite number (a failed or empty
/// measurement reads as no bandwidth, never as infinite).
pub fn algbw_gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds.is_finite() && seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

/// Bus bandwidth in GB/s: [`algbw_gbps`] times [`busbw_factor`].
pub fn busbw_gbps(coll: Collective, world: usize, bytes: u64, seconds: f64) -> f64 {
    algbw_gbps(bytes, seconds) * busbw_factor(coll, world)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_match_nccl_tests() {
        assert_eq!(busbw_factor(Collective::AllReduce, 8), 1.75);
        assert_eq!(busbw_factor(Collective::AllReduce, 2), 1.0);
        assert_eq!(busbw_factor(Collective::AllGather, 8), 0.875);
        assert_eq!(busbw_factor(Collective::ReduceScatter, 4), 0.75);
        assert_eq!(busbw_factor(Collective::AllToAll, 4), 0.75);
        assert_eq!(busbw_factor(Collective::Broadcast, 8), 1.0);
        assert_eq!(busbw_factor(Collective::Reduce, 8), 1.0);
        assert_eq!(busbw_factor(Collective::SendRecv, 2), 1.0);
        assert_eq!(busbw_factor(Collective::AllReduce, 1), 0.0);
        assert_eq!(busbw_factor(Collective::AllGather, 0), 0.0);
        let f3 = busbw_factor(Collective::AllReduce, 3);
        assert!((f3 - 4.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn busbw_factor_is_the_bandwidth_optimal_bytes_factor() {
        // Why busbw compares with a link's bandwidth: for the bandwidth-optimal
        // algorithms, the factor is exactly the alpha-beta bytes factor, so
        // t -> factor x n / link_bw for large n and busbw -> link_bw.
        use crate::model::alpha_beta::{pairwise_all_to_all, ring_all_reduce, ring_gather_scatter};
        for p in 2..=9 {
            let f = |c| busbw_factor(c, p);
            assert!((ring_all_reduce(p).bytes_factor - f(Collective::AllReduce)).abs() < 1e-15);
            let ag = ring_gather_scatter(p, false).bytes_factor;
            assert!((ag - f(Collective::AllGather)).abs() < 1e-15);
            let rs = ring_gather_scatter(p, true).bytes_factor;
            assert!((rs - f(Collective::ReduceScatter)).abs() < 1e-15);
            let a2a = pairwise_all_to_all(p).bytes_factor;
            assert!((a2a - f(Collective::AllToAll)).abs() < 1e-15);
        }
    }

    #[test]
    fn algbw_uses_decimal_gigabytes() {
        // 1 GiB in 10 ms: 107.374 GB/s (1 GiB = 1.073741824e9 B).
        let a = algbw_gbps(1 << 30, 0.01);
        assert!((a - 107.3741824).abs() < 1e-9, "{a}");
        // busbw of an 8-rank all_reduce: x 1.75.
        let b = busbw_gbps(Collective::AllReduce, 8, 1 << 30, 0.01);
        assert!((b - 107.3741824 * 1.75).abs() < 1e-9, "{b}");
        assert_eq!(algbw_gbps(8, 0.0), 0.0);
        assert_eq!(algbw_gbps(8, f64::NAN), 0.0);
        assert_eq!(algbw_gbps(8, -1.0), 0.0);
    }
}
