/*
 * trace.h — Mooncake-format request traces: load, generate, replay through the store.
 *
 * The idea: a trace is a list of requests, each a chain of block ids (hash_ids,
 * one per 512-token block in the Mooncake trace; two requests sharing the first
 * n ids share an n-block prefix). Replay turns every chain into real chain keys
 * (keys.h) and drives the real store (store.h): for each request, look up the
 * longest cached prefix (those blocks are prefix hits), then insert the missing
 * blocks in order, evicting by the policy under test. The metric is the
 * prefix-hit fraction of ../shared/traces/README.md: hit blocks / requested blocks.
 *
 * Ownership: a kvs_trace is allocated by kvs_trace_load / kvs_trace_generate and
 * freed by kvs_trace_free; replay borrows it.
 */
#ifndef KVS_TRACE_H
#define KVS_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kvs_trace {
    size_t nreq;
    size_t *off;       /* request r's blocks are ids[off[r] .. off[r+1]) */
    uint32_t *ids;     /* all hash ids, request after request */
    size_t nblocks;    /* == off[nreq] */
    uint8_t *put;      /* per request: 1 = a put line (its chain is inserted, it is not
                          demand), 0 = a lookup; NULL = every request is a lookup */
} kvs_trace;

/* Reads JSONL from f. Blank lines are skipped; any other line must be an
 * object with an array "hash_ids" of integers in 0..2^32-1 and, optionally,
 * "op": "lookup" (the default) or "put" (kvstashd --record-trace writes put
 * lines for blocks put without a preceding Lookup); other members are ignored.
 * On a malformed line: KVS_EFORMAT and err = "<name>:<line>: <why>". */
int kvs_trace_load(FILE *f, const char *name, kvs_trace **out, char *err, size_t errlen);

/* Writes the trace as JSONL (timestamp = request index, input_length =
 * 512 * blocks, output_length = 0, and "op": "put" on put lines). */
int kvs_trace_write(const kvs_trace *t, FILE *f);

void kvs_trace_free(kvs_trace *t);

/* Synthetic mixes for checking a policy beyond one trace (docs/EVICTION.md):
 * "chat" (multi-turn conversations on a few shared system prompts), "sysprompt"
 * (many short one-shot questions on shared system prompts), "docs" (long one-off
 * documents, some asked again), "mix" (all three interleaved).
 * KVS_EINVAL for an unknown kind. */
int kvs_trace_generate(const char *kind, size_t nreq, uint64_t seed, kvs_trace **out);

typedef struct kvs_replay_result {
    uint64_t requested; /* blocks requested (lookup lines) */
    uint64_t hits;      /* blocks served as a cached prefix */
    uint64_t evictions; /* capacity evictions */
    double seconds;     /* wall time of the replay */
    uint64_t put_blocks; /* blocks named by put lines (inserted; not in requested) */
} kvs_replay_result;

/* Replays t through a fresh store with this policy and capacity. A put line
 * inserts its chain (blocks already cached count as accessed, as a Put of a
 * cached block does) and adds nothing to requested or hits: the lookup lines
 * alone are the demand. For "belady" the replay feeds every block's next use
 * (by a lookup line) to the store (kvs_store_hint).
 * check_every > 0 runs kvs_store_check every that many requests (tests). */
int kvs_trace_replay(const kvs_trace *t, const char *policy, uint64_t capacity_blocks,
                     size_t check_every, kvs_replay_result *out, char *err, size_t errlen);

#endif /* KVS_TRACE_H */
