//! Harness overhead: time per 8-byte all_reduce through `measure::time_loop`
//! (one clock pair around the loop plus one clock read per iteration) against
//! a bare loop of the same communicator calls, alternating, on `local`.
//!
//! `cargo run --release -p bench-collectives --example harness_overhead [RANKS] [ITERS] [ROUNDS]`

use parbench::comm::{local, Algo, CommBuffer, Communicator, DType, Io, ReduceOp};
use parbench::measure::{time_loop, LoopSpec};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let world = args.next().and_then(Result::ok).unwrap_or(2);
    let iters = args.next().and_then(Result::ok).unwrap_or(20_000);
    let rounds = args.next().and_then(Result::ok).unwrap_or(7);
    let results = local::run(world, Algo::Auto, Duration::from_secs(60), |comm| {
        let mut send = comm.alloc(8)?;
        send.write_from_host(&[1u8; 8])?;
        let mut recv = comm.alloc(8)?;
        let spec = LoopSpec {
            warmup: 100,
            iters,
            delay: None,
            graph: None,
        };
        // The one call both loops time: the same closure, so that they
        // differ only by the harness around it.
        let mut all_reduce_8b = |c: &mut local::LocalComm| {
            let io = Io::OutOfPlace {
                send: &send,
                recv: &mut recv,
            };
            c.all_reduce(io, 2, DType::F32, ReduceOp::Sum)
        };
        let (mut bare, mut harness) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for _ in 0..100 {
                all_reduce_8b(comm)?;
            }
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..iters {
                all_reduce_8b(comm)?;
            }
            comm.sync()?;
            bare.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            let times = time_loop(comm, &spec, &mut all_reduce_8b)?;
            harness.push(times.mean_us());
        }
        Ok((bare, harness))
    });
    let Some(Ok((mut bare, mut harness))) = results.into_iter().next() else {
        eprintln!("harness_overhead: the run failed");
        std::process::exit(1);
    };
    bare.sort_by(f64::total_cmp);
    harness.sort_by(f64::total_cmp);
    // On a shared machine other processes inflate some rounds: the best
    // round is the least disturbed, the median the typical one.
    let (bm, hm) = (bare[bare.len() / 2], harness[harness.len() / 2]);
    let (bb, hb) = (bare[0], harness[0]);
    println!("local, {world} ranks, all_reduce 8 B float sum, {iters} iterations x {rounds} alternating rounds (rank 0):");
    println!("  bare loop     best {bb:.3} us/op, median {bm:.3} us/op");
    println!("  time_loop     best {hb:.3} us/op, median {hm:.3} us/op");
    println!(
        "  harness / bare: best {:.3}, median {:.3}",
        hb / bb,
        hm / bm
    );
}
