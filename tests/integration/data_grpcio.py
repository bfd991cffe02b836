#!/usr/bin/python3
"""data_grpcio.py -- the data path of kvstashd driven by an independent gRPC
implementation (Debian's python3-grpcio), no libkvstash code involved.

Usage: /usr/bin/python3 data_grpcio.py /path/to/kvstashd [/path/to/kvstash]
PYTHONPATH must hold the classes protoc --python_out generated at build time.

Starts its own kvstashd and checks, with channel.unary_unary / stream_unary /
unary_stream and the generated message classes:
  - Lookup of an unseen prompt matches nothing;
  - Put (client streaming: header, then one LayerPayload per layer) of the
    prompt's 3 full blocks at fp16, chained by parent_key; the reply's key,
    stored_bytes and per-layer quality (0 error at fp16);
  - Lookup then matches 3 blocks with the keys Put returned and a lease;
  - Get (server streaming) at fp16 returns every layer bit-exact, in order,
    with last_layer on each block's final layer;
  - an int8 Put reports a small non-zero error and Get returns values close
    to what was sent;
  - malformed requests get INVALID_ARGUMENT naming the field (a layer of the
    wrong size, a Lookup without a namespace) and the server keeps serving;
  - when the kvstash CLI is given: `kvstash lookup` of the same prompt finds
    the same keys (two client implementations, one key chain).
Exits 0 on success, 1 with "FAIL: ..." on the first failed check.
"""
import random
import struct
import subprocess
import sys

import grpc
from kvstash.v1 import kvstash_pb2 as pb
from kvs_testlib import Kvstashd, expect_code, fail

SVC = "/kvstash.v1.KvStash/"
L, H, D, T = 2, 2, 32, 16


def ns(model="py-interop"):
    return pb.Namespace(model=model, layout=pb.Layout(
        num_layers=L, num_kv_heads=H, head_dim=D, block_tokens=T, dtype=pb.DTYPE_FP16))


def fp16(values):
    return struct.pack("<%de" % len(values), *values)


def unfp16(data):
    return struct.unpack("<%de" % (len(data) // 2), data)


def put_stream(header, layers):
    yield pb.PutRequest(header=header)
    for i, (k, v) in enumerate(layers):
        yield pb.PutRequest(layer=pb.LayerPayload(layer=i, k=k, v=v))


def check(channel, kvstash, port):
    lookup = channel.unary_unary(SVC + "Lookup", request_serializer=pb.LookupRequest.SerializeToString,
                                 response_deserializer=pb.LookupResponse.FromString)
    put = channel.stream_unary(SVC + "Put", request_serializer=pb.PutRequest.SerializeToString,
                               response_deserializer=pb.PutResponse.FromString)
    get = channel.unary_stream(SVC + "Get", request_serializer=pb.GetRequest.SerializeToString,
                               response_deserializer=pb.GetResponse.FromString)
    rng = random.Random(20261130)
    tokens = [rng.randrange(32000) for _ in range(3 * T + 5)]  # 3 full blocks + a tail

    r = lookup(pb.LookupRequest(ns=ns(), tokens=tokens), timeout=10)
    if r.matched_blocks != 0 or r.lease_id != 0:
        fail("Lookup of an unseen prompt: matched %d lease %d" % (r.matched_blocks, r.lease_id))
    print("ok - Lookup of an unseen prompt matches nothing")

    n = T * H * D
    sent, keys, parent = [], [], b""
    for b in range(3):
        layers = []
        for _ in range(L):
            k = fp16([rng.uniform(-3, 3) for _ in range(n)])
            v = fp16([rng.uniform(-3, 3) for _ in range(n)])
            layers.append((k, v))
        hdr = pb.PutHeader(ns=ns(), parent_key=parent, tokens=tokens[b * T:(b + 1) * T],
                           scheme=pb.SCHEME_FP16, index=b)
        rep = put(put_stream(hdr, layers), timeout=20)
        if len(rep.key) != 32 or rep.stored_bytes == 0 or rep.already_present:
            fail("Put block %d: key %d bytes, stored %d, already_present %s" % (
                b, len(rep.key), rep.stored_bytes, rep.already_present))
        if len(rep.quality) != L or any(q.k_rel_error != 0 or q.v_rel_error != 0 for q in rep.quality):
            fail("Put block %d at fp16: quality %s, want %d layers of 0 error" % (b, rep.quality, L))
        sent.append(layers)
        keys.append(rep.key)
        parent = rep.key
    if len(set(keys)) != 3:
        fail("Put returned repeated keys")
    print("ok - Put (client streaming) of 3 chained fp16 blocks: %d bytes stored each, 0 error"
          % rep.stored_bytes)

    hdr = pb.PutHeader(ns=ns(), parent_key=b"", tokens=tokens[:T], scheme=pb.SCHEME_FP16, index=0)
    rep = put(put_stream(hdr, sent[0]), timeout=20)
    if not rep.already_present or rep.key != keys[0]:
        fail("Put of the same block again: already_present=%s" % rep.already_present)
    print("ok - the same Put again reports already_present with the same key")

    r = lookup(pb.LookupRequest(ns=ns(), tokens=tokens, lease_ms=2000), timeout=10)
    if r.matched_blocks != 3 or r.matched_tokens != 3 * T:
        fail("Lookup after Put: matched %d blocks %d tokens" % (r.matched_blocks, r.matched_tokens))
    if [bi.key for bi in r.blocks] != keys or [bi.index for bi in r.blocks] != [0, 1, 2]:
        fail("Lookup keys differ from the keys Put returned")
    if r.lease_id == 0:
        fail("Lookup matched but granted no lease")
    print("ok - Lookup matches the 3 blocks with Put's keys, lease %d for %d ms" % (
        r.lease_id, r.lease_ms))

    got = list(get(pb.GetRequest(ns=ns(), keys=keys, format=pb.EGRESS_FP16, lease_id=r.lease_id),
                   timeout=20))
    if len(got) != 3 * L:
        fail("Get returned %d messages, want %d" % (len(got), 3 * L))
    for i, m in enumerate(got):
        b, l = divmod(i, L)
        if m.block_index != b or m.layer != l or m.key != keys[b]:
            fail("Get message %d is block %d layer %d, want %d/%d" % (i, m.block_index, m.layer, b, l))
        if m.last_layer != (l == L - 1):
            fail("Get message %d: last_layer=%s" % (i, m.last_layer))
        if m.k != sent[b][l][0] or m.v != sent[b][l][1]:
            fail("Get block %d layer %d: bytes differ from what was Put at fp16" % (b, l))
    print("ok - Get (server streaming) at fp16: %d layers bit-exact, in order" % len(got))

    # int8: lossy but close.
    t2 = [rng.randrange(32000) for _ in range(T)]
    vals = [[rng.gauss(0, 1) for _ in range(n)] for _ in range(2 * L)]
    layers = [(fp16(vals[2 * l]), fp16(vals[2 * l + 1])) for l in range(L)]
    hdr = pb.PutHeader(ns=ns(), tokens=t2, scheme=pb.SCHEME_INT8, index=0)
    rep = put(put_stream(hdr, layers), timeout=20)
    errs = [(q.k_rel_error, q.v_rel_error) for q in rep.quality]
    if len(errs) != L or not all(0 < e < 0.05 for pair in errs for e in pair):
        fail("int8 Put: quality %s, want small non-zero errors" % errs)
    got = list(get(pb.GetRequest(ns=ns(), keys=[rep.key], format=pb.EGRESS_FP32), timeout=20))
    worst = 0.0
    for m in got:
        k = struct.unpack("<%df" % n, m.k)
        ref = unfp16(layers[m.layer][0])
        num = sum((a - b) ** 2 for a, b in zip(k, ref)) ** 0.5
        den = sum(b * b for b in ref) ** 0.5
        worst = max(worst, num / den)
    if not 0 < worst < 0.05:
        fail("int8 Get at fp32: relative K error %.4f" % worst)
    print("ok - int8 Put reports errors %s; Get at fp32 is within %.4f of what was sent" % (
        ["%.4f/%.4f" % e for e in errs], worst))

    bad_hdr = pb.PutHeader(ns=ns(), tokens=tokens[:T], scheme=pb.SCHEME_FP16, index=0)
    short = [(sent[0][0][0][:-2], sent[0][0][1])] + sent[0][1:]
    expect_code(lambda: put(put_stream(bad_hdr, short), timeout=10),
                grpc.StatusCode.INVALID_ARGUMENT, "Put with a short K payload", "k")
    expect_code(lambda: lookup(pb.LookupRequest(tokens=tokens), timeout=10),
                grpc.StatusCode.INVALID_ARGUMENT, "Lookup without a namespace", "ns")
    r = lookup(pb.LookupRequest(ns=ns(), tokens=tokens), timeout=10)
    if r.matched_blocks != 3:
        fail("after the bad requests, Lookup matches %d" % r.matched_blocks)
    print("ok - after the malformed requests the server still serves the 3 blocks")

    if kvstash:
        res = subprocess.run([kvstash, "--server", "127.0.0.1:%d" % port, "lookup", "--model",
                              "py-interop", "--layers", str(L), "--kv-heads", str(H),
                              "--head-dim", str(D), "--block-tokens", str(T), "--tokens",
                              ",".join(map(str, tokens))], capture_output=True, text=True,
                             timeout=30)
        if res.returncode != 0:
            fail("kvstash lookup: exit %d: %s" % (res.returncode, res.stderr))
        cli_keys = [ln.split()[2] for ln in res.stdout.splitlines() if ln.startswith("block ")]
        if cli_keys != [k.hex() for k in keys]:
            fail("kvstash lookup printed keys %s, python Put returned %s" % (
                cli_keys, [k.hex() for k in keys]))
        print("ok - kvstash lookup (libkvstash) finds the blocks python put, same keys")


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    with Kvstashd(sys.argv[1], prefix="kvs-pydata-") as srv:
        with grpc.insecure_channel("127.0.0.1:%d" % srv.port) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            check(channel, sys.argv[2] if len(sys.argv) == 3 else None, srv.port)
        rc = srv.stop(timeout_s=5)
        if rc != 0:
            fail("kvstashd exited with %d after SIGTERM" % rc)
        print("ok - SIGTERM: exit 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
