/*
 * leases.c — lease id -> owning tenant (see leases.h).
 *
 * A chained hash table of 4096 buckets. Each add first drops the expired
 * entries of its bucket, so the table holds about the leases live within one
 * lease period, whatever the request rate.
 */
#include "leases.h"

#include "kvs_error.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define NBUCKETS 4096u

typedef struct lease {
    struct lease *next;
    uint64_t id;
    uint64_t expires_ms;
    uint16_t tenant;
} lease;

struct kvs_lease_reg {
    pthread_mutex_t mu;
    lease *b[NBUCKETS];
    uint64_t n;
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
    if (r == NULL)
        return KVS_ENOMEM;
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
    free(r);
}

int kvs_lease_reg_add(kvs_lease_reg *r, uint64_t id, uint16_t tenant, uint32_t ttl_ms)
{
    lease *nl = malloc(sizeof *nl);
    if (nl == NULL)
        return KVS_ENOMEM;
    uint64_t now = now_ms();
    nl->id = id;
    nl->tenant = tenant;
    nl->expires_ms = now + ttl_ms;
    unsigned bi = bucket(id);
    pthread_mutex_lock(&r->mu);
    for (lease **pp = &r->b[bi]; *pp;) {
        lease *l = *pp;
        if (l->expires_ms < now || l->id == id) { /* expired, or a lease extended */
            *pp = l->next;
            free(l);
            r->n--;
        } else {
            pp = &l->next;
        }
    }
    nl->next = r->b[bi];
    r->b[bi] = nl;
    r->n++;
    pthread_mutex_unlock(&r->mu);
    return 0;
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
                *pp = l->next;
                free(l);
                r->n--;
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
