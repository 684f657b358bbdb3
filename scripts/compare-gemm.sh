#!/usr/bin/env bash
# Times the shard GEMMs of the presets' tensor-parallel blocks through
# parbench's CpuCompute (the device bench-layers and bench-pipeline compute
# on; bench-layers' example gemm_rate) and through numpy's matmul (OpenBLAS
# in the PyPI wheel) on the same f32 shapes and thread count, and prints
# each shape's GFLOP/s on both sides and their ratio.
#
# Shapes: for each PRESET:TP:TOKENS spec, the four forward projections of
# one rank's shard (qkv, proj, mlp1, mlp2; m = TOKENS), row-major C = A B,
# 2 m n k flops per call; `gemm_rate --list` prints them, and numpy times
# exactly that list.
#
# Timing on a shared machine drifts from second to second, so the two sides
# take turns shape by shape: each round runs every shape once through each
# side, back to back, in an order that alternates with the round and the
# shape, and there are ROUNDS rounds. Each run (one process) gives its shape
# two untimed calls, then SAMPLES samples of enough back-to-back calls to
# last about 50 ms, and reports the median sample. Each figure below is the
# median over rounds of those; the ratio is parbench's median over numpy's,
# and [lo-hi] the lowest and highest ratio of one shape's back-to-back pair.
# OpenBLAS's threads spin while they wait for each other: with other jobs on
# the cores its multi-threaded figures fall apart (the spread shows it), so
# compare on a quiet machine, or with THREADS=1.
#
# Usage: scripts/compare-gemm.sh
# Environment: SPECS (default "tiny:2:128 gpt3-1.3b:4:256 llama2-70b:8:256
#   gpt3-175b:8:256"), THREADS (each side's threads; default: every core, as
#   bench-layers gives TP = 1), ROUNDS (5), SAMPLES (5), NUMPY_PYTHON (the
#   python with numpy, default python3; threadpoolctl, when installed, names
#   the BLAS and its kernel: pip install numpy threadpoolctl).
# OpenBLAS picks its kernel from the CPU unless OPENBLAS_CORETYPE forces one;
# the script prints both, so a forced (slower) kernel cannot pass unnoticed.
set -euo pipefail

cd "$(dirname "$0")/.."
SPECS=${SPECS:-"tiny:2:128 gpt3-1.3b:4:256 llama2-70b:8:256 gpt3-175b:8:256"}
THREADS=${THREADS:-$(nproc)}
ROUNDS=${ROUNDS:-5}
SAMPLES=${SAMPLES:-5}
NUMPY_PYTHON=${NUMPY_PYTHON:-python3}

for v in THREADS ROUNDS SAMPLES; do
    case ${!v} in ''|*[!0-9]*|0) echo "compare-gemm: $v=${!v} is not a positive count" >&2; exit 2;; esac
done

echo "# building bench-layers' gemm_rate example (release)"
cargo build --release -q -p bench-layers --example gemm_rate
BIN=${CARGO_TARGET_DIR:-target}/release/examples/gemm_rate

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# shellcheck disable=SC2086 # SPECS is a list of words
"$BIN" --list $SPECS >"$TMP/shapes" || exit 2

NUMPY=1
if ! "$NUMPY_PYTHON" -c 'import numpy' 2>/dev/null; then
    NUMPY=0
    echo "# numpy: skipped, $NUMPY_PYTHON has no numpy (pip install numpy threadpoolctl, or set NUMPY_PYTHON)"
fi

# The numpy side: the same protocol as gemm_rate, one line per shape of the
# file $1 ($2 = 1: describe the BLAS first).
numpy_rate() {
    OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS \
        "$NUMPY_PYTHON" - "$1" "$THREADS" "$SAMPLES" "$2" <<'PY'
import math, sys, time
import numpy as np
shapes, threads, samples, describe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
try:
    from threadpoolctl import threadpool_info, threadpool_limits
    threadpool_limits(threads)
    info = [p for p in threadpool_info() if p.get("user_api") == "blas"]
except ImportError:
    info = None
if describe:
    if info is None:
        print(f"# numpy {np.__version__}: BLAS unknown (no threadpoolctl), OPENBLAS_NUM_THREADS={threads}")
    for p in info or []:
        print(f"# numpy {np.__version__}: {p.get('internal_api')} {p.get('version')}, "
              f"{p.get('architecture', '?')} kernels, {p.get('num_threads')} threads")
rng = np.random.default_rng(0)
for line in open(shapes):
    name, m, n, k = line.split()
    m, n, k = int(m), int(n), int(k)
    a = rng.random((m, k), dtype=np.float32) - 0.5
    b = rng.random((k, n), dtype=np.float32) - 0.5
    c = np.empty((m, n), dtype=np.float32)
    np.matmul(a, b, out=c)
    t = time.perf_counter()
    np.matmul(a, b, out=c)
    one = max(time.perf_counter() - t, 1e-9)
    calls = max(1, math.ceil(0.05 / one))
    rates = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(calls):
            np.matmul(a, b, out=c)
        rates.append(2.0 * m * n * k * calls / (time.perf_counter() - t) / 1e9)
    rates.sort()
    mid = len(rates) // 2
    med = rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2
    print(f"{name} {m} {n} {k} {med:.1f} {rates[0]:.1f} {rates[-1]:.1f} {len(rates)} {calls}")
PY
}

# shellcheck disable=SC2086
parbench_rate() { "$BIN" --threads "$THREADS" --samples "$SAMPLES" --only "$1" $SPECS; }

if [ -n "${OPENBLAS_CORETYPE:-}${OPENBLAS_L2_SIZE:-}" ]; then
    echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-} are set: OpenBLAS runs that kernel, not the one it would pick"
fi
parbench_rate "$(head -1 "$TMP/shapes" | cut -d' ' -f1)" | sed -n 1p >"$TMP/pb.describe"
[ "$NUMPY" = 0 ] || numpy_rate /dev/null 1 >"$TMP/np.describe"
for round in $(seq "$ROUNDS"); do
    echo "# round $round of $ROUNDS"
    i=0
    while read -r name m n k; do
        i=$((i + 1))
        echo "$name $m $n $k" >"$TMP/one"
        if [ $(((round + i) % 2)) = 0 ]; then
            parbench_rate "$name" | grep -v '^#' >>"$TMP/pb.$round"
            [ "$NUMPY" = 0 ] || numpy_rate "$TMP/one" 0 >>"$TMP/np.$round"
        else
            [ "$NUMPY" = 0 ] || numpy_rate "$TMP/one" 0 >>"$TMP/np.$round"
            parbench_rate "$name" | grep -v '^#' >>"$TMP/pb.$round"
        fi
    done <"$TMP/shapes"
done
cat "$TMP/pb.describe"
[ "$NUMPY" = 0 ] || cat "$TMP/np.describe"
echo "# load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; $THREADS threads each side"

# side round name gflops, for every run's shape lines.
for f in "$TMP"/pb.* "$TMP"/np.*; do
    [ -e "$f" ] || continue
    b=$(basename "$f")
    [ "${b#*.}" = describe ] && continue
    awk -v side="${b%%.*}" -v round="${b#*.}" '!/^#/ { print side, round, $1, $5 }' "$f"
done >"$TMP/all"

awk -v rounds="$ROUNDS" -v numpy="$NUMPY" '
function median(list,    v, n, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { t = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
FNR == NR { order[++shapes] = $1; dims[$1] = $2 " " $3 " " $4; next }
{ val[$1, $2, $3] = $4; runs[$1, $3] = runs[$1, $3] " " $4 }
END {
    printf "\nf32, C = A B row-major; GFLOP/s, medians over %d rounds\n", rounds
    if (numpy) printf "%-22s %6s %6s %6s %9s %9s %6s %s\n", "shape", "m", "n", "k", "parbench", "numpy", "ratio", "[per-round]"
    else printf "%-22s %6s %6s %6s %9s\n", "shape", "m", "n", "k", "parbench"
    all = ""; worst = ""
    for (s = 1; s <= shapes; s++) {
        name = order[s]; split(dims[name], d, " ")
        p = median(runs["pb", name])
        if (!numpy) { printf "%-22s %6d %6d %6d %9.1f\n", name, d[1], d[2], d[3], p; continue }
        q = median(runs["np", name]); r = p / q
        lo = ""; hi = ""
        for (k = 1; k <= rounds; k++) {
            x = val["pb", k, name] / val["np", k, name]
            if (lo == "" || x < lo) lo = x
            if (hi == "" || x > hi) hi = x
        }
        printf "%-22s %6d %6d %6d %9.1f %9.1f %6.2f [%.2f-%.2f]\n", name, d[1], d[2], d[3], p, q, r, lo, hi
        all = all " " r
        if (worst == "" || r < worst) { worst = r; worst_name = name }
    }
    if (numpy) printf "all %d shapes: median ratio %.2f, lowest %.2f (%s)\n", shapes, median(all), worst, worst_name
}' "$TMP/shapes" "$TMP/all"
