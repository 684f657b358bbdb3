#!/usr/bin/env bash
# Builds everything the GPU check needs, here (where Rust is), and collects it
# into one folder for scripts/gpu-check.sh on a GPU machine that has no Rust
# toolchain and no network:
#
#   scripts/gpu-bundle.sh [BUNDLE]        # default: gpu-bundle/ (git-ignored)
#   (carry BUNDLE to the GPU machine with the tree; scripts/ are tracked)
#   scripts/gpu-check.sh OUTDIR [BUNDLE]
#
# It runs, with the cuda feature (cudarc loads CUDA at run time, so this
# machine needs no CUDA):
#   cargo build --release --features cuda -p <each binary>
#   cargo test  --release --features cuda -p parbench --no-run
# and copies the binaries and the four gpu_* test executables gpu-check.sh
# runs, fully stripped
# (strip -s: a carried folder is limited to 64 MiB, and the check needs no
# symbols; panics still name their message and location).
#
# NCCL_TESTS_SRC=<folder or git directory of NVIDIA/nccl-tests> also copies
# that source (no build: the GPU machine has nvcc) into BUNDLE/nccl-tests, so
# that gpu-check.sh can run all_reduce_perf beside parbench. The source never
# enters this repository: it lives only in the ignored bundle.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${1:-$root/gpu-bundle}
target=${CARGO_TARGET_DIR:-$root/target}
limit_mib=64
cd "$root"

bins=(bench-collectives bench-layers bench-pipeline)
for b in "${bins[@]}"; do
    cargo build --release --features cuda -p "$b"
done

# The test executables' paths, from cargo's JSON messages.
tests=$(cargo test --release --features cuda -p parbench --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    name = m.get("target", {}).get("name", "")
    # Only what gpu-check.sh runs: the other gpu_* tests need no GPU (CI
    # runs them) and would only take room in the 64 MiB.
    if exe and name in ("gpu_probe", "gpu_kernels_compile", "gpu_compute", "gpu_nccl"):
        print(name + " " + exe)
')

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/tests"
for b in "${bins[@]}"; do
    cp "$target/release/$b" "$bundle/bin/$b"
done
while read -r name exe; do
    [ -n "$name" ] && cp "$exe" "$bundle/tests/$name"
done <<<"$tests"
for f in gpu_probe gpu_kernels_compile gpu_compute gpu_nccl; do
    [ -x "$bundle/tests/$f" ] || { echo "gpu-bundle: test executable $f was not built" >&2; exit 1; }
done
strip -s "$bundle"/bin/* "$bundle"/tests/*

nccl_tests="none"
if [ -n "${NCCL_TESTS_SRC-}" ]; then
    mkdir -p "$bundle/nccl-tests"
    if git --git-dir="$NCCL_TESTS_SRC" rev-parse --verify -q HEAD >/dev/null 2>&1; then
        git --git-dir="$NCCL_TESTS_SRC" archive HEAD | tar -x -C "$bundle/nccl-tests"
        nccl_tests="NVIDIA/nccl-tests $(git --git-dir="$NCCL_TESTS_SRC" log -1 --format='%h %s')"
    elif [ -f "$NCCL_TESTS_SRC/src/Makefile" ]; then
        cp -r "$NCCL_TESTS_SRC/." "$bundle/nccl-tests/"
        rm -rf "$bundle/nccl-tests/.git" "$bundle/nccl-tests/build"
        nccl_tests="NVIDIA/nccl-tests from $NCCL_TESTS_SRC"
    else
        echo "gpu-bundle: NCCL_TESTS_SRC=$NCCL_TESTS_SRC is neither a git directory nor a source folder" >&2
        exit 1
    fi
fi

{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "revision: $(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)"
    echo "features: cuda (cudarc 0.19, CUDA 13.0 bindings, dynamic loading)"
    echo "binaries: ${bins[*]}"
    echo "tests: $(cd "$bundle/tests" && echo *)"
    echo "nccl-tests source: $nccl_tests"
    # The GPU machine's C library must be at least this (ldd --version there).
    if command -v objdump >/dev/null; then
        echo "needs: $(objdump -T "$bundle"/bin/* "$bundle"/tests/* | grep -o 'GLIBC_[0-9.]*' |
            sort -t. -k2,2n -k3,3n -u | tail -1 | tr _ ' ') or newer"
    fi
} >"$bundle/MANIFEST"
bytes=$(du -sb "$bundle" | cut -f1)
mib=$(((bytes + (1 << 20) - 1) >> 20))
echo "bundle ready: $bundle, $bytes bytes ($mib MiB of the $limit_mib MiB a carried folder may hold)"
du -b "$bundle"/bin/* "$bundle"/tests/* | sort -n | awk '{ printf "  %6.1f MiB  %s\n", $1 / 1048576, $2 }'
if [ "$mib" -ge "$limit_mib" ]; then
    echo "gpu-bundle: the bundle is over $limit_mib MiB: it cannot be carried" >&2
    exit 1
fi
echo "then, on the GPU machine: scripts/gpu-check.sh OUTDIR $bundle"
