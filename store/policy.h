/*
 * policy.h — the store's internal eviction-policy interface and index entry.
 *
 * Not a public header: only the store .c files include it (kvs__ names, STYLE.md).
 *
 * The idea: the index owns the entries and decides *which* blocks may be
 * evicted: a block is a candidate when it is live, in memory (DRAM or
 * metadata-only, not on the SSD tier), has no cached children in memory, and
 * is not pinned, held by a lease record or set aside (so evicting it never
 * orphans anything: a candidate whose children are all on SSD is demoted, not
 * dropped — index.c, kvs__evict). A policy only orders
 * candidates: the index tells it when a block appears, is accessed, becomes or
 * stops being a candidate, and goes away, and asks it for a victim. Each policy
 * keeps its state in the entry's policy fields (plink, pkey, paux, pbits) and
 * in its own struct; the generic history (last_access, hits, depth) belongs to
 * the index, so switching policy rebuilds the new policy's state from it.
 *
 * Invariants: victim() returns a candidate or KVS__NIL, never anything else;
 * a policy never touches the index links (parent, hnext, nchildren).
 */
#ifndef KVS_POLICY_H
#define KVS_POLICY_H

#include "keys.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define KVS__NIL UINT32_MAX

enum {
    KVS__F_LIVE = 1, /* slot holds a cached block */
    KVS__F_CAND = 2, /* registered with the policy as an eviction candidate */
    KVS__F_PARKED = 4, /* met as a victim while leased: out of the candidates until
                          its lease ends (index.c, do_unpark) */
    KVS__F_SKIP = 8,   /* set aside by the running eviction (protected by priority, or
                          not removable in that mode); back among the candidates
                          when that eviction ends (index.c, kvs__evict) */
};

/* One cached block. Entries live in one array and link to each other by
 * 32-bit index, which keeps the entry at 120 bytes (128 with its hash-table slots). */
typedef struct kvs__entry {
    kvs_key key;          /* 32: chain key */
    uint32_t *tokens;     /*  8: token ids (own allocation, not counted as metadata) */
    uint64_t location;    /*  8: DRAM: the payload's kvs__blob; SSD: demotion number */
    uint64_t last_access; /*  8: index tick of the last access */
    uint64_t pkey;        /*  8: policy: heap key / score / next use */
    uint32_t size;        /*  4: payload bytes (metadata-only blocks: the caller's figure) */
    uint32_t lease_ms;    /*  4: anonymous read lease expiry, store clock ms; 0 = none */
    uint32_t parent;      /*  4: parent entry or KVS__NIL for a root */
    uint32_t hnext;       /*  4: free-list link while the slot is free */
    uint32_t nchildren;   /*  4: cached children */
    uint32_t memkids;     /*  4: cached children not on the SSD tier */
    uint32_t ns_id;       /*  4: namespace id */
    uint32_t plink[2];    /*  8: policy: list prev/next, or plink[0] = heap slot */
    uint32_t paux;        /*  4: policy: auxiliary counter */
    uint16_t hits;        /*  2: accesses after the insert (saturating) */
    uint16_t depth;       /*  2: block index in its chain (0 = root; at most 65535) */
    uint16_t n_tokens;    /*  2: at most 65535 */
    uint16_t pins;        /*  2: kvs_store_pin count */
    uint16_t holds;       /*  2: lease records (and TTL pins) naming this block */
    uint16_t tenant;      /*  2: kvs_tenant_id */
    uint8_t tier;         /*  1: kvs_tier_kind */
    uint8_t flags;        /*  1: KVS__F_* (low nibble) | policy bits (high nibble) */
    uint8_t ctx;          /*  1: insert context, KVS__CTX_* (what the Put knew) */
    int8_t prio;          /*  1: protection priority (kvs_store_put, kvs_store_pin_ex) */
} kvs__entry;

/* Insert context: how far the block was from the end of the chain being put
 * (0 = the last block, 3 = three or more), and whether that chain extended an
 * already cached prefix. kvs_store_insert_chain knows both; a single insert
 * records "far from the end, fresh chain". */
#define KVS__CTX_TAIL_MASK 3u
#define KVS__CTX_EXTENDS 4u

/* 120 bytes of fields, no padding; with its share of the hash table (4/3 to
 * 5/3 slots of 4 bytes as the store fills, index.c) a block costs at most 128 bytes. The payload's
 * own 64-byte header (kvs__blob) lives in its arena chunk, counted there. */
static_assert(sizeof(kvs__entry) <= 120, "index entry must stay within 120 bytes");

typedef struct kvs__index kvs__index;

/* The entry array, for policies (valid until the next insert). */
kvs__entry *kvs__entries(kvs__index *ix);
uint64_t kvs__capacity(kvs__index *ix);
uint64_t kvs__count(kvs__index *ix);

typedef struct kvs__policy_ops {
    const char *name;
    int (*create)(kvs__index *ix, void **state); /* 0 or KVS_ENOMEM */
    void (*destroy)(void *st);
    void (*on_insert)(void *st, kvs__index *ix, uint32_t e); /* new block */
    void (*on_access)(void *st, kvs__index *ix, uint32_t e); /* hit or re-insert */
    void (*add_cand)(void *st, kvs__index *ix, uint32_t e);  /* became evictable */
    void (*del_cand)(void *st, kvs__index *ix, uint32_t e);  /* stopped being evictable */
    void (*on_remove)(void *st, kvs__index *ix, uint32_t e); /* leaving (already not a candidate) */
    uint32_t (*victim)(void *st, kvs__index *ix);            /* a candidate or KVS__NIL */
    void (*on_hint)(void *st, kvs__index *ix, uint32_t e, uint64_t next_use); /* may be NULL */
    /* Called before every insert of a new key, full = the insert needs an
     * eviction. Non-zero admits; zero refuses the block (the insert returns
     * KVS_ENOSPC, counted as not admitted). May be NULL: always admit. */
    int (*admit)(void *st, kvs__index *ix, const kvs_key *key, int full);
} kvs__policy_ops;

extern const kvs__policy_ops kvs__policy_lru;
extern const kvs__policy_ops kvs__policy_leaflru;
extern const kvs__policy_ops kvs__policy_lfu;
extern const kvs__policy_ops kvs__policy_s3fifo;
extern const kvs__policy_ops kvs__policy_prefix;
extern const kvs__policy_ops kvs__policy_belady;

/* A binary min-heap of entry ids ordered by (pkey, last_access); an entry's
 * slot is kept in plink[0]. Shared by the heap-based policies. */
typedef struct kvs__heap {
    uint32_t *a;
    uint32_t n, cap;
} kvs__heap;

int kvs__heap_push(kvs__heap *h, kvs__entry *E, uint32_t e);
void kvs__heap_del(kvs__heap *h, kvs__entry *E, uint32_t e);
void kvs__heap_fix(kvs__heap *h, kvs__entry *E, uint32_t e); /* after pkey changed */
static inline uint32_t kvs__heap_top(const kvs__heap *h) { return h->n ? h->a[0] : KVS__NIL; }
void kvs__heap_free(kvs__heap *h);

/* A doubly linked list of entries through plink (prev = plink[0], next = plink[1]);
 * head = most recent. */
typedef struct kvs__list {
    uint32_t head, tail, n;
} kvs__list;

void kvs__list_init(kvs__list *l);
void kvs__list_push_head(kvs__list *l, kvs__entry *E, uint32_t e);
void kvs__list_push_tail(kvs__list *l, kvs__entry *E, uint32_t e);
void kvs__list_del(kvs__list *l, kvs__entry *E, uint32_t e);

#endif /* KVS_POLICY_H */
