#!/usr/bin/env python3
"""tracegen.py — synthetic prefix-cache request traces in the Mooncake format.

    tracegen.py KIND [--requests N] [--seed S] [-o FILE]
    KIND: chat | sysprompt | docs | mix

Writes one JSON object per request, as in the Mooncake trace
(../shared/traces/README.md): {"timestamp": ms, "input_length": tokens,
"output_length": tokens, "hash_ids": [...]}, 512 tokens per block; two
requests share a cached prefix of n blocks exactly when their first n ids
agree. Python 3 standard library only; the output depends only on KIND, N and
the seed (random.Random(seed), no hash randomisation, no clock).

The workloads are chosen to test whether an eviction policy generalises
beyond one trace; each stresses a different reuse pattern:

  chat       multi-turn conversations. Each turn resends the whole
             conversation so far (system prompt + earlier turns) plus a new
             question; the next turn reuses it all. Conversations start on one
             of 24 system prompts (Zipf popularity), last a geometric number of
             turns (mean 6) and interleave (about 40 open at once), so the reuse
             gap of a conversation's newest blocks is tens of requests.
  sysprompt  one-shot questions on shared system prompts: 200 prompts of 2-60
             blocks with Zipf(1.1) popularity, each request the prompt plus a
             private 1-2 block question. Reuse is pure frequency.
  docs       long one-off documents (30-250 blocks) behind a short shared
             instruction prefix; 25 % of requests ask again about an earlier
             document, picked with a heavy-tailed look-back (most recent
             documents likelier), so some reuse gaps are short and many long.
             Most document blocks are never used again: a scan-like load.
  mix        per request: 45 % chat, 35 % sysprompt, 20 % docs, the three
             sharing one id space (no accidental sharing between them).
"""
import argparse
import json
import random
import sys

BLOCK_TOKENS = 512


class Ids:
    """Fresh block ids; a new id never equals an earlier one."""

    def __init__(self):
        self.next = 0

    def take(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def zipf_weights(n, s):
    return [1.0 / (k + 1) ** s for k in range(n)]


class Chat:
    def __init__(self, rng, ids, prompts=24, open_convs=40):
        self.rng, self.ids = rng, ids
        self.prompts = [ids.take(rng.randint(4, 40)) for _ in range(prompts)]
        self.w = zipf_weights(prompts, 1.0)
        self.convs = [self.new_conv() for _ in range(open_convs)]

    def new_conv(self):
        p = self.rng.choices(self.prompts, weights=self.w)[0]
        turns = 1
        while self.rng.random() > 1.0 / 6.0:  # geometric, mean 6
            turns += 1
        return {"ids": list(p) + self.ids.take(self.rng.randint(1, 3)), "left": turns}

    def request(self):
        i = self.rng.randrange(len(self.convs))
        c = self.convs[i]
        if c["left"] == 0 or len(c["ids"]) > 300:
            c = self.convs[i] = self.new_conv()
        c["left"] -= 1
        req = list(c["ids"])
        # the answer and the next question join the conversation
        c["ids"] += self.ids.take(self.rng.randint(1, 4))
        return req


class SysPrompt:
    def __init__(self, rng, ids, prompts=200):
        self.rng, self.ids = rng, ids
        self.prompts = [ids.take(rng.randint(2, 60)) for _ in range(prompts)]
        self.w = zipf_weights(prompts, 1.1)

    def request(self):
        p = self.rng.choices(self.prompts, weights=self.w)[0]
        return list(p) + self.ids.take(self.rng.randint(1, 2))


class Docs:
    def __init__(self, rng, ids):
        self.rng, self.ids = rng, ids
        self.instr = ids.take(2)
        self.docs = []

    def request(self):
        if self.docs and self.rng.random() < 0.25:
            # heavy-tailed look-back: Pareto-distributed distance into the past
            back = int(self.rng.paretovariate(0.8))
            d = self.docs[max(0, len(self.docs) - back)]
        else:
            d = self.instr + self.ids.take(self.rng.randint(30, 250))
            self.docs.append(d)
        return list(d) + self.ids.take(1)  # the question


def generate(kind, n, seed):
    rng = random.Random(seed)
    ids = Ids()
    gens = {}
    if kind in ("chat", "mix"):
        gens["chat"] = Chat(rng, ids)
    if kind in ("sysprompt", "mix"):
        gens["sysprompt"] = SysPrompt(rng, ids)
    if kind in ("docs", "mix"):
        gens["docs"] = Docs(rng, ids)
    t = 0
    for _ in range(n):
        if kind == "mix":
            u = rng.random()
            g = gens["chat"] if u < 0.45 else gens["sysprompt"] if u < 0.80 else gens["docs"]
        else:
            g = gens[kind]
        req = g.request()
        t += int(rng.expovariate(1.0 / 250.0))  # ~4 requests per second
        yield {
            "timestamp": t,
            "input_length": len(req) * BLOCK_TOKENS,
            "output_length": rng.randint(16, 512),
            "hash_ids": req,
        }


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["chat", "sysprompt", "docs", "mix"])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", default="-")
    a = ap.parse_args(argv)
    if a.requests < 0:
        ap.error("--requests must be >= 0")
    out = sys.stdout if a.output == "-" else open(a.output, "w")
    try:
        for rec in generate(a.kind, a.requests, a.seed):
            out.write(json.dumps(rec) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
