/*
 * tier_fault.c — the fault-injecting tier for tests: wraps a real tier and
 * fails every Nth alloc, put or get with a chosen status (KVS_ENOSPC, KVS_EIO),
 * so a test can rerun a scenario with the failure at each point in turn
 * (SQLite's do_faultsim_test). free and drop never fail: nothing real does.
 */
#include "kvs_error.h"
#include "tier.h"

#include <stdatomic.h>
#include <stdlib.h>

typedef struct fault {
    kvs_tier base;
    kvs_tier *in;
    uint32_t every;
    int status;
    atomic_uint_fast64_t ops; /* SSD reads run outside the store lock */
    kvs_tier_methods m;
} fault;

static int hit(fault *f)
{
    return (atomic_fetch_add(&f->ops, 1) + 1) % f->every == 0;
}

static uint64_t f_charge(kvs_tier *t, uint64_t size)
{
    fault *f = (fault *)t;
    return f->in->m->charge(f->in, size);
}
static void f_free(kvs_tier *t, void *ptr, uint64_t size)
{
    fault *f = (fault *)t;
    f->in->m->free(f->in, ptr, size);
}
static void f_drop(kvs_tier *t, const kvs_key *key)
{
    fault *f = (fault *)t;
    f->in->m->drop(f->in, key);
}

static int f_alloc(kvs_tier *t, uint64_t size, void **ptr)
{
    fault *f = (fault *)t;
    *ptr = NULL;
    return hit(f) ? f->status : f->in->m->alloc(f->in, size, ptr);
}

static int f_put(kvs_tier *t, const kvs_key *key, const void *buf, uint64_t size)
{
    fault *f = (fault *)t;
    return hit(f) ? f->status : f->in->m->put(f->in, key, buf, size);
}

static int f_get(kvs_tier *t, const kvs_key *key, void *buf, uint64_t size)
{
    fault *f = (fault *)t;
    return hit(f) ? f->status : f->in->m->get(f->in, key, buf, size);
}

static void f_close(kvs_tier *t)
{
    fault *f = (fault *)t;
    f->in->m->close(f->in);
    free(f);
}

int kvs_tier_fault_open(kvs_tier *inner, uint32_t every, int status, kvs_tier **out)
{
    if (!out || !inner || every == 0 || (status != KVS_ENOSPC && status != KVS_EIO))
        return KVS_EINVAL;
    *out = NULL;
    fault *f = calloc(1, sizeof *f);
    if (!f)
        return KVS_ENOMEM;
    const kvs_tier_methods *im = inner->m;
    f->in = inner;
    f->every = every;
    f->status = status;
    f->m = (kvs_tier_methods){.name = "fault", .kind = im->kind, .close = f_close};
    if (im->alloc) {
        f->m.charge = f_charge;
        f->m.alloc = f_alloc;
        f->m.free = f_free;
    }
    if (im->put) {
        f->m.put = f_put;
        f->m.get = f_get;
        f->m.drop = f_drop;
    }
    f->base.m = &f->m;
    *out = &f->base;
    return 0;
}
