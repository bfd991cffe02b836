#!/bin/sh
# cli_data_test.sh — the `kvstash` data commands against a real kvstashd:
# put, lookup, get, delete, pin, unpin and bench, and their usage errors.
# Usage: cli_data_test.sh /path/to/kvstashd /path/to/kvstash
# Each check prints "ok - ..." or "not ok - ..."; exit 1 when any failed.
set -u
KVSTASHD=$1
KVSTASH=$2
. "$(dirname "$0")/lib.sh"
kvs_init clidata

kvs_start kvstashd
K="$KVSTASH --server 127.0.0.1:$PORT --timeout-ms 10000"
NS="--model cli-data --layers 2 --kv-heads 2 --head-dim 64 --block-tokens 16"

# A prompt of 3 full blocks and a 7-token tail, and an fp16 payload for its blocks
# (block, layer, K then V, 16 x 2 x 64 halfs each), values in [-2, 2].
seq 1000 1054 | tr '\n' ' ' >"$TMP/tokens"
/usr/bin/python3 - "$TMP/data.bin" <<'PY' || { echo "not ok - python payload"; exit 1; }
import random, struct, sys
rng = random.Random(5)
n = 3 * 2 * 2 * 16 * 2 * 64
open(sys.argv[1], "wb").write(struct.pack("<%de" % n, *[rng.uniform(-2, 2) for _ in range(n)]))
PY

run $K put $NS --tokens-file "$TMP/tokens" --data "$TMP/data.bin" --scheme fp16
[ $RC -eq 0 ] && [ "$(printf '%s\n' "$OUT" | grep -c '^put block [0-2] [0-9a-f]\{64\} ')" -eq 3 ] \
    && printf '%s\n' "$OUT" | grep -q '^put 3 blocks (48 tokens)' \
    && ok "put --data --scheme fp16 stores the 3 full blocks" || not_ok "put: rc=$RC out='$OUT' err='$ERR'"
PUT_KEYS=$(printf '%s\n' "$OUT" | awk '/^put block/ {print $4}')

run $K lookup $NS --tokens-file "$TMP/tokens" --lease-ms 60000
LEASE=$(printf '%s\n' "$OUT" | sed -n 's/.* lease_id=\([0-9]*\) lease_ms=60000$/\1/p')
LOOKUP_KEYS=$(printf '%s\n' "$OUT" | awk '/^block/ {print $3}')
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^matched_blocks=3 matched_tokens=48 of 55 tokens' \
    && [ "$LOOKUP_KEYS" = "$PUT_KEYS" ] && printf '%s\n' "$OUT" | grep -q 'scheme=fp16' \
    && [ -n "$LEASE" ] && ok "lookup matches 3 blocks with the keys put printed, lease $LEASE for 60 s" \
    || not_ok "lookup: rc=$RC out='$OUT' err='$ERR'"

run $K get $NS --tokens-file "$TMP/tokens" --out "$TMP/got.bin" --format fp16
[ $RC -eq 0 ] && cmp -s "$TMP/data.bin" "$TMP/got.bin" \
    && ok "get --format fp16 of an fp16 block writes back the put file byte for byte" \
    || not_ok "get: rc=$RC out='$OUT' err='$ERR'"

run $K get $NS --tokens-file "$TMP/tokens" --out "$TMP/got32.bin" --format fp32
[ $RC -eq 0 ] && [ "$(wc -c <"$TMP/got32.bin")" -eq $((2 * $(wc -c <"$TMP/data.bin"))) ] \
    && ok "get --format fp32 writes twice the bytes" || not_ok "get fp32: rc=$RC err='$ERR'"

run $K get $NS --out "$TMP/x.bin" $(printf '%s\n' "$PUT_KEYS" | sed -n 2p)
head -c 32768 "$TMP/data.bin" | tail -c 16384 >"$TMP/block1.bin"
[ $RC -eq 0 ] && cmp -s "$TMP/x.bin" "$TMP/block1.bin" \
    && ok "get by hex key fetches exactly that block (the second)" || not_ok "get by key: rc=$RC err='$ERR'"

run $K put $NS --tokens-file "$TMP/tokens" --data "$TMP/got32.bin"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'holds 98304 bytes; 3 blocks x 2 layers x (K+V) x 4096 bytes = 49152' \
    && ok "put --data of the wrong size is refused with the sizes" || not_ok "put bad size: rc=$RC err='$ERR'"

LEAF=$(printf '%s\n' "$PUT_KEYS" | tail -1)
ROOT=$(printf '%s\n' "$PUT_KEYS" | head -1)
run $K pin $NS "$ROOT" --ttl-ms 0 --priority 5
[ $RC -eq 0 ] && [ "$OUT" = "pinned: 1 of 1 block(s)" ] && ok "pin KEY" || not_ok "pin: rc=$RC out='$OUT' err='$ERR'"
run $K unpin $NS "$ROOT"
[ $RC -eq 0 ] && [ "$OUT" = "unpinned: 1 of 1 block(s)" ] && ok "unpin KEY" || not_ok "unpin: rc=$RC out='$OUT' err='$ERR'"

run $K delete $NS "$LEAF"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'failed precondition: FAILED_PRECONDITION: .*leased' \
    && ok "delete of a block under a Lookup lease is refused" || not_ok "delete leased: rc=$RC err='$ERR'"
run $K unpin $NS --lease-id "$LEASE"
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '(lease released)' && ok "unpin --lease-id ends the lease" \
    || not_ok "unpin lease: rc=$RC out='$OUT' err='$ERR'"
run $K delete $NS "$LEAF"
[ $RC -eq 0 ] && [ "$OUT" = "deleted: 1 of 1 block(s)" ] && ok "delete the leaf block" \
    || not_ok "delete leaf: rc=$RC out='$OUT' err='$ERR'"
run $K lookup $NS --tokens-file "$TMP/tokens" --lease-ms 1
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^matched_blocks=2 ' \
    && ok "after deleting the leaf, lookup matches 2 blocks" || not_ok "lookup after delete: out='$OUT' err='$ERR'"
run $K delete $NS --tokens-file "$TMP/tokens" --subtree
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^deleted: [12] of 2 block(s)' \
    && ok "delete --subtree by prompt" || not_ok "delete subtree: rc=$RC out='$OUT' err='$ERR'"
run $K lookup $NS --tokens-file "$TMP/tokens"
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^matched_blocks=0 ' \
    && ok "after delete --subtree nothing matches" || not_ok "lookup after subtree: out='$OUT'"
run $K get $NS --tokens-file "$TMP/tokens" --out "$TMP/none.bin"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'not found: no block of the prompt is cached' \
    && ok "get of an uncached prompt: not found" || not_ok "get uncached: rc=$RC err='$ERR'"

run $K put $NS --random-tokens 64 --seed 9
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^put 4 blocks' && ok "put --random-tokens with random data" \
    || not_ok "put random: rc=$RC err='$ERR'"

run $K bench $NS --clients 4 --requests 40 --prompt-blocks 4 --prefixes 2
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^RESULT requests_per_s=[0-9.]* .* hit_rate=0\.[0-9]* errors=0$' \
    && ! printf '%s\n' "$OUT" | grep -q 'hit_rate=0.0000' \
    && ok "bench: 4 clients, 40 requests, hits and no errors" || not_ok "bench: rc=$RC out='$OUT' err='$ERR'"

# Usage errors: exit 2 with a message.
usage() { # MESSAGE args...
    msg=$1
    shift
    run $K "$@"
    [ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q -- "$msg" && ok "usage error: $msg" \
        || not_ok "usage '$*': rc=$RC err='$ERR'"
}
usage "lookup: needs a prompt" lookup $NS
usage "key 0: expected 64 hex digits" delete $NS abcd
usage "unknown option '--frobnicate'" put $NS --frobnicate 1
usage "get: --out FILE is required" get $NS --tokens 1,2
usage "--dtype: expected fp16, bf16 or fp32" lookup --dtype fp64 --tokens 1
usage "token 1 is not an integer" lookup $NS --tokens 1,x
usage "--block-tokens: expected an integer in 16..1024" lookup --block-tokens 8 --tokens 1
usage "--prefix-share: expected a number in \[0, 1\]" bench --prefix-share 2
# the server's own bounds (data_keys.c: priority -128..127, where negatives act as 0;
# leases and TTLs at most 24 h) are usage errors, not a server refusal (exit 1)
usage "pin: --priority: expected an integer in 0..127" pin $NS "$ROOT" --priority 128
usage "pin: --ttl-ms: expected an integer in 0..86400000" pin $NS "$ROOT" --ttl-ms 86400001
usage "lookup: --lease-ms: expected an integer in 0..86400000" lookup $NS --tokens 1 --lease-ms 86400001

kvs_stop
[ $RC -eq 0 ] && ok "kvstashd exits 0 on SIGTERM" || not_ok "kvstashd exit $RC"
exit $FAILED
