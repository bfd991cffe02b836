/*
 * trace_rec.h — `kvstashd --record-trace FILE`: the requests the server
 * serves, written as a Mooncake-format trace that kvstash-sim replays.
 *
 * One JSON object per line (../shared/traces/README.md, store/trace.h):
 *   {"timestamp": ms since recording began, "input_length": tokens,
 *    "output_length": 0, "hash_ids": [ids...], "op": "lookup"|"put"}
 * hash_ids are the request's 32-byte chain keys remapped to small integers in
 * first-seen order (0, 1, 2, ...). Chain keys already encode the tenant, the
 * namespace and the whole prefix, so two lines share their first n ids
 * exactly when they share an n-block cached prefix, which is what the
 * simulator needs. No token ids and no key bytes are written.
 *
 * What becomes a line:
 *  - Lookup: one line per call, the chain keys of every full block of the
 *    prompt (matched or not), root first. That is the demand the cache sees;
 *    kvstash-sim's replay (look up the prefix, insert the misses) models the
 *    Lookup-then-Put cycle of a worker.
 *  - Put: a block whose key some earlier line already holds writes nothing
 *    (a worker filling the miss of its Lookup: the replay inserts it already).
 *    A block never seen before (a worker that puts without looking up) writes
 *    one line: the chain of known ancestors through its parent, then itself.
 *    A parent never seen gets an id of its own, so the line still starts
 *    where the prefix starts as far as the recording knows.
 *
 * Thread-safe: one mutex around the id table and the write. Lines reach the
 * file at least once a second (and all of them at close), so a trace can be
 * simulated while the server keeps recording, without a write(2) per Lookup.
 */
#ifndef KVS_TRACE_REC_H
#define KVS_TRACE_REC_H

#include <stddef.h>
#include <stdint.h>

#define KVS_TRACE_KEY_LEN 32

typedef struct kvs_trace_rec kvs_trace_rec;

/* Creates (truncates) path and starts recording. Errors: KVS_EIO (cannot
 * open), KVS_ENOMEM; err (KVS_ERR_LEN, may be NULL) says which. */
int kvs_trace_rec_open(const char *path, kvs_trace_rec **out, char *err);

/* Records one Lookup: n_keys chain keys (32 bytes each, root first) of the
 * prompt's full blocks, and the prompt length in tokens. Returns 0,
 * KVS_ENOMEM or KVS_EIO (the line is then dropped; recording continues). */
int kvs_trace_rec_lookup(kvs_trace_rec *r, const uint8_t (*keys)[KVS_TRACE_KEY_LEN], size_t n_keys,
                         size_t n_tokens);

/* Records one Put answered OK (stored, or already present) with this key;
 * parent_key is NULL for a root. A line written for it has input_length =
 * block_tokens x the chain length the recording knows. */
int kvs_trace_rec_put(kvs_trace_rec *r, const uint8_t *key, const uint8_t *parent_key,
                      unsigned block_tokens);

/* Lines written so far. */
uint64_t kvs_trace_rec_lines(const kvs_trace_rec *r);

/* Flushes, closes and frees. NULL is a no-op. */
void kvs_trace_rec_close(kvs_trace_rec *r);

#endif /* KVS_TRACE_REC_H */
