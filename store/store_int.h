/*
 * store_int.h — the store's internals shared by index.c (the index, eviction)
 * and payload.c (arena, tiers, two-phase writes, read references, leases,
 * quotas). Not a public header.
 *
 * The idea: one struct kvs_store, one reader/writer lock per store, made of
 * a writer mutex (s->wmu, with the s->writer flag) and reader stripes (the
 * busy word of each kvs__rbuf, below; index.c, rd_lock and kvs__lock). Every
 * call that changes the index, a payload, a lease or the policy takes the
 * write side through kvs__lock, and every do_ and kvs__ function here runs
 * with it held. Plain lookups (no lease) and contains take the read side, one
 * stripe: they only read the index (table slots, keys, parents, token ids),
 * and record the accesses they owe the policy in their stripe's read buffer
 * that kvs__lock drains before a writer does anything else. A writer therefore
 * sees every earlier lookup's accesses applied, in each thread's order, and
 * since nothing a lookup reads changes without the write lock, a buffered
 * leaf index still names the same blocks when it is drained. Writers are
 * preferred: once one has raised s->writer, new readers wait on wmu.
 *
 * Payload ownership: a DRAM block's bytes live in a chunk of the DRAM tier
 * whose first 64 bytes are a kvs__blob header; the entry's location points at
 * the blob while the block is cached there ("attached"). A read reference
 * counts in blob->refs. The chunk goes back to the tier when it is neither
 * attached nor referenced, so eviction, demotion and delete never free memory
 * a reader still holds.
 */
#ifndef KVS_STORE_INT_H
#define KVS_STORE_INT_H

#include "policy.h"
#include "store.h"
#include "tier.h"

#include <pthread.h>
#include <stdatomic.h>

/* Token ids of blocks, by exact length (one class per block_tokens in use, at
 * most KVS__TOK_CLASSES): slots carved from 2 MiB huge-page chunks, freed
 * slots reused, chunks returned at close. Other lengths use malloc. The first
 * length of at most 256 bytes stored is the primary one (prim): its slot is
 * fixed by the entry index (chunk[i >> shift] + (i & mask) * bytes), so a
 * lookup can start loading an entry's tokens together with the entry. */
#define KVS__TOK_CLASSES 8
typedef struct kvs__tokpool {
    struct {
        uint32_t n;      /* tokens per slot; 0 = not chosen yet */
        uint32_t shift;  /* entries per chunk = 1 << shift */
        uint32_t nchunk; /* length of chunk[] */
        uint8_t **chunk; /* NULL = not allocated yet */
    } prim;
    struct {
        uint32_t n;    /* tokens per slot */
        void *free;    /* freed slots, linked through their first 8 bytes */
        uint8_t *cur;  /* bump pointer in the newest chunk */
        size_t left;
    } c[KVS__TOK_CLASSES];
    uint32_t nc;
    void **chunks;
    uint32_t nchunks, cap_chunks;
} kvs__tokpool;

struct kvs__index {
    kvs__entry *e;       /* entries[cap_e] */
    uint32_t cap_e;      /* slots allocated */
    uint32_t used_e;     /* slots ever used (high-water mark) */
    uint32_t free_head;  /* free list through hnext */
    uint32_t *slot;      /* hash table (index.c): entry | tag << ibits, or empty / tombstone */
    uint32_t nslot;      /* slots (>= 1024, a multiple of 16) */
    uint32_t used_slot;  /* slots not empty: live entries and tombstones */
    uint32_t ibits;      /* low bits of a slot naming the entry (log2 cap_e, >= 10) */
    uint64_t count;      /* live entries */
    uint64_t capacity;   /* 0 = unlimited */
    uint64_t tick;       /* access clock */
    kvs__tokpool tp;     /* token ids */
};

#define KVS__BLOB_HDR 64u

/* Header at the start of a payload chunk; the payload follows at +64. */
typedef struct kvs__blob {
    uint32_t refs;     /* read references */
    uint8_t attached;  /* an entry's location points here */
    uint8_t heap;      /* a private copy (SSD read that could not be promoted): free() */
    uint16_t tenant;
    uint64_t size;     /* payload bytes */
    uint64_t charged;  /* bytes the DRAM tier charged for the chunk (0 for heap copies) */
} kvs__blob;

static inline void *kvs__blob_data(kvs__blob *b) { return (uint8_t *)b + KVS__BLOB_HDR; }

/* A lease record: lookup_leased's matched blocks or one TTL pin. An ended
 * record stays in place (idx == NULL) until the array is compacted, so ending
 * one costs no memmove and ids stay sorted for the binary search. */
typedef struct kvs__hold {
    uint64_t id;
    uint32_t until; /* store clock ms */
    uint32_t n : 31;
    uint32_t pin : 1; /* a TTL pin (kvs_store_pin_ex): kvs_store_unpin may end it */
    uint32_t *idx;  /* entries; KVS__NIL once an entry was force-dropped */
} kvs__hold;

/* The SSD tier's demotion order: oldest first, stale items skipped. */
typedef struct kvs__ssd_item {
    uint32_t idx;
    uint64_t seq;
} kvs__ssd_item;

/* A read buffer: the accesses lookups owe the policy. Each lookup that
 * matched appends the index of its deepest matched block (the drain touches
 * it and its ancestors, leaf first, as an immediate lookup would) and adds to
 * the counters. Threads spread over KVS__RSTRIPES stripes (one each, by a
 * thread-local number); a reader holds its stripe (busy = 1) for its whole
 * lookup, so a buffer has one user at a time, and holding a stripe is holding
 * the read side. A buffer that fills is drained by its lookup (read side held, plus
 * s->drain_mu, so one drainer at a time and never beside a writer) when
 * drain_mu is free, else that lookup's access is dropped (counters are kept
 * whatever happens); kvs__lock drains every buffer whose bit is set in
 * s->rmask (set by the lookup that makes a buffer non-empty). A single thread never finds
 * drain_mu taken, so it loses nothing: it sees exactly the policy state of
 * immediate accesses. */
#define KVS__RSTRIPES 16u
#define KVS__RBUF 128u
_Static_assert(KVS__RSTRIPES <= 32, "rmask has one bit per read buffer");
typedef struct kvs__rbuf {
    _Alignas(64) atomic_uint busy; /* 1 while a reader holds the stripe (index.c, rd_lock) */
    uint32_t n;
    uint64_t lookups, lookup_blocks, hit_blocks;
    uint32_t leaf[KVS__RBUF];
} kvs__rbuf;

#define KVS__NTENANTS 65536u
#define KVS__BUSY_MAX 64u

struct kvs_store {
    pthread_mutex_t wmu;      /* the write side: every call but lookup (no lease) and contains */
    atomic_uint writer;       /* 1 while the holder of wmu keeps readers out */
    pthread_mutex_t drain_mu; /* a reader draining its full read buffer */
    kvs__rbuf *rbuf;          /* [KVS__RSTRIPES], 64-byte aligned */
    atomic_uint rmask;        /* bit k set whenever rbuf[k] is not empty (a writer
                                 reads one word when no lookup ran since the last) */
    kvs__index ix;
    const kvs__policy_ops *pol;
    void *pst;
    int verify_chain;
    kvs_store_stats st;
    uint64_t (*clock_ms)(void *arg);
    void *clock_arg;
    uint32_t *parked; /* entries with KVS__F_PARKED */
    uint32_t nparked, cap_parked;
    /* Set aside by the running eviction (KVS__F_SKIP): prot = protected by
     * priority, stuck = cannot be removed in this mode. */
    uint32_t *prot, nprot, cap_prot;
    uint32_t *stuck, nstuck, cap_stuck;

    /* Payloads. */
    kvs_tier *dram;           /* always present (unbounded heap arena by default) */
    kvs_tier *ssd;            /* NULL = no SSD tier */
    uint64_t region_bytes;    /* DRAM arena size fixed at open; 0 = heap-backed */
    uint64_t cap_bytes;       /* DRAM byte bound now; 0 = none */
    double high, low;         /* watermarks, fractions of cap_bytes */
    uint64_t used;            /* DRAM bytes charged: committed, reserved, held by readers */
    uint64_t ssd_cap, ssd_used;
    kvs_store_payload_stats ps;
    uint64_t *t_bytes;        /* per tenant: committed payload bytes, all tiers */
    uint64_t *t_resv;         /* per tenant: reserved (begun, not committed) */
    uint64_t *t_quota;        /* per tenant: 0 = none */
    kvs__hold *holds;         /* sorted by id */
    uint32_t nholds, cap_holds;
    uint32_t ndead_holds;     /* ended records (idx == NULL) not yet compacted away */
    uint32_t holds_min_until; /* earliest expiry among holds (valid when nholds) */
    uint64_t next_hold_id;
    kvs__ssd_item *ring;      /* circular; demotion order */
    uint32_t ring_head, ring_n, ring_cap;
    uint64_t ssd_seq;
    uint64_t ssd_blocks;      /* entries on the SSD tier */
    /* Reads of SSD blocks in flight outside the lock (payload.c, do_fetch_ssd):
     * the entry is held (holds + 1) so only a forced drop can remove it, and
     * do_remove marks the slot so the reader knows. */
    struct {
        uint32_t idx;
        uint8_t used, removed;
    } busy[KVS__BUSY_MAX];
    uint32_t nbusy;
};

enum { KVS__EV_COUNT = 0, KVS__EV_BYTES = 1 };

/* index.c */
void kvs__lock(kvs_store *s);   /* write side; drains the read buffers */
void kvs__unlock(kvs_store *s);
uint32_t kvs__find(const kvs__index *ix, const kvs_key *k);
void kvs__refresh(kvs_store *s, uint32_t i);
/* Keeps parent p (KVS__NIL: none) from being chosen as the victim that makes
 * room for its own child, with a guard pin; 1 when it took one. A pin count
 * at its maximum already keeps it, and must not wrap: then none is taken.
 * kvs__parent_unguard(s, p, guard) gives back what kvs__parent_guard took.
 * With the store lock. */
int kvs__parent_guard(kvs_store *s, uint32_t p);
void kvs__parent_unguard(kvs_store *s, uint32_t p, int guard);
void kvs__touch(kvs_store *s, uint32_t i);
void kvs__remove(kvs_store *s, uint32_t i, kvs_evict_reason why);
int kvs__lease_active(const kvs_store *s, const kvs__entry *x);
uint32_t kvs__now(const kvs_store *s);
int kvs__insert(kvs_store *s, const kvs_key *key, const kvs_key *parent, uint32_t ns_id,
                const uint32_t *tokens, uint32_t n_tokens, uint64_t size, uint8_t ctx,
                int verify, uint32_t *out_idx);
/* Evicts until the block count is below goal (COUNT) or DRAM usage is at most
 * goal (BYTES). 0, or KVS_ENOSPC when nothing more can go. */
int kvs__evict(kvs_store *s, int mode, uint64_t goal, kvs_evict_reason why);
int kvs__drop_subtree(kvs_store *s, uint32_t t, kvs_evict_reason why);

/* payload.c */
int kvs__payload_open(kvs_store *s, const kvs_store_payload_opts *p);
void kvs__payload_close(kvs_store *s);
void kvs__payload_detach(kvs_store *s, kvs__entry *x); /* entry leaving: its payload goes */
int kvs__demote(kvs_store *s, uint32_t i);             /* DRAM -> SSD */
int kvs__ssd_drop_oldest(kvs_store *s, kvs_evict_reason why);
void kvs__reap_holds(kvs_store *s);
void kvs__holds_scrub(kvs_store *s, uint32_t i); /* entry i is being force-dropped */
int kvs__payload_check(kvs_store *s, char *err, size_t errlen);
int kvs__unpin_ttl(kvs_store *s, uint32_t i); /* ends one TTL pin of i; KVS_EPRECOND if none */
void kvs__busy_removed(kvs_store *s, uint32_t i); /* entry i leaves while being read */

#endif /* KVS_STORE_INT_H */
