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
        };
        let (mut bare, mut harness) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for _ in 0..100 {
                comm.all_reduce(
                    Io::OutOfPlace {
                        send: &send,
                        recv: &mut recv,
                    },
                    2,
                    DType::F32,
                    ReduceOp::Sum,
                )?;
            }
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..iters {
                comm.all_reduce(
                    Io::OutOfPlace {
                        send: &send,
                        recv: &mut recv,
                    },
                    2,
                    DType::F32,
                    ReduceOp::Sum,
                )?;
            }
            comm.sync()?;
            bare.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            let times = time_loop(comm, &spec, |c| {
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
    let (b, h) = (bare[bare.len() / 2], harness[harness.len() / 2]);
    println!("local, {world} ranks, all_reduce 8 B float sum, {iters} iterations x {rounds} rounds (rank 0, median round):");
    println!("  bare loop     {b:.3} us/op   (rounds: {bare:.3?})");
    println!("  time_loop     {h:.3} us/op   (rounds: {harness:.3?})");
    println!("  harness / bare = {:.3}", h / b);
}
