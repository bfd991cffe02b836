#!/usr/bin/python3
"""metrics_test.py -- GET /metrics of a real kvstashd against the Stats RPC.

Usage: /usr/bin/python3 metrics_test.py /path/to/kvstashd /path/to/kvstash

Starts kvstashd with --metrics-listen 127.0.0.1:0 --metrics-port-file, drives
a few RPCs through the `kvstash` CLI, then checks:
  - GET /metrics: 200, Content-Type text/plain; version=0.0.4, every line is a
    comment or a well-formed sample, histograms end with le="+Inf", _sum, _count;
  - HEAD /metrics: 200, no body; GET /other: 404; POST /metrics: 405 + Allow;
  - the renderers agree: `kvstash stats` (the Stats RPC rendered by libkvstash)
    and a scrape taken right after it are the same lines in the same order, the
    same values too, except the figures that move between the two reads
    (uptime, calls in flight, and the Stats method's own call counters);
  - counters move: a Health call made between two scrapes shows up in the second;
  - start-up errors are clear: a bad metrics_listen, metrics_port_file without
    metrics_listen, and a port already in use make kvstashd exit 1 with a message.
Exits 0 on success, 1 with "FAIL: ..." on the first failed check.
"""
import http.client
import os
import re
import socket
import subprocess
import sys

from kvs_testlib import Kvstashd, fail

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*\})? \S+$')


def fetch(port, method, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path)
    r = c.getresponse()
    body = r.read().decode("utf-8")
    headers = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, headers, body


def volatile(line):
    """Figures that may differ between a Stats reply and the next scrape."""
    name = re.split(r'[{ ]', line, 1)[0]
    return (name in ("kvstash_uptime_seconds", "kvstash_rpc_calls_in_flight")
            or 'method="Stats"' in line)


def check_format(body):
    lines = body.split("\n")
    if lines[-1] != "":
        fail("/metrics body does not end with a newline")
    families = {}
    for ln in lines[:-1]:
        if ln.startswith("# HELP ") or ln.startswith("# TYPE "):
            parts = ln.split(" ", 3)
            if ln.startswith("# TYPE "):
                if parts[3] not in ("counter", "gauge", "histogram", "untyped"):
                    fail("bad TYPE line %r" % ln)
                if parts[2] in families:
                    fail("family %s has two TYPE lines" % parts[2])
                families[parts[2]] = parts[3]
            continue
        if not SAMPLE.match(ln):
            fail("malformed sample line %r" % ln)
        float(ln.rsplit(" ", 1)[1].replace("+Inf", "inf"))
    hist = [f for f, t in families.items() if t == "histogram"]
    if not hist:
        fail("no histogram family in /metrics")
    for h in hist:
        if (h + '_bucket{method="Check",le="+Inf"}') not in body and \
                not re.search(re.escape(h) + r'_bucket\{.*le="\+Inf"\}', body):
            fail("histogram %s has no +Inf bucket" % h)
        if not re.search("^" + re.escape(h) + r"_count", body, re.M):
            fail("histogram %s has no _count" % h)
    return families


def independent_parse(body, fams):
    """The official Python client's text parser (python3-prometheus-client) reads
    the body: the same families, types, and every sample's value."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        print("skip - python3-prometheus-client not installed: no independent parse")
        return
    parsed = {f.name: f for f in text_string_to_metric_families(body)}
    # The parser strips _total from counter family names.
    want = {(n[:-6] if t == "counter" and n.endswith("_total") else n): t for n, t in fams.items()}
    got = {n: f.type for n, f in parsed.items()}
    if got != want:
        fail("prometheus_client parsed families %s, want %s" % (sorted(got.items()), sorted(want.items())))
    samples = sum(len(f.samples) for f in parsed.values())
    lines = sum(1 for ln in body.split("\n") if ln and not ln.startswith("#"))
    if samples != lines:
        fail("prometheus_client parsed %d samples from %d sample lines" % (samples, lines))
    for f in parsed.values():
        for smp in f.samples:
            lab = ",".join('%s="%s"' % (k, v.replace("\\", "\\\\").replace('"', '\\"'))
                           for k, v in smp.labels.items())
            series = smp.name + ("{%s}" % lab if lab else "")
            if value(body, series) != smp.value and not (smp.value != smp.value):
                fail("prometheus_client read %s = %r, the text says %r" % (
                    series, smp.value, value(body, series)))
    print("ok - python3-prometheus-client parses /metrics: %d families, %d samples, same values" % (
        len(parsed), samples))


def value(body, series):
    for ln in body.split("\n"):
        if ln.startswith(series + " "):
            return float(ln.rsplit(" ", 1)[1])
    fail("no series %s in /metrics" % series)


def cli(kvstash, port, *args):
    r = subprocess.run([kvstash, "--server", "127.0.0.1:%d" % port, "--timeout-ms", "5000"]
                       + list(args), capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail("kvstash %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()))
    return r.stdout


def expect_start_failure(kvstashd, tmp, extra, what):
    r = subprocess.run([kvstashd, "--listen", "127.0.0.1:0", "--port-file",
                        os.path.join(tmp, "never"), "--log-level", "warn"] + extra,
                       capture_output=True, text=True, timeout=20)
    if r.returncode != 1 or what not in r.stderr:
        fail("kvstashd %s: exit %d, stderr %r; want exit 1 naming %r"
             % (" ".join(extra), r.returncode, r.stderr.strip(), what))
    print("ok - kvstashd %s refuses to start: %s" % (" ".join(extra), r.stderr.strip()[-90:]))


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    kvstashd, kvstash = sys.argv[1], sys.argv[2]
    with Kvstashd(kvstashd, metrics=True, prefix="kvs-metrics-") as srv:
        port, mport, tmp = srv.port, srv.mport, srv.tmp
        if mport == port or mport <= 0:
            fail("metrics port %d (gRPC port %d)" % (mport, port))
        for _ in range(3):
            cli(kvstash, port, "health")
        cli(kvstash, port, "config", "get", "log_level")

        st, hd, body = fetch(mport, "GET", "/metrics")
        if st != 200:
            fail("GET /metrics: %d" % st)
        if hd.get("content-type") != "text/plain; version=0.0.4; charset=utf-8":
            fail("GET /metrics Content-Type %r" % hd.get("content-type"))
        fams = check_format(body)
        print("ok - GET /metrics: 200, %d families, %d lines, format 0.0.4" % (
            len(fams), body.count("\n")))
        independent_parse(body, fams)
        if value(body, 'kvstash_rpc_calls_total{method="Check"}') != 3:
            fail("Check counted %r times, want 3" % value(body, 'kvstash_rpc_calls_total{method="Check"}'))

        st, hd, hbody = fetch(mport, "HEAD", "/metrics")
        if st != 200 or hbody != "":
            fail("HEAD /metrics: %d, body %d bytes" % (st, len(hbody)))
        st, _, _ = fetch(mport, "GET", "/nothing")
        if st != 404:
            fail("GET /nothing: %d, want 404" % st)
        st, hd, _ = fetch(mport, "POST", "/metrics")
        if st != 405 or "GET" not in hd.get("allow", ""):
            fail("POST /metrics: %d allow=%r, want 405 with Allow: GET, HEAD" % (st, hd.get("allow")))
        print("ok - HEAD 200 without a body, unknown path 404, POST 405 with Allow")

        # Agreement of the two renderers: Stats (rendered by libkvstash), then a scrape.
        stats = cli(kvstash, port, "stats")
        _, _, scrape = fetch(mport, "GET", "/metrics")
        a = [ln for ln in stats.split("\n") if not ln.startswith("# version:")
             and not ln.startswith("# uptime_seconds:")]
        b = scrape.split("\n")
        if len(a) != len(b):
            fail("kvstash stats has %d lines, /metrics %d" % (len(a), len(b)))
        same = 0
        for x, y in zip(a, b):
            if x == y:
                same += 1
                continue
            kx = x.rsplit(" ", 1)[0]
            ky = y.rsplit(" ", 1)[0]
            if kx != ky or x.startswith("#") or not volatile(x):
                fail("renderers disagree:\n  stats:    %r\n  /metrics: %r" % (x, y))
        if same < len(a) * 0.8:
            fail("only %d of %d lines identical" % (same, len(a)))
        print("ok - kvstash stats and /metrics: same %d lines, %d identical (the rest: uptime, "
              "in-flight, the Stats method's own counters)" % (len(a), same))

        _, _, before = fetch(mport, "GET", "/metrics")
        cli(kvstash, port, "health")
        _, _, after = fetch(mport, "GET", "/metrics")
        s = 'kvstash_rpc_calls_total{method="Check"}'
        if value(after, s) != value(before, s) + 1:
            fail("Check counter %r -> %r, want +1" % (value(before, s), value(after, s)))
        h = 'kvstash_rpc_latency_seconds_count{method="Check"}'
        if value(after, h) != value(before, h) + 1:
            fail("Check latency count %r -> %r, want +1" % (value(before, h), value(after, h)))
        print("ok - a Health call between two scrapes moves the counter and the histogram by 1")
        n0 = value(after, "kvstash_metrics_scrapes_total")
        _, _, again = fetch(mport, "GET", "/metrics")
        if value(again, "kvstash_metrics_scrapes_total") != n0 + 1 or value(after, "kvstash_tls_enabled") != 0:
            fail("kvstash_metrics_scrapes_total %r -> %r, tls_enabled %r" % (
                n0, value(again, "kvstash_metrics_scrapes_total"), value(after, "kvstash_tls_enabled")))
        print("ok - kvstash_metrics_scrapes_total counts scrapes (%d so far), kvstash_tls_enabled 0" % (n0 + 1))

        rc = srv.stop(timeout_s=5)
        if rc != 0:
            fail("kvstashd exited %d after SIGTERM" % rc)
        print("ok - SIGTERM with the metrics daemon running: exit 0")

        expect_start_failure(kvstashd, tmp, ["--metrics-listen", "nohost"], "metrics_listen")
        expect_start_failure(kvstashd, tmp, ["--metrics-port-file", os.path.join(tmp, "m2")],
                             "metrics_listen is empty")
        busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        try:
            expect_start_failure(kvstashd, tmp,
                                 ["--metrics-listen", "127.0.0.1:%d" % busy.getsockname()[1]],
                                 "cannot bind")
        finally:
            busy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
