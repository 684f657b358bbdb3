#!/usr/bin/env bash
# The collective model held against N default runs back to back on each
# CPU wire (shared memory, then loopback TCP), judged over the runs: per
# wire the median share of rows from 64 KiB that the model priced within
# 25%, the rows that missed in every run, and the fits from 1 MiB
# (report model-check). A run its noise guard marked noisy is not judged.
#
# Usage: scripts/model-check.sh [--runs N] [--out DIR] [--no-build]
# Exit: 0 the criterion met on every wire; 1 not met; 2 a run failed;
# 3 no run could be judged (all noisy).
set -uo pipefail
caller=$PWD
here=$(cd "$(dirname "$0")/.." && pwd)
runs=5
out=""
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=${2:?--runs needs a count}; shift ;;
        --out) out=${2:?--out needs a folder}; shift ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "model-check.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ $runs =~ ^[1-9][0-9]?$ ]] || { echo "model-check.sh: --runs must be 1..99, got '$runs'" >&2; exit 2; }
if [ -z "$out" ]; then
    out=$(mktemp -d /tmp/parbench-model-check.XXXXXX)
else
    case "$out" in /*) ;; *) out="$caller/$out" ;; esac
fi
mkdir -p "$out" || exit 2
cd "$here" || exit 2
bin=${PARBENCH_BIN:-${CARGO_TARGET_DIR:-target}/release}
if [ "$build" = 1 ] && [ -z "${PARBENCH_BIN:-}" ]; then
    cargo build --release --bins || { echo "model-check.sh: build failed" >&2; exit 2; }
fi
for b in bench-collectives report; do
    [ -x "$bin/$b" ] || { echo "model-check.sh: $bin/$b not found (build first, or set PARBENCH_BIN)" >&2; exit 2; }
done

echo "model-check: $runs runs a wire into $out; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
failed=0
for ((k = 1; k <= runs; k++)); do
    "$bin/bench-collectives" --out "$out/local-$k" > "$out/local-$k.log" 2>&1 || { echo "model-check: local run $k failed (see $out/local-$k.log)" >&2; failed=1; }
    "$bin/bench-collectives" --backend tcp -np 2 --out "$out/tcp-$k" > "$out/tcp-$k.log" 2>&1 || { echo "model-check: tcp run $k failed (see $out/tcp-$k.log)" >&2; failed=1; }
    echo "model-check: round $k of $runs done; load $(cut -d' ' -f1-3 /proc/loadavg)"
done
status=0
for wire in local tcp; do
    dirs=()
    for d in "$out/$wire"-*/; do [ -d "$d" ] && dirs+=("${d%/}"); done
    [ ${#dirs[@]} -gt 0 ] || continue
    "$bin/report" model-check "${dirs[@]}"
    rc=$?
    if [ "$rc" = 1 ] || { [ "$rc" != 0 ] && [ "$status" = 0 ]; }; then
        status=$rc
    fi
done
echo "model-check: load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$failed" = 1 ] && exit 2
exit "$status"
