/*
 * tier_pinned.c — pinned host memory: the DRAM arena registered with CUDA.
 *
 * The idea: cudaHostRegister on the whole arena mapping once at open (one call;
 * registering per block would cost a driver call per Put), so GPU copies out
 * of any block are DMA without staging. Built with CUDA only (KVS_HAVE_CUDART);
 * without it, or when registration fails (no device), KVS_ENODEV, and the store
 * falls back to plain DRAM. The arena must be bounded (a heap-backed arena has
 * no single mapping to register).
 */
#include "arena.h"
#include "kvs_error.h"
#include "tier.h"

#include <stdlib.h>

#ifdef KVS_HAVE_CUDART
#include <cuda_runtime_api.h>

kvs__arena *kvs__tier_dram_arena(kvs_tier *t);

typedef struct pinned {
    kvs_tier base;
    kvs_tier *dram;
    void *region;
    kvs_tier_methods m;
} pinned;

static uint64_t p_charge(kvs_tier *t, uint64_t size)
{
    kvs_tier *d = ((pinned *)t)->dram;
    return d->m->charge(d, size);
}
static int p_alloc(kvs_tier *t, uint64_t size, void **ptr)
{
    kvs_tier *d = ((pinned *)t)->dram;
    return d->m->alloc(d, size, ptr);
}
static void p_free(kvs_tier *t, void *ptr, uint64_t size)
{
    kvs_tier *d = ((pinned *)t)->dram;
    d->m->free(d, ptr, size);
}

static void p_close(kvs_tier *t)
{
    pinned *p = (pinned *)t;
    cudaHostUnregister(p->region);
    p->dram->m->close(p->dram);
    free(p);
}

static int p_memory(kvs_tier *t, int *fd, void **base, uint64_t *len)
{
    kvs_tier *d = ((pinned *)t)->dram;
    return d->m->memory(d, fd, base, len);
}

int kvs_tier_pinned_open(uint64_t capacity, int shared, kvs_tier **out)
{
    if (!out || capacity == 0)
        return KVS_EINVAL;
    *out = NULL;
    pinned *p = calloc(1, sizeof *p);
    if (!p)
        return KVS_ENOMEM;
    int rc = kvs_tier_dram_open(capacity, shared, &p->dram);
    if (rc) {
        free(p);
        return rc;
    }
    size_t len;
    p->region = kvs__arena_region(kvs__tier_dram_arena(p->dram), &len);
    if (!p->region || cudaHostRegister(p->region, len, cudaHostRegisterDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        p->dram->m->close(p->dram);
        free(p);
        return KVS_ENODEV;
    }
    p->m = (kvs_tier_methods){.name = "pinned",
                              .kind = KVS_TIER_DRAM,
                              .charge = p_charge,
                              .alloc = p_alloc,
                              .free = p_free,
                              .close = p_close,
                              .memory = p_memory};
    p->base.m = &p->m;
    *out = &p->base;
    return 0;
}

#else

int kvs_tier_pinned_open(uint64_t capacity, int shared, kvs_tier **out)
{
    (void)capacity;
    (void)shared;
    if (out)
        *out = NULL;
    return KVS_ENODEV;
}

#endif
