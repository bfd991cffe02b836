#!/usr/bin/env python3
"""evict_oracles.py — how far online eviction can go on a trace (docs/EVICTION.md §5).

    evict_oracles.py --trace FILE [--capacity N] [--only NAME[,NAME...]]

A second, independent replay of the store's rule in plain Python: a request hits
the longest cached prefix of its hash_ids, the missing blocks are inserted in
order, and while the cache is full the victim is the lowest-ranked *leaf*
(cached block with no cached child), never the parent of the block being
inserted. It reproduces kvstash-sim's lru, belady and a static-popularity
oracle to four digits, then ranks leaves by rules that know more than any
online policy can, to show where a target lies:

  lru              last use (check against kvstash-sim)
  belady           next use (check against kvstash-sim)
  static           total uses in the whole trace, then last use ("best fixed set")
  known_lru        first-sight blocks first, then last use: kvstash's "prefix"
                   without its adaptation (online)
  known_static     first-sight blocks first, then total uses (hindsight)
  next500          uses in the next 500 requests (hindsight)
  hazard_full      P(next use within 300 requests | uses so far, last reuse gap,
                   age), evaluated at each eviction from a table fitted on the
                   whole trace (hindsight)
  hazard_half      the same table fitted on the first half of the trace only:
                   what a learner that had seen the first half would know

Prints "NAME capacity=N hit=0.xxxx" per rule. Python 3 standard library only.
"""
import argparse
import bisect
import collections
import heapq
import json
import math
import sys


def load(path):
    reqs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                ids = json.loads(line)["hash_ids"]
                if not isinstance(ids, list) or not all(isinstance(x, int) for x in ids):
                    raise ValueError("hash_ids is not a list of integers")
            except (ValueError, KeyError, TypeError) as e:
                sys.exit("%s:%d: malformed trace line (%s)" % (path, n, e))
            reqs.append(ids)
    return reqs


def keyed(reqs):
    """Chain keys: block i of a request is (key of block i-1, id), so equal
    keys mean equal prefixes, as in the store."""
    out, intern = [], {}
    for r in reqs:
        ks, prev = [], -1
        for x in r:
            prev = intern.setdefault((prev, x), len(intern))
            ks.append(prev)
        out.append(ks)
    return out


def replay_static(R, cap, score):
    """Rank fixed at push time: score(key, t, uses_so_far, pos, req) -> tuple."""
    parent, nch, cached = {}, collections.Counter(), set()
    hist = collections.defaultdict(list)
    heap, ver, where = [], {}, {}
    hits = req = seq = 0

    def push(x):
        nonlocal seq
        t, i = where[x]
        seq += 1
        ver[x] = seq
        heapq.heappush(heap, (score(x, t, hist[x], i, R[t]), seq, x))

    for t, r in enumerate(R):
        n = 0
        while n < len(r) and r[n] in cached:
            n += 1
        hits += n
        req += len(r)
        for i, x in enumerate(r):
            hist[x].append(t)
        for i in range(n - 1, -1, -1):
            where[r[i]] = (t, i)
            if nch[r[i]] == 0:
                push(r[i])
            else:
                ver[r[i]] = -1
        for i in range(n, len(r)):
            x, p = r[i], (r[i - 1] if i else None)
            if len(cached) >= cap:
                held, v = [], None
                while heap:
                    e = heapq.heappop(heap)
                    if ver.get(e[2]) != e[1]:
                        continue
                    if e[2] == p:
                        held.append(e)
                        continue
                    v = e[2]
                    break
                for e in held:
                    heapq.heappush(heap, e)
                if v is None:
                    break
                cached.discard(v)
                ver.pop(v, None)
                pv = parent.pop(v, None)
                if pv is not None:
                    nch[pv] -= 1
                    if nch[pv] == 0 and pv in cached:
                        push(pv)
            cached.add(x)
            parent[x] = p
            where[x] = (t, i)
            if p is not None:
                nch[p] += 1
                ver[p] = -1
            push(x)
    return hits / req


def replay_scan(R, cap, value):
    """Rank evaluated at each eviction over all leaves: value(key, now, uses)."""
    parent, nch, cached, leaves = {}, collections.Counter(), set(), set()
    hist = collections.defaultdict(list)
    hits = req = 0
    for t, r in enumerate(R):
        n = 0
        while n < len(r) and r[n] in cached:
            n += 1
        hits += n
        req += len(r)
        for x in r:
            hist[x].append(t)
        for i in range(n, len(r)):
            x, p = r[i], (r[i - 1] if i else None)
            if len(cached) >= cap:
                best, bv = None, None
                for v in leaves:
                    if v == p:
                        continue
                    s = (value(v, t, hist[v]), hist[v][-1])
                    if bv is None or s < bv:
                        best, bv = v, s
                if best is None:
                    break
                cached.discard(best)
                leaves.discard(best)
                pv = parent.pop(best, None)
                if pv is not None:
                    nch[pv] -= 1
                    if nch[pv] == 0:
                        leaves.add(pv)
            cached.add(x)
            parent[x] = p
            leaves.add(x)
            if p is not None:
                nch[p] += 1
                leaves.discard(p)
    return hits / req


def hazard_table(R, upto, horizon):
    """Reuse-gap samples per (uses so far, last-gap bucket) from requests < upto."""
    times = collections.defaultdict(list)
    for t, r in enumerate(R[:upto]):
        for x in r:
            times[x].append(t)
    gaps = collections.defaultdict(list)
    for ts in times.values():
        for k in range(len(ts)):
            if k + 1 < len(ts):
                g = ts[k + 1] - ts[k]
            elif upto - ts[k] < 2 * horizon:
                continue  # censored: not enough time seen to call it "never"
            else:
                g = 10 ** 9
            lg = int(math.log2(ts[k] - ts[k - 1] + 1) * 2) if k else -1
            gaps[(min(k + 1, 12), lg)].append(g)
    for g in gaps.values():
        g.sort()
    memo = {}

    def value(x, now, h):
        k = len(h)
        lg = int(math.log2(h[-1] - h[-2] + 1) * 2) if k > 1 else -1
        a = now - h[-1]
        key = (min(k, 12), lg, int(math.log2(a + 1) * 3))
        if key not in memo:
            g = gaps.get(key[:2], [])
            lo = bisect.bisect_right(g, a)
            hi = bisect.bisect_right(g, a + horizon)
            memo[key] = (hi - lo + 0.01) / (len(g) - lo + 1)
        return memo[key]

    return value


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--capacity", type=int, default=4000)
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    if a.capacity <= 0:
        ap.error("--capacity must be positive")
    R = keyed(load(a.trace))
    times = collections.defaultdict(list)
    for t, r in enumerate(R):
        for x in r:
            times[x].append(t)
    total = {x: len(ts) for x, ts in times.items()}

    def next_use(x, t):
        ts = times[x]
        j = bisect.bisect_right(ts, t)
        return ts[j] if j < len(ts) else 10 ** 9

    def uses_within(x, t, w):
        ts = times[x]
        return bisect.bisect_right(ts, t + w) - bisect.bisect_right(ts, t)

    rules = {
        "lru": lambda: replay_static(R, a.capacity, lambda x, t, h, i, r: (t,)),
        "belady": lambda: replay_static(R, a.capacity, lambda x, t, h, i, r: (-next_use(x, t), -i)),
        "static": lambda: replay_static(R, a.capacity, lambda x, t, h, i, r: (total[x], t)),
        "known_lru": lambda: replay_static(R, a.capacity, lambda x, t, h, i, r: (len(h) >= 2, t)),
        "known_static": lambda: replay_static(
            R, a.capacity, lambda x, t, h, i, r: (len(h) >= 2, total[x], t)),
        "next500": lambda: replay_static(
            R, a.capacity, lambda x, t, h, i, r: (uses_within(x, t, 500), t)),
        "hazard_full": lambda: replay_scan(R, a.capacity, hazard_table(R, len(R), 300)),
        "hazard_half": lambda: replay_scan(R, a.capacity, hazard_table(R, len(R) // 2, 300)),
    }
    names = a.only.split(",") if a.only else list(rules)
    for n in names:
        if n not in rules:
            ap.error("unknown rule %s" % n)
    for n in names:
        print("%s capacity=%d hit=%.4f" % (n, a.capacity, rules[n]()))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
