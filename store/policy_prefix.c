/*
 * policy_prefix.c — "prefix": kvstash's own policy; learned reuse odds with aging.
 *
 * The idea (docs/EVICTION.md has the evidence and the reasoning): how likely a
 * cached block is to be asked for again depends far more on how many requests
 * have asked for it so far, and on where it sat in the request that put it,
 * than on how recently it was used; and the store can measure those odds
 * while it runs. Each block is in one class:
 *   - used once so far: split by how far it was from the end of its chain
 *     (0, 1, 2, 3+ blocks; the last blocks of a prompt hold its private
 *     question) x whether the chain extended an already cached prefix (a
 *     private suffix hanging off a shared prefix) or started fresh: 8 classes;
 *   - used twice; used three times or more.
 * "Used" counts requests for the block's key, whether they hit or inserted it,
 * in a count-min sketch that remembers blocks after they are evicted
 * (TinyLFU's idea), so a block that comes back is recognised.
 * For every class the policy counts chances (a block entering the class) and
 * successes (a block of the class hit), p(class) = (hits + 1) / (chances + 2),
 * and halves sketch and counts every 4 x capacity requests so the odds follow
 * the workload. A block's priority is GreedyDual's: pkey = L + 1024 p(class)
 * set at insert and at each access, L being the priority of the last victim;
 * the lowest priority leaf goes first, and L rising past an old block's
 * priority ages it out, so nothing stays only because it once looked good.
 * Nothing is fitted to one trace: the classes are structural and their
 * weights are measured online (on multi-turn chats, where a conversation's
 * suffix *is* reused, p(extends) learns to be high).
 *
 * Invariants: the heap holds exactly the candidates; pkey of an entry changes
 * only at insert and access; paux holds the block's use count (>= 1).
 */
#include "policy_heapbase.h"

#include <stdlib.h>
#include <string.h>

#define PX_ROWS 4
#define PX_CLASSES 10 /* 8 first-use classes, used twice, used 3+ times */
#define PX_TWICE 8
#define PX_MORE 9
#define PX_SCALE 1024

typedef struct px {
    hp base;          /* must be first: the hp_* helpers take the state as an hp */
    uint8_t *cm;      /* count-min sketch of requests per key, PX_ROWS * width */
    uint32_t width;   /* power of two */
    uint64_t adds;    /* sketch increments since the last halving */
    uint64_t period;  /* halve the sketch and the class counts every period */
    double seen[PX_CLASSES], used[PX_CLASSES];
} px;

static uint64_t cap_of(kvs__index *ix)
{
    uint64_t c = kvs__capacity(ix);
    return c ? c : (kvs__count(ix) > 4096 ? kvs__count(ix) : 4096);
}

static int px_create(kvs__index *ix, void **st)
{
    px *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    uint64_t c = cap_of(ix);
    /* Wide enough that distinct keys rarely share all four counters: a
     * one-use block must not look like a two-use one. 4 MiB at least. */
    p->width = 1u << 20;
    while (p->width < 4 * c && p->width < (1u << 28))
        p->width *= 2;
    p->period = 4 * c;
    p->cm = calloc((size_t)PX_ROWS * p->width, 1);
    if (!p->cm) {
        free(p);
        return -1;
    }
    *st = p;
    return 0;
}

static void px_destroy(void *st)
{
    px *p = st;
    free(p->cm);
    kvs__heap_free(&p->base.h);
    free(p);
}

static uint32_t slot(const px *p, const kvs_key *k, int row)
{
    uint32_t h;
    memcpy(&h, k->b + 16 + 4 * row, sizeof h); /* key bytes are uniform */
    return (uint32_t)row * p->width + (h & (p->width - 1));
}

static unsigned estimate(const px *p, const kvs_key *k)
{
    unsigned m = 255;
    for (int r = 0; r < PX_ROWS; r++)
        if (p->cm[slot(p, k, r)] < m)
            m = p->cm[slot(p, k, r)];
    return m;
}

/* One more request for this key; conservative update, periodic halving. */
static unsigned count_key(px *p, const kvs_key *k)
{
    unsigned m = estimate(p, k);
    for (int r = 0; r < PX_ROWS; r++) {
        uint8_t *c = &p->cm[slot(p, k, r)];
        if (*c == m && *c < 255)
            (*c)++;
    }
    if (++p->adds >= p->period) {
        for (size_t i = 0; i < (size_t)PX_ROWS * p->width; i++)
            p->cm[i] >>= 1;
        for (int c = 0; c < PX_CLASSES; c++) {
            p->seen[c] /= 2;
            p->used[c] /= 2;
        }
        p->adds = 0;
    }
    return m + 1;
}

static int klass(const kvs__entry *x)
{
    return x->paux >= 3 ? PX_MORE : x->paux == 2 ? PX_TWICE : (int)(x->ctx & 7u);
}

/* GreedyDual priority: the aging clock plus the block's learned reuse odds. */
static void set_key(px *p, kvs__entry *x)
{
    int c = klass(x);
    double odds = (p->used[c] + 1) / (p->seen[c] + 2);
    x->pkey = p->base.clock + (uint64_t)(odds * PX_SCALE);
}

static void px_insert(void *st, kvs__index *ix, uint32_t e)
{
    px *p = st;
    kvs__entry *x = &kvs__entries(ix)[e];
    unsigned k = count_key(p, &x->key);
    x->paux = k > x->hits + 1 ? k : x->hits + 1;
    p->seen[klass(x)] += 1;
    set_key(p, x);
}

static void px_access(void *st, kvs__index *ix, uint32_t e)
{
    px *p = st;
    kvs__entry *x = &kvs__entries(ix)[e];
    p->used[klass(x)] += 1;
    unsigned k = count_key(p, &x->key);
    x->paux = k > x->paux + 1 ? k : x->paux + 1;
    p->seen[klass(x)] += 1; /* a new chance, in the new class */
    set_key(p, x);
    hp_fix(st, ix, e);
}

static uint32_t px_victim(void *st, kvs__index *ix)
{
    px *p = st;
    uint32_t v = kvs__heap_top(&p->base.h);
    if (v != KVS__NIL && kvs__entries(ix)[v].pkey > p->base.clock)
        p->base.clock = kvs__entries(ix)[v].pkey;
    return v;
}

const kvs__policy_ops kvs__policy_prefix = {
    .name = "prefix",
    .create = px_create,
    .destroy = px_destroy,
    .on_insert = px_insert,
    .on_access = px_access,
    .add_cand = hp_add,
    .del_cand = hp_del,
    .on_remove = hp_nop,
    .victim = px_victim,
    .on_hint = NULL,
    .admit = NULL,
};
