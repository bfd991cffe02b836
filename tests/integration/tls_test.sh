#!/bin/sh
# tls_test.sh — kvstashd's TLS listener (tls_cert, tls_key, tls_client_ca).
# Usage: tls_test.sh /path/to/kvstashd /path/to/kvstash [python-proto-dir]
# Makes a throw-away CA, a server certificate for 127.0.0.1/localhost and a
# client certificate with the openssl CLI, then checks that:
#   health and stats work over TLS with the CA (--tls-ca), and through
#   KVSTASH_TLS_CA; a plaintext client, and a client trusting another CA, fail;
#   half a configuration (cert without key, client CA without cert, a missing
#   file, a file that is not PEM) stops kvstashd at start with a message;
#   with tls_client_ca, kvstash --tls-cert/--tls-key and python3-grpcio with
#   the client certificate get SERVING, without one (or with the wrong key)
#   the client is refused (the python check when python-proto-dir is given).
# Each check prints "ok - ..." or "not ok - ..."; exit 1 when any failed.
set -u
KVSTASHD=$1
KVSTASH=$2
PYDIR=${3:-}
. "$(dirname "$0")/lib.sh"
kvs_init tls

# --- certificates --------------------------------------------------------------
mkcert() { # NAME CN SAN CA
    openssl req -newkey rsa:2048 -nodes -keyout "$TMP/$1.key" -out "$TMP/$1.csr" \
        -subj "/CN=$2" >/dev/null 2>&1 &&
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$TMP/$1.ext" &&
    openssl x509 -req -in "$TMP/$1.csr" -CA "$TMP/$4.pem" -CAkey "$TMP/$4.key" \
        -CAcreateserial -out "$TMP/$1.pem" -days 2 -extfile "$TMP/$1.ext" >/dev/null 2>&1
}
for ca in ca otherca; do
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$TMP/$ca.key" -out "$TMP/$ca.pem" \
        -days 2 -subj "/CN=kvstash test $ca" >/dev/null 2>&1 || { echo "not ok - openssl CA"; exit 1; }
done
mkcert server localhost "IP:127.0.0.1,DNS:localhost" ca || { echo "not ok - openssl server cert"; exit 1; }
mkcert client worker-1 "DNS:worker-1" ca || { echo "not ok - openssl client cert"; exit 1; }
ok "openssl made a CA, a server and a client certificate"


# --- server authentication -----------------------------------------------------
kvs_start kvstashd --tls-cert "$TMP/server.pem" --tls-key "$TMP/server.key"
K="$KVSTASH --server 127.0.0.1:$PORT --timeout-ms 3000"
KF="$KVSTASH --server 127.0.0.1:$PORT --timeout-ms 1000" # for handshakes meant to fail

run $K --tls-ca "$TMP/ca.pem" health
[ $RC -eq 0 ] && [ "$OUT" = "SERVING" ] && ok "health over TLS with the CA" \
    || not_ok "health over TLS: rc=$RC out='$OUT' err='$ERR'"

run $K --tls-ca "$TMP/ca.pem" stats kvstash_
[ $RC -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^kvstash_rpc_calls_total{method="Check"} 1$' \
    && printf '%s\n' "$OUT" | grep -q '^kvstash_tls_enabled 1$' \
    && ok "stats over TLS counts the TLS health call" \
    || not_ok "stats over TLS: rc=$RC out='$OUT' err='$ERR'"

KVSTASH_TLS_CA="$TMP/ca.pem" run $K health
[ $RC -eq 0 ] && [ "$OUT" = "SERVING" ] && ok "KVSTASH_TLS_CA selects TLS" \
    || not_ok "KVSTASH_TLS_CA: rc=$RC out='$OUT' err='$ERR'"

run $KF health
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'server unavailable' \
    && ok "a plaintext client cannot talk to the TLS listener ($ERR)" \
    || not_ok "plaintext client against TLS: rc=$RC out='$OUT' err='$ERR'"

run $KF --tls-ca "$TMP/otherca.pem" health
[ $RC -eq 1 ] && ok "a client trusting another CA is refused" \
    || not_ok "other CA: rc=$RC out='$OUT' err='$ERR'"

run $K --tls-ca "$TMP/none.pem" health
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'none.pem: cannot open' \
    && ok "a missing CA file is an error naming it" || not_ok "missing CA: rc=$RC err='$ERR'"

run $K --tls-ca "$TMP/server.ext" health
[ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'no PEM certificate' \
    && ok "a CA file without a certificate is refused" || not_ok "non-PEM CA: rc=$RC err='$ERR'"

kvs_stop
[ $RC -eq 0 ] && ok "SIGTERM: TLS server exits 0" || not_ok "TLS server exit $RC"

# --- plaintext server, TLS client ------------------------------------------------
kvs_start kvstashd
run $KVSTASH --server 127.0.0.1:$PORT --timeout-ms 1000 --tls-ca "$TMP/ca.pem" health
[ $RC -eq 1 ] && ok "a TLS client cannot talk to a plaintext listener" \
    || not_ok "TLS client against plaintext: rc=$RC out='$OUT'"
kvs_stop

# --- bad configurations stop the server at start ---------------------------------
bad() { # MESSAGE args...
    msg=$1
    shift
    run "$KVSTASHD" --listen 127.0.0.1:0 --log-level warn "$@"
    [ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q "$msg" \
        && ok "refused at start: $msg" || not_ok "start with $*: rc=$RC err='$ERR'"
}
bad "TLS needs both tls_cert and tls_key" --tls-cert "$TMP/server.pem"
bad "tls_client_ca needs tls_cert and tls_key" --tls-client-ca "$TMP/ca.pem"
bad "tls_key $TMP/nope.key: No such file" --tls-cert "$TMP/server.pem" --tls-key "$TMP/nope.key"
bad "not a PEM file" --tls-cert "$TMP/server.ext" --tls-key "$TMP/server.key"

# --- client certificates (tls_client_ca) ---------------------------------------------
{
    kvs_start kvstashd --tls-cert "$TMP/server.pem" --tls-key "$TMP/server.key" --tls-client-ca "$TMP/ca.pem"
    K="$KVSTASH --server 127.0.0.1:$PORT --timeout-ms 3000"
    KF="$KVSTASH --server 127.0.0.1:$PORT --timeout-ms 1000"
    run $KF --tls-ca "$TMP/ca.pem" health
    [ $RC -eq 1 ] && ok "with tls_client_ca, a client without a certificate is refused" \
        || not_ok "no client cert: rc=$RC out='$OUT'"
    run $K --tls-ca "$TMP/ca.pem" --tls-cert "$TMP/client.pem" --tls-key "$TMP/client.key" health
    [ $RC -eq 0 ] && [ "$OUT" = "SERVING" ] \
        && ok "with tls_client_ca, kvstash --tls-cert/--tls-key (libkvstash) gets SERVING" \
        || not_ok "mTLS CLI: rc=$RC out='$OUT' err='$ERR'"
    run $KF --tls-ca "$TMP/ca.pem" --tls-cert "$TMP/server.pem" --tls-key "$TMP/client.key" health
    [ $RC -eq 1 ] && ok "a certificate with the wrong key is refused" \
        || not_ok "mismatched key: rc=$RC out='$OUT' err='$ERR'"
    run $K --tls-ca "$TMP/ca.pem" --tls-cert "$TMP/client.pem" health
    [ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'tls_cert_file and tls_key_file go together' \
        && ok "a client certificate without its key is an error" || not_ok "cert without key: rc=$RC err='$ERR'"
    run $K --tls-cert "$TMP/client.pem" --tls-key "$TMP/client.key" health
    [ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'a client certificate needs tls_ca_file' \
        && ok "a client certificate without --tls-ca is an error" || not_ok "cert without CA: rc=$RC err='$ERR'"
    run $K --tls-ca "$TMP/ca.pem" --tls-cert "$TMP/client.pem" --tls-key "$TMP/client.pem" health
    [ $RC -eq 1 ] && printf '%s' "$ERR" | grep -q 'no PEM private key' \
        && ok "a key file without a key is refused" || not_ok "non-key: rc=$RC err='$ERR'"
    [ -n "$PYDIR" ] && PYTHONPATH="$PYDIR" PYTHONDONTWRITEBYTECODE=1 run /usr/bin/python3 - "$PORT" "$TMP" <<'PY'
import sys, grpc, health_pb2
port, tmp = sys.argv[1], sys.argv[2]
rd = lambda n: open(tmp + "/" + n, "rb").read()
creds = grpc.ssl_channel_credentials(rd("ca.pem"), rd("client.key"), rd("client.pem"))
with grpc.secure_channel("127.0.0.1:" + port, creds) as ch:
    check = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                           response_deserializer=health_pb2.HealthCheckResponse.FromString)
    r = check(health_pb2.HealthCheckRequest(), timeout=5)
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
PY
    if [ -n "$PYDIR" ]; then
        [ $RC -eq 0 ] && [ "$OUT" = "SERVING" ] \
            && ok "with tls_client_ca, python3-grpcio presenting the client certificate gets SERVING" \
            || not_ok "mTLS python: rc=$RC out='$OUT' err='$ERR'"
    fi
    kvs_stop
}

exit $FAILED
