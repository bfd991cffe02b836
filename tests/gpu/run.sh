#!/usr/bin/env bash
# tests/gpu/run.sh OUTDIR — the whole GPU check of the FP8 kernels in one go.
#
# Builds only what the GPU checks need (tests/gpu/CMakeLists.txt, a standalone project:
# no gRPC/UCX/CUnit/inih needed; falls back to plain nvcc + cc if cmake is missing or
# fails), for sm_${KVS_CUDA_ARCH:-90}, then runs
#   1. test_fp8_cuda: kvq_math.h on the device == hardware cvt == host, bit for bit;
#   2. fp8_bw: bandwidth of the kernels vs cudaMemcpy D2D (validates before timing).
# Everything is logged under OUTDIR (run.log has it all; build.log, nvidia-smi.txt,
# conformance.log, bw.log, summary.txt). Step timeouts (configure 60 s, build 120 s,
# conformance 60 s, bandwidth 60 s) bound the run; expected well under a minute on an
# H200 with 16 cores, most of it the build.
#
# Exit status: 0 all checks passed; 77 built fine but no usable GPU here (nothing was
# checked on a device); 1 a build, check or validation failed (see summary.txt).
# Env: KVS_CUDA_ARCH (default 90), KVS_BW_ELEMENTS (default 67108864), NVCC.
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 1
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ARCH=${KVS_CUDA_ARCH:-90}
BUILD="$OUT/build"
JOBS=$(nproc 2>/dev/null || echo 4)
exec > >(tee "$OUT/run.log") 2>&1

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi
NVCC=${NVCC:-$(command -v nvcc || true)}

failed=()
note() { echo "== $*"; }
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
: >"$OUT/summary.txt"

note "kvstash GPU check: $(date -u +%Y-%m-%dT%H:%M:%SZ), tree $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git')), sm_$ARCH"
note "nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
else
    echo "nvidia-smi not found" | tee "$OUT/nvidia-smi.txt"
fi

note "toolchain"
if [ -z "$NVCC" ]; then
    summary "FAIL build: nvcc not found (PATH or /usr/local/cuda/bin)"
    exit 1
fi
"$NVCC" --version | tail -n 2
cmake --version 2>/dev/null | head -n 1 || echo "cmake not found"
cc --version 2>/dev/null | head -n 1

build_cmake() {
    command -v cmake >/dev/null 2>&1 || return 1
    timeout 60 cmake -S "$ROOT/tests/gpu" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" &&
        timeout 120 cmake --build "$BUILD" -j "$JOBS"
}

# Same sources and flags as kernels/CMakeLists.txt, for machines without a usable cmake.
build_direct() {
    local b="$BUILD/direct" inc=(-I"$ROOT/common" -I"$ROOT/kernels" -I"$ROOT/kernels/ref"
        -I"$ROOT/kernels/cuda" -I"$ROOT/tests/conformance")
    mkdir -p "$b" || return 1
    "$NVCC" -O2 -std=c++17 -arch=sm_"$ARCH" -ftz=false -prec-div=true -prec-sqrt=true -fmad=false \
        "${inc[@]}" -c "$ROOT/kernels/cuda/fp8_roundtrip.cu" -o "$b/fp8_roundtrip.o" || return 1
    for src in common/kvs_error.c common/kvs_log.c kernels/ref/fp8_ref.c tests/conformance/test_fp8_cuda.c; do
        cc -std=c11 -O2 -D_GNU_SOURCE -Wall -Wextra "${inc[@]}" -c "$ROOT/$src" \
            -o "$b/$(basename "$src" .c).o" || return 1
    done
    "$NVCC" -arch=sm_"$ARCH" -o "$b/test_fp8_cuda" "$b/test_fp8_cuda.o" "$b/fp8_roundtrip.o" \
        "$b/fp8_ref.o" "$b/kvs_error.o" "$b/kvs_log.o" -lm || return 1
    "$NVCC" -O2 -std=c++17 -arch=sm_"$ARCH" "${inc[@]}" -o "$b/fp8_bw" "$ROOT/tests/gpu/fp8_bw.cu" \
        "$b/fp8_roundtrip.o" "$b/fp8_ref.o" "$b/kvs_error.o" "$b/kvs_log.o" -lm || return 1
    cp "$b/test_fp8_cuda" "$b/fp8_bw" "$BUILD/" || return 1
}

note "build (log: build.log)"
start=$SECONDS
if build_cmake >"$OUT/build.log" 2>&1; then
    summary "PASS build (cmake, sm_$ARCH, $((SECONDS - start)) s)"
else
    echo "cmake build failed or cmake missing; trying plain nvcc" | tee -a "$OUT/build.log"
    if build_direct >>"$OUT/build.log" 2>&1; then
        summary "PASS build (direct nvcc, sm_$ARCH, $((SECONDS - start)) s)"
    else
        tail -n 40 "$OUT/build.log"
        summary "FAIL build: see build.log"
        exit 1
    fi
fi

no_gpu=0
run_step() { # name timeout binary args...
    local name=$1 secs=$2 rc
    shift 2
    note "$name (log: $name.log)"
    timeout "$secs" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    case $rc in
    0) summary "PASS $name" ;;
    77) summary "SKIP $name: no usable GPU"; no_gpu=1 ;;
    124) summary "FAIL $name: timed out after $secs s"; failed+=("$name") ;;
    *) summary "FAIL $name: exit $rc"; failed+=("$name") ;;
    esac
}

run_step conformance 60 "$BUILD/test_fp8_cuda"
if [ $no_gpu -eq 0 ]; then
    run_step bw 60 "$BUILD/fp8_bw" "${KVS_BW_ELEMENTS:-67108864}"
fi

note "summary (summary.txt)"
cat "$OUT/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then
    echo "RESULT: FAILED (${failed[*]}); logs in $OUT"
    exit 1
fi
if [ $no_gpu -eq 1 ]; then
    echo "RESULT: built OK, but no usable GPU on this machine: nothing was checked on a device (exit 77); logs in $OUT"
    exit 77
fi
echo "RESULT: all GPU checks passed; logs in $OUT"
exit 0
