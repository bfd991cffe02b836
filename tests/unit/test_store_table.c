/*
 * test_store_table.c — the index's hash table and token slots (store/index.c):
 * open addressing with tags and tombstones, rebuilds as it grows, shrinks and
 * collects tombstones, the entry-index bits widening as the entry array
 * grows, and token ids of several lengths (the primary length's slots fixed by
 * entry index, the others pooled or malloc'd).
 *
 * And the read lock with more lookup threads than read stripes, beside writers.
 *
 * Keys here are made by hand (verify_chain off) so that the table's corner
 * cases are reached on purpose: keys with equal first 8 bytes share a home
 * slot and a tag, and only the full key compare tells them apart. Every
 * test checks kvs_store_check (each live entry reachable from its home slot)
 * and that exactly the blocks the store counts are found.
 */
#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"
#include "store_test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A pseudo-random key from id (splitmix64 over its four words). */
static kvs_key rkey(uint64_t id)
{
    kvs_key k;
    for (int w = 0; w < 4; w++) {
        uint64_t z = id * 4 + (uint64_t)w + 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        memcpy(k.b + 8 * w, &z, 8);
    }
    return k;
}

static void rtok(uint64_t id, uint32_t n, uint32_t *t)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (uint32_t)(id * 2654435761u) + i;
}

static kvs_store *open_plain(uint64_t cap)
{
    kvs_store_opts o = {.capacity_blocks = cap, .policy = "lru", .verify_chain = 0};
    kvs_store *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_store_open(&o, &s), 0);
    return s;
}

/* 1 when root block id (n tokens) is found by a lookup, 0 when not. */
static size_t has(kvs_store *s, uint64_t id, uint32_t n)
{
    uint32_t t[600];
    kvs_key k = rkey(id);
    size_t m = 9;
    rtok(id, n, t);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, &k, t, n, 1, &m), 0);
    return m;
}

static int put(kvs_store *s, uint64_t id, uint32_t n)
{
    uint32_t t[600];
    kvs_key k = rkey(id);
    rtok(id, n, t);
    return kvs_store_insert(s, &k, NULL, 0, t, n, 0);
}

/* Unbounded growth: the table rebuilds many times and the entry index widens
 * from 10 to 17 bits; every block stays found, absent ones are not, and the
 * metadata bound holds. */
static void test_growth(void)
{
    kvs_store *s = open_plain(0);
    const uint64_t N = 100000;
    for (uint64_t i = 0; i < N; i++) {
        CU_ASSERT_EQUAL_FATAL(put(s, i, BT), 0);
        if (i + 1 >= 1024 && kvs_store_meta_bytes_per_block(s) > 128) {
            CU_FAIL("more than 128 bytes of metadata per block");
            break;
        }
    }
    store_test_assert_ok(s);
    size_t found = 0, absent = 0;
    for (uint64_t i = 0; i < N; i++)
        found += has(s, i, BT);
    for (uint64_t i = N; i < N + 20000; i++)
        absent += has(s, i, BT);
    CU_ASSERT_EQUAL(found, N);
    CU_ASSERT_EQUAL(absent, 0);
    CU_ASSERT_EQUAL(put(s, 7, BT), KVS_EEXIST);
    kvs_store_close(s);
}

/* A full store evicting at every insert: removals leave tombstones, inserts
 * reuse them, rebuilds at the same size clear them. Exactly the counted
 * blocks are found, at every stage. */
static void test_churn(void)
{
    const uint64_t cap = 3000, N = 60000;
    kvs_store *s = open_plain(cap);
    for (uint64_t i = 0; i < N; i++) {
        CU_ASSERT_EQUAL_FATAL(put(s, i, BT), 0);
        if ((i + 1) % 15000 == 0) {
            store_test_assert_ok(s);
            kvs_store_stats st;
            kvs_store_get_stats(s, &st);
            CU_ASSERT_EQUAL(st.blocks, cap);
            size_t found = 0;
            for (uint64_t j = 0; j <= i; j++)
                found += has(s, j, BT);
            CU_ASSERT_EQUAL(found, cap);
            /* lru with no lookups in between: the newest cap blocks. */
            for (uint64_t j = i + 1 - cap; j <= i; j += 97)
                CU_ASSERT_EQUAL(has(s, j, BT), 1);
        }
    }
    CU_ASSERT(kvs_store_meta_bytes_per_block(s) <= 128);
    kvs_store_close(s);
}

/* Deletes in every order: every other block, then the rest from the top, with
 * lookups and re-inserts in between; the table shrinks back at its next
 * rebuild (inserts after the deletes). */
static void test_deletes(void)
{
    const uint64_t N = 6000;
    kvs_store *s = open_plain(0);
    for (uint64_t i = 0; i < N; i++)
        CU_ASSERT_EQUAL_FATAL(put(s, i, BT), 0);
    for (uint64_t i = 0; i < N; i += 2) {
        kvs_key k = rkey(i);
        CU_ASSERT_EQUAL(kvs_store_delete(s, &k, 0), 0);
    }
    store_test_assert_ok(s);
    for (uint64_t i = 0; i < N; i++)
        CU_ASSERT_EQUAL(has(s, i, BT), i % 2);
    kvs_key k0 = rkey(0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k0, 0), KVS_ENOTFOUND);
    for (uint64_t i = 0; i < N; i += 2)
        CU_ASSERT_EQUAL(put(s, i, BT), 0);
    store_test_assert_ok(s);
    for (uint64_t i = N; i-- > 0;) {
        kvs_key k = rkey(i);
        CU_ASSERT_EQUAL(kvs_store_delete(s, &k, 0), 0);
    }
    store_test_assert_ok(s);
    size_t found = 0;
    for (uint64_t i = 0; i < N; i++)
        found += has(s, i, BT);
    CU_ASSERT_EQUAL(found, 0);
    /* Refill past the old size: tombstones and the rebuild after them. */
    for (uint64_t i = 0; i < 2 * N; i++)
        CU_ASSERT_EQUAL(put(s, i + N, BT), 0);
    store_test_assert_ok(s);
    found = 0;
    for (uint64_t i = 0; i < 2 * N; i++)
        found += has(s, i + N, BT);
    CU_ASSERT_EQUAL(found, 2 * N);
    CU_ASSERT(kvs_store_meta_bytes_per_block(s) <= 128);
    kvs_store_close(s);
}

/* Keys equal in their first 8 bytes have the same home slot and tag: the full
 * 32-byte compare separates them, and removing one leaves the others found. */
static void test_same_home(void)
{
    kvs_store *s = open_plain(0);
    enum { M = 40 };
    kvs_key k[M];
    uint32_t t[BT];
    for (int i = 0; i < M; i++) {
        k[i] = rkey(1000);
        k[i].b[8 + i % 24] ^= (uint8_t)(1 + i / 24);
        rtok((uint64_t)i, BT, t);
        CU_ASSERT_EQUAL_FATAL(kvs_store_insert(s, &k[i], NULL, 0, t, BT, 0), 0);
    }
    kvs_key other = rkey(1000); /* same first 8 bytes, in none of them */
    CU_ASSERT_EQUAL(kvs_store_contains(s, &other), 0);
    for (int i = 0; i < M; i += 3)
        CU_ASSERT_EQUAL(kvs_store_delete(s, &k[i], 0), 0);
    store_test_assert_ok(s);
    for (int i = 0; i < M; i++) {
        size_t m = 9;
        rtok((uint64_t)i, BT, t);
        CU_ASSERT_EQUAL(kvs_store_lookup(s, &k[i], t, BT, 1, &m), 0);
        CU_ASSERT_EQUAL(m, i % 3 ? 1u : 0u);
        /* Right key, another block's tokens: refused. */
        rtok((uint64_t)i + 1, BT, t);
        CU_ASSERT_EQUAL(kvs_store_lookup(s, &k[i], t, BT, 1, &m), 0);
        CU_ASSERT_EQUAL(m, 0);
    }
    for (int i = 0; i < M; i += 3) {
        rtok((uint64_t)i, BT, t);
        CU_ASSERT_EQUAL(kvs_store_insert(s, &k[i], NULL, 0, t, BT, 0), 0);
    }
    for (int i = 0; i < M; i++)
        CU_ASSERT_EQUAL(kvs_store_contains(s, &k[i]), 1);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

/* Token ids of several lengths in one store: the first length of at most 64
 * ids becomes the primary one (slots by entry index), others are pooled
 * (<= 4096 ids) or malloc'd. Each block keeps its own ids through evictions
 * and slot reuse; a lookup with one id changed does not match. */
static void test_token_lengths(void)
{
    static const uint32_t len[] = {300, 16, 8, 64, 5000, 1, 16, 300};
    const uint32_t NL = sizeof len / sizeof len[0];
    for (int cap = 0; cap <= 1; cap++) {
        kvs_store *s = open_plain(cap ? 500 : 0);
        const uint64_t N = 4000;
        for (uint64_t i = 0; i < N; i++) {
            uint32_t n = len[i % NL];
            uint32_t *t = malloc(n * sizeof *t);
            CU_ASSERT_PTR_NOT_NULL_FATAL(t);
            rtok(i, n, t);
            kvs_key k = rkey(i);
            CU_ASSERT_EQUAL_FATAL(kvs_store_insert(s, &k, NULL, 0, t, n, 0), 0);
            free(t);
        }
        store_test_assert_ok(s);
        size_t found = 0;
        for (uint64_t i = 0; i < N; i++) {
            uint32_t n = len[i % NL];
            uint32_t *t = malloc(n * sizeof *t);
            CU_ASSERT_PTR_NOT_NULL_FATAL(t);
            rtok(i, n, t);
            kvs_key k = rkey(i);
            size_t m = 9, m2 = 9;
            CU_ASSERT_EQUAL(kvs_store_lookup(s, &k, t, n, 1, &m), 0);
            found += m;
            t[n - 1] ^= 1;
            CU_ASSERT_EQUAL(kvs_store_lookup(s, &k, t, n, 1, &m2), 0);
            CU_ASSERT_EQUAL(m2, 0);
            /* The same ids as another length: not this block. */
            if (n > 1) {
                t[n - 1] ^= 1;
                CU_ASSERT_EQUAL(kvs_store_lookup(s, &k, t, n - 1, 1, &m2), 0);
                CU_ASSERT_EQUAL(m2, 0);
            }
            free(t);
        }
        CU_ASSERT_EQUAL(found, cap ? 500u : N);
        kvs_store_close(s);
    }
}

/* More lookup threads than read stripes (16), so some share one, beside
 * writers inserting and deleting: lookups of the blocks nobody deletes always
 * hit, and the store's counters equal the lookups made. */
#define SH_READERS 20
#define SH_KEEP 2000u   /* ids 0..SH_KEEP-1: never deleted */
#define SH_LOOKUPS 3000 /* per reader */
static kvs_store *g_sh;
static atomic_int g_sh_bad, g_sh_stop;

static void *sh_reader(void *arg)
{
    uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(uintptr_t)arg + 1;
    for (int i = 0; i < SH_LOOKUPS; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (has(g_sh, x % SH_KEEP, BT) != 1)
            atomic_fetch_add(&g_sh_bad, 1);
    }
    return NULL;
}

static void *sh_writer(void *arg)
{
    uint64_t base = 1000000u * (1 + (uint64_t)(uintptr_t)arg);
    for (uint64_t r = 0; !atomic_load(&g_sh_stop); r++) {
        for (uint64_t i = 0; i < 50; i++)
            if (put(g_sh, base + r * 50 + i, BT) != 0)
                atomic_fetch_add(&g_sh_bad, 1);
        for (uint64_t i = 0; i < 50; i++) {
            kvs_key k = rkey(base + r * 50 + i);
            if (kvs_store_delete(g_sh, &k, 0) != 0)
                atomic_fetch_add(&g_sh_bad, 1);
        }
    }
    return NULL;
}

static void test_shared_stripes(void)
{
    g_sh = open_plain(0);
    for (uint64_t i = 0; i < SH_KEEP; i++)
        CU_ASSERT_EQUAL_FATAL(put(g_sh, i, BT), 0);
    atomic_store(&g_sh_bad, 0);
    atomic_store(&g_sh_stop, 0);
    pthread_t r[SH_READERS], w[2];
    for (int t = 0; t < 2; t++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&w[t], NULL, sh_writer, (void *)(uintptr_t)t), 0);
    for (int t = 0; t < SH_READERS; t++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&r[t], NULL, sh_reader, (void *)(uintptr_t)t), 0);
    for (int t = 0; t < SH_READERS; t++)
        pthread_join(r[t], NULL);
    atomic_store(&g_sh_stop, 1);
    for (int t = 0; t < 2; t++)
        pthread_join(w[t], NULL);
    CU_ASSERT_EQUAL(atomic_load(&g_sh_bad), 0);
    kvs_store_stats st;
    kvs_store_get_stats(g_sh, &st);
    CU_ASSERT_EQUAL(st.lookups, (uint64_t)SH_READERS * SH_LOOKUPS);
    CU_ASSERT_EQUAL(st.hit_blocks, (uint64_t)SH_READERS * SH_LOOKUPS);
    CU_ASSERT_EQUAL(st.blocks, SH_KEEP);
    store_test_assert_ok(g_sh);
    kvs_store_close(g_sh);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"growth", test_growth},
        {"churn", test_churn},
        {"deletes", test_deletes},
        {"same_home", test_same_home},
        {"token_lengths", test_token_lengths},
        {"shared_stripes", test_shared_stripes},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_table", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
