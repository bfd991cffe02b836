#!/usr/bin/env bash
# The main job of the README's first command: start kvstashd with its embedded
# defaults (in-memory store, default capacity, loopback), run the kvstash
# client against it, and stop the server. Usage: deploy/run-demo.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
kvstashd="$build/service/kvstashd"
kvstash="$build/clients/c/kvstash"
for b in "$kvstashd" "$kvstash"; do
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
echo "== kvstash --server $addr stats"
"$kvstash" --server "$addr" stats
echo "== kvstash --server $addr config get"
"$kvstash" --server "$addr" config get

kill -TERM "$pid"
wait "$pid"
rc=$?
pid=""
echo "== kvstashd stopped (exit $rc)"
exit "$rc"
