#!/usr/bin/env bash
# NVIDIA's NVRTC and NCCL from their Python wheels, for the checks of the GPU
# path that need no GPU: the kernels compile (gpu_kernels_compile) and the
# real libnccl loads, exports every symbol parbench calls and makes a unique
# id (gpu_nccl_lib). CI runs it (.ci/run); so can a developer:
#
#   scripts/gpu-libs.sh [DIR]     install into DIR (default: <target dir>/gpu-libs)
#   . DIR/env.sh                  then LD_LIBRARY_PATH names both libraries
#   cargo test --release --features cuda -p parbench --test gpu_kernels_compile --test gpu_nccl_lib
#
# DIR holds a venv with the pinned wheels, a second NCCL (the oldest release
# docs/gpu.md supports, for its symbols only), and env.sh. A DIR that already
# holds these versions is kept as it is, so a warm cache costs nothing.
# Exits 0 with the versions printed, 2 when python3 or PyPI is not there.
set -euo pipefail

# Pinned: a new release is taken on purpose, by editing these lines.
NVRTC_VERSION=12.9.86     # nvidia-cuda-nvrtc-cu12: NVRTC 12.9, knows sm_75 .. sm_121
NCCL_VERSION=2.28.9       # nvidia-nccl-cu12: the NCCL the checks load and call
NCCL_OLDEST=2.18.1        # the oldest NCCL docs/gpu.md supports: symbols checked only

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${CARGO_TARGET_DIR:-$root/target}/gpu-libs}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
want="nvrtc=$NVRTC_VERSION nccl=$NCCL_VERSION oldest=$NCCL_OLDEST"

fail() {
    echo "gpu-libs.sh: $*" >&2
    exit 2
}

# The stamp alone is not enough: a cache restored in part keeps it.
installed() {
    [ "$(cat "$dir/installed" 2>/dev/null)" = "$want" ] &&
        [ -x "$dir/venv/bin/python" ] &&
        compgen -G "$dir/venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" >/dev/null &&
        compgen -G "$dir/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2" >/dev/null &&
        [ -e "$dir/nccl-$NCCL_OLDEST/nvidia/nccl/lib/libnccl.so.2" ]
}

if ! installed; then
    command -v python3 >/dev/null 2>&1 || fail "python3 not found (apt-get install python3 python3-venv)"
    rm -rf "$dir/venv" "$dir/nccl-$NCCL_OLDEST" "$dir/installed" "$dir/env.sh"
    if ! python3 -m venv "$dir/venv" >/dev/null 2>&1; then
        # Debian splits venv (ensurepip) out of python3.
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
            rm -rf "$dir/venv"
            python3 -m venv "$dir/venv" || fail "python3 -m venv failed"
        else
            fail "python3 -m venv failed (apt-get install python3-venv)"
        fi
    fi
    pip=("$dir/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all:)
    "${pip[@]}" "nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION" "nvidia-nccl-cu12==$NCCL_VERSION" ||
        fail "pip could not install the wheels (is PyPI reachable?)"
    # Not into the venv: one environment holds one version of a package.
    "${pip[@]}" --target "$dir/nccl-$NCCL_OLDEST" "nvidia-nccl-cu12==$NCCL_OLDEST" ||
        fail "pip could not install nvidia-nccl-cu12==$NCCL_OLDEST"
fi

site=$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nvrtc_lib=$site/nvidia/cuda_nvrtc/lib
nccl_lib=$site/nvidia/nccl/lib
oldest_lib=$dir/nccl-$NCCL_OLDEST/nvidia/nccl/lib
for f in "$nvrtc_lib/libnvrtc.so.12" "$nccl_lib/libnccl.so.2" "$oldest_lib/libnccl.so.2"; do
    [ -e "$f" ] || fail "$f missing after the install (a wheel changed its layout?)"
done
# cudarc tries libnvrtc.so and libnccl.so, never NCCL's soname libnccl.so.2
# (docs/gpu.md, "the libnccl.so.2 note"); the wheels ship only the sonames.
ln -sf libnvrtc.so.12 "$nvrtc_lib/libnvrtc.so"
ln -sf libnccl.so.2 "$nccl_lib/libnccl.so"

cat >"$dir/env.sh" <<EOF
# Written by scripts/gpu-libs.sh: NVRTC $NVRTC_VERSION and NCCL $NCCL_VERSION on the loader's path.
export LD_LIBRARY_PATH=$nvrtc_lib:$nccl_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PARBENCH_NVRTC_VERSION=$NVRTC_VERSION
export PARBENCH_NCCL_VERSION=$NCCL_VERSION
export PARBENCH_NCCL_OLDEST=$oldest_lib/libnccl.so.2
export PARBENCH_NCCL_OLDEST_VERSION=$NCCL_OLDEST
EOF
echo "$want" >"$dir/installed"

"$dir/venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null |
    awk '/^nvidia-/ { printf "gpu-libs: %s %s\n", $1, $2 }'
echo "gpu-libs: nvidia-nccl-cu12 $NCCL_OLDEST (oldest supported, in $dir/nccl-$NCCL_OLDEST)"
echo "gpu-libs: . $dir/env.sh  # sets LD_LIBRARY_PATH"
