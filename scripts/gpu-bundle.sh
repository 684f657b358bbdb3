#!/usr/bin/env bash
# Builds everything the GPU check needs, here (where Rust is), and collects it
# into one folder for scripts/gpu-check.sh on a GPU machine that has no Rust
# toolchain and no network:
#
#   scripts/gpu-bundle.sh [BUNDLE]        # default: gpu-bundle/
#   (copy BUNDLE and scripts/ to the GPU machine)
#   scripts/gpu-check.sh OUTDIR [BUNDLE]
#
# It runs, with the cuda feature (cudarc loads CUDA at run time, so this
# machine needs no CUDA):
#   cargo build --release --features cuda -p <each binary>
#   cargo test  --release --features cuda -p parbench --no-run
# and copies the binaries and the gpu_* test executables, debug info
# stripped to keep the bundle small (a carried folder is limited in size).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${1:-$root/gpu-bundle}
target=${CARGO_TARGET_DIR:-$root/target}
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
    if exe and name.startswith("gpu_"):
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
if command -v strip >/dev/null; then
    strip --strip-debug "$bundle"/bin/* "$bundle"/tests/*
fi
{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "revision: $(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)"
    echo "features: cuda (cudarc 0.19, CUDA 13.0 bindings, dynamic loading)"
    echo "binaries: ${bins[*]}"
    echo "tests: $(ls "$bundle/tests" | tr '\n' ' ')"
} >"$bundle/MANIFEST"
du -sh "$bundle"
echo "bundle ready: $bundle (run scripts/gpu-check.sh OUTDIR $bundle on the GPU machine)"
