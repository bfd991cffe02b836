#!/bin/sh
# install_test.sh — `cmake --install` lays out what an operator runs: kvstashd with its
# two helpers side by side (it finds them next to /proc/self/exe; deploy/kvstashd.service
# runs /usr/local/bin/kvstashd) and the tools docs/OPERATIONS.md calls by name, the
# `kvstash` CLI (config, stats, token-hash) and kvstash-sim (replaying a recorded trace).
# Usage: install_test.sh BUILD_DIR
# Each check prints "ok - ..." or "not ok - ..."; exit 1 when any failed.
set -u
BUILD=$1
. "$(dirname "$0")/lib.sh"
kvs_init install

run cmake --install "$BUILD" --prefix "$TMP/prefix"
[ $RC -eq 0 ] && ok "cmake --install into a fresh prefix" || not_ok "cmake --install: rc=$RC err='$ERR'"
for b in kvstashd kvstash-xferd kvstash-ucx-addrcheck kvstash kvstash-sim; do
    [ -x "$TMP/prefix/bin/$b" ] && ok "installed bin/$b" || not_ok "bin/$b not installed"
done
run "$TMP/prefix/bin/kvstash" --version
[ $RC -eq 0 ] && printf '%s' "$OUT" | grep -q '^kvstash [0-9]' \
    && ok "the installed kvstash runs" || not_ok "installed kvstash --version: rc=$RC err='$ERR'"
exit $FAILED
