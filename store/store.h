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
 * Locking: one reader/writer lock per store (writers preferred). Every call is
 * thread-safe. kvs_store_lookup (no lease) and kvs_store_contains take the
 * read side and run in parallel; a lookup's accesses (recency, frequency) are
 * buffered per thread and applied, in each thread's order, before the next
 * call that takes the write side (every other call) or when the buffer fills,
 * so a single thread sees exactly the effect of immediate accesses. Lookups
 * with a lease change entry state and take the write side.
 *
 * Blocks inserted with kvs_store_insert are metadata-only (tier NONE, a size
 * but no payload); kvs_store_write_begin/commit store a payload (lower half).
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
    KVS_EVICT_RESIZE = 3,   /* capacity lowered by kvs_store_set_capacity(_bytes) */
    KVS_EVICT_WATERMARK = 4, /* DRAM above its high watermark, no SSD tier to take it */
    KVS_EVICT_QUOTA = 5,    /* the tenant's own block, to fit its quota */
    KVS_EVICT_DEMOTE = 6,   /* moved from DRAM to the SSD tier: still cached (counted
                               here because it left DRAM; payload stats count it too) */
    KVS_EVICT_CORRUPT = 7,  /* its SSD copy failed its checksum (descendants: SUBTREE) */
    KVS_EVICT_SSD_FULL = 8, /* dropped from the SSD tier to make room there */
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
 * the key of block i-1, which must be cached. tokens (1 <= n_tokens <= 65535)
 * are copied; a chain holds at most 65536 blocks (KVS_EINVAL beyond).
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
 * already cached are accepted (the KVS_EEXIST case of kvs_store_insert). Each
 * new entry records where it sat in the Put (how far from its end, whether the
 * chain extended a cached prefix: its insert context); no policy reads it today.
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
 * plus its share of the hash table's slots (for an empty store, the
 * share of one block). */
size_t kvs_store_meta_bytes_per_block(kvs_store *s);

/* ==========================================================================
 * Payloads: the arena, tiers, tenants (issue 4 items 3-5; used by service/).
 *
 * The idea: a block's payload (an encoded block, kernels/block/kv_block.h) lives
 * in a tier; the index entry holds (tier, location, size). Writing is two-phase
 * so nothing half-written is ever served: write_begin reserves arena memory
 * (evicting by policy, honouring watermarks and the tenant's quota) and hands
 * out a private buffer; write_commit inserts the entry, which becomes visible to
 * lookups only then; write_abort gives the memory back. Reading takes a
 * reference that keeps the payload's memory alive until read_release, whatever
 * eviction or delete does meanwhile (an evicted block's memory is reclaimed at
 * its last release).
 *
 * Capacity: capacity_bytes bounds the DRAM tier's charged bytes: each block
 * takes a slab chunk of its size plus a 64-byte header, rounded up by under a
 * quarter (store/slab.c); reservations and chunks still referenced by readers
 * count (0 = no byte bound; capacity_blocks still applies). The arena is that
 * size, fixed at open. When usage after a reservation would exceed
 * high_watermark * capacity_bytes, eviction runs until usage is at most
 * low_watermark * capacity_bytes. With an SSD tier, blocks evicted from DRAM
 * are demoted (written to a file with a checksum) instead of dropped, and
 * promoted back on read; a file that fails its checksum is dropped and never
 * served. docs/EVICTION.md §6 has the rules (priorities, quotas, reasons).
 *
 * Ownership: every kvs_store_wr must be committed or aborted, and every
 * kvs_store_ref released, before kvs_store_close. Metadata-only blocks
 * (kvs_store_insert) have no payload: read says KVS_ENOTFOUND and
 * lookup_leased does not match them; write_begin of an identical block is
 * still KVS_EEXIST.
 * ========================================================================== */

typedef uint16_t kvs_tenant_id; /* 0 = the default tenant; the service numbers the rest */

/* Store-wide payload options, given to kvs_store_open_ex. */
typedef struct kvs_store_payload_opts {
    uint64_t capacity_bytes;   /* DRAM payload bytes; 0 = unbounded */
    double high_watermark;     /* fraction of capacity_bytes that starts eviction; 0 = 1.0 */
    double low_watermark;      /* eviction goes down to this fraction; 0 = high_watermark */
    const char *ssd_dir;       /* NULL = no SSD tier; else an existing writable directory */
    uint64_t ssd_capacity_bytes; /* 0 = unbounded */
    /* The DRAM arena (capacity_bytes > 0) as a memfd another process may map
     * (kvs_store_shared_memory): kvstashd's isolated UCX data plane reads
     * blocks from it in place. */
    int shareable;
    /* Tests: wrap the DRAM (fault_tier == 1) or SSD (2) tier in the fault-injecting
     * tier, failing every fault_every-th operation with fault_status
     * (KVS_ENOSPC or KVS_EIO). 0 = off. */
    int fault_tier;
    uint32_t fault_every;
    int fault_status;
} kvs_store_payload_opts;

/* kvs_store_open with payload options (p may be NULL: an unbounded heap-backed DRAM
 * tier, no SSD). KVS_EINVAL for watermarks outside 0 < low <= high <= 1 or a bad
 * fault setting; KVS_ENOTFOUND / KVS_EPERM for a missing / read-only ssd_dir. */
int kvs_store_open_ex(const kvs_store_opts *o, const kvs_store_payload_opts *p, kvs_store **out);

/* Where a payload lives. */
typedef enum kvs_tier_kind {
    KVS_TIER_NONE = 0,   /* metadata-only block */
    KVS_TIER_DRAM = 1,   /* host memory (pinned when CUDA is present) */
    KVS_TIER_GPU = 2,
    KVS_TIER_SSD = 3,
} kvs_tier_kind;

/* One block to write. Strings and arrays are borrowed for the call. */
typedef struct kvs_store_put {
    const kvs_key *key;
    const kvs_key *parent;   /* NULL for a root */
    uint32_t ns_id;
    kvs_tenant_id tenant;
    const uint32_t *tokens;
    uint32_t n_tokens;
    uint64_t size;           /* payload bytes, >= 1 */
    int8_t priority;         /* higher survives longer; 0 = normal */
} kvs_store_put;

typedef struct kvs_store_wr kvs_store_wr;

/*
 * Reserves room for one block and returns a private, 64-byte aligned buffer of
 * p->size bytes in *buf. Nothing is visible until commit. Returns 0, or:
 *   KVS_EEXIST    the identical block is already cached (nothing reserved);
 *   KVS_EINVAL    key cached with other tokens/parent, forged key (verify_chain),
 *                 or bad arguments;
 *   KVS_EPRECOND  parent not cached;
 *   KVS_ENOSPC    the tenant's quota, or nothing evictable, or the tier is full;
 *   KVS_ENOMEM.
 */
int kvs_store_write_begin(kvs_store *s, const kvs_store_put *p, kvs_store_wr **w, void **buf);

/*
 * What write_begin would say about p before any room is made: the same
 * checks of the key, tokens and parent (KVS_EEXIST touches the cached block,
 * as write_begin does), and KVS_ENOSPC when no eviction could ever make room
 * (more than the tenant's quota, or larger than the memory tier). Reserves,
 * evicts and changes nothing else. For writers that receive the payload
 * first and reserve only when it is complete (an aborted upload then evicts
 * nothing).
 */
int kvs_store_write_check(kvs_store *s, const kvs_store_put *p);

/*
 * Makes the block visible. Re-checks what may have changed since begin: the
 * parent was evicted (KVS_EPRECOND), another writer committed the same block
 * (KVS_EEXIST: callers treat it as success). On any non-zero return the
 * reservation is released. w is consumed either way.
 */
int kvs_store_write_commit(kvs_store *s, kvs_store_wr *w);

/* Gives the reservation back (client cancelled, payload malformed). w is consumed. */
void kvs_store_write_abort(kvs_store *s, kvs_store_wr *w);

/* A read reference: data stays valid and unchanged until kvs_store_read_release. */
typedef struct kvs_store_ref {
    const void *data;
    uint64_t size;
    kvs_tier_kind tier;    /* where the block was found (SSD: promoted or copied) */
    uint32_t ns_id;
    kvs_tenant_id tenant;
    void *h_;              /* private */
} kvs_store_ref;

/*
 * Takes a reference to a cached block's payload and counts an access.
 * KVS_ENOTFOUND if absent (or metadata-only); KVS_EFORMAT when the SSD copy
 * failed its checksum (the block and its descendants are dropped, whatever
 * pins or leases they had); KVS_EIO (the block stays on SSD). An SSD block is
 * promoted to DRAM, or, when DRAM cannot make room, served from a private copy
 * (ref->tier == KVS_TIER_SSD). The file is read without the store lock; while
 * it is, the block cannot be deleted (KVS_EPERM) or evicted. Releasing a ref
 * twice is harmless (the first release clears it).
 */
int kvs_store_read(kvs_store *s, const kvs_key *key, kvs_store_ref *ref);
void kvs_store_read_release(kvs_store *s, kvs_store_ref *ref);

/*
 * kvs_store_lookup plus a lease with an id: the matched blocks are kept from
 * eviction and deletion until ttl_ms passes or kvs_store_lease_release. Only
 * blocks of `tenant` match (another tenant's block with the same key is not
 * seen). *lease_id = 0 when nothing matched. ttl_ms 1..24 h.
 */
int kvs_store_lookup_leased(kvs_store *s, kvs_tenant_id tenant, const kvs_key *keys,
                            const uint32_t *tokens, uint32_t block_tokens, size_t nblocks,
                            uint32_t ttl_ms, size_t *matched, uint64_t *lease_id);
/*
 * What kvstashd's Lookup needs of the store, in one write-lock acquisition:
 * kvs_store_lookup_leased (same matches, same lease, same statuses; the
 * matched blocks' accesses are counted once each, leaf first, exactly as
 * kvs_store_lookup counts them) plus, for each matched block k, out[k]: its
 * size, tier, namespace and a copy of the first min(size,
 * KVS_STORE_PEEK_BYTES) bytes of its payload when it is in DRAM (peek_len
 * 0 for a block on the SSD tier, whose file is not read). The copy is taken
 * under the lock, so no read reference is needed to look at it, and it is the
 * caller's: out (nblocks entries, caller-owned; may be NULL, then this is
 * kvs_store_lookup_leased) is written only for k < *matched. The peek bytes
 * are the block's own, as written by its Put: callers treat them as they
 * would the payload (bounds-check before use).
 */
#define KVS_STORE_PEEK_BYTES 64u /* one cache line: a block header + 24 scheme bytes */
typedef struct kvs_store_match {
    uint64_t size;      /* payload bytes */
    kvs_tier_kind tier; /* KVS_TIER_DRAM or KVS_TIER_SSD */
    uint32_t ns_id;
    uint32_t peek_len; /* bytes valid in peek */
    uint8_t peek[KVS_STORE_PEEK_BYTES];
} kvs_store_match;
int kvs_store_lookup_leased_info(kvs_store *s, kvs_tenant_id tenant, const kvs_key *keys,
                                 const uint32_t *tokens, uint32_t block_tokens, size_t nblocks,
                                 uint32_t ttl_ms, kvs_store_match *out, size_t *matched,
                                 uint64_t *lease_id);
/* Ends a lease early. KVS_ENOTFOUND if unknown or already expired. */
int kvs_store_lease_release(kvs_store *s, uint64_t lease_id);

/* Per-tenant payload quota in bytes (all tiers, plus writes begun and not yet
 * committed); 0 = none. A write that would exceed it first evicts the tenant's own
 * blocks (unprotected leaves, lowest priority then least recent), then fails
 * KVS_ENOSPC. Setting a lower quota evicts nothing until the tenant's next write. */
int kvs_store_set_quota(kvs_store *s, kvs_tenant_id tenant, uint64_t bytes);

/* The shared DRAM arena (payload opts.shareable): its memfd (owned by the
 * store, open until kvs_store_close), mapping and length; KVS_ENODEV when the
 * store has none (not shareable, or heap-backed: capacity_bytes 0). Blocks
 * read with kvs_store_read lie inside it while they are in DRAM. */
int kvs_store_shared_memory(kvs_store *s, int *fd, const void **base, uint64_t *len);

/* Populates the memory tier's arena now (kvs_tier_dram_prefault: every page
 * faulted in, no byte changed), so no Put pays the kernel's first touch of a
 * page: 0 (also for a pinned tier, resident since registration); KVS_ENODEV
 * (heap-backed store, or a kernel without MADV_POPULATE_WRITE: nothing done);
 * KVS_ENOMEM (the machine cannot back it all). Takes no lock: safe at any time. */
int kvs_store_prefault(kvs_store *s);

/* Runtime tunables; each KVS_EINVAL when out of range (nothing changes).
 * set_capacity_bytes: at most the arena size given at open (any value for a
 * heap-backed store); lowering it evicts (reason RESIZE) and returns KVS_ENOSPC
 * when protected blocks keep usage above the new bound (the bound is still set).
 * set_watermarks: 0 < low <= high <= 1; evicts at once if usage is above high. */
int kvs_store_set_capacity_bytes(kvs_store *s, uint64_t bytes);
int kvs_store_set_watermarks(kvs_store *s, double high, double low);

/* Pin with a priority (kvs_store_pin is priority 0) and an optional TTL (0 = until Unpin;
 * ttl_ms at most 24 h). kvs_store_unpin ends a counted pin first, else one TTL pin early.
 * The block keeps the highest priority it was given (Put or pin_ex): once no pin holds
 * it, blocks of priority > 0 are evicted only when no unprotected candidate is left,
 * lowest priority first (docs/EVICTION.md §6); negative priorities count as 0. */
int kvs_store_pin_ex(kvs_store *s, const kvs_key *key, int8_t priority, uint32_t ttl_ms);

/* Facts about one cached block (no access recorded). KVS_ENOTFOUND if absent. */
typedef struct kvs_store_info {
    uint64_t size;
    kvs_tier_kind tier;
    uint32_t ns_id;
    kvs_tenant_id tenant;
    uint32_t depth;
    uint32_t nchildren;
    uint16_t pins;
} kvs_store_info;
int kvs_store_info_get(kvs_store *s, const kvs_key *key, kvs_store_info *out);

/* Payload figures (bytes per tier, per tenant) for Stats and /metrics. */
typedef struct kvs_store_payload_stats {
    uint64_t bytes[4];            /* by kvs_tier_kind */
    uint64_t capacity_bytes;
    uint64_t reserved_bytes;      /* written but not committed */
    uint64_t demotions, promotions;
    uint64_t corrupt_dropped;     /* SSD copies that failed their checksum */
    uint64_t io_errors;
    uint64_t quota_refused;
    uint64_t used_bytes;          /* DRAM bytes charged: slab chunks with their 64-byte
                                     headers, committed + reserved + held by readers of
                                     blocks that left (what capacity_bytes bounds) */
    uint64_t ssd_capacity_bytes;
    uint64_t leases;              /* lease records (and TTL pins) now active */
    int pinned;                   /* the DRAM arena is registered with CUDA */
} kvs_store_payload_stats;
void kvs_store_get_payload_stats(kvs_store *s, kvs_store_payload_stats *out);
/* Bytes stored for one tenant (all tiers). */
uint64_t kvs_store_tenant_bytes(kvs_store *s, kvs_tenant_id tenant);

#endif /* KVS_STORE_H */
