#!/usr/bin/env bash
# The main job of the README's first command: start kvstashd with its embedded
# defaults (in-memory store, default capacity, loopback), run the reference
# decoder's workload against it (conversations sharing prefixes: Lookup, Get by
# layer, asynchronous Put, quality against its own fp32 prefill), show what the
# node holds, and stop the server. Usage: deploy/run-demo.sh BUILD_DIR [SCHEME]
# MODEL (environment) picks another llama2.c checkpoint.
set -euo pipefail
build=${1:-build}
kvstashd="$build/service/kvstashd"
kvstash="$build/clients/c/kvstash"
decoder="$build/clients/decoder/kvstash-decoder"
scheme=${2:-int8}
here=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-}
if [ -z "$model" ]; then
  for m in "$here/models/stories260K.bin" "$here/../shared/models/stories260K.bin"; do
    [ -f "$m" ] && { model=$m; break; }
  done
fi
for b in "$kvstashd" "$kvstash" "$decoder"; do
  [ -x "$b" ] || { echo "run-demo: $b not built (run make build)" >&2; exit 1; }
done

tmp=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# Embedded defaults, except an ephemeral port so a running node never collides.
"$kvstashd" --listen 127.0.0.1:0 --port-file "$tmp/port" 2> >(sed 's/^/[kvstashd] /' >&2) &
pid=$!
for _ in $(seq 100); do
  [ -s "$tmp/port" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "run-demo: kvstashd exited during start-up" >&2; exit 1; }
  sleep 0.05
done
[ -s "$tmp/port" ] || { echo "run-demo: kvstashd did not start within 5 s" >&2; exit 1; }
addr="127.0.0.1:$(cat "$tmp/port")"

echo "== kvstash --server $addr health"
"$kvstash" --server "$addr" health
if [ -n "$model" ] && [ -f "$model" ]; then
  echo
  echo "== reference decoder: 16 conversations sharing prefixes, KV reused through kvstashd ($scheme)"
  "$decoder" workload --model "$model" --server "$addr" --scheme "$scheme"
  echo
  echo "== a second worker asks for the same prompts: everything cached is reused"
  "$decoder" workload --model "$model" --server "$addr" --scheme "$scheme" | tail -n 1
else
  echo "run-demo: no model found (set MODEL=path/to/llama2.c checkpoint); skipping the decoder" >&2
fi
echo
echo "== what the node holds (kvstash stats, selected)"
"$kvstash" --server "$addr" stats |
  grep -E '^kvstash_(lookup_(blocks|tokens)_total|put_blocks_total|ingest(_stored)?_bytes_total|egress_bytes_total|store_(blocks|used_bytes|memory_capacity_bytes)|store_evictions_total\{reason="capacity"\})' || true

kill -TERM "$pid"
wait "$pid"
rc=$?
pid=""
echo "== kvstashd stopped (exit $rc)"
exit "$rc"
