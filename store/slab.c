/*
 * slab.c — slab classes: which chunk size a block of a given size takes.
 *
 * The idea (memcached's slabs.c): chunk sizes grow geometrically from 64 bytes
 * by 1.25, rounded up to 64 bytes, up to the arena's page size; a block takes
 * the smallest class that fits, so rounding wastes under 25% (and blocks of one
 * namespace, which all have the same encoded size, share one class). Larger
 * blocks take whole pages (arena.c).
 *
 * Invariants: sizes strictly ascending, multiples of 64, the last equals the
 * page size, at most KVS__SLAB_MAXCLASS classes (1.25^60 > 2^19 * 64: far
 * beyond any page size used).
 */
#include "arena.h"

void kvs__slab_init(kvs__slab_classes *c, uint64_t page)
{
    uint64_t sz = KVS__SLAB_MIN;
    c->n = 0;
    while (sz < page && c->n < KVS__SLAB_MAXCLASS - 1) {
        c->size[c->n++] = sz;
        uint64_t next = (sz * 5 / 4 + 63) & ~(uint64_t)63;
        sz = next > sz ? next : sz + 64;
    }
    c->size[c->n++] = page;
}

int kvs__slab_class(const kvs__slab_classes *c, uint64_t size)
{
    if (size > c->size[c->n - 1])
        return -1;
    uint32_t lo = 0, hi = c->n - 1; /* smallest class >= size */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (c->size[mid] >= size)
            hi = mid;
        else
            lo = mid + 1;
    }
    return (int)lo;
}
