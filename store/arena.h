/*
 * arena.h — the DRAM arena behind the DRAM and pinned tiers (internal).
 *
 * The idea: capacity is fixed in bytes at open. The arena is one anonymous
 * mapping cut into equal pages (MAP_NORESERVE: untouched pages cost nothing).
 * A page serves one slab class (store/slab.c: chunk sizes 64 B * 1.25^k, so a
 * block wastes under a fifth of its size to rounding) or belongs to a run of
 * pages holding one block larger than a page. A page whose chunks are all free
 * goes back to the pool, so classes do not calcify when block sizes change.
 * With capacity 0 the arena is unbounded and chunks come from the heap (the
 * same slab sizes are charged, so figures compare).
 *
 * Invariants: used == sum of the charges of live chunks; every chunk is
 * 64-byte aligned; a page is free, the head or tail of one large run, or
 * serves one class with 0 < nfree <= nchunks exactly when it is on that
 * class's partial list.
 */
#ifndef KVS_ARENA_H
#define KVS_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs__arena kvs__arena;

/* Slab classes for a page size (slab.c). */
#define KVS__SLAB_MIN 64u
#define KVS__SLAB_MAXCLASS 64u
typedef struct kvs__slab_classes {
    uint32_t n;
    uint64_t size[KVS__SLAB_MAXCLASS]; /* ascending, multiples of 64, the last == page */
} kvs__slab_classes;
void kvs__slab_init(kvs__slab_classes *c, uint64_t page);
/* Class for size bytes, or -1 when it needs a run of pages. */
int kvs__slab_class(const kvs__slab_classes *c, uint64_t size);

int kvs__arena_open(uint64_t capacity, kvs__arena **out);
void kvs__arena_close(kvs__arena *a);
uint64_t kvs__arena_charge(const kvs__arena *a, uint64_t size);
int kvs__arena_alloc(kvs__arena *a, uint64_t size, void **ptr); /* KVS_ENOSPC, KVS_ENOMEM */
void kvs__arena_free(kvs__arena *a, void *ptr, uint64_t size);
/* The mapping (NULL, 0 when heap-backed), for cudaHostRegister. */
void *kvs__arena_region(const kvs__arena *a, size_t *len);
uint64_t kvs__arena_used(const kvs__arena *a);

#endif /* KVS_ARENA_H */
