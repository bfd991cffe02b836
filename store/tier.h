/*
 * tier.h — where block payloads live: one vtable, several tiers (DESIGN.md §5).
 *
 * The idea: a memory tier (DRAM, pinned host, later GPU) hands out chunks that
 * a block lives in and readers point into; a storage tier (SSD) keeps copies by
 * key and copies them back in. The store holds one memory tier and at most one
 * storage tier and never looks inside either; the fault tier wraps either kind
 * and fails every Nth operation, so tests can walk every failure point
 * (SQLite's do_faultsim_test).
 *
 * Invariants: a memory tier's chunks are 64-byte aligned and stay put until
 * freed; charge(size) is exactly what alloc(size) charges. A storage tier's get
 * either fills buf with the bytes put under that key or fails (KVS_EFORMAT for
 * a copy that is torn, truncated, foreign or fails its checksum: never
 * garbage); a failed put leaves no copy behind.
 *
 * Threading: the store calls a tier under its lock, except a storage tier's
 * get, which it calls outside the lock, concurrently with other gets and with
 * put/drop (the SSD tier keeps no mutable state; the fault tier counts
 * atomically). A get racing a put or drop of the same key may fail
 * (KVS_EFORMAT); it never returns bytes that fail the checksum.
 */
#ifndef KVS_TIER_H
#define KVS_TIER_H

#include "keys.h"
#include "store.h"

#include <stdint.h>

typedef struct kvs_tier kvs_tier;

typedef struct kvs_tier_methods {
    const char *name;
    kvs_tier_kind kind;
    /* Memory tiers (NULL for storage tiers). */
    uint64_t (*charge)(kvs_tier *t, uint64_t size);            /* bytes alloc(size) takes */
    int (*alloc)(kvs_tier *t, uint64_t size, void **ptr);      /* KVS_ENOSPC, KVS_ENOMEM */
    void (*free)(kvs_tier *t, void *ptr, uint64_t size);       /* size as given to alloc */
    /* Storage tiers (NULL for memory tiers). */
    int (*put)(kvs_tier *t, const kvs_key *key, const void *buf, uint64_t size); /* ENOSPC, EIO */
    int (*get)(kvs_tier *t, const kvs_key *key, void *buf, uint64_t size); /* EFORMAT, EIO */
    void (*drop)(kvs_tier *t, const kvs_key *key);
    void (*close)(kvs_tier *t);
    /* Memory tiers with a shared arena: its memfd and mapping (NULL: none). */
    int (*memory)(kvs_tier *t, int *fd, void **base, uint64_t *len);
} kvs_tier_methods;

struct kvs_tier {
    const kvs_tier_methods *m;
};

/* DRAM: a fixed arena of capacity bytes (slab classes per block size,
 * store/slab.c, store/arena.c); capacity 0 = chunks from the heap, no bound.
 * shared: the arena is a memfd another process may map (methods.memory). */
int kvs_tier_dram_open(uint64_t capacity, int shared, kvs_tier **out);

/* Faults every page of a DRAM tier's arena in now (MADV_POPULATE_WRITE),
 * without changing any byte, so no later alloc pays the kernel's first touch
 * (zeroing, and in a VM the host's allocation): 0; KVS_ENODEV when t is not a
 * DRAM tier with an arena (heap-backed, pinned, fault-wrapped) or the kernel
 * lacks MADV_POPULATE_WRITE; KVS_ENOMEM when the memory cannot be backed
 * (pages up to there stay populated). Safe beside allocs and writes. */
int kvs_tier_dram_prefault(kvs_tier *t);

/* Pinned host memory: the DRAM arena registered with cudaHostRegister, so GPU
 * copies from it are DMA. Only in builds with CUDA (KVS_CUDA_ENABLED); elsewhere,
 * and when registration fails (no GPU), KVS_ENODEV and nothing is opened. */
int kvs_tier_pinned_open(uint64_t capacity, int shared, kvs_tier **out);

/* SSD: one file per block, <64 hex digits of the key>.kvb in dir (an existing
 * writable directory, one store per directory), each with a header carrying
 * the key, the size and XXH3-64 checksums of header and payload. Copies are
 * a cache: not fsync'ed, not reloaded after a restart. */
int kvs_tier_ssd_open(const char *dir, kvs_tier **out);

/* Wraps inner (taking ownership) and fails every every-th alloc, put or get
 * with status (KVS_ENOSPC or KVS_EIO); free and drop always pass. */
int kvs_tier_fault_open(kvs_tier *inner, uint32_t every, int status, kvs_tier **out);

/* The file name the SSD tier uses for key: 68 characters and a NUL. */
void kvs_tier_ssd_name(const kvs_key *key, char name[69]);

#endif /* KVS_TIER_H */
