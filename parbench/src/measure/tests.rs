//! The measurements over a real communicator (`local`, threads).

use super::*;
use crate::comm::{local, Algo, CommBuffer, Communicator, DType, Io, ReduceOp};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn gathers_in_rank_order_on_every_rank() {
    let got = local::run(3, Algo::Auto, TIMEOUT, |c| {
        let r = c.rank() as f64;
        gather_f64(c, &[r, 10.0 * r])
    });
    for g in got {
        assert_eq!(
            g.unwrap(),
            vec![vec![0.0, 0.0], vec![1.0, 10.0], vec![2.0, 20.0]]
        );
    }
}

#[test]
fn a_timed_loop_gives_the_same_stats_on_every_rank_and_sees_a_late_rank() {
    let delay = Duration::from_millis(3);
    let got = local::run(2, Algo::Auto, TIMEOUT, |c| {
        let mut send = c.alloc(8)?;
        send.write_from_host(&[0u8; 8])?;
        let mut recv = c.alloc(8)?;
        let spec = LoopSpec {
            warmup: 2,
            iters: 12,
            delay: (c.rank() == 1).then_some(delay),
            graph: None,
        };
        let times = time_loop(c, &spec, |c| {
            c.all_reduce(
                Io::OutOfPlace {
                    send: &send,
                    recv: &mut recv,
                },
                2,
                DType::F32,
                ReduceOp::Sum,
            )
        })?;
        assert_eq!(times.iter_ns.len(), 12);
        let wrong = c.rank() as u64 + 1;
        LoopStats::gather(c, &times, wrong, Average::Max)
    });
    let stats: Vec<LoopStats> = got.into_iter().map(Result::unwrap).collect();
    assert_eq!(stats[0], stats[1], "every rank reduces the same packets");
    let s = &stats[0];
    assert_eq!(s.wrong, 3, "summed over ranks");
    assert_eq!(s.rank_time_us.len(), 2);
    // Rank 1 sleeps before every call, so every iteration lasts at least that long...
    assert!(s.iter_min_us >= delay.as_secs_f64() * 1e6 * 0.9, "{s:?}");
    assert!(
        s.p50_us <= s.p99_us && s.p99_us <= s.iter_max_us * 1.001,
        "{s:?}"
    );
    // ...and rank 1 arrives last: the tally names it.
    let mut tally = StragglerTally::default();
    tally.add(s);
    let v = tally.verdict().expect("a straggler");
    assert_eq!(v.rank, 1);
    assert!(v.fraction > 0.5);
}

#[test]
fn wire_figures_need_two_ranks() {
    let got = local::run(2, Algo::Auto, TIMEOUT, |c| {
        Ok((stream_throughput(c, 1 << 16, 4)?, ping_pong_latency(c, 20)?))
    });
    for g in got {
        let (bw, lat) = g.unwrap();
        assert!(bw.is_some_and(|b| b > 0.0 && b.is_finite()));
        assert!(lat.is_some_and(|l| l > 0.0 && l.is_finite()));
    }
    let alone = local::run(1, Algo::Auto, TIMEOUT, |c| {
        Ok((stream_throughput(c, 1 << 16, 4)?, ping_pong_latency(c, 20)?))
    });
    assert_eq!(alone.into_iter().next().unwrap().unwrap(), (None, None));
}

/// Latencies on 3 ranks: every rank gets rank 0's figures, and the
/// warm-up never leaves one rank an exchange ahead (a lone exchange would
/// pair with its peer's gather and scramble both: the collectives after
/// it would fail or disagree).
#[test]
fn latencies_agree_on_every_rank_and_leave_the_ranks_in_step() {
    let got = local::run(3, Algo::Auto, TIMEOUT, |c| {
        let ping = ping_pong(c, 50)?;
        let x = exchange_latency(c, 50)?;
        // Still in step: a gather after them sees every rank.
        let ranks = gather_f64(c, &[c.rank() as f64])?;
        Ok((ping, x, ranks))
    });
    let all: Vec<_> = got.into_iter().map(Result::unwrap).collect();
    for (p, x, ranks) in &all {
        assert_eq!((p, x), (&all[0].0, &all[0].1));
        assert_eq!(ranks, &vec![vec![0.0], vec![1.0], vec![2.0]]);
        let (p, x) = (p.as_ref().unwrap(), x.as_ref().unwrap());
        assert!(
            p.trips >= 50 && p.warmup >= 50 && x.warmup >= 50,
            "{p:?} {x:?}"
        );
        assert!(p.p10_us <= p.median_us && p.median_us <= p.p90_us, "{p:?}");
        assert!(x.median_us > 0.0 && x.jitter_us() >= 0.0, "{x:?}");
    }
}
