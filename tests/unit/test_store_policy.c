/*
 * test_store_policy.c — behaviour of the "prefix" eviction policy
 * (store/policy_prefix.c, docs/EVICTION.md section 3).
 *
 * Each case drives the real store with chains and checks what is still cached,
 * and runs the same sequence under "lru" to show that the case separates the
 * two (so the prefix assertions cannot pass by accident):
 *   - a scan of one-off chains (5 x the capacity) does not evict a prefix that
 *     was hit before (LRU loses it);
 *   - a chain seen once, evicted, and put again is recognised by the history
 *     and then survives the next scan (LRU loses it);
 *   - when the proven segment holds stale blocks and fresh chains start being
 *     reused soon after their first use, the first-sight segment grows (ARC's
 *     ghost feedback) and the policy gets LRU's hits back;
 *   - after T1 evidence that arrived while T1's target was already the whole
 *     cache, one returning chain's run of T2 ghost hits does not take T1's
 *     room away (ARC's clamped p loses that evidence; the case fails with it);
 *   - on a frequency-driven generated trace (shared system prompts) prefix
 *     does at least as well as LRU, and every replay keeps the index invariants.
 */
#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"
#include "store_test_util.h"
#include "trace.h"

#include <stdlib.h>
#include <string.h>

/* A request for the chain of blocks first..first+n-1 (ids name blocks; the
 * chain's keys follow from its tokens): look the chain up, insert what is
 * missing, return the matched prefix length. */
static size_t request(kvs_store *s, uint32_t first, size_t n)
{
    uint32_t *tok = malloc(n * BT * sizeof *tok);
    kvs_key *k = malloc(n * sizeof *k);
    CU_ASSERT_FATAL(tok && k);
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < BT; j++)
            tok[i * BT + (size_t)j] = (first + (uint32_t)i) * 7u + (uint32_t)j;
    CU_ASSERT_EQUAL_FATAL(kvs_key_chain(&g_ns, (const uint8_t *)"p", 1, tok, n, k), 0);
    size_t hit = 0, ins = 0;
    CU_ASSERT_EQUAL(kvs_store_lookup(s, k, tok, BT, n, &hit), 0);
    if (hit < n) {
        int rc = kvs_store_insert_chain(s, k + hit, hit ? &k[hit - 1] : NULL, 0, tok + hit * BT, BT,
                                        n - hit, 0, &ins);
        CU_ASSERT(rc == 0 || rc == KVS_ENOSPC);
    }
    free(tok);
    free(k);
    return hit;
}

/* Matched length of a chain without touching it (contains, block by block). */
static size_t cached_prefix(kvs_store *s, uint32_t first, size_t n)
{
    uint32_t tok[64 * BT];
    kvs_key k[64];
    CU_ASSERT_FATAL(n <= 64);
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < BT; j++)
            tok[i * BT + (size_t)j] = (first + (uint32_t)i) * 7u + (uint32_t)j;
    CU_ASSERT_EQUAL_FATAL(kvs_key_chain(&g_ns, (const uint8_t *)"p", 1, tok, n, k), 0);
    size_t m = 0;
    while (m < n && kvs_store_contains(s, &k[m]) == 1)
        m++;
    return m;
}

/* Hot prefix (20 blocks, used twice), then 50 one-off chains of 10 blocks. */
static size_t scan_after_hot(const char *policy)
{
    kvs_store *s = store_test_open(100, policy);
    CU_ASSERT_EQUAL(request(s, 1, 20), 0);
    CU_ASSERT_EQUAL(request(s, 1, 20), 20);
    for (uint32_t c = 0; c < 50; c++)
        CU_ASSERT_EQUAL(request(s, 1000 + c * 10, 10), 0);
    size_t m = cached_prefix(s, 1, 20);
    store_test_assert_ok(s);
    kvs_store_close(s);
    return m;
}

static void test_scan_keeps_hot_prefix(void)
{
    CU_ASSERT_EQUAL(scan_after_hot("prefix"), 20);
    CU_ASSERT_EQUAL(scan_after_hot("lru"), 0);
}

/* Chain A seen once, pushed out by a scan, put again (a miss: the history
 * recognises it), then a second scan. */
static size_t returning_chain(const char *policy)
{
    kvs_store *s = store_test_open(100, policy);
    CU_ASSERT_EQUAL(request(s, 1, 15), 0);
    for (uint32_t c = 0; c < 30; c++)
        request(s, 1000 + c * 10, 10);
    CU_ASSERT_EQUAL(cached_prefix(s, 1, 15), 0);
    CU_ASSERT_EQUAL(request(s, 1, 15), 0);
    for (uint32_t c = 0; c < 30; c++)
        request(s, 5000 + c * 10, 10);
    size_t m = cached_prefix(s, 1, 15);
    store_test_assert_ok(s);
    kvs_store_close(s);
    return m;
}

static void test_returning_chain_is_proven(void)
{
    CU_ASSERT_EQUAL(returning_chain("prefix"), 15);
    CU_ASSERT_EQUAL(returning_chain("lru"), 0);
}

/* Phase 1: a 90-block chain used three times fills the proven segment.
 * Phase 2: fresh 20-block chains, each asked twice, the second time right
 * after the next chain's first request (reuse distance 40 blocks). With the
 * first-sight segment fixed at what phase 1 leaves (10 blocks) no chain would
 * survive to its second request; LRU keeps them all. Returns the blocks hit
 * in the second half of phase 2. */
static size_t shift_to_soon_reuse(const char *policy)
{
    kvs_store *s = store_test_open(100, policy);
    for (int i = 0; i < 3; i++)
        request(s, 1, 90);
    size_t hits = 0;
    const uint32_t n = 200;
    for (uint32_t c = 0; c < n; c++) {
        request(s, 10000 + c * 20, 20);
        if (c > 0) {
            size_t h = request(s, 10000 + (c - 1) * 20, 20);
            if (c >= n / 2)
                hits += h;
        }
    }
    store_test_assert_ok(s);
    kvs_store_close(s);
    return hits;
}

static void test_adapts_to_soon_reuse(void)
{
    size_t lru = shift_to_soon_reuse("lru"), px = shift_to_soon_reuse("prefix");
    CU_ASSERT_EQUAL(lru, 100 * 20); /* every second request hits in full */
    CU_ASSERT(px >= lru * 9 / 10);
}

/* Phase 1: 20-block chains, each asked again 6 chains later (120 blocks: past
 * the cache, within the ghost window), so every second request is a run of
 * first-sight ghost hits while T1's target is already the whole cache; the
 * chains asked again are proven (T2) and leave first. Phase 2 (with burst):
 * one of them, evicted from T2 since, is asked a third time: a run of 20 T2
 * ghost hits. Phase 3: fresh chains, each asked again 4 chains later (80
 * blocks), which all hit only while T1 may hold the whole cache. Returns the
 * blocks hit in phase 3. */
static size_t burst_after_t1_evidence(const char *policy, int burst)
{
    kvs_store *s = store_test_open(100, policy);
    const uint32_t n = 60, back = 6;
    for (uint32_t c = 0; c < n; c++) {
        request(s, 10000 + c * 20, 20);
        if (c >= back)
            request(s, 10000 + (c - back) * 20, 20);
    }
    if (burst)
        CU_ASSERT_EQUAL(request(s, 10000 + (n - 2 * back) * 20, 20), 0);
    size_t hits = 0;
    for (uint32_t c = 0; c < 12; c++) {
        request(s, 50000 + c * 20, 20);
        if (c >= 4)
            hits += request(s, 50000 + (c - 4) * 20, 20);
    }
    store_test_assert_ok(s);
    kvs_store_close(s);
    return hits;
}

/* ARC clamps p, so the surplus T1 evidence of phase 1 is lost and the burst
 * of phase 2 takes 20 blocks of T1's target away (phase 3 then misses 18
 * blocks); prefix sums the evidence and keeps T1's target. LRU, which keeps
 * the chains asked again instead, hits one of the eight. */
static void test_burst_keeps_t1_target(void)
{
    CU_ASSERT_EQUAL(burst_after_t1_evidence("prefix", 0), 8 * 20);
    CU_ASSERT_EQUAL(burst_after_t1_evidence("prefix", 1), 8 * 20);
    CU_ASSERT(burst_after_t1_evidence("lru", 1) < 8 * 20);
}

/* Frequency-driven generated trace: prefix >= LRU; invariants checked every
 * 50 requests during the replay. */
static void test_sysprompt_trace(void)
{
    kvs_trace *t;
    CU_ASSERT_EQUAL_FATAL(kvs_trace_generate("sysprompt", 3000, 11, &t), 0);
    char err[KVS_ERR_LEN];
    kvs_replay_result lru, px, bel;
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "lru", 200, 50, &lru, err, sizeof err), 0);
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "prefix", 200, 50, &px, err, sizeof err), 0);
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "belady", 200, 0, &bel, err, sizeof err), 0);
    CU_ASSERT(px.hits >= lru.hits);
    CU_ASSERT(px.hits <= bel.hits);
    CU_ASSERT(lru.evictions > 0);
    kvs_trace_free(t);
}

/* Unbounded store (capacity 0), then a resize that forces evictions: the
 * policy must size its history without a capacity and still pick leaves. */
static void test_unbounded_then_resize(void)
{
    kvs_store *s = store_test_open(0, "prefix");
    request(s, 1, 30);
    request(s, 1, 30);
    for (uint32_t c = 0; c < 20; c++)
        request(s, 1000 + c * 10, 10);
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    CU_ASSERT_EQUAL(st.blocks, 230);
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, 50), 0);
    kvs_store_get_stats(s, &st);
    CU_ASSERT(st.blocks <= 50);
    CU_ASSERT_EQUAL(cached_prefix(s, 1, 30), 30); /* the proven chain stays */
    store_test_assert_ok(s);
    kvs_store_close(s);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"scan_keeps_hot_prefix", test_scan_keeps_hot_prefix},
        {"returning_chain_is_proven", test_returning_chain_is_proven},
        {"adapts_to_soon_reuse", test_adapts_to_soon_reuse},
        {"burst_keeps_t1_target", test_burst_keeps_t1_target},
        {"sysprompt_trace", test_sysprompt_trace},
        {"unbounded_then_resize", test_unbounded_then_resize},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_policy", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
