#!/usr/bin/env bash
# tests/gpu/run.sh OUTDIR — every GPU check of the CUDA kernels in one go.
#
# Builds only what the GPU checks need (tests/gpu/CMakeLists.txt, a standalone project:
# no gRPC/UCX/CUnit/inih needed; falls back to plain nvcc + cc if cmake is missing or
# fails), for sm_${KVS_CUDA_ARCH:-90}, in a scratch folder outside OUTDIR, then runs
#   1. fp8_conformance  test_fp8_cuda: kvq_math.h on the device == hardware cvt == host;
#   2. tile_conformance test_kvq_cuda: the tile kernels == the C reference, byte for byte;
#   3. fp8_bw           FP8 conversion bandwidth vs cudaMemcpy D2D (validates first);
#   4. tile_bw          tile quantize/dequantize vs cudaMemcpy D2D (validates first),
#                       ending with RESULT gpu_quant_vs_d2d=.. gpu_dequant_vs_d2d=..
#   5. ingest_codec     tests/gpu/ingest (standalone: kernels + service/codec.c, no gRPC):
#                       kvstashd's GPU ingest backend makes the CPU's blocks byte for byte;
#   6. ingest_gpu       tests/integration/test_ingest_gpu of the main project: the same
#                       in-process, then through kvstashd --ingest-backend gpu Put/Get.
#                       Needs the main project's build with CUDA: the folder KVS_MAIN_BUILD
#                       (configured already), or one configured and built here (needs
#                       deploy/install-deps.sh's packages; where they are missing the step
#                       says SKIP). Steps 5 and 6 log to build.log and run.log only.
#   7. xfer_gpu_tcp/shm tests/integration/test_xfer_gpu of the same build: UCX fetch into
#                       device buffers through pinned staging (transfer/), over tcp and
#                       over posix shm; logs like step 6.
# The tile code needs xxhash: pkg-config's libxxhash, or xxhash.h compiled inline from
# <repo>/.gpu-deps/ (mkdir -p .gpu-deps && cp /usr/include/xxhash.h .gpu-deps/) or from
# /usr/include. Without any, steps 2 and 4 cannot be built and the run fails saying so.
#
# OUTDIR gets at most 8 small files: run.log (everything), build.log, nvidia-smi.txt,
# fp8_conformance.log, tile_conformance.log, fp8_bw.log, tile_bw.log, summary.txt (one
# line per step, the RESULT line, the verdict). Step timeouts: configure 90 s, build
# 240 s, fp8_conformance 90 s, tile_conformance 240 s, fp8_bw 90 s, tile_bw 150 s,
# ingest_codec configure 120 s + build 300 s + run 120 s, ingest_gpu configure 120 s +
# build 480 s + run 240 s, xfer_gpu build 240 s + 2 runs of 120 s; expected about 2 minutes on an H200 machine with 16 cores,
# most of it the build (plus about a minute for step 5 and the main build for step 6).
#
# Prebuilt (KVS_GPU_PREBUILT=DIR, made by tests/gpu/stage.sh DIR on a machine with the main
# build's packages): nothing is built here; the programs come from DIR/bin, their shared
# libraries from DIR/lib (LD_LIBRARY_PATH), and steps 5-7 run on a machine that has no gRPC
# or UCX. nvcc is then not needed. After step 7, KVS_GPU_NCU=1 also profiles one K and one
# V quantize launch with Nsight Compute (ncu on PATH or in /opt/nvidia), output in run.log.
#
# Exit status: 0 all checks passed; 77 built fine but no usable GPU here (nothing was
# checked on a device); 1 a build, check or validation failed (summary.txt says which).
# Env: KVS_CUDA_ARCH (default 90), KVS_BW_ELEMENTS (default 67108864), NVCC,
# KVS_GPU_BUILD (build folder; default a fresh mktemp folder, removed unless a step
# failed), KVS_GPU_DIRECT=1 (skip cmake: test the plain-nvcc build).
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 1
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ARCH=${KVS_CUDA_ARCH:-90}
if [ -n "${KVS_GPU_BUILD:-}" ]; then
    BUILD=$KVS_GPU_BUILD
    KEEP_BUILD=1
else
    BUILD=$(mktemp -d "${TMPDIR:-/tmp}/kvstash-gpu-build.XXXXXX") || exit 1
    KEEP_BUILD=0
fi
JOBS=$(nproc 2>/dev/null || echo 4)
PREBUILT=${KVS_GPU_PREBUILT:-}
if [ -n "$PREBUILT" ]; then
    PREBUILT=$(cd "$PREBUILT" && pwd) || exit 1
    BIN=$PREBUILT/bin
    export LD_LIBRARY_PATH="$PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    BIN=$BUILD
fi
rm -f "$OUT"/run.log "$OUT"/build.log "$OUT"/nvidia-smi.txt "$OUT"/fp8_conformance.log \
    "$OUT"/tile_conformance.log "$OUT"/fp8_bw.log "$OUT"/tile_bw.log "$OUT"/summary.txt
exec > >(tee "$OUT/run.log") 2>&1

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi
NVCC=${NVCC:-$(command -v nvcc || true)}

failed=()
note() { echo "== $*"; }
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
: >"$OUT/summary.txt"

finish() { # status
    note "summary (summary.txt)"
    cat "$OUT/summary.txt"
    if [ "$KEEP_BUILD" -eq 0 ] && [ "$1" -ne 1 ]; then
        rm -rf "$BUILD"
    fi
    exit "$1"
}

note "kvstash GPU check: $(date -u +%Y-%m-%dT%H:%M:%SZ), tree $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git')$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo ', with uncommitted changes')), sm_$ARCH, build in $BUILD"
note "nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
else
    echo "nvidia-smi not found" | tee "$OUT/nvidia-smi.txt"
fi

note "toolchain"
if [ -z "$NVCC" ] && [ -z "$PREBUILT" ]; then
    summary "FAIL build: nvcc not found (PATH or /usr/local/cuda/bin)"
    summary "RESULT: FAILED (build)"
    finish 1
fi
[ -z "$NVCC" ] || "$NVCC" --version | tail -n 2
cmake --version 2>/dev/null | head -n 1 || echo "cmake not found"
cc --version 2>/dev/null | head -n 1
if [ -f "$ROOT/.gpu-deps/xxhash.h" ]; then
    echo "xxhash.h in .gpu-deps: version $(awk '/^#define XXH_VERSION_(MAJOR|MINOR|RELEASE)/ {v = v (v == "" ? "" : ".") $3} END {print v}' "$ROOT/.gpu-deps/xxhash.h")"
else
    echo "no .gpu-deps/xxhash.h (pkg-config libxxhash or /usr/include/xxhash.h needed for the tile checks)"
fi

build_cmake() {
    [ "${KVS_GPU_DIRECT:-0}" = 1 ] && { echo "KVS_GPU_DIRECT=1: skipping cmake"; return 1; }
    command -v cmake >/dev/null 2>&1 || return 1
    timeout 90 cmake -S "$ROOT/tests/gpu" -B "$BUILD/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" &&
        timeout 240 cmake --build "$BUILD/cmake" -j "$JOBS" &&
        for p in test_fp8_cuda fp8_bw test_kvq_cuda kvq_tile_bw; do
            [ ! -x "$BUILD/cmake/$p" ] || cp "$BUILD/cmake/$p" "$BUILD/" || return 1
        done
}

# Same sources and flags as kernels/cuda/CMakeLists.txt and tests/gpu/CMakeLists.txt, for
# machines without a usable cmake. Compiles in parallel; any failure fails the build.
build_direct() {
    local b="$BUILD/direct" inc=(-I"$ROOT/common" -I"$ROOT/kernels" -I"$ROOT/kernels/ref"
        -I"$ROOT/kernels/cuda" -I"$ROOT/tests/conformance") xxh_c=() xxh_l=() tiles=1 pids=() f
    local cuflags=(-O2 -std=c++17 -arch=sm_"$ARCH" -ftz=false -prec-div=true -prec-sqrt=true -fmad=false)
    mkdir -p "$b" || return 1
    if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libxxhash; then
        read -r -a xxh_c <<<"$(pkg-config --cflags libxxhash)"
        read -r -a xxh_l <<<"$(pkg-config --libs libxxhash)"
    elif [ -f "$ROOT/.gpu-deps/xxhash.h" ]; then
        xxh_c=(-DXXH_INLINE_ALL -isystem "$ROOT/.gpu-deps")
    elif [ -f /usr/include/xxhash.h ]; then
        xxh_c=(-DXXH_INLINE_ALL)
    else
        tiles=0
        echo "direct build: no xxhash: FP8 checks only"
    fi
    for f in kvs_cuda_util fp8_roundtrip tile_api tile_quant_k tile_quant_k_cols tile_quant_v tile_dequant; do
        "$NVCC" "${cuflags[@]}" "${inc[@]}" -c "$ROOT/kernels/cuda/$f.cu" -o "$b/$f.o" &
        pids+=($!)
    done
    "$NVCC" -O2 -std=c++17 -arch=sm_"$ARCH" "${inc[@]}" -c "$ROOT/tests/bench/kvq_speed_gpu.cu" \
        -o "$b/kvq_speed_gpu.o" &
    pids+=($!)
    for f in common/kvs_error.c common/kvs_log.c kernels/ref/fp8_ref.c \
        tests/conformance/test_fp8_cuda.c tests/conformance/test_kvq_cuda.c tests/gpu/kvq_tile_bw.c; do
        cc -std=c11 -O2 -D_GNU_SOURCE -Wall -Wextra "${inc[@]}" -c "$ROOT/$f" \
            -o "$b/$(basename "$f" .c).o" &
        pids+=($!)
    done
    if [ $tiles -eq 1 ]; then
        for f in kernels/kvq_tile.c kernels/ref/kvq_ref.c; do
            cc -std=c11 -O2 -D_GNU_SOURCE -Wall -Wextra "${inc[@]}" "${xxh_c[@]}" -c "$ROOT/$f" \
                -o "$b/$(basename "$f" .c).o" &
            pids+=($!)
        done
    fi
    for f in "${pids[@]}"; do
        wait "$f" || return 1
    done
    local cuda_o=("$b/kvs_cuda_util.o" "$b/fp8_roundtrip.o") common_o=("$b/kvs_error.o" "$b/kvs_log.o")
    "$NVCC" -arch=sm_"$ARCH" -o "$BUILD/test_fp8_cuda" "$b/test_fp8_cuda.o" "${cuda_o[@]}" \
        "$b/fp8_ref.o" "${common_o[@]}" -lm || return 1
    "$NVCC" "${cuflags[@]}" "${inc[@]}" -o "$BUILD/fp8_bw" "$ROOT/tests/gpu/fp8_bw.cu" "${cuda_o[@]}" \
        "$b/fp8_ref.o" "${common_o[@]}" -lm || return 1
    if [ $tiles -eq 1 ]; then
        local tile_o=("${cuda_o[@]}" "$b/tile_api.o" "$b/tile_quant_k.o" "$b/tile_quant_k_cols.o" "$b/tile_quant_v.o"
            "$b/tile_dequant.o" "$b/kvq_tile.o" "$b/kvq_ref.o" "$b/fp8_ref.o" "${common_o[@]}")
        "$NVCC" -arch=sm_"$ARCH" -o "$BUILD/test_kvq_cuda" "$b/test_kvq_cuda.o" "${tile_o[@]}" \
            "${xxh_l[@]}" -lm || return 1
        "$NVCC" -arch=sm_"$ARCH" -o "$BUILD/kvq_tile_bw" "$b/kvq_tile_bw.o" "$b/kvq_speed_gpu.o" \
            "${tile_o[@]}" "${xxh_l[@]}" -lm || return 1
    fi
}

note "build (log: build.log)"
start=$SECONDS
if [ -n "$PREBUILT" ]; then
    ls -l "$BIN" >"$OUT/build.log" 2>&1
    summary "PASS build (prebuilt by tests/gpu/stage.sh: $BIN; from $(head -n 2 "$PREBUILT/BUILT_FROM" 2>/dev/null | paste -sd ' ' || echo '?'))"
elif build_cmake >"$OUT/build.log" 2>&1; then
    summary "PASS build (cmake, sm_$ARCH, $((SECONDS - start)) s; $(grep -o 'xxhash: [^)]*' "$OUT/build.log" | head -n 1))"
else
    echo "cmake build failed or cmake missing; trying plain nvcc" | tee -a "$OUT/build.log"
    grep -E 'error|Error|FAILED' "$OUT/build.log" | head -n 20
    if timeout 300 bash -c "$(declare -f build_direct); $(declare -p ROOT BUILD ARCH NVCC); build_direct" >>"$OUT/build.log" 2>&1; then
        summary "PASS build (direct nvcc after the cmake build failed, sm_$ARCH, $((SECONDS - start)) s)"
    else
        tail -n 40 "$OUT/build.log"
        summary "FAIL build: neither cmake nor direct nvcc built the programs; see build.log"
        summary "RESULT: FAILED (build)"
        finish 1
    fi
fi
for p in test_kvq_cuda kvq_tile_bw; do
    if [ ! -x "$BIN/$p" ]; then
        summary "FAIL build: $p not built: no xxhash (put Debian's /usr/include/xxhash.h into $ROOT/.gpu-deps/)"
        failed+=("build:$p")
    fi
done

no_gpu=0
run_step() { # name timeout binary args...
    local name=$1 secs=$2 rc
    shift 2
    if [ ! -x "$1" ]; then
        summary "FAIL $name: $(basename "$1") was not built"
        failed+=("$name")
        return
    fi
    note "$name (log: $name.log)"
    timeout "$secs" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    case $rc in
    0) summary "PASS $name: $(grep -E 'passed, [0-9]+ failed|^PASS [a-z0-9_]+:' "$OUT/$name.log" | tail -n 1)" ;;
    77) summary "SKIP $name: no usable GPU ($(grep -m1 SKIP "$OUT/$name.log"))"; no_gpu=1 ;;
    124) summary "FAIL $name: timed out after $secs s (last lines in $name.log)"; failed+=("$name") ;;
    *)
        summary "FAIL $name: exit $rc: $(grep -E '^FAIL|passed, [0-9]+ failed' "$OUT/$name.log" | head -n 3 | tr '\n' ' ')"
        failed+=("$name")
        ;;
    esac
}

# Like run_step, but the log stays in the build folder (OUTDIR's 8 files are taken);
# the output is in run.log all the same.
run_inline() { # name timeout binary args...
    local name=$1 secs=$2 rc
    shift 2
    note "$name"
    timeout "$secs" "$@" 2>&1 | tee "$BUILD/$name.log"
    rc=${PIPESTATUS[0]}
    case $rc in
    0) summary "PASS $name: $(grep -E '^PASS|passed, [0-9]+ failed|GPU == CPU|stored tiles ==' "$BUILD/$name.log" | tr -s ' ' | tr '\n' ';')" ;;
    77) summary "SKIP $name: no usable GPU ($(grep -m1 SKIP "$BUILD/$name.log"))" ;;
    124) summary "FAIL $name: timed out after $secs s (run.log)"; failed+=("$name") ;;
    *) summary "FAIL $name: exit $rc: $(grep -E '^FAIL|passed, [0-9]+ failed' "$BUILD/$name.log" | head -n 3 | tr '\n' ' ')"; failed+=("$name") ;;
    esac
}

run_step fp8_conformance 90 "$BIN/test_fp8_cuda"
if [ $no_gpu -eq 0 ]; then
    run_step tile_conformance 240 "$BIN/test_kvq_cuda"
    run_step fp8_bw 90 "$BIN/fp8_bw" "${KVS_BW_ELEMENTS:-67108864}"
    run_step tile_bw 150 "$BIN/kvq_tile_bw"
    if [ -f "$OUT/tile_bw.log" ] && grep -q '^RESULT ' "$OUT/tile_bw.log"; then
        summary "$(grep '^RESULT ' "$OUT/tile_bw.log" | tail -n 1)"
    fi
    # 5. ingest: no files of their own (OUTDIR keeps to 8): build output to build.log,
    # program output to run.log.
    note "ingest_codec: build tests/gpu/ingest (log: build.log)"
    if [ -n "$PREBUILT" ]; then
        run_inline ingest_codec 120 "$BIN/ingest_codec_gpu"
    elif timeout 120 cmake -S "$ROOT/tests/gpu/ingest" -B "$BUILD/ingest" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >>"$OUT/build.log" 2>&1 &&
        timeout 300 cmake --build "$BUILD/ingest" -j "$JOBS" >>"$OUT/build.log" 2>&1; then
        run_inline ingest_codec 120 "$BUILD/ingest/ingest_codec_gpu"
    else
        summary "FAIL ingest_codec: tests/gpu/ingest did not build; see build.log"
        failed+=("ingest_codec")
    fi
    MAIN_BUILD=${KVS_MAIN_BUILD:-$BUILD/main}
    if [ -n "$PREBUILT" ]; then
        note "ingest_gpu, xfer_gpu: prebuilt"
        run_inline ingest_gpu 240 "$BIN/test_ingest_gpu" "$BIN/kvstashd"
        UCX_TLS=tcp,self run_inline xfer_gpu_tcp 120 "$BIN/test_xfer_gpu"
        UCX_TLS=posix,cma,self UCX_MM_ERROR_HANDLING=y \
            run_inline xfer_gpu_shm 120 "$BIN/test_xfer_gpu"
    else
    note "ingest_gpu: main project build in $MAIN_BUILD (log: build.log)"
    if { [ -n "${KVS_MAIN_BUILD:-}" ] ||
        timeout 120 cmake -S "$ROOT" -B "$MAIN_BUILD" -DKVS_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH"; } >>"$OUT/build.log" 2>&1 &&
        timeout 480 cmake --build "$MAIN_BUILD" -j "$JOBS" --target kvstashd test_ingest_gpu \
            >>"$OUT/build.log" 2>&1; then
        run_inline ingest_gpu 240 "$MAIN_BUILD/tests/integration/test_ingest_gpu" "$MAIN_BUILD/service/kvstashd"
        # 7. UCX fetch into device memory through pinned staging (issue 6), tcp and shm.
        if timeout 240 cmake --build "$MAIN_BUILD" -j "$JOBS" --target test_xfer_gpu >>"$OUT/build.log" 2>&1; then
            UCX_TLS=tcp,self run_inline xfer_gpu_tcp 120 "$MAIN_BUILD/tests/integration/test_xfer_gpu"
            UCX_TLS=posix,cma,self UCX_MM_ERROR_HANDLING=y \
                run_inline xfer_gpu_shm 120 "$MAIN_BUILD/tests/integration/test_xfer_gpu"
        else
            summary "SKIP xfer_gpu: test_xfer_gpu did not build here (UCX: deploy/install-deps.sh); see build.log"
        fi
    else
        summary "SKIP ingest_gpu, xfer_gpu: the main project did not configure or build here (its packages: deploy/install-deps.sh); see build.log"
    fi
    fi
    if [ "${KVS_GPU_NCU:-0}" = 1 ]; then
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
        if [ -n "$NCU" ]; then
            note "ncu: one K and one V quantize launch of kvq_tile_bw (the 256 x T=256 shape)"
            timeout 240 "$NCU" --clock-control none -k regex:quant_k -s 60 -c 1 \
                --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
                --section LaunchStats --section WarpStateStats "$BIN/kvq_tile_bw" 2>&1 |
                grep -v -E '^(gpu_|RESULT|  [KV] |kvar)' | tail -n 120
            timeout 240 "$NCU" --clock-control none -k regex:quant_v -s 60 -c 1 \
                --section SpeedOfLight --section Occupancy --section LaunchStats \
                "$BIN/kvq_tile_bw" 2>&1 | grep -v -E '^(gpu_|RESULT|  [KV] |kvar)' | tail -n 60
        else
            echo "ncu not found"
        fi
    fi
fi

if [ ${#failed[@]} -gt 0 ]; then
    summary "RESULT: FAILED (${failed[*]}); logs in $OUT"
    finish 1
fi
if [ $no_gpu -eq 1 ]; then
    summary "RESULT: built OK, but no usable GPU on this machine: nothing was checked on a device (exit 77); logs in $OUT"
    finish 77
fi
summary "RESULT: all GPU checks passed; logs in $OUT"
finish 0
