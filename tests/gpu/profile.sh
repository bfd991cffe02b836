#!/usr/bin/env bash
# tests/gpu/profile.sh OUTDIR — Nsight Compute profiles of the tile kernels on the large
# launches of kvq_tile_bw (KVS_GPU_BW_ONLY="big auto": 2048 tiles x T=256 and 256 x T=1024,
# D = 128, fp16, e4m3, k = 2), one launch each of the K quantize, V quantize and
# dequantize kernels (the first: the launch validated before timing), full section set.
# Programs from KVS_GPU_PREBUILT (tests/gpu/stage.sh) or KVS_GPU_BIN (a folder holding
# kvq_tile_bw). Writes OUTDIR/ncu_k.txt, ncu_v.txt, ncu_deq.txt (details pages) and prints
# a short digest of each. Needs ncu (PATH or /opt/nvidia/nsight-compute/*/ncu).
set -u -o pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 1
OUT=$(cd "$1" && pwd)
if [ -n "${KVS_GPU_PREBUILT:-}" ]; then
    BIN=$KVS_GPU_PREBUILT/bin
    export LD_LIBRARY_PATH="$KVS_GPU_PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    BIN=${KVS_GPU_BIN:?set KVS_GPU_PREBUILT or KVS_GPU_BIN}
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
[ -n "$NCU" ] || { echo "ncu not found" >&2; exit 1; }
export KVS_GPU_BW_ONLY=${KVS_GPU_BW_ONLY:-big auto}
rc=0
for kv in "k:quant_k_kernel" "v:quant_v_kernel" "deq:dequant_kernel"; do
    name=${kv%%:*}
    kern=${kv#*:}
    timeout 300 "$NCU" --clock-control none --set full -k "regex:$kern" -c 1 \
        "$BIN/kvq_tile_bw" >"$OUT/ncu_$name.txt" 2>&1 || rc=1
    echo "== $kern ($OUT/ncu_$name.txt)"
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Grid Size|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit Rate|L1/TEX Hit|Executed Ipc A|Dynamic Shared|Stall|Bank" \
        "$OUT/ncu_$name.txt" | grep -v -E "^ +(INF|OPT|WRN)" | head -n 40
done
exit $rc
