/*
 * index.c — the store: a hash table of chain-linked block entries, with eviction.
 *
 * The idea: entries sit in one growable array and refer to each other by u32
 * index (parent, hash-bucket chain, policy links), so an entry is 128 bytes and
 * growing the array is a realloc. The hash table is separate chaining over a
 * power-of-two bucket array indexed by the first 8 bytes of the key: keys are
 * SHA-256 outputs the server computes with a tenant secret, so they are uniform
 * and a client cannot aim at one bucket.
 *
 * Invariants (kvs_store_check verifies them all):
 *  - every live entry is in exactly one bucket chain; free slots are on the free
 *    list through hnext;
 *  - parent of a live entry is live (or NIL for a root) and nchildren counts the
 *    live entries naming it;
 *  - F_CAND is set exactly when the entry is live, nchildren == 0, pins == 0
 *    and not F_PARKED, and then the policy knows it as a candidate (do_refresh
 *    keeps this true);
 *  - F_PARKED entries are exactly those in s->parked: victims met while under a
 *    read lease, kept out of the candidates until do_unpark finds the lease over
 *    (checked at every eviction, so a lease costs nothing until it matters).
 *
 * Leases are u32 milliseconds of the store clock compared wrap-safely: a TTL is
 * at most 24 h, far below the 24.8 days at which a u32 difference changes sign.
 * (A lease value left untouched for over 24.8 days could alias as active when
 * its block is next chosen as a victim; it then stays parked for at most 24 h.)
 *  - count <= capacity when capacity != 0 (after every public call).
 *
 * Locking: s->mu is taken by every public function; do_* functions run with it
 * held.
 */
#include "store.h"

#include "kvs_error.h"
#include "policy.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvs__index {
    kvs__entry *e;       /* entries[cap_e] */
    uint32_t cap_e;      /* slots allocated */
    uint32_t used_e;     /* slots ever used (high-water mark) */
    uint32_t free_head;  /* free list through hnext */
    uint32_t *bucket;    /* heads, KVS__NIL = empty */
    uint32_t nbucket;    /* power of two */
    uint64_t count;      /* live entries */
    uint64_t capacity;   /* 0 = unlimited */
    uint64_t tick;       /* access clock */
};

struct kvs_store {
    pthread_mutex_t mu;
    kvs__index ix;
    const kvs__policy_ops *pol;
    void *pst;
    int verify_chain;
    kvs_store_stats st;
    uint64_t (*clock_ms)(void *arg);
    void *clock_arg;
    uint32_t *parked;    /* entries with KVS__F_PARKED */
    uint32_t nparked, cap_parked;
};

static const kvs__policy_ops *const g_policies[] = {
    &kvs__policy_lru,    &kvs__policy_leaflru, &kvs__policy_lfu,
    &kvs__policy_s3fifo, &kvs__policy_prefix,  &kvs__policy_belady,
};
#define NPOLICIES (sizeof g_policies / sizeof g_policies[0])

const char *const *kvs_store_policy_names(void)
{
    static const char *names[NPOLICIES + 1];
    if (!names[0])
        for (size_t i = 0; i < NPOLICIES; i++)
            names[i] = g_policies[i]->name;
    return names;
}

static const kvs__policy_ops *find_policy(const char *name)
{
    if (!name)
        return &kvs__policy_lru;
    for (size_t i = 0; i < NPOLICIES; i++)
        if (strcmp(g_policies[i]->name, name) == 0)
            return g_policies[i];
    return NULL;
}

kvs__entry *kvs__entries(kvs__index *ix) { return ix->e; }
uint64_t kvs__capacity(kvs__index *ix) { return ix->capacity; }
uint64_t kvs__count(kvs__index *ix) { return ix->count; }

static uint32_t bucket_of(const kvs__index *ix, const kvs_key *k)
{
    uint64_t h;
    memcpy(&h, k->b, sizeof h);
    return (uint32_t)(h & (ix->nbucket - 1));
}

static uint32_t do_find(const kvs__index *ix, const kvs_key *k)
{
    for (uint32_t i = ix->bucket[bucket_of(ix, k)]; i != KVS__NIL; i = ix->e[i].hnext)
        if (memcmp(ix->e[i].key.b, k->b, KVS_KEY_LEN) == 0)
            return i;
    return KVS__NIL;
}

static int do_grow_buckets(kvs__index *ix)
{
    uint32_t nb = ix->nbucket * 2;
    uint32_t *b = malloc((size_t)nb * sizeof *b);
    if (!b)
        return KVS_ENOMEM;
    for (uint32_t i = 0; i < nb; i++)
        b[i] = KVS__NIL;
    uint32_t *old = ix->bucket;
    ix->bucket = b;
    ix->nbucket = nb;
    for (uint32_t i = 0; i < ix->used_e; i++) {
        kvs__entry *x = &ix->e[i];
        if (!(x->flags & KVS__F_LIVE))
            continue;
        uint32_t h = bucket_of(ix, &x->key);
        x->hnext = b[h];
        b[h] = i;
    }
    free(old);
    return 0;
}

static uint32_t do_alloc_slot(kvs__index *ix)
{
    if (ix->free_head != KVS__NIL) {
        uint32_t i = ix->free_head;
        ix->free_head = ix->e[i].hnext;
        return i;
    }
    if (ix->used_e == ix->cap_e) {
        if (ix->cap_e >= UINT32_MAX / 2)
            return KVS__NIL;
        uint32_t nc = ix->cap_e ? ix->cap_e * 2 : 1024;
        kvs__entry *ne = realloc(ix->e, (size_t)nc * sizeof *ne);
        if (!ne)
            return KVS__NIL;
        ix->e = ne;
        ix->cap_e = nc;
    }
    return ix->used_e++;
}

static uint64_t default_clock_ms(void *arg)
{
    struct timespec t;
    (void)arg;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

static uint32_t now32(const kvs_store *s) { return (uint32_t)s->clock_ms(s->clock_arg); }

static int lease_active(const kvs_store *s, const kvs__entry *x)
{
    return x->lease_ms != 0 && (int32_t)(x->lease_ms - now32(s)) > 0;
}

/* Brings F_CAND (and the policy's candidate set) in line with the entry. */
static void do_refresh(kvs_store *s, uint32_t i)
{
    kvs__entry *x = &s->ix.e[i];
    int want = (x->flags & KVS__F_LIVE) && x->nchildren == 0 && x->pins == 0 &&
               !(x->flags & KVS__F_PARKED);
    int have = (x->flags & KVS__F_CAND) != 0;
    if (want && !have) {
        x->flags |= KVS__F_CAND;
        s->pol->add_cand(s->pst, &s->ix, i);
    } else if (!want && have) {
        x->flags &= (uint8_t)~KVS__F_CAND;
        s->pol->del_cand(s->pst, &s->ix, i);
    }
}

static void do_touch(kvs_store *s, uint32_t i)
{
    kvs__entry *x = &s->ix.e[i];
    x->last_access = ++s->ix.tick;
    if (x->hits < UINT32_MAX)
        x->hits++;
    s->pol->on_access(s->pst, &s->ix, i);
}

/* Removes a live entry with no children; the caller has checked pins. */
static void do_remove(kvs_store *s, uint32_t i, kvs_evict_reason why)
{
    kvs__index *ix = &s->ix;
    kvs__entry *x = &ix->e[i];
    KVS_ASSERT((x->flags & KVS__F_LIVE) && x->nchildren == 0);
    if (x->flags & KVS__F_CAND) {
        x->flags &= (uint8_t)~KVS__F_CAND;
        s->pol->del_cand(s->pst, ix, i);
    }
    s->pol->on_remove(s->pst, ix, i);
    if (x->flags & KVS__F_PARKED) {
        for (uint32_t k = 0; k < s->nparked; k++)
            if (s->parked[k] == i) {
                s->parked[k] = s->parked[--s->nparked];
                break;
            }
    }
    uint32_t *pp = &ix->bucket[bucket_of(ix, &x->key)];
    while (*pp != i)
        pp = &ix->e[*pp].hnext;
    *pp = x->hnext;
    uint32_t p = x->parent;
    free(x->tokens);
    memset(x, 0, sizeof *x);
    x->hnext = ix->free_head;
    ix->free_head = i;
    ix->count--;
    s->st.evictions[why]++;
    if (p != KVS__NIL) {
        ix->e[p].nchildren--;
        do_refresh(s, p);
    }
}

/* Returns parked entries whose lease has ended to the candidates. */
static void do_unpark(kvs_store *s)
{
    for (uint32_t k = 0; k < s->nparked;) {
        uint32_t i = s->parked[k];
        kvs__entry *x = &s->ix.e[i];
        if (lease_active(s, x)) {
            k++;
            continue;
        }
        x->lease_ms = 0;
        x->flags &= (uint8_t)~KVS__F_PARKED;
        s->parked[k] = s->parked[--s->nparked];
        do_refresh(s, i);
    }
}

/* Evicts until count < limit; KVS_ENOSPC if no candidate is left. A victim
 * under a read lease is parked instead (see the top of the file). */
static int do_make_room(kvs_store *s, uint64_t limit, kvs_evict_reason why)
{
    if (s->nparked)
        do_unpark(s);
    while (s->ix.count >= limit) {
        uint32_t v = s->pol->victim(s->pst, &s->ix);
        if (v == KVS__NIL)
            return KVS_ENOSPC;
        KVS_ASSERT(s->ix.e[v].flags & KVS__F_CAND);
        if (lease_active(s, &s->ix.e[v])) {
            if (s->nparked == s->cap_parked) {
                uint32_t nc = s->cap_parked ? 2 * s->cap_parked : 64;
                uint32_t *np = realloc(s->parked, (size_t)nc * sizeof *np);
                if (!np)
                    return KVS_ENOMEM;
                s->parked = np;
                s->cap_parked = nc;
            }
            s->parked[s->nparked++] = v;
            s->ix.e[v].flags |= KVS__F_PARKED;
            do_refresh(s, v);
            continue;
        }
        s->ix.e[v].lease_ms = 0;
        do_remove(s, v, why);
    }
    return 0;
}

int kvs_store_open(const kvs_store_opts *o, kvs_store **out)
{
    if (!out)
        return KVS_EINVAL;
    *out = NULL;
    const kvs__policy_ops *pol = find_policy(o ? o->policy : NULL);
    if (!pol)
        return KVS_EINVAL;
    kvs_store *s = calloc(1, sizeof *s);
    if (!s)
        return KVS_ENOMEM;
    s->ix.nbucket = 1024;
    s->ix.bucket = malloc(s->ix.nbucket * sizeof *s->ix.bucket);
    if (!s->ix.bucket) {
        free(s);
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < s->ix.nbucket; i++)
        s->ix.bucket[i] = KVS__NIL;
    s->ix.free_head = KVS__NIL;
    s->ix.capacity = o ? o->capacity_blocks : 0;
    s->verify_chain = o ? o->verify_chain : 0;
    s->clock_ms = o && o->clock_ms ? o->clock_ms : default_clock_ms;
    s->clock_arg = o ? o->clock_arg : NULL;
    s->pol = pol;
    if (pol->create(&s->ix, &s->pst) != 0) {
        free(s->ix.bucket);
        free(s);
        return KVS_ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void kvs_store_close(kvs_store *s)
{
    if (!s)
        return;
    s->pol->destroy(s->pst);
    for (uint32_t i = 0; i < s->ix.used_e; i++)
        if (s->ix.e[i].flags & KVS__F_LIVE)
            free(s->ix.e[i].tokens);
    free(s->ix.e);
    free(s->ix.bucket);
    free(s->parked);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int do_insert(kvs_store *s, const kvs_key *key, const kvs_key *parent, uint32_t ns_id,
                     const uint32_t *tokens, uint32_t n_tokens, uint64_t size, uint8_t ctx)
{
    kvs__index *ix = &s->ix;
    uint32_t p = KVS__NIL;
    if (parent) {
        p = do_find(ix, parent);
        if (p == KVS__NIL)
            return KVS_EPRECOND;
    }
    uint32_t have = do_find(ix, key);
    if (have != KVS__NIL) {
        kvs__entry *x = &ix->e[have];
        if (x->parent != p || x->n_tokens != n_tokens ||
            memcmp(x->tokens, tokens, (size_t)n_tokens * sizeof *tokens) != 0) {
            s->st.refused++;
            return KVS_EINVAL;
        }
        do_touch(s, have);
        return KVS_EEXIST;
    }
    if (s->verify_chain && parent) {
        kvs_key want;
        int rc = kvs_key_next(parent, tokens, n_tokens, &want);
        if (rc)
            return rc;
        if (memcmp(want.b, key->b, KVS_KEY_LEN) != 0) {
            s->st.refused++;
            return KVS_EINVAL;
        }
    }
    uint32_t *tok = malloc((size_t)n_tokens * sizeof *tok);
    if (!tok)
        return KVS_ENOMEM;
    memcpy(tok, tokens, (size_t)n_tokens * sizeof *tok);
    /* Keep the parent from being chosen as the victim that makes room for its
     * own child. */
    if (p != KVS__NIL) {
        ix->e[p].pins++;
        do_refresh(s, p);
    }
    int full = ix->capacity && ix->count >= ix->capacity;
    int rc = 0;
    if (s->pol->admit && !s->pol->admit(s->pst, ix, key, full)) {
        s->st.not_admitted++;
        rc = KVS_ENOSPC;
    } else if (full) {
        rc = do_make_room(s, ix->capacity, KVS_EVICT_CAPACITY);
    }
    if (p != KVS__NIL) {
        ix->e[p].pins--;
        do_refresh(s, p);
    }
    if (rc == 0 && ix->count + 1 > (uint64_t)ix->nbucket)
        rc = do_grow_buckets(ix);
    uint32_t i = rc == 0 ? do_alloc_slot(ix) : KVS__NIL;
    if (i == KVS__NIL) {
        free(tok);
        return rc ? rc : KVS_ENOMEM;
    }
    kvs__entry *x = &ix->e[i];
    memset(x, 0, sizeof *x);
    x->key = *key;
    x->tokens = tok;
    x->n_tokens = n_tokens;
    x->size = (uint32_t)size;
    x->parent = p;
    x->ns_id = ns_id;
    x->depth = p == KVS__NIL ? 0 : ix->e[p].depth + 1;
    x->plink[0] = x->plink[1] = KVS__NIL;
    x->flags = KVS__F_LIVE;
    x->ctx = ctx;
    x->last_access = ++ix->tick;
    uint32_t h = bucket_of(ix, key);
    x->hnext = ix->bucket[h];
    ix->bucket[h] = i;
    ix->count++;
    s->st.inserts++;
    s->pol->on_insert(s->pst, ix, i);
    if (p != KVS__NIL) {
        ix->e[p].nchildren++;
        do_refresh(s, p);
    }
    do_refresh(s, i);
    return 0;
}

int kvs_store_insert(kvs_store *s, const kvs_key *key, const kvs_key *parent, uint32_t ns_id,
                     const uint32_t *tokens, uint32_t n_tokens, uint64_t size)
{
    if (!s || !key || !tokens || n_tokens == 0 || size > UINT32_MAX)
        return KVS_EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = do_insert(s, key, parent, ns_id, tokens, n_tokens, size, KVS__CTX_TAIL_MASK);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvs_store_insert_chain(kvs_store *s, const kvs_key *keys, const kvs_key *parent,
                           uint32_t ns_id, const uint32_t *tokens, uint32_t block_tokens,
                           size_t nblocks, uint64_t size, size_t *inserted)
{
    if (!s || !inserted || (nblocks && (!keys || !tokens || block_tokens == 0)) ||
        size > UINT32_MAX)
        return KVS_EINVAL;
    *inserted = 0;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    for (size_t i = 0; i < nblocks; i++) {
        size_t tail = nblocks - 1 - i;
        uint8_t ctx = (uint8_t)((tail < KVS__CTX_TAIL_MASK ? tail : KVS__CTX_TAIL_MASK) |
                                (parent ? KVS__CTX_EXTENDS : 0));
        rc = do_insert(s, &keys[i], i ? &keys[i - 1] : parent, ns_id,
                       tokens + i * (size_t)block_tokens, block_tokens, size, ctx);
        if (rc == KVS_EEXIST)
            rc = 0;
        if (rc)
            break;
        *inserted = i + 1;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

#define KVS_LEASE_MAX_MS (24u * 3600u * 1000u)

static int lookup(kvs_store *s, const kvs_key *keys, const uint32_t *tokens,
                  uint32_t block_tokens, size_t nblocks, uint32_t ttl_ms, size_t *matched)
{
    if (!s || !matched || (nblocks && (!keys || !tokens || block_tokens == 0)) ||
        ttl_ms > KVS_LEASE_MAX_MS)
        return KVS_EINVAL;
    pthread_mutex_lock(&s->mu);
    size_t n = 0;
    uint32_t prev = KVS__NIL;
    for (; n < nblocks; n++) {
        uint32_t i = do_find(&s->ix, &keys[n]);
        if (i == KVS__NIL)
            break;
        const kvs__entry *x = &s->ix.e[i];
        if (x->parent != prev || x->n_tokens != block_tokens ||
            memcmp(x->tokens, tokens + n * block_tokens, (size_t)block_tokens * sizeof *tokens))
            break;
        prev = i;
    }
    /* Touch leaf-first so that every block ends up at least as recent as its
     * descendants (recency-ordered policies then see chain tails as older). */
    uint32_t until = ttl_ms ? now32(s) + ttl_ms : 0;
    if (ttl_ms && until == 0)
        until = 1; /* 0 means "no lease" */
    uint32_t i = prev;
    while (i != KVS__NIL) {
        kvs__entry *x = &s->ix.e[i];
        if (ttl_ms && (!lease_active(s, x) || (int32_t)(until - x->lease_ms) > 0))
            x->lease_ms = until;
        do_touch(s, i);
        i = x->parent;
    }
    s->st.lookups++;
    s->st.lookup_blocks += nblocks;
    s->st.hit_blocks += n;
    *matched = n;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int kvs_store_lookup(kvs_store *s, const kvs_key *keys, const uint32_t *tokens,
                     uint32_t block_tokens, size_t nblocks, size_t *matched)
{
    return lookup(s, keys, tokens, block_tokens, nblocks, 0, matched);
}

int kvs_store_lookup_lease(kvs_store *s, const kvs_key *keys, const uint32_t *tokens,
                           uint32_t block_tokens, size_t nblocks, uint32_t ttl_ms,
                           size_t *matched)
{
    return lookup(s, keys, tokens, block_tokens, nblocks, ttl_ms, matched);
}

int kvs_store_contains(kvs_store *s, const kvs_key *key)
{
    if (!s || !key)
        return 0;
    pthread_mutex_lock(&s->mu);
    int r = do_find(&s->ix, key) != KVS__NIL;
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* Is a an ancestor-or-self of b? */
static int do_under(const kvs__index *ix, uint32_t a, uint32_t b)
{
    uint32_t da = ix->e[a].depth;
    while (b != KVS__NIL && ix->e[b].depth > da)
        b = ix->e[b].parent;
    return b == a;
}

static int do_delete(kvs_store *s, const kvs_key *key, int subtree)
{
    kvs__index *ix = &s->ix;
    uint32_t t = do_find(ix, key);
    if (t == KVS__NIL)
        return KVS_ENOTFOUND;
    if (ix->e[t].nchildren && !subtree)
        return KVS_EPRECOND;
    if (ix->e[t].nchildren == 0) {
        if (ix->e[t].pins || lease_active(s, &ix->e[t]))
            return KVS_EPERM;
        do_remove(s, t, KVS_EVICT_DELETE);
        return 0;
    }
    /* Subtree: collect descendants (O(n * depth), an administrative call),
     * refuse if any is pinned, then remove deepest first so each is a leaf. */
    uint32_t n = 0, *v = malloc((size_t)(ix->count) * sizeof *v);
    if (!v)
        return KVS_ENOMEM;
    for (uint32_t i = 0; i < ix->used_e; i++)
        if ((ix->e[i].flags & KVS__F_LIVE) && do_under(ix, t, i)) {
            if (ix->e[i].pins || lease_active(s, &ix->e[i])) {
                free(v);
                return KVS_EPERM;
            }
            v[n++] = i;
        }
    uint32_t maxd = 0;
    for (uint32_t k = 0; k < n; k++)
        if (ix->e[v[k]].depth > maxd)
            maxd = ix->e[v[k]].depth;
    for (uint32_t d = maxd + 1; d-- > ix->e[t].depth;)
        for (uint32_t k = 0; k < n; k++)
            if (v[k] != t && (ix->e[v[k]].flags & KVS__F_LIVE) && ix->e[v[k]].depth == d)
                do_remove(s, v[k], KVS_EVICT_SUBTREE);
    do_remove(s, t, KVS_EVICT_DELETE);
    free(v);
    return 0;
}

int kvs_store_delete(kvs_store *s, const kvs_key *key, int subtree)
{
    if (!s || !key)
        return KVS_EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = do_delete(s, key, subtree);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int pin_delta(kvs_store *s, const kvs_key *key, int d)
{
    if (!s || !key)
        return KVS_EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    uint32_t i = do_find(&s->ix, key);
    if (i == KVS__NIL)
        rc = KVS_ENOTFOUND;
    else if (d < 0 && s->ix.e[i].pins == 0)
        rc = KVS_EPRECOND;
    else if (d > 0 && s->ix.e[i].pins == UINT16_MAX)
        rc = KVS_ENOSPC;
    else {
        s->ix.e[i].pins = (uint16_t)(s->ix.e[i].pins + d);
        do_refresh(s, i);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvs_store_pin(kvs_store *s, const kvs_key *key) { return pin_delta(s, key, 1); }
int kvs_store_unpin(kvs_store *s, const kvs_key *key) { return pin_delta(s, key, -1); }

int kvs_store_hint(kvs_store *s, const kvs_key *key, uint64_t next_use)
{
    if (!s || !key)
        return KVS_EINVAL;
    pthread_mutex_lock(&s->mu);
    uint32_t i = do_find(&s->ix, key);
    if (i != KVS__NIL && s->pol->on_hint)
        s->pol->on_hint(s->pst, &s->ix, i, next_use);
    pthread_mutex_unlock(&s->mu);
    return i == KVS__NIL ? KVS_ENOTFOUND : 0;
}

int kvs_store_set_policy(kvs_store *s, const char *name)
{
    if (!s || !name)
        return KVS_EINVAL;
    const kvs__policy_ops *pol = find_policy(name);
    if (!pol)
        return KVS_EINVAL;
    void *st;
    if (pol->create(&s->ix, &st) != 0)
        return KVS_ENOMEM;
    pthread_mutex_lock(&s->mu);
    s->pol->destroy(s->pst);
    s->pol = pol;
    s->pst = st;
    /* Rebuild in access order so list-based policies see the old recency. */
    kvs__index *ix = &s->ix;
    uint32_t n = 0, *ord = malloc((size_t)(ix->count ? ix->count : 1) * sizeof *ord);
    KVS_ASSERT(ord != NULL);
    for (uint32_t i = 0; i < ix->used_e; i++)
        if (ix->e[i].flags & KVS__F_LIVE) {
            ix->e[i].flags &= (uint8_t)~KVS__F_CAND;
            ix->e[i].plink[0] = ix->e[i].plink[1] = KVS__NIL;
            ix->e[i].pkey = 0;
            ix->e[i].paux = 0;
            ix->e[i].flags &= 0x0f;
            ord[n++] = i;
        }
    /* Shell sort on last_access: no allocation, no global comparator state. */
    for (uint32_t gap = n / 2; gap > 0; gap /= 2)
        for (uint32_t k = gap; k < n; k++) {
            uint32_t v = ord[k], j = k;
            while (j >= gap && ix->e[ord[j - gap]].last_access > ix->e[v].last_access) {
                ord[j] = ord[j - gap];
                j -= gap;
            }
            ord[j] = v;
        }
    for (uint32_t k = 0; k < n; k++)
        pol->on_insert(st, ix, ord[k]);
    for (uint32_t k = 0; k < n; k++)
        do_refresh(s, ord[k]);
    free(ord);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int kvs_store_set_capacity(kvs_store *s, uint64_t capacity_blocks)
{
    if (!s)
        return KVS_EINVAL;
    pthread_mutex_lock(&s->mu);
    s->ix.capacity = capacity_blocks;
    int rc = capacity_blocks ? do_make_room(s, capacity_blocks + 1, KVS_EVICT_RESIZE) : 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void kvs_store_get_stats(kvs_store *s, kvs_store_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->blocks = s->ix.count;
    out->capacity_blocks = s->ix.capacity;
    out->policy = s->pol->name;
    pthread_mutex_unlock(&s->mu);
}

size_t kvs_store_meta_bytes_per_block(kvs_store *s)
{
    /* The entry plus this block's share of the bucket heads (rounded up). */
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->ix.count ? s->ix.count : 1;
    size_t b = sizeof(kvs__entry) + (size_t)((s->ix.nbucket * sizeof(uint32_t) + n - 1) / n);
    pthread_mutex_unlock(&s->mu);
    return b;
}

static int bad(char *err, size_t errlen, const char *what, uint32_t i)
{
    if (err && errlen)
        snprintf(err, errlen, "entry %u: %s", i, what);
    return KVS_EINTERNAL;
}

int kvs_store_check(kvs_store *s, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->mu);
    kvs__index *ix = &s->ix;
    int rc = 0;
    uint64_t live = 0;
    uint32_t *kids = calloc(ix->used_e ? ix->used_e : 1, sizeof *kids);
    KVS_ASSERT(kids != NULL);
    for (uint32_t i = 0; i < ix->used_e && !rc; i++) {
        kvs__entry *x = &ix->e[i];
        if (!(x->flags & KVS__F_LIVE))
            continue;
        live++;
        if (do_find(ix, &x->key) != i)
            rc = bad(err, errlen, "not reachable through its bucket", i);
        else if (x->parent != KVS__NIL && !(ix->e[x->parent].flags & KVS__F_LIVE))
            rc = bad(err, errlen, "orphan: parent not cached", i);
        else if (x->parent != KVS__NIL && x->depth != ix->e[x->parent].depth + 1)
            rc = bad(err, errlen, "depth != parent depth + 1", i);
        else if (x->parent == KVS__NIL && x->depth != 0)
            rc = bad(err, errlen, "root with depth != 0", i);
        else if (((x->flags & KVS__F_CAND) != 0) !=
                 (x->nchildren == 0 && x->pins == 0 && !(x->flags & KVS__F_PARKED)))
            rc = bad(err, errlen, "candidate flag out of date", i);
        if (x->parent != KVS__NIL)
            kids[x->parent]++;
    }
    for (uint32_t i = 0; i < ix->used_e && !rc; i++)
        if ((ix->e[i].flags & KVS__F_LIVE) && kids[i] != ix->e[i].nchildren)
            rc = bad(err, errlen, "nchildren differs from the cached children", i);
    uint32_t parked = 0;
    for (uint32_t i = 0; i < ix->used_e; i++)
        parked += (ix->e[i].flags & (KVS__F_LIVE | KVS__F_PARKED)) == (KVS__F_LIVE | KVS__F_PARKED);
    if (!rc && parked != s->nparked)
        rc = bad(err, errlen, "parked entries differ from the parked list", 0);
    if (!rc && live != ix->count)
        rc = bad(err, errlen, "live entries != count", 0);
    if (!rc && ix->capacity && ix->count > ix->capacity)
        rc = bad(err, errlen, "count above capacity", 0);
    free(kids);
    pthread_mutex_unlock(&s->mu);
    return rc;
}
