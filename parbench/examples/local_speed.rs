//! Quick look at the `local` backend's speed (not a benchmark suite: the
//! bench-collectives binary is). Prints all_reduce latency at 8 bytes and
//! bus bandwidth (nccl-tests' definition) of all_reduce, all_gather and
//! reduce_scatter at 64 MiB, for a world size given as the first argument
//! (default 2) and an algorithm as the second (default auto).
//!
//! `cargo run --release -p parbench --example local_speed -- 2 auto`

use parbench::comm::local::run;
use parbench::comm::{Algo, CommResult, Communicator, DType, HostBuffer, Io, LocalComm, ReduceOp};
use std::time::{Duration, Instant};

/// Seconds per call of `op` after `warm` untimed calls, timed over `iters`
/// calls between barriers; the slowest rank's figure.
fn time_per_call(
    world: usize,
    algo: Algo,
    warm: usize,
    iters: usize,
    op: impl Fn(&mut LocalComm, &mut HostBuffer, &mut HostBuffer) -> CommResult<()> + Sync,
    send_bytes: usize,
    recv_bytes: usize,
) -> f64 {
    let res = run(world, algo, Duration::from_secs(60), |c| {
        let mut send = HostBuffer::zeroed(send_bytes);
        let mut recv = HostBuffer::zeroed(recv_bytes);
        for _ in 0..warm {
            op(c, &mut send, &mut recv)?;
        }
        c.barrier()?;
        let t = Instant::now();
        for _ in 0..iters {
            op(c, &mut send, &mut recv)?;
        }
        c.barrier()?;
        Ok(t.elapsed().as_secs_f64() / iters as f64)
    });
    res.into_iter()
        .map(|r| r.expect("rank failed"))
        .fold(0.0, f64::max)
}

/// A collective on a rank's send and receive buffers.
type Op<'a> =
    &'a (dyn Fn(&mut LocalComm, &mut HostBuffer, &mut HostBuffer) -> CommResult<()> + Sync);

/// Which buffer holds the whole vector: the one an in-place op runs on.
#[derive(Clone, Copy)]
enum Whole {
    Send,
    Recv,
}

/// The op's buffers: from `send` to `recv`, or `in_place` on `whole`.
fn io<'a>(
    in_place: bool,
    whole: Whole,
    send: &'a mut HostBuffer,
    recv: &'a mut HostBuffer,
) -> Io<'a, HostBuffer> {
    match (in_place, whole) {
        (false, _) => Io::OutOfPlace { send, recv },
        (true, Whole::Send) => Io::InPlace(send),
        (true, Whole::Recv) => Io::InPlace(recv),
    }
}

/// GB/s of a plain 32 MiB memcpy per thread, `threads` threads at once:
/// the ceiling the shared-memory backend is measured against.
fn memcpy_gbs(threads: usize) -> f64 {
    let n = 32usize << 20;
    let secs: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let src = vec![1u8; n];
                    let mut dst = vec![0u8; n];
                    dst.copy_from_slice(&src);
                    let t = Instant::now();
                    for _ in 0..10 {
                        dst.copy_from_slice(std::hint::black_box(&src));
                    }
                    std::hint::black_box(&dst);
                    t.elapsed().as_secs_f64() / 10.0
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("copy thread"))
            .collect()
    });
    n as f64 / secs.iter().cloned().fold(0.0, f64::max) / 1e9
}

/// Microseconds per round trip of a flag bounced between two spinning
/// threads: the floor under any 2-rank latency on this machine right now.
fn ping_pong_us() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let flag = AtomicU64::new(0);
    let rounds = 100_000u64;
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..rounds {
                while flag.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                flag.store(2 * i + 2, Ordering::Release);
            }
        });
        for i in 0..rounds {
            flag.store(2 * i + 1, Ordering::Release);
            while flag.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
        }
    });
    t.elapsed().as_secs_f64() * 1e6 / rounds as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let world: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let algo: Algo = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(Algo::Auto);
    let p = world as f64;
    println!(
        "spinning flag ping-pong: {:.2} us per round trip",
        ping_pong_us()
    );
    println!(
        "memcpy 32 MiB: 1 thread {:.2} GB/s, {world} threads {:.2} GB/s each",
        memcpy_gbs(1),
        memcpy_gbs(world)
    );

    for &(count, in_place) in &[(2usize, true), (2, false)] {
        let t = time_per_call(
            world,
            algo,
            2000,
            20000,
            move |c, s, r| {
                c.all_reduce(
                    io(in_place, Whole::Recv, s, r),
                    count,
                    DType::F32,
                    ReduceOp::Sum,
                )
            },
            count * 4,
            count * 4,
        );
        let place = if in_place { "in-place" } else { "out-of-place" };
        println!("all_reduce   8 B {place:12}  {:8.2} us", t * 1e6);
    }

    let bytes = 64usize << 20;
    let count = bytes / 4;
    let per_rank = count / world;
    let total = per_rank * world * 4;
    for in_place in [true, false] {
        let place = if in_place { "in-place" } else { "out-of-place" };
        // nccl-tests' bus bandwidth: S/t x factor, S the whole vector's
        // bytes (all_gather's gathered, reduce_scatter's reduced ones).
        let ops: [(&str, Op, usize, usize, f64); 3] = [
            (
                "all_reduce",
                &move |c, s, r| {
                    let io = io(in_place, Whole::Recv, s, r);
                    c.all_reduce(io, count, DType::F32, ReduceOp::Sum)
                },
                bytes,
                bytes,
                2.0,
            ),
            (
                "all_gather",
                &move |c, s, r| c.all_gather(io(in_place, Whole::Recv, s, r), per_rank, DType::F32),
                per_rank * 4,
                total,
                1.0,
            ),
            (
                "reduce_scatter",
                &move |c, s, r| {
                    let io = io(in_place, Whole::Send, s, r);
                    c.reduce_scatter(io, per_rank, DType::F32, ReduceOp::Sum)
                },
                total,
                per_rank * 4,
                1.0,
            ),
        ];
        for (name, op, send_bytes, recv_bytes, factor) in ops {
            let t = time_per_call(world, algo, 3, 10, op, send_bytes, recv_bytes);
            let whole = send_bytes.max(recv_bytes);
            let busbw = whole as f64 / t * factor * (p - 1.0) / p / 1e9;
            println!(
                "{name:12} 64 MiB {place:12} {:8.2} ms  busbw {busbw:6.2} GB/s",
                t * 1e3
            );
        }
    }
}
