/*
 * arena.h — the DRAM arena behind the DRAM and pinned tiers (internal).
 *
 * The idea: capacity is fixed in bytes at open. The arena is one anonymous
 * mapping cut into equal pages P (MAP_NORESERVE: untouched pages cost
 * nothing). A slab serves one slab class (store/slab.c: chunk sizes 64 B *
 * 1.25^k, then 1.125^k above P/8, and whole pages, up to KVS__SLAB_PAGES
 * pages, so a block wastes under a fifth of its size to rounding, under a
 * ninth above P/8). A slab is one page for chunks up to P/8 (its tail wastes
 * under a chunk), else a run of m contiguous pages, m the smallest whose tail
 * past the last whole chunk is at most m*P/16 (m up to a sixteenth of the
 * arena), else at most m*P/8 (up to a quarter of it), else the m wasting the
 * least per page; m <= KVS__SLAB_RUN_MAX. A block larger than the largest
 * class takes a run of whole pages (wasting under a page, under an eighth of
 * it). A slab whose chunks are all free goes back to the pool, so classes do
 * not calcify when block sizes change. With capacity 0 the arena is unbounded
 * and chunks come from the heap (the same slab sizes are charged, so figures
 * compare).
 *
 * Invariants: used == sum of the charges of live chunks and runs, and the
 * charge is what kvs__arena_alloc takes from used (a chunk's class size, a
 * run's whole pages); every chunk is 64-byte aligned; a page is free, the head
 * of a run of pg.run pages (a large block, or a slab of one class with
 * pg.run == that class's slab pages, 0 <= nfree < nchunks, on that class's
 * partial list exactly when nfree > 0), or a tail page whose pg.head is its
 * run's head; no free page lies below lowfree.
 */
#ifndef KVS_ARENA_H
#define KVS_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs__arena kvs__arena;

/* Slab classes for a page size (slab.c). */
#define KVS__SLAB_MIN 64u
#define KVS__SLAB_MAXCLASS 96u
#define KVS__SLAB_PAGES    8u  /* the largest class, in pages */
#define KVS__SLAB_RUN_MAX  64u /* the most pages in one slab */
typedef struct kvs__slab_classes {
    uint32_t n;
    uint64_t size[KVS__SLAB_MAXCLASS]; /* ascending, multiples of 64, the last == 8 pages */
} kvs__slab_classes;
void kvs__slab_init(kvs__slab_classes *c, uint64_t page);
/* Class for size bytes, or -1 when it needs a run of whole pages. */
int kvs__slab_class(const kvs__slab_classes *c, uint64_t size);

/* shared: the mapping is a memfd (MAP_SHARED) another process may map, e.g.
 * the isolated UCX data plane (transfer/xproc.h); kvs__arena_fd gives it. */
int kvs__arena_open(uint64_t capacity, int shared, kvs__arena **out);
int kvs__arena_fd(const kvs__arena *a); /* -1 unless shared */
void kvs__arena_close(kvs__arena *a);
uint64_t kvs__arena_charge(const kvs__arena *a, uint64_t size);
int kvs__arena_alloc(kvs__arena *a, uint64_t size, void **ptr); /* KVS_ENOSPC, KVS_ENOMEM */
void kvs__arena_free(kvs__arena *a, void *ptr, uint64_t size);
/* The mapping (NULL, 0 when heap-backed), for cudaHostRegister. */
void *kvs__arena_region(const kvs__arena *a, size_t *len);
uint64_t kvs__arena_used(const kvs__arena *a);
/* Pages in all and free (0, 0 when heap-backed), for tests and stats. */
void kvs__arena_pages(const kvs__arena *a, uint32_t *npages, uint32_t *nfree);
/* Checks the invariants above, walking every page and partial list: 0 or
 * KVS_EINTERNAL (tests assert on it; not for hot paths). */
int kvs__arena_check(const kvs__arena *a);

#endif /* KVS_ARENA_H */
