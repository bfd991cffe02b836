#!/bin/sh
# decoder_ttft.sh — TTFT and quality of reused KV, per scheme, medians over repetitions.
# Usage: decoder_ttft.sh KVSTASH_DECODER REPS MODEL_ARGS... [-- WORKLOAD_ARGS...]
#   e.g. decoder_ttft.sh build/clients/decoder/kvstash-decoder 5 --model stories260K.bin
#        decoder_ttft.sh ... 3 --synthetic-model dim=512,layers=8,heads=8,kv_heads=4,vocab=2048,seq=512 \
#             -- --conversations 8 --turns 3 --gen 8
#
# Each repetition runs `kvstash-decoder workload` once per scheme (fp16, fp8_e4m3,
# fp8_e5m2, int8), with --local-quant, or through a kvstashd when KVS_DECODER_SERVER is
# set to its host:port (--server ... --scheme S --salt S-rR: every repetition gets a
# fresh namespace, so each starts from an empty cache): every run measures its own fp32 no-cache
# baseline on the same prompts, so ttft_ratio is a same-run ratio. Every RESULT line is
# validated (format, reused_tokens > 0) before it is used. Prints one line per scheme
# with the median ttft_ratio, p50 TTFT, baseline p50 TTFT and quality (quality does not
# vary between repetitions: the arithmetic is deterministic), and exits 1 on any failure.
set -u
DEC=$1
REPS=$2
shift 2
MODEL_ARGS=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do MODEL_ARGS="$MODEL_ARGS $1"; shift; done
[ $# -gt 0 ] && shift
WL_ARGS="$*"
TMP=$(mktemp -d /tmp/kvs-ttft-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

for s in fp16 fp8_e4m3 fp8_e5m2 int8; do
    : >"$TMP/$s.ratio"; : >"$TMP/$s.ttft"; : >"$TMP/$s.base"
    r=1
    while [ $r -le "$REPS" ]; do
        if [ -n "${KVS_DECODER_SERVER:-}" ]; then
            CACHE="--server $KVS_DECODER_SERVER --scheme $s --salt $s-r$r-$$"
        else
            CACHE="--local-quant $s"
        fi
        # shellcheck disable=SC2086
        if ! "$DEC" workload $MODEL_ARGS $CACHE $WL_ARGS >"$TMP/out" 2>"$TMP/err"; then
            echo "decoder_ttft: $s run $r failed: $(cat "$TMP/err")"; exit 1
        fi
        LAST=$(tail -n 1 "$TMP/out")
        if ! printf '%s\n' "$LAST" | grep -Eq "^RESULT scheme=$s top1=[01]\.[0-9]{6} kl=[0-9.e+-]+ ttft_ratio=[0-9.]+ reused_tokens=[1-9][0-9]*\$"; then
            echo "decoder_ttft: $s run $r: bad RESULT line '$LAST'"; exit 1
        fi
        printf '%s\n' "$LAST" | sed 's/.*ttft_ratio=\([0-9.]*\).*/\1/' >>"$TMP/$s.ratio"
        sed -n 's/^TTFT ms: p50 \([0-9.]*\) .*baseline p50 \([0-9.]*\) .*/\1 \2/p' "$TMP/out" >"$TMP/t"
        cut -d' ' -f1 "$TMP/t" >>"$TMP/$s.ttft"
        cut -d' ' -f2 "$TMP/t" >>"$TMP/$s.base"
        r=$((r + 1))
    done
    REUSE=$(sed -n 's/^requests .* reused \([0-9]*\) (\([0-9.]*%\)).*/\1 (\2)/p' "$TMP/out")
    Q=$(printf '%s\n' "$LAST" | sed 's/.*\(top1=[^ ]*\) \(kl=[^ ]*\).*/\1 \2/')
    echo "$s: ttft_ratio median $(median <"$TMP/$s.ratio") (p50 TTFT $(median <"$TMP/$s.ttft") ms vs fp32 no-cache $(median <"$TMP/$s.base") ms), reused $REUSE, $Q"
done
head -n 1 "$TMP/out"
exit 0
