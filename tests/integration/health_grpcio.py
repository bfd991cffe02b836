#!/usr/bin/python3
"""health_grpcio.py -- interoperability check of kvstashd with an independent
gRPC implementation (Debian's python3-grpcio), no libkvstash code involved.

Usage: /usr/bin/python3 health_grpcio.py /path/to/kvstashd
PYTHONPATH must hold the classes protoc --python_out generated at build time
(health_pb2.py at the top: a "grpc" directory there would be shadowed by the
grpc package itself; kvstash/v1/kvstash_pb2.py).

Starts its own kvstashd (--listen 127.0.0.1:0 --port-file), calls
/grpc.health.v1.Health/Check and /kvstash.v1.KvStash/Stats through
channel.unary_unary, then SIGTERMs the server and expects exit 0 within 2 s.
Exits 0 on success, 1 with a message on the first failed check.
"""
import sys
import time

import grpc
import health_pb2                      # generated from grpc/health/v1/health.proto
from kvstash.v1 import kvstash_pb2     # generated from proto/kvstash/v1/kvstash.proto
from kvs_testlib import Kvstashd, fail


def check(channel):
    health = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString)
    for service in ("", "kvstash.v1.KvStash"):
        reply = health(health_pb2.HealthCheckRequest(service=service), timeout=5)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            fail("Check(%r) = %s, want SERVING" % (
                service, health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)))
    try:
        health(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        fail("Check of an unknown service succeeded")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            fail("Check of an unknown service: %s, want NOT_FOUND" % e.code())

    stats = channel.unary_unary(
        "/kvstash.v1.KvStash/Stats",
        request_serializer=kvstash_pb2.StatsRequest.SerializeToString,
        response_deserializer=kvstash_pb2.StatsResponse.FromString)
    reply = stats(kvstash_pb2.StatsRequest(), timeout=5)
    if not reply.version:
        fail("Stats: empty version")
    if not reply.uptime_seconds > 0:
        fail("Stats: uptime_seconds = %r" % reply.uptime_seconds)
    calls = [m for m in reply.metrics if m.name == "kvstash_rpc_calls_total"
             and any(l.name == "method" and l.value == "Check" for l in m.labels)]
    if len(calls) != 1 or calls[0].kind != kvstash_pb2.Metric.COUNTER:
        fail("Stats: no single kvstash_rpc_calls_total{method=\"Check\"} counter")
    if calls[0].value < 3:
        fail("Stats: Check counted %r times, want >= 3" % calls[0].value)
    print("grpcio %s: Check SERVING, Stats version=%r uptime=%.3f metrics=%d" % (
        grpc.__version__, reply.version, reply.uptime_seconds, len(reply.metrics)))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with Kvstashd(sys.argv[1]) as srv:
        with grpc.insecure_channel("127.0.0.1:%d" % srv.port) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            check(channel)
        t0 = time.monotonic()
        rc = srv.stop(timeout_s=2)
        ms = (time.monotonic() - t0) * 1e3
        if rc != 0:
            fail("kvstashd exited with %d after SIGTERM, want 0" % rc)
        print("SIGTERM: exit 0 after %.1f ms" % ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
