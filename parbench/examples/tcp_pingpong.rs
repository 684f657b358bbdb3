//! Quick figures for the tcp transport between two local processes:
//! ping-pong latency, one-stream throughput, and a two-rank ring
//! all-reduce done by hand over the transport (reduce-scatter exchange
//! then all-gather exchange), reported as nccl-tests' busbw.
//!
//! `cargo run --release -p parbench --example tcp_pingpong` (spawns 2 ranks).
//! Not a benchmark suite: `bench-collectives` is; this is a quick check of
//! the transport, and of `all_reduce` over it through `HostComm`.

use parbench::comm::tcp;
use parbench::comm::{
    Algo, Collective, Communicator, DType, HostComm, Io, RecvInto, ReduceOp, Transport,
};
use parbench::launch::{self, Role};
use std::time::{Duration, Instant};

fn main() {
    let info = match launch::join_or_spawn(Some(2)) {
        Ok(Role::Rank(info)) => info,
        Ok(Role::Launcher(status)) => std::process::exit(launch::exit_code(status)),
        Ok(Role::Single) => unreachable!("--nprocs 2 always spawns"),
        Err(e) => {
            eprintln!("tcp_pingpong: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&info) {
        eprintln!("rank {}: {e}", info.rank);
        std::process::exit(1);
    }
}

/// CPU time (user + system) this process has used: on a loaded host the
/// wall-clock figures include waiting for a core, this does not.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn run(info: &launch::RankInfo) -> Result<(), parbench::comm::CommError> {
    let timeout = Duration::from_secs(60);
    let mut t = tcp::connect(info, timeout)?;
    let me = t.rank();
    let peer = 1 - me;
    let dl = || Instant::now() + timeout;
    let say = |s: String| {
        if me == 0 {
            println!("{s}");
        }
    };

    // Ping-pong: half the round trip of an 8-byte message.
    let iters = 20_000;
    let mut b = [0u8; 8];
    for round in 0..2 {
        let t0 = Instant::now();
        for _ in 0..iters {
            if me == 0 {
                t.send(peer, &b.clone(), dl())?;
                t.recv(peer, RecvInto::Copy(&mut b), dl())?;
            } else {
                t.recv(peer, RecvInto::Copy(&mut b), dl())?;
                t.send(peer, &b.clone(), dl())?;
            }
        }
        if round == 1 {
            say(format!(
                "ping-pong 8 B: {:.2} us one way",
                t0.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0
            ));
        }
    }

    // 8-byte reducing exchange: a two-rank all_reduce of one f64 / two f32.
    let mut acc = [1.0f32, 2.0];
    for round in 0..2 {
        let t0 = Instant::now();
        for _ in 0..iters {
            let data = acc;
            let into = RecvInto::Reduce {
                acc: bytemuck::cast_slice_mut(&mut acc),
                dtype: DType::F32,
                op: ReduceOp::Max,
            };
            t.exchange(peer, bytemuck::cast_slice(&data), peer, into, dl())?;
        }
        if round == 1 {
            say(format!(
                "exchange+reduce 8 B (2-rank all_reduce): {:.2} us",
                t0.elapsed().as_secs_f64() * 1e6 / iters as f64
            ));
        }
    }

    // One stream, 64 MiB messages from rank 0 to rank 1.
    let size = 64 << 20;
    let data = vec![1u8; size];
    let mut got = vec![0u8; size];
    let reps = 10;
    for round in 0..2 {
        let t0 = Instant::now();
        for _ in 0..reps {
            if me == 0 {
                t.send(peer, &data, dl())?;
            } else {
                t.recv(peer, RecvInto::Copy(&mut got), dl())?;
            }
        }
        // A one-byte reply so rank 0 times the delivery, not its buffering.
        if me == 0 {
            t.recv(peer, RecvInto::Copy(&mut b[..1]), dl())?;
        } else {
            t.send(peer, &b[..1], dl())?;
        }
        if round == 1 {
            let s = t0.elapsed().as_secs_f64();
            say(format!(
                "one stream 64 MiB: {:.2} GB/s",
                (size * reps) as f64 / s / 1e9
            ));
        }
    }

    // Two-rank ring all_reduce of 64 MiB f32 sum, by hand: exchange and
    // reduce one half, then exchange the reduced halves.
    let count = size / 4;
    let mut buf: Vec<f32> = vec![me as f32 + 1.0; count];
    let half = count / 2;
    for round in 0..2 {
        let t0 = Instant::now();
        for _ in 0..reps {
            let (lo, hi) = buf.split_at_mut(half);
            // Rank 0 keeps the low half, rank 1 the high half.
            let (mine, theirs) = if me == 0 { (lo, hi) } else { (hi, lo) };
            let into = RecvInto::Reduce {
                acc: bytemuck::cast_slice_mut(mine),
                dtype: DType::F32,
                op: ReduceOp::Sum,
            };
            t.exchange(peer, bytemuck::cast_slice(theirs), peer, into, dl())?;
            let into = RecvInto::Copy(bytemuck::cast_slice_mut(theirs));
            t.exchange(peer, bytemuck::cast_slice(mine), peer, into, dl())?;
        }
        if round == 1 {
            let s = t0.elapsed().as_secs_f64() / reps as f64;
            // busbw = algbw * 2(n-1)/n = algbw for n = 2.
            say(format!(
                "hand-made ring all_reduce 64 MiB f32: {:.2} GB/s busbw ({:.1} ms)",
                size as f64 / s / 1e9,
                s * 1e3
            ));
        }
    }
    drop((data, got, buf));

    // The real thing: all_reduce through HostComm (Algo::Auto), in place.
    let mut comm = HostComm::new(t, Algo::Auto, timeout);
    for (bytes, iters) in [(8usize, 20_000usize), (64 << 20, 10)] {
        let count = bytes / 4;
        let mut b = comm.alloc(bytes)?;
        for round in 0..2 {
            let (t0, c0) = (Instant::now(), cpu_time());
            for _ in 0..iters {
                comm.all_reduce(Io::InPlace(&mut b), count, DType::F32, ReduceOp::Sum)?;
            }
            if round == 1 {
                let s = t0.elapsed().as_secs_f64() / iters as f64;
                let cpu = (cpu_time() - c0).as_secs_f64() / iters as f64;
                let algo = comm.algo_for(Collective::AllReduce, bytes);
                say(format!(
                    "HostComm all_reduce {bytes} B f32 sum ({algo}): {:.2} us, busbw {:.3} GB/s; rank 0 CPU {:.2} us per call (busbw if CPU-bound: {:.3} GB/s)",
                    s * 1e6,
                    bytes as f64 / s / 1e9,
                    cpu * 1e6,
                    bytes as f64 / cpu / 1e9
                ));
            }
        }
    }
    Ok(())
}
