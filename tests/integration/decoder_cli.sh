#!/bin/sh
# decoder_cli.sh — kvstash-decoder end to end, no server needed.
# Usage: decoder_cli.sh KVSTASH_DECODER KVSTASH KVQ_QUALITY MODEL_DIR
#
# Greedy ids from BOS equal stories260K.reference.txt; hostile checkpoints and bad
# options exit 1 / 2 with a message naming the problem; --dump-kv writes KVSM sample
# files that `kvstash calibrate` and kvq_quality (tests/bench) read back; the workload
# ends with its RESULT line and reuses tokens under --local-quant.
# Each check prints "ok - ..." or "not ok - ..."; exit 1 when any failed, 77 when the
# model is not there.
set -u
DEC=$1
KVSTASH=$2
KVQ=$3
MODELS=$4
M="$MODELS/stories260K.bin"
REF="$MODELS/stories260K.reference.txt"
[ -r "$M" ] && [ -r "$REF" ] || { echo "skip: $M not found"; exit 77; }
. "$(dirname "$0")/lib.sh"
kvs_init dec
export OMP_NUM_THREADS=2

# 1. greedy ids from BOS, one line, equal to the reference
run "$DEC" --model "$M" --greedy 257 --print-ids
WANT=$(sed -n 's/^ids //p' "$REF" | sed 's/ *$//')
[ $RC -eq 0 ] && [ "$(printf '%s\n' "$OUT" | wc -l)" -eq 1 ] && [ "$OUT" = "$WANT" ] \
    && ok "--greedy 257 --print-ids prints the reference ids on one line" \
    || not_ok "greedy ids: rc=$RC err='$ERR' out='$(printf '%s' "$OUT" | cut -c1-80)...'"
run "$DEC" --model "$M" --greedy 5 --print-ids
[ $RC -eq 0 ] && [ "$OUT" = "$(printf '%s\n' "$WANT" | cut -d' ' -f1-5)" ] \
    && ok "--greedy 5 prints the first five" || not_ok "greedy 5: '$OUT'"

# 2. hostile checkpoints: exit 1, a message naming the problem
head -c 100000 "$M" >"$TMP/trunc.bin"
run "$DEC" --model "$TMP/trunc.bin" --greedy 3
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "checkpoint size: 100000 bytes" \
    && ok "a truncated checkpoint is refused" || not_ok "truncated: rc=$RC err='$ERR'"
head -c 20 "$M" >"$TMP/short.bin"
run "$DEC" --model "$TMP/short.bin" --greedy 3
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "shorter than the 28-byte header" \
    && ok "a file shorter than the header is refused" || not_ok "short: rc=$RC err='$ERR'"
# n_heads (bytes 12..15) = 3: does not divide dim
{ head -c 12 "$M"; printf '\003\000\000\000'; tail -c +17 "$M"; } >"$TMP/heads.bin"
run "$DEC" --model "$TMP/heads.bin" --greedy 3
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "n_heads = 3 does not divide dim = 64" \
    && ok "a header with n_heads not dividing dim is refused" || not_ok "heads: rc=$RC err='$ERR'"
# dim = 0x7fffffff
{ printf '\377\377\377\177'; tail -c +5 "$M"; } >"$TMP/dim.bin"
run "$DEC" --model "$TMP/dim.bin" --greedy 3
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "dim = 2147483647" \
    && ok "a huge dim is refused" || not_ok "dim: rc=$RC err='$ERR'"
run "$DEC" --model "$TMP/missing.bin" --greedy 3
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "missing.bin" \
    && ok "a missing file is an error naming it" || not_ok "missing: rc=$RC err='$ERR'"

# 3. usage errors exit 2
run "$DEC" --model "$M"
[ $RC -eq 2 ] && ok "no --greedy: usage error" || not_ok "no greedy: rc=$RC"
run "$DEC" --model "$M" --greedy 0
[ $RC -eq 2 ] && ok "--greedy 0: usage error" || not_ok "greedy 0: rc=$RC"
run "$DEC" --model "$M" --greedy 600
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "seq_len 512" \
    && ok "--greedy past seq_len: usage error" || not_ok "greedy 600: rc=$RC err='$ERR'"
run "$DEC" --model "$M" --greedy 3 --prompt 1,999
[ $RC -eq 2 ] && ok "--prompt id out of the vocabulary: usage error" || not_ok "prompt: rc=$RC"
run "$DEC" workload --model "$M" --local-quant int9
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "int9" \
    && ok "--local-quant int9: usage error" || not_ok "int9: rc=$RC err='$ERR'"
run "$DEC" workload --model "$M" --no-cache --sinks 2
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "need --local-quant" \
    && ok "--sinks without --local-quant: usage error" || not_ok "sinks: rc=$RC err='$ERR'"
run "$DEC" workload --model "$M" --local-quant int8 --k-outliers 17
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "expected 0..16" \
    && ok "--k-outliers 17: usage error" || not_ok "k-outliers: rc=$RC err='$ERR'"
for L in 0,,1 3-1 1- -1 "0, 1" 256; do
    run "$DEC" workload --model "$M" --local-quant int8 --skip-layers "$L"
    [ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "^kvstash-decoder: --skip-layers: expected" \
        && ok "--skip-layers '$L': usage error" || not_ok "skip-layers '$L': rc=$RC err='$ERR'"
done
run "$DEC" workload --model "$M" --local-quant int8 --skip-layers 1,5
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "skip layer 5, the model has 5 layers" \
    && ok "--skip-layers past the model's layers: usage error" || not_ok "skip-layers 5: rc=$RC err='$ERR'"
run "$DEC" workload --model "$M" --no-cache --skip-layers 0
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "need --local-quant" \
    && ok "--skip-layers without --local-quant: usage error" || not_ok "skip no-cache: rc=$RC err='$ERR'"
run "$DEC" workload --model "$M" --local-quant int8 --k-rope sideways
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "expected pre or post" \
    && ok "--k-rope sideways: usage error" || not_ok "k-rope: rc=$RC err='$ERR'"
run "$DEC" --synthetic-model "dim=64,heads=3" --greedy 2
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "n_heads = 3" \
    && ok "a synthetic model with bad dims: usage error" || not_ok "synthetic: rc=$RC err='$ERR'"

# 4. a prompt continues like the stream it is cut from
P=$(printf '%s\n' "$WANT" | cut -d' ' -f1-10 | tr ' ' ',')
run "$DEC" --model "$M" --greedy 5 --print-ids --prompt "1,$P"
[ $RC -eq 0 ] && [ "$OUT" = "$(printf '%s\n' "$WANT" | cut -d' ' -f11-15)" ] \
    && ok "--prompt: greedy continuation of a reference prefix" || not_ok "prompt: '$OUT' '$ERR'"

# 5. --dump-kv: KVSM files that calibrate and kvq_quality read
run "$DEC" --model "$M" --greedy 300 --dump-kv "$TMP/kv"
[ $RC -eq 0 ] && [ -s "$TMP/kv/greedy.kvsm" ] && ok "--greedy --dump-kv writes greedy.kvsm" \
    || not_ok "dump greedy: rc=$RC err='$ERR'"
# 112-byte header + 5 layers x (K 4 heads + V 4 heads + Q 8 heads) x 300 tokens x 8 dims x 4 bytes
SIZE=$(wc -c <"$TMP/kv/greedy.kvsm" | tr -d ' ')
[ "$SIZE" -eq $((112 + 5 * 16 * 300 * 8 * 4)) ] && ok "greedy.kvsm has the size of K, V and Q" \
    || not_ok "greedy.kvsm size $SIZE"
run "$DEC" workload --model "$M" --no-cache --conversations 4 --turns 2 --gen 8 \
    --dump-kv "$TMP/kv"
[ $RC -eq 0 ] && [ "$(ls "$TMP/kv"/conv*.kvsm | wc -l)" -eq 4 ] \
    && ok "workload --dump-kv writes one sample per conversation" || not_ok "dump workload: rc=$RC err='$ERR'"
run "$KVSTASH" calibrate --out "$TMP/p.prof" --block-tokens 32 "$TMP/kv"/*.kvsm
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q "^calibrate: 5 sample(s), .* model stories260K@[0-9a-f]\{16\}; 5 layers x 4 kv heads x head_dim 8, fp32, keys post-RoPE" \
    && ok "kvstash calibrate reads the dumped samples" || not_ok "calibrate: rc=$RC out='$OUT' err='$ERR'"
run "$KVQ" "$TMP/kv/greedy.kvsm"
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q "greedy.kvsm (model stories260K@.*fp32, keys post-RoPE), its own queries" \
    && printf '%s\n' "$OUT" | grep -q "^RESULT int8_vs_pertensor_fp8=" \
    && ok "kvq_quality reads the dumped sample with its own queries" || not_ok "kvq_quality: rc=$RC err='$ERR'"
# a corrupted dump is refused by the reader
cp "$TMP/kv/greedy.kvsm" "$TMP/bad.kvsm"
printf '\001' | dd of="$TMP/bad.kvsm" bs=1 seek=5000 conv=notrunc 2>/dev/null
run "$KVQ" "$TMP/bad.kvsm"
[ $RC -ne 0 ] && ok "a corrupted dump is refused by kvq_quality" || not_ok "bad sample accepted"

# 6. workload: RESULT line; local quantization reuses tokens
run "$DEC" workload --model "$M" --local-quant fp8_e4m3 --conversations 6 --turns 2 --gen 8
LAST=$(printf '%s\n' "$OUT" | tail -n 1)
KL_DEFAULT=$(printf '%s\n' "$LAST" | sed -n 's/.* kl=\([^ ]*\) .*/\1/p')
[ $RC -eq 0 ] && printf '%s\n' "$LAST" | grep -Eq '^RESULT scheme=fp8_e4m3 top1=[01]\.[0-9]{6} kl=[0-9.e+-]+ ttft_ratio=[0-9.]+ reused_tokens=[1-9][0-9]*$' \
    && ok "workload --local-quant ends with RESULT and reuses tokens" || not_ok "workload: rc=$RC last='$LAST' err='$ERR'"
# with an fp16 KV cache in both runs, reused fp16 blocks change nothing
run "$DEC" workload --model "$M" --kv-dtype fp16 --local-quant fp16 --conversations 6 --turns 2 --gen 8
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | tail -n 1 | grep -Eq '^RESULT scheme=fp16 top1=1.000000 kl=0.000000e\+00 ttft_ratio=[0-9.]+ reused_tokens=[1-9]' \
    && ok "--kv-dtype fp16: reused fp16 blocks are exact" || not_ok "kv fp16: rc=$RC last='$(printf '%s\n' "$OUT" | tail -n 1)' err='$ERR'"
run "$DEC" --model "$M" --greedy 3 --kv-dtype fp8
[ $RC -eq 2 ] && ok "--kv-dtype fp8: usage error" || not_ok "kv-dtype fp8: rc=$RC"
# keeping every V value (kV = head_dim = 8) and half the K values exact lowers the KL
run "$DEC" workload --model "$M" --local-quant fp8_e4m3 --conversations 6 --turns 2 --gen 8 \
    --k-outliers 16 --v-outliers 8
KL_MORE=$(printf '%s\n' "$OUT" | tail -n 1 | sed -n 's/.* kl=\([^ ]*\) .*/\1/p')
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q "^scheme fp8_e4m3, outliers kK=16 kV=8, sinks S=1" \
    && awk -v a="$KL_MORE" -v b="$KL_DEFAULT" 'BEGIN { exit !(a < b / 2) }' \
    && ok "more outliers: KL $KL_MORE < $KL_DEFAULT / 2" || not_ok "outliers: rc=$RC kl $KL_MORE vs $KL_DEFAULT err='$ERR'"
run "$DEC" workload --synthetic-model "dim=64,layers=2,heads=4,kv_heads=2,vocab=256,seq=256" \
    --no-cache --conversations 2 --turns 1 --gen 4 --max-context 256
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | tail -n 1 | grep -q '^RESULT scheme=none top1=1.000000 kl=0.000000e+00 ttft_ratio=1.0000 reused_tokens=0$' \
    && ok "workload on a synthetic model, no cache" || not_ok "synthetic workload: rc=$RC err='$ERR'"

exit $FAILED
