/*
 * policy_lru.c — classic LRU over every block, evicting the least recent leaf.
 *
 * The idea: one recency list of all cached blocks (what vLLM and LMCache ship),
 * head = most recent. The victim is the first candidate found from the tail.
 * kvs_store_lookup touches a matched chain leaf-first, so a parent is never older
 * than its children and the tail is almost always a leaf: the scan is short.
 *
 * Invariant: every live entry is on the list exactly once.
 */
#include "policy.h"

#include "kvs_error.h"

#include <stdlib.h>

typedef struct lru {
    kvs__list l;
} lru;

static int lru_create(kvs__index *ix, void **st)
{
    lru *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    kvs__list_init(&p->l);
    *st = p;
    return 0;
}

static void lru_destroy(void *st) { free(st); }

static void lru_insert(void *st, kvs__index *ix, uint32_t e)
{
    kvs__list_push_head(&((lru *)st)->l, kvs__entries(ix), e);
}

static void lru_access(void *st, kvs__index *ix, uint32_t e)
{
    lru *p = st;
    kvs__list_del(&p->l, kvs__entries(ix), e);
    kvs__list_push_head(&p->l, kvs__entries(ix), e);
}

static void lru_nop(void *st, kvs__index *ix, uint32_t e) {}

static void lru_remove(void *st, kvs__index *ix, uint32_t e)
{
    kvs__list_del(&((lru *)st)->l, kvs__entries(ix), e);
}

static uint32_t lru_victim(void *st, kvs__index *ix)
{
    kvs__entry *E = kvs__entries(ix);
    for (uint32_t i = ((lru *)st)->l.tail; i != KVS__NIL; i = E[i].plink[0])
        if (E[i].flags & KVS__F_CAND)
            return i;
    return KVS__NIL;
}

const kvs__policy_ops kvs__policy_lru = {
    .name = "lru",
    .create = lru_create,
    .destroy = lru_destroy,
    .on_insert = lru_insert,
    .on_access = lru_access,
    .add_cand = lru_nop,
    .del_cand = lru_nop,
    .on_remove = lru_remove,
    .victim = lru_victim,
    .on_hint = NULL,
};
