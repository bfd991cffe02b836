/*
 * policy_prefix.c — "prefix": kvstash's own policy; adaptive replacement (ARC)
 * over leaves, with a long-memory history of keys seen before.
 *
 * The idea (docs/EVICTION.md, section 3, has the measurements): on prefix
 * workloads the blocks worth keeping are those that have already been asked
 * for more than once; a block seen for the first time is, on the Mooncake
 * trace, most often a one-off chain (82 % of its roots are never asked again),
 * and LRU lets every such chain push out proven prefixes. So the cached blocks
 * are in two segments, each ordered by recency (least recently used leaf
 * first):
 *   T1 — first sight: keys the history has not seen before;
 *   T2 — proven: hit while cached, or inserted again after an eviction.
 * The history is a hashed table of keys (4 x capacity slots, at least 2^16,
 * 8 bytes each) that outlives eviction, so a block that comes back hundreds
 * of requests later is recognised and goes to T2 at once (TinyLFU's and
 * S3-FIFO's ghost idea, with a memory long enough for reuse gaps far beyond
 * the cache's own residence time).
 * How much room first-sight blocks get is not a constant: as in ARC (Megiddo &
 * Modha, FAST '03) the target size p of T1 grows each time a key evicted from
 * T1 comes back within the last `capacity` T1 evictions (T1 was too small: a
 * chat's next turn, a document asked again soon) and shrinks when a key
 * evicted from T2 comes back within the last `capacity` T2 evictions. The
 * victim is T1's least recent leaf while T1 holds more than p blocks, T2's
 * otherwise; one-off chains then leave first, and a workload whose fresh
 * blocks are reused soon turns the policy back into plain LRU.
 * Unlike ARC, the steps are summed without clamping (within one capacity
 * beyond either end) and p is that sum clamped to 0..capacity: ARC's clamp
 * drops the evidence that arrives while p sits at an end, so the first
 * contrary burst moves p off it. A prefix cache's ghost hits come in bursts (a
 * returning chain is a run of ghost hits): one document asked again after it
 * left T2 pulled p well below the capacity on workloads that want it there
 * (docs/EVICTION.md, section 4).
 * Nothing here is fitted to one trace: no thresholds, no learned weights; the
 * only sizes are the history's (a multiple of the capacity), ARC's ghost
 * windows (the capacity) and the margin of the summed adaptation (the
 * capacity).
 *
 * Leaf-only adaptation: the segments' sizes count every cached block, but
 * only candidates (leaves) sit in the two heaps (min-heaps on last use); an
 * inner block joins its segment's heap when its last child goes. When the
 * chosen segment has no candidate the other one gives the victim.
 *
 * Invariants: every live entry belongs to exactly one segment (flags bit 4:
 * set = T2) and sz[] counts them; an entry is in its segment's heap exactly
 * when it has KVS__F_CAND; pkey is the policy clock of its last use.
 */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#define PX_T2 0x10 /* flags bit: in T2 */

/* One history slot: which key (16-bit fingerprint), whether it was seen, and
 * where and when it was last evicted. */
typedef struct px_hist {
    uint16_t fp;  /* 0 = empty slot */
    uint8_t seen; /* saturating use count */
    uint8_t seg;  /* 0 = evicted from T1, 1 = from T2 */
    uint32_t ev;  /* that segment's eviction number; 0 = not evicted since */
} px_hist;

typedef struct px {
    kvs__heap heap[2]; /* candidates of T1 and T2, least recent first */
    uint64_t sz[2];    /* live blocks in T1, T2 */
    px_hist *hist;
    uint64_t mask;   /* history slots - 1 (a power of two) */
    uint64_t clock;  /* one tick per insert or access */
    uint32_t nev[2]; /* evictions from T1, T2 so far (wrap harmlessly) */
    double p;        /* ARC's adaptation summed: T1's target is p clamped to
                        0..capacity; p itself stays within -capacity..2 x capacity */
} px;

static double cap_of(kvs__index *ix)
{
    uint64_t c = kvs__capacity(ix);
    if (!c)
        c = kvs__count(ix) > 4096 ? kvs__count(ix) : 4096;
    return (double)c;
}

/* The history is sized once, from the capacity at creation (or 4096 blocks
 * for an unbounded store); ghost windows and p follow the current capacity. */
static int px_create(kvs__index *ix, void **st)
{
    px *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    uint64_t n = 1u << 16;
    while ((double)n < 4 * cap_of(ix) && n < (1ull << 30))
        n *= 2;
    p->hist = calloc(n, sizeof *p->hist);
    if (!p->hist) {
        free(p);
        return -1;
    }
    p->mask = n - 1;
    *st = p;
    return 0;
}

static void px_destroy(void *st)
{
    px *p = st;
    kvs__heap_free(&p->heap[0]);
    kvs__heap_free(&p->heap[1]);
    free(p->hist);
    free(p);
}

/* The key's slot; a slot held by another key is taken over (forgetting it). */
static px_hist *slot(px *p, const kvs_key *k)
{
    uint64_t h;
    uint16_t f;
    memcpy(&h, k->b + 16, sizeof h); /* key bytes are uniform (SHA-256) */
    memcpy(&f, k->b + 24, sizeof f);
    f |= 1;
    px_hist *s = &p->hist[h & p->mask];
    if (s->fp != f) {
        memset(s, 0, sizeof *s);
        s->fp = f;
    }
    return s;
}

static int seg_of(const kvs__entry *x)
{
    return (x->flags & PX_T2) ? 1 : 0;
}

static void set_seg(kvs__entry *x, int s)
{
    x->flags = (uint8_t)(s ? (x->flags | PX_T2) : (x->flags & ~PX_T2));
}

/* Evicted from segment s within that segment's last `capacity` evictions. */
static int recent_ghost(const px *p, const px_hist *s, double cap)
{
    return s->ev != 0 && (double)(uint32_t)(p->nev[s->seg] - s->ev) < cap;
}

static double ghost_size(const px *p, int s, double cap)
{
    return p->nev[s] < cap ? p->nev[s] : cap;
}

static void px_insert(void *st, kvs__index *ix, uint32_t e)
{
    px *p = st;
    kvs__entry *x = &kvs__entries(ix)[e];
    px_hist *s = slot(p, &x->key);
    int to = s->seen ? 1 : 0;
    double cap = cap_of(ix);
    if (recent_ghost(p, s, cap)) {
        /* ARC's adaptation: a miss T1 (or T2) would have turned into a hit
         * had that segment been larger. Steps as in ARC: max(1, |other|/|this|). */
        double b1 = ghost_size(p, 0, cap), b2 = ghost_size(p, 1, cap);
        if (s->seg == 0)
            p->p += b1 > 0 && b2 > b1 ? b2 / b1 : 1;
        else
            p->p -= b2 > 0 && b1 > b2 ? b1 / b2 : 1;
        p->p = p->p < -cap ? -cap : p->p > 2 * cap ? 2 * cap : p->p;
    }
    s->ev = 0;
    if (s->seen < 255)
        s->seen++;
    x->pkey = ++p->clock;
    set_seg(x, to);
    p->sz[to]++;
}

static void px_add(void *st, kvs__index *ix, uint32_t e)
{
    px *p = st;
    kvs__entry *E = kvs__entries(ix);
    kvs__heap_push(&p->heap[seg_of(&E[e])], E, e);
}

static void px_del(void *st, kvs__index *ix, uint32_t e)
{
    px *p = st;
    kvs__entry *E = kvs__entries(ix);
    kvs__heap_del(&p->heap[seg_of(&E[e])], E, e);
}

/* A hit: the block is proven; it moves to (or stays in) T2, most recent. */
static void px_access(void *st, kvs__index *ix, uint32_t e)
{
    px *p = st;
    kvs__entry *x = &kvs__entries(ix)[e];
    px_hist *s = slot(p, &x->key);
    if (s->seen < 255)
        s->seen++;
    int cand = (x->flags & KVS__F_CAND) != 0;
    if (cand)
        px_del(st, ix, e);
    if (!seg_of(x)) {
        p->sz[0]--;
        p->sz[1]++;
        set_seg(x, 1);
    }
    x->pkey = ++p->clock;
    if (cand)
        px_add(st, ix, e);
}

static void px_remove(void *st, kvs__index *ix, uint32_t e)
{
    px *p = st;
    p->sz[seg_of(&kvs__entries(ix)[e])]--;
}

/* T1's target: the summed adaptation clamped to 0..capacity. */
static double target_t1(const px *p, kvs__index *ix)
{
    double cap = cap_of(ix);
    return p->p < 0 ? 0 : p->p > cap ? cap : p->p;
}

/* T1's least recent leaf while T1 is over its target, else T2's; the victim's
 * key is remembered as a ghost of its segment. (The index may park a leased
 * victim instead of evicting it; recording it as a ghost anyway costs at most
 * one spurious adaptation step when it comes back.) */
static uint32_t px_victim(void *st, kvs__index *ix)
{
    px *p = st;
    kvs__entry *E = kvs__entries(ix);
    uint32_t t1 = kvs__heap_top(&p->heap[0]), t2 = kvs__heap_top(&p->heap[1]);
    uint32_t v =
        t1 != KVS__NIL && ((double)p->sz[0] > target_t1(p, ix) || t2 == KVS__NIL) ? t1 : t2;
    if (v == KVS__NIL)
        return KVS__NIL;
    int sg = seg_of(&E[v]);
    px_hist *s = slot(p, &E[v].key);
    s->seg = (uint8_t)sg;
    s->ev = ++p->nev[sg];
    if (s->ev == 0) /* 0 means "not evicted": skip it on wrap-around */
        s->ev = ++p->nev[sg];
    return v;
}

const kvs__policy_ops kvs__policy_prefix = {
    .name = "prefix",
    .create = px_create,
    .destroy = px_destroy,
    .on_insert = px_insert,
    .on_access = px_access,
    .add_cand = px_add,
    .del_cand = px_del,
    .on_remove = px_remove,
    .victim = px_victim,
    .on_hint = NULL,
    .admit = NULL,
};
