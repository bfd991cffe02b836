/*
 * slab.c — slab classes: which chunk size a block of a given size takes.
 *
 * The idea (memcached's slabs.c): chunk sizes grow geometrically from 64 bytes
 * by 1.25 up to an eighth of a page, then by 1.125 (large blocks are what
 * fills the memory, so they get finer classes), rounded up to 64 bytes, with
 * every whole number of pages a class too, up to KVS__SLAB_PAGES pages. A
 * block takes the smallest class that fits, so rounding wastes under a fifth
 * (under a ninth above P/8), and blocks of one namespace, which all have the
 * same encoded size, share one class. Classes above P/8 get slabs of several
 * pages (arena.c) so a slab's tail wastes little; larger blocks take whole
 * pages (arena.c).
 *
 * Invariants: sizes strictly ascending, multiples of 64, every multiple of the
 * page up to the last, the last equals KVS__SLAB_PAGES pages, at most
 * KVS__SLAB_MAXCLASS classes (4 MiB pages, the largest used, need 76).
 */
#include "arena.h"

void kvs__slab_init(kvs__slab_classes *c, uint64_t page)
{
    uint64_t sz = KVS__SLAB_MIN, last = page * KVS__SLAB_PAGES;
    c->n = 0;
    while (sz < last && c->n < KVS__SLAB_MAXCLASS - 1) {
        c->size[c->n++] = sz;
        uint64_t next = sz < page / 8 ? sz * 5 / 4 : sz * 9 / 8;
        uint64_t pages = (sz / page + 1) * page; /* the next whole pages */
        next = (next + 63) & ~(uint64_t)63;
        next = next < pages ? next : pages;
        sz = next > sz ? next : sz + 64;
    }
    c->size[c->n++] = last;
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
