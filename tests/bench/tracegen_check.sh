#!/bin/sh
# tracegen_check.sh PYTHON TRACEGEN SIM — ctest tracegen_mixes (tests/unit/policy.cmake).
# For each kind: two runs with the same seed give the same bytes, a different seed
# different ones; kvstash-sim loads the trace and replays it under lru, prefix and
# belady, and Belady's hit fraction is at least each online policy's.
set -eu
PY=$1 GEN=$2 SIM=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for k in chat sysprompt docs mix; do
    "$PY" "$GEN" "$k" --requests 300 --seed 3 -o "$T/a.jsonl"
    "$PY" "$GEN" "$k" --requests 300 --seed 3 > "$T/b.jsonl"
    "$PY" "$GEN" "$k" --requests 300 --seed 4 -o "$T/c.jsonl"
    cmp -s "$T/a.jsonl" "$T/b.jsonl" || { echo "$k: same seed, different output"; exit 1; }
    cmp -s "$T/a.jsonl" "$T/c.jsonl" && { echo "$k: seed ignored"; exit 1; }
    test "$(wc -l < "$T/a.jsonl")" -eq 300 || { echo "$k: not 300 lines"; exit 1; }
    out=$("$SIM" --trace "$T/a.jsonl" --capacity-blocks 200 --policy all)
    echo "$out" | awk -v k="$k" '
        /^policy=[a-z0-9]+ capacity=200 hit=[01]\.[0-9][0-9][0-9][0-9]$/ {
            split($3, h, "="); v[substr($1, 8)] = h[2] + 0; n++; next }
        { print k ": bad line: " $0; bad = 1 }
        END {
            if (bad || n < 3 || !("belady" in v)) { print k ": malformed output"; exit 1 }
            for (p in v) if (v[p] > v["belady"] + 1e-9) { print k ": " p " above belady"; exit 1 }
            if (v["belady"] <= 0) { print k ": no reuse at all"; exit 1 }
        }' || exit 1
done
echo "tracegen ok"
