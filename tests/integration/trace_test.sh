#!/bin/sh
# trace_test.sh — `kvstashd --record-trace FILE`, then kvstash-sim replays it,
# then the chosen policy goes live with SetConfig: the loop of OPERATIONS.md.
# Usage: trace_test.sh /path/to/kvstashd /path/to/kvstash /path/to/kvstash-sim
#
# A scripted session through the CLI (block_tokens 16), each prompt looked up
# and then its blocks put, as a worker does:
#   A = 4 blocks; B = A's first 2 blocks + 2 new; C = 3 unrelated blocks; A again.
# then D = 2 blocks put without a Lookup. The recording must be exactly 4 lookup
# lines with ids [0,1,2,3] [0,1,4,5] [6,7,8] [0,1,2,3] (the Puts name blocks the
# Lookups already did: no lines) and 2 put lines [9] [9,10], with no token ids
# and no key bytes; the server's own hit count (6 of 15 blocks) must equal what
# kvstash-sim reports for the lookup lines at a capacity that evicts nothing; a
# capacity of 4 blocks must give less; and the best online policy at 4 blocks
# is set live with `kvstash config set policy=...`.
# Each check prints "ok - ..." or "not ok - ..."; exit 1 when any failed.
set -u
KVSTASHD=$1
KVSTASH=$2
SIM=$3
. "$(dirname "$0")/lib.sh"
kvs_init trace

kvs_start kvstashd --record-trace "$TMP/trace.jsonl"
K="$KVSTASH --server 127.0.0.1:$PORT --timeout-ms 10000"
NS="--model trace-test --layers 2 --kv-heads 2 --head-dim 32 --block-tokens 16"

A=$(seq 100 163 | tr '\n' ,)
B=$(seq 100 131 | tr '\n' ,)$(seq 500 531 | tr '\n' ,)
C=$(seq 900 947 | tr '\n' ,)
HITS=0
session() { # TOKENS
    run $K lookup $NS --tokens "$1" --lease-ms 1
    [ $RC -eq 0 ] || { not_ok "lookup: rc=$RC err='$ERR'"; return; }
    m=$(printf '%s\n' "$OUT" | sed -n 's/^matched_blocks=\([0-9]*\) .*/\1/p')
    HITS=$((HITS + m))
    run $K put $NS --tokens "$1"
    [ $RC -eq 0 ] || not_ok "put: rc=$RC err='$ERR'"
}
session "$A"
session "$B"
session "$C"
session "$A"
[ $HITS -eq 6 ] && ok "the session hit 6 of 15 blocks on the server" \
    || not_ok "the session hit $HITS blocks, want 6"
# A worker that puts without looking up: each new block writes its known chain.
run $K put $NS --tokens "$(seq 700 731 | tr '\n' ,)"
[ $RC -eq 0 ] || not_ok "put without lookup: rc=$RC err='$ERR'"

run $KVSTASH --server 127.0.0.1:$PORT stats kvstash_trace_lines_total
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^kvstash_trace_lines_total 6$' \
    && ok "stats: kvstash_trace_lines_total 6" || not_ok "trace lines metric: rc=$RC out='$OUT'"
kvs_stop
[ $RC -eq 0 ] && ok "kvstashd exits 0 on SIGTERM (trace closed)" || not_ok "kvstashd exit $RC"

IDS=$(sed 's/.*"hash_ids": \[\([0-9, ]*\)\].*/\1/' "$TMP/trace.jsonl" | tr -d ' ' | tr '\n' ';')
[ "$IDS" = "0,1,2,3;0,1,4,5;6,7,8;0,1,2,3;9;9,10;" ] \
    && ok "trace: 4 lookup lines [0,1,2,3] [0,1,4,5] [6,7,8] [0,1,2,3], then put lines [9] [9,10]" \
    || not_ok "trace ids '$IDS'; trace: $(cat "$TMP/trace.jsonl")"
[ "$(grep -c '"op": "lookup"' "$TMP/trace.jsonl")" -eq 4 ] \
    && [ "$(grep -c '"op": "put"' "$TMP/trace.jsonl")" -eq 2 ] \
    && [ "$(sed -n 6p "$TMP/trace.jsonl" | grep -c '"input_length": 32')" -eq 1 ] \
    && [ "$(sed -n 3p "$TMP/trace.jsonl" | grep -c '"input_length": 48')" -eq 1 ] \
    && grep -q '"timestamp": [0-9]' "$TMP/trace.jsonl" \
    && ok "trace lines carry timestamp, input_length (48 for C) and op" \
    || not_ok "trace members: $(cat "$TMP/trace.jsonl")"
! grep -q '"tokens"\|100, 101\|[0-9a-f]\{64\}' "$TMP/trace.jsonl" \
    && ok "trace holds no token ids and no key bytes" || not_ok "trace leaks tokens or keys"

grep '"op": "lookup"' "$TMP/trace.jsonl" >"$TMP/lookups.jsonl"
run "$SIM" --trace "$TMP/lookups.jsonl" --capacity-blocks 1000 --policy lru
[ $RC -eq 0 ] && [ "$OUT" = "policy=lru capacity=1000 hit=0.4000" ] \
    && ok "kvstash-sim on the lookup lines: lru at 1000 blocks hits 0.4000 = 6/15, as the server did" \
    || not_ok "kvstash-sim lookups: rc=$RC out='$OUT' err='$ERR'"
run "$SIM" --trace "$TMP/trace.jsonl" --capacity-blocks 4,1000 --policy all
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^policy=lru capacity=1000 hit=0.4000$' \
    && ok "kvstash-sim on the whole trace: lru at 1000 blocks 0.4000 = 6/15 (put lines insert, they are not requests)" \
    || not_ok "kvstash-sim: rc=$RC out='$OUT' err='$ERR'"
LRU4=$(printf '%s\n' "$OUT" | sed -n 's/^policy=lru capacity=4 hit=//p')
[ -n "$LRU4" ] && awk "BEGIN { exit !($LRU4 < 0.4000) }" \
    && ok "at 4 blocks lru hits less ($LRU4)" || not_ok "lru at 4 blocks: '$LRU4'"
BEST=$(printf '%s\n' "$OUT" | grep 'capacity=4 ' | grep -v 'policy=belady' \
    | sed 's/policy=\([a-z0-9]*\) capacity=4 hit=\(.*\)/\2 \1/' | sort -k1,1nr -k2 | head -1 | cut -d' ' -f2)
BELADY=$(printf '%s\n' "$OUT" | sed -n 's/^policy=belady capacity=4 hit=//p')
[ -n "$BEST" ] && [ -n "$BELADY" ] && ok "best online policy at 4 blocks: $BEST (belady $BELADY)" \
    || not_ok "no policy ranking: '$OUT'"

# The loop closes: the chosen policy goes live on a running server.
kvs_start live
run $KVSTASH --server "$ADDR" config set "policy=$BEST"
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q "^policy = $BEST " \
    && ok "kvstash config set policy=$BEST applied live" \
    || not_ok "config set policy=$BEST: rc=$RC out='$OUT' err='$ERR'"

run "$KVSTASHD" --listen 127.0.0.1:0 --record-trace /nonexistent-dir/t.jsonl
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'record_trace /nonexistent-dir/t.jsonl: No such file' \
    && ok "an unwritable --record-trace stops kvstashd at start with the path" \
    || not_ok "bad record_trace: rc=$RC err='$ERR'"
exit $FAILED
