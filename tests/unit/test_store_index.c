/*
 * test_store_index.c — the index and its eviction policies (store/store.h).
 *
 * Chain semantics (parent required, token comparison, EEXIST/EINVAL), forged
 * keys, delete of tails and subtrees, pins, exact victims for small cases,
 * evictions by reason, a randomised run per policy that checks after every few
 * operations that no block is orphaned and every invariant holds, policy
 * switches on a live store, and buffered lookups (the read side) driving every
 * policy exactly as immediate ones do.
 */
#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"
#include "store_test_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Block with one distinguishing token id. */
/* Keys of a chain of block ids. */
static void chain(const uint32_t *ids, size_t n, kvs_key *k, uint32_t *tok)
{
    for (size_t i = 0; i < n; i++)
        toks(ids[i], tok + i * BT);
    CU_ASSERT_EQUAL_FATAL(kvs_key_chain(&g_ns, (const uint8_t *)"x", 1, tok, n, k), 0);
}

/* Keys of n roots (one-block chains) of block ids first, first + 1, ...: k[i],
 * its token ids at tok + i * BT. */
static void roots(uint32_t first, size_t n, kvs_key *k, uint32_t *tok)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t id = first + (uint32_t)i;
        chain(&id, 1, &k[i], tok + i * BT);
    }
}

static void test_entry_size(void)
{
    kvs_store *s = store_test_open(0, NULL);
    uint32_t ids[1], tok[BT];
    kvs_key k;
    for (uint32_t i = 0; i < 10000; i++) {
        ids[0] = i;
        chain(ids, 1, &k, tok);
        CU_ASSERT_EQUAL_FATAL(kvs_store_insert(s, &k, NULL, 0, tok, BT, 0), 0);
        /* The table starts at 1024 buckets (4 KiB, a fixed cost); from there
         * on it grows with the blocks and keeps every block within 128 bytes. */
        size_t b = kvs_store_meta_bytes_per_block(s);
        if (i + 1 >= 1024 && b > 128) {
            CU_FAIL("more than 128 bytes of metadata per block");
            break;
        }
    }
    CU_ASSERT(kvs_store_meta_bytes_per_block(s) <= 128);
    CU_ASSERT(kvs_store_meta_bytes_per_block(s) >= 120);
    kvs_store_close(s);
}

static void test_chain_semantics(void)
{
    kvs_store *s = store_test_open(0, "lru");
    uint32_t ids[3] = {1, 2, 3}, tok[3 * BT];
    kvs_key k[3];
    chain(ids, 3, k, tok);
    /* The parent must be cached first. */
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, tok + BT, BT, 0), KVS_EPRECOND);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, tok + BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[2], &k[1], 0, tok + 2 * BT, BT, 0), 0);
    /* Same block again: EEXIST, nothing changes. */
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, tok + BT, BT, 0), KVS_EEXIST);
    size_t m = 99;
    CU_ASSERT_EQUAL(kvs_store_lookup(s, k, tok, BT, 3, &m), 0);
    CU_ASSERT_EQUAL(m, 3);
    /* A longer request matches the cached prefix only. */
    uint32_t ids4[4] = {1, 2, 3, 4}, tok4[4 * BT];
    kvs_key k4[4];
    chain(ids4, 4, k4, tok4);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, k4, tok4, BT, 4, &m), 0);
    CU_ASSERT_EQUAL(m, 3);
    /* Another prompt that diverges at block 1 matches block 0 only. */
    uint32_t idsb[3] = {1, 9, 3}, tokb[3 * BT];
    kvs_key kb[3];
    chain(idsb, 3, kb, tokb);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, kb, tokb, BT, 3, &m), 0);
    CU_ASSERT_EQUAL(m, 1);
    /* Lookup out of order (block 1 first) matches nothing: block 0 must be a root. */
    CU_ASSERT_EQUAL(kvs_store_lookup(s, k + 1, tok + BT, BT, 2, &m), 0);
    CU_ASSERT_EQUAL(m, 0);
    /* Delete: inner blocks refused, tails allowed, then the new tail. */
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[0], 0), KVS_EPRECOND);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[1], 0), KVS_EPRECOND);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[2], 0), 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[2], 0), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[1], 0), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, k, tok, BT, 3, &m), 0);
    CU_ASSERT_EQUAL(m, 1);
    store_test_assert_ok(s);
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    CU_ASSERT_EQUAL(st.blocks, 1);
    CU_ASSERT_EQUAL(st.inserts, 3);
    CU_ASSERT_EQUAL(st.evictions[KVS_EVICT_DELETE], 2);
    CU_ASSERT_EQUAL(st.lookups, 5);
    CU_ASSERT_EQUAL(st.hit_blocks, 3 + 3 + 1 + 0 + 1);
    kvs_store_close(s);
}

static void test_forged_key(void)
{
    uint32_t ids[2] = {1, 2}, tok[2 * BT], bad[BT];
    kvs_key k[2];
    chain(ids, 2, k, tok);
    toks(77, bad);
    /* verify_chain: a key that is not SHA-256(parent || tokens) is refused. */
    kvs_store *s = store_test_open(0, NULL);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, bad, BT, 0), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    kvs_store_close(s);
    /* Without verify_chain (roots are never verifiable in the store): a cached
     * key offered again with other tokens or another parent is refused, and a
     * lookup with the right key but other tokens does not match. */
    kvs_store_opts o = {.capacity_blocks = 0, .policy = "lru", .verify_chain = 0};
    CU_ASSERT_EQUAL_FATAL(kvs_store_open(&o, &s), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, bad, BT, 0), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, tok + BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, bad, BT, 0), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], NULL, 0, tok + BT, BT, 0), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, tok + BT, BT - 1, 0), KVS_EINVAL);
    uint32_t tok2[2 * BT];
    memcpy(tok2, tok, sizeof tok2);
    tok2[BT + 5] ^= 1; /* one token differs in block 1 */
    size_t m;
    CU_ASSERT_EQUAL(kvs_store_lookup(s, k, tok2, BT, 2, &m), 0);
    CU_ASSERT_EQUAL(m, 1);
    tok2[3] ^= 1; /* and in block 0 */
    CU_ASSERT_EQUAL(kvs_store_lookup(s, k, tok2, BT, 2, &m), 0);
    CU_ASSERT_EQUAL(m, 0);
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    CU_ASSERT_EQUAL(st.refused, 4);
    CU_ASSERT_EQUAL(st.blocks, 2);
    kvs_store_close(s);
}

static void test_subtree_and_pins(void)
{
    kvs_store *s = store_test_open(0, "prefix");
    /* 1 -> 2 -> 3 and 1 -> 4 */
    uint32_t a[3] = {1, 2, 3}, b[2] = {1, 4}, ta[3 * BT], tb[2 * BT];
    kvs_key ka[3], kb[2];
    chain(a, 3, ka, ta);
    chain(b, 2, kb, tb);
    size_t n;
    CU_ASSERT_EQUAL(kvs_store_insert_chain(s, ka, NULL, 0, ta, BT, 3, 0, &n), 0);
    CU_ASSERT_EQUAL(n, 3);
    CU_ASSERT_EQUAL(kvs_store_insert_chain(s, kb + 1, &kb[0], 0, tb + BT, BT, 1, 0, &n), 0);
    CU_ASSERT_EQUAL(n, 1);
    CU_ASSERT_EQUAL(kvs_store_pin(s, &ka[2]), 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &ka[2], 0), KVS_EPERM);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &ka[0], 1), KVS_EPERM); /* pinned descendant */
    CU_ASSERT_EQUAL(kvs_store_unpin(s, &ka[2]), 0);
    CU_ASSERT_EQUAL(kvs_store_unpin(s, &ka[2]), KVS_EPRECOND);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &ka[1], 1), 0); /* 2 and 3 go, 1 and 4 stay */
    CU_ASSERT_EQUAL(kvs_store_contains(s, &ka[2]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &ka[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &kb[1]), 1);
    store_test_assert_ok(s);
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    CU_ASSERT_EQUAL(st.evictions[KVS_EVICT_SUBTREE], 1);
    CU_ASSERT_EQUAL(st.evictions[KVS_EVICT_DELETE], 1);
    CU_ASSERT_EQUAL(st.blocks, 2);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &ka[0], 1), 0);
    kvs_store_get_stats(s, &st);
    CU_ASSERT_EQUAL(st.blocks, 0);
    kvs_store_close(s);
}

/* A parent pinned as often as the count allows (65535) is still protected
 * while its child is inserted: the insert's own protection of the parent must
 * not wrap its pin count to 0 and offer it as the victim that makes room. */
static void test_saturated_pins(void)
{
    kvs_store *s = store_test_open(1, "lru");
    uint32_t ids[2] = {1, 2}, tok[2 * BT];
    kvs_key k[2];
    chain(ids, 2, k, tok);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
    int rc = 0;
    for (uint32_t i = 0; i < UINT16_MAX && rc == 0; i++)
        rc = kvs_store_pin(s, &k[0]);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(kvs_store_pin(s, &k[0]), KVS_ENOSPC);
    /* Full, and the only block is the pinned parent: nothing can go. */
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], &k[0], 0, tok + BT, BT, 0), KVS_ENOSPC);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    kvs_store_info info;
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &k[0], &info), 0);
    CU_ASSERT_EQUAL(info.pins, UINT16_MAX);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

/* A store of capacity 3 under policy holding the roots k[0..2], inserted in
 * that order, then k[0] looked up (its match in *m): k[1] is now the least
 * recently used. */
static kvs_store *open_three_touch_first(const char *policy, const kvs_key *k, const uint32_t *tok,
                                         size_t *m)
{
    kvs_store *s = store_test_open(3, policy);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(kvs_store_insert(s, &k[i], NULL, 0, tok + i * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, &k[0], tok, BT, 1, m), 0);
    return s;
}

static void test_exact_victims(void)
{
    uint32_t tok[4 * BT];
    kvs_key k[4];
    roots(10, 4, k, tok);
    /* LRU: roots A B C, touch A, insert D -> B goes. */
    size_t m;
    kvs_store *s = open_three_touch_first("lru", k, tok, &m);
    CU_ASSERT_EQUAL(m, 1);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[3], NULL, 0, tok + 3 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[2]), 1);
    kvs_store_close(s);
    /* Belady: the block used farthest in the future goes. */
    s = store_test_open(2, "belady");
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], NULL, 0, tok + BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_hint(s, &k[0], 10), 0);
    CU_ASSERT_EQUAL(kvs_store_hint(s, &k[1], 5), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[2], NULL, 0, tok + 2 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 1);
    CU_ASSERT_EQUAL(kvs_store_hint(s, &k[0], 1), KVS_ENOTFOUND);
    kvs_store_close(s);
    /* Belady without hints: ties go to the least recently used (A was looked up). */
    s = open_three_touch_first("belady", k, tok, &m);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[3], NULL, 0, tok + 3 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 1);
    kvs_store_close(s);
    /* LFU: the block with more hits stays. */
    s = store_test_open(2, "lfu");
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], NULL, 0, tok + BT, BT, 0), 0);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(kvs_store_lookup(s, &k[0], tok, BT, 1, &m), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, &k[1], tok + BT, BT, 1, &m), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[2], NULL, 0, tok + 2 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 1);
    kvs_store_close(s);
}

static void test_full_of_chain(void)
{
    /* Capacity 2 holding the chain A -> B: C (child of B) cannot get room:
     * B is its parent and A is not a leaf. ENOSPC, nothing evicted. */
    uint32_t ids[3] = {1, 2, 3}, tok[3 * BT];
    kvs_key k[3];
    chain(ids, 3, k, tok);
    kvs_store *s = store_test_open(2, "leaflru");
    size_t n;
    CU_ASSERT_EQUAL(kvs_store_insert_chain(s, k, NULL, 0, tok, BT, 3, 0, &n), KVS_ENOSPC);
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 1);
    /* Pinned leaves are not victims either. */
    uint32_t o[1] = {9}, to[BT];
    kvs_key ko;
    chain(o, 1, &ko, to);
    CU_ASSERT_EQUAL(kvs_store_pin(s, &k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &ko, NULL, 0, to, BT, 0), KVS_ENOSPC);
    CU_ASSERT_EQUAL(kvs_store_unpin(s, &k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &ko, NULL, 0, to, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    /* Lowering the capacity evicts with reason RESIZE. */
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, 1), 0);
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    CU_ASSERT_EQUAL(st.blocks, 1);
    CU_ASSERT_EQUAL(st.evictions[KVS_EVICT_CAPACITY], 1);
    CU_ASSERT_EQUAL(st.evictions[KVS_EVICT_RESIZE], 1);
    store_test_assert_ok(s);
    /* The largest capacity is no bound at all: it evicts nothing. */
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, UINT64_MAX), 0);
    kvs_store_get_stats(s, &st);
    CU_ASSERT_EQUAL(st.blocks, 1);
    CU_ASSERT_EQUAL(st.evictions[KVS_EVICT_RESIZE], 1);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

/* Random tree of prompts: block j of a prompt has id parent_id * 8 + branch,
 * so prompts share prefixes; pins, deletes and lookups mixed in. */
static void random_run(kvs_store *s, uint64_t seed, int ops, const char *const *switch_to)
{
    uint64_t x = seed;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    enum { MAXN = 12, NPIN = 8 };
    kvs_key pinned[NPIN];
    int npinned = 0;
    for (int op = 0; op < ops; op++) {
        uint32_t ids[MAXN], tok[MAXN * BT];
        kvs_key k[MAXN];
        size_t n = 1 + RND() % MAXN, m = 0, ins = 0;
        ids[0] = (uint32_t)(RND() % 6);
        for (size_t i = 1; i < n; i++)
            ids[i] = ids[i - 1] * 8 + (uint32_t)(RND() % 3) + 1;
        chain(ids, n, k, tok);
        CU_ASSERT_EQUAL(kvs_store_lookup(s, k, tok, BT, n, &m), 0);
        int rc = m < n ? kvs_store_insert_chain(s, k + m, m ? &k[m - 1] : NULL, 0, tok + m * BT,
                                                BT, n - m, 0, &ins)
                       : 0;
        CU_ASSERT(rc == 0 || rc == KVS_ENOSPC);
        uint64_t r = RND() % 10;
        if (r == 0 && npinned < NPIN && kvs_store_pin(s, &k[0]) == 0) {
            pinned[npinned++] = k[0];
        } else if (r == 1 && npinned) {
            CU_ASSERT_EQUAL(kvs_store_unpin(s, &pinned[--npinned]), 0);
        } else if (r == 2) {
            rc = kvs_store_delete(s, &k[n - 1], (int)(RND() & 1));
            CU_ASSERT(rc == 0 || rc == KVS_ENOTFOUND || rc == KVS_EPRECOND || rc == KVS_EPERM);
        }
        for (int p = 0; p < npinned; p++) /* a pinned block is never evicted */
            CU_ASSERT_EQUAL(kvs_store_contains(s, &pinned[p]), 1);
        if (switch_to && op % 97 == 96) {
            const char *name = switch_to[(op / 97) % 6];
            CU_ASSERT_EQUAL(kvs_store_set_policy(s, name), 0);
            kvs_store_stats st;
            kvs_store_get_stats(s, &st);
            CU_ASSERT_STRING_EQUAL(st.policy, name);
        }
        if (op % 25 == 0)
            store_test_assert_ok(s);
    }
    while (npinned)
        CU_ASSERT_EQUAL(kvs_store_unpin(s, &pinned[--npinned]), 0);
    store_test_assert_ok(s);
#undef RND
}

static void test_random_no_orphans(void)
{
    for (const char *const *p = kvs_store_policy_names(); *p; p++) {
        kvs_store *s = store_test_open(60, *p);
        random_run(s, 0x9e3779b97f4a7c15ULL ^ (uint64_t)(p - kvs_store_policy_names()), 3000,
                   NULL);
        kvs_store_stats st;
        kvs_store_get_stats(s, &st);
        CU_ASSERT(st.evictions[KVS_EVICT_CAPACITY] > 100); /* the run did evict */
        CU_ASSERT(st.blocks <= 60);
        kvs_store_close(s);
    }
}

static void test_policy_switch(void)
{
    kvs_store *s = store_test_open(60, "lru");
    CU_ASSERT_EQUAL(kvs_store_set_policy(s, "nope"), KVS_EINVAL);
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    CU_ASSERT_STRING_EQUAL(st.policy, "lru");
    random_run(s, 42, 3000, kvs_store_policy_names());
    kvs_store_close(s);
    kvs_store_opts o = {.policy = "nope"};
    CU_ASSERT_EQUAL(kvs_store_open(&o, &s), KVS_EINVAL);
    CU_ASSERT_PTR_NULL(s);
}

/* Capacities too large to ever be reached are accepted by every policy:
 * s3fifo sizes its ghost table from the capacity (4 slots a block), and for
 * capacities of 2^61 blocks and more that size overflowed and its doubling
 * loop never ended, at open and at a switch to it. */
static void test_huge_capacity(void)
{
    static const uint64_t caps[] = {(uint64_t)1 << 61, ((uint64_t)1 << 62) - 1, UINT64_MAX};
    uint32_t tok[2 * BT];
    kvs_key k[2];
    roots(70, 2, k, tok);
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        kvs_store *s = store_test_open(caps[c], "s3fifo");
        CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
        CU_ASSERT_EQUAL(kvs_store_set_policy(s, "lru"), 0);
        CU_ASSERT_EQUAL(kvs_store_set_policy(s, "s3fifo"), 0);
        CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], NULL, 0, tok + BT, BT, 0), 0);
        kvs_store_stats st;
        kvs_store_get_stats(s, &st);
        CU_ASSERT_EQUAL(st.blocks, 2);
        store_test_assert_ok(s);
        kvs_store_close(s);
    }
}

static void test_switch_keeps_recency(void)
{
    /* Under lfu, switch to lru: the least recently used block goes next. */
    uint32_t tok[4 * BT];
    kvs_key k[4];
    roots(20, 4, k, tok);
    size_t m;
    kvs_store *s = open_three_touch_first("lfu", k, tok, &m);
    CU_ASSERT_EQUAL(kvs_store_set_policy(s, "lru"), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[3], NULL, 0, tok + 3 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 1);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

typedef struct worker {
    kvs_store *s;
    uint64_t seed;
    int bad;
} worker;

/* Each thread inserts, looks up, pins and deletes chains of a shared tree;
 * the store must stay consistent (one mutex today; this test is the one to
 * run under ThreadSanitizer once the index is sharded). */
static void *worker_main(void *arg)
{
    worker *w = arg;
    uint64_t x = w->seed;
    for (int op = 0; op < 4000; op++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t ids[8], tok[8 * BT];
        kvs_key k[8];
        size_t n = 1 + x % 8, m = 0, ins;
        ids[0] = (uint32_t)(x >> 8) % 5;
        for (size_t i = 1; i < n; i++)
            ids[i] = ids[i - 1] * 4 + (uint32_t)((x >> (10 + 2 * i)) % 3) + 1;
        for (size_t i = 0; i < n; i++)
            toks(ids[i], tok + i * BT);
        if (kvs_key_chain(&g_ns, (const uint8_t *)"x", 1, tok, n, k)) {
            w->bad++;
            continue;
        }
        if (kvs_store_lookup(w->s, k, tok, BT, n, &m))
            w->bad++;
        int rc = m < n ? kvs_store_insert_chain(w->s, k + m, m ? &k[m - 1] : NULL, 0,
                                                tok + m * BT, BT, n - m, 0, &ins)
                       : 0;
        /* Another thread may evict or delete the parent between our lookup and
         * insert: EPRECOND is a legal outcome then. */
        if (rc && rc != KVS_ENOSPC && rc != KVS_EPRECOND)
            w->bad++;
        if (x % 7 == 0 && kvs_store_pin(w->s, &k[0]) == 0 && kvs_store_unpin(w->s, &k[0]))
            w->bad++;
        if (x % 11 == 0) {
            rc = kvs_store_delete(w->s, &k[n - 1], (int)(x & 1));
            if (rc && rc != KVS_ENOTFOUND && rc != KVS_EPRECOND && rc != KVS_EPERM)
                w->bad++;
        }
        if (x % 13 == 0 && kvs_store_lookup_lease(w->s, k, tok, BT, n, 1, &m))
            w->bad++;
    }
    return NULL;
}

static void test_threads(void)
{
    kvs_store *s = store_test_open(100, "prefix");
    enum { NT = 4 };
    pthread_t th[NT];
    worker w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){.s = s, .seed = 0x1234567ULL * (uint64_t)(i + 1), .bad = 0};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT_EQUAL(w[i].bad, 0);
    }
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    CU_ASSERT(st.blocks <= 100);
    CU_ASSERT(st.evictions[KVS_EVICT_CAPACITY] > 0);
    CU_ASSERT(st.lookups >= NT * 4000);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static uint64_t g_now;
static uint64_t test_clock(void *arg)
{
    (void)arg;
    return g_now;
}

static void test_leases(void)
{
    uint32_t tok[5 * BT];
    kvs_key k[5];
    roots(40, 5, k, tok);
    g_now = 1000;
    kvs_store_opts o = {.capacity_blocks = 2, .policy = "lru", .clock_ms = test_clock};
    kvs_store *s;
    CU_ASSERT_EQUAL_FATAL(kvs_store_open(&o, &s), 0);
    size_t m;
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[0], NULL, 0, tok, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[1], NULL, 0, tok + BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup_lease(s, &k[0], tok, BT, 1, 100, &m), 0);
    CU_ASSERT_EQUAL(m, 1);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, &k[1], tok + BT, BT, 1, &m), 0);
    /* A is least recent but leased: B goes instead. */
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[2], NULL, 0, tok + 2 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[0], 0), KVS_EPERM);
    store_test_assert_ok(s);
    /* Everything leased: no room. */
    CU_ASSERT_EQUAL(kvs_store_lookup_lease(s, &k[2], tok + 2 * BT, BT, 1, 50, &m), 0);
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[3], NULL, 0, tok + 3 * BT, BT, 0), KVS_ENOSPC);
    store_test_assert_ok(s);
    /* C's lease (until 1050) ends first; A's (1100) still holds at 1060. */
    g_now = 1060;
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[3], NULL, 0, tok + 3 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[2]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 1);
    /* After 1100, A is an ordinary (least recent) block again. */
    g_now = 1101;
    CU_ASSERT_EQUAL(kvs_store_insert(s, &k[4], NULL, 0, tok + 4 * BT, BT, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &k[3]), 1);
    store_test_assert_ok(s);
    /* A later, shorter lease does not shorten an earlier one. */
    CU_ASSERT_EQUAL(kvs_store_lookup_lease(s, &k[3], tok + 3 * BT, BT, 1, 500, &m), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup_lease(s, &k[3], tok + 3 * BT, BT, 1, 10, &m), 0);
    g_now = 1200;
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[3], 0), KVS_EPERM);
    g_now = 1602;
    CU_ASSERT_EQUAL(kvs_store_delete(s, &k[3], 0), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup_lease(s, &k[4], tok + 4 * BT, BT, 1, 24u * 3600u * 1000u + 1, &m),
                    KVS_EINVAL);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

/* A clock that moves 10 ms at every reading: a 1 ms lease has ended by the
 * next time anything looks at it. */
static uint64_t step_clock(void *arg)
{
    uint64_t *t = arg;
    return *t += 10;
}

/* Plain lookups record their accesses in read buffers that are applied later
 * (before the next writer, or when a buffer fills); a lookup with a lease
 * applies them at once under the write lock. With leases that end at once,
 * the two must drive every policy identically: same matches, same inserts,
 * same cached set at every check, same counters, including through runs of
 * 500 lookups with no write between them (several buffer fills). */
static void test_buffered_equals_immediate(void)
{
    enum { NC = 32, D = 6 };
    static kvs_key k[NC][D];
    static uint32_t tok[NC][D * BT];
    for (uint32_t c = 0; c < NC; c++) {
        uint32_t ids[D];
        ids[0] = 1 + c % 4; /* eight chains share each root */
        for (uint32_t i = 1; i < D; i++)
            ids[i] = 100 * i + (i == 1 ? c % 8 : c); /* and some their second block */
        chain(ids, D, k[c], tok[c]);
    }
    for (const char *const *pol = kvs_store_policy_names(); *pol; pol++) {
        uint64_t ta = 0, tb = 0;
        kvs_store_opts oa = {.capacity_blocks = 40, .policy = *pol, .clock_ms = step_clock,
                             .clock_arg = &ta};
        kvs_store_opts ob = oa;
        ob.clock_arg = &tb;
        kvs_store *a, *b;
        CU_ASSERT_EQUAL_FATAL(kvs_store_open(&oa, &a), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_store_open(&ob, &b), 0);
        uint64_t x = 12345;
        unsigned diff = 0;
        for (int step = 0; step < 4000; step++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t c = (uint32_t)(x % NC);
            size_t n = 1 + (size_t)(x >> 32) % D, ma = 99, mb = 98;
            CU_ASSERT_EQUAL(kvs_store_lookup(a, k[c], tok[c], BT, n, &ma), 0);
            CU_ASSERT_EQUAL(kvs_store_lookup_lease(b, k[c], tok[c], BT, n, 1, &mb), 0);
            diff += ma != mb;
            if ((step / 500) % 2 == 0 && ma < n && ma == mb) {
                size_t ia = 0, ib = 0;
                int ra = kvs_store_insert_chain(a, k[c] + ma, ma ? &k[c][ma - 1] : NULL, 0,
                                                tok[c] + ma * BT, BT, n - ma, 0, &ia);
                int rb = kvs_store_insert_chain(b, k[c] + mb, mb ? &k[c][mb - 1] : NULL, 0,
                                                tok[c] + mb * BT, BT, n - mb, 0, &ib);
                diff += ra != rb || ia != ib;
            }
            if (step % 250 == 249)
                for (uint32_t cc = 0; cc < NC; cc++)
                    for (uint32_t i = 0; i < D; i++)
                        diff += kvs_store_contains(a, &k[cc][i]) != kvs_store_contains(b, &k[cc][i]);
        }
        if (diff)
            fprintf(stderr, "policy %s: %u differences\n", *pol, diff);
        CU_ASSERT_EQUAL(diff, 0);
        kvs_store_stats sa, sb;
        kvs_store_get_stats(a, &sa);
        kvs_store_get_stats(b, &sb);
        CU_ASSERT_EQUAL(sa.lookups, 4000);
        CU_ASSERT_EQUAL(sa.lookups, sb.lookups);
        CU_ASSERT_EQUAL(sa.lookup_blocks, sb.lookup_blocks);
        CU_ASSERT_EQUAL(sa.hit_blocks, sb.hit_blocks);
        CU_ASSERT_EQUAL(sa.evictions[KVS_EVICT_CAPACITY], sb.evictions[KVS_EVICT_CAPACITY]);
        CU_ASSERT(sa.evictions[KVS_EVICT_CAPACITY] > 100);
        CU_ASSERT(sa.hit_blocks > 1000);
        store_test_assert_ok(a);
        store_test_assert_ok(b);
        kvs_store_close(a);
        kvs_store_close(b);
    }
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"entry_size", test_entry_size},
        {"chain_semantics", test_chain_semantics},
        {"forged_key", test_forged_key},
        {"subtree_and_pins", test_subtree_and_pins},
        {"saturated_pins", test_saturated_pins},
        {"exact_victims", test_exact_victims},
        {"full_of_chain", test_full_of_chain},
        {"random_no_orphans", test_random_no_orphans},
        {"policy_switch", test_policy_switch},
        {"huge_capacity", test_huge_capacity},
        {"switch_keeps_recency", test_switch_keeps_recency},
        {"leases", test_leases},
        {"threads", test_threads},
        {"buffered_equals_immediate", test_buffered_equals_immediate},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_index", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
