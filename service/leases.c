/*
 * leases.c — lease id -> owning tenant (see leases.h).
 *
 * A chained hash table of 4096 buckets. Each add first drops the expired
 * entries of its bucket, so the table holds about the leases live within one
 * lease period, whatever the request rate. held[tenant] sums the blocks of
 * the tenant's entries; an add that would pass its bound first prunes every
 * bucket (at most once per PRUNE_MS: a tenant at its bound cannot make each
 * Lookup a full sweep), so expired leases do not count against it for long.
 */
#include "leases.h"

#include "kvs_error.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define NBUCKETS 4096u
#define NTENANTS 65536u /* tenant ids are 16 bits */
#define PRUNE_MS 100u

typedef struct lease {
    struct lease *next;
    uint64_t id;
    uint64_t expires_ms;
    uint32_t blocks;
    uint16_t tenant;
} lease;

struct kvs_lease_reg {
    pthread_mutex_t mu;
    lease *b[NBUCKETS];
    uint64_t n;
    uint64_t *held; /* [NTENANTS] */
    uint64_t pruned_ms;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static unsigned bucket(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (unsigned)(id % NBUCKETS);
}

int kvs_lease_reg_open(kvs_lease_reg **out)
{
    kvs_lease_reg *r = calloc(1, sizeof *r);
    if (r == NULL || (r->held = calloc(NTENANTS, sizeof *r->held)) == NULL) {
        free(r);
        return KVS_ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return 0;
}

void kvs_lease_reg_close(kvs_lease_reg *r)
{
    if (r == NULL)
        return;
    for (unsigned i = 0; i < NBUCKETS; i++) {
        for (lease *l = r->b[i], *next; l; l = next) {
            next = l->next;
            free(l);
        }
    }
    pthread_mutex_destroy(&r->mu);
    free(r->held);
    free(r);
}

/* With r->mu: unlinks *pp and frees it. */
static void do_drop(kvs_lease_reg *r, lease **pp)
{
    lease *l = *pp;
    *pp = l->next;
    r->held[l->tenant] -= l->blocks;
    r->n--;
    free(l);
}

/* With r->mu: drops the expired entries of bucket bi, and the one of id
 * (a lease extended is recorded again). */
static void do_prune(kvs_lease_reg *r, unsigned bi, uint64_t now, uint64_t id)
{
    for (lease **pp = &r->b[bi]; *pp;) {
        if ((*pp)->expires_ms < now || (id != 0 && (*pp)->id == id))
            do_drop(r, pp);
        else
            pp = &(*pp)->next;
    }
}

int kvs_lease_reg_add(kvs_lease_reg *r, uint64_t id, uint16_t tenant, uint32_t ttl_ms,
                      uint32_t blocks, uint64_t max_blocks, uint64_t *held)
{
    lease *nl = malloc(sizeof *nl);
    if (nl == NULL)
        return KVS_ENOMEM;
    uint64_t now = now_ms();
    nl->id = id;
    nl->tenant = tenant;
    nl->blocks = blocks;
    nl->expires_ms = now + ttl_ms;
    unsigned bi = bucket(id);
    pthread_mutex_lock(&r->mu);
    do_prune(r, bi, now, id);
    if (r->held[tenant] + blocks > max_blocks && now - r->pruned_ms >= PRUNE_MS) {
        r->pruned_ms = now;
        for (unsigned i = 0; i < NBUCKETS; i++)
            do_prune(r, i, now, 0);
    }
    if (r->held[tenant] + blocks > max_blocks) {
        if (held)
            *held = r->held[tenant];
        pthread_mutex_unlock(&r->mu);
        free(nl);
        return KVS_ENOSPC;
    }
    nl->next = r->b[bi];
    r->b[bi] = nl;
    r->n++;
    r->held[tenant] += blocks;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

uint64_t kvs_lease_reg_held(kvs_lease_reg *r, uint16_t tenant)
{
    uint64_t now = now_ms();
    pthread_mutex_lock(&r->mu);
    for (unsigned i = 0; i < NBUCKETS; i++)
        do_prune(r, i, now, 0);
    uint64_t h = r->held[tenant];
    pthread_mutex_unlock(&r->mu);
    return h;
}

int kvs_lease_reg_take(kvs_lease_reg *r, uint64_t id, uint16_t tenant)
{
    int hit = 0;
    uint64_t now = now_ms();
    pthread_mutex_lock(&r->mu);
    for (lease **pp = &r->b[bucket(id)]; *pp; pp = &(*pp)->next) {
        lease *l = *pp;
        if (l->id == id) {
            if (l->tenant == tenant) {
                hit = l->expires_ms >= now;
                do_drop(r, pp);
            }
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return hit;
}

uint64_t kvs_lease_reg_count(kvs_lease_reg *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}
