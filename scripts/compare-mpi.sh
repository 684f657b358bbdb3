#!/usr/bin/env bash
# Runs the same collectives through Open MPI and through parbench, back to
# back on this machine, 2 ranks, float sum, out of place, and prints the
# ratios the bench-collectives issue sets as goals:
#   shared memory: Open MPI (btl vader,self) vs parbench `local`
#     all_reduce 8 B latency, busbw at 1 MiB and 64 MiB (and every size from
#     64 KiB up), all_gather busbw at 64 MiB;
#   TCP loopback: Open MPI (btl tcp,self) vs parbench `tcp`
#     all_reduce 8 B latency and busbw at 64 MiB.
# Open MPI runs through parbench's own `mpi` backend (MPI_Allreduce and
# MPI_Allgather under the same harness, timer and checker), so the two sides
# differ only in the communicator. Figures are medians per op: p50 of the
# per-iteration times (each the slowest rank's); busbw is computed from it.
#
# Usage: scripts/compare-mpi.sh [OUT_DIR]     (default: results/compare-mpi)
# Run it on a quiet machine: both sides poll, so other load on the cores
# distorts the figures (the script prints the load average with them).
# Needs: mpirun and the MPI headers (Debian: apt-get install -y openmpi-bin
# libopenmpi-dev), python3, cargo. Environment: ITERS (default 50), WARMUP (10).
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${1:-results/compare-mpi}
ITERS=${ITERS:-50}
WARMUP=${WARMUP:-10}
mkdir -p "$OUT"

command -v mpirun >/dev/null || { echo "compare-mpi: mpirun not found (apt-get install -y openmpi-bin libopenmpi-dev)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare-mpi: python3 not found" >&2; exit 2; }

echo "# building bench-collectives (release, --features mpi)"
cargo build --release -q -p bench-collectives --features mpi
BIN=${CARGO_TARGET_DIR:-target}/release/bench-collectives

MPIRUN=(mpirun -np 2 --bind-to none)
if [ "$(id -u)" = 0 ]; then MPIRUN+=(--allow-run-as-root); fi
# --oversubscribe makes Open MPI yield the core while it polls, which slows
# it down: only ask for it when this machine has fewer than 2 cores.
if [ "$(nproc)" -lt 2 ]; then MPIRUN+=(--oversubscribe); fi
COMMON=(-n "$ITERS" -w "$WARMUP" -c 1 --outplace-only)

run() { # NAME ARGS...: one run into $OUT/NAME, its table kept in $OUT/NAME.txt
    local name=$1; shift
    echo "# $name: $*"
    rm -rf "${OUT:?}/$name"
    "$@" --out "$OUT/$name" >"$OUT/$name.txt"
}

# Back to back, each pair in turn.
run mpi-shm "${MPIRUN[@]}" --mca btl vader,self "$BIN" --backend mpi all_reduce -b 8 -e 64M -f 2 "${COMMON[@]}"
run local "$BIN" --backend local -np 2 all_reduce -b 8 -e 64M -f 2 "${COMMON[@]}"
run mpi-shm-ag "${MPIRUN[@]}" --mca btl vader,self "$BIN" --backend mpi all_gather -b 64M -e 64M "${COMMON[@]}"
run local-ag "$BIN" --backend local -np 2 all_gather -b 64M -e 64M "${COMMON[@]}"
run mpi-tcp "${MPIRUN[@]}" --mca btl tcp,self "$BIN" --backend mpi all_reduce -b 8 -e 64M -f 8388608 "${COMMON[@]}"
run tcp "$BIN" --backend tcp -np 2 all_reduce -b 8 -e 64M -f 8388608 "${COMMON[@]}"

echo "# load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
python3 - "$OUT" <<'PY'
import csv, sys, os
out = sys.argv[1]

def rows(name):
    with open(os.path.join(out, name, "collectives.csv")) as f:
        return {int(r["bytes"]): r for r in csv.DictReader(f)}

def p50(r):
    return float(r["p50_us"])

def busbw_p50(r):
    # busbw at the median iteration: the row's busbw scaled from its mean time.
    return float(r["busbw_gbps"]) * float(r["time_us"]) / p50(r)

def lat(case, mpi, pb, size):
    m, p = p50(mpi[size]), p50(pb[size])
    print(f"{case:<44} {m:>12.2f} us {p:>12.2f} us   MPI/parbench = {m / p:5.2f}x")

def bw(case, mpi, pb, size):
    m, p = busbw_p50(mpi[size]), busbw_p50(pb[size])
    print(f"{case:<44} {m:>9.2f} GB/s {p:>9.2f} GB/s   parbench/MPI = {p / m:5.2f}x")

shm, loc = rows("mpi-shm"), rows("local")
ag_m, ag_p = rows("mpi-shm-ag"), rows("local-ag")
tcp_m, tcp_p = rows("mpi-tcp"), rows("tcp")
M = 1 << 20
print()
print(f"{'2 ranks, float sum, out of place, median':<44} {'Open MPI':>15} {'parbench':>15}")
lat("all_reduce 8 B   vader vs local", shm, loc, 8)
bw("all_reduce 1 MiB  busbw vader vs local", shm, loc, M)
bw("all_reduce 64 MiB busbw vader vs local", shm, loc, 64 * M)
bw("all_gather 64 MiB busbw vader vs local", ag_m, ag_p, 64 * M)
lat("all_reduce 8 B   tcp,self vs tcp", tcp_m, tcp_p, 8)
bw("all_reduce 64 MiB busbw tcp,self vs tcp", tcp_m, tcp_p, 64 * M)
slower = [s for s in sorted(loc) if s >= 64 * 1024 and s in shm and busbw_p50(loc[s]) < busbw_p50(shm[s])]
print()
print("local all_reduce sizes >= 64 KiB slower than vader:", ", ".join(f"{s} B" for s in slower) or "none")
PY
