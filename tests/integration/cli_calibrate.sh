#!/bin/sh
# cli_calibrate.sh — `kvstash calibrate` end to end, no server needed.
# Usage: cli_calibrate.sh /path/to/kvstash /path/to/kvq_quality
#
# kvq_quality --write-sample makes synthetic KV sample files (docs/CALIBRATION.md);
# calibrate turns them into a profile whose lines and counts are checked here and which
# kvq_quality --profile parses back with the library's strict reader. Corrupt, truncated,
# foreign and mismatched inputs must give exit 1 and an error naming the problem, and
# leave no profile behind; usage errors exit 2.
# Each check prints "ok - ..." or "not ok - ..."; exit 1 when any failed.
set -u
KVSTASH=$1
KVQ=$2
. "$(dirname "$0")/lib.sh"
kvs_init calib

# Two samples of one synthetic model: one starts the sequence (it has the sink), one
# continues it; different data.
run "$KVQ" --write-sample "$TMP/s1.kvsm" --layers 3 --heads 2 --dim 64 --tokens 300 --seed 7
[ $RC -eq 0 ] && [ -s "$TMP/s1.kvsm" ] && ok "kvq_quality --write-sample writes a sample" \
    || not_ok "write-sample s1: rc=$RC err='$ERR'"
run "$KVQ" --write-sample "$TMP/s2.kvsm" --layers 3 --heads 2 --dim 64 --tokens 200 --seed 7 \
    --data-seed 8 --first-pos 256
[ $RC -eq 0 ] || not_ok "write-sample s2: rc=$RC err='$ERR'"
# Size: 112-byte header + 3 layers x (K, V, Q) x tokens x 2 heads x 64 dims x 2 bytes.
SIZE=$(wc -c <"$TMP/s1.kvsm" | tr -d ' ')
[ "$SIZE" -eq $((112 + 3 * 3 * 300 * 2 * 64 * 2)) ] && ok "sample file size matches the format" \
    || not_ok "sample size $SIZE"

run "$KVSTASH" calibrate --out "$TMP/p.prof" "$TMP/s1.kvsm" "$TMP/s2.kvsm"
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^calibrate: 2 sample(s), 500 tokens; model kvq-synthetic-7; 3 layers x 2 kv heads x head_dim 64' \
    && [ "$(printf '%s\n' "$OUT" | grep -cE '^ +[0-9]+ +[0-9.e+-]+ ')" -eq 3 ] \
    && printf '%s\n' "$OUT" | grep -q "^wrote $TMP/p.prof\$" \
    && ok "calibrate prints a summary with one row per layer" \
    || not_ok "calibrate: rc=$RC out='$OUT' err='$ERR'"

P="$TMP/p.prof"
[ "$(grep -v '^#' "$P" | head -n 1)" = "kvstash-profile 1" ] \
    && grep -qx 'model kvq-synthetic-7' "$P" \
    && grep -qx 'layout layers=3 kv_heads=2 head_dim=64 block_tokens=256 dtype=fp16 keys=pre-rope' "$P" \
    && grep -qx 'scheme int8' "$P" \
    && grep -qE '^outliers k=[0-9]+ v=[0-9]+ sinks=[0-9]+( key_offsets=1)?$' "$P" \
    && grep -qx 'calibration samples=2 tokens=500 percentile=100' "$P" \
    && [ "$(tail -n 1 "$P")" = "end" ] \
    && ok "profile header lines" || not_ok "profile header: $(head -n 8 "$P")"

NK=$(grep -c '^k ' "$P")
NV=$(grep -c '^v ' "$P")
NL=$(grep -c '^layer ' "$P")
BADK=$(grep '^k ' "$P" | awk 'NF != 67' | wc -l | tr -d ' ')
BADV=$(grep '^v ' "$P" | awk 'NF != 4' | wc -l | tr -d ' ')
[ "$NL" -eq 3 ] && [ "$NK" -eq 6 ] && [ "$NV" -eq 3 ] && [ "$BADK" -eq 0 ] && [ "$BADV" -eq 0 ] \
    && ok "profile has 3 layers, 3x2 K lines of 64 scales, 3 V lines of 2 scales" \
    || not_ok "profile counts: layer=$NL k=$NK v=$NV badk=$BADK badv=$BADV"
# A positive scale on every line (the data is nowhere all zero).
ZERO=$(grep -E '^(k|v) ' "$P" | awk '{for (i = ($1 == "k" ? 4 : 3); i <= NF; i++) if ($i + 0 <= 0) z++} END {print z + 0}')
[ "$ZERO" -eq 0 ] && ok "every static scale is positive" || not_ok "$ZERO zero scales"

run "$KVQ" --no-grid --profile "$P" "$TMP/s1.kvsm"
[ $RC -eq 0 ] \
    && printf '%s\n' "$OUT" | grep -q "^profile $P: model kvq-synthetic-7, layers=3 kv_heads=2 head_dim=64 block_tokens=256, scheme int8" \
    && printf '%s\n' "$OUT" | grep -q '^static int8 ' \
    && printf '%s\n' "$OUT" | tail -n 1 | grep -qE '^RESULT int8_vs_pertensor_fp8=[0-9.]+ int8_vs_q8_0=[0-9.]+ fp8_vs_pertensor_fp8=[0-9.]+$' \
    && ok "the profile parses (kvq_quality --profile) and its static scales quantize" \
    || not_ok "kvq_quality --profile: rc=$RC err='$ERR' out-tail='$(printf '%s\n' "$OUT" | tail -n 3)'"

run "$KVSTASH" calibrate --out "$TMP/e.prof" --scheme e4m3 --percentile 99.9 --k-outliers 4 \
    --v-outliers 0 --sinks 2 --key-offsets 0 "$TMP/s1.kvsm"
[ $RC -eq 0 ] && grep -qx 'scheme fp8_e4m3' "$TMP/e.prof" \
    && grep -qx 'outliers k=4 v=0 sinks=2' "$TMP/e.prof" \
    && grep -qx 'calibration samples=1 tokens=300 percentile=99.9' "$TMP/e.prof" \
    && ok "--scheme, --percentile, --k-outliers, --v-outliers, --sinks, --key-offsets reach the profile" \
    || not_ok "calibrate options: rc=$RC err='$ERR'"

# Key offsets: the synthetic keys' outlier channels sit off zero, so offsets cut the K
# error by far more than the bytes they add: suggested, printed, written.
run "$KVSTASH" calibrate --out "$TMP/o.prof" "$TMP/s1.kvsm"
[ $RC -eq 0 ] && grep -qE '^outliers k=[0-9]+ v=[0-9]+ sinks=[0-9]+ key_offsets=1$' "$TMP/o.prof" \
    && printf '%s\n' "$OUT" | grep -qE '^key offsets at k=[0-9]+ v=[0-9]+: K error x0\.[0-9]+ .*: suggested$' \
    && printf '%s\n' "$OUT" | grep -q ' profile uses k=[0-9]* v=[0-9]* sinks=[0-9]* key_offsets=1$' \
    && ok "key offsets suggested on keys with biased channels: key_offsets=1 in the profile" \
    || not_ok "key offsets: rc=$RC out='$OUT'"
run "$KVSTASH" calibrate --out "$TMP/o.prof" --key-offsets 2 "$TMP/s1.kvsm"
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q "calibrate: --key-offsets: expected 0 or 1, got '2'" \
    && ok "--key-offsets 2: usage error" || not_ok "--key-offsets 2: rc=$RC err='$ERR'"

# A metadata budget smaller than the scales themselves leaves no room for outliers.
run "$KVSTASH" calibrate --out "$TMP/m.prof" --max-meta-bits 0.1 "$TMP/s1.kvsm"
[ $RC -eq 0 ] && grep -qE '^outliers k=0 v=0 sinks=[0-9]+( key_offsets=1)?$' "$TMP/m.prof" \
    && printf '%s\n' "$OUT" | grep -q 'the scales alone exceed the budget' \
    && ok "--max-meta-bits 0.1: no outliers suggested" \
    || not_ok "max-meta-bits: rc=$RC out='$OUT' err='$ERR'"

# Corrupt inputs: exit 1, a clear message, no profile.
cp "$TMP/s1.kvsm" "$TMP/bad.kvsm"
printf 'X' | dd of="$TMP/bad.kvsm" bs=1 seek=5000 conv=notrunc 2>/dev/null
run "$KVSTASH" calibrate --out "$TMP/x.prof" "$TMP/s2.kvsm" "$TMP/bad.kvsm"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "^kvstash: calibrate: malformed or corrupted data: $TMP/bad.kvsm: sample: checksum mismatch" \
    && [ ! -e "$TMP/x.prof" ] && ok "a flipped byte: exit 1, checksum mismatch, no profile" \
    || not_ok "corrupt sample: rc=$RC err='$ERR'"

head -c 20000 "$TMP/s1.kvsm" >"$TMP/short.kvsm"
run "$KVSTASH" calibrate --out "$TMP/x.prof" "$TMP/short.kvsm"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "short.kvsm: sample: truncated: 19888 of 691200 data bytes" \
    && [ ! -e "$TMP/x.prof" ] && ok "a truncated file: exit 1, 'truncated'" \
    || not_ok "truncated sample: rc=$RC err='$ERR'"

head -c 50 "$TMP/s1.kvsm" >"$TMP/tiny.kvsm"
run "$KVSTASH" calibrate --out "$TMP/x.prof" "$TMP/tiny.kvsm"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "truncated header: 50 of 112 bytes" \
    && ok "a truncated header: exit 1" || not_ok "truncated header: rc=$RC err='$ERR'"

run "$KVSTASH" calibrate --out "$TMP/x.prof" "$P"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "bad magic" \
    && ok "not a sample file: exit 1, bad magic" || not_ok "foreign file: rc=$RC err='$ERR'"

run "$KVSTASH" calibrate --out "$TMP/x.prof" "$TMP/none.kvsm"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "I/O error: $TMP/none.kvsm: cannot open" \
    && ok "a missing file: exit 1" || not_ok "missing file: rc=$RC err='$ERR'"

run "$KVQ" --write-sample "$TMP/s3.kvsm" --layers 3 --heads 2 --dim 32 --tokens 64 --seed 7
run "$KVSTASH" calibrate --out "$TMP/x.prof" "$TMP/s1.kvsm" "$TMP/s3.kvsm"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "s3.kvsm: head_dim: 32, earlier samples have 64" \
    && [ ! -e "$TMP/x.prof" ] && ok "mismatched layouts: exit 1, names head_dim" \
    || not_ok "layout mismatch: rc=$RC err='$ERR'"

# Usage errors: exit 2.
run "$KVSTASH" calibrate "$TMP/s1.kvsm"
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q -- "--out PROFILE is required" \
    && ok "no --out: exit 2" || not_ok "no --out: rc=$RC err='$ERR'"
run "$KVSTASH" calibrate --out "$TMP/x.prof"
[ $RC -eq 2 ] && ok "no sample file: exit 2" || not_ok "no files: rc=$RC err='$ERR'"
run "$KVSTASH" calibrate --out "$TMP/x.prof" --percentile 0 "$TMP/s1.kvsm"
[ $RC -eq 2 ] && printf '%s' "$ERR" | grep -q -- "--percentile" \
    && ok "--percentile 0: exit 2" || not_ok "percentile 0: rc=$RC err='$ERR'"
run "$KVSTASH" calibrate --out "$TMP/x.prof" --scheme fp16 "$TMP/s1.kvsm"
[ $RC -eq 2 ] && ok "--scheme fp16: exit 2" || not_ok "scheme fp16: rc=$RC err='$ERR'"
run "$KVSTASH" calibrate --out "$TMP/x.prof" --k-outliers 17 "$TMP/s1.kvsm"
[ $RC -eq 2 ] && ok "--k-outliers 17: exit 2" || not_ok "k 17: rc=$RC err='$ERR'"
run "$KVSTASH" calibrate --out "$TMP/x.prof" --max-meta-bits lots "$TMP/s1.kvsm"
[ $RC -eq 2 ] && ok "--max-meta-bits lots: exit 2" || not_ok "max-meta-bits: rc=$RC err='$ERR'"

# A malformed profile is refused by the reader, naming line and field.
sed 's/^scheme int8$/scheme int9/' "$P" >"$TMP/bad.prof"
run "$KVQ" --no-grid --profile "$TMP/bad.prof" "$TMP/s1.kvsm"
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "bad.prof: profile line 5: field 'scheme'" \
    && ok "a malformed profile: line and field named" || not_ok "bad profile: rc=$RC err='$ERR'"

exit $FAILED
