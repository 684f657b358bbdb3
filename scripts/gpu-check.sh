#!/usr/bin/env bash
# parbench's check on a GPU machine that has no Rust toolchain and no
# network: one run of about seven minutes (PARBENCH_CHECK_SECONDS, 420 s by
# default; 480 s with several GPUs), every step under `timeout`, every log
# and record kept in OUTDIR, and a summary table to paste into docs/gpu.md.
#
#   scripts/gpu-check.sh OUTDIR [BUNDLE]            run it (BUNDLE: gpu-bundle/)
#   scripts/gpu-check.sh --dry-run OUTDIR [BUNDLE]  discovery and the plan only,
#                                                   no GPU needed
#   scripts/gpu-check.sh --summarize OUTDIR         the summary again, from the logs
#   scripts/gpu-check.sh --steps a,b OUTDIR [BUNDLE]  only those steps (a rerun of
#                                                   the failed ones, in a new OUTDIR)
#
# BUNDLE is what scripts/gpu-bundle.sh built where Rust is (release binaries,
# the gpu_* test executables, optionally NVIDIA/nccl-tests' source).
#
# The steps, in order (cap in seconds; the caps sum within the budget, which
# is checked before anything runs, so no step can be skipped for time):
#   probe            libraries found under cudarc's names, symbols present (gpu_probe)
#   kernels_compile  NVRTC compiles the kernels as CUBIN and PTX (gpu_kernels_compile)
#   compute_memcheck the element-wise kernels under compute-sanitizer memcheck
#   compute          every kernel and GEMM against f64 references, graphs, the CUBIN load
#   nccl             every collective in and out of place, graphs, the store's join
#   gemm             cuBLASLt bf16 8192^3 TFLOP/s beside torch.matmul, interleaved twice
#                    (this step and fp8 log GPU 0's SM clock and power every 250 ms)
#   copy_ceiling     device-to-device (and peer) copy GB/s
#   sweep            bench-collectives --backend nccl -np 1 all_reduce, 8 B .. 256 MiB
#   sweep_graph      the same with --graph 8 (CUDA graphs, nccl-tests' -G)
#   sweep_npN        with N > 1 GPUs: -np N
#   layers           bench-layers --backend nccl --tp 1 (tiny, then gpt3-1.3b train)
#   fp8              on sm_89 or newer: FP8 GEMMs against f64, then at K = 8192
#                    and 2048 in split and fast accumulation beside bf16, then
#                    bench-layers --dtype fp8 beside --dtype bfloat16
#   pipeline         bench-pipeline --backend nccl (one stage per visible GPU)
#   nccl_tests_build, nccl_tests   when BUNDLE/nccl-tests holds its source and
#                    nvcc and nccl.h are here: all_reduce_perf -g 1 beside `sweep`
#
# A step fails when it exits non-zero (exit 2 included: with a GPU present,
# a refused run is a failure), times out, or finds no time left. The script
# exits 0 only when every planned step passed; 2 when there is no GPU or no
# bundle; 1 otherwise.
set -uo pipefail

# The header comment above, whatever its length.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

mode=run
only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) mode=dry; shift ;;
        --summarize) mode=summarize; shift ;;
        --steps) only=${2-}; shift 2 || { usage >&2; exit 2; } ;;
        -h | --help) usage; exit 0 ;;
        *) break ;;
    esac
done
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    usage >&2
    exit 2
fi
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${2:-${PARBENCH_BUNDLE:-$root/gpu-bundle}}
start=$(date +%s)
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
steps_tsv="$out/steps.tsv"

say() { echo "$*" | tee -a "$summary"; }

# --- the summary ---------------------------------------------------------------
# Written as a file so that it is kept with the logs and can be rerun.
write_summarizer() {
    cat >"$out/summarize.py" <<'PY'
"""Summary of a gpu-check.sh run: markdown tables for docs/gpu.md."""
import csv, os, re, sys

out = sys.argv[1]
res = os.path.join(out, "results")

def read(name):
    try:
        with open(os.path.join(out, name), errors="replace") as f:
            return f.read()
    except OSError:
        return ""

def rows(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []

def num(x, fmt="{:.2f}"):
    try:
        return fmt.format(float(x))
    except (TypeError, ValueError):
        return "-"

def human(b):
    b = int(b)
    for unit, s in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return f"{b >> s} {unit}iB"
    return f"{b} B"

meta = read("meta.txt").strip()
print("## GPU check" + (f": {meta}" if meta else ""))
print()
print("| step | result | seconds | cap |")
print("|---|---|---:|---:|")
for line in read("steps.tsv").splitlines():
    p = line.split("\t")
    if len(p) == 4:
        print(f"| {p[0]} | {p[1]} | {p[2]} | {p[3]} |")
print()

figs = []
img = re.findall(r"^kernels on (.*)$", read("compute.log"), re.M)
if img:
    figs.append(("NVRTC kernels loaded", img[-1], "-"))
gemm = read("gemm.log")
ours = re.findall(r"GEMM bf16 \S+ \(cuBLASLt.*?: ([0-9.]+) TFLOP/s", gemm)
torch = re.findall(r"GEMM bf16 \S+ \(torch\.matmul.*?: ([0-9.]+) TFLOP/s", gemm)
tver = re.findall(r"\(torch\.matmul ([^,]+),", gemm)
if ours or torch:
    figs.append((
        "GEMM bf16 8192^3, TFLOP/s (runs, interleaved)",
        "cuBLASLt, f32 accumulation: " + (", ".join(ours) or "-"),
        f"torch.matmul {tver[0] if tver else ''}: " + (", ".join(torch) or "-"),
    ))
copy = re.findall(r"device-to-device copy on GPU 0 \((.*?)\): ([0-9.]+) GB/s", read("copy_ceiling.log"))
if copy:
    figs.append(("device-to-device copy, 256 MiB, GB/s", copy[-1][1], "-"))
for m in re.findall(r"peer copy GPU (\d+) -> GPU (\d+) \(direct: (\w+)\): ([0-9.]+) GB/s", read("copy_ceiling.log")):
    figs.append((f"peer copy {m[0]} -> {m[1]} (direct {m[2]}), GB/s", m[3], "-"))
if figs:
    print("| figure | parbench | reference, same run |")
    print("|---|---|---|")
    for f in figs:
        print(f"| {f[0]} | {f[1]} | {f[2]} |")
    print()

def sweep(name):
    by = {}
    for r in rows(os.path.join(res, name, "collectives.csv")):
        if r.get("collective") != "all_reduce":
            continue
        key = "in" if r.get("in_place") == "true" else "out"
        by.setdefault(int(r["bytes"]), {})[key] = r
    return by

ours = sweep("sweep")
graph = sweep("sweep_graph")
nt = {}
for line in read("nccl_tests.log").splitlines():
    f = line.split()
    if len(f) >= 13 and f[0].isdigit():
        nt[int(f[0])] = (f[5], f[7], f[9], f[11])
if ours or graph or nt:
    ceil = next((r["out"].get("ceiling_gbps") for r in ours.values() if "out" in r), None)
    print(f"all_reduce, 1 rank (`bench-collectives --backend nccl -np 1`), float sum; "
          f"wire ceiling {num(ceil, '{:.1f}')} GB/s. Times in us (out-of-place), busbw in GB/s; "
          "nccl-tests: all_reduce_perf -g 1 in the same run; diff = parbench time / nccl-tests time - 1.")
    print()
    print("| size | parbench time | p50 | p99 | busbw | #wrong | graph time | nccl-tests time | nccl-tests busbw | diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in sorted(set(ours) | set(graph) | set(nt)):
        o = ours.get(b, {}).get("out", {})
        g = graph.get(b, {}).get("out", {})
        n = nt.get(b)
        diff = "-"
        if o and n:
            try:
                d = float(o["time_us"]) / float(n[0]) - 1
                flag = " **>2%**" if b >= 1 << 20 and abs(d) > 0.02 else ""
                diff = f"{d * 100:+.1f}%{flag}"
            except (ValueError, ZeroDivisionError):
                pass
        print(f"| {human(b)} | {num(o.get('time_us'))} | {num(o.get('p50_us'))} | {num(o.get('p99_us'))} "
              f"| {num(o.get('busbw_gbps'))} | {o.get('wrong', '-')} | {num(g.get('time_us'))} "
              f"| {n[0] if n else '-'} | {n[1] if n else '-'} | {diff} |")
    print()

def table(caption, header, body):
    """A markdown table: header is (name, right-aligned) pairs, body rows of cells."""
    if not body:
        return
    print(caption)
    print()
    print("| " + " | ".join(h for h, _ in header) + " |")
    print("|" + "|".join("---:" if right else "---" for _, right in header) + "|")
    for cells in body:
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print()

table("bench-layers --backend nccl (times per block call, us):",
      [("preset", 0), ("mode", 0), ("dtype", 0), ("tp", 1), ("compute", 1), ("comm", 1), ("total", 1),
       ("per token", 1), ("GF/s", 1), ("check max err", 1)],
      [(f"{r.get('preset')} (h={r.get('hidden')}, seq={r.get('seq')})", r.get("mode"), r.get("dtype"),
        r.get("tp"), num(r.get("compute_us")), num(r.get("comm_us")), num(r.get("total_us")),
        num(r.get("per_token_us"), "{:.3f}"), num(r.get("compute_gflops"), "{:.0f}"),
        num(r.get("check_max_err"), "{:.1e}"))
       for r in rows(os.path.join(res, "layers", "layers.csv"))])
table("bench-pipeline --backend nccl (step time in us, bubble as a share of the step):",
      [("schedule", 0), ("stages", 1), ("microbatches", 1), ("step", 1), ("bubble measured", 1),
       ("simulated", 1), ("closed form", 1)],
      [(r.get("schedule"), r.get("stages"), r.get("microbatches"), num(r.get("step_us"), "{:.1f}"),
        num(r.get("bubble_measured"), "{:.3f}"), num(r.get("bubble_simulated"), "{:.3f}"),
        num(r.get("bubble_formula"), "{:.3f}"))
       for r in rows(os.path.join(res, "pipeline", "pipeline.csv"))])
PY
}

summarize() {
    write_summarizer
    if command -v python3 >/dev/null; then
        python3 "$out/summarize.py" "$out" >"$out/summary.md" 2>"$out/summarize.log" ||
            echo "(the summary failed: see summarize.log)" >>"$out/summary.md"
    else
        { echo "| step | result | seconds | cap |"; tr '\t' '|' <"$steps_tsv"; } >"$out/summary.md"
    fi
    cat "$out/summary.md"
}

if [ "$mode" = summarize ]; then
    summarize
    exit 0
fi

: >"$summary"
: >"$steps_tsv"
# Without a GPU nothing below can run: one line, before the bundle and the
# libraries are looked at. nvidia-smi hangs on some broken drivers, hence
# the timeout.
if [ "$mode" = run ] && ! timeout 15 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    say "FAIL: no GPU on this machine (nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists none' || echo 'not found')): nothing measured (--dry-run shows the plan)"
    exit 2
fi
if [ ! -d "$bundle/tests" ] || [ ! -d "$bundle/bin" ]; then
    say "FAIL: no bundle at $bundle: build it where Rust is with scripts/gpu-bundle.sh and carry it here"
    exit 2
fi
t="$bundle/tests"
for f in gpu_probe gpu_kernels_compile gpu_compute gpu_nccl; do
    [ -x "$t/$f" ] || { say "FAIL: the bundle lacks tests/$f (rebuild it with scripts/gpu-bundle.sh)"; exit 2; }
done
for f in bench-collectives bench-layers bench-pipeline; do
    [ -x "$bundle/bin/$f" ] || { say "FAIL: the bundle lacks bin/$f (rebuild it with scripts/gpu-bundle.sh)"; exit 2; }
done
say "# parbench gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($mode)"
sed 's/^/# bundle /' "$bundle/MANIFEST" >>"$summary" 2>/dev/null

# --- the machine -------------------------------------------------------------
ngpu=0
gpu_name="no GPU"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1
    nvidia-smi topo -m >"$out/nvidia-topo.txt" 2>&1
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    gpu_name=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
fi
# The first GPU's compute capability without the dot (90 on Hopper), for nvcc.
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
[ -n "$cc" ] || cc=90
say "# GPUs: $ngpu${ngpu:+ ($gpu_name)}"
if [ "$ngpu" -eq 0 ]; then
    if [ "$mode" = run ]; then
        say "FAIL: no GPU on this machine (nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists none' || echo 'not found')): nothing measured"
        exit 2
    fi
    say "# no GPU here: the plan below is for one GPU and nothing runs"
fi
plan_gpus=$((ngpu > 0 ? ngpu : 1))
budget=${PARBENCH_CHECK_SECONDS:-$((plan_gpus > 1 ? 480 : 420))}
# Seconds kept for discovery, the plan check and the summary.
reserve=10

# --- the libraries -----------------------------------------------------------
libdirs=()
add_dir() { case " ${libdirs[*]-} " in *" $1 "*) ;; *) [ -d "$1" ] && libdirs+=("$1") ;; esac; }
IFS=: read -r -a ld_dirs <<<"${LD_LIBRARY_PATH-}"
for d in "${ld_dirs[@]-}"; do [ -n "$d" ] && add_dir "$d"; done
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    add_dir "$d"
done
sitedirs=()
for py in python3 python; do
    command -v "$py" >/dev/null || continue
    while read -r sp; do
        [ -d "$sp" ] && sitedirs+=("$sp")
        for d in "$sp"/nvidia/*/lib "$sp"/torch/lib; do add_dir "$d"; done
    done < <("$py" -c 'import site, sys
dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
print("\n".join(d for d in dirs if d))' 2>/dev/null)
    break
done
# find_lib NAME: the first file NAME or NAME.<version> in libdirs or the loader cache.
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
mkdir -p "$out/lib"
for lib in libcuda.so libnccl.so libcublasLt.so libnvrtc.so libcudart.so; do
    if f=$(find_lib "$lib"); then
        add_dir "$(dirname "$f")"
        # cudarc does not open versioned names such as libnccl.so.2: link the plain name.
        if [ "$(basename "$f")" != "$lib" ]; then
            ln -sf "$f" "$out/lib/$lib"
        fi
        say "# $lib: $f"
    else
        say "# $lib: NOT FOUND (the steps needing it fail with a line naming it)"
    fi
done
LD_LIBRARY_PATH="$out/lib:$(
    IFS=:
    echo "${libdirs[*]-}"
)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH PARBENCH_GPU=1 RUST_BACKTRACE=1
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >"$out/env.txt"

# find_tool NAME: NAME on PATH, in the CUDA toolkit, or in a Python wheel.
find_tool() {
    local name=$1 f
    f=$(command -v "$name" 2>/dev/null) && { echo "$f"; return 0; }
    for f in /usr/local/cuda/bin/"$name" /usr/local/cuda/compute-sanitizer/"$name"; do
        [ -x "$f" ] && { echo "$f"; return 0; }
    done
    for sp in "${sitedirs[@]-}"; do
        for f in "$sp"/nvidia/*/bin/"$name" "$sp"/nvidia/*/"$name"/"$name"; do
            [ -x "$f" ] && { echo "$f"; return 0; }
        done
    done
    return 1
}
sanitizer=$(find_tool compute-sanitizer) || sanitizer=""
nvcc=$(find_tool nvcc) || nvcc=""
nccl_h=""
for f in "${sitedirs[@]/%//nvidia/nccl/include/nccl.h}" /usr/include/nccl.h /usr/local/cuda/include/nccl.h; do
    [ -n "$f" ] && [ -e "$f" ] && { nccl_h=$f; break; }
done
say "# compute-sanitizer: ${sanitizer:-not found (compute_memcheck is not planned)}"
say "# nvcc: ${nvcc:-not found}; nccl.h: ${nccl_h:-not found}"
have_nccl_tests=0
if [ -f "$bundle/nccl-tests/src/Makefile" ] && [ -n "$nvcc" ] && [ -n "$nccl_h" ]; then
    have_nccl_tests=1
elif [ -f "$bundle/nccl-tests/src/Makefile" ]; then
    say "# nccl-tests: source carried, but nvcc or nccl.h is missing: not planned"
else
    say "# nccl-tests: no source in the bundle (scripts/gpu-bundle.sh copies NCCL_TESTS_SRC): not planned"
fi
{
    printf '%s; bundle %s; %s\n' "$(date -u +%Y-%m-%d)" \
        "$(sed -n 's/^revision: //p' "$bundle/MANIFEST" 2>/dev/null)" "$gpu_name"
} >"$out/meta.txt"

# --- the steps ---------------------------------------------------------------
res="$out/results"
mkdir -p "$res"
bc="$bundle/bin/bench-collectives"
tp_args=(--tp 1)
[ "$plan_gpus" -gt 1 ] && tp_args=()

s_probe() { "$t/gpu_probe" --nocapture --test-threads=1; }
s_kernels_compile() { "$t/gpu_kernels_compile" --nocapture --test-threads=1; }
s_compute_memcheck() {
    "$sanitizer" --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$t/gpu_compute" --exact gpu_compute_kernels_match_reference --nocapture --test-threads=1
}
s_compute() {
    "$t/gpu_compute" --skip gpu_gemm_bf16_throughput_8192 --skip gpu_gemm_fp8_throughput_beside_bf16_8192 \
        --nocapture --test-threads=1
}
s_nccl() { "$t/gpu_nccl" --skip gpu_copy_ceilings_are_measured --nocapture --test-threads=1; }
s_gemm() {
    write_torch_gemm
    local round
    for round in 1 2; do
        echo "## round $round: parbench"
        "$t/gpu_compute" --exact gpu_gemm_bf16_throughput_8192 --nocapture --test-threads=1 || return
        echo "## round $round: torch"
        python3 "$out/torch_gemm.py" || return
    done
}
s_copy_ceiling() { "$t/gpu_nccl" --exact gpu_copy_ceilings_are_measured --nocapture --test-threads=1; }
# To 256 MiB: on the first H200 run the sweep to 1 GiB did not end in 35 s
# (13 s of ladders, then the host builds and checks each row's data: the
# 256 MiB row's two placements took seconds, so 512 MiB and 1 GiB would
# not fit the budget); nccl-tests goes on to 1 GiB beside it.
s_sweep() { "$bc" --backend nccl -np 1 -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 --out "$res/sweep" all_reduce; }
s_sweep_graph() { "$bc" --backend nccl -np 1 -b 8 -e 256M -f 2 -n 24 -w 5 -c 1 --graph 8 --out "$res/sweep_graph" all_reduce; }
s_sweep_npN() { "$bc" --backend nccl -np "$ngpu" -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 --out "$res/sweep_np$ngpu" all_reduce all_gather reduce_scatter; }
s_layers() {
    "$bundle/bin/bench-layers" --backend nccl "${tp_args[@]}" --out "$res/layers" &&
        "$bundle/bin/bench-layers" --backend nccl "${tp_args[@]}" --preset gpt3-1.3b --mode train --out "$res/layers"
}
s_fp8() {
    "$t/gpu_compute" --exact gpu_gemm_fp8_throughput_beside_bf16_8192 --nocapture --test-threads=1 &&
        "$bundle/bin/bench-layers" --backend nccl "${tp_args[@]}" --dtype bfloat16 --out "$res/layers_fp8" &&
        "$bundle/bin/bench-layers" --backend nccl "${tp_args[@]}" --dtype fp8 --out "$res/layers_fp8"
}
s_pipeline() { "$bundle/bin/bench-pipeline" --backend nccl --out "$res/pipeline"; }
s_nccl_tests_build() {
    # NCCL's wheels ship include/ and lib/libnccl.so.2; nccl-tests links -lnccl.
    local home="$out/nccl-home" cuda_home cuda_lib
    mkdir -p "$home/lib"
    ln -sfn "$(dirname "$nccl_h")" "$home/include"
    ln -sf "$(find_lib libnccl.so)" "$home/lib/libnccl.so"
    cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
    cuda_lib="$cuda_home/lib64"
    [ -e "$cuda_lib/libcudart.so" ] || cuda_lib="$out/lib"
    make -C "$bundle/nccl-tests/src" -j "$(nproc)" BUILDDIR="$out/nccl-tests-build" \
        CUDA_HOME="$cuda_home" CUDA_LIB="$cuda_lib" NVCC="$nvcc" NCCL_HOME="$home" \
        NVCC_GENCODE="-gencode=arch=compute_$cc,code=sm_$cc" "$out/nccl-tests-build/all_reduce_perf"
}
s_nccl_tests() { "$out/nccl-tests-build/all_reduce_perf" -b 8 -e 1G -f 2 -g 1 -n 20 -w 5 -c 1; }

write_torch_gemm() {
    cat >"$out/torch_gemm.py" <<'PY'
# torch.matmul on the shapes and the timing of parbench's GEMM test:
# bf16 8192^3, 3 untimed products, then 20 between two CUDA events.
import torch
n, iters = 8192, 20
assert torch.cuda.is_available(), "torch sees no GPU"
torch.manual_seed(1)
a = (torch.rand(n, n, device="cuda") * 2 - 1).to(torch.bfloat16)
b = (torch.rand(n, n, device="cuda") * 2 - 1).to(torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    torch.matmul(a, b, out=c)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(iters):
    torch.matmul(a, b, out=c)
end.record()
end.synchronize()
s = start.elapsed_time(end) / 1e3
red = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
print(f"GEMM bf16 {n}x{n}x{n} (torch.matmul {torch.__version__}, CUDA {torch.version.cuda}, "
      f"bf16 reduced-precision reduction {red}) on {torch.cuda.get_device_name(0)}: "
      f"{2 * n**3 * iters / s / 1e12:.1f} TFLOP/s ({s / iters * 1e3:.3f} ms per product)")
PY
}

# The plan: name and cap in seconds, in order.
plan=(probe:15 kernels_compile:15)
[ -n "$sanitizer" ] && plan+=(compute_memcheck:35)
plan+=(compute:25 nccl:40 gemm:40 copy_ceiling:15 sweep:50 sweep_graph:50)
[ "$plan_gpus" -gt 1 ] && plan+=(sweep_npN:60)
plan+=(layers:25 pipeline:25)
[ "$cc" -ge 89 ] && plan+=(fp8:30)
[ "$have_nccl_tests" -eq 1 ] && plan+=(nccl_tests_build:45 nccl_tests:25)

if [ -n "$only" ]; then
    picked=()
    for name in ${only//,/ }; do
        found=0
        for p in "${plan[@]}"; do [ "${p%%:*}" = "$name" ] && found=1; done
        if [ "$found" -eq 0 ]; then
            say "FAIL: --steps: '$name' is not a step of this machine's plan (${plan[*]})"
            exit 2
        fi
    done
    for p in "${plan[@]}"; do
        case ",$only," in *",${p%%:*},"*) picked+=("$p") ;; esac
    done
    plan=("${picked[@]}")
fi
total=0
for p in "${plan[@]}"; do total=$((total + ${p#*:})); done
say "# plan: ${plan[*]}"
say "# caps sum to ${total}s + ${reserve}s reserve, budget ${budget}s"
if [ $((total + reserve)) -gt "$budget" ]; then
    say "FAIL: the steps' caps (${total}s + ${reserve}s) exceed the budget (${budget}s): a step could be skipped for time; raise PARBENCH_CHECK_SECONDS or shorten the plan"
    exit 1
fi
if [ "$mode" = dry ]; then
    for p in "${plan[@]}"; do
        printf 'plan\t%s\tcap %ss\n' "${p%%:*}" "${p#*:}"
        printf '%s\tplanned\t-\t%s\n' "${p%%:*}" "${p#*:}" >>"$steps_tsv"
    done
    say "# dry run: nothing ran"
    exit 0
fi

failed=0
# The clock and power the first GPU holds through a compute step, sampled
# every 250 ms to OUTDIR/NAME.clocks.csv: a product's rate beside the clock
# it ran at (the planner's FP8 band names the in-step clock as unpriced).
clock_steps=" gemm fp8 "
clocks_line() {
    # GPU 0's samples that parsed: SM clock, max SM clock, power, power limit.
    local rows n sm w
    rows=$(awk -F', *' '$1 == 0 && $2 + 0 > 0 { print $2 + 0, $3, $4 + 0, $5 }' "$1")
    n=$(printf '%s' "$rows" | grep -c .)
    if [ "$n" -eq 0 ]; then
        echo "     clocks: no samples (see $(basename "$1"))"
        return 0
    fi
    sm=$(cut -d' ' -f1 <<<"$rows" | sort -n)
    w=$(cut -d' ' -f3 <<<"$rows" | sort -n)
    printf '     clocks: GPU 0 SM median %s MHz (min %s, max clock %s), power median %.0f W of %s W, %d samples\n' \
        "$(sed -n "$(((n + 1) / 2))p" <<<"$sm")" "$(head -1 <<<"$sm")" "$(tail -1 <<<"$rows" | cut -d' ' -f2)" \
        "$(sed -n "$(((n + 1) / 2))p" <<<"$w")" "$(tail -1 <<<"$rows" | cut -d' ' -f4)" "$n"
}

# step NAME CAP: runs s_NAME under a timeout of CAP seconds (less when the
# budget has less left); its output goes to OUTDIR/NAME.log. Every way of
# not passing is a failure.
step() {
    local name=$1 cap=$2 left secs rc t0 dt
    left=$((budget - reserve - ($(date +%s) - start)))
    if [ "$left" -le 1 ]; then
        failed=$((failed + 1))
        say "FAIL $name: no time left (skipped)"
        printf '%s\tFAIL: skipped, no time left\t0\t%s\n' "$name" "$cap" >>"$steps_tsv"
        return 0
    fi
    secs=$((cap < left ? cap : left))
    local logger=""
    if [ "${clock_steps#* "$name" }" != "$clock_steps" ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw,power.limit \
            --format=csv,noheader,nounits -lms 250 >"$out/$name.clocks.csv" 2>&1 &
        logger=$!
    fi
    t0=$(date +%s)
    # A fresh bash under timeout runs s_NAME with the variables and functions of check-env.sh.
    # shellcheck disable=SC2016 # $1 and $2 are the inner shell's
    timeout -k 5 "$secs" bash -c '. "$1" && "s_$2"' step "$out/check-env.sh" "$name" >"$out/$name.log" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
    if [ -n "$logger" ]; then
        kill "$logger" 2>/dev/null
        wait "$logger" 2>/dev/null
        clocks_line "$out/$name.clocks.csv" | tee -a "$summary"
    fi
    if [ $rc -eq 0 ]; then
        # A test that skipped passed without checking anything: say so.
        local skipped note=""
        skipped=$(grep -c 'skipped' "$out/$name.log")
        [ "$skipped" -gt 0 ] && note="; $skipped line(s) say skipped, see $name.log"
        say "ok   $name (${dt}s of ${secs}s$note)"
        printf '%s\tok%s\t%s\t%s\n' "$name" "$note" "$dt" "$cap" >>"$steps_tsv"
        return 0
    fi
    failed=$((failed + 1))
    local why="exit $rc"
    case $rc in
        124 | 137) why="timed out after ${secs}s" ;;
        2) why="exit 2 (refused: with a GPU present this is a failure)" ;;
    esac
    say "FAIL $name: $why, see $name.log"
    printf '%s\tFAIL: %s\t%s\t%s\n' "$name" "$why" "$dt" "$cap" >>"$steps_tsv"
    grep -E -A1 "panicked|^error|Error|FAIL|ERROR" "$out/$name.log" | grep -v "^--$" | head -6 | sed 's/^/     /' | tee -a "$summary"
    return 0
}

# What the steps need, for the fresh shells that run them (kept with the logs).
{
    declare -p t out res bc bundle sanitizer nvcc nccl_h ngpu cc tp_args libdirs
    # shellcheck disable=SC2046 # function names split on purpose
    declare -f find_lib write_torch_gemm $(compgen -A function s_)
} >"$out/check-env.sh"
for p in "${plan[@]}"; do
    step "${p%%:*}" "${p#*:}"
done

say "# $failed step(s) failed; $(($(date +%s) - start))s in all; logs and records in $out"
echo
summarize
[ "$failed" -eq 0 ]
