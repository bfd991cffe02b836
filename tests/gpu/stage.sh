#!/usr/bin/env bash
# tests/gpu/stage.sh DIR — build every program tests/gpu/run.sh runs, here, for a GPU
# machine that has nvcc and cmake but none of the main build's packages (gRPC, protobuf-c,
# UCX, CUnit, inih), and put them with the shared libraries they need into DIR:
#   DIR/bin  test_fp8_cuda fp8_bw test_kvq_cuda kvq_tile_bw   (tests/gpu)
#            ingest_codec_gpu                                 (tests/gpu/ingest)
#            kvstashd kvstash-xferd kvstash-ucx-addrcheck test_ingest_gpu test_xfer_gpu
#                                                             (the main project, KVS_CUDA=ON)
#   DIR/lib  every library ldd names for them except the C library's own (libc, libm,
#            libdl, libpthread, librt, ld-linux; libstdc++ and libgcc_s, which a newer system
#            has in newer versions) and the GPU driver's; UCX's transport
#            modules in DIR/lib/ucx (where libucs looks beside itself).
#   DIR/BUILT_FROM  the commit (and whether the tree had uncommitted changes).
# Then, on the GPU machine: KVS_GPU_PREBUILT=DIR bash tests/gpu/run.sh OUT builds nothing
# and runs these (steps 1-7). Binaries are stripped to keep DIR small (tens of MB: the
# device tool carries at most 64 MiB with the tree).
# Env: KVS_CUDA_ARCH (default 90), KVS_STAGE_LINEINFO (above), KVS_STAGE_BUILD (build folder, default build-gpu-stage
# in the repository; kept, so a second run is incremental).
set -eu -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ARCH=${KVS_CUDA_ARCH:-90}
B=${KVS_STAGE_BUILD:-$ROOT/build-gpu-stage}
JOBS=$(nproc 2>/dev/null || echo 2)
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi
# KVS_STAGE_LINEINFO=1 adds -lineinfo (Nsight Compute's source view; it changes no code, but
# the binaries triple in size: carry only the ones profiled).
cuda=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
[ "${KVS_STAGE_LINEINFO:-0}" = 1 ] && cuda+=(-DCMAKE_CUDA_FLAGS=-lineinfo)
[ "${KVS_STAGE_LINEINFO:-0}" = 1 ] || cuda+=(-DCMAKE_CUDA_FLAGS=)

echo "== tests/gpu"
cmake -S "$ROOT/tests/gpu" -B "$B/gpu" "${cuda[@]}" >/dev/null
cmake --build "$B/gpu" -j "$JOBS" --target test_fp8_cuda fp8_bw test_kvq_cuda kvq_tile_bw
echo "== tests/gpu/ingest"
cmake -S "$ROOT/tests/gpu/ingest" -B "$B/ingest" "${cuda[@]}" >/dev/null
cmake --build "$B/ingest" -j "$JOBS" --target ingest_codec_gpu
echo "== main project, KVS_CUDA=ON"
cmake -S "$ROOT" -B "$B/main" -DKVS_CUDA=ON "${cuda[@]}" >/dev/null
cmake --build "$B/main" -j "$JOBS" --target kvstashd test_ingest_gpu test_xfer_gpu

rm -rf "$1"
mkdir -p "$1/bin" "$1/lib/ucx"
DIR=$(cd "$1" && pwd)
progs=("$B/gpu/test_fp8_cuda" "$B/gpu/fp8_bw" "$B/gpu/test_kvq_cuda" "$B/gpu/kvq_tile_bw"
    "$B/ingest/ingest_codec_gpu" "$B/main/service/kvstashd" "$B/main/service/kvstash-xferd"
    "$B/main/service/kvstash-ucx-addrcheck" "$B/main/tests/integration/test_ingest_gpu"
    "$B/main/tests/integration/test_xfer_gpu")
for p in "${progs[@]}"; do
    [ -x "$p" ] || { echo "stage: $p was not built" >&2; exit 1; }
    cp "$p" "$DIR/bin/"
    strip "$DIR/bin/$(basename "$p")"
done
mods=()
for m in /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0; do
    [ -e "$m" ] && mods+=("$m")
done
# Every library the programs and the modules need, but the C library's own and the driver's.
for f in "${progs[@]}" "${mods[@]}"; do
    ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
    case $(basename "$lib") in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libcuda.so.*) ;;
    libstdc++.so.* | libgcc_s.so.*) ;; # the GPU machine's own are newer
    *) cp -L "$lib" "$DIR/lib/" ;;
    esac
done
for m in "${mods[@]}"; do
    cp -L "$m" "$DIR/lib/ucx/"
done
# What the binaries were built from (the GPU machine's copy of .git may be older).
{
    git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null || echo "no git"
    git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | grep -q . &&
        echo "with uncommitted changes"
} >"$DIR/BUILT_FROM"
echo "== staged in $DIR: $(du -sh "$DIR" | cut -f1), built from $(head -n 1 "$DIR/BUILT_FROM")"
ls "$DIR/bin"
