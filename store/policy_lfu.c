/*
 * policy_lfu.c — LFU with dynamic aging (LFU-DA) over leaves.
 *
 * The idea: a block's priority is L + frequency, where L is the priority of the
 * last victim. Frequent blocks survive, but a block that was popular long ago
 * sinks as L rises past it, so old frequency cannot pin the cache forever.
 * Ties go to the least recently used. Frequency is the entry's generic hit
 * count + 1, so a policy switch keeps it.
 */
#include "policy_heapbase.h"

static void lfu_set(hp *p, kvs__index *ix, uint32_t e)
{
    kvs__entry *x = &kvs__entries(ix)[e];
    x->pkey = p->clock + (uint64_t)x->hits + 1;
}

static void lfu_insert(void *st, kvs__index *ix, uint32_t e) { lfu_set(st, ix, e); }

static void lfu_access(void *st, kvs__index *ix, uint32_t e)
{
    lfu_set(st, ix, e);
    hp_fix(st, ix, e);
}

static uint32_t lfu_victim(void *st, kvs__index *ix)
{
    hp *p = st;
    uint32_t v = kvs__heap_top(&p->h);
    if (v != KVS__NIL && kvs__entries(ix)[v].pkey > p->clock)
        p->clock = kvs__entries(ix)[v].pkey;
    return v;
}

const kvs__policy_ops kvs__policy_lfu = {
    .name = "lfu",
    .create = hp_create,
    .destroy = hp_destroy,
    .on_insert = lfu_insert,
    .on_access = lfu_access,
    .add_cand = hp_add,
    .del_cand = hp_del,
    .on_remove = hp_nop,
    .victim = lfu_victim,
    .on_hint = NULL,
};
