#!/bin/sh
# eviction_mixes.sh — the eviction tables of docs/BENCHMARKS.md in one run.
#
#   tests/bench/eviction_mixes.sh SIM [MOONCAKE_TRACE]
#
# SIM is build/store/kvstash-sim. Generates the four tracegen.py mixes (4,000
# requests, seed 1), replays each under every policy at 500, 2,000 and 8,000
# blocks, and the Mooncake trace (when given) at nine capacities. Before
# printing, every output line is checked (format, 0 <= hit <= 1, one line per
# policy and capacity, Belady >= every online policy); then one markdown row
# per policy and capacity set, and prefix / lru from the same run.
set -eu
SIM=$1
MC=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

table() { # name trace caps
    "$SIM" --trace "$2" --capacity-blocks "$3" --policy all > "$T/out" || {
        echo "$1: kvstash-sim failed" >&2; exit 1; }
    awk -v name="$1" -v caps="$3" '
        BEGIN { nc = split(caps, C, ",") }
        /^policy=[a-z0-9]+ capacity=[0-9]+ hit=[01]\.[0-9][0-9][0-9][0-9]$/ {
            split($1, a, "="); split($2, b, "="); split($3, h, "=")
            if (h[2] + 0 > 1) { print name ": hit above 1: " $0 > "/dev/stderr"; exit 1 }
            v[a[2], b[2]] = h[2]; if (!(a[2] in seen)) { seen[a[2]] = 1; P[++np] = a[2] }
            n++; next }
        { print name ": bad line: " $0 > "/dev/stderr"; exit 1 }
        END {
            if (n != np * nc || !("belady" in seen) || !("lru" in seen) || !("prefix" in seen)) {
                print name ": missing lines" > "/dev/stderr"; exit 1 }
            for (i = 1; i <= np; i++) for (c = 1; c <= nc; c++)
                if (v[P[i], C[c]] > v["belady", C[c]] + 1e-9) {
                    print name ": " P[i] " above belady at " C[c] > "/dev/stderr"; exit 1 }
            printf "\n%s\n\n| policy |", name
            for (c = 1; c <= nc; c++) printf " %s |", C[c]
            printf "\n|---|"; for (c = 1; c <= nc; c++) printf "---|"; printf "\n"
            for (i = 1; i <= np; i++) {
                printf "| %s |", P[i]
                for (c = 1; c <= nc; c++) printf " %s |", v[P[i], C[c]]
                printf "\n"
            }
            printf "| prefix / lru |"
            for (c = 1; c <= nc; c++) printf " %.3f |", (v["lru", C[c]] > 0 ? v["prefix", C[c]] / v["lru", C[c]] : 0)
            printf "\n"
        }' "$T/out"
}

for k in chat sysprompt docs mix; do
    python3 "$HERE/tracegen.py" "$k" --requests 4000 --seed 1 -o "$T/$k.jsonl"
    table "tracegen $k (4000 requests, seed 1)" "$T/$k.jsonl" 500,2000,8000
done
if [ -n "$MC" ]; then
    table "mooncake" "$MC" 1000,1500,2000,3000,4000,6000,8000,12000,16000
fi
