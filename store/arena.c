/*
 * arena.c — the DRAM arena: a fixed mapping cut into pages, pages into slab
 * chunks (arena.h has the idea and the invariants).
 *
 * Free chunks of a slab form a list through their first 4 bytes (chunk
 * indices); chunks past ncarved have never been handed out, so a fresh slab is
 * not written to until used. Free pages (one, or a run for a multi-page slab
 * or a large block) are found first-fit from the lowest page that may be free
 * (lowfree): reused pages are already faulted in and warm, and the scan is
 * O(pages) at worst, pages being few (at most 16 Ki for a 64 GiB arena).
 *
 * Why multi-page slabs: with one page per slab, a chunk just over half a page
 * left almost half of every page unused (a 2.1 MB block per 4 MiB page), and a
 * block just over 2 pages took 3. Classes above P/8 now take the fewest pages
 * m whose tail past the last whole chunk is <= m*P/16 (<= m*P/8 where the
 * arena is too small for such slabs), classes reach 8 pages, and only blocks
 * above that take plain page runs (waste < P <= size/8). A
 * chunk's slab is found from its pointer: its page's pg entry, or the head's
 * when the page is a tail (pg.head).
 */
#include "arena.h"

#include "kvs_error.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PG_FREE   (-1)
#define PG_RUN    (-2) /* first page of a large block; run = pages */
#define PG_TAIL   (-3) /* later page of a large block or a slab; head = first */
#define NIL       UINT32_MAX
#define HEAP_PAGE (4u << 20)

typedef struct pg {
    int32_t cls;
    uint32_t nfree, nchunks, ncarved, freehead;
    uint32_t prev, next; /* class partial list */
    uint32_t run;        /* head page of a large block or a slab: its pages */
    uint32_t head;       /* PG_TAIL: the run's first page */
} pg;

struct kvs__arena {
    uint8_t *base; /* NULL: heap-backed */
    uint64_t len, page;
    uint32_t npages, nfree_pages, lowfree; /* no free page below lowfree */
    pg *pg;
    kvs__slab_classes cls;
    uint32_t partial[KVS__SLAB_MAXCLASS];
    uint8_t spages[KVS__SLAB_MAXCLASS]; /* pages per slab of a class (<= KVS__SLAB_RUN_MAX) */
    uint64_t used;
    int fd; /* the memfd of a shared mapping; -1 */
};

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static const pg PG_FREE_ENTRY = {.cls = PG_FREE, .freehead = NIL, .prev = NIL, .next = NIL};

/* The fewest pages m in [lo, hi] whose slab of chunks of sz wastes at most
 * 1/div of itself past its last whole chunk; 0 if none. */
static uint32_t slab_fit(uint64_t P, uint64_t sz, uint32_t lo, uint32_t hi, uint32_t div)
{
    for (uint32_t m = lo; m <= hi; m++)
        if ((uint64_t)m * P % sz * div <= (uint64_t)m * P)
            return m;
    return 0;
}

/* Pages per slab of each class: one up to P/8 (the tail then wastes under a
 * chunk, <= P/8). Above, m >= ceil(size / P): the fewest pages whose tail is
 * <= m*P/16 where the arena has 16 slabs of them, else <= m*P/8 where it has
 * 4 (a slab much larger would strand pages at the arena's end and hold many
 * pages for a few chunks), else in a small arena the least waste per page. At
 * most KVS__SLAB_RUN_MAX pages. */
static void slab_pages(kvs__arena *a)
{
    uint64_t P = a->page;
    uint32_t lim16 = a->npages / 16 < KVS__SLAB_RUN_MAX ? a->npages / 16 : KVS__SLAB_RUN_MAX;
    uint32_t lim8 = a->npages / 4 < KVS__SLAB_RUN_MAX ? a->npages / 4 : KVS__SLAB_RUN_MAX;
    for (uint32_t c = 0; c < a->cls.n; c++) {
        uint64_t sz = a->cls.size[c];
        uint32_t mmin = (uint32_t)(round_up(sz, P) / P), best = mmin;
        if (sz > P / 8) {
            best = slab_fit(P, sz, mmin, lim16, 16);
            if (!best)
                best = slab_fit(P, sz, mmin, lim8, 8);
            if (!best) {
                uint64_t bw = UINT64_MAX, bm = 1; /* least waste / pages */
                best = mmin;
                for (uint32_t m = mmin; m <= (lim8 > mmin ? lim8 : mmin); m++) {
                    uint64_t w = (uint64_t)m * P % sz;
                    if (w * bm < bw * m) {
                        bw = w;
                        bm = m;
                        best = m;
                    }
                }
            }
        }
        a->spages[c] = (uint8_t)best;
    }
}

int kvs__arena_fd(const kvs__arena *a)
{
    return a->fd;
}

int kvs__arena_open(uint64_t capacity, int shared, kvs__arena **out)
{
    *out = NULL;
    kvs__arena *a = calloc(1, sizeof *a);
    if (!a)
        return KVS_ENOMEM;
    a->fd = -1;
    if (capacity == 0) {
        a->page = HEAP_PAGE;
        kvs__slab_init(&a->cls, a->page);
        *out = a;
        return 0;
    }
    /* About 32 pages or more, each a power of two in [4 KiB, 4 MiB]. */
    uint64_t page = 4096;
    while (page < (4u << 20) && page * 2 <= capacity / 32)
        page *= 2;
    if (capacity > (uint64_t)UINT32_MAX * page) {
        free(a);
        return KVS_EINVAL;
    }
    a->page = page;
    a->len = round_up(capacity, page);
    a->npages = (uint32_t)(a->len / page);
    a->pg = malloc((size_t)a->npages * sizeof *a->pg);
    void *m = MAP_FAILED;
    if (!shared) {
        m = mmap(NULL, a->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
    } else if ((a->fd = memfd_create("kvstash-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING)) >= 0 &&
               ftruncate(a->fd, (off_t)a->len) == 0) {
        /* A sparse file: pages are backed on first touch, as the private
         * mapping's are (MAP_NORESERVE). Sealing allowed: the isolated
         * data plane seals it against writes through any mapping but this
         * one before it hands it to its process (transfer/xproc.c). */
        m = mmap(NULL, a->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd, 0);
    }
    if (!a->pg || m == MAP_FAILED) {
        if (m != MAP_FAILED)
            munmap(m, a->len);
        if (a->fd >= 0)
            close(a->fd);
        free(a->pg);
        free(a);
        return KVS_ENOMEM;
    }
    a->base = m;
    madvise(m, a->len, MADV_HUGEPAGE); /* fewer faults and TLB misses; advice only */
    for (uint32_t i = 0; i < a->npages; i++)
        a->pg[i] = PG_FREE_ENTRY;
    a->nfree_pages = a->npages;
    kvs__slab_init(&a->cls, page);
    slab_pages(a);
    for (uint32_t c = 0; c < KVS__SLAB_MAXCLASS; c++)
        a->partial[c] = NIL;
    *out = a;
    return 0;
}

void kvs__arena_close(kvs__arena *a)
{
    if (!a)
        return;
    if (a->base)
        munmap(a->base, a->len);
    if (a->fd >= 0)
        close(a->fd);
    free(a->pg);
    free(a);
}

uint64_t kvs__arena_charge(const kvs__arena *a, uint64_t size)
{
    int c = kvs__slab_class(&a->cls, size ? size : 1);
    return c >= 0 ? a->cls.size[c] : round_up(size, a->base ? a->page : 4096);
}

void *kvs__arena_region(const kvs__arena *a, size_t *len)
{
    *len = a->base ? (size_t)a->len : 0;
    return a->base;
}

uint64_t kvs__arena_used(const kvs__arena *a)
{
    return a->used;
}

static void partial_push(kvs__arena *a, uint32_t c, uint32_t p)
{
    a->pg[p].prev = NIL;
    a->pg[p].next = a->partial[c];
    if (a->partial[c] != NIL)
        a->pg[a->partial[c]].prev = p;
    a->partial[c] = p;
}

static void partial_del(kvs__arena *a, uint32_t c, uint32_t p)
{
    pg *g = &a->pg[p];
    if (g->prev != NIL)
        a->pg[g->prev].next = g->next;
    else
        a->partial[c] = g->next;
    if (g->next != NIL)
        a->pg[g->next].prev = g->prev;
    g->prev = g->next = NIL;
}

/* Lowest run of k free pages; NIL if none. */
static uint32_t find_run(kvs__arena *a, uint32_t k)
{
    if (k > a->nfree_pages)
        return NIL;
    uint32_t len = 0;
    for (uint32_t p = a->lowfree; p < a->npages; p++) {
        if (a->pg[p].cls != PG_FREE) {
            len = 0;
            if (p == a->lowfree)
                a->lowfree = p + 1; /* nothing free below here */
            continue;
        }
        if (++len == k)
            return p + 1 - k;
    }
    return NIL;
}

static int heap_alloc(kvs__arena *a, uint64_t size, void **ptr)
{
    uint64_t ch = kvs__arena_charge(a, size);
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)ch) != 0)
        return KVS_ENOMEM;
    a->used += ch;
    *ptr = p;
    return 0;
}

/* Marks the k pages from p taken, p their head (cls set by the caller). */
static void take_run(kvs__arena *a, uint32_t p, uint32_t k)
{
    a->pg[p].run = k;
    for (uint32_t j = 1; j < k; j++)
        a->pg[p + j] = (pg){.cls = PG_TAIL, .freehead = NIL, .prev = NIL, .next = NIL, .head = p};
    a->nfree_pages -= k;
}

static void free_run(kvs__arena *a, uint32_t p, uint32_t k)
{
    for (uint32_t j = 0; j < k; j++)
        a->pg[p + j] = PG_FREE_ENTRY;
    a->nfree_pages += k;
    if (p < a->lowfree)
        a->lowfree = p;
}

int kvs__arena_alloc(kvs__arena *a, uint64_t size, void **ptr)
{
    *ptr = NULL;
    if (size == 0)
        return KVS_EINVAL;
    if (!a->base)
        return heap_alloc(a, size, ptr);
    int c = kvs__slab_class(&a->cls, size);
    if (c < 0) {
        uint64_t k64 = round_up(size, a->page) / a->page;
        if (k64 > a->npages)
            return KVS_ENOSPC;
        uint32_t k = (uint32_t)k64, p = find_run(a, k);
        if (p == NIL)
            return KVS_ENOSPC;
        a->pg[p].cls = PG_RUN;
        take_run(a, p, k);
        a->used += k64 * a->page;
        *ptr = a->base + (uint64_t)p * a->page;
        return 0;
    }
    uint32_t p = a->partial[c];
    if (p == NIL) {
        p = find_run(a, a->spages[c]);
        if (p == NIL)
            return KVS_ENOSPC;
        pg *g = &a->pg[p];
        g->cls = c;
        take_run(a, p, a->spages[c]);
        g->nchunks = (uint32_t)(a->spages[c] * a->page / a->cls.size[c]);
        g->nfree = g->nchunks;
        g->ncarved = 0;
        g->freehead = NIL;
        partial_push(a, (uint32_t)c, p);
    }
    pg *g = &a->pg[p];
    uint64_t csz = a->cls.size[c];
    uint8_t *pbase = a->base + (uint64_t)p * a->page;
    uint32_t idx;
    if (g->freehead != NIL) {
        idx = g->freehead;
        memcpy(&g->freehead, pbase + idx * csz, sizeof g->freehead);
    } else {
        idx = g->ncarved++;
    }
    if (--g->nfree == 0)
        partial_del(a, (uint32_t)c, p);
    a->used += csz;
    *ptr = pbase + idx * csz;
    return 0;
}

void kvs__arena_free(kvs__arena *a, void *ptr, uint64_t size)
{
    if (!ptr)
        return;
    if (!a->base) {
        a->used -= kvs__arena_charge(a, size);
        free(ptr);
        return;
    }
    uint64_t off = (uint64_t)((uint8_t *)ptr - a->base);
    uint32_t p = (uint32_t)(off / a->page);
    if (a->pg[p].cls == PG_TAIL)
        p = a->pg[p].head; /* a chunk of a multi-page slab */
    pg *g = &a->pg[p];
    if (g->cls == PG_RUN) {
        uint32_t k = g->run;
        free_run(a, p, k);
        a->used -= (uint64_t)k * a->page;
        return;
    }
    uint32_t c = (uint32_t)g->cls;
    uint64_t csz = a->cls.size[c];
    uint32_t idx = (uint32_t)((off - (uint64_t)p * a->page) / csz);
    memcpy(ptr, &g->freehead, sizeof g->freehead);
    g->freehead = idx;
    a->used -= csz;
    if (++g->nfree == 1)
        partial_push(a, c, p);
    if (g->nfree == g->nchunks) {
        partial_del(a, c, p);
        free_run(a, p, g->run);
    }
}

void kvs__arena_pages(const kvs__arena *a, uint32_t *npages, uint32_t *nfree)
{
    *npages = a->npages;
    *nfree = a->nfree_pages;
}

int kvs__arena_check(const kvs__arena *a)
{
    if (!a->base)
        return 0;
    uint64_t used = 0;
    uint32_t nfree = 0, onlist[KVS__SLAB_MAXCLASS] = {0}; /* slabs with a free chunk */
    for (uint32_t p = 0; p < a->npages;) {
        const pg *g = &a->pg[p];
        if (g->cls == PG_FREE) {
            if (p < a->lowfree)
                return KVS_EINTERNAL;
            nfree++;
            p++;
            continue;
        }
        if (g->cls == PG_TAIL || g->run == 0 || g->run > a->npages - p)
            return KVS_EINTERNAL;
        for (uint32_t j = 1; j < g->run; j++)
            if (a->pg[p + j].cls != PG_TAIL || a->pg[p + j].head != p)
                return KVS_EINTERNAL;
        if (g->cls == PG_RUN) {
            used += (uint64_t)g->run * a->page;
        } else {
            uint32_t c = (uint32_t)g->cls;
            if (c >= a->cls.n || g->run != a->spages[c] ||
                g->nchunks != a->spages[c] * a->page / a->cls.size[c] || g->nfree >= g->nchunks ||
                g->ncarved > g->nchunks) /* an empty slab is freed */
                return KVS_EINTERNAL;
            used += (uint64_t)(g->nchunks - g->nfree) * a->cls.size[c];
            onlist[c] += g->nfree > 0;
        }
        p += g->run;
    }
    if (used != a->used || nfree != a->nfree_pages)
        return KVS_EINTERNAL;
    for (uint32_t c = 0; c < a->cls.n; c++) {
        uint32_t n = 0;
        for (uint32_t p = a->partial[c]; p != NIL; p = a->pg[p].next) {
            if (a->pg[p].cls != (int32_t)c || ++n > onlist[c])
                return KVS_EINTERNAL;
        }
        if (n != onlist[c])
            return KVS_EINTERNAL;
    }
    return 0;
}
