#!/usr/bin/env python3
"""PyTorch gloo all_reduce over TCP loopback, timed the way bench-collectives
times a collective, for scripts/compare-mpi.sh.

Each rank is a process (torch.multiprocessing, spawn) joined through a TCP
rendezvous on 127.0.0.1. Per size: WARMUP untimed calls, then ITERS timed
ones, each started after a barrier, on float32 with SUM, in place (gloo has
no out-of-place all_reduce). The input is restored before each barrier, out
of the timed region. An iteration's time is the slowest rank's; the row
reports the median (p50) over iterations and the busbw at that median
(nccl-tests' factor 2(n-1)/n). The last result is checked exactly (every
element must equal the sum of the ranks' inputs); a wrong result exits 1.

Usage: gloo_allreduce.py SIZES_BYTES OUT_CSV   (SIZES: comma separated)
Environment: RANKS (2), ITERS (50), WARMUP (10), TIMEOUT_S (600).
Writes OUT_CSV with columns bytes,p50_us,busbw_gbps (atomically: temp + rename).
"""
import csv
import os
import statistics
import sys
import time


def worker(rank, world, sizes, iters, warmup, port, timeout_s, queue):
    import datetime

    import torch
    import torch.distributed as dist

    # One intra-op thread per rank: the ranks share the cores already.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        # Small integers: every summation order gives the same float.
        base = torch.full((count,), float(rank + 1), dtype=torch.float32)
        x = base.clone()
        for _ in range(warmup):
            x.copy_(base)
            dist.all_reduce(x)
        times = []
        for _ in range(iters):
            x.copy_(base)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        expected = float(world * (world + 1) // 2)
        wrong = int((x != expected).sum().item())
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        w = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(w)
        rows.append((count * 4, t.tolist(), int(w.item())))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def free_port():
    # The kernel picks a port free on loopback; the rendezvous binds it next.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gloo_allreduce.py SIZES_BYTES OUT_CSV")
    import torch.multiprocessing as mp

    sizes = [int(s) for s in sys.argv[1].split(",") if s]
    out = sys.argv[2]
    world = int(os.environ.get("RANKS", 2))
    iters = int(os.environ.get("ITERS", 50))
    warmup = int(os.environ.get("WARMUP", 10))
    timeout_s = int(os.environ.get("TIMEOUT_S", 600))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=worker,
            args=(r, world, sizes, iters, warmup, port, timeout_s, queue),
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        rows = queue.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        sys.exit(f"gloo_allreduce: a rank exited with {bad[0]}")
    factor = 2 * (world - 1) / world
    tmp = out + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bytes", "p50_us", "busbw_gbps", "wrong"])
        for nbytes, times, wrong in rows:
            p50 = statistics.median(times)
            w.writerow([nbytes, f"{p50 * 1e6:.2f}", f"{factor * nbytes / p50 / 1e9:.4f}", wrong])
    os.replace(tmp, out)
    if any(wrong for _, _, wrong in rows):
        sys.exit("gloo_allreduce: wrong elements in the result")


if __name__ == "__main__":
    main()
