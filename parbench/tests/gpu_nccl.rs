//! The NCCL communicator on real GPUs: every collective, in and out of place,
//! every element type and operator, on one rank and (with two or more GPUs)
//! on all local GPUs with one thread each; send/recv that cannot deadlock;
//! the copy ceilings. Run with `--features cuda` and `PARBENCH_GPU=1`.
#![cfg(feature = "cuda")]

mod common;
mod tcp_support;

use common::gpu_enabled;
use parbench::comm::nccl::NcclComm;
use parbench::comm::{CommBuffer, Communicator, DType, Element, Io, ReduceOp};
use parbench::gpu::{self, bandwidth, Gpu};
use parbench::with_dtype;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A one-rank communicator on GPU 0 when GPU tests run (else `None`, the
/// skip printed: see `gpu_enabled`).
fn on_gpu_0(test: &str) -> Option<NcclComm> {
    gpu_enabled(test).then(|| NcclComm::init_all(&[0], TIMEOUT).unwrap().pop().unwrap())
}

/// `send` to `recv`: the out-of-place form every collective here is also run in.
fn out_of_place<'a, B>(send: &'a B, recv: &'a mut B) -> Io<'a, B> {
    Io::OutOfPlace { send, recv }
}

/// Input of `rank`: small integers, so that sums, minima and maxima are exact
/// in every type whatever order NCCL reduces in.
fn input(dtype: DType, count: usize, rank: usize, salt: usize) -> Vec<u8> {
    values(dtype, count, |i| {
        (((i * 7 + rank * 3 + salt) % 5) + 1) as f64
    })
}

/// For products: 1 or 2, so every partial product is a power of two (exact in
/// bf16 too; u8 wraps the same way on both sides).
fn input_prod(dtype: DType, count: usize, rank: usize) -> Vec<u8> {
    values(dtype, count, |i| ((i + rank) % 2 + 1) as f64)
}

fn values(dtype: DType, count: usize, f: impl Fn(usize) -> f64) -> Vec<u8> {
    with_dtype!(dtype, T => {
        let v: Vec<T> = (0..count).map(|i| T::from_f64(f(i))).collect();
        bytemuck::cast_slice(&v).to_vec()
    })
}

fn op_input(dtype: DType, count: usize, rank: usize, op: ReduceOp, salt: usize) -> Vec<u8> {
    if dtype.is_fp8() {
        // Exact for up to 8 ranks in any order, where 1..5 on every rank is not.
        parbench::comm::reference::input(rank, count, dtype, op, salt)
    } else if op == ReduceOp::Prod {
        input_prod(dtype, count, rank)
    } else {
        input(dtype, count, rank, salt)
    }
}

/// Exact equality, except for avg: NCCL pre-multiplies by 1/world before
/// summing, so the last bits may differ from sum-then-divide.
fn same(dtype: DType, op: ReduceOp, got: &[u8], want: &[u8]) -> bool {
    if op != ReduceOp::Avg {
        return got == want;
    }
    let rtol = match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        DType::F32 => 1e-6,
        DType::F8E4M3 => 0.125,
        DType::F8E5M2 => 0.25,
        _ => 1e-12,
    };
    with_dtype!(dtype, T => {
        let g: &[T] = bytemuck::cast_slice(got);
        let w: &[T] = bytemuck::cast_slice(want);
        g.len() == w.len()
            && g.iter().zip(w).all(|(a, b)| (a.to_f64() - b.to_f64()).abs() <= rtol * b.to_f64().abs())
    })
}

/// Every rank's input reduced in rank order (mulsum's scalars included).
fn reduced(dtype: DType, count: usize, world: usize, op: ReduceOp, salt: usize) -> Vec<u8> {
    let inputs: Vec<Vec<u8>> = (0..world)
        .map(|r| op_input(dtype, count, r, op, salt))
        .collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    parbench::comm::reference::all_reduce(&refs, dtype, op)
}

fn upload(c: &NcclComm, bytes: &[u8], len: usize) -> parbench::gpu::DeviceBuffer {
    let mut b = c.alloc(len).unwrap();
    b.write_from_host(bytes).unwrap();
    b
}

fn download(c: &mut NcclComm, b: &parbench::gpu::DeviceBuffer, len: usize) -> Vec<u8> {
    c.sync().unwrap();
    let mut v = vec![0u8; len];
    b.read_to_host(&mut v).unwrap();
    v
}

/// Runs every collective on this rank and checks it; all ranks call it at once.
fn exercise(c: &mut NcclComm) {
    let (rank, world) = (c.rank(), c.world());
    let count = 1000;
    for dtype in DType::ALL {
        if let Some(why) = c.cannot_run(dtype, true) {
            eprintln!("SKIP {dtype}: {why}");
            continue;
        }
        let s = dtype.size();
        let b = count * s;
        for op in ReduceOp::ALL {
            if op == ReduceOp::Avg && !dtype.is_float() {
                continue; // ncclAvg's integer rounding is NCCL's own; the contract is for floats
            }
            // Which call a failure below belongs to, in the log.
            eprintln!("rank {rank}: {dtype} {op}");
            let want = reduced(dtype, count, world, op, 0);
            // all_reduce out of place and in place
            let send = upload(c, &op_input(dtype, count, rank, op, 0), b);
            let mut recv = c.alloc(b).unwrap();
            match c.all_reduce(out_of_place(&send, &mut recv), count, dtype, op) {
                // NCCL 2.28.3 on an H200 refused avg and mulsum of 8-bit
                // floats (both pre-multiply) as an invalid argument.
                Err(e)
                    if dtype.is_fp8()
                        && matches!(op, ReduceOp::Avg | ReduceOp::MulSum)
                        && e.to_string().contains("invalid argument") =>
                {
                    eprintln!("SKIP {dtype} {op}: this NCCL refuses it: {e}");
                    continue;
                }
                r => r.unwrap(),
            }
            assert!(
                same(dtype, op, &download(c, &recv, b), &want),
                "all_reduce {dtype} {op}"
            );
            let mut buf = upload(c, &op_input(dtype, count, rank, op, 0), b);
            c.all_reduce(Io::InPlace(&mut buf), count, dtype, op)
                .unwrap();
            assert!(
                same(dtype, op, &download(c, &buf, b), &want),
                "all_reduce in place {dtype} {op}"
            );
            // reduce_scatter: block r of the reduction of count x world
            let full = reduced(dtype, count * world, world, op, 1);
            let mine = &full[rank * b..(rank + 1) * b];
            let send = upload(c, &op_input(dtype, count * world, rank, op, 1), b * world);
            let mut recv = c.alloc(b).unwrap();
            c.reduce_scatter(out_of_place(&send, &mut recv), count, dtype, op)
                .unwrap();
            assert!(
                same(dtype, op, &download(c, &recv, b), mine),
                "reduce_scatter {dtype} {op}"
            );
            let mut buf = upload(c, &op_input(dtype, count * world, rank, op, 1), b * world);
            c.reduce_scatter(Io::InPlace(&mut buf), count, dtype, op)
                .unwrap();
            let got = download(c, &buf, b * world);
            assert!(
                same(dtype, op, &got[rank * b..(rank + 1) * b], mine),
                "reduce_scatter in place {dtype} {op}"
            );
            // reduce to the last rank
            let root = world - 1;
            let send = upload(c, &op_input(dtype, count, rank, op, 0), b);
            let mut recv = c.alloc(b).unwrap();
            c.reduce(out_of_place(&send, &mut recv), count, dtype, op, root)
                .unwrap();
            let got = download(c, &recv, b);
            if rank == root {
                assert!(same(dtype, op, &got, &want), "reduce {dtype} {op}");
            }
        }
        // all_gather
        let gathered: Vec<u8> = (0..world).flat_map(|r| input(dtype, count, r, 2)).collect();
        let send = upload(c, &input(dtype, count, rank, 2), b);
        let mut recv = c.alloc(b * world).unwrap();
        c.all_gather(out_of_place(&send, &mut recv), count, dtype)
            .unwrap();
        assert_eq!(
            download(c, &recv, b * world),
            gathered,
            "all_gather {dtype}"
        );
        let mut buf = c.alloc(b * world).unwrap();
        let mut host = vec![0u8; b * world];
        host[rank * b..(rank + 1) * b].copy_from_slice(&input(dtype, count, rank, 2));
        buf.write_from_host(&host).unwrap();
        c.all_gather(Io::InPlace(&mut buf), count, dtype).unwrap();
        assert_eq!(
            download(c, &buf, b * world),
            gathered,
            "all_gather in place {dtype}"
        );
        // broadcast from rank 0
        let mut buf = upload(c, &input(dtype, count, rank, 3), b);
        c.broadcast(Io::InPlace(&mut buf), count, dtype, 0).unwrap();
        assert_eq!(
            download(c, &buf, b),
            input(dtype, count, 0, 3),
            "broadcast {dtype}"
        );
        // all_to_all: block j of rank r is input(r) block j; rank r receives block r of each
        let mine = input(dtype, count * world, rank, 4);
        let want: Vec<u8> = (0..world)
            .flat_map(|src| input(dtype, count * world, src, 4)[rank * b..(rank + 1) * b].to_vec())
            .collect();
        let send = upload(c, &mine, b * world);
        let mut recv = c.alloc(b * world).unwrap();
        c.all_to_all(out_of_place(&send, &mut recv), count, dtype)
            .unwrap();
        assert_eq!(download(c, &recv, b * world), want, "all_to_all {dtype}");
        let mut buf = upload(c, &mine, b * world);
        c.all_to_all(Io::InPlace(&mut buf), count, dtype).unwrap();
        assert_eq!(
            download(c, &buf, b * world),
            want,
            "all_to_all in place {dtype}"
        );
        // send_recv around the ring, and send-then-recv both ways (staged sends)
        let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
        let send = upload(c, &input(dtype, count, rank, 5), b);
        let mut recv = c.alloc(b).unwrap();
        c.send_recv(&send, to, &mut recv, from, count, dtype)
            .unwrap();
        assert_eq!(
            download(c, &recv, b),
            input(dtype, count, from, 5),
            "send_recv {dtype}"
        );
        c.send(&send, count, dtype, to).unwrap();
        let mut recv = c.alloc(b).unwrap();
        c.recv(&mut recv, count, dtype, from).unwrap();
        assert_eq!(
            download(c, &recv, b),
            input(dtype, count, from, 5),
            "send then recv {dtype}"
        );
    }
    c.barrier().unwrap();
}

#[test]
fn gpu_nccl_one_rank_collectives() {
    let Some(mut c) = on_gpu_0("gpu_nccl_one_rank_collectives") else {
        return;
    };
    assert_eq!((c.rank(), c.world(), c.backend()), (0, 1, "nccl"));
    exercise(&mut c);
}

#[test]
fn gpu_nccl_all_local_gpus_one_thread_each() {
    if !gpu_enabled("gpu_nccl_all_local_gpus_one_thread_each") {
        return;
    }
    let n = gpu::device_count().unwrap();
    if n < 2 {
        eprintln!("skipped gpu_nccl_all_local_gpus_one_thread_each: {n} GPU");
        return;
    }
    let ordinals: Vec<usize> = (0..n).collect();
    let comms = NcclComm::init_all(&ordinals, TIMEOUT).unwrap();
    std::thread::scope(|s| {
        for mut c in comms {
            s.spawn(move || exercise(&mut c));
        }
    });
}

#[test]
fn gpu_copy_ceilings_are_measured() {
    if !gpu_enabled("gpu_copy_ceilings_are_measured") {
        return;
    }
    let g0 = Gpu::open(0).unwrap();
    let d2d = bandwidth::device_copy_gbps(&g0, 256 << 20, TIMEOUT).unwrap();
    println!(
        "device-to-device copy on GPU 0 ({}): {d2d:.1} GB/s",
        g0.name()
    );
    assert!(d2d.is_finite() && d2d > 0.0);
    let n = gpu::device_count().unwrap();
    let gpus: Vec<Gpu> = (0..n).map(|o| Gpu::open(o).unwrap()).collect();
    for p in bandwidth::peer_copy_gbps(&gpus, 256 << 20, TIMEOUT).unwrap() {
        println!(
            "peer copy GPU {} -> GPU {} (direct: {}): {:.1} GB/s",
            p.src, p.dst, p.direct, p.gbps
        );
        assert!(p.gbps.is_finite() && p.gbps > 0.0);
    }
}

#[test]
fn gpu_nccl_graph_replays_and_events_time() {
    let Some(mut c) = on_gpu_0("gpu_nccl_graph_replays_and_events_time") else {
        return;
    };
    let count = 4096;
    let src = input(DType::F32, count, 0, 7);
    let send = upload(&c, &src, count * 4);
    let mut recv = c.alloc(count * 4).unwrap();
    // The call run once before the capture and then captured.
    let sum_into = |c: &mut NcclComm, recv: &mut <NcclComm as Communicator>::Buffer| {
        c.all_reduce(out_of_place(&send, recv), count, DType::F32, ReduceOp::Sum)
    };
    // Warm-up outside the capture (NCCL sets up its buffers on first use).
    sum_into(&mut c, &mut recv).unwrap();
    c.sync().unwrap();
    let mut recv = c.alloc(count * 4).unwrap();
    let mut graph = c
        .capture(4, &mut |c: &mut NcclComm| sum_into(c, &mut recv))
        .unwrap();
    assert_eq!(graph.launches(), 4);
    assert_eq!(
        download(&mut c, &recv, count * 4),
        vec![0u8; count * 4],
        "capture must not run"
    );
    let mut clock = c.stream_clock(3).unwrap().expect("a device clock");
    clock.mark().unwrap();
    graph.replay().unwrap();
    clock.mark().unwrap();
    graph.replay().unwrap();
    clock.mark().unwrap();
    let t = clock.intervals().unwrap();
    assert_eq!(t.len(), 2);
    assert!(t.iter().all(|s| s.is_finite() && *s > 0.0), "{t:?}");
    assert_eq!(
        download(&mut c, &recv, count * 4),
        src,
        "replayed all_reduce"
    );
}

#[test]
fn gpu_nccl_join_through_the_store() {
    if !gpu_enabled("gpu_nccl_join_through_the_store") {
        return;
    }
    let port = tcp_support::free_port();
    let vars = [
        ("RANK", "0".to_string()),
        ("WORLD_SIZE", "1".to_string()),
        ("LOCAL_RANK", "0".to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
    ];
    let info = parbench::launch::RankInfo::from_vars(|k| {
        vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .unwrap()
    .unwrap();
    let mut c = NcclComm::join(&info, TIMEOUT).unwrap();
    assert_eq!((c.rank(), c.world()), (0, 1));
    exercise(&mut c);
}

/// A graph of a staged send, its receive and an in-place all_to_all, on a
/// fresh communicator (nothing warmed up), replays right twice with new
/// data each time: every buffer the calls need was allocated before the
/// capture, none inside it.
#[test]
fn gpu_nccl_graph_allocates_before_capture_and_replays_twice() {
    let Some(mut c) = on_gpu_0("gpu_nccl_graph_allocates_before_capture_and_replays_twice") else {
        return;
    };
    let count = 1024;
    let b = count * 4;
    let mut send = c.alloc(b).unwrap();
    let mut recv = c.alloc(b).unwrap();
    let mut a2a = c.alloc(b).unwrap();
    // The graph holds the buffers' addresses: it is declared after them, so dropped first.
    let mut graph = c
        .capture(2, &mut |c: &mut NcclComm| {
            c.send(&send, count, DType::F32, 0)?;
            c.recv(&mut recv, count, DType::F32, 0)?;
            c.all_to_all(Io::InPlace(&mut a2a), count, DType::F32)
        })
        .unwrap();
    for round in 0..2 {
        let (s_host, a_host) = (
            input(DType::F32, count, round, 1),
            input(DType::F32, count, round, 2),
        );
        send.write_from_host(&s_host).unwrap();
        a2a.write_from_host(&a_host).unwrap();
        graph.replay().unwrap();
        assert_eq!(
            download(&mut c, &recv, b),
            s_host,
            "round {round}: send/recv"
        );
        assert_eq!(
            download(&mut c, &a2a, b),
            a_host,
            "round {round}: in-place all_to_all"
        );
    }
}
