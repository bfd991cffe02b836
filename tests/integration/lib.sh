# lib.sh — helpers shared by the integration shell tests; POSIX sh (ctest runs the
# scripts with /bin/sh). A script sources it first: . "$(dirname "$0")/lib.sh"
#
#   kvs_init NAME   TMP = a fresh /tmp/kvs-NAME-XXXXXX, FAILED=0, and traps: on exit
#                   every kvstashd started by kvs_start and not stopped is killed (-9)
#                   and reaped, its log is printed ("# NAME: ...") when the script
#                   exits non-zero, and TMP is removed; INT, TERM, HUP and PIPE (the
#                   reader of the output gone) exit 1, so the same cleanup runs.
#   ok TEXT         prints "ok - TEXT"
#   not_ok TEXT     prints "not ok - TEXT" and sets FAILED=1 (ctest's
#                   FAIL_REGULAR_EXPRESSION "not ok - " and the final `exit $FAILED`).
#   run CMD...      runs CMD; RC = its status, OUT = its stdout, ERR = its stderr.
#   kvs_start NAME [kvstashd args...]
#                   starts "$KVSTASHD" --listen 127.0.0.1:0 --port-file $TMP/NAME.port
#                   --log-level warn ARGS, stdout and stderr in $TMP/NAME.log, and waits
#                   up to 10 s for the port file's complete (newline-ended) line. Sets
#                   PID, PORT and ADDR=127.0.0.1:PORT. If kvstashd dies or never writes
#                   the port, prints "not ok - ..." with its log and exits 1.
#                   KVS_START_PREFIX, when set, is a command (words) that execs the
#                   rest, e.g. "setpriv --reuid=nobody ...": PID is still kvstashd's.
#   kvs_stop        SIGTERM to $PID and waits for it: RC = its exit status, PID empty.
#   kvs_dead_addr   DEAD_ADDR = 127.0.0.1:PORT where nobody listens and nobody can: a
#                   helper process holds PORT bound without listen() (connections are
#                   refused) until the script exits. A stopped server's port is not
#                   that: a server of a test running in parallel may be given it.
#   field LINE KEY  the value of " KEY=value" in LINE's last line (RESULT lines).
#
# Invariant: KVS_PIDS lists exactly the kvstashd processes started and not yet stopped.

kvs_init() {
    TMP=$(mktemp -d "/tmp/kvs-$1-XXXXXX") || { echo "not ok - mktemp"; exit 1; }
    FAILED=0
    PID=
    KVS_PIDS=
    KVS_LOGS=
    KVS_HOLD=
    trap 'kvs_cleanup $?' EXIT
    trap 'exit 1' INT TERM HUP PIPE
}

kvs_cleanup() { # exit status
    for p in $KVS_HOLD; do
        kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    for p in $KVS_PIDS; do
        if kill -0 "$p" 2>/dev/null; then
            kill -9 "$p" 2>/dev/null
            wait "$p" 2>/dev/null
        fi
    done
    if [ "$1" -ne 0 ]; then
        for l in $KVS_LOGS; do
            [ -s "$TMP/$l.log" ] && sed "s/^/# $l: /" "$TMP/$l.log"
        done
    fi
    rm -rf "$TMP"
}

ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1"; FAILED=1; }

# A command that hangs is stopped after KVS_RUN_TIMEOUT seconds (default 100) with
# SIGSEGV, so a sanitizer build prints where it was stuck into ERR (a hang then
# fails its check with a stack instead of running into ctest's timeout).
run() {
    timeout -s SEGV -k 10 "${KVS_RUN_TIMEOUT:-100}" "$@" >"$TMP/out" 2>"$TMP/err"
    RC=$?
    OUT=$(cat "$TMP/out")
    ERR=$(cat "$TMP/err")
}

field() { printf '%s\n' "$1" | tail -n 1 | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }

kvs_start() { # NAME [kvstashd args...]
    kvs_name=$1
    shift
    rm -f "$TMP/$kvs_name.port"
    # shellcheck disable=SC2086
    ${KVS_START_PREFIX:-} "$KVSTASHD" --listen 127.0.0.1:0 --port-file "$TMP/$kvs_name.port" \
        --log-level warn "$@" >"$TMP/$kvs_name.log" 2>&1 &
    PID=$!
    KVS_PIDS="$KVS_PIDS $PID"
    case " $KVS_LOGS " in *" $kvs_name "*) ;; *) KVS_LOGS="$KVS_LOGS $kvs_name" ;; esac
    kvs_i=0
    while [ $kvs_i -lt 1000 ]; do
        if [ -s "$TMP/$kvs_name.port" ] &&
           [ "$(tail -c 1 "$TMP/$kvs_name.port" | od -An -c | tr -d ' ')" = '\n' ]; then
            PORT=$(cat "$TMP/$kvs_name.port")
            ADDR="127.0.0.1:$PORT"
            return 0
        fi
        kill -0 "$PID" 2>/dev/null ||
            { echo "not ok - kvstashd died at start: $(cat "$TMP/$kvs_name.log")"; exit 1; }
        sleep 0.01
        kvs_i=$((kvs_i + 1))
    done
    echo "not ok - no port file after 10 s: $(cat "$TMP/$kvs_name.log")"
    exit 1
}

kvs_stop() {
    kill -TERM "$PID" 2>/dev/null
    wait "$PID"
    RC=$?
    KVS_PIDS=$(for p in $KVS_PIDS; do [ "$p" = "$PID" ] || printf ' %s' "$p"; done)
    PID=
}

kvs_dead_addr() {
    rm -f "$TMP/dead.port"
    python3 -c 'import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("%d\n" % s.getsockname()[1])
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(3600)' "$TMP/dead.port" &
    KVS_HOLD="$KVS_HOLD $!"
    kvs_i=0
    while [ ! -s "$TMP/dead.port" ] && [ $kvs_i -lt 1000 ]; do
        sleep 0.01
        kvs_i=$((kvs_i + 1))
    done
    [ -s "$TMP/dead.port" ] || { echo "not ok - kvs_dead_addr: no port"; exit 1; }
    DEAD_ADDR="127.0.0.1:$(cat "$TMP/dead.port")"
}
