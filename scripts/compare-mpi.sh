#!/usr/bin/env bash
# Runs the same collectives through Open MPI (and PyTorch gloo, when PyTorch
# is installed) and through parbench, back to back on this machine, 2 ranks,
# float sum, and prints the ratios the bench-collectives issue sets as goals:
#   shared memory: Open MPI (btl vader,self) vs parbench `local`
#     all_reduce 8 B latency, busbw at 1 MiB and 64 MiB (and every size from
#     64 KiB up), all_gather busbw at 64 MiB;
#   TCP loopback: Open MPI (btl tcp,self) and gloo vs parbench `tcp`
#     all_reduce 8 B latency and busbw at 64 MiB.
# Open MPI runs through parbench's own `mpi` backend (MPI_Allreduce and
# MPI_Allgather under the same harness, timer and checker), so the two sides
# differ only in the communicator. gloo runs through scripts/gloo_allreduce.py,
# which times each call the same way (slowest rank per iteration, median).
#
# Timings on a shared 2-core machine drift by tens of percent from minute to
# minute, so every pair runs ROUNDS times, interleaved (round 1: every run
# once, then round 2, ...). Each figure is the median over rounds of the
# per-run median per op (p50 of the per-iteration times, each the slowest
# rank's); busbw is computed from it. Each ratio is that of the two medians,
# and the lowest and highest per-round ratios are printed beside it.
#
# Usage: scripts/compare-mpi.sh [OUT_DIR]     (default: results/compare-mpi)
# Run it on a quiet machine: every side polls, so other load on the cores
# distorts the figures (the script prints the load average with them).
# Needs: mpirun and the MPI headers (Debian: apt-get install -y openmpi-bin
# libopenmpi-dev), python3, cargo; for gloo, a python with torch (TORCH_PYTHON,
# default python3; `pip install torch`).
# Environment: ROUNDS (default 3), ITERS (50), WARMUP (10).
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${1:-results/compare-mpi}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-50}
WARMUP=${WARMUP:-10}
TORCH_PYTHON=${TORCH_PYTHON:-python3}
mkdir -p "$OUT"

command -v mpirun >/dev/null || { echo "compare-mpi: mpirun not found (apt-get install -y openmpi-bin libopenmpi-dev)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare-mpi: python3 not found" >&2; exit 2; }
case $ROUNDS in ''|*[!0-9]*|0) echo "compare-mpi: ROUNDS=$ROUNDS is not a positive count" >&2; exit 2;; esac

GLOO=1
if ! "$TORCH_PYTHON" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
    GLOO=0
    echo "# gloo: skipped, $TORCH_PYTHON has no torch with gloo (pip install torch, or set TORCH_PYTHON)"
fi

echo "# building bench-collectives (release, --features mpi)"
cargo build --release -q -p bench-collectives --features mpi
BIN=${CARGO_TARGET_DIR:-target}/release/bench-collectives

MPIRUN=(mpirun -np 2 --bind-to none)
if [ "$(id -u)" = 0 ]; then MPIRUN+=(--allow-run-as-root); fi
# --oversubscribe makes Open MPI yield the core while it polls, which slows
# it down: only ask for it when this machine has fewer than 2 cores.
if [ "$(nproc)" -lt 2 ]; then MPIRUN+=(--oversubscribe); fi
COMMON=(-n "$ITERS" -w "$WARMUP" -c 1 --outplace-only)
# gloo's all_reduce works in place only: parbench's side of that comparison too.
INPLACE=(-n "$ITERS" -w "$WARMUP" -c 1 --inplace-only)
TCP_SIZES=(-b 8 -e 64M -f 8388608)

run() { # DIR NAME ARGS...: one run into DIR/NAME, its table kept in DIR/NAME.txt
    local dir=$1 name=$2; shift 2
    echo "# $(basename "$dir") $name: $*"
    rm -rf "${dir:?}/$name"
    "$@" --out "$dir/$name" >"$dir/$name.txt"
}

for round in $(seq "$ROUNDS"); do
    D=$OUT/round$round
    mkdir -p "$D"
    run "$D" mpi-shm "${MPIRUN[@]}" --mca btl vader,self "$BIN" --backend mpi all_reduce -b 8 -e 64M -f 2 "${COMMON[@]}"
    run "$D" local "$BIN" --backend local -np 2 all_reduce -b 8 -e 64M -f 2 "${COMMON[@]}"
    run "$D" mpi-shm-ag "${MPIRUN[@]}" --mca btl vader,self "$BIN" --backend mpi all_gather -b 64M -e 64M "${COMMON[@]}"
    run "$D" local-ag "$BIN" --backend local -np 2 all_gather -b 64M -e 64M "${COMMON[@]}"
    run "$D" mpi-tcp "${MPIRUN[@]}" --mca btl tcp,self "$BIN" --backend mpi all_reduce "${TCP_SIZES[@]}" "${COMMON[@]}"
    run "$D" tcp "$BIN" --backend tcp -np 2 all_reduce "${TCP_SIZES[@]}" "${COMMON[@]}"
    if [ "$GLOO" = 1 ]; then
        run "$D" tcp-inplace "$BIN" --backend tcp -np 2 all_reduce "${TCP_SIZES[@]}" "${INPLACE[@]}"
        echo "# round$round gloo: scripts/gloo_allreduce.py"
        ITERS=$ITERS WARMUP=$WARMUP "$TORCH_PYTHON" scripts/gloo_allreduce.py 8,8388608,67108864 "$D/gloo.csv"
    fi
done

echo "# load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
python3 - "$OUT" "$ROUNDS" "$GLOO" <<'PY'
import csv, os, statistics, sys
out, rounds, gloo = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
M = 1 << 20


def rows(rnd, name):
    """bytes -> (p50 us, busbw GB/s at the p50) for one run."""
    path = os.path.join(out, f"round{rnd}", name if name == "gloo.csv" else os.path.join(name, "collectives.csv"))
    with open(path) as f:
        table = {}
        for r in csv.DictReader(f):
            p50 = float(r["p50_us"])
            if name == "gloo.csv":
                bw = float(r["busbw_gbps"])
            else:
                # busbw at the median iteration: the row's busbw scaled from its mean time.
                bw = float(r["busbw_gbps"]) * float(r["time_us"]) / p50
            table[int(r["bytes"])] = (p50, bw)
        return table


runs = {}
def run(name):
    if name not in runs:
        runs[name] = [rows(k, name) for k in range(1, rounds + 1)]
    return runs[name]


def compare(case, base, ours, size, latency, goal):
    """One line: both medians over rounds, their ratio (>1 = parbench
    better), the per-round spread of the ratio, and the goal."""
    b = [r[size][0 if latency else 1] for r in run(base)]
    p = [r[size][0 if latency else 1] for r in run(ours)]
    ratio = (lambda x, y: x / y) if latency else (lambda x, y: y / x)
    med = ratio(statistics.median(b), statistics.median(p))
    per_round = [ratio(x, y) for x, y in zip(b, p)]
    unit = "us" if latency else "GB/s"
    met = sum(r >= goal for r in per_round)
    print(f"{case:<48} {statistics.median(b):>9.2f} {unit:<4} {statistics.median(p):>9.2f} {unit:<4} "
          f"{med:5.2f}x [{min(per_round):.2f}-{max(per_round):.2f}]  goal >= {goal:.1f}x: "
          f"{'met' if med >= goal else 'NOT met'} (rounds {met}/{rounds})")


print()
print(f"2 ranks, float sum, out of place unless marked; medians over {rounds} rounds; ratio >1 means parbench is better")
print(f"{'case':<48} {'baseline':>14} {'parbench':>14} {'ratio':>6} [per-round]")
compare("all_reduce 8 B latency, vader vs local", "mpi-shm", "local", 8, True, 1.0)
compare("all_reduce 1 MiB busbw, vader vs local", "mpi-shm", "local", M, False, 1.0)
compare("all_reduce 64 MiB busbw, vader vs local", "mpi-shm", "local", 64 * M, False, 2.0)
compare("all_gather 64 MiB busbw, vader vs local", "mpi-shm-ag", "local-ag", 64 * M, False, 1.2)
compare("all_reduce 8 B latency, MPI tcp vs tcp", "mpi-tcp", "tcp", 8, True, 1.0)
compare("all_reduce 64 MiB busbw, MPI tcp vs tcp", "mpi-tcp", "tcp", 64 * M, False, 1.2)
if gloo:
    compare("all_reduce 8 B latency, gloo vs tcp (in place)", "gloo.csv", "tcp-inplace", 8, True, 1.0)
    compare("all_reduce 64 MiB busbw, gloo vs tcp (in place)", "gloo.csv", "tcp-inplace", 64 * M, False, 1.5)

print()
print("local all_reduce busbw from 64 KiB up (medians over rounds; goal: no size slower than vader):")
slower = []
for s in sorted(run("local")[0]):
    if s < 64 * 1024 or s not in run("mpi-shm")[0]:
        continue
    m = statistics.median(r[s][1] for r in run("mpi-shm"))
    p = statistics.median(r[s][1] for r in run("local"))
    print(f"  {s:>10} B  vader {m:6.2f} GB/s  local {p:6.2f} GB/s  {p / m:5.2f}x")
    if p < m:
        slower.append(s)
print("sizes slower than vader:", ", ".join(f"{s} B" for s in slower) or "none")
PY
