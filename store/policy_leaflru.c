/*
 * policy_leaflru.c — leaf-LRU: the least recently used candidate, exactly.
 *
 * The idea: TensorRT-LLM style leaf-only eviction. Only leaves are kept in a
 * heap keyed by last access, so a victim costs O(log n) with no scan, whatever
 * the touch order. On prefix traces it evicts what "lru" evicts (see
 * docs/EVICTION.md); it exists as the scan-free form and as a cross-check.
 */
#include "policy_heapbase.h"

static void ll_access(void *st, kvs__index *ix, uint32_t e) { hp_fix(st, ix, e); }

const kvs__policy_ops kvs__policy_leaflru = {
    .name = "leaflru",
    .create = hp_create,
    .destroy = hp_destroy,
    .on_insert = hp_nop,
    .on_access = ll_access,
    .add_cand = hp_add,
    .del_cand = hp_del,
    .on_remove = hp_nop,
    .victim = hp_top,
    .on_hint = NULL,
};
