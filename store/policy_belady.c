/*
 * policy_belady.c — Belady's offline optimum, restricted to leaves: a reference.
 *
 * The idea: evict the candidate whose next use lies farthest in the future
 * (never used again first). The future comes from kvs_store_hint, which only a
 * simulator that has read the whole trace can call; without hints a block counts
 * as needed "now" and is kept as long as anything else can go. Leaf-only
 * eviction makes this the best a chain-keeping cache can do up to the usual
 * caveat that Belady is optimal for single-block requests, a very close bound
 * here.
 */
#include "policy_heapbase.h"

#include <stdint.h>

static void bel_insert(void *st, kvs__index *ix, uint32_t e) { kvs__entries(ix)[e].pkey = UINT64_MAX; }

/* An access moves last_access, the heap's tie-break: restore the heap order. */
static void bel_access(void *st, kvs__index *ix, uint32_t e)
{
    hp_fix(st, ix, e);
}

static void bel_hint(void *st, kvs__index *ix, uint32_t e, uint64_t next_use)
{
    kvs__entries(ix)[e].pkey = UINT64_MAX - next_use;
    hp_fix(st, ix, e);
}

const kvs__policy_ops kvs__policy_belady = {
    .name = "belady",
    .create = hp_create,
    .destroy = hp_destroy,
    .on_insert = bel_insert,
    .on_access = bel_access,
    .add_cand = hp_add,
    .del_cand = hp_del,
    .on_remove = hp_nop,
    .victim = hp_top,
    .on_hint = bel_hint,
};
