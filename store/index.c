/*
 * index.c — the store: a hash table of chain-linked block entries, with eviction.
 *
 * The idea: entries sit in one growable array and refer to each other by u32
 * index (parent, free list, policy links), so an entry is 120 bytes and
 * growing the array is a copy. The hash table is open addressing over 32-bit
 * slots that hold an entry index and a tag from the key (slot_put, below), so
 * entries never move when the table does. Its positions come from the first
 * 8 bytes of the key: keys are SHA-256 outputs the server computes with a
 * tenant secret, so they are uniform and a client cannot aim at one slot.
 *
 * Invariants (kvs_store_check verifies them all):
 *  - every live entry is in exactly one table slot, reachable from its key's
 *    home slot without crossing an empty one; free entries are on the free
 *    list through hnext;
 *  - parent of a live entry is live (or NIL for a root) and nchildren counts the
 *    live entries naming it;
 *  - memkids counts the live children not on the SSD tier;
 *  - F_CAND is set exactly when the entry is live, not on SSD, memkids == 0,
 *    pins == 0, holds == 0 and neither F_PARKED nor F_SKIP, and then the policy
 *    knows it as a candidate (do_refresh keeps this true). A candidate with
 *    children (all on SSD) can only be demoted, never dropped;
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
 * Locking (store_int.h): a reader/writer lock of s->wmu, s->writer and one
 * busy word per reader stripe (rd_lock, kvs__lock). Lookups without a lease
 * and contains take the read side and only read the index: table slots, keys, parent,
 * n_tokens, tokens. Their accesses (last_access, hits, the policy's order) are
 * applied later from the read buffers, by kvs__lock before any writer runs
 * or by a lookup whose buffer filled (under s->drain_mu, try-locked: when
 * another lookup is draining, the access is dropped). Those drains write
 * last_access, hits, the policy fields and the policy's own state, which no
 * reader reads. Every other public function takes the write side through
 * kvs__lock; do_* and kvs__ functions run with it held. Payloads, tiers,
 * leases with ids and quotas are in payload.c; the struct is in store_int.h.
 *
 * Eviction (kvs__evict) asks the policy for victims and handles each by mode:
 * COUNT (block capacity) drops SSD-resident leaves oldest-demoted first, then
 * policy victims; BYTES (DRAM above its high watermark) demotes DRAM victims
 * to SSD when there is one, else drops them. A victim under an anonymous
 * lease is parked (above); one with priority > 0 is set aside (F_SKIP) while
 * any unprotected candidate is left, then the lowest priority goes first; one
 * that cannot go in this mode (children on SSD under COUNT) is set aside too.
 * Set-aside entries return to the candidates when the call ends.
 */
#include "store.h"

#include "kvs_error.h"
#include "policy.h"
#include "store_int.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

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

/* The hash table: open addressing with linear probing over 32-bit slots.
 * A slot holds an entry index in its low ibits bits and, above them, a tag:
 * the top bits of the key's second 32-bit word (never all ones). A probe
 * compares tags and reads an entry only when its tag matches, so a lookup
 * costs one slot line and one entry (a chained bucket walk read 1 + load/2
 * entries, each a dependent cache miss at a million blocks), and a miss
 * usually reads no entry at all. The home slot is the key's first 32-bit word
 * scaled to nslot (Lemire's multiply-shift, so nslot need not be a power of
 * two). Empty slots are all ones, removed entries leave a tombstone (all ones
 * but the lowest bit) that later inserts reuse; neither can look like an
 * entry because no tag is all ones. used_slot (live + tombstones) stays at or
 * below 3/4 of nslot, so a probe always ends; the table is rebuilt (tombstones
 * gone, live entries at 3/5 of the slots) when an insert would pass that, and
 * when the entry array outgrows ibits. Slots per block stay between 4/3 and
 * 5/3 as the store fills (under 7 bytes beside the entry's 120: the 128-byte
 * bound; removals without inserts leave more, as any table that never shrinks). */
#define SLOT_EMPTY UINT32_MAX
#define SLOT_TOMB  (UINT32_MAX - 1)
#define SLOT_MIN   1024u

static inline uint64_t key_h64(const kvs_key *k)
{
    uint64_t h;
    memcpy(&h, k->b, sizeof h);
    return h;
}

static inline uint32_t slot_home(const kvs__index *ix, uint64_t h)
{
    return (uint32_t)(((h & 0xffffffffu) * ix->nslot) >> 32);
}

static inline uint32_t slot_tag(const kvs__index *ix, uint64_t h)
{
    uint32_t t = (uint32_t)(h >> 32) >> ix->ibits;
    return t == (UINT32_MAX >> ix->ibits) ? 0 : t;
}

/* 32-byte key compare inline (memcmp is a call and stops early for nothing:
 * keys whose tags match differ in their first 8 bytes almost always). */
static inline int key_eq(const kvs_key *a, const kvs_key *b)
{
    uint64_t x[4], y[4];
    memcpy(x, a->b, sizeof x);
    memcpy(y, b->b, sizeof y);
    return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}

/* Starts loading entry i's policy links (what a list policy's on_access
 * rewrites in its neighbours) when i names a slot; any other value is ignored. */
static inline void prefetch_links(const kvs__index *ix, uint32_t i)
{
    if (i < ix->used_e)
        __builtin_prefetch(ix->e[i].plink, 1);
}

#define do_find kvs__find

/* Large index arrays (entries, table slots) live in 2 MiB-aligned mappings
 * advised for transparent huge pages: at a million blocks most of a lookup's
 * misses are TLB misses (store_bench). Growing copies into a fresh mapping,
 * whose pages are then faulted in huge; mremap (realloc) would keep the old
 * 4 KiB pages. Arrays under 2 MiB, and sanitizer builds (whose checks need
 * malloc'd memory), use malloc. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVS__ARR_MALLOC_ONLY 1
#else
#define KVS__ARR_MALLOC_ONLY 0
#endif
#define HUGE_SZ ((size_t)2 << 20)

static int arr_mapped(size_t len) { return !KVS__ARR_MALLOC_ONLY && len >= HUGE_SZ; }

static void *arr_alloc(size_t len)
{
    if (!arr_mapped(len))
        return malloc(len);
    size_t l = (len + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ;
    uint8_t *p = mmap(NULL, l + HUGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uint8_t *q = (uint8_t *)(((uintptr_t)p + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ);
    if (q > p)
        munmap(p, (size_t)(q - p));
    if (p + HUGE_SZ > q)
        munmap(q + l, (size_t)(p + HUGE_SZ - q));
    madvise(q, l, MADV_HUGEPAGE); /* advice: failure only costs speed */
    return q;
}

static void arr_free(void *p, size_t len)
{
    if (!p)
        return;
    if (!arr_mapped(len))
        free(p);
    else
        munmap(p, (len + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ);
}

static void *arr_grow(void *p, size_t old, size_t len)
{
    if (!arr_mapped(len))
        return realloc(p, len);
    void *q = arr_alloc(len);
    if (!q)
        return NULL;
    if (p)
        memcpy(q, p, old);
    arr_free(p, old);
    return q;
}

/* Puts entry i (not in the table) in the first empty or tombstone slot of its
 * key's probe sequence. */
static void slot_put(kvs__index *ix, uint32_t i)
{
    uint64_t h = key_h64(&ix->e[i].key);
    uint32_t pos = slot_home(ix, h);
    while (ix->slot[pos] < SLOT_TOMB)
        if (++pos == ix->nslot)
            pos = 0;
    if (ix->slot[pos] == SLOT_EMPTY)
        ix->used_slot++;
    ix->slot[pos] = i | slot_tag(ix, h) << ix->ibits;
}

/* Takes live entry i out of the table: its slot becomes a tombstone, or empty
 * (with the tombstones just before it) when the next slot is empty, since no
 * probe then needs to pass it. */
static void slot_del(kvs__index *ix, uint32_t i)
{
    uint64_t h = key_h64(&ix->e[i].key);
    uint32_t want = i | slot_tag(ix, h) << ix->ibits, pos = slot_home(ix, h);
    while (ix->slot[pos] != want) {
        KVS_ASSERT(ix->slot[pos] != SLOT_EMPTY);
        if (++pos == ix->nslot)
            pos = 0;
    }
    uint32_t next = pos + 1 == ix->nslot ? 0 : pos + 1;
    if (ix->slot[next] != SLOT_EMPTY) {
        ix->slot[pos] = SLOT_TOMB;
        return;
    }
    do {
        ix->slot[pos] = SLOT_EMPTY;
        ix->used_slot--;
        pos = pos == 0 ? ix->nslot - 1 : pos - 1;
    } while (ix->slot[pos] == SLOT_TOMB);
}

static uint32_t ibits_for(uint32_t cap_e)
{
    uint32_t b = 10;
    while (b < 31 && (1u << b) < cap_e)
        b++;
    return b;
}

/* A table of nslot slots (rounded up to 16, at least SLOT_MIN) holding every
 * live entry, with ibits fitted to the entry array; replaces the old one. */
static int slot_build(kvs__index *ix, uint64_t nslot)
{
    nslot = nslot < SLOT_MIN ? SLOT_MIN : (nslot + 15) & ~(uint64_t)15;
    if (nslot > UINT32_MAX - 16)
        return KVS_ENOMEM;
    uint32_t *v = arr_alloc((size_t)nslot * sizeof *v);
    if (!v)
        return KVS_ENOMEM;
    memset(v, 0xff, (size_t)nslot * sizeof *v);
    arr_free(ix->slot, (size_t)ix->nslot * sizeof *ix->slot);
    ix->slot = v;
    ix->nslot = (uint32_t)nslot;
    ix->used_slot = 0;
    ix->ibits = ibits_for(ix->cap_e);
    for (uint32_t i = 0; i < ix->used_e; i++) {
        /* Entries are read in order, slots at random: start on a later one's. */
        if (i + 16 < ix->used_e)
            __builtin_prefetch(&v[slot_home(ix, key_h64(&ix->e[i + 16].key))], 1);
        if (ix->e[i].flags & KVS__F_LIVE)
            slot_put(ix, i);
    }
    return 0;
}

/* Room for one more entry, whose index is below cap_e. */
static int slot_reserve(kvs__index *ix)
{
    if ((uint64_t)(ix->used_slot + 1) * 4 <= (uint64_t)ix->nslot * 3 &&
        ix->cap_e <= 1u << ix->ibits)
        return 0;
    return slot_build(ix, (ix->count + 1) * 5 / 3);
}

/* Token arrays (kvs__tokpool in store_int.h): a lookup compares the stored
 * ids, and at a million blocks 64-byte mallocs spread over 20k pages cost a
 * TLB miss each; slots in huge-page chunks do not. */
#define TOK_POOL_MAX 16384u /* bytes; longer arrays are malloc'd */

static int tok_class(kvs__tokpool *tp, uint32_t n, int create)
{
    if (KVS__ARR_MALLOC_ONLY || (size_t)n * 4 > TOK_POOL_MAX)
        return -1;
    for (uint32_t k = 0; k < tp->nc; k++)
        if (tp->c[k].n == n)
            return (int)k;
    if (!create || tp->nc == KVS__TOK_CLASSES)
        return -1;
    tp->c[tp->nc].n = n;
    return (int)tp->nc++;
}

#define TOK_PRIM_MAX 256u /* bytes: the largest primary slot */

/* Entry i's primary slot, or NULL when its chunk is not allocated. */
static inline uint32_t *tok_prim(const kvs__tokpool *tp, uint32_t i)
{
    uint32_t c = i >> tp->prim.shift;
    if (c >= tp->prim.nchunk || !tp->prim.chunk[c])
        return NULL;
    return (uint32_t *)(void *)(tp->prim.chunk[c] +
                                (size_t)(i & ((1u << tp->prim.shift) - 1)) * tp->prim.n * 4);
}

/* The entry with key k, or KVS__NIL. n: the token count of the block looked
 * for, or 0; when it is the primary length, the token slot of an entry whose
 * tag matches starts loading with the entry (the compare after needs both). */
static inline uint32_t find_in(const kvs__index *ix, const kvs_key *k, uint32_t n)
{
    uint64_t h = key_h64(k);
    uint32_t ib = ix->ibits, tag = slot_tag(ix, h), mask = (1u << ib) - 1;
    int pf = n != 0 && n == ix->tp.prim.n;
    for (uint32_t pos = slot_home(ix, h);;) {
        uint32_t v = ix->slot[pos];
        if (v == SLOT_EMPTY)
            return KVS__NIL;
        if ((v >> ib) == tag) { /* tombstones never match */
            const uint32_t *t = pf ? tok_prim(&ix->tp, v & mask) : NULL;
            if (t)
                __builtin_prefetch(t);
            if (key_eq(&ix->e[v & mask].key, k))
                return v & mask;
        }
        if (++pos == ix->nslot)
            pos = 0;
    }
}

uint32_t kvs__find(const kvs__index *ix, const kvs_key *k)
{
    return find_in(ix, k, 0);
}

static uint32_t *tok_prim_alloc(kvs__tokpool *tp, uint32_t i)
{
    uint32_t c = i >> tp->prim.shift;
    if (c >= tp->prim.nchunk) {
        uint32_t nc = tp->prim.nchunk ? tp->prim.nchunk : 4;
        while (nc <= c)
            nc *= 2;
        uint8_t **v = realloc(tp->prim.chunk, nc * sizeof *v);
        if (!v)
            return NULL;
        memset(v + tp->prim.nchunk, 0, (nc - tp->prim.nchunk) * sizeof *v);
        tp->prim.chunk = v;
        tp->prim.nchunk = nc;
    }
    if (!tp->prim.chunk[c] && !(tp->prim.chunk[c] = arr_alloc(HUGE_SZ)))
        return NULL;
    return tok_prim(tp, i);
}

/* Room for n token ids of entry i. */
static uint32_t *tok_alloc(kvs__tokpool *tp, uint32_t n, uint32_t i)
{
    if (tp->prim.n == 0 && n > 0 && (size_t)n * 4 <= TOK_PRIM_MAX) {
        tp->prim.n = n;
        tp->prim.shift = 0;
        while (((size_t)2 << tp->prim.shift) * n * 4 <= HUGE_SZ)
            tp->prim.shift++;
    }
    if (n > 0 && n == tp->prim.n)
        return tok_prim_alloc(tp, i);
    int k = tok_class(tp, n, 1);
    if (k < 0)
        return malloc((size_t)n * sizeof(uint32_t));
    size_t bytes = ((size_t)n * 4 + 7) & ~(size_t)7;
    if (tp->c[k].free) {
        void *p = tp->c[k].free;
        memcpy(&tp->c[k].free, p, sizeof(void *));
        return p;
    }
    if (tp->c[k].left < bytes) {
        if (tp->nchunks == tp->cap_chunks) {
            uint32_t nc = tp->cap_chunks ? 2 * tp->cap_chunks : 16;
            void **v = realloc(tp->chunks, nc * sizeof *v);
            if (!v)
                return NULL;
            tp->chunks = v;
            tp->cap_chunks = nc;
        }
        uint8_t *c = arr_alloc(HUGE_SZ);
        if (!c)
            return NULL;
        tp->chunks[tp->nchunks++] = c;
        tp->c[k].cur = c;
        tp->c[k].left = HUGE_SZ;
    }
    void *p = tp->c[k].cur;
    tp->c[k].cur += bytes;
    tp->c[k].left -= bytes;
    return p;
}

static void tok_free(kvs__tokpool *tp, uint32_t *p, uint32_t n)
{
    if (n > 0 && n == tp->prim.n)
        return; /* the slot belongs to the entry index */
    int k = tok_class(tp, n, 0);
    if (k < 0) {
        free(p);
        return;
    }
    void *next = tp->c[k].free;
    memcpy(p, &next, sizeof next);
    tp->c[k].free = p;
}

static void tok_pool_close(kvs__tokpool *tp)
{
    for (uint32_t c = 0; c < tp->prim.nchunk; c++)
        arr_free(tp->prim.chunk[c], HUGE_SZ);
    free(tp->prim.chunk);
    for (uint32_t i = 0; i < tp->nchunks; i++)
        arr_free(tp->chunks[i], HUGE_SZ);
    free(tp->chunks);
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
        kvs__entry *ne = arr_grow(ix->e, (size_t)ix->cap_e * sizeof *ne, (size_t)nc * sizeof *ne);
        if (!ne)
            return KVS__NIL;
        ix->e = ne;
        ix->cap_e = nc;
    }
    memset(&ix->e[ix->used_e], 0, sizeof *ix->e); /* not live until filled in */
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
uint32_t kvs__now(const kvs_store *s) { return now32(s); }

static int lease_active(const kvs_store *s, const kvs__entry *x)
{
    return x->lease_ms != 0 && (int32_t)(x->lease_ms - now32(s)) > 0;
}
int kvs__lease_active(const kvs_store *s, const kvs__entry *x) { return lease_active(s, x); }

/* Brings F_CAND (and the policy's candidate set) in line with the entry. */
static int want_cand(const kvs__entry *x)
{
    return (x->flags & KVS__F_LIVE) && x->tier != KVS_TIER_SSD && x->memkids == 0 &&
           x->pins == 0 && x->holds == 0 && !(x->flags & (KVS__F_PARKED | KVS__F_SKIP));
}

static void do_refresh(kvs_store *s, uint32_t i)
{
    kvs__entry *x = &s->ix.e[i];
    int want = want_cand(x);
    int have = (x->flags & KVS__F_CAND) != 0;
    if (want && !have) {
        x->flags |= KVS__F_CAND;
        s->pol->add_cand(s->pst, &s->ix, i);
    } else if (!want && have) {
        x->flags &= (uint8_t)~KVS__F_CAND;
        s->pol->del_cand(s->pst, &s->ix, i);
    }
}

void kvs__refresh(kvs_store *s, uint32_t i) { do_refresh(s, i); }

int kvs__parent_guard(kvs_store *s, uint32_t p)
{
    if (p == KVS__NIL || s->ix.e[p].pins == UINT16_MAX)
        return 0;
    s->ix.e[p].pins++;
    do_refresh(s, p);
    return 1;
}

void kvs__parent_unguard(kvs_store *s, uint32_t p, int guard)
{
    if (!guard)
        return;
    s->ix.e[p].pins--;
    do_refresh(s, p);
}

static void do_touch(kvs_store *s, uint32_t i)
{
    kvs__entry *x = &s->ix.e[i];
    x->last_access = ++s->ix.tick;
    if (x->hits < UINT16_MAX)
        x->hits++;
    s->pol->on_access(s->pst, &s->ix, i);
}
void kvs__touch(kvs_store *s, uint32_t i) { do_touch(s, i); }

/* Applies one read buffer: its lookups' touches in their order, each leaf
 * first, and its counters. The caller holds the write side, or the read side
 * with drain_mu and b->mu (the bit in rmask stays set: only a writer clears
 * it, when it drains). */
static void do_drain(kvs_store *s, kvs__rbuf *b)
{
    kvs__index *ix = &s->ix;
    for (uint32_t k = 0; k < b->n; k++) {
        /* Single-block lookups leave random entries: load the one after next,
         * and the neighbours on_access relinks of the next (list policies). */
        if (k + 2 < b->n)
            __builtin_prefetch(&ix->e[b->leaf[k + 2]], 1);
        if (k + 1 < b->n) {
            prefetch_links(ix, ix->e[b->leaf[k + 1]].plink[0]);
            prefetch_links(ix, ix->e[b->leaf[k + 1]].plink[1]);
        }
        for (uint32_t i = b->leaf[k]; i != KVS__NIL; i = ix->e[i].parent)
            do_touch(s, i);
    }
    b->n = 0;
    s->st.lookups += b->lookups;
    s->st.lookup_blocks += b->lookup_blocks;
    s->st.hit_blocks += b->hit_blocks;
    b->lookups = b->lookup_blocks = b->hit_blocks = 0;
}

/* Waits for *a to read 0: a few hundred polls, then yielding the CPU (the
 * holder may not be running: two shared cores, many threads). */
static void wait_zero(atomic_uint *a)
{
    for (unsigned n = 0; atomic_load_explicit(a, memory_order_acquire) != 0; n++)
        if (n >= 256)
            sched_yield();
}

/* The write side (store_int.h, "Locking"): writers queue on wmu; the one
 * holding it raises s->writer, then waits until no stripe is held. A reader
 * that takes its stripe after that sees the flag and backs off, so a writer
 * waits at most for the lookups already running (writers first). The flag
 * store and the stripe loads are sequentially consistent, as are the
 * reader's stripe exchange and flag load: of a writer and a reader arriving
 * together, at least one sees the other. */
void kvs__lock(kvs_store *s)
{
    pthread_mutex_lock(&s->wmu);
    atomic_store(&s->writer, 1u);
    for (unsigned k = 0; k < KVS__RSTRIPES; k++)
        if (atomic_load(&s->rbuf[k].busy) != 0)
            wait_zero(&s->rbuf[k].busy);
    /* Relaxed is enough: releasing the stripes ordered each reader's update before us. */
    unsigned m = atomic_load_explicit(&s->rmask, memory_order_relaxed);
    if (m) /* a locked exchange only when some lookup ran since the last writer */
        m = atomic_exchange_explicit(&s->rmask, 0, memory_order_relaxed);
    for (; m; m &= m - 1)
        do_drain(s, &s->rbuf[__builtin_ctz(m)]);
}

void kvs__unlock(kvs_store *s)
{
    atomic_store_explicit(&s->writer, 0u, memory_order_release);
    pthread_mutex_unlock(&s->wmu);
}

/* This thread's stripe: threads are numbered round-robin at their first
 * lookup (any store), so up to KVS__RSTRIPES threads never share one. */
static atomic_uint g_next_stripe;
static _Thread_local unsigned t_stripe; /* 0 = not numbered yet, else stripe + 1 */

/* The read side: takes this thread's stripe (one locked exchange on a line
 * no other thread uses, when at most KVS__RSTRIPES threads look up), and
 * returns it once no writer is in. A thread sharing the stripe waits for the
 * other's lookup; a reader that meets a writer waits on wmu, which the writer
 * holds until it is done. */
static kvs__rbuf *rd_lock(kvs_store *s)
{
    if (t_stripe == 0)
        t_stripe = atomic_fetch_add_explicit(&g_next_stripe, 1, memory_order_relaxed) %
                       KVS__RSTRIPES + 1;
    kvs__rbuf *b = &s->rbuf[t_stripe - 1];
    for (;;) {
        unsigned free_ = 0;
        if (!atomic_compare_exchange_strong(&b->busy, &free_, 1u)) {
            wait_zero(&b->busy);
            continue;
        }
        if (atomic_load(&s->writer) == 0)
            return b;
        atomic_store_explicit(&b->busy, 0u, memory_order_release);
        pthread_mutex_lock(&s->wmu);
        pthread_mutex_unlock(&s->wmu);
    }
}

static void rd_unlock(kvs__rbuf *b)
{
    atomic_store_explicit(&b->busy, 0u, memory_order_release);
}

/* Records a lookup's accesses in b, the stripe it holds: leaf = its deepest
 * matched block or KVS__NIL. */
static void rd_record(kvs_store *s, kvs__rbuf *b, uint32_t leaf, size_t asked, size_t matched)
{
    if (b->lookups == 0) /* empty (a record always comes with a count): tell writers */
        atomic_fetch_or_explicit(&s->rmask, 1u << (b - s->rbuf), memory_order_relaxed);
    if (leaf != KVS__NIL) {
        /* Full: drain it unless another lookup is draining its own; then this
         * access is dropped rather than waited for (Caffeine's read buffer:
         * under contention recency is approximate, lookups never queue). A
         * single thread always gets the drain, so it loses nothing. */
        if (b->n == KVS__RBUF && pthread_mutex_trylock(&s->drain_mu) == 0) {
            do_drain(s, b);
            pthread_mutex_unlock(&s->drain_mu);
        }
        if (b->n < KVS__RBUF)
            b->leaf[b->n++] = leaf;
    }
    b->lookups++;
    b->lookup_blocks += asked;
    b->hit_blocks += matched;
}

static void list_del(uint32_t *v, uint32_t *n, uint32_t i)
{
    for (uint32_t k = 0; k < *n; k++)
        if (v[k] == i) {
            v[k] = v[--*n];
            return;
        }
}

static int list_push(uint32_t **v, uint32_t *n, uint32_t *cap, uint32_t i)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? 2 * *cap : 64;
        uint32_t *nv = realloc(*v, (size_t)nc * sizeof *nv);
        if (!nv)
            return KVS_ENOMEM;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = i;
    return 0;
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
    if (x->flags & KVS__F_PARKED)
        list_del(s->parked, &s->nparked, i);
    if (x->flags & KVS__F_SKIP) {
        list_del(s->prot, &s->nprot, i);
        list_del(s->stuck, &s->nstuck, i);
    }
    if (x->holds)
        kvs__holds_scrub(s, i);
    if (s->nbusy)
        kvs__busy_removed(s, i);
    int on_ssd = x->tier == KVS_TIER_SSD;
    if (x->tier != KVS_TIER_NONE)
        kvs__payload_detach(s, x);
    slot_del(ix, i);
    uint32_t p = x->parent;
    tok_free(&ix->tp, x->tokens, x->n_tokens);
    memset(x, 0, sizeof *x);
    x->hnext = ix->free_head;
    ix->free_head = i;
    ix->count--;
    s->st.evictions[why]++;
    if (p != KVS__NIL) {
        ix->e[p].nchildren--;
        if (!on_ssd)
            ix->e[p].memkids--;
        do_refresh(s, p);
    }
}

void kvs__remove(kvs_store *s, uint32_t i, kvs_evict_reason why) { do_remove(s, i, why); }

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

static int over(const kvs_store *s, int mode, uint64_t goal)
{
    return mode == KVS__EV_COUNT ? s->ix.count >= goal : s->used > goal;
}

/* Sets victim v aside for the rest of this eviction. */
static int do_set_aside(kvs_store *s, uint32_t v, int protect)
{
    int rc = protect ? list_push(&s->prot, &s->nprot, &s->cap_prot, v)
                     : list_push(&s->stuck, &s->nstuck, &s->cap_stuck, v);
    if (rc)
        return rc;
    s->ix.e[v].flags |= KVS__F_SKIP;
    do_refresh(s, v);
    return 0;
}

/* The set-aside victim to take once no unprotected candidate is left: the
 * lowest priority, then the least recently used. */
static uint32_t do_take_protected(kvs_store *s)
{
    if (!s->nprot)
        return KVS__NIL;
    uint32_t bk = 0;
    for (uint32_t k = 1; k < s->nprot; k++) {
        const kvs__entry *a = &s->ix.e[s->prot[k]], *b = &s->ix.e[s->prot[bk]];
        if (a->prio < b->prio || (a->prio == b->prio && a->last_access < b->last_access))
            bk = k;
    }
    uint32_t v = s->prot[bk];
    s->prot[bk] = s->prot[--s->nprot];
    return v;
}

/* Handles one victim v (a candidate, or a protected one taken back): 1 when
 * it left DRAM or the store, 0 when it was set aside or parked, or an error. */
static int do_evict_one(kvs_store *s, uint32_t v, int mode, kvs_evict_reason why)
{
    kvs__entry *x = &s->ix.e[v];
    if (lease_active(s, x)) {
        if (list_push(&s->parked, &s->nparked, &s->cap_parked, v))
            return KVS_ENOMEM;
        x->flags |= KVS__F_PARKED;
        x->flags &= (uint8_t)~KVS__F_SKIP;
        do_refresh(s, v);
        return 0;
    }
    x->flags &= (uint8_t)~KVS__F_SKIP;
    if (mode == KVS__EV_BYTES && x->tier == KVS_TIER_DRAM && s->ssd) {
        int rc = kvs__demote(s, v);
        if (rc == 0)
            return 1;
        /* The SSD could not take it: drop it if that keeps chains whole. */
    }
    if (x->nchildren == 0 && (mode == KVS__EV_COUNT || x->tier == KVS_TIER_DRAM)) {
        x->lease_ms = 0;
        do_remove(s, v, why);
        return 1;
    }
    return do_set_aside(s, v, 0);
}

/* BYTES mode with an SSD tier, once no candidate is left: the least recently
 * used unprotected DRAM block even if it has children in DRAM. Demotion keeps
 * it in the index, so chains stay whole; without this a chain longer than DRAM
 * could not be put (each new block's ancestors have a child in DRAM). A scan:
 * only reached when the policy has nothing to offer. */
static uint32_t do_oldest_dram(kvs_store *s)
{
    uint32_t best = KVS__NIL;
    for (uint32_t i = 0; i < s->ix.used_e; i++) {
        const kvs__entry *x = &s->ix.e[i];
        if (!(x->flags & KVS__F_LIVE) || x->tier != KVS_TIER_DRAM || x->pins || x->holds ||
            (x->flags & (KVS__F_SKIP | KVS__F_PARKED)) || lease_active(s, x))
            continue;
        if (best == KVS__NIL || x->last_access < s->ix.e[best].last_access)
            best = i;
    }
    return best;
}

/* Ends an eviction: set-aside entries become candidates again. */
static void do_evict_end(kvs_store *s)
{
    for (uint32_t *v = s->prot, n = s->nprot; n; n--, v++)
        s->ix.e[*v].flags &= (uint8_t)~KVS__F_SKIP;
    for (uint32_t *v = s->stuck, n = s->nstuck; n; n--, v++)
        s->ix.e[*v].flags &= (uint8_t)~KVS__F_SKIP;
    uint32_t np = s->nprot, ns = s->nstuck;
    s->nprot = s->nstuck = 0;
    for (uint32_t k = 0; k < np; k++)
        do_refresh(s, s->prot[k]);
    for (uint32_t k = 0; k < ns; k++)
        do_refresh(s, s->stuck[k]);
}

int kvs__evict(kvs_store *s, int mode, uint64_t goal, kvs_evict_reason why)
{
    kvs__reap_holds(s);
    if (s->nparked)
        do_unpark(s);
    if (mode == KVS__EV_COUNT && s->ssd)
        while (over(s, mode, goal) && kvs__ssd_drop_oldest(s, why) == 0) {
        }
    int rc = 0;
    while (over(s, mode, goal)) {
        uint32_t v = s->pol->victim(s->pst, &s->ix);
        if (v != KVS__NIL) {
            KVS_ASSERT(s->ix.e[v].flags & KVS__F_CAND);
            if (s->ix.e[v].prio > 0 && !lease_active(s, &s->ix.e[v])) {
                rc = do_set_aside(s, v, 1);
                if (rc)
                    break;
                continue;
            }
        } else if ((v = do_take_protected(s)) == KVS__NIL) {
            if (mode == KVS__EV_BYTES && s->ssd && (v = do_oldest_dram(s)) != KVS__NIL) {
                if (kvs__demote(s, v) != 0 && (rc = do_set_aside(s, v, 0)) != 0)
                    break;
                continue;
            }
            rc = KVS_ENOSPC;
            break;
        }
        rc = do_evict_one(s, v, mode, why);
        if (rc < 0)
            break;
        rc = 0;
    }
    do_evict_end(s);
    return rc;
}

/* Evicts until count < limit (COUNT mode). */
static int do_make_room(kvs_store *s, uint64_t limit, kvs_evict_reason why)
{
    return kvs__evict(s, KVS__EV_COUNT, limit, why);
}

int kvs_store_open(const kvs_store_opts *o, kvs_store **out)
{
    return kvs_store_open_ex(o, NULL, out);
}

int kvs_store_open_ex(const kvs_store_opts *o, const kvs_store_payload_opts *p, kvs_store **out)
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
    s->ix.free_head = KVS__NIL;
    if (slot_build(&s->ix, SLOT_MIN) != 0) {
        free(s);
        return KVS_ENOMEM;
    }
    s->ix.capacity = o ? o->capacity_blocks : 0;
    s->verify_chain = o ? o->verify_chain : 0;
    s->clock_ms = o && o->clock_ms ? o->clock_ms : default_clock_ms;
    s->clock_arg = o ? o->clock_arg : NULL;
    s->pol = pol;
    if (pol->create(&s->ix, &s->pst) != 0) {
        arr_free(s->ix.slot, s->ix.nslot * sizeof *s->ix.slot);
        free(s);
        return KVS_ENOMEM;
    }
    int rc = kvs__payload_open(s, p);
    if (rc) {
        pol->destroy(s->pst);
        kvs__payload_close(s);
        arr_free(s->ix.slot, s->ix.nslot * sizeof *s->ix.slot);
        free(s);
        return rc;
    }
    s->rbuf = aligned_alloc(64, KVS__RSTRIPES * sizeof *s->rbuf);
    if (!s->rbuf) {
        pol->destroy(s->pst);
        kvs__payload_close(s);
        arr_free(s->ix.slot, s->ix.nslot * sizeof *s->ix.slot);
        free(s);
        return KVS_ENOMEM;
    }
    memset(s->rbuf, 0, KVS__RSTRIPES * sizeof *s->rbuf);
    for (uint32_t k = 0; k < KVS__RSTRIPES; k++)
        atomic_init(&s->rbuf[k].busy, 0u);
    atomic_init(&s->writer, 0u);
    pthread_mutex_init(&s->drain_mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    *out = s;
    return 0;
}

void kvs_store_close(kvs_store *s)
{
    if (!s)
        return;
    s->pol->destroy(s->pst);
    for (uint32_t i = 0; i < s->ix.used_e; i++)
        if (s->ix.e[i].flags & KVS__F_LIVE) {
            if (s->ix.e[i].tier != KVS_TIER_NONE)
                kvs__payload_detach(s, &s->ix.e[i]);
            tok_free(&s->ix.tp, s->ix.e[i].tokens, s->ix.e[i].n_tokens);
        }
    tok_pool_close(&s->ix.tp);
    kvs__payload_close(s);
    arr_free(s->ix.e, (size_t)s->ix.cap_e * sizeof *s->ix.e);
    arr_free(s->ix.slot, (size_t)s->ix.nslot * sizeof *s->ix.slot);
    free(s->parked);
    free(s->prot);
    free(s->stuck);
    free(s->rbuf);
    pthread_mutex_destroy(&s->drain_mu);
    pthread_mutex_destroy(&s->wmu);
    free(s);
}

/* Inserts one metadata entry (payload.c attaches a payload to it after).
 * verify: check the chain key (write_commit already did at write_begin). */
int kvs__insert(kvs_store *s, const kvs_key *key, const kvs_key *parent, uint32_t ns_id,
                const uint32_t *tokens, uint32_t n_tokens, uint64_t size, uint8_t ctx, int verify,
                uint32_t *out_idx)
{
    kvs__index *ix = &s->ix;
    if (n_tokens > UINT16_MAX)
        return KVS_EINVAL;
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
        if (out_idx)
            *out_idx = have;
        return KVS_EEXIST;
    }
    if (p != KVS__NIL && ix->e[p].depth == UINT16_MAX)
        return KVS_EINVAL; /* chains end at 65536 blocks */
    if (verify && s->verify_chain && parent) {
        kvs_key want;
        int rc = kvs_key_next(parent, tokens, n_tokens, &want);
        if (rc)
            return rc;
        if (memcmp(want.b, key->b, KVS_KEY_LEN) != 0) {
            s->st.refused++;
            return KVS_EINVAL;
        }
    }
    int guard = kvs__parent_guard(s, p);
    int full = ix->capacity && ix->count >= ix->capacity;
    int rc = 0;
    if (s->pol->admit && !s->pol->admit(s->pst, ix, key, full)) {
        s->st.not_admitted++;
        rc = KVS_ENOSPC;
    } else if (full) {
        rc = do_make_room(s, ix->capacity, KVS_EVICT_CAPACITY);
    }
    kvs__parent_unguard(s, p, guard);
    uint32_t i = rc == 0 ? do_alloc_slot(ix) : KVS__NIL;
    uint32_t *tok = NULL;
    if (i != KVS__NIL &&
        ((rc = slot_reserve(ix)) != 0 || !(tok = tok_alloc(&ix->tp, n_tokens, i)))) {
        ix->e[i].hnext = ix->free_head; /* not live: back to the free list */
        ix->free_head = i;
        i = KVS__NIL;
    }
    if (i == KVS__NIL)
        return rc ? rc : KVS_ENOMEM;
    memcpy(tok, tokens, (size_t)n_tokens * sizeof *tok);
    kvs__entry *x = &ix->e[i];
    memset(x, 0, sizeof *x);
    x->key = *key;
    x->tokens = tok;
    x->n_tokens = (uint16_t)n_tokens;
    x->size = (uint32_t)size;
    x->parent = p;
    x->ns_id = ns_id;
    x->depth = p == KVS__NIL ? 0 : (uint16_t)(ix->e[p].depth + 1);
    x->plink[0] = x->plink[1] = KVS__NIL;
    x->flags = KVS__F_LIVE;
    x->ctx = ctx;
    x->last_access = ++ix->tick;
    x->hnext = KVS__NIL;
    slot_put(ix, i);
    ix->count++;
    s->st.inserts++;
    s->pol->on_insert(s->pst, ix, i);
    if (p != KVS__NIL) {
        ix->e[p].nchildren++;
        ix->e[p].memkids++;
        do_refresh(s, p);
    }
    do_refresh(s, i);
    if (out_idx)
        *out_idx = i;
    return 0;
}

static int do_insert(kvs_store *s, const kvs_key *key, const kvs_key *parent, uint32_t ns_id,
                     const uint32_t *tokens, uint32_t n_tokens, uint64_t size, uint8_t ctx)
{
    return kvs__insert(s, key, parent, ns_id, tokens, n_tokens, size, ctx, 1, NULL);
}

int kvs_store_insert(kvs_store *s, const kvs_key *key, const kvs_key *parent, uint32_t ns_id,
                     const uint32_t *tokens, uint32_t n_tokens, uint64_t size)
{
    if (!s || !key || !tokens || n_tokens == 0 || size > UINT32_MAX)
        return KVS_EINVAL;
    kvs__lock(s);
    int rc = do_insert(s, key, parent, ns_id, tokens, n_tokens, size, KVS__CTX_TAIL_MASK);
    kvs__unlock(s);
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
    kvs__lock(s);
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
    kvs__unlock(s);
    return rc;
}

#define KVS_LEASE_MAX_MS (24u * 3600u * 1000u)

/* The longest matching prefix (either side of the lock held); *leaf gets its
 * deepest block or KVS__NIL. */
static size_t do_match(const kvs_store *s, const kvs_key *keys, const uint32_t *tokens,
                       uint32_t block_tokens, size_t nblocks, uint32_t *leaf)
{
    size_t n = 0;
    uint32_t prev = KVS__NIL;
    for (; n < nblocks; n++) {
        /* A lookup at a million blocks is a chain of cache misses: table
         * slot, entry, then token ids. Issue the independent ones together:
         * the next key's home slot, and, once the entry is found, its tokens. */
        if (n + 1 < nblocks)
            __builtin_prefetch(&s->ix.slot[slot_home(&s->ix, key_h64(&keys[n + 1]))]);
        uint32_t i = find_in(&s->ix, &keys[n], block_tokens);
        if (i == KVS__NIL)
            break;
        const kvs__entry *x = &s->ix.e[i];
        __builtin_prefetch(x->tokens);
        if (x->parent != prev || x->n_tokens != block_tokens ||
            memcmp(x->tokens, tokens + n * block_tokens, (size_t)block_tokens * sizeof *tokens))
            break;
        prev = i;
    }
    *leaf = prev;
    return n;
}

static int lookup(kvs_store *s, const kvs_key *keys, const uint32_t *tokens,
                  uint32_t block_tokens, size_t nblocks, uint32_t ttl_ms, size_t *matched)
{
    if (!s || !matched || (nblocks && (!keys || !tokens || block_tokens == 0)) ||
        ttl_ms > KVS_LEASE_MAX_MS)
        return KVS_EINVAL;
    uint32_t leaf;
    if (ttl_ms == 0) {
        /* The read side: the accesses go to this thread's read buffer. */
        kvs__rbuf *b = rd_lock(s);
        size_t n = do_match(s, keys, tokens, block_tokens, nblocks, &leaf);
        rd_record(s, b, leaf, nblocks, n);
        rd_unlock(b);
        *matched = n;
        return 0;
    }
    /* A lease changes entry state: the write side. */
    kvs__lock(s);
    size_t n = do_match(s, keys, tokens, block_tokens, nblocks, &leaf);
    /* Touch leaf-first so that every block ends up at least as recent as its
     * descendants (recency-ordered policies then see chain tails as older). */
    uint32_t until = now32(s) + ttl_ms;
    if (until == 0)
        until = 1; /* 0 means "no lease" */
    for (uint32_t i = leaf; i != KVS__NIL;) {
        kvs__entry *x = &s->ix.e[i];
        if (!lease_active(s, x) || (int32_t)(until - x->lease_ms) > 0)
            x->lease_ms = until;
        do_touch(s, i);
        i = x->parent;
    }
    s->st.lookups++;
    s->st.lookup_blocks += nblocks;
    s->st.hit_blocks += n;
    *matched = n;
    kvs__unlock(s);
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
    kvs__rbuf *b = rd_lock(s);
    int r = do_find(&s->ix, key) != KVS__NIL;
    rd_unlock(b);
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

static int protected_now(const kvs_store *s, const kvs__entry *x)
{
    return x->pins || x->holds || lease_active(s, x);
}

static int do_delete(kvs_store *s, const kvs_key *key, int subtree)
{
    kvs__index *ix = &s->ix;
    kvs__reap_holds(s);
    uint32_t t = do_find(ix, key);
    if (t == KVS__NIL)
        return KVS_ENOTFOUND;
    if (ix->e[t].nchildren && !subtree)
        return KVS_EPRECOND;
    if (ix->e[t].nchildren == 0) {
        if (protected_now(s, &ix->e[t]))
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
            if (protected_now(s, &ix->e[i])) {
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

/* Removes t and all its descendants whatever protects them (a corrupt SSD
 * copy: the block cannot be served, so neither can anything below it). */
int kvs__drop_subtree(kvs_store *s, uint32_t t, kvs_evict_reason why)
{
    kvs__index *ix = &s->ix;
    uint32_t n = 0, *v = malloc((size_t)ix->count * sizeof *v);
    if (!v)
        return KVS_ENOMEM;
    for (uint32_t i = 0; i < ix->used_e; i++)
        if ((ix->e[i].flags & KVS__F_LIVE) && do_under(ix, t, i))
            v[n++] = i;
    uint32_t maxd = 0;
    for (uint32_t k = 0; k < n; k++)
        if (ix->e[v[k]].depth > maxd)
            maxd = ix->e[v[k]].depth;
    for (uint32_t d = maxd + 1; d-- > ix->e[t].depth;)
        for (uint32_t k = 0; k < n; k++)
            if ((ix->e[v[k]].flags & KVS__F_LIVE) && ix->e[v[k]].depth == d)
                do_remove(s, v[k], v[k] == t ? why : KVS_EVICT_SUBTREE);
    free(v);
    return 0;
}

int kvs_store_delete(kvs_store *s, const kvs_key *key, int subtree)
{
    if (!s || !key)
        return KVS_EINVAL;
    kvs__lock(s);
    int rc = do_delete(s, key, subtree);
    kvs__unlock(s);
    return rc;
}

static int pin_delta(kvs_store *s, const kvs_key *key, int d)
{
    if (!s || !key)
        return KVS_EINVAL;
    kvs__lock(s);
    int rc = 0;
    uint32_t i = do_find(&s->ix, key);
    if (i == KVS__NIL)
        rc = KVS_ENOTFOUND;
    else if (d < 0 && s->ix.e[i].pins == 0)
        rc = kvs__unpin_ttl(s, i); /* a TTL pin ends early, or KVS_EPRECOND */
    else if (d > 0 && s->ix.e[i].pins == UINT16_MAX)
        rc = KVS_ENOSPC;
    else {
        s->ix.e[i].pins = (uint16_t)(s->ix.e[i].pins + d);
        do_refresh(s, i);
    }
    kvs__unlock(s);
    return rc;
}

int kvs_store_pin(kvs_store *s, const kvs_key *key) { return pin_delta(s, key, 1); }
int kvs_store_unpin(kvs_store *s, const kvs_key *key) { return pin_delta(s, key, -1); }

int kvs_store_hint(kvs_store *s, const kvs_key *key, uint64_t next_use)
{
    if (!s || !key)
        return KVS_EINVAL;
    kvs__lock(s);
    uint32_t i = do_find(&s->ix, key);
    if (i != KVS__NIL && s->pol->on_hint)
        s->pol->on_hint(s->pst, &s->ix, i, next_use);
    kvs__unlock(s);
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
    kvs__lock(s); /* create() reads the index (count, capacity) */
    if (pol->create(&s->ix, &st) != 0) {
        kvs__unlock(s);
        return KVS_ENOMEM;
    }
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
    kvs__unlock(s);
    return 0;
}

int kvs_store_set_capacity(kvs_store *s, uint64_t capacity_blocks)
{
    if (!s)
        return KVS_EINVAL;
    kvs__lock(s);
    s->ix.capacity = capacity_blocks;
    /* Evicts while count >= limit: capacity + 1, which must not wrap to 0. */
    int rc = capacity_blocks && capacity_blocks < UINT64_MAX
                 ? do_make_room(s, capacity_blocks + 1, KVS_EVICT_RESIZE)
                 : 0;
    kvs__unlock(s);
    return rc;
}

void kvs_store_get_stats(kvs_store *s, kvs_store_stats *out)
{
    kvs__lock(s);
    *out = s->st;
    out->blocks = s->ix.count;
    out->capacity_blocks = s->ix.capacity;
    out->policy = s->pol->name;
    kvs__unlock(s);
}

size_t kvs_store_meta_bytes_per_block(kvs_store *s)
{
    /* The entry plus this block's share of the hash table's slots (rounded up). */
    kvs__lock(s);
    uint64_t n = s->ix.count ? s->ix.count : 1;
    size_t b = sizeof(kvs__entry) + (size_t)((s->ix.nslot * sizeof(uint32_t) + n - 1) / n);
    kvs__unlock(s);
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
    kvs__lock(s);
    kvs__index *ix = &s->ix;
    int rc = 0;
    uint64_t live = 0;
    uint32_t *kids = calloc(ix->used_e ? ix->used_e : 1, sizeof *kids);
    uint32_t *memk = calloc(ix->used_e ? ix->used_e : 1, sizeof *memk);
    KVS_ASSERT(kids != NULL && memk != NULL);
    for (uint32_t i = 0; i < ix->used_e && !rc; i++) {
        kvs__entry *x = &ix->e[i];
        if (!(x->flags & KVS__F_LIVE))
            continue;
        live++;
        if (do_find(ix, &x->key) != i)
            rc = bad(err, errlen, "not reachable through the hash table", i);
        else if (x->parent != KVS__NIL && !(ix->e[x->parent].flags & KVS__F_LIVE))
            rc = bad(err, errlen, "orphan: parent not cached", i);
        else if (x->parent != KVS__NIL && x->depth != ix->e[x->parent].depth + 1)
            rc = bad(err, errlen, "depth != parent depth + 1", i);
        else if (x->parent == KVS__NIL && x->depth != 0)
            rc = bad(err, errlen, "root with depth != 0", i);
        else if (((x->flags & KVS__F_CAND) != 0) != want_cand(x))
            rc = bad(err, errlen, "candidate flag out of date", i);
        else if (x->flags & KVS__F_SKIP)
            rc = bad(err, errlen, "set aside outside an eviction", i);
        else if ((x->tier == KVS_TIER_DRAM) != (x->location != 0 && x->tier != KVS_TIER_SSD))
            rc = bad(err, errlen, "DRAM block without a payload (or the reverse)", i);
        if (x->parent != KVS__NIL) {
            kids[x->parent]++;
            if (x->tier != KVS_TIER_SSD)
                memk[x->parent]++;
        }
    }
    for (uint32_t i = 0; i < ix->used_e && !rc; i++)
        if ((ix->e[i].flags & KVS__F_LIVE) && kids[i] != ix->e[i].nchildren)
            rc = bad(err, errlen, "nchildren differs from the cached children", i);
        else if ((ix->e[i].flags & KVS__F_LIVE) && memk[i] != ix->e[i].memkids)
            rc = bad(err, errlen, "memkids differs from the children in memory", i);
    uint32_t parked = 0;
    for (uint32_t i = 0; i < ix->used_e; i++)
        parked += (ix->e[i].flags & (KVS__F_LIVE | KVS__F_PARKED)) == (KVS__F_LIVE | KVS__F_PARKED);
    if (!rc && parked != s->nparked)
        rc = bad(err, errlen, "parked entries differ from the parked list", 0);
    if (!rc && live != ix->count)
        rc = bad(err, errlen, "live entries != count", 0);
    if (!rc && ix->capacity && ix->count > ix->capacity)
        rc = bad(err, errlen, "count above capacity", 0);
    if (!rc)
        rc = kvs__payload_check(s, err, errlen);
    free(kids);
    free(memk);
    kvs__unlock(s);
    return rc;
}
