#!/usr/bin/env bash
# The wire decides, measured: the same all_reduce sweep (2 ranks, float sum,
# out of place) on every wire this machine can offer, each into its own
# results folder, then one HTML report with the wires side by side.
#
#   shm          parbench `local`: threads of one process, shared memory
#   tcp          parbench `tcp`: two processes over loopback
#   tcp-1gbit    parbench `tcp` between two network namespaces, links shaped
#   tcp-200mbit  to 1 Gbit/s and 200 Mbit/s by tc (scripts/netns.sh; root)
#   mpi-shm      Open MPI through parbench's `mpi` backend, btl vader,self
#   mpi-tcp      Open MPI, btl tcp,self (loopback)
#
# Usage: scripts/wires.sh [OUT_DIR]        (default: results/wires-<UTC time>)
# Environment: MAX (largest size, default 16M), FACTOR (size step, default 2),
# ITERS (default 5), WARMUP (default 1), RATES (default "1gbit 200mbit"),
# PARBENCH_BIN (folder with bench-collectives and report; default: build
# release with --features mpi into ${CARGO_TARGET_DIR:-target}/release).
# A wire this machine cannot offer (not root: no namespaces; no mpirun, or a
# build without `mpi`) is skipped with a line saying why; exit 1 when a run
# that was attempted failed, 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

OUT=${1:-results/wires-$(date -u +%Y%m%dT%H%M%SZ)}
MAX=${MAX:-16M}
FACTOR=${FACTOR:-2}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-1}
RATES=${RATES:-1gbit 200mbit}

if [ -z "${PARBENCH_BIN:-}" ]; then
    features=()
    command -v mpicc >/dev/null && features=(--features mpi)
    echo "# wires: building bench-collectives ${features[*]} and report (release)"
    cargo build --release -q -p bench-collectives "${features[@]}" || exit 2
    cargo build --release -q -p reports || exit 2
    BIN=${CARGO_TARGET_DIR:-target}/release
else
    BIN=$PARBENCH_BIN
fi
for b in bench-collectives report; do
    [ -x "$BIN/$b" ] || { echo "wires.sh: $BIN/$b not found (build first, or set PARBENCH_BIN)" >&2; exit 2; }
done
BIN=$(cd "$BIN" && pwd)
BENCH=$BIN/bench-collectives
if [ -e "$OUT" ]; then echo "wires.sh: $OUT exists (a results folder is never reused)" >&2; exit 2; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SWEEP=(all_reduce -b 8 -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" --outplace-only --timeout 60)

dirs=()
failed=0
run() { # NAME COMMAND...: one wire into $OUT/NAME, its table into $OUT/NAME.txt
    local name=$1; shift
    echo "# wires: $name: $*"
    local start=$SECONDS
    if "$@" --out "$OUT/$name" >"$OUT/$name.txt" 2>&1; then
        dirs+=("$OUT/$name")
        echo "#   done in $((SECONDS - start)) s"
    else
        echo "wires.sh: $name FAILED (see $OUT/$name.txt):" >&2
        tail -5 "$OUT/$name.txt" >&2
        failed=1
    fi
}
skip() { echo "# wires: SKIP $1: $2"; }

run shm "$BENCH" --backend local -np 2 "${SWEEP[@]}"
run tcp env -u PARBENCH_WIRE "$BENCH" --backend tcp -np 2 "${SWEEP[@]}"

if [ "$(id -u)" != 0 ]; then
    skip "shaped links ($RATES)" "not root (ip netns and tc need CAP_NET_ADMIN)"
else
    for rate in $RATES; do
        run "tcp-$rate" scripts/netns.sh run 2 --rate "$rate" -- "$BENCH" --backend tcp "${SWEEP[@]}"
    done
fi

if ! command -v mpirun >/dev/null; then
    skip "mpi-shm, mpi-tcp" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
elif ! ldd "$BENCH" 2>/dev/null | grep -q 'libmpi'; then
    skip "mpi-shm, mpi-tcp" "bench-collectives was built without --features mpi"
else
    MPIRUN=(mpirun -np 2 --bind-to none)
    [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
    [ "$(nproc)" -lt 2 ] && MPIRUN+=(--oversubscribe)
    run mpi-shm env PARBENCH_WIRE=mpi-shm "${MPIRUN[@]}" --mca btl vader,self "$BENCH" --backend mpi "${SWEEP[@]}"
    run mpi-tcp env PARBENCH_WIRE=mpi-tcp "${MPIRUN[@]}" --mca btl tcp,self "$BENCH" --backend mpi "${SWEEP[@]}"
fi

[ ${#dirs[@]} -gt 0 ] || { echo "wires.sh: no wire ran" >&2; exit 1; }
"$BIN/report" html --title "parbench: the wire decides (all_reduce, 2 ranks)" --output-file "$OUT/report.html" "${dirs[@]}" || failed=1

# Per wire, from the records themselves: the 8-byte p50 latency, the peak
# busbw (and its size), and the busbw at the largest size. On a shaped link
# the peak can sit above the link's rate at sizes under tbf's burst (4 ms of
# traffic): the bucket refills between iterations and lets such a message
# through at memory speed. The largest size's busbw is the link's.
echo
printf '%-14s %12s %14s %12s %14s\n' wire "8 B p50" "peak busbw" "at (B)" "busbw at max"
for d in "${dirs[@]}"; do
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $col["collective"] == "all_reduce" {
            wire = $col["wire"]; b = $col["bytes"] + 0; bw = $col["busbw_gbps"] + 0
            if (b == 8) lat = $col["p50_us"]
            if (bw > peak) { peak = bw; at = b }
            if (b >= maxb) { maxb = b; last = bw }
        }
        END { printf "%-14s %9.1f us %9.3f GB/s %12s %9.4f GB/s\n", wire, lat, peak, at, last }' "$d/collectives.csv"
done
echo
echo "# wires: report $OUT/report.html (load $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores)"
exit $failed
