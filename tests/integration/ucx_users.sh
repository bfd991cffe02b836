#!/bin/sh
# ucx_users.sh — UCX shared memory on one host and user IDs (docs/OPERATIONS.md "UCX and
# user IDs"). UCX's shared memory segments are their user's alone, so a worker under
# another user than kvstashd cannot use UCX on the same host: its Connect is refused
# with FAILED_PRECONDITION and a reason, kvstashd logs one WARN naming the cause, and
# the worker gets every block over gRPC (the decoder's workload still runs to its
# RESULT line, nothing over UCX). A worker under kvstashd's user fetches over UCX.
# kvstashd runs as nobody (setpriv), its binaries and the model copied where nobody can
# read them. Needs root and setpriv; exits 77 otherwise, or without the model.
# Usage: ucx_users.sh KVSTASH_DECODER KVSTASHD KVSTASH_CLI MODEL_DIR.
set -u
DEC=$1
KVSTASHD_BUILT=$2
CLI=$3
MODELS=$4
M="$MODELS/stories260K.bin"
[ -r "$M" ] || { echo "skip: $M not found"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "skip: needs root (to run kvstashd as nobody)"; exit 77; }
command -v setpriv >/dev/null 2>&1 || { echo "skip: no setpriv"; exit 77; }
. "$(dirname "$0")/lib.sh"
kvs_init ucxusers
unset UCX_TLS UCX_NET_DEVICES # the default on loopback: shared memory only
AS_NOBODY="setpriv --reuid=nobody --regid=nogroup --clear-groups"
chmod 1777 "$TMP" # kvstashd, as nobody, writes its port file here
mkdir -m 755 "$TMP/run" "$TMP/bin"
BIN=$(dirname "$KVSTASHD_BUILT")
for f in kvstashd kvstash-xferd kvstash-ucx-addrcheck; do
    cp "$BIN/$f" "$TMP/bin/$f" || { not_ok "copy $f"; exit 1; }
done
cp "$DEC" "$TMP/bin/kvstash-decoder" && cp "$M" "$TMP/run/model.bin" || { not_ok "copy"; exit 1; }
chmod 755 "$TMP/bin" "$TMP/bin/"*
chmod 644 "$TMP/run/model.bin"
KVSTASHD="$TMP/bin/kvstashd"
sent() { "$CLI" --server "$ADDR" stats kvstash_xfer_blocks_sent_total 2>/dev/null |
         sed -n 's/^kvstash_xfer_blocks_sent_total \([0-9.e+]*\).*/\1/p' | head -n 1; }
W="--conversations 3 --turns 2 --gen 4 --scheme int8"

KVS_START_PREFIX=$AS_NOBODY kvs_start asnobody
UID_RUN=$(awk '/^Uid:/ { print $2 }' "/proc/$PID/status")
if [ "$UID_RUN" = "$(id -u nobody)" ]; then
    ok "kvstashd runs as nobody"
else
    not_ok "kvstashd runs as uid '$UID_RUN'"
fi

# a worker under another user (root): refused with the reason, served over gRPC
# shellcheck disable=SC2086
run "$TMP/bin/kvstash-decoder" workload --model "$TMP/run/model.bin" --server "$ADDR" --ucx $W
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
S0=$(sent)
if [ $RC -eq 0 ] && [ "$(field "$LAST" reused_tokens)" -gt 0 ] 2>/dev/null && [ "$S0" = "0" ]; then
    ok "a worker under another user gets its blocks over gRPC ($(field "$LAST" reused_tokens) tokens reused, none over UCX)"
else
    not_ok "another user: rc=$RC last='$LAST' sent='$S0' err='$ERR'"
fi
if grep -q "UCX cannot attach the worker's shared memory (permission denied): the worker runs as another user" "$TMP/asnobody.log"; then
    ok "kvstashd says why"
else
    not_ok "no WARN naming the other user in kvstashd's log"
fi

# a worker under kvstashd's user: over UCX
# shellcheck disable=SC2086
run $AS_NOBODY "$TMP/bin/kvstash-decoder" workload --model "$TMP/run/model.bin" \
    --server "$ADDR" --ucx $W --salt same
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
S1=$(sent)
if [ $RC -eq 0 ] && [ -n "$S1" ] && awk -v b="$S1" 'BEGIN { exit !(b > 0) }'; then
    ok "a worker under kvstashd's user fetches over UCX ($S1 blocks)"
else
    not_ok "same user: rc=$RC last='$LAST' sent='$S1' err='$ERR'"
fi
kvs_stop

# the same with UCX inside kvstashd (ucx_isolate = off): refused alike
KVS_START_PREFIX=$AS_NOBODY kvs_start inproc --ucx-isolate off
# shellcheck disable=SC2086
run "$TMP/bin/kvstash-decoder" workload --model "$TMP/run/model.bin" --server "$ADDR" --ucx $W \
    --salt inproc
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
S2=$(sent)
if [ $RC -eq 0 ] && [ "$(field "$LAST" reused_tokens)" -gt 0 ] 2>/dev/null && [ "$S2" = "0" ] \
    && grep -q "UCX cannot attach the worker's shared memory (permission denied)" "$TMP/inproc.log"; then
    ok "ucx_isolate = off: another user's worker refused with the reason, served over gRPC"
else
    not_ok "ucx_isolate = off: rc=$RC last='$LAST' sent='$S2' log='$(cat "$TMP/inproc.log")'"
fi
exit $FAILED
