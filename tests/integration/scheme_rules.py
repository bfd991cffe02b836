#!/usr/bin/python3
"""scheme_rules.py -- the scheme per model and per tenant, skip layers, the fp16
fallback and the tenants' quotas, from the config file and changed at run time
with SetConfig, checked against a real kvstashd with Debian's python3-grpcio.

Usage: /usr/bin/python3 scheme_rules.py /path/to/kvstashd
PYTHONPATH must hold the classes protoc --python_out generated at build time.

The config file declares tenants ops (admin), acme (scheme fp8_e5m2, a quota)
and beta (fp16 = true), and the model rules [model.llama-3-*] (fp8_e4m3, layer
1 at fp16) and [model.llama-3-8b] (fp16 = true). Checks, each on the scheme Put
reports per layer (PutResponse.quality) and the one Lookup reports (BlockInfo):
  - GetConfig shows the sections as model_rules / tenant_rules, canonical;
  - the precedence: model rule > tenant scheme > default_scheme; the request's
    scheme beats both; a model's or a tenant's fp16 fallback beats the request;
    the skip layers of the model rule are stored at fp16;
  - SetConfig (admin only) changes model_rules for the next Put, not for a Put
    whose header the server took before the change;
  - SetConfig of tenant_rules changes acme's quota (Stats, RESOURCE_EXHAUSTED);
  - bad values are INVALID_ARGUMENT naming the row, and a request with one bad
    setting applies none of its settings;
  - kvstashd refuses to start with --tenant-rules, or a bad [model.*] section.
Exits 0 on success, 1 with "FAIL: ..." on the first failed check.
"""
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

import grpc
from kvstash.v1 import kvstash_pb2 as pb
from kvs_testlib import Kvstashd, expect_code, fail

SVC = "/kvstash.v1.KvStash/"
L, H, D, T = 3, 2, 32, 16
FP16, E4M3, E5M2, INT8 = pb.SCHEME_FP16, pb.SCHEME_FP8_E4M3, pb.SCHEME_FP8_E5M2, pb.SCHEME_INT8
NAMES = {FP16: "fp16", E4M3: "fp8_e4m3", E5M2: "fp8_e5m2", INT8: "int8"}

CONFIG = """\
[kvstashd]
default_scheme = int8
log_level = warn

[tenant.ops]
token = ops-token-0001
admin = true

[tenant.acme]
token = acme-token-001
scheme = fp8_e5m2
quota = 8MiB

[tenant.beta]
token = beta-token-001
fp16 = yes

[model.llama-3-*]
scheme = fp8_e4m3
skip_layers = 1

[model.llama-3-8b]
fp16 = true
"""

MODEL_RULES = "llama-3-* scheme=fp8_e4m3 skip_layers=1; llama-3-8b fp16=true"
TENANT_RULES = "acme scheme=fp8_e5m2 quota=8MiB; beta fp16=true"


def ns(model):
    return pb.Namespace(model=model, layout=pb.Layout(
        num_layers=L, num_kv_heads=H, head_dim=D, block_tokens=T, dtype=pb.DTYPE_FP16))


def auth(token):
    return (("authorization", "Bearer " + token),)


class Client:
    def __init__(self, channel, rng):
        u = channel.unary_unary
        self.lookup = u(SVC + "Lookup", request_serializer=pb.LookupRequest.SerializeToString,
                        response_deserializer=pb.LookupResponse.FromString)
        self.get_config = u(SVC + "GetConfig",
                            request_serializer=pb.GetConfigRequest.SerializeToString,
                            response_deserializer=pb.GetConfigResponse.FromString)
        self.set_config = u(SVC + "SetConfig",
                            request_serializer=pb.SetConfigRequest.SerializeToString,
                            response_deserializer=pb.SetConfigResponse.FromString)
        self.stats = u(SVC + "Stats", request_serializer=pb.StatsRequest.SerializeToString,
                       response_deserializer=pb.StatsResponse.FromString)
        self.put = channel.stream_unary(SVC + "Put",
                                        request_serializer=pb.PutRequest.SerializeToString,
                                        response_deserializer=pb.PutResponse.FromString)
        self.rng = rng
        self.layers_put = 0

    def layers(self):
        n = T * H * D
        vals = lambda: struct.pack("<%de" % n, *[self.rng.gauss(0, 1) for _ in range(n)])
        return [(vals(), vals()) for _ in range(L)]

    def header(self, model, scheme):
        tokens = [self.rng.randrange(32000) for _ in range(T)]
        return pb.PutHeader(ns=ns(model), tokens=tokens, scheme=scheme, index=0)

    def put_block(self, token, model, scheme=pb.SCHEME_UNSPECIFIED):
        """Puts a fresh root block; its per-layer schemes and the Lookup scheme."""
        hdr = self.header(model, scheme)

        def stream():
            yield pb.PutRequest(header=hdr)
            for i, (k, v) in enumerate(self.layers()):
                yield pb.PutRequest(layer=pb.LayerPayload(layer=i, k=k, v=v))
        rep = self.put(stream(), metadata=auth(token), timeout=30)
        if rep.already_present or len(rep.quality) != L:
            fail("Put %s: already_present=%s, %d quality entries" % (
                model, rep.already_present, len(rep.quality)))
        got = [q.scheme for q in rep.quality]
        self.layers_put += L
        r = self.lookup(pb.LookupRequest(ns=ns(model), tokens=hdr.tokens), metadata=auth(token),
                        timeout=10)
        if r.matched_blocks != 1 or r.blocks[0].key != rep.key:
            fail("Lookup after Put %s: matched %d" % (model, r.matched_blocks))
        return got, r.blocks[0].scheme

    def config(self, token, *names):
        r = self.get_config(pb.GetConfigRequest(names=list(names)), metadata=auth(token),
                            timeout=10)
        return {e.name: e.value for e in r.entries}

    def set(self, token, dry_run=False, **settings):
        req = pb.SetConfigRequest(settings=[pb.ConfigSetting(name=k, value=v)
                                            for k, v in settings.items()], dry_run=dry_run)
        return self.set_config(req, metadata=auth(token), timeout=10)

    def metric(self, token, name, tenant=None):
        r = self.stats(pb.StatsRequest(prefix=name), metadata=auth(token), timeout=10)
        for m in r.metrics:
            labels = {lb.name: lb.value for lb in m.labels}
            if m.name == name and (tenant is None or labels.get("tenant") == tenant):
                return m.value
        fail("Stats has no %s%s" % (name, "" if tenant is None else "{tenant=%s}" % tenant))


def expect_schemes(what, got, want, lookup=None):
    g, lk = got
    if g != want:
        fail("%s: layers stored %s, want %s" % (
            what, [NAMES.get(s, s) for s in g], [NAMES.get(s, s) for s in want]))
    if lookup is not None and lk != lookup:
        fail("%s: Lookup reports %s, want %s" % (what, NAMES.get(lk, lk), NAMES[lookup]))
    print("ok - %s: layers %s" % (what, "/".join(NAMES[s] for s in g)))


def check_rules(c):
    ops, acme, beta = "ops-token-0001", "acme-token-001", "beta-token-001"
    cfg = c.config(ops, "model_rules", "tenant_rules")
    if cfg != {"model_rules": MODEL_RULES, "tenant_rules": TENANT_RULES}:
        fail("GetConfig: %s" % cfg)
    print("ok - GetConfig shows the [model.*] and [tenant.*] sections: %s | %s" % (
        cfg["model_rules"], cfg["tenant_rules"]))

    expect_schemes("acme, llama-3-70b, no scheme: the model rule (fp8_e4m3), layer 1 skipped",
                   c.put_block(acme, "llama-3-70b"), [E4M3, FP16, E4M3], E4M3)
    expect_schemes("acme, mistral-7b, no scheme: the tenant's fp8_e5m2",
                   c.put_block(acme, "mistral-7b"), [E5M2] * 3, E5M2)
    expect_schemes("ops, mistral-7b, no scheme: default_scheme int8",
                   c.put_block(ops, "mistral-7b"), [INT8] * 3, INT8)
    expect_schemes("acme, llama-3-70b, request int8: the request beats the rules (layer 1 still "
                   "skipped)", c.put_block(acme, "llama-3-70b", INT8), [INT8, FP16, INT8], INT8)
    expect_schemes("acme, llama-3-8b, request int8: the model's fp16 fallback wins",
                   c.put_block(acme, "llama-3-8b", INT8), [FP16] * 3, FP16)
    expect_schemes("beta, mistral-7b, request int8: the tenant's fp16 fallback wins",
                   c.put_block(beta, "mistral-7b", INT8), [FP16] * 3, FP16)

    # SetConfig: admin only; bad values named and nothing half-applied.
    expect_code(lambda: c.set(acme, model_rules="llama-3-* scheme=int8"),
                grpc.StatusCode.PERMISSION_DENIED, "SetConfig model_rules by acme (no admin)")
    expect_code(lambda: c.set(ops, model_rules="llama-3-* scheme=fp9"),
                grpc.StatusCode.INVALID_ARGUMENT, "SetConfig model_rules with scheme=fp9",
                "model_rules")
    expect_code(lambda: c.set(ops, model_rules="llama-3-* skip_layers=2-1"),
                grpc.StatusCode.INVALID_ARGUMENT, "SetConfig model_rules with skip_layers=2-1",
                "skip_layers")
    expect_code(lambda: c.set(ops, model_rules="a*b fp16=true"),
                grpc.StatusCode.INVALID_ARGUMENT, "SetConfig model_rules with a '*' inside",
                "model_rules")
    expect_code(lambda: c.set(ops, model_rules="x fp16=true; x scheme=int8"),
                grpc.StatusCode.INVALID_ARGUMENT, "SetConfig model_rules naming x twice",
                "model_rules")
    expect_code(lambda: c.set(ops, tenant_rules="nobody quota=1GiB"),
                grpc.StatusCode.INVALID_ARGUMENT, "SetConfig tenant_rules for an unknown tenant",
                "tenant_rules")
    expect_code(lambda: c.set(ops, tenant_rules="acme quota=lots"),
                grpc.StatusCode.INVALID_ARGUMENT, "SetConfig tenant_rules with quota=lots",
                "quota")
    expect_code(lambda: c.set(ops, model_rules="llama-3-* scheme=int8",
                              tenant_rules="acme quota=1GiB; ghost fp16=true"),
                grpc.StatusCode.INVALID_ARGUMENT,
                "SetConfig of a good model_rules with a bad tenant_rules", "ghost")
    if c.config(ops, "model_rules", "tenant_rules") != cfg:
        fail("a refused SetConfig changed something: %s" % c.config(ops, "model_rules",
                                                                    "tenant_rules"))
    expect_code(lambda: c.set(ops, dry_run=True, tenant_rules="acme quota=1GiB; nobody fp16=1"),
                grpc.StatusCode.INVALID_ARGUMENT, "SetConfig dry run of a tenant_rules naming "
                "an unknown tenant", "nobody")
    c.set(ops, dry_run=True, model_rules="llama-3-* scheme=int8")
    if c.config(ops, "model_rules") != {"model_rules": MODEL_RULES}:
        fail("a dry run changed model_rules")
    print("ok - refused settings and a dry run leave model_rules and tenant_rules as they were")

    # A Put whose header the server has taken keeps the rules it started with.
    hdr = c.header("llama-3-70b", pb.SCHEME_UNSPECIFIED)
    go = threading.Event()
    layers = c.layers()

    def slow_stream():
        yield pb.PutRequest(header=hdr)
        go.wait(30)
        for i, (k, v) in enumerate(layers):
            yield pb.PutRequest(layer=pb.LayerPayload(layer=i, k=k, v=v))
    fut = c.put.future(slow_stream(), metadata=auth(acme), timeout=60)
    end = time.monotonic() + 20
    while c.metric(ops, "kvstash_put_staged_bytes") == 0:  # the header was taken
        if time.monotonic() > end:
            go.set()
            fail("the slow Put's header was never staged")
        time.sleep(0.02)
    r = c.set(ops, model_rules="llama-3-* scheme=int8 skip_layers=0")
    if [e.value for e in r.entries] != ["llama-3-* scheme=int8 skip_layers=0"]:
        fail("SetConfig model_rules answered %s" % r.entries)
    go.set()
    old = [q.scheme for q in fut.result(timeout=60).quality]
    c.layers_put += L
    if old != [E4M3, FP16, E4M3]:
        fail("the Put begun before SetConfig stored %s, want the old rule's" % old)
    print("ok - a Put whose header came before SetConfig keeps the old rule: %s" % (
        "/".join(NAMES[s] for s in old)))
    expect_schemes("after SetConfig, acme, llama-3-70b: the new rule (int8, layer 0 skipped)",
                   c.put_block(acme, "llama-3-70b"), [FP16, INT8, INT8], FP16)
    expect_schemes("after SetConfig, llama-3-8b has no rule of its own any more: the prefix rule",
                   c.put_block(acme, "llama-3-8b"), [FP16, INT8, INT8])
    if c.config(acme, "model_rules") != {"model_rules": "llama-3-* scheme=int8 skip_layers=0"}:
        fail("GetConfig after SetConfig: %s" % c.config(acme, "model_rules"))
    print("ok - GetConfig shows the new model_rules")

    # tenant_rules: quota and fallback at run time.
    if c.metric(ops, "kvstash_tenant_quota_bytes", "acme") != 8 << 20:
        fail("kvstash_tenant_quota_bytes{acme} is not 8 MiB at start")
    c.set(ops, tenant_rules="acme quota=4KiB; beta scheme=fp8_e4m3")
    if c.metric(ops, "kvstash_tenant_quota_bytes", "acme") != 4096:
        fail("kvstash_tenant_quota_bytes{acme} after SetConfig: %s" % c.metric(
            ops, "kvstash_tenant_quota_bytes", "acme"))
    expect_code(lambda: c.put_block(acme, "mistral-7b"), grpc.StatusCode.RESOURCE_EXHAUSTED,
                "acme's Put after its quota went down to 4KiB", "quota")
    expect_schemes("beta without its fp16 fallback, request none: its new scheme fp8_e4m3",
                   c.put_block(beta, "mistral-7b"), [E4M3] * 3, E4M3)
    c.set(ops, tenant_rules="beta fp16=on")
    expect_schemes("acme without a tenant scheme any more (quota lifted): default int8",
                   c.put_block(acme, "mistral-7b"), [INT8] * 3, INT8)
    if c.metric(ops, "kvstash_tenant_quota_bytes", "acme") != 0:
        fail("acme left out of tenant_rules still has a quota")
    if c.config(ops, "tenant_rules") != {"tenant_rules": "beta fp16=true"}:
        fail("tenant_rules is not canonical: %s" % c.config(ops, "tenant_rules"))
    print("ok - tenant_rules at run time: quota set, lowered, lifted (Stats follows), canonical")

    # Every layer stored went through the ingest backend the server chose (auto).
    r = c.stats(pb.StatsRequest(prefix="kvstash_ingest_"), metadata=auth(ops), timeout=10)
    layers = sum(m.value for m in r.metrics if m.name == "kvstash_ingest_layers_total")
    using = [lb.value for m in r.metrics if m.name == "kvstash_ingest_backend" and m.value == 1
             for lb in m.labels]
    if layers != c.layers_put or len(using) != 1 or using[0] not in ("cpu", "gpu"):
        fail("kvstash_ingest_layers_total sums to %s for %d layers put; backend %s" % (
            layers, c.layers_put, using))
    koff = [m.value for m in r.metrics if m.name == "kvstash_ingest_gpu_key_offsets"]
    if len(koff) != 1 or koff[0] not in (0, 1) or (using[0] == "cpu" and koff[0] != 0):
        fail("kvstash_ingest_gpu_key_offsets is %s with backend %s" % (koff, using[0]))
    print("ok - Stats: %d layers quantized on ingest, backend %s" % (layers, using[0]))


def start_refused(kvstashd, args, want, what):
    try:
        res = subprocess.run([kvstashd, "--listen", "127.0.0.1:0"] + args, capture_output=True,
                             text=True, timeout=20)
    except subprocess.TimeoutExpired:
        fail("%s: kvstashd kept running" % what)
    if res.returncode == 0 or want not in res.stderr:
        fail("%s: exit %d, stderr %r (want %r)" % (what, res.returncode, res.stderr, want))
    print("ok - %s: kvstashd refuses to start: %s" % (what, res.stderr.strip().splitlines()[-1]))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    kvstashd = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="kvs-rules-")
    try:
        conf = os.path.join(tmp, "kvstashd.ini")
        with open(conf, "w") as f:
            f.write(CONFIG)
        with Kvstashd(kvstashd, extra=["--config", conf], prefix="kvs-rules-srv-") as srv:
            with grpc.insecure_channel("127.0.0.1:%d" % srv.port) as channel:
                grpc.channel_ready_future(channel).result(timeout=10)
                check_rules(Client(channel, random.Random(20261130)))
            rc = srv.stop(timeout_s=5)
            if rc != 0:
                fail("kvstashd exited with %d after SIGTERM" % rc)
        start_refused(kvstashd, ["--config", conf, "--tenant-rules", "acme quota=1GiB"],
                      "tenant_rules", "--tenant-rules as a flag")
        bad = os.path.join(tmp, "bad.ini")
        with open(bad, "w") as f:
            f.write(CONFIG + "\n[model.qwen-*]\nscheme = int4\n")
        start_refused(kvstashd, ["--config", bad], "[model.qwen-*]: scheme 'int4'",
                      "a [model.qwen-*] section with scheme = int4")
        with open(bad, "w") as f:
            f.write(CONFIG + "\n[model.qwen-*]\nscheme = int8\n\n[model.llama-3-8b]\nscheme = int8\n")
        start_refused(kvstashd, ["--config", bad], "already has a rule",
                      "a second [model.llama-3-8b] section")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
