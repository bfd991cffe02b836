#!/bin/sh
# decoder_server.sh — kvstash-decoder's workload through a real kvstashd (item 2 of the
# decoder: Lookup, Get by layer into the paged cache, chained asynchronous Put).
# Usage: decoder_server.sh KVSTASH_DECODER KVSTASHD MODEL_DIR
#
# The server quantizes on ingest with the same kernels and defaults that
# --local-quant uses in-process, so for each scheme the server run must give exactly
# the local run's RESULT figures (top-1, KL, reused tokens) and store as many bytes.
# A second run against the same server finds the blocks the first one stored. Fetching
# as fp16 (an extra rounding) still works. A server with skip_layers and v_outliers set
# equals --local-quant with --skip-layers and --v-outliers; one with key_offsets on equals
# --local-quant with --k-offsets. An unreachable server means full prefill
# (said on stderr); bad options fail with a message. Each check prints "ok - ..." or "not ok - ..."; exit 1 when any
# failed, 77 when the model is not there.
set -u
DEC=$1
KVSTASHD=$2
MODELS=$3
M="$MODELS/stories260K.bin"
[ -r "$M" ] || { echo "skip: $M not found"; exit 77; }
. "$(dirname "$0")/lib.sh"
kvs_init decsrv
export OMP_NUM_THREADS=2

kvs_start kvstashd
W="--conversations 8 --turns 3 --gen 8"

for s in int8 fp8_e4m3 fp16; do
    # shellcheck disable=SC2086
    run "$DEC" workload --model "$M" --local-quant $s $W
    LRC=$RC
    LOCAL=$(printf '%s\n' "$OUT" | tail -n 1)
    LBYTES=$(printf '%s\n' "$OUT" | sed -n 's/^stored [0-9]* blocks, \([0-9]*\) bytes.*/\1/p')
    # shellcheck disable=SC2086
    run "$DEC" workload --model "$M" --server "$ADDR" --scheme $s $W
    SERVER=$(printf '%s\n' "$OUT" | tail -n 1)
    SBYTES=$(printf '%s\n' "$OUT" | sed -n 's/^server stored [0-9]* blocks (0 already present), \([0-9]*\) bytes.*/\1/p')
    if [ $LRC -eq 0 ] && [ $RC -eq 0 ] && [ -n "$(field "$SERVER" reused_tokens)" ] && [ "$(field "$SERVER" reused_tokens)" -gt 0 ] \
        && [ "$(field "$SERVER" top1)" = "$(field "$LOCAL" top1)" ] \
        && [ "$(field "$SERVER" kl)" = "$(field "$LOCAL" kl)" ] \
        && [ "$(field "$SERVER" reused_tokens)" = "$(field "$LOCAL" reused_tokens)" ] \
        && [ -n "$SBYTES" ] && [ "$SBYTES" = "$LBYTES" ]; then
        ok "$s through kvstashd equals --local-quant $s ($(field "$SERVER" reused_tokens) tokens reused, $SBYTES bytes stored)"
    else
        not_ok "$s: rc=$RC (local $LRC) server='$SERVER' ($SBYTES bytes) local='$LOCAL' ($LBYTES bytes) err='$ERR'"
    fi
done

# an fp16 KV cache and fp16 blocks: exact through the server too
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" --scheme fp16 --kv-dtype fp16 --salt kv16 $W
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
[ $RC -eq 0 ] && printf '%s\n' "$LAST" | grep -Eq '^RESULT scheme=fp16 top1=1.000000 kl=0.000000e\+00 .* reused_tokens=[1-9]' \
    && ok "fp16 KV cache, fp16 blocks through kvstashd: exact" || not_ok "kv16: rc=$RC last='$LAST' err='$ERR'"

# the same workload again: the blocks are there, nothing new is stored
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" --scheme int8 $W -v
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q "^server stored 0 blocks ([1-9][0-9]* already present), 0 bytes" \
    && ! printf '%s\n' "$OUT" | grep -q "^request conv=0 turn=0 .* reused=0 " \
    && ok "a second run finds the first run's blocks (conversation 0 turn 0 reuses)" \
    || not_ok "second run: rc=$RC out='$(printf '%s\n' "$OUT" | grep -E '^server|conv=0 turn=0')' err='$ERR'"

# fp16 egress of int8 blocks: a different salt, so a fresh namespace
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" --scheme int8 --egress fp16 --salt egress16 $W
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
[ $RC -eq 0 ] && [ "$(field "$LAST" reused_tokens)" -gt 0 ] \
    && awk -v k="$(field "$LAST" kl)" 'BEGIN { exit !(k > 0 && k < 5e-3) }' \
    && ok "Get as fp16 works (kl $(field "$LAST" kl))" || not_ok "egress fp16: rc=$RC last='$LAST' err='$ERR'"

# layers kept at fp16: kvstashd's skip_layers (and v_outliers) equal the decoder's
# --skip-layers (and --v-outliers) under --local-quant, to the byte
kvs_stop
kvs_start kvstashd --skip-layers 0,2-3 --v-outliers 0
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --local-quant int8 --skip-layers 0,2-3 --v-outliers 0 $W
LRC=$RC
LOCAL=$(printf '%s\n' "$OUT" | tail -n 1)
LBYTES=$(printf '%s\n' "$OUT" | sed -n 's/^stored [0-9]* blocks, \([0-9]*\) bytes.*/\1/p')
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --local-quant int8 $W
PRC=$RC
PLAIN=$(printf '%s\n' "$OUT" | tail -n 1)
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" --scheme int8 $W
SERVER=$(printf '%s\n' "$OUT" | tail -n 1)
SBYTES=$(printf '%s\n' "$OUT" | sed -n 's/^server stored [0-9]* blocks (0 already present), \([0-9]*\) bytes.*/\1/p')
if [ $LRC -eq 0 ] && [ $PRC -eq 0 ] && [ $RC -eq 0 ] && [ "$(field "$SERVER" reused_tokens)" -gt 0 ] \
    && [ "$(field "$SERVER" top1)" = "$(field "$LOCAL" top1)" ] \
    && [ "$(field "$SERVER" kl)" = "$(field "$LOCAL" kl)" ] \
    && [ "$(field "$SERVER" kl)" != "$(field "$PLAIN" kl)" ] \
    && [ -n "$SBYTES" ] && [ "$SBYTES" = "$LBYTES" ]; then
    ok "kvstashd --skip-layers 0,2-3 --v-outliers 0 equals --local-quant with the same ($SBYTES bytes stored)"
else
    not_ok "skip layers: rc=$RC (local $LRC, plain $PRC) server='$SERVER' ($SBYTES bytes) local='$LOCAL' ($LBYTES bytes) plain='$PLAIN' err='$ERR'"
fi

# per-channel key offsets: kvstashd's key_offsets equals the decoder's --k-offsets
# under --local-quant, to the byte, for both 8-bit schemes; and it is not the plain run
kvs_stop
kvs_start kvstashd --key-offsets on
for s in int8 fp8_e4m3; do
    # shellcheck disable=SC2086
    run "$DEC" workload --model "$M" --local-quant $s --k-offsets $W
    LRC=$RC
    LOCAL=$(printf '%s\n' "$OUT" | tail -n 1)
    LBYTES=$(printf '%s\n' "$OUT" | sed -n 's/^stored [0-9]* blocks, \([0-9]*\) bytes.*/\1/p')
    # shellcheck disable=SC2086
    run "$DEC" workload --model "$M" --local-quant $s $W
    PRC=$RC
    PBYTES=$(printf '%s\n' "$OUT" | sed -n 's/^stored [0-9]* blocks, \([0-9]*\) bytes.*/\1/p')
    # shellcheck disable=SC2086
    run "$DEC" workload --model "$M" --server "$ADDR" --scheme $s --salt koff-$s $W
    SERVER=$(printf '%s\n' "$OUT" | tail -n 1)
    SBYTES=$(printf '%s\n' "$OUT" | sed -n 's/^server stored [0-9]* blocks (0 already present), \([0-9]*\) bytes.*/\1/p')
    if [ $LRC -eq 0 ] && [ $PRC -eq 0 ] && [ $RC -eq 0 ] && [ "$(field "$SERVER" reused_tokens)" -gt 0 ] \
        && [ "$(field "$SERVER" top1)" = "$(field "$LOCAL" top1)" ] \
        && [ "$(field "$SERVER" kl)" = "$(field "$LOCAL" kl)" ] \
        && [ -n "$SBYTES" ] && [ "$SBYTES" = "$LBYTES" ] && [ -n "$PBYTES" ] && [ "$SBYTES" -gt "$PBYTES" ]; then
        ok "kvstashd --key-offsets on equals --local-quant $s --k-offsets ($SBYTES bytes stored, $PBYTES without)"
    else
        not_ok "key offsets $s: rc=$RC (local $LRC, plain $PRC) server='$SERVER' ($SBYTES bytes) local='$LOCAL' ($LBYTES bytes, plain $PBYTES) err='$ERR'"
    fi
done

# errors
kvs_stop
kvs_dead_addr
run "$DEC" workload --model "$M" --server "$DEAD_ADDR" --conversations 1 --turns 1
[ $RC -eq 0 ] && [ "$(field "$(printf '%s\n' "$OUT" | tail -n 1)" reused_tokens)" = 0 ] \
    && printf '%s\n' "$ERR" | grep -q "unavailable" \
    && ok "nobody listening: full prefill, said on stderr (decoder_faults has more)" \
    || not_ok "no server: rc=$RC err='$ERR'"
run "$DEC" workload --model "$M" --scheme int8
[ $RC -eq 2 ] && ok "--scheme without --server: usage error" || not_ok "scheme alone: rc=$RC"
run "$DEC" workload --model "$M" --server "$ADDR" --local-quant int8
[ $RC -eq 2 ] && ok "--server with --local-quant: usage error" || not_ok "server+local: rc=$RC"
run "$DEC" workload --model "$M" --server "$ADDR" --egress fp8
[ $RC -eq 2 ] && ok "--egress fp8: usage error" || not_ok "egress fp8: rc=$RC"

exit $FAILED
