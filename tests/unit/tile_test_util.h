/*
 * tile_test_util.h — what the tile and block unit tests (test_kvq_tile,
 * test_kv_block) both derive from first principles rather than from the code
 * under test: a tile's payload layout written out from docs/FORMAT.md,
 * little-endian fields at documented offsets, float bit patterns, byte
 * checks, and a seeded splitmix64 source with roughly normal values.
 * Header-only (static inline): each test binary gets its own copy.
 *
 * TILE_TEST_SEED (the generator's start) must be defined before including:
 * each test keeps its own sequence.
 */
#ifndef KVS_TILE_TEST_UTIL_H
#define KVS_TILE_TEST_UTIL_H

#include "kv_format.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef TILE_TEST_SEED
#error "define TILE_TEST_SEED before including tile_test_util.h"
#endif

#define MAX_REPORT 6    /* mismatches printed per check */
#define SENTINEL   0xA5 /* fill beyond what a call may write */

/* ---- random values ---------------------------------------------------------------- */

static uint64_t g_rng = TILE_TEST_SEED;
static inline uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double unif(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}
static inline float gauss(void)
{
    double s = 0;
    for (int i = 0; i < 6; i++)
        s += unif();
    return (float)((s - 3.0) * 1.41);
}

/* ---- bytes -------------------------------------------------------------------------- */

static inline uint16_t rd16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline void wr16(unsigned char *p, uint16_t v)
{
    memcpy(p, &v, 2);
}
static inline void wr32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static inline void wr64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}
static inline uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline size_t align16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}
static inline int all_bytes(const void *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)p)[i] != v)
            return 0;
    return 1;
}

/* ---- tile layout ---------------------------------------------------------------------- */

/* Payload layout written out from docs/FORMAT.md (not kvs_tile_layout_of):
 * fp16 scales, outlier entries of w = 3 bytes (uint8 index) when the group's
 * span (T for K, D for V) is <= 256, else 4 (uint16 index), then fp16 value.
 * Offsets from the payload's start; payload is its size (the tile's is 32 more). */
typedef struct lay {
    size_t scales, outliers, sinks, payload, groups, w;
} lay;
static inline lay layout(kvs_scheme s, kvs_tile_kind kind, size_t T, size_t D, size_t k, size_t S)
{
    lay l;
    l.groups = kind == KVS_TILE_K ? D : T;
    l.w = (kind == KVS_TILE_K ? T : D) <= 256 ? 3 : 4;
    if (s == KVS_SCHEME_FP16) {
        l.scales = l.outliers = l.sinks = l.payload = align16(2 * T * D);
        return l;
    }
    l.scales = align16(T * D);
    l.outliers = align16(l.scales + 2 * l.groups);
    l.sinks = align16(l.outliers + l.w * l.groups * k);
    l.payload = align16(l.sinks + 2 * S * D);
    return l;
}

#endif /* KVS_TILE_TEST_UTIL_H */
