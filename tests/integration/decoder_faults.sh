#!/bin/sh
# decoder_faults.sh — the cache is an optimisation, never a dependency (issue 7, item 6):
#  - kvstashd unreachable: the workload still answers, prefills every prompt in full,
#    says so on stderr and in its report, exits 0 with reused_tokens=0 and the exact
#    no-cache quality (top1=1, kl=0);
#  - a block that fails its checksum (kvstashd with a tiny memory tier demotes blocks to
#    SSD files; the test flips a byte in every file): the fetch is abandoned and the
#    prompt recomputed, never served from the bad block — the server counts the drops,
#    the decoder counts the recomputations, and quality stays what int8 gives; then the
#    same with the blocks fetched over UCX (--ucx).
# Usage: decoder_faults.sh KVSTASH_DECODER KVSTASHD KVSTASH_CLI MODEL_DIR
set -u
DEC=$1
KVSTASHD=$2
CLI=$3
MODELS=$4
M="$MODELS/stories260K.bin"
[ -r "$M" ] || { echo "skip: $M not found"; exit 77; }
. "$(dirname "$0")/lib.sh"
kvs_init decfault
export OMP_NUM_THREADS=2
export UCX_TLS="${UCX_TLS:-tcp}" # step 3: the transport decoder_ucx uses
W="--conversations 8 --turns 3 --gen 8"

# 1. Nobody listens on the port (held bound without listen(): kvs_dead_addr).
kvs_dead_addr
GONE=$DEAD_ADDR
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$GONE" $W
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
[ $RC -eq 0 ] && [ "$(field "$LAST" reused_tokens)" = 0 ] && [ "$(field "$LAST" top1)" = 1.000000 ] \
    && printf '%s\n' "$ERR" | grep -q "unavailable.*prefilled in full" \
    && printf '%s\n' "$OUT" | grep -q "^cache trouble: server unreachable" \
    && ok "server down: full prefill, said on stderr and in the report, exact answers" \
    || not_ok "server down: rc=$RC last='$LAST' err='$ERR'"

# 2. Corrupted blocks on the SSD tier.
mkdir "$TMP/ssd"
kvs_start ssd --capacity 1MiB --ssd-dir "$TMP/ssd"
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" $W
FIRST=$(printf '%s\n' "$OUT" | tail -n 1)
NFILES=$(ls "$TMP/ssd" | wc -l)
[ $RC -eq 0 ] && [ "$NFILES" -gt 0 ] \
    && ok "first run stored blocks; $NFILES demoted to SSD files" \
    || not_ok "first run: rc=$RC files=$NFILES err='$ERR'"
for f in "$TMP"/ssd/*; do
    printf '\377' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
done
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" $W
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
NREC=$(printf '%s\n' "$OUT" | sed -n 's/^cache trouble: \([0-9]*\) fetch(es) abandoned and recomputed.*/\1/p')
[ $RC -eq 0 ] && [ -n "$NREC" ] && [ "$NREC" -gt 0 ] \
    && printf '%s\n' "$ERR" | grep -q "fetch failed (DATA_LOSS.*corrupted.*prefilling the prompt" \
    && ok "corrupted blocks: $NREC fetch(es) abandoned and recomputed, said on stderr" \
    || not_ok "corrupt run: rc=$RC last='$LAST' trouble='$NREC' err='$ERR'"
DROPPED=$("$CLI" --server "$ADDR" stats | sed -n 's/^kvstash_store_corrupt_dropped_total \([0-9]*\)$/\1/p')
[ -n "$DROPPED" ] && [ "$DROPPED" -ge "$NREC" ] \
    && ok "kvstashd dropped $DROPPED bad SSD copies (never served)" \
    || not_ok "corrupt_dropped_total '$DROPPED' < recomputed '$NREC'"
# Quality with recomputed prompts is that of int8 reuse or better, never garbage.
T1=$(field "$LAST" top1)
awk "BEGIN { exit !($T1 >= 0.95) }" && ok "answers stay good (top1 $T1; first run $(field "$FIRST" top1))" \
    || not_ok "top1 after corruption $T1"

kvs_stop
[ "$RC" -eq 0 ] && ok "kvstashd exits 0" || not_ok "kvstashd exit $RC"

# 3. Step 2 over the UCX data plane (--ucx: the blocks are decoded straight into the KV
#    pages), against a fresh server: the bad blocks' fetches are abandoned as well.
mkdir "$TMP/ssd2"
kvs_start ssd2 --capacity 1MiB --ssd-dir "$TMP/ssd2"
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" --ucx $W
NFILES=$(ls "$TMP/ssd2" | wc -l)
[ $RC -eq 0 ] && [ "$NFILES" -gt 0 ] || not_ok "--ucx first run: rc=$RC files=$NFILES err='$ERR'"
for f in "$TMP"/ssd2/*; do
    printf '\377' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
done
# shellcheck disable=SC2086
run "$DEC" workload --model "$M" --server "$ADDR" --ucx $W
ULAST=$(printf '%s\n' "$OUT" | tail -n 1)
UREC=$(printf '%s\n' "$OUT" | sed -n 's/^cache trouble: \([0-9]*\) fetch(es) abandoned and recomputed.*/\1/p')
SENT=$("$CLI" --server "$ADDR" stats kvstash_xfer_blocks_sent_total 2>/dev/null |
       sed -n 's/^kvstash_xfer_blocks_sent_total \([0-9.e+]*\).*/\1/p' | head -n 1)
[ $RC -eq 0 ] && [ -n "$UREC" ] && [ "$UREC" -gt 0 ] \
    && printf '%s\n' "$ERR" | grep -q "fetch failed (DATA_LOSS.*prefilling the prompt" \
    && awk -v t="$(field "$ULAST" top1)" 'BEGIN { exit !(t >= 0.95) }' \
    && [ -n "$SENT" ] && [ "$SENT" != "0" ] \
    && ok "--ucx, corrupted blocks: $UREC fetch(es) abandoned and recomputed, top1 $(field "$ULAST" top1) ($SENT blocks sent over UCX)" \
    || not_ok "--ucx corrupt run: rc=$RC last='$ULAST' trouble='$UREC' sent='$SENT' err='$ERR'"
kvs_stop
[ "$RC" -eq 0 ] && ok "kvstashd exits 0 (--ucx)" || not_ok "kvstashd (--ucx) exit $RC"
exit $FAILED
