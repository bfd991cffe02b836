/*
 * store.h — the block store's public API: a prefix-chain index with eviction.
 *
 * The idea (DESIGN.md §5): every cached block is named by its 256-bit chain key
 * (keys.h, docs/KEYSPEC.md) and remembers its parent, its token ids and how many
 * cached children it has. A prompt's cached prefix is found by walking its keys
 * from block 0 and comparing stored token ids, so a hash collision or a forged
 * key can never serve another prompt's KV.
 *
 * Invariants (checked by kvs_store_check and the unit tests):
 *  - Chains are whole: a cached block's parent is cached (no orphans), because
 *    insert requires the parent and eviction only takes blocks with no cached
 *    children ("leaves"); delete refuses an inner block unless asked for the
 *    subtree.
 *  - nchildren of every block equals the number of cached blocks naming it parent.
 *  - A pinned block is never evicted, nor a block under an unexpired read lease.
 *  - The number of cached blocks never exceeds capacity_blocks (when non-zero).
 *
 * Locking: one mutex per store, taken by every call. Lookups update recency and
 * frequency (policy state), so a reader/writer lock would be taken for writing
 * anyway; sharding by root key is the next step once a benchmark shows the
 * mutex is the limit (issue 4, item 7).
 *
 * This step is metadata-only: blocks carry a size and a (tier, location) pair
 * but no payload; the arena and tiers come next.
 */
#ifndef KVS_STORE_H
#define KVS_STORE_H

#include "keys.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvs_store kvs_store;

typedef struct kvs_store_opts {
    uint64_t capacity_blocks; /* 0 = unlimited */
    const char *policy;       /* kvs_store_policy_names(); NULL = "lru" */
    int verify_chain;         /* non-zero: insert checks key == SHA-256(parent key || tokens) */
    /* Clock for read leases, in milliseconds; NULL = CLOCK_MONOTONIC. Tests
     * pass their own to move time by hand. */
    uint64_t (*clock_ms)(void *arg);
    void *clock_arg;
} kvs_store_opts;

/* Why a block left the store. */
typedef enum kvs_evict_reason {
    KVS_EVICT_CAPACITY = 0, /* made room for an insert */
    KVS_EVICT_DELETE = 1,   /* kvs_store_delete of that block */
    KVS_EVICT_SUBTREE = 2,  /* removed as a descendant by a subtree delete */
    KVS_EVICT_RESIZE = 3,   /* capacity lowered by kvs_store_set_capacity */
    KVS_EVICT__COUNT
} kvs_evict_reason;

typedef struct kvs_store_stats {
    uint64_t blocks;            /* cached now */
    uint64_t capacity_blocks;
    uint64_t inserts;           /* blocks inserted */
    uint64_t lookups;           /* kvs_store_lookup calls */
    uint64_t lookup_blocks;     /* blocks asked for by lookups */
    uint64_t hit_blocks;        /* blocks served as a cached prefix */
    uint64_t refused;           /* inserts refused as forged/mismatched (KVS_EINVAL) */
    uint64_t not_admitted;      /* inserts the policy declined to admit (KVS_ENOSPC) */
    uint64_t evictions[KVS_EVICT__COUNT];
    const char *policy;         /* static storage */
} kvs_store_stats;

/* Opens an empty store. *out is owned by the caller, freed by kvs_store_close.
 * KVS_EINVAL for an unknown policy name. */
int kvs_store_open(const kvs_store_opts *o, kvs_store **out);
void kvs_store_close(kvs_store *s);

/*
 * Inserts one block. parent is NULL for block 0 of a chain (a root), otherwise
 * the key of block i-1, which must be cached. tokens (n_tokens >= 1) are copied.
 * Evicts by the current policy when the store is full. Returns:
 *   0             inserted;
 *   KVS_EEXIST    the same block (same key, parent and tokens) is already cached:
 *                 nothing changes except that it counts as an access — callers
 *                 may treat it as success;
 *   KVS_EINVAL    the key is cached with other tokens or another parent, or
 *                 verify_chain is on and key != SHA-256(parent || tokens):
 *                 a forged or colliding key, refused, nothing changes;
 *   KVS_EPRECOND  parent is not cached (insert the chain from its root);
 *   KVS_ENOSPC    full and nothing is evictable (every leaf pinned or leased), or the
 *                 policy's admission test judged the block less valuable than
 *                 the block it would evict (stats.not_admitted);
 *   KVS_ENOMEM.
 */
int kvs_store_insert(kvs_store *s, const kvs_key *key, const kvs_key *parent, uint32_t ns_id,
                     const uint32_t *tokens, uint32_t n_tokens, uint64_t size);

/*
 * Inserts the blocks of one Put in order: keys[i]'s parent is keys[i-1], and
 * keys[0]'s is parent (NULL when keys[0] is block 0 of its prompt). Blocks
 * already cached are accepted (the KVS_EEXIST case of kvs_store_insert). Tells
 * the policy where each block sits in the chain (how far from its end, whether
 * the chain extends a cached prefix), which the "prefix" policy learns from.
 * *inserted gets the number of leading blocks now cached; the return is 0 or
 * the status of the first block that failed (as for kvs_store_insert); the
 * blocks before it stay inserted (a shorter chain is still a valid prefix).
 */
int kvs_store_insert_chain(kvs_store *s, const kvs_key *keys, const kvs_key *parent,
                           uint32_t ns_id, const uint32_t *tokens, uint32_t block_tokens,
                           size_t nblocks, uint64_t size, size_t *inserted);

/*
 * Longest cached prefix of a chain: keys[0..nblocks) with block i's tokens at
 * tokens + i*block_tokens. Block i matches when keys[i] is cached, its parent is
 * the block matched at i-1 (a root for i = 0), and its stored tokens equal the
 * given ones. *matched gets the number of leading blocks that match; they count
 * as accessed (recency, frequency). Always 0 unless arguments are invalid.
 */
int kvs_store_lookup(kvs_store *s, const kvs_key *keys, const uint32_t *tokens,
                     uint32_t block_tokens, size_t nblocks, size_t *matched);

/*
 * kvs_store_lookup plus a read lease: every matched block is kept from eviction
 * and deletion for ttl_ms (from now; a later lease extends, never shortens),
 * so a Fetch that follows the Lookup cannot race eviction. A lease needs no
 * release; it just ends. ttl_ms at most 24 h (KVS_EINVAL beyond).
 */
int kvs_store_lookup_lease(kvs_store *s, const kvs_key *keys, const uint32_t *tokens,
                           uint32_t block_tokens, size_t nblocks, uint32_t ttl_ms,
                           size_t *matched);

/* Is the key cached (no access recorded)? 1 yes, 0 no. */
int kvs_store_contains(kvs_store *s, const kvs_key *key);

/* Deletes a block. Without subtree, a block with cached children is refused
 * (KVS_EPRECOND); with subtree its descendants go too. KVS_ENOTFOUND if absent,
 * KVS_EPERM if it (or, for a subtree, any descendant) is pinned or leased. */
int kvs_store_delete(kvs_store *s, const kvs_key *key, int subtree);

/* Pins keep a block (and therefore its ancestors) from eviction; counted. */
int kvs_store_pin(kvs_store *s, const kvs_key *key);
int kvs_store_unpin(kvs_store *s, const kvs_key *key); /* KVS_EPRECOND if not pinned */

/* Offline oracle for simulation: the logical time of the block's next use
 * (UINT64_MAX = never). Only the "belady" policy reads it. */
int kvs_store_hint(kvs_store *s, const kvs_key *key, uint64_t next_use);

/* Switches the eviction policy on a live store: the new policy's state is
 * rebuilt from every entry's recency, hit count and depth. KVS_EINVAL for an
 * unknown name (the old policy stays). */
int kvs_store_set_policy(kvs_store *s, const char *name);

/* Changes the capacity; lowering it evicts down to the new size (reason RESIZE)
 * or returns KVS_ENOSPC when pinned blocks prevent that (capacity still set). */
int kvs_store_set_capacity(kvs_store *s, uint64_t capacity_blocks);

void kvs_store_get_stats(kvs_store *s, kvs_store_stats *out);

/* Names of the policies, NULL-terminated, static storage. */
const char *const *kvs_store_policy_names(void);

/* Full consistency check of the invariants above (O(n)); 0 or KVS_EINTERNAL
 * with a description in err. For tests and debugging. */
int kvs_store_check(kvs_store *s, char *err, size_t errlen);

/* Bytes of index metadata per cached block, excluding token ids: the entry
 * plus its share of the hash table's bucket heads (for an empty store, the
 * share of one block). */
size_t kvs_store_meta_bytes_per_block(kvs_store *s);

#endif /* KVS_STORE_H */
