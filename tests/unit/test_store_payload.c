/*
 * test_store_payload.c — block payloads in the store (store.h, lower half).
 *
 * Two-phase writes (an uncommitted block is invisible; abort frees; a commit
 * whose parent was evicted is KVS_EPRECOND), read references that outlive
 * delete and eviction, leases with ids (expiry, release by id, tenants), TTL
 * pins with priorities, per-tenant quotas, DRAM watermarks and runtime
 * tunables, the SSD tier (demotion, promotion, a truncated or flipped file is
 * KVS_EFORMAT and dropped with its subtree, never served), and the fault tier
 * failing every Nth DRAM allocation or SSD I/O for N = 1..8 with ENOSPC and
 * EIO: right status, nothing half-visible, every invariant (kvs_store_check,
 * which also checks the byte accounting) and no bytes left charged once the
 * blocks are gone; leaks are the ASan build's to find. The arena itself
 * (arena.c) is filled with blocks of one size and of mixed sizes, freed in
 * random order: blocks just over half a page, two or four pages fill it to
 * within the bound (multi-page slabs), never overlap, charge what they take,
 * and all of it comes back.
 */
#include "arena.h"
#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"
#include "store_test_util.h"
#include "tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t g_now = 1000;
static uint64_t test_clock(void *arg)
{
    (void)arg;
    return g_now;
}

static int put(kvs_store *s, const chain_t *c, size_t i, kvs_tenant_id tenant, uint64_t size,
               int8_t prio)
{
    return store_test_put(s, c, i, 7, tenant, prio, size);
}

/* Reads block i and checks its bytes; returns the read status. */
static int read_ok(kvs_store *s, const chain_t *c, size_t i, kvs_tier_kind *tier)
{
    kvs_store_ref r;
    int rc = kvs_store_read(s, &c->k[i], &r);
    if (rc)
        return rc;
    CU_ASSERT(same(&c->k[i], r.data, r.size));
    if (tier)
        *tier = r.tier;
    kvs_store_read_release(s, &r);
    return 0;
}

static kvs_store *open_p(uint64_t cap_blocks, const char *policy, const kvs_store_payload_opts *p)
{
    kvs_store_opts o = {
        .capacity_blocks = cap_blocks, .policy = policy, .verify_chain = 1, .clock_ms = test_clock};
    kvs_store *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_store_open_ex(&o, p, &s), 0);
    return s;
}

static kvs_store_payload_stats pstats(kvs_store *s)
{
    kvs_store_payload_stats ps;
    kvs_store_get_payload_stats(s, &ps);
    return ps;
}

static kvs_store_stats stats(kvs_store *s)
{
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    return st;
}

static void test_bad_opts(void)
{
    kvs_store *s = NULL;
    kvs_store_payload_opts p = {.high_watermark = 0.5, .low_watermark = 0.8};
    CU_ASSERT_EQUAL(kvs_store_open_ex(NULL, &p, &s), KVS_EINVAL);
    p = (kvs_store_payload_opts){.high_watermark = 1.5};
    CU_ASSERT_EQUAL(kvs_store_open_ex(NULL, &p, &s), KVS_EINVAL);
    p = (kvs_store_payload_opts){.ssd_dir = "/nonexistent/kvstash-test"};
    CU_ASSERT_EQUAL(kvs_store_open_ex(NULL, &p, &s), KVS_ENOTFOUND);
    p = (kvs_store_payload_opts){.fault_tier = 2, .fault_every = 1, .fault_status = KVS_EIO};
    CU_ASSERT_EQUAL(kvs_store_open_ex(NULL, &p, &s), KVS_EINVAL); /* no SSD to wrap */
    p = (kvs_store_payload_opts){.fault_tier = 1, .fault_every = 1, .fault_status = KVS_EPERM};
    CU_ASSERT_EQUAL(kvs_store_open_ex(NULL, &p, &s), KVS_EINVAL);
    CU_ASSERT_PTR_NULL(s);
    /* Bad write arguments. */
    s = open_p(0, NULL, NULL);
    chain_t c;
    mk_chain(1, 1, &c);
    kvs_store_put pp = {.key = &c.k[0], .tokens = c.tok, .n_tokens = BT, .size = 0};
    kvs_store_wr *w;
    void *buf;
    CU_ASSERT_EQUAL(kvs_store_write_begin(s, &pp, &w, &buf), KVS_EINVAL);
    pp.size = (uint64_t)UINT32_MAX + 1;
    CU_ASSERT_EQUAL(kvs_store_write_begin(s, &pp, &w, &buf), KVS_EINVAL);
    pp.size = 10;
    pp.n_tokens = 0;
    CU_ASSERT_EQUAL(kvs_store_write_begin(s, &pp, &w, &buf), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_set_watermarks(s, 0.5, 0.9), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_set_watermarks(s, 0.0 / 0.0, 0.5), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_pin_ex(s, &c.k[0], 1, 100), KVS_ENOTFOUND);
    kvs_store_close(s);
}

static void test_two_phase(void)
{
    kvs_store *s = open_p(0, NULL, &(kvs_store_payload_opts){.capacity_bytes = 1 << 20});
    chain_t c;
    mk_chain(10, 3, &c);
    CU_ASSERT_EQUAL(put(s, &c, 0, 0, 1000, 0), 0);

    kvs_store_put p = {.key = &c.k[1],
                       .parent = &c.k[0],
                       .ns_id = 7,
                       .tokens = c.tok + BT,
                       .n_tokens = BT,
                       .size = 3000};
    kvs_store_wr *w;
    void *buf;
    CU_ASSERT_EQUAL_FATAL(kvs_store_write_begin(s, &p, &w, &buf), 0);
    fill(&c.k[1], buf, 3000);
    /* Reserved, not visible: lookups, reads, contains, info, leases do not see it. */
    size_t m = 9;
    uint64_t lease = 9;
    CU_ASSERT_EQUAL(kvs_store_lookup(s, c.k, c.tok, BT, 2, &m), 0);
    CU_ASSERT_EQUAL(m, 1);
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 0, c.k, c.tok, BT, 2, 100, &m, &lease), 0);
    CU_ASSERT_EQUAL(m, 1);
    CU_ASSERT_EQUAL(kvs_store_lease_release(s, lease), 0);
    kvs_store_ref r;
    CU_ASSERT_EQUAL(kvs_store_read(s, &c.k[1], &r), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[1]), 0);
    kvs_store_info info;
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &c.k[1], &info), KVS_ENOTFOUND);
    kvs_store_payload_stats ps = pstats(s);
    CU_ASSERT(ps.reserved_bytes >= 3000 + 64);
    CU_ASSERT_EQUAL(ps.bytes[KVS_TIER_DRAM], 1000);
    /* A child cannot be begun under an uncommitted parent. */
    kvs_store_put p2 = {
        .key = &c.k[2], .parent = &c.k[1], .tokens = c.tok + 2 * BT, .n_tokens = BT, .size = 10};
    kvs_store_wr *w2;
    void *b2;
    CU_ASSERT_EQUAL(kvs_store_write_begin(s, &p2, &w2, &b2), KVS_EPRECOND);
    store_test_assert_ok(s);
    CU_ASSERT_EQUAL(kvs_store_write_commit(s, w), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, c.k, c.tok, BT, 2, &m), 0);
    CU_ASSERT_EQUAL(m, 2);
    kvs_tier_kind t;
    CU_ASSERT_EQUAL(read_ok(s, &c, 1, &t), 0);
    CU_ASSERT_EQUAL(t, KVS_TIER_DRAM);
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &c.k[1], &info), 0);
    CU_ASSERT_EQUAL(info.size, 3000);
    CU_ASSERT_EQUAL(info.depth, 1);
    CU_ASSERT_EQUAL(info.ns_id, 7);
    CU_ASSERT_EQUAL(pstats(s).reserved_bytes, 0);
    CU_ASSERT_EQUAL(pstats(s).bytes[KVS_TIER_DRAM], 4000);

    /* The same block again: EEXIST at begin, nothing reserved. */
    uint64_t used = pstats(s).used_bytes;
    CU_ASSERT_EQUAL(put(s, &c, 1, 0, 3000, 0), KVS_EEXIST);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, used);
    /* Another tenant's identical block is refused, not merged. */
    CU_ASSERT_EQUAL(put(s, &c, 1, 5, 3000, 0), KVS_EINVAL);

    /* Abort frees the reservation. */
    CU_ASSERT_EQUAL_FATAL(kvs_store_write_begin(s, &p2, &w2, &b2), 0);
    CU_ASSERT(pstats(s).used_bytes > used);
    kvs_store_write_abort(s, w2);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, used);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[2]), 0);

    /* Commit after the parent was evicted (here deleted): EPRECOND, freed. */
    CU_ASSERT_EQUAL_FATAL(kvs_store_write_begin(s, &p2, &w2, &b2), 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[1], 0), 0);
    CU_ASSERT_EQUAL(kvs_store_write_commit(s, w2), KVS_EPRECOND);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[2]), 0);
    CU_ASSERT_EQUAL(pstats(s).reserved_bytes, 0);

    /* Two writers of one block: the second commit is EEXIST and frees its copy. */
    kvs_store_wr *wa, *wb;
    void *ba, *bb;
    CU_ASSERT_EQUAL_FATAL(kvs_store_write_begin(s, &p, &wa, &ba), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_store_write_begin(s, &p, &wb, &bb), 0);
    fill(&c.k[1], ba, 3000);
    memset(bb, 0xee, 3000);
    CU_ASSERT_EQUAL(kvs_store_write_commit(s, wa), 0);
    CU_ASSERT_EQUAL(kvs_store_write_commit(s, wb), KVS_EEXIST);
    CU_ASSERT_EQUAL(read_ok(s, &c, 1, NULL), 0);
    store_test_assert_ok(s);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[0], 1), 0);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, 0);
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 0), 0);
    kvs_store_close(s);
}

/* write_begin protects the parent while it makes room for the child; a parent
 * already pinned 65535 times (the most a count holds) must stay protected, not
 * have that count wrap to 0 and be evicted for its own child. */
static void test_saturated_parent_pins(void)
{
    kvs_store *s = open_p(0, "lru", &(kvs_store_payload_opts){.capacity_bytes = 5120});
    chain_t c;
    mk_chain(40, 2, &c);
    CU_ASSERT_EQUAL_FATAL(put(s, &c, 0, 0, 4000, 0), 0);
    int rc = 0;
    for (uint32_t i = 0; i < UINT16_MAX && rc == 0; i++)
        rc = kvs_store_pin(s, &c.k[0]);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    uint64_t used = pstats(s).used_bytes;
    /* DRAM holds one block, the pinned parent: the child does not fit. */
    CU_ASSERT_EQUAL(put(s, &c, 1, 0, 4000, 0), KVS_ENOSPC);
    CU_ASSERT_EQUAL(read_ok(s, &c, 0, NULL), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[1]), 0);
    kvs_store_info info;
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &c.k[0], &info), 0);
    CU_ASSERT_EQUAL(info.pins, UINT16_MAX);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, used);
    CU_ASSERT_EQUAL(pstats(s).reserved_bytes, 0);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static void test_read_ref_outlives(void)
{
    /* 8 blocks of ~4 KiB fit; the arena is the bound. */
    kvs_store *s = open_p(0, "lru", &(kvs_store_payload_opts){.capacity_bytes = 8 * 5120});
    chain_t c[16];
    for (uint32_t i = 0; i < 16; i++)
        mk_chain(100 + 10 * i, 1, &c[i]);
    CU_ASSERT_EQUAL(put(s, &c[0], 0, 0, 4000, 0), 0);
    CU_ASSERT_EQUAL(put(s, &c[1], 0, 0, 4000, 0), 0);
    kvs_store_ref r0, r1;
    CU_ASSERT_EQUAL_FATAL(kvs_store_read(s, &c[0].k[0], &r0), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_store_read(s, &c[1].k[0], &r1), 0);
    uint64_t used = pstats(s).used_bytes;
    /* Delete: the block is gone for everyone else, the bytes stay for r0. */
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c[0].k[0], 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[0].k[0]), 0);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, used);
    CU_ASSERT_EQUAL(pstats(s).bytes[KVS_TIER_DRAM], 4000);
    /* Eviction: fill past capacity; c[1] (oldest) goes, r1 still reads right. */
    for (uint32_t i = 2; i < 16; i++) {
        int rc = put(s, &c[i], 0, 0, 4000, 0);
        CU_ASSERT(rc == 0 || rc == KVS_ENOSPC);
    }
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[1].k[0]), 0);
    CU_ASSERT(same(&c[0].k[0], r0.data, 4000));
    CU_ASSERT(same(&c[1].k[0], r1.data, 4000));
    CU_ASSERT(stats(s).evictions[KVS_EVICT_WATERMARK] > 0);
    uint64_t held = pstats(s).used_bytes;
    kvs_store_read_release(s, &r0);
    kvs_store_read_release(s, &r1);
    CU_ASSERT(pstats(s).used_bytes < held);
    CU_ASSERT(pstats(s).used_bytes <= 8 * 5120);
    kvs_store_read_release(s, &r1); /* released refs are cleared: a second release is a no-op */
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static void test_leases(void)
{
    kvs_store *s = open_p(0, NULL, NULL);
    chain_t c;
    mk_chain(200, 3, &c);
    for (size_t i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(put(s, &c, i, 3, 100, 0), 0);
    size_t m;
    uint64_t id1, id2;
    /* Another tenant matches nothing and gets no lease. */
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 4, c.k, c.tok, BT, 3, 100, &m, &id1), 0);
    CU_ASSERT_EQUAL(m, 0);
    CU_ASSERT_EQUAL(id1, 0);
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 3, c.k, c.tok, 0, 3, 100, &m, &id1), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 3, c.k, c.tok, BT, 3, 0, &m, &id1), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 3, c.k, c.tok, BT, 3, 100, &m, &id1), 0);
    CU_ASSERT_EQUAL(m, 3);
    CU_ASSERT(id1 != 0);
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 3, c.k, c.tok, BT, 2, 500, &m, &id2), 0);
    CU_ASSERT_EQUAL(m, 2);
    CU_ASSERT(id2 != id1);
    CU_ASSERT_EQUAL(pstats(s).leases, 2);
    /* Leased blocks cannot be deleted. */
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[2], 0), KVS_EPERM);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[0], 1), KVS_EPERM);
    /* Expiry of the first lease frees block 2 (only it held block 2). */
    g_now += 100;
    CU_ASSERT_EQUAL(kvs_store_lease_release(s, id1), KVS_ENOTFOUND); /* already expired */
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[2], 0), 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[1], 0), KVS_EPERM);
    /* Release by id ends the second early. */
    CU_ASSERT_EQUAL(kvs_store_lease_release(s, id2), 0);
    CU_ASSERT_EQUAL(kvs_store_lease_release(s, id2), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_store_lease_release(s, 12345), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(pstats(s).leases, 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[1], 0), 0);
    store_test_assert_ok(s);
    /* A leased block survives eviction pressure: capacity 1 block, block 0 leased. */
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, 1), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 3, c.k, c.tok, BT, 1, 50, &m, &id1), 0);
    chain_t d;
    mk_chain(300, 1, &d);
    CU_ASSERT_EQUAL(put(s, &d, 0, 3, 100, 0), KVS_ENOSPC);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[0]), 1);
    g_now += 50;
    CU_ASSERT_EQUAL(put(s, &d, 0, 3, 100, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[0]), 0);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

/* Many lease records ended in any order: ids stay findable, counts right. */
static void test_many_leases(void)
{
    kvs_store *s = open_p(0, NULL, NULL);
    chain_t c;
    mk_chain(250, 2, &c);
    for (size_t i = 0; i < 2; i++)
        CU_ASSERT_EQUAL(put(s, &c, i, 0, 100, 0), 0);
    enum { N = 1000 };
    static uint64_t id[N];
    size_t m;
    for (int k = 0; k < N; k++) {
        CU_ASSERT_EQUAL_FATAL(kvs_store_lookup_leased(s, 0, c.k, c.tok, BT, 1 + (size_t)(k % 2),
                                                      k < N / 2 ? 100 : 1000, &m, &id[k]),
                              0);
        CU_ASSERT_EQUAL(m, 1 + (size_t)(k % 2));
    }
    CU_ASSERT_EQUAL(pstats(s).leases, N);
    /* Release every third, from the end. */
    uint64_t released = 0;
    for (int k = N - 1; k >= 0; k -= 3) {
        CU_ASSERT_EQUAL(kvs_store_lease_release(s, id[k]), 0);
        released++;
    }
    CU_ASSERT_EQUAL(pstats(s).leases, N - released);
    for (int k = N - 1; k >= 0; k -= 3)
        CU_ASSERT_EQUAL(kvs_store_lease_release(s, id[k]), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_store_lease_release(s, id[1]), 0); /* 1 is not a multiple-of-3 step */
    released++;
    /* The first half expires. */
    g_now += 100;
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[1], 0), KVS_EPERM);
    uint64_t left = 0;
    for (int k = N / 2; k < N; k++)
        left += (N - 1 - k) % 3 != 0;
    CU_ASSERT_EQUAL(pstats(s).leases, left);
    for (int k = N / 2; k < N; k++)
        if ((N - 1 - k) % 3 != 0)
            CU_ASSERT_EQUAL(kvs_store_lease_release(s, id[k]), 0);
    CU_ASSERT_EQUAL(pstats(s).leases, 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c.k[0], 1), 0);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static void test_quotas(void)
{
    kvs_store *s = open_p(0, NULL, NULL);
    chain_t a[6], b[2];
    for (uint32_t i = 0; i < 6; i++)
        mk_chain(400 + i, 1, &a[i]);
    for (uint32_t i = 0; i < 2; i++)
        mk_chain(500 + i, 1, &b[i]);
    CU_ASSERT_EQUAL(kvs_store_set_quota(s, 1, 3000), 0);
    CU_ASSERT_EQUAL(put(s, &b[0], 0, 2, 1000, 0), 0);
    CU_ASSERT_EQUAL(put(s, &b[1], 0, 2, 1000, 0), 0);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(put(s, &a[i], 0, 1, 1000, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 1), 3000);
    /* The fourth evicts the tenant's own least recently used (a[1] after a
     * read of a[0]), never the other tenant's. */
    CU_ASSERT_EQUAL(read_ok(s, &a[0], 0, NULL), 0);
    CU_ASSERT_EQUAL(put(s, &a[3], 0, 1, 1000, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &a[1].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &a[0].k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 1), 3000);
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 2), 2000);
    CU_ASSERT_EQUAL(stats(s).evictions[KVS_EVICT_QUOTA], 1);
    /* Larger than the quota: refused outright. */
    CU_ASSERT_EQUAL(put(s, &a[4], 0, 1, 3001, 0), KVS_ENOSPC);
    /* Everything of the tenant pinned: refused, counted. */
    CU_ASSERT_EQUAL(kvs_store_pin(s, &a[0].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_pin(s, &a[2].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_pin(s, &a[3].k[0]), 0);
    CU_ASSERT_EQUAL(put(s, &a[4], 0, 1, 1000, 0), KVS_ENOSPC);
    CU_ASSERT_EQUAL(pstats(s).quota_refused, 2);
    /* A reservation counts against the quota until it is committed. */
    CU_ASSERT_EQUAL(kvs_store_set_quota(s, 1, 4500), 0);
    kvs_store_put p = {
        .key = &a[4].k[0], .tenant = 1, .tokens = a[4].tok, .n_tokens = BT, .size = 1000};
    kvs_store_wr *w;
    void *buf;
    CU_ASSERT_EQUAL_FATAL(kvs_store_write_begin(s, &p, &w, &buf), 0);
    CU_ASSERT_EQUAL(put(s, &a[5], 0, 1, 1000, 0), KVS_ENOSPC);
    kvs_store_write_abort(s, w);
    CU_ASSERT_EQUAL(put(s, &a[5], 0, 1, 1000, 0), 0);
    /* Quota off. */
    CU_ASSERT_EQUAL(kvs_store_set_quota(s, 1, 0), 0);
    CU_ASSERT_EQUAL(put(s, &a[4], 0, 1, 1000, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 1), 5000);
    /* Only leaves go for a quota: the parent of a chain, though written
     * first, stays while its child is cached; the child goes. */
    chain_t ch, r6;
    mk_chain(450, 2, &ch);
    mk_chain(460, 1, &r6);
    CU_ASSERT_EQUAL(kvs_store_set_quota(s, 6, 2000), 0);
    CU_ASSERT_EQUAL(put(s, &ch, 0, 6, 1000, 0), 0);
    CU_ASSERT_EQUAL(put(s, &ch, 1, 6, 1000, 0), 0);
    CU_ASSERT_EQUAL(put(s, &r6, 0, 6, 1000, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &ch.k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &ch.k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &r6.k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 6), 2000);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

/* kvs_store_write_check: write_begin's verdict on the key, tokens and
 * parent, and ENOSPC only for what no eviction could fit; it reserves and
 * evicts nothing, however full the store (service Puts stage their payload
 * and reserve only at commit, so a header alone never evicts). */
static void test_write_check(void)
{
    kvs_store *s = open_p(0, NULL, &(kvs_store_payload_opts){.capacity_bytes = 64 << 10});
    chain_t c, d;
    mk_chain(600, 3, &c);
    mk_chain(601, 1, &d);
    CU_ASSERT_EQUAL(put(s, &c, 0, 0, 20000, 0), 0);
    CU_ASSERT_EQUAL(put(s, &c, 1, 0, 20000, 0), 0);
    kvs_store_stats st0 = stats(s);
    kvs_store_payload_stats ps0 = pstats(s);
    /* The store is nearly full: a block that needs every unpinned byte is
     * admissible (write_begin would evict for it), and checking it evicts
     * nothing. */
    kvs_store_put p = {.key = &d.k[0], .tokens = d.tok, .n_tokens = BT, .size = 40000};
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &p), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[1]), 1);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, ps0.used_bytes);
    CU_ASSERT_EQUAL(pstats(s).reserved_bytes, 0);
    for (int r = 0; r < KVS_EVICT__COUNT; r++)
        CU_ASSERT_EQUAL(stats(s).evictions[r], st0.evictions[r]);
    /* Larger than the memory tier: never. */
    p.size = 65 << 10;
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &p), KVS_ENOSPC);
    /* Larger than the tenant's quota: never; within it: yes. */
    CU_ASSERT_EQUAL(kvs_store_set_quota(s, 3, 1000), 0);
    p.size = 1001;
    p.tenant = 3;
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &p), KVS_ENOSPC);
    p.size = 1000;
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &p), 0);
    p.tenant = 0;
    /* write_begin's other answers. */
    kvs_store_put q = {.key = &c.k[1],
                       .parent = &c.k[0],
                       .ns_id = 7,
                       .tokens = c.tok + BT,
                       .n_tokens = BT,
                       .size = 20000};
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &q), KVS_EEXIST);
    q.tenant = 5; /* the same block as another tenant's: refused, not merged */
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &q), KVS_EINVAL);
    kvs_store_put orphan = {
        .key = &c.k[2], .parent = &d.k[0], .tokens = c.tok + 2 * BT, .n_tokens = BT, .size = 10};
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &orphan), KVS_EPRECOND);
    p.size = 0;
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &p), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_write_check(NULL, &p), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_store_write_check(s, NULL), KVS_EINVAL);
    /* A key that is not the chain key of its parent and tokens (verify_chain):
     * refused by both calls, counted, nothing reserved or stored. */
    kvs_store_put forged = {
        .key = &c.k[2], .parent = &c.k[1], .tokens = d.tok, .n_tokens = BT, .size = 10};
    uint64_t refused0 = stats(s).refused;
    CU_ASSERT_EQUAL(kvs_store_write_check(s, &forged), KVS_EINVAL);
    kvs_store_wr *fw = NULL;
    void *fb = NULL;
    CU_ASSERT_EQUAL(kvs_store_write_begin(s, &forged, &fw, &fb), KVS_EINVAL);
    CU_ASSERT_PTR_NULL(fw);
    if (fw)
        kvs_store_write_abort(s, fw);
    CU_ASSERT_EQUAL(stats(s).refused, refused0 + 2);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[2]), 0);
    CU_ASSERT_EQUAL(pstats(s).reserved_bytes, 0);
    /* And write_begin of the admissible block then does evict. */
    p.size = 40000;
    kvs_store_wr *w;
    void *buf;
    CU_ASSERT_EQUAL_FATAL(kvs_store_write_begin(s, &p, &w, &buf), 0);
    CU_ASSERT(kvs_store_contains(s, &c.k[0]) + kvs_store_contains(s, &c.k[1]) < 2);
    kvs_store_write_abort(s, w);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static void test_watermarks(void)
{
    /* 1 KiB blocks take 1088-byte chunks (the 1024+64 header, class 1088... see
     * kvs__slab_init); read the real charge from used_bytes. */
    kvs_store *s =
        open_p(0, "lru",
               &(kvs_store_payload_opts){
                   .capacity_bytes = 64 * 1024, .high_watermark = 0.75, .low_watermark = 0.5});
    chain_t c[64];
    for (uint32_t i = 0; i < 64; i++)
        mk_chain(600 + i, 1, &c[i]);
    CU_ASSERT_EQUAL(put(s, &c[0], 0, 0, 1000, 0), 0);
    uint64_t chunk = pstats(s).used_bytes;
    CU_ASSERT(chunk >= 1064 && chunk < 1064 * 5 / 4 + 64);
    uint64_t high = 48 * 1024, low = 32 * 1024;
    uint32_t n = 1;
    while (pstats(s).used_bytes + chunk <= high)
        CU_ASSERT_EQUAL_FATAL(put(s, &c[n++], 0, 0, 1000, 0), 0);
    CU_ASSERT_EQUAL(stats(s).evictions[KVS_EVICT_WATERMARK], 0);
    /* The next write crosses the high mark: eviction down to the low mark. */
    CU_ASSERT_EQUAL(put(s, &c[n++], 0, 0, 1000, 0), 0);
    uint64_t u = pstats(s).used_bytes;
    CU_ASSERT(u <= low);
    CU_ASSERT(u + chunk > low);
    CU_ASSERT(stats(s).evictions[KVS_EVICT_WATERMARK] > 0);
    /* LRU: the oldest went, the newest stayed. */
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[0].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[n - 1].k[0]), 1);
    /* Tunables while running: lower the capacity, then the watermarks. */
    CU_ASSERT_EQUAL(kvs_store_set_capacity_bytes(s, 1 << 30), KVS_EINVAL); /* beyond the arena */
    CU_ASSERT_EQUAL(kvs_store_set_capacity_bytes(s, 16 * 1024), 0);
    CU_ASSERT(pstats(s).used_bytes <= 8 * 1024);
    CU_ASSERT(stats(s).evictions[KVS_EVICT_RESIZE] > 0);
    CU_ASSERT_EQUAL(pstats(s).capacity_bytes, 16 * 1024);
    CU_ASSERT_EQUAL(kvs_store_set_capacity_bytes(s, 64 * 1024), 0);
    CU_ASSERT_EQUAL(kvs_store_set_watermarks(s, 0.1, 0.05), 0);
    CU_ASSERT(pstats(s).used_bytes <= 64 * 1024 / 20);
    /* A block larger than the arena. */
    chain_t big;
    mk_chain(700, 1, &big);
    CU_ASSERT_EQUAL(put(s, &big, 0, 0, 65 * 1024, 0), KVS_ENOSPC);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static void test_priority(void)
{
    /* Count-bounded store of 4 blocks; block p pinned with priority 5 for 100 ms. */
    kvs_store *s = open_p(4, "lru", NULL);
    chain_t c[8];
    for (uint32_t i = 0; i < 8; i++)
        mk_chain(800 + i, 1, &c[i]);
    for (int i = 0; i < 4; i++)
        CU_ASSERT_EQUAL(put(s, &c[i], 0, 0, 10, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_pin_ex(s, &c[0].k[0], 5, 100), 0);
    CU_ASSERT_EQUAL(kvs_store_pin_ex(s, &c[1].k[0], 2, 0), 0); /* pinned until unpin */
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c[0].k[0], 0), KVS_EPERM);
    /* Unpin ends a TTL pin early; then nothing is left to unpin. */
    CU_ASSERT_EQUAL(kvs_store_pin_ex(s, &c[3].k[0], 0, 1000), 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &c[3].k[0], 0), KVS_EPERM);
    CU_ASSERT_EQUAL(kvs_store_unpin(s, &c[3].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_unpin(s, &c[3].k[0]), KVS_EPRECOND);
    CU_ASSERT_EQUAL(pstats(s).leases, 1); /* c[0]'s TTL pin */
    /* While the TTL runs, c[0] is pinned: c[2] (LRU among the rest) goes. */
    CU_ASSERT_EQUAL(put(s, &c[4], 0, 0, 10, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[2].k[0]), 0);
    g_now += 100;
    /* TTL over: c[0] is the least recent, but priority 5 keeps it behind the
     * unprotected blocks. */
    CU_ASSERT_EQUAL(put(s, &c[5], 0, 0, 10, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[0].k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[3].k[0]), 0);
    CU_ASSERT_EQUAL(put(s, &c[6], 0, 0, 10, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[0].k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[4].k[0]), 0);
    /* Unpin c[1] (priority 2): with c[5], c[6] newer but unprotected, they go
     * first; then c[1] (priority 2) before c[0] (priority 5). */
    CU_ASSERT_EQUAL(kvs_store_unpin(s, &c[1].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, 2), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[0].k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[1].k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, 1), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[0].k[0]), 1);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[1].k[0]), 0);
    /* Priority from the Put itself. */
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, 2), 0);
    CU_ASSERT_EQUAL(put(s, &c[7], 0, 0, 10, 9), 0);
    CU_ASSERT_EQUAL(put(s, &c[1], 0, 0, 10, 0), 0); /* evicts c[0], priority 5 < 9 */
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[0].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[7].k[0]), 1);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static char *mk_dir(void)
{
    char *d = strdup("/tmp/kvs-ssd-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(d));
    return d;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void rm_dir(char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
    free(dir);
}

static void file_of(const char *dir, const kvs_key *k, char *p, size_t n)
{
    char name[69];
    kvs_tier_ssd_name(k, name);
    snprintf(p, n, "%s/%s", dir, name);
}

static void test_ssd_tier(void)
{
    char *dir = mk_dir();
    /* DRAM holds about 4 blocks of 4000 bytes; the SSD takes the rest. */
    kvs_store *s =
        open_p(0, "lru", &(kvs_store_payload_opts){.capacity_bytes = 4 * 5120, .ssd_dir = dir});
    chain_t c[4];
    for (uint32_t k = 0; k < 4; k++) {
        mk_chain(900 + 10 * k, 2, &c[k]);
        for (size_t i = 0; i < 2; i++)
            CU_ASSERT_EQUAL(put(s, &c[k], i, 0, 4000, 0), 0);
    }
    kvs_store_payload_stats ps = pstats(s);
    CU_ASSERT(ps.demotions >= 3);
    CU_ASSERT_EQUAL(ps.bytes[KVS_TIER_DRAM] + ps.bytes[KVS_TIER_SSD], 8 * 4000);
    CU_ASSERT_EQUAL(ps.bytes[KVS_TIER_SSD], ps.demotions * 4000);
    CU_ASSERT_EQUAL(count_files(dir), (int)ps.demotions);
    CU_ASSERT_EQUAL(stats(s).evictions[KVS_EVICT_DEMOTE], ps.demotions);
    /* Demotion keeps every chain whole and matching; the oldest chain went
     * to SSD tail first, then its root. */
    kvs_store_info info;
    for (uint32_t k = 0; k < 4; k++) {
        size_t m;
        CU_ASSERT_EQUAL(kvs_store_lookup(s, c[k].k, c[k].tok, BT, 2, &m), 0);
        CU_ASSERT_EQUAL(m, 2);
    }
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &c[0].k[0], &info), 0);
    CU_ASSERT_EQUAL(info.tier, KVS_TIER_SSD);
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &c[0].k[1], &info), 0);
    CU_ASSERT_EQUAL(info.tier, KVS_TIER_SSD);
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &c[3].k[1], &info), 0);
    CU_ASSERT_EQUAL(info.tier, KVS_TIER_DRAM);
    store_test_assert_ok(s);
    /* Promotion on read: every block reads back right and comes to DRAM. */
    uint64_t promoted = 0;
    for (uint32_t k = 0; k < 4; k++)
        for (size_t i = 0; i < 2; i++) {
            CU_ASSERT_EQUAL(kvs_store_info_get(s, &c[k].k[i], &info), 0);
            promoted += info.tier == KVS_TIER_SSD;
            kvs_tier_kind t;
            CU_ASSERT_EQUAL(read_ok(s, &c[k], i, &t), 0);
            CU_ASSERT_EQUAL(t, KVS_TIER_DRAM);
            CU_ASSERT_EQUAL(kvs_store_info_get(s, &c[k].k[i], &info), 0);
            CU_ASSERT_EQUAL(info.tier, KVS_TIER_DRAM);
            store_test_assert_ok(s);
        }
    CU_ASSERT_EQUAL(pstats(s).promotions, promoted);
    CU_ASSERT(promoted >= 3);
    CU_ASSERT_EQUAL(count_files(dir), (int)(pstats(s).bytes[KVS_TIER_SSD] / 4000));

    /* A chain longer than DRAM goes in whole: its older blocks are demoted
     * although they have children (demotion keeps the chain in the index). */
    chain_t lc;
    mk_chain(950, 8, &lc);
    for (size_t i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(put(s, &lc, i, 0, 4000, 0), 0);
    size_t lm;
    CU_ASSERT_EQUAL(kvs_store_lookup(s, lc.k, lc.tok, BT, 8, &lm), 0);
    CU_ASSERT_EQUAL(lm, 8);
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &lc.k[0], &info), 0);
    CU_ASSERT_EQUAL(info.tier, KVS_TIER_SSD);
    for (size_t i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(read_ok(s, &lc, i, NULL), 0);
    store_test_assert_ok(s);
    kvs_store_close(s);
    CU_ASSERT_EQUAL(count_files(dir), 0);

    /* SSD capacity of 2 blocks: more demotions drop the oldest SSD leaves. */
    s = open_p(0, "lru",
               &(kvs_store_payload_opts){
                   .capacity_bytes = 4 * 5120, .ssd_dir = dir, .ssd_capacity_bytes = 2 * 4000});
    chain_t r[10];
    for (uint32_t i = 0; i < 10; i++) {
        mk_chain(1000 + i, 1, &r[i]);
        CU_ASSERT_EQUAL(put(s, &r[i], 0, 0, 4000, 0), 0);
    }
    CU_ASSERT(stats(s).evictions[KVS_EVICT_SSD_FULL] >= 3);
    CU_ASSERT_EQUAL(pstats(s).bytes[KVS_TIER_SSD], 2 * 4000);
    CU_ASSERT_EQUAL(count_files(dir), 2);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &r[0].k[0]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &r[9].k[0]), 1);
    store_test_assert_ok(s);
    /* DRAM cannot make room (everything pinned): the read serves a private copy. */
    kvs_store_info in2;
    uint32_t on_ssd = 10;
    for (uint32_t i = 0; i < 10; i++)
        if (kvs_store_info_get(s, &r[i].k[0], &in2) == 0 && in2.tier == KVS_TIER_SSD)
            on_ssd = i;
        else if (kvs_store_contains(s, &r[i].k[0]))
            CU_ASSERT_EQUAL(kvs_store_pin(s, &r[i].k[0]), 0);
    CU_ASSERT_FATAL(on_ssd < 10);
    kvs_tier_kind t;
    CU_ASSERT_EQUAL(read_ok(s, &r[on_ssd], 0, &t), 0);
    CU_ASSERT_EQUAL(t, KVS_TIER_SSD);
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &r[on_ssd].k[0], &in2), 0);
    CU_ASSERT_EQUAL(in2.tier, KVS_TIER_SSD);
    store_test_assert_ok(s);
    kvs_store_close(s);
    rm_dir(dir);
}

/* A read reference across demotion; block capacity and quotas with SSD blocks;
 * a policy switch with blocks on SSD. */
static void test_ssd_interplay(void)
{
    char *dir = mk_dir();
    kvs_store *s =
        open_p(0, "lru", &(kvs_store_payload_opts){.capacity_bytes = 3 * 5120, .ssd_dir = dir});
    chain_t c[8];
    for (uint32_t i = 0; i < 8; i++)
        mk_chain(1300 + i, 1, &c[i]);
    CU_ASSERT_EQUAL(put(s, &c[0], 0, 1, 4000, 0), 0);
    kvs_store_ref r;
    CU_ASSERT_EQUAL_FATAL(kvs_store_read(s, &c[0].k[0], &r), 0);
    for (uint32_t i = 1; i < 4; i++)
        CU_ASSERT_EQUAL(put(s, &c[i], 0, 1, 4000, 0), 0);
    kvs_store_info info;
    CU_ASSERT_EQUAL(kvs_store_info_get(s, &c[0].k[0], &info), 0);
    CU_ASSERT_EQUAL(info.tier, KVS_TIER_SSD); /* demoted while referenced */
    CU_ASSERT(same(&c[0].k[0], r.data, 4000));
    uint64_t held = pstats(s).used_bytes;
    kvs_store_read_release(s, &r);
    CU_ASSERT(pstats(s).used_bytes < held); /* the old DRAM chunk went at release */
    CU_ASSERT_EQUAL(read_ok(s, &c[0], 0, NULL), 0);
    store_test_assert_ok(s);

    /* Quota counts SSD bytes too, and evicts the tenant's SSD blocks. */
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 1), 4 * 4000);
    CU_ASSERT(pstats(s).bytes[KVS_TIER_SSD] > 0);
    CU_ASSERT_EQUAL(kvs_store_set_quota(s, 1, 4 * 4000), 0);
    CU_ASSERT_EQUAL(put(s, &c[4], 0, 1, 4000, 0), 0);
    CU_ASSERT_EQUAL(kvs_store_tenant_bytes(s, 1), 4 * 4000);
    CU_ASSERT_EQUAL(stats(s).evictions[KVS_EVICT_QUOTA], 1);
    CU_ASSERT_EQUAL(kvs_store_set_quota(s, 1, 0), 0);
    store_test_assert_ok(s);

    /* A policy switch keeps SSD blocks out of the candidates. */
    CU_ASSERT_EQUAL(kvs_store_set_policy(s, "s3fifo"), 0);
    store_test_assert_ok(s);
    CU_ASSERT_EQUAL(put(s, &c[5], 0, 1, 4000, 0), 0);
    store_test_assert_ok(s);

    /* Block capacity: SSD leaves go first (the coldest), reason capacity. */
    uint64_t before = pstats(s).bytes[KVS_TIER_SSD];
    CU_ASSERT(before > 0);
    kvs_store_stats st = stats(s);
    CU_ASSERT_EQUAL(kvs_store_set_capacity(s, st.blocks - 1), 0);
    CU_ASSERT_EQUAL(pstats(s).bytes[KVS_TIER_SSD], before - 4000);
    CU_ASSERT_EQUAL(stats(s).evictions[KVS_EVICT_RESIZE], st.evictions[KVS_EVICT_RESIZE] + 1);
    CU_ASSERT_EQUAL(count_files(dir), (int)(pstats(s).bytes[KVS_TIER_SSD] / 4000));
    store_test_assert_ok(s);
    kvs_store_close(s);
    CU_ASSERT_EQUAL(count_files(dir), 0);
    rm_dir(dir);
}

/* A read of an SSD block holds it while it makes room in DRAM and reads the
 * file. A block held by 65535 lease records (the most its count keeps; more
 * become anonymous leases) must stay held: a wrapped count let the room-making
 * demotion drop it from a full SSD mid-read, leaving its lease records pointing
 * at a freed entry. */
static void test_ssd_read_saturated_holds(void)
{
    char *dir = mk_dir();
    kvs_store *s = open_p(0, "lru",
                          &(kvs_store_payload_opts){
                              .capacity_bytes = 5120, .ssd_dir = dir, .ssd_capacity_bytes = 4000});
    chain_t a, b, d;
    mk_chain(1400, 1, &a);
    mk_chain(1410, 1, &b);
    mk_chain(1420, 1, &d);
    CU_ASSERT_EQUAL_FATAL(put(s, &a, 0, 0, 4000, 0), 0);
    CU_ASSERT_EQUAL_FATAL(put(s, &b, 0, 0, 4000, 0), 0); /* a goes to SSD, which is now full */
    kvs_store_info info;
    CU_ASSERT_EQUAL_FATAL(kvs_store_info_get(s, &a.k[0], &info), 0);
    CU_ASSERT_EQUAL_FATAL(info.tier, KVS_TIER_SSD);
    enum { N = UINT16_MAX };
    uint64_t *id = calloc(N, sizeof *id);
    CU_ASSERT_PTR_NOT_NULL_FATAL(id);
    size_t m;
    for (int k = 0; k < N; k++)
        CU_ASSERT_EQUAL_FATAL(kvs_store_lookup_leased(s, 0, a.k, a.tok, BT, 1, 100000, &m, &id[k]),
                              0);
    /* Promoting a needs b's room; b cannot go to the full SSD (a is held), so
     * it is dropped and a comes back whole. */
    kvs_tier_kind t;
    CU_ASSERT_EQUAL(read_ok(s, &a, 0, &t), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &a.k[0]), 1);
    store_test_assert_ok(s);
    /* A new block may take any freed entry; ending the leases must not touch it. */
    CU_ASSERT_EQUAL(put(s, &d, 0, 0, 100, 0), 0);
    for (int k = 0; k < N; k++)
        CU_ASSERT_EQUAL(kvs_store_lease_release(s, id[k]), 0);
    free(id);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &d.k[0], 0), 0);
    CU_ASSERT_EQUAL(kvs_store_delete(s, &a.k[0], 0), 0);
    kvs_store_delete(s, &b.k[0], 0);
    CU_ASSERT_EQUAL(stats(s).blocks, 0);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, 0);
    store_test_assert_ok(s);
    kvs_store_close(s);
    CU_ASSERT_EQUAL(count_files(dir), 0);
    rm_dir(dir);
}

/* Corrupts the SSD copy of block 1 of a 3-block chain, then reads it. */
static void corrupt_case(int how)
{
    char *dir = mk_dir();
    kvs_store *s =
        open_p(0, "lru", &(kvs_store_payload_opts){.capacity_bytes = 3 * 5120, .ssd_dir = dir});
    chain_t c, d;
    mk_chain(1100, 3, &c);
    mk_chain(1200, 2, &d);
    for (size_t i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(put(s, &c, i, 0, 4000, 0), 0);
    for (size_t i = 0; i < 2; i++)
        CU_ASSERT_EQUAL(put(s, &d, i, 0, 4000, 0), 0);
    kvs_store_info info;
    CU_ASSERT_EQUAL_FATAL(kvs_store_info_get(s, &c.k[1], &info), 0);
    CU_ASSERT_EQUAL_FATAL(info.tier, KVS_TIER_SSD);
    char path[512];
    file_of(dir, &c.k[1], path, sizeof path);
    int fd = open(path, O_RDWR);
    CU_ASSERT_FATAL(fd >= 0);
    if (how == 0) {
        CU_ASSERT_EQUAL(ftruncate(fd, 64 + 2000), 0); /* torn write */
    } else if (how == 1) {
        uint8_t b;
        CU_ASSERT_EQUAL(pread(fd, &b, 1, 64 + 1234), 1); /* flipped payload byte */
        b ^= 0x10;
        CU_ASSERT_EQUAL(pwrite(fd, &b, 1, 64 + 1234), 1);
    } else if (how == 2) {
        uint8_t b;
        CU_ASSERT_EQUAL(pread(fd, &b, 1, 41), 1); /* flipped header byte (the size) */
        b ^= 0x01;
        CU_ASSERT_EQUAL(pwrite(fd, &b, 1, 41), 1);
    } else {
        CU_ASSERT_EQUAL(ftruncate(fd, 0), 0); /* empty file */
    }
    close(fd);
    uint64_t lease;
    size_t m;
    CU_ASSERT_EQUAL(kvs_store_lookup_leased(s, 0, c.k, c.tok, BT, 3, 1000, &m, &lease), 0);
    CU_ASSERT_EQUAL(m, 3);
    kvs_store_ref r;
    CU_ASSERT_EQUAL(kvs_store_read(s, &c.k[1], &r), KVS_EFORMAT);
    CU_ASSERT_PTR_NULL(r.data);
    /* Dropped with its subtree, never served; the other chain is untouched. */
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[1]), 0);
    CU_ASSERT_EQUAL(kvs_store_contains(s, &c.k[2]), 0);
    CU_ASSERT_EQUAL(kvs_store_read(s, &c.k[1], &r), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(read_ok(s, &c, 0, NULL), 0);
    CU_ASSERT_EQUAL(read_ok(s, &d, 0, NULL), 0);
    CU_ASSERT_EQUAL(read_ok(s, &d, 1, NULL), 0);
    CU_ASSERT_EQUAL(kvs_store_lookup(s, c.k, c.tok, BT, 3, &m), 0);
    CU_ASSERT_EQUAL(m, 1);
    CU_ASSERT_EQUAL(pstats(s).corrupt_dropped, 1);
    CU_ASSERT_EQUAL(stats(s).evictions[KVS_EVICT_CORRUPT], 1);
    CU_ASSERT_EQUAL(kvs_store_lease_release(s, lease), 0); /* the record outlives its blocks */
    store_test_assert_ok(s);
    kvs_store_close(s);
    CU_ASSERT_EQUAL(count_files(dir), 0);
    rm_dir(dir);
}

static void test_ssd_torn(void)
{
    corrupt_case(0);
}
static void test_ssd_flipped(void)
{
    corrupt_case(1);
}
static void test_ssd_header(void)
{
    corrupt_case(2);
}
static void test_ssd_empty(void)
{
    corrupt_case(3);
}

/* The fault scenario: writes (chains of 3, forcing demotion when there is an
 * SSD), reads, deletes; every status is checked against what may fail. */
static void fault_run(int tier, uint32_t every, int status)
{
    char *dir = tier == 2 ? mk_dir() : NULL;
    kvs_store_payload_opts po = {.capacity_bytes = 6 * 5120,
                                 .ssd_dir = dir,
                                 .fault_tier = tier,
                                 .fault_every = every,
                                 .fault_status = status};
    kvs_store *s = open_p(0, "lru", &po);
    chain_t c[6];
    int committed[6][3] = {{0}};
    for (uint32_t k = 0; k < 6; k++) {
        mk_chain(2000 + 10 * k, 3, &c[k]);
        for (size_t i = 0; i < 3; i++) {
            int rc = put(s, &c[k], i, 0, 4000, 0);
            if (tier == 1) {
                CU_ASSERT(rc == 0 || rc == status || rc == KVS_EPRECOND || rc == KVS_ENOSPC);
            } else {
                /* SSD faults never fail a write: a failed demotion drops instead. */
                CU_ASSERT(rc == 0 || rc == KVS_EPRECOND);
            }
            committed[k][i] = rc == 0;
            /* Nothing half-visible: visible exactly when committed and not evicted since. */
            if (rc != 0)
                CU_ASSERT_EQUAL(kvs_store_contains(s, &c[k].k[i]), 0);
            store_test_assert_ok(s);
        }
    }
    for (uint32_t k = 0; k < 6; k++)
        for (size_t i = 0; i < 3; i++) {
            kvs_store_ref r;
            int rc = kvs_store_read(s, &c[k].k[i], &r);
            if (rc == 0) {
                CU_ASSERT(committed[k][i]);
                CU_ASSERT_EQUAL(r.size, 4000);
                CU_ASSERT(same(&c[k].k[i], r.data, r.size));
                kvs_store_read_release(s, &r);
            } else {
                CU_ASSERT(rc == KVS_ENOTFOUND || rc == status || rc == KVS_ENOSPC);
                if (rc == KVS_ENOTFOUND)
                    CU_ASSERT_EQUAL(kvs_store_contains(s, &c[k].k[i]), 0);
            }
            store_test_assert_ok(s);
        }
    kvs_store_payload_stats ps = pstats(s);
    if (tier == 2 && status == KVS_EIO)
        CU_ASSERT(ps.io_errors > 0);
    for (uint32_t k = 0; k < 6; k++) {
        int rc = kvs_store_delete(s, &c[k].k[0], 1);
        CU_ASSERT(rc == 0 || rc == KVS_ENOTFOUND);
    }
    ps = pstats(s);
    CU_ASSERT_EQUAL(ps.used_bytes, 0);
    CU_ASSERT_EQUAL(ps.bytes[KVS_TIER_DRAM], 0);
    CU_ASSERT_EQUAL(ps.bytes[KVS_TIER_SSD], 0);
    CU_ASSERT_EQUAL(ps.reserved_bytes, 0);
    CU_ASSERT_EQUAL(stats(s).blocks, 0);
    store_test_assert_ok(s);
    kvs_store_close(s);
    if (dir) {
        CU_ASSERT_EQUAL(count_files(dir), 0);
        rm_dir(dir);
    }
}

static void test_fault_dram(void)
{
    for (uint32_t n = 1; n <= 8; n++) {
        fault_run(1, n, KVS_ENOSPC);
        fault_run(1, n, KVS_EIO);
    }
}

static void test_fault_ssd(void)
{
    for (uint32_t n = 1; n <= 8; n++) {
        fault_run(2, n, KVS_ENOSPC);
        fault_run(2, n, KVS_EIO);
    }
}

/* Every Nth DRAM allocation fails with EIO: with N = 1 nothing is ever stored. */
static void test_fault_exact(void)
{
    kvs_store_payload_opts po = {.fault_tier = 1, .fault_every = 1, .fault_status = KVS_EIO};
    kvs_store *s = open_p(0, NULL, &po);
    chain_t c;
    mk_chain(3000, 2, &c);
    CU_ASSERT_EQUAL(put(s, &c, 0, 0, 100, 0), KVS_EIO);
    CU_ASSERT_EQUAL(stats(s).blocks, 0);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, 0);
    kvs_store_close(s);
    po.fault_every = 2; /* ops 2, 4, ... fail */
    s = open_p(0, NULL, &po);
    CU_ASSERT_EQUAL(put(s, &c, 0, 0, 100, 0), 0);
    CU_ASSERT_EQUAL(put(s, &c, 1, 0, 100, 0), KVS_EIO);
    CU_ASSERT_EQUAL(put(s, &c, 1, 0, 100, 0), 0);
    CU_ASSERT_EQUAL(stats(s).blocks, 2);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static void test_slab_classes(void)
{
    /* Charges: at least the need, under 1.25x + 64 for slab sizes; a block
     * larger than a page takes whole pages. */
    kvs_store *s = open_p(0, NULL, &(kvs_store_payload_opts){.capacity_bytes = 1 << 20});
    chain_t c[40];
    uint64_t prev = 0;
    uint32_t sizes[] = {1, 100, 1000, 4000, 10000, 20000, 30000, 40000, 100000, 300000};
    for (uint32_t i = 0; i < 10; i++) {
        mk_chain(4000 + i, 1, &c[i]);
        CU_ASSERT_EQUAL_FATAL(put(s, &c[i], 0, 0, sizes[i], 0), 0);
        uint64_t u = pstats(s).used_bytes, ch = u - prev;
        CU_ASSERT(ch >= sizes[i] + 64);
        CU_ASSERT(ch <= (sizes[i] + 64) * 5 / 4 + 64 || ch % 32768 == 0);
        prev = u;
        CU_ASSERT_EQUAL(read_ok(s, &c[i], 0, NULL), 0);
    }
    for (uint32_t i = 0; i < 10; i++)
        CU_ASSERT_EQUAL(kvs_store_delete(s, &c[i].k[0], 0), 0);
    CU_ASSERT_EQUAL(pstats(s).used_bytes, 0);
    /* Pages come back: the arena refills with another class entirely. */
    for (uint32_t i = 0; i < 30; i++) { /* one 20 KB chunk per 32 KiB page: 32 fit */
        mk_chain(5000 + i, 1, &c[i]);
        CU_ASSERT_EQUAL(put(s, &c[i], 0, 0, 20000, 0), 0);
    }
    CU_ASSERT_EQUAL(stats(s).evictions[KVS_EVICT_WATERMARK], 0);
    CU_ASSERT_EQUAL(stats(s).blocks, 30);
    store_test_assert_ok(s);
    kvs_store_close(s);
}

/* ---- the arena itself: waste, overlap, charge, return ------------------- */

typedef struct ablk {
    uint8_t *p;
    uint64_t size;
} ablk;

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static int by_addr(const void *x, const void *y)
{
    const ablk *a = x, *b = y;
    return a->p < b->p ? -1 : a->p > b->p;
}

/* Tags a block at its first and last 8 bytes (a fresh slab stays mostly
 * untouched, so the test's memory stays small) with its index. */
static void tag(const ablk *b, uint64_t i)
{
    uint64_t v = i * 0x9E3779B97F4A7C15ull + b->size;
    memcpy(b->p, &v, 8);
    memcpy(b->p + b->size - 8, &v, 8);
}
static int tag_ok(const ablk *b, uint64_t i)
{
    uint64_t v = i * 0x9E3779B97F4A7C15ull + b->size, x, y;
    memcpy(&x, b->p, 8);
    memcpy(&y, b->p + b->size - 8, 8);
    return x == v && y == v;
}

/* Allocates blocks of size (or random sizes in [64, rmax] when size is 0)
 * until the arena says KVS_ENOSPC; checks the charge of every one, tags,
 * no overlap and the invariants; frees all in random order (checking the
 * invariants as it goes) and checks the arena is whole again. Returns the
 * payload bytes held when full; *usedp the charged bytes then. */
static uint64_t arena_fill(kvs__arena *a, uint64_t size, uint64_t rmax, uint64_t *usedp)
{
    size_t len;
    uint8_t *base = kvs__arena_region(a, &len);
    ablk *b = calloc(1u << 16, sizeof *b);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    uint32_t n = 0, misses = 0;
    uint64_t payload = 0;
    while (n < (1u << 16)) {
        uint64_t sz = size ? size : 64 + rnd() % (rmax - 63);
        uint64_t before = kvs__arena_used(a);
        void *p;
        int rc = kvs__arena_alloc(a, sz, &p);
        if (rc) {
            CU_ASSERT_EQUAL(rc, KVS_ENOSPC);
            CU_ASSERT_EQUAL(kvs__arena_used(a), before);
            if (size || ++misses == 64) /* random sizes: until 64 in a row fail */
                break;
            continue;
        }
        misses = 0;
        CU_ASSERT_EQUAL(kvs__arena_used(a) - before, kvs__arena_charge(a, sz)); /* (d) */
        CU_ASSERT_EQUAL((uintptr_t)p % 64, 0);
        CU_ASSERT((uint8_t *)p >= base && (uint8_t *)p + sz <= base + len);
        b[n] = (ablk){p, sz};
        tag(&b[n], n);
        payload += sz;
        n++;
    }
    CU_ASSERT_EQUAL(kvs__arena_check(a), 0);
    for (uint32_t i = 0; i < n; i++) /* (b): no block wrote over another's tags */
        CU_ASSERT(tag_ok(&b[i], i));
    *usedp = kvs__arena_used(a);
    qsort(b, n, sizeof *b, by_addr); /* (b): no two ranges overlap */
    for (uint32_t i = 1; i < n; i++)
        CU_ASSERT(b[i - 1].p + b[i - 1].size <= b[i].p);
    for (uint32_t i = n; i > 1; i--) { /* random order */
        uint32_t j = (uint32_t)(rnd() % i);
        ablk t = b[i - 1];
        b[i - 1] = b[j];
        b[j] = t;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t before = kvs__arena_used(a);
        kvs__arena_free(a, b[i].p, b[i].size);
        CU_ASSERT_EQUAL(before - kvs__arena_used(a), kvs__arena_charge(a, b[i].size)); /* (d) */
        if (i % 16 == 0)
            CU_ASSERT_EQUAL(kvs__arena_check(a), 0);
    }
    uint32_t np, nf; /* (c): all of it back, lowfree right (kvs__arena_check) */
    kvs__arena_pages(a, &np, &nf);
    CU_ASSERT_EQUAL(nf, np);
    CU_ASSERT_EQUAL(kvs__arena_used(a), 0);
    CU_ASSERT_EQUAL(kvs__arena_check(a), 0);
    free(b);
    return payload;
}

static void test_arena_waste(void)
{
    /* 1 GiB: 256 pages of 4 MiB. With one page per slab, blocks just over P/2
     * filled half the arena and blocks just over 2P one per 3 pages. The test
     * touches 16 bytes a block: without huge pages, a few MiB. */
    kvs__arena *a;
    CU_ASSERT_EQUAL_FATAL(kvs__arena_open(1u << 30, 0, &a), 0);
    size_t len;
    void *region = kvs__arena_region(a, &len);
    madvise(region, len, MADV_NOHUGEPAGE); /* advice only */
    uint32_t np, nf;
    kvs__arena_pages(a, &np, &nf);
    CU_ASSERT_EQUAL_FATAL(np, 256);
    uint64_t P = len / np;
    CU_ASSERT_EQUAL_FATAL(P, 4u << 20);
    uint64_t sizes[] = {P / 2 + 64, P / 2 + 4160, 2 * P / 3,  3 * P / 4 + 64, P - 64,
                        P,          P + 64,       2 * P + 64, 2 * P + P / 3,  4 * P + 64,
                        8 * P + 64, 9 * P + 4096};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        uint64_t used, payload = arena_fill(a, sizes[i], 0, &used);
        /* (a): the charge takes what a block needs within the class rounding,
         * and full, the arena holds what its bytes and the charge allow. */
        CU_ASSERT(used * 100 >= (uint64_t)len * 85);
        CU_ASSERT(payload * 100 >= (uint64_t)len * 75);
        if (payload * 100 < (uint64_t)len * 75 || used * 100 < (uint64_t)len * 85)
            fprintf(stderr, "size %.3f P: used %.3f payload %.3f of the arena\n",
                    (double)sizes[i] / (double)P, (double)used / (double)len,
                    (double)payload / (double)len);
    }
    /* Mixed sizes up to 10 pages, twice (the second fill reuses the pages the
     * first gave back), then small blocks: pages went back to the pool. */
    for (int r = 0; r < 2; r++) {
        uint64_t used, payload = arena_fill(a, 0, 10 * P, &used);
        CU_ASSERT(payload * 100 >= (uint64_t)len * 60);
    }
    uint64_t used, payload = arena_fill(a, 0, P / 4, &used);
    CU_ASSERT(payload * 100 >= (uint64_t)len * 60);
    /* Heap-backed: the same charges, the same bookkeeping of used. */
    kvs__arena *h;
    CU_ASSERT_EQUAL_FATAL(kvs__arena_open(0, 0, &h), 0);
    void *p;
    CU_ASSERT_EQUAL(kvs__arena_alloc(h, P / 2 + 64, &p), 0);
    CU_ASSERT_EQUAL(kvs__arena_used(h), kvs__arena_charge(h, P / 2 + 64));
    CU_ASSERT(kvs__arena_charge(h, P / 2 + 64) <= (P / 2 + 64) * 9 / 8 + 64);
    kvs__arena_free(h, p, P / 2 + 64);
    CU_ASSERT_EQUAL(kvs__arena_used(h), 0);
    kvs__arena_close(h);
    kvs__arena_close(a);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"bad_opts", test_bad_opts},
        {"two_phase", test_two_phase},
        {"saturated_parent_pins", test_saturated_parent_pins},
        {"read_ref_outlives_delete_and_eviction", test_read_ref_outlives},
        {"leases_expiry_release_tenant", test_leases},
        {"many_leases", test_many_leases},
        {"quotas", test_quotas},
        {"write_check_evicts_nothing", test_write_check},
        {"watermarks_and_tunables", test_watermarks},
        {"priority", test_priority},
        {"ssd_demote_promote", test_ssd_tier},
        {"ssd_interplay", test_ssd_interplay},
        {"ssd_read_saturated_holds", test_ssd_read_saturated_holds},
        {"ssd_torn_file", test_ssd_torn},
        {"ssd_flipped_byte", test_ssd_flipped},
        {"ssd_flipped_header", test_ssd_header},
        {"ssd_empty_file", test_ssd_empty},
        {"fault_dram_every_n", test_fault_dram},
        {"fault_ssd_every_n", test_fault_ssd},
        {"fault_exact", test_fault_exact},
        {"slab_classes", test_slab_classes},
        {"arena_waste_overlap_charge", test_arena_waste},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_payload", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
