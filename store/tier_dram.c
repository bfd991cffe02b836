/*
 * tier_dram.c — the DRAM tier: the arena (arena.c) behind the tier vtable.
 *
 * Also the pinned-host tier when the build has CUDA: the same arena with its
 * mapping registered by cudaHostRegister (tier_pinned.c opens it and keeps the
 * registration; this file stays free of CUDA).
 */
#include "arena.h"
#include "kvs_error.h"
#include "tier.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

typedef struct dram {
    kvs_tier base;
    kvs__arena *a;
} dram;

static uint64_t d_charge(kvs_tier *t, uint64_t size)
{
    return kvs__arena_charge(((dram *)t)->a, size);
}
static int d_alloc(kvs_tier *t, uint64_t size, void **ptr)
{
    return kvs__arena_alloc(((dram *)t)->a, size, ptr);
}
static void d_free(kvs_tier *t, void *ptr, uint64_t size)
{
    kvs__arena_free(((dram *)t)->a, ptr, size);
}

static int d_memory(kvs_tier *t, int *fd, void **base, uint64_t *len)
{
    kvs__arena *a = ((dram *)t)->a;
    size_t n;
    *base = kvs__arena_region(a, &n);
    *len = n;
    *fd = kvs__arena_fd(a);
    return *fd >= 0 && *base ? 0 : KVS_ENODEV;
}

static void d_close(kvs_tier *t)
{
    dram *d = (dram *)t;
    kvs__arena_close(d->a);
    free(d);
}

static const kvs_tier_methods g_dram = {
    .name = "dram",
    .kind = KVS_TIER_DRAM,
    .charge = d_charge,
    .alloc = d_alloc,
    .free = d_free,
    .close = d_close,
    .memory = d_memory,
};

int kvs_tier_dram_open(uint64_t capacity, int shared, kvs_tier **out)
{
    if (!out)
        return KVS_EINVAL;
    *out = NULL;
    dram *d = calloc(1, sizeof *d);
    if (!d)
        return KVS_ENOMEM;
    int rc = kvs__arena_open(capacity, shared, &d->a);
    if (rc) {
        free(d);
        return rc;
    }
    d->base.m = &g_dram;
    *out = &d->base;
    return 0;
}

/* For tier_pinned.c: the arena under a DRAM tier. */
kvs__arena *kvs__tier_dram_arena(kvs_tier *t);
kvs__arena *kvs__tier_dram_arena(kvs_tier *t)
{
    return ((dram *)t)->a;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL */
#endif

int kvs_tier_dram_prefault(kvs_tier *t)
{
    if (t == NULL || t->m != &g_dram)
        return KVS_ENODEV;
    size_t len;
    uint8_t *base = kvs__arena_region(((dram *)t)->a, &len);
    if (base == NULL)
        return KVS_ENODEV; /* heap-backed: nothing to populate */
    /* Write-faults every page in without changing its bytes, so it may run
     * beside writers; in steps, so a failure says how far it got. */
    const size_t step = (size_t)64 << 20;
    for (size_t off = 0; off < len; off += step) {
        size_t n = len - off < step ? len - off : step;
        if (madvise(base + off, n, MADV_POPULATE_WRITE) != 0)
            return errno == EINVAL ? KVS_ENODEV : KVS_ENOMEM;
    }
    return 0;
}
