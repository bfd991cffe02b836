#!/bin/sh
# decoder_ucx.sh — the reference decoder's workload fetching its reused KV over the
# UCX data plane (kvstash-decoder --ucx: kvs_client_fetch) gives exactly the figures
# of the same workload over gRPC Get (top-1, KL, reused tokens), against two fresh
# kvstashd (each run stores, then reuses, the same blocks), and the UCX run's blocks
# really came over UCX (kvstash_xfer_blocks_sent_total > 0 on its server; none on the
# gRPC run's). Usage: decoder_ucx.sh KVSTASH_DECODER KVSTASHD KVSTASH_CLI MODEL_DIR.
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
# shellcheck disable=SC2086
G=$("$DEC" workload --model "$M" --server "$GADDR" $W 2>"$TMP/g.err" | tail -n 1)
kvs_start ucx
UADDR=$ADDR
# shellcheck disable=SC2086
U=$("$DEC" workload --model "$M" --server "$UADDR" --ucx $W 2>"$TMP/u.err" | tail -n 1)
RG=$(field "$G" reused_tokens)
if [ -n "$RG" ] && [ "$RG" -gt 0 ] && [ "$(field "$U" top1)" = "$(field "$G" top1)" ] \
    && [ "$(field "$U" kl)" = "$(field "$G" kl)" ] \
    && [ "$(field "$U" reused_tokens)" = "$RG" ]; then
    ok "--ucx equals gRPC Get ($RG tokens reused, top1=$(field "$U" top1), kl=$(field "$U" kl))"
else
    not_ok "--ucx: '$U' vs gRPC: '$G' ($(cat "$TMP/u.err" "$TMP/g.err"))"
fi
SU=$(sent "$UADDR")
SG=$(sent "$GADDR")
if [ -n "$SU" ] && [ "$SU" != "0" ] && [ "$SG" = "0" ]; then
    ok "the --ucx run's blocks came over UCX ($SU blocks; gRPC run: $SG)"
else
    not_ok "kvstash_xfer_blocks_sent_total: --ucx run '$SU', gRPC run '$SG'"
fi
exit $FAILED
