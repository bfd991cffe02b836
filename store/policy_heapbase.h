/*
 * policy_heapbase.h — the shared skeleton of the heap-ordered policies.
 *
 * The idea: candidates (and only candidates) sit in a min-heap ordered by
 * (pkey, last_access); a policy differs only in how it sets pkey on insert and
 * access. Included by policy_leaflru.c, policy_lfu.c and policy_belady.c
 * (policy_prefix.c keeps its own lists); everything here is static.
 *
 * Invariant: an entry is in the heap exactly when it has KVS__F_CAND.
 */
#ifndef KVS_POLICY_HEAPBASE_H
#define KVS_POLICY_HEAPBASE_H

#include "policy.h"

#include <stdlib.h>

typedef struct hp {
    kvs__heap h;
    uint64_t clock;   /* aging clock (LFU-DA's and GreedyDual's "L") */
} hp;

static inline int hp_create(kvs__index *ix, void **st)
{
    hp *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    *st = p;
    return 0;
}

static inline void hp_destroy(void *st)
{
    hp *p = st;
    kvs__heap_free(&p->h);
    free(p);
}

static inline void hp_add(void *st, kvs__index *ix, uint32_t e)
{
    kvs__heap_push(&((hp *)st)->h, kvs__entries(ix), e);
}

static inline void hp_del(void *st, kvs__index *ix, uint32_t e)
{
    kvs__heap_del(&((hp *)st)->h, kvs__entries(ix), e);
}

static inline void hp_nop(void *st, kvs__index *ix, uint32_t e) {}

/* After pkey or last_access changed. */
static inline void hp_fix(hp *p, kvs__index *ix, uint32_t e)
{
    kvs__entry *E = kvs__entries(ix);
    if (E[e].flags & KVS__F_CAND)
        kvs__heap_fix(&p->h, E, e);
}

static inline uint32_t hp_top(void *st, kvs__index *ix) { return kvs__heap_top(&((hp *)st)->h); }

#endif /* KVS_POLICY_HEAPBASE_H */
