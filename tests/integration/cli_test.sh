#!/bin/sh
# cli_test.sh — the `kvstash` CLI against a real kvstashd.
# Usage: cli_test.sh /path/to/kvstashd /path/to/kvstash
# Each check prints "ok - ..." or "not ok - ..."; exit 1 when any failed.
set -u
KVSTASHD=$1
KVSTASH=$2
. "$(dirname "$0")/lib.sh"
kvs_init cli

# an ssd_dir kvstashd cannot use: it does not start, and says why (not the store's bare
# status)
run "$KVSTASHD" --listen 127.0.0.1:0 --ssd-dir "$TMP/none/ssd" --log-level warn
[ $RC -ne 0 ] && printf '%s' "$ERR" | grep -q "ssd_dir $TMP/none/ssd: No such file or directory" \
    && ok "a missing ssd_dir: no start, named with the reason" \
    || not_ok "missing ssd_dir: rc=$RC err='$ERR'"
: >"$TMP/afile"
run "$KVSTASHD" --listen 127.0.0.1:0 --ssd-dir "$TMP/afile" --log-level warn
[ $RC -ne 0 ] && printf '%s' "$ERR" | grep -q "ssd_dir $TMP/afile: not a directory" \
    && ok "an ssd_dir that is a file: no start, named with the reason" \
    || not_ok "file ssd_dir: rc=$RC err='$ERR'"

# docs/OPERATIONS.md's settings table is what `kvstashd --help-config-md` prints (the docs
# say it is generated from the config table: an edit by hand drifts from --help, GetConfig)
DOCS="$(dirname "$0")/../../docs/OPERATIONS.md"
run "$KVSTASHD" --help-config-md
printf '%s\n' "$OUT" >"$TMP/table.gen"
awk '/^\| name \| type \|/ {on = 1} on && !/^\|/ {exit} on' "$DOCS" >"$TMP/table.doc"
[ $RC -eq 0 ] && [ -s "$TMP/table.doc" ] && diff "$TMP/table.doc" "$TMP/table.gen" >"$TMP/table.diff" \
    && ok "docs/OPERATIONS.md's settings table equals kvstashd --help-config-md" \
    || not_ok "OPERATIONS.md table differs from --help-config-md (rc=$RC): $(cat "$TMP/table.diff")"

# the shipped example config starts a node as it is (its listen address replaced by the
# command line's)
EXAMPLE="$(dirname "$0")/../../deploy/kvstashd.ini.example"
kvs_start example --config "$EXAMPLE"
run "$KVSTASH" --server "$ADDR" --timeout-ms 5000 config get policy default_scheme
CRC=$RC
kvs_stop
[ $CRC -eq 0 ] && [ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q 'policy.*lru' \
    && printf '%s\n' "$OUT" | grep -q 'default_scheme.*int8' \
    && ok "deploy/kvstashd.ini.example starts a node with its settings" \
    || not_ok "example config: config get rc=$CRC, kvstashd exit $RC, out='$OUT' err='$ERR'"

kvs_start kvstashd
K="$KVSTASH --server 127.0.0.1:$PORT --timeout-ms 5000"

run $K health
[ $RC -eq 0 ] && [ "$OUT" = "SERVING" ] && ok "health prints SERVING, exit 0" \
    || not_ok "health: rc=$RC out='$OUT' err='$ERR'"

run $K health no.such.Service
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q '^kvstash: health: not found: NOT_FOUND' \
    && ok "health of an unknown service exits 1 with the error on stderr" \
    || not_ok "health unknown service: rc=$RC err='$ERR'"

KVSTASH_SERVER=127.0.0.1:$PORT run "$KVSTASH" health
[ $RC -eq 0 ] && [ "$OUT" = "SERVING" ] && ok "KVSTASH_SERVER selects the server" \
    || not_ok "KVSTASH_SERVER: rc=$RC out='$OUT' err='$ERR'"

run $K stats
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^kvstash_rpc_calls_total{method="Stats"} [1-9]' \
    && printf '%s\n' "$OUT" | grep -q '^# TYPE kvstash_rpc_calls_total counter$' \
    && printf '%s\n' "$OUT" | grep -q '^# version: .' \
    && ok "stats prints version and kvstash_rpc_calls_total" \
    || not_ok "stats: rc=$RC err='$ERR'"

run $K stats kvstash_store_
[ $RC -eq 0 ] && ! printf '%s\n' "$OUT" | grep -q '^kvstash_rpc_calls_total' \
    && printf '%s\n' "$OUT" | grep -q '^kvstash_store_capacity_bytes [1-9]' \
    && ok "stats PREFIX filters" || not_ok "stats prefix: rc=$RC err='$ERR'"

run $K config set log_level=warn
[ $RC -eq 0 ] || not_ok "config set log_level=warn: rc=$RC err='$ERR'"
run $K config set log_level=error
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^log_level = error ' \
    && ok "config set log_level=error" || not_ok "config set: rc=$RC out='$OUT' err='$ERR'"
run $K config get log_level
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^log_level = error   # enum, runtime, ' \
    && ok "config get log_level shows error" || not_ok "config get: rc=$RC out='$OUT' err='$ERR'"
run $K config set log_level=warn
run $K config get log_level
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^log_level = warn ' \
    && ok "config set log_level=warn then get shows warn" \
    || not_ok "config get after set warn: rc=$RC out='$OUT'"

run $K config set log_level=debug --dry-run
run2_rc=$RC
run $K config get log_level
[ $run2_rc -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^log_level = warn ' \
    && ok "config set --dry-run changes nothing" || not_ok "dry run: rc=$run2_rc out='$OUT'"

run $K config get
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^capacity = [0-9]*   # size, runtime, ' \
    && printf '%s\n' "$OUT" | grep -q '^listen = 127.0.0.1:0 ' \
    && ok "config get lists every entry" || not_ok "config get all: rc=$RC out='$OUT'"

run $K config get no_such_setting
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "^kvstash: config get: invalid argument: .*no_such_setting" \
    && ok "config get of an unknown name exits 1" || not_ok "config get unknown: rc=$RC err='$ERR'"

run $K config set threads=1
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "^kvstash: config set: failed precondition: " \
    && ok "config set of a static entry exits 1" || not_ok "config set static: rc=$RC err='$ERR'"

for bad in "frobnicate" "config" "config frob" "config set" "config set novalue" \
           "health a b" "--timeout-ms x health" "--nope health" ""; do
    run $KVSTASH --server 127.0.0.1:$PORT $bad
    [ $RC -eq 2 ] && [ -n "$ERR" ] && ok "usage error exits 2: '$bad'" \
        || not_ok "usage '$bad': rc=$RC err='$ERR'"
done

run $KVSTASH --help
[ $RC -eq 0 ] && printf '%s' "$OUT" | grep -q '^usage: kvstash' && ok "--help" || not_ok "--help rc=$RC"
run $KVSTASH --version
[ $RC -eq 0 ] && printf '%s' "$OUT" | grep -q '^kvstash [0-9]' && ok "--version" || not_ok "--version rc=$RC"

kvs_stop
[ $RC -eq 0 ] && ok "kvstashd exits 0 on SIGTERM" || not_ok "kvstashd exit status $RC"

run $KVSTASH --server 127.0.0.1:$PORT --timeout-ms 500 health
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q '^kvstash: health: server unavailable: ' \
    && ok "dead server exits 1" || not_ok "dead server: rc=$RC err='$ERR'"

# token-hash: the [tenant.NAME] line for a token read from stdin, as sha256sum has it
TOK=cli-test-token-0123
WANT="token_sha256 = $(printf %s "$TOK" | sha256sum | cut -d' ' -f1)"
for form in 'no-newline:%s' 'newline:%s\n' 'crlf:%s\r\n' 'two-lines:%s\nsecond line\n'; do
    printf "${form#*:}" "$TOK" | "$KVSTASH" token-hash >"$TMP/out" 2>"$TMP/err"
    RC=$?
    [ $RC -eq 0 ] && [ "$(cat "$TMP/out")" = "$WANT" ] && [ ! -s "$TMP/err" ] \
        && ok "token-hash prints the token_sha256 line (stdin: ${form%%:*})" \
        || not_ok "token-hash ${form%%:*}: rc=$RC out='$(cat "$TMP/out")' err='$(cat "$TMP/err")'"
done
LONG=$(printf '%0256d' 7)
for bad in "" "short77" "has space9" "$(printf 'tab\there9')" "$LONG"; do
    printf '%s\n' "$bad" | "$KVSTASH" token-hash >"$TMP/out" 2>"$TMP/err"
    RC=$?
    [ $RC -eq 1 ] && [ ! -s "$TMP/out" ] \
        && grep -q '^kvstash: token-hash: invalid argument: ' "$TMP/err" \
        && { [ -z "$bad" ] || ! grep -qF "$bad" "$TMP/err"; } \
        && ok "token-hash refuses '$(printf %.20s "$bad")' without echoing it" \
        || not_ok "token-hash bad '$bad': rc=$RC err='$(cat "$TMP/err")'"
done
printf '%s' "$TOK" | "$KVSTASH" token-hash "$TOK" >"$TMP/out" 2>"$TMP/err"
RC=$?
[ $RC -eq 2 ] && ! grep -qF "$TOK" "$TMP/err" \
    && ok "token-hash takes no argument (exit 2, the argument not echoed)" \
    || not_ok "token-hash with an argument: rc=$RC err='$(cat "$TMP/err")'"

# kvstashd takes the line: the token authenticates, its hash and another token do
# not; a tenant still on `token =` works and gets one WARN with its own line.
PLAIN=cli-plain-token-456
printf '[tenant.hashed]\n%s\n\n[tenant.plain]\ntoken = %s\n' "$WANT" "$PLAIN" \
    >"$TMP/tenants.ini"
kvs_start tenants --config "$TMP/tenants.ini"
HEX=${WANT#token_sha256 = }
run $KVSTASH --server "$ADDR" --timeout-ms 5000 --token "$TOK" stats kvstash_rpc
[ $RC -eq 0 ] && ok "token_sha256: the token authenticates" || not_ok "hashed token: rc=$RC err='$ERR'"
run $KVSTASH --server "$ADDR" --timeout-ms 5000 --token "$PLAIN" stats kvstash_rpc
[ $RC -eq 0 ] && ok "token =: still authenticates" || not_ok "plain token: rc=$RC err='$ERR'"
for bad in "$HEX" cli-test-token-0124 "${TOK}x"; do
    run $KVSTASH --server "$ADDR" --timeout-ms 5000 --token "$bad" stats kvstash_rpc
    [ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'unauthenticated' \
        && ok "token_sha256: '$(printf %.24s "$bad")' refused" \
        || not_ok "bad token '$bad': rc=$RC err='$ERR'"
done
PLAIN_LINE="token_sha256 = $(printf %s "$PLAIN" | sha256sum | cut -d' ' -f1)"
[ "$(grep -c ' WARN *\[tenants\] ' "$TMP/tenants.log")" -eq 1 ] \
    && grep ' WARN *\[tenants\] ' "$TMP/tenants.log" | grep -q "tenant plain: .*UCX data plane.*$PLAIN_LINE\$" \
    && ! grep -qF "$PLAIN" "$TMP/tenants.log" && ! grep -q 'tenant hashed' "$TMP/tenants.log" \
    && ok "one WARN for the token = tenant, with its token_sha256 line" \
    || not_ok "WARN: $(cat "$TMP/tenants.log")"
kvs_stop
[ $RC -eq 0 ] || not_ok "kvstashd with tenants exit status $RC"

exit $FAILED
