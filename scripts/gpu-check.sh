#!/usr/bin/env bash
# parbench's check on a GPU machine: no Rust toolchain, no network, under
# five minutes. Takes the bundle scripts/gpu-bundle.sh built elsewhere
# (release binaries and GPU test executables built with --features cuda),
# finds the CUDA libraries, runs the GPU tests and a short sweep of every
# binary, and writes every log and result into OUTDIR.
#
#   scripts/gpu-check.sh OUTDIR [BUNDLE]     (BUNDLE defaults to gpu-bundle/)
#
# What it measures (all printed into OUTDIR/summary.txt):
#   - device-to-device copy bandwidth of GPU 0 and peer copy bandwidth between
#     every pair of GPUs (gpu_nccl test, gpu_copy_ceilings_are_measured);
#   - cuBLASLt bf16 GEMM throughput at 8192x8192x8192 on random data (gpu_compute);
#   - a 1-rank NCCL sweep (bench-collectives --backend nccl -np 1 -b 8 -e 1G -f 4),
#     and one over all GPUs when there are several, and a --graph run if the
#     binary has the flag;
#   - correctness of every CUDA kernel, GEMM shape and NCCL collective (the tests).
# Libraries: NCCL, cuBLASLt and NVRTC are looked for on the loader's path, in
# the CUDA toolkit, and in the Python wheels (PyTorch's nvidia-* packages).
# cudarc opens libnccl.so or libnccl.so.<CUDA major>, while NCCL's wheels
# ship only libnccl.so.2: a libnccl.so symlink is made in OUTDIR/lib.
set -uo pipefail

out=${1:?usage: scripts/gpu-check.sh OUTDIR [BUNDLE]}
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${2:-${PARBENCH_BUNDLE:-$root/gpu-bundle}}
budget=${PARBENCH_CHECK_SECONDS:-290}
start=$(date +%s)
mkdir -p "$out/lib" "$out/results"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
: >"$summary"

say() { echo "$*" | tee -a "$summary"; }

if [ ! -d "$bundle/tests" ] || [ ! -d "$bundle/bin" ]; then
    say "no bundle at $bundle: build it where Rust is with scripts/gpu-bundle.sh and copy it here"
    exit 2
fi
say "# parbench gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
sed 's/^/# bundle /' "$bundle/MANIFEST" >>"$summary" 2>/dev/null

# --- the machine -------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1
    nvidia-smi topo -m >"$out/nvidia-topo.txt" 2>&1
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    say "# GPUs: $ngpu ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1))"
else
    ngpu=0
    say "# nvidia-smi not found"
fi

# --- the libraries -----------------------------------------------------------
libdirs=()
add_dir() { case " ${libdirs[*]-} " in *" $1 "*) ;; *) [ -d "$1" ] && libdirs+=("$1") ;; esac; }
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    add_dir "$d"
done
for py in python3 python; do
    command -v "$py" >/dev/null || continue
    while read -r sp; do
        for d in "$sp"/nvidia/*/lib "$sp"/torch/lib; do add_dir "$d"; done
    done < <("$py" -c 'import site, sys
dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
print("\n".join(d for d in dirs if d))' 2>/dev/null)
    break
done
# find_lib NAME: the first file NAME or NAME.<version> in the loader cache or libdirs.
find_lib() {
    local name=$1 f d
    for d in "${libdirs[@]-}"; do
        for f in "$d/$name" "$d/$name".[0-9]*; do
            [ -e "$f" ] && { echo "$f"; return 0; }
        done
    done
    f=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 ~ "^"n {print $NF; exit}')
    [ -n "$f" ] && { echo "$f"; return 0; }
    return 1
}
for lib in libnccl.so libcublasLt.so libnvrtc.so; do
    if f=$(find_lib "$lib"); then
        add_dir "$(dirname "$f")"
        # cudarc does not open versioned names such as libnccl.so.2: link the plain name.
        if [ "$(basename "$f")" != "$lib" ]; then
            ln -sf "$f" "$out/lib/$lib"
        fi
        say "# $lib: $f"
    else
        say "# $lib: NOT FOUND (tests needing it will fail with a line naming it)"
    fi
done
LD_LIBRARY_PATH="$out/lib:$(IFS=:; echo "${libdirs[*]-}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH PARBENCH_GPU=1 RUST_BACKTRACE=1
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >"$out/env.txt"

# --- the steps ---------------------------------------------------------------
failed=0
# step NAME SECONDS CMD...: runs CMD with a timeout that also respects the
# whole script's budget; its output goes to OUTDIR/NAME.log.
step() {
    local name=$1 secs=$2 left rc
    shift 2
    left=$((budget - ($(date +%s) - start)))
    if [ "$left" -le 5 ]; then
        say "SKIP $name: out of time"
        return 0
    fi
    [ "$secs" -gt "$left" ] && secs=$left
    local t0=$(date +%s)
    timeout -k 5 "$secs" "$@" >"$out/$name.log" 2>&1
    rc=$?
    local dt=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        say "ok   $name (${dt}s)"
    else
        failed=$((failed + 1))
        [ $rc -eq 124 ] && say "FAIL $name: timed out after ${secs}s" || say "FAIL $name: exit $rc (${dt}s), see $name.log"
        grep -E -A1 "panicked|^error|Error:" "$out/$name.log" | grep -v "^--$" | head -6 | sed 's/^/     /' | tee -a "$summary"
    fi
    return 0
}

t="$bundle/tests"
step probe 20 "$t/gpu_probe" --nocapture
step kernels_compile 30 "$t/gpu_kernels_compile" --nocapture
step compute 100 "$t/gpu_compute" --nocapture --test-threads=1
step nccl 100 "$t/gpu_nccl" --nocapture --test-threads=1

bc="$bundle/bin/bench-collectives"
all="all_reduce all_gather reduce_scatter broadcast reduce all_to_all sendrecv"
step sweep_nccl_np1 150 "$bc" --backend nccl -np 1 -b 8 -e 1G -f 4 --out "$out/results" $all
if [ "$ngpu" -gt 1 ]; then
    step "sweep_nccl_np$ngpu" 60 "$bc" --backend nccl -np "$ngpu" -b 8 -e 256M -f 4 --out "$out/results" all_reduce all_gather reduce_scatter
fi
if "$bc" --help 2>/dev/null | grep -q -- "--graph"; then
    step sweep_nccl_graph 40 "$bc" --backend nccl -np 1 -b 8 -e 16M -f 4 --graph 8 --out "$out/results" all_reduce
fi
# bench-layers and bench-pipeline on the GPU, where their build offers it:
# exit code 2 with one line is their way of saying it does not (not a failure).
for b in bench-layers bench-pipeline; do
    left=$((budget - ($(date +%s) - start)))
    [ "$left" -le 10 ] && { say "SKIP $b: out of time"; continue; }
    secs=$((left < 45 ? left : 45))
    timeout -k 5 "$secs" "$bundle/bin/$b" --backend nccl --out "$out/results" >"$out/$b.log" 2>&1
    rc=$?
    case $rc in
        0) say "ok   $b --backend nccl" ;;
        2) say "# $b: no GPU run: $(tail -1 "$out/$b.log")" ;;
        *) failed=$((failed + 1)); say "FAIL $b --backend nccl: exit $rc, see $b.log" ;;
    esac
done

# --- the figures -------------------------------------------------------------
{
    echo
    echo "## Figures"
    grep -h "device-to-device copy\|peer copy GPU" "$out/nccl.log" 2>/dev/null
    grep -h "TFLOP/s" "$out/compute.log" 2>/dev/null
    for f in "$out"/sweep_*.log; do
        [ -e "$f" ] || continue
        echo "### $(basename "$f" .log)"
        grep -vE "^\s*$" "$f" | head -80
    done
} >>"$summary"
say "# $failed step(s) failed; $(($(date +%s) - start))s in all; logs and results in $out"
[ "$failed" -eq 0 ]
