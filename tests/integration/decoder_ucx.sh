#!/bin/sh
# decoder_ucx.sh — the reference decoder's workload fetching its reused KV over the
# UCX data plane (kvstash-decoder --ucx: kvs_client_fetch_into) gives exactly the figures
# of the same workload over gRPC Get (top-1, KL, reused tokens), against two fresh
# kvstashd (each run stores, then reuses, the same blocks), and the UCX run's blocks
# really came over UCX (kvstash_xfer_blocks_sent_total > 0 on its server; none on the
# gRPC run's). Over UCX too, fp16 blocks in an fp16 KV cache give exactly the
# no-cache logits, and --egress fp16 gives the gRPC run's figures (that one with
# KVSTASH_CPU_ISA=portable).
# Usage: decoder_ucx.sh KVSTASH_DECODER KVSTASHD KVSTASH_CLI MODEL_DIR.
# Prints "ok - ..." / "not ok - ..."; exit 1 when any failed, 77 without the model.
set -u
DEC=$1
KVSTASHD=$2
CLI=$3
MODELS=$4
M="$MODELS/stories260K.bin"
[ -r "$M" ] || { echo "skip: $M not found"; exit 77; }
. "$(dirname "$0")/lib.sh"
kvs_init decucx
export OMP_NUM_THREADS=2
sent() { "$CLI" --server "$1" stats kvstash_xfer_blocks_sent_total 2>/dev/null |
         sed -n 's/^kvstash_xfer_blocks_sent_total \([0-9.e+]*\).*/\1/p' | head -n 1; }
W="--conversations 6 --turns 3 --gen 8 --scheme int8"

kvs_start grpc
GADDR=$ADDR
# (each run's exit status counts: a decoder that prints its RESULT line and then fails,
# e.g. a sanitizer report at exit, fails the check)
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$GADDR" $W
GRC=$RC GERR=$ERR
G=$(printf '%s\n' "$OUT" | tail -n 1)
kvs_start ucx
UADDR=$ADDR
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$UADDR" --ucx $W
URC=$RC
U=$(printf '%s\n' "$OUT" | tail -n 1)
RG=$(field "$G" reused_tokens)
if [ $GRC -eq 0 ] && [ $URC -eq 0 ] && [ -n "$RG" ] && [ "$RG" -gt 0 ] \
    && [ "$(field "$U" top1)" = "$(field "$G" top1)" ] \
    && [ "$(field "$U" kl)" = "$(field "$G" kl)" ] \
    && [ "$(field "$U" reused_tokens)" = "$RG" ]; then
    ok "--ucx equals gRPC Get ($RG tokens reused, top1=$(field "$U" top1), kl=$(field "$U" kl))"
else
    not_ok "--ucx: rc=$URC '$U' vs gRPC: rc=$GRC '$G' ($ERR $GERR)"
fi
SU=$(sent "$UADDR")
SG=$(sent "$GADDR")
if [ -n "$SU" ] && [ "$SU" != "0" ] && [ "$SG" = "0" ]; then
    ok "the --ucx run's blocks came over UCX ($SU blocks; gRPC run: $SG)"
else
    not_ok "kvstash_xfer_blocks_sent_total: --ucx run '$SU', gRPC run '$SG'"
fi

# sealed fetches (--seal-fetches: kvstashd tags each layer, libkvstash checks it before
# the layer is used): the same figures, and the blocks came sealed over UCX
stat() { "$CLI" --server "$1" stats "$2" 2>/dev/null |
         sed -n "s/^$2 \([0-9.e+]*\).*/\1/p" | head -n 1; }
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$UADDR" --ucx --seal-fetches $W --salt sealed
SL=$(printf '%s\n' "$OUT" | tail -n 1)
SS=$(stat "$UADDR" kvstash_xfer_fetch_sealed_total)
if [ $RC -eq 0 ] && [ "$(field "$SL" top1)" = "$(field "$G" top1)" ] \
    && [ "$(field "$SL" kl)" = "$(field "$G" kl)" ] && [ "$(field "$SL" reused_tokens)" = "$RG" ] \
    && [ -n "$SS" ] && [ "$SS" != "0" ]; then
    ok "--ucx --seal-fetches equals gRPC Get ($SS blocks sealed)"
else
    not_ok "--seal-fetches: rc=$RC '$SL' vs '$G', sealed '$SS' err='$ERR'"
fi
run "$DEC" workload --model "$M" --server "$UADDR" --seal-fetches $W
[ $RC -eq 2 ] && ok "--seal-fetches without --ucx: usage error" \
    || not_ok "--seal-fetches without --ucx: rc=$RC"

# fp16 blocks into an fp16 KV cache over UCX: the reused pages are exactly what the
# cache would have computed, so the logits are the no-cache run's (kl exactly 0)
S0=$SU
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$UADDR" --ucx --conversations 6 --turns 3 --gen 8 \
    --scheme fp16 --kv-dtype fp16 --salt kv16
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
S1=$(sent "$UADDR")
if [ $RC -eq 0 ] && printf '%s\n' "$LAST" | grep -Eq '^RESULT scheme=fp16 top1=1.000000 kl=0.000000e\+00 .* reused_tokens=[1-9]' \
    && [ -n "$S1" ] && awk -v a="$S0" -v b="$S1" 'BEGIN { exit !(b > a) }'; then
    ok "--ucx, fp16 blocks, fp16 KV cache: the no-cache logits ($(field "$LAST" reused_tokens) tokens reused, $S0 -> $S1 blocks sent over UCX)"
else
    not_ok "--ucx kv16: rc=$RC last='$LAST' sent $S0 -> '$S1' err='$ERR'"
fi

# fp16 egress (each reused value rounded to fp16) is the same over UCX as over gRPC Get,
# and really rounds: int8 blocks then give another KL than with fp32 egress. The gRPC
# run uses the portable CPU path, so the pages' fp16 widening with F16C (AVX2 CPUs)
# is compared with the plain C one as well.
# shellcheck disable=SC2086
KVSTASH_CPU_ISA=portable run "$DEC" workload --model "$M" --server "$GADDR" $W --egress fp16 \
    --salt egress16
G16=$(printf '%s\n' "$OUT" | tail -n 1)
G16RC=$RC
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$UADDR" --ucx $W --egress fp16 --salt egress16
U16=$(printf '%s\n' "$OUT" | tail -n 1)
R16=$(field "$U16" reused_tokens)
if [ $G16RC -eq 0 ] && [ $RC -eq 0 ] && [ -n "$R16" ] && [ "$R16" = "$RG" ] \
    && [ "$(field "$U16" top1)" = "$(field "$G16" top1)" ] \
    && [ "$(field "$U16" kl)" = "$(field "$G16" kl)" ] \
    && [ "$(field "$U16" kl)" != "$(field "$U" kl)" ] \
    && awk -v k="$(field "$U16" kl)" 'BEGIN { exit !(k > 0 && k < 5e-3) }'; then
    ok "--ucx --egress fp16 equals gRPC ($R16 tokens reused, kl=$(field "$U16" kl); fp32 egress kl=$(field "$U" kl))"
else
    not_ok "--egress fp16: --ucx rc=$RC '$U16' vs gRPC rc=$G16RC '$G16' (fp32 egress '$U') err='$ERR'"
fi
exit $FAILED
