/*
 * policy_s3fifo.c — S3-FIFO (Yang et al., SOSP '23) adapted to leaf-only eviction.
 *
 * The idea: new blocks enter a small FIFO S (10% of capacity); a block that is
 * hit again while in S moves to the main FIFO M when it reaches S's tail, one
 * that is not is evicted and remembered in a ghost set; a block inserted while
 * its key is in the ghost goes straight to M. M is a FIFO with a 2-bit
 * frequency: a block at M's tail with frequency > 0 is reinserted with
 * frequency - 1. One-hit wonders (one-off documents) leave fast.
 * Leaf-only adaptation: the queues order only candidates (leaves); inner blocks
 * keep their queue bit and frequency and join their queue's list when they
 * become leaves: a new block at the head, a block whose last child was evicted
 * at the tail (it is older than that child). S's 10% share is counted in
 * leaves. The ghost is a hashed table of
 * insertion sequence numbers (approximate, as in the paper's implementation):
 * a key counts as a ghost if its slot was written within the last |M| ghost
 * insertions.
 *
 * Invariants: every live entry belongs to exactly one of S and M (flags bit 4,
 * set = M; bits 5-6 hold the frequency, bit 7 marks "just inserted"); it is on
 * that queue's list exactly when it is a candidate.
 */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#define Q_MAIN 0x10
#define F_SHIFT 5
#define F_MASK 0x60

#define F_FRESH 0x80

typedef struct s3 {
    kvs__list s, m;   /* candidates only */
    uint64_t *ghost; /* slot -> sequence number of the last ghost write (0 = none) */
    uint64_t nghost; /* power of two */
    uint64_t seq;
} s3;

static uint64_t fp(const kvs__entry *x)
{
    uint64_t h;
    memcpy(&h, x->key.b + 8, sizeof h);
    return h;
}

static uint64_t target_small(kvs__index *ix)
{
    uint64_t c = kvs__capacity(ix) ? kvs__capacity(ix) : kvs__count(ix);
    return c / 10 ? c / 10 : 1;
}

static uint64_t main_size(kvs__index *ix)
{
    uint64_t c = kvs__capacity(ix) ? kvs__capacity(ix) : kvs__count(ix);
    return c - c / 10 + 1;
}

static int s3_create(kvs__index *ix, void **st)
{
    s3 *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    /* 4 slots a block, without forming 4 * capacity (it wraps for capacities
     * no store reaches), and at most 2^26 slots (512 MiB). */
    uint64_t cap = kvs__capacity(ix) ? kvs__capacity(ix) : 16384;
    p->nghost = 1024;
    while (p->nghost / 4 < cap && p->nghost < ((uint64_t)1 << 26))
        p->nghost *= 2;
    p->ghost = calloc(p->nghost, sizeof *p->ghost);
    if (!p->ghost) {
        free(p);
        return -1;
    }
    kvs__list_init(&p->s);
    kvs__list_init(&p->m);
    *st = p;
    return 0;
}

static void s3_destroy(void *st)
{
    s3 *p = st;
    free(p->ghost);
    free(p);
}

static unsigned freq(const kvs__entry *x) { return (x->flags & F_MASK) >> F_SHIFT; }

static void set_freq(kvs__entry *x, unsigned f)
{
    x->flags = (uint8_t)((x->flags & ~F_MASK) | (f << F_SHIFT));
}

static void s3_insert(void *st, kvs__index *ix, uint32_t e)
{
    s3 *p = st;
    kvs__entry *x = &kvs__entries(ix)[e];
    uint64_t g = p->ghost[fp(x) & (p->nghost - 1)];
    set_freq(x, 0);
    x->flags |= F_FRESH;
    if (g && p->seq - g < main_size(ix))
        x->flags |= Q_MAIN;
    else
        x->flags &= (uint8_t)~Q_MAIN;
}

static void s3_access(void *st, kvs__index *ix, uint32_t e)
{
    kvs__entry *x = &kvs__entries(ix)[e];
    unsigned f = freq(x);
    if (f < 3)
        set_freq(x, f + 1);
}

static void s3_add(void *st, kvs__index *ix, uint32_t e)
{
    s3 *p = st;
    kvs__entry *E = kvs__entries(ix);
    kvs__list *l = E[e].flags & Q_MAIN ? &p->m : &p->s;
    if (E[e].flags & F_FRESH)
        kvs__list_push_head(l, E, e);
    else
        kvs__list_push_tail(l, E, e);
    E[e].flags &= (uint8_t)~F_FRESH;
}

static void s3_del(void *st, kvs__index *ix, uint32_t e)
{
    s3 *p = st;
    kvs__entry *E = kvs__entries(ix);
    kvs__list_del(E[e].flags & Q_MAIN ? &p->m : &p->s, E, e);
}

static void s3_nop(void *st, kvs__index *ix, uint32_t e) {}

/* Terminates: each step evicts, moves a block from S to M (at most once per
 * block), or spends one unit of a block's frequency (at most 3 per block). */
static uint32_t s3_victim(void *st, kvs__index *ix)
{
    s3 *p = st;
    kvs__entry *E = kvs__entries(ix);
    for (;;) {
        /* S's share is measured in leaves: inner blocks of S cannot leave
         * before their descendants, so counting them would starve M. */
        int from_small = p->s.n && (p->s.n > target_small(ix) || p->m.n == 0);
        if (from_small) {
            uint32_t t = p->s.tail;
            if (freq(&E[t]) == 0) {
                p->ghost[fp(&E[t]) & (p->nghost - 1)] = ++p->seq;
                return t;
            }
            kvs__list_del(&p->s, E, t);
            set_freq(&E[t], 0);
            E[t].flags |= Q_MAIN;
            kvs__list_push_head(&p->m, E, t);
        } else {
            uint32_t t = p->m.tail;
            if (t == KVS__NIL)
                return KVS__NIL;
            unsigned f = freq(&E[t]);
            if (f == 0)
                return t;
            set_freq(&E[t], f - 1);
            kvs__list_del(&p->m, E, t);
            kvs__list_push_head(&p->m, E, t);
        }
    }
}

const kvs__policy_ops kvs__policy_s3fifo = {
    .name = "s3fifo",
    .create = s3_create,
    .destroy = s3_destroy,
    .on_insert = s3_insert,
    .on_access = s3_access,
    .add_cand = s3_add,
    .del_cand = s3_del,
    .on_remove = s3_nop,
    .victim = s3_victim,
    .on_hint = NULL,
};
