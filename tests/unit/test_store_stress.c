/*
 * test_store_stress.c — the store from many threads at once (issue 4 item 7).
 *
 * Writers put chains (two-phase, some aborted), readers look up with leases
 * and read every matched block, checking its bytes while other threads evict,
 * demote to SSD, promote, delete, pin, change tunables and switch policy; one
 * thread does the administrative calls. A payload's bytes are a function of its
 * key, so a reader that saw freed or reused memory fails the byte check (and
 * ASan/TSan see the access). At the end every invariant holds and, with all
 * blocks deleted, no byte is left charged. A second case runs plain lookups
 * (the read side of the store lock) from many threads beside one writer and
 * checks what they match and that no access is lost. Built and run under ThreadSanitizer
 * by tests/run-all.sh (ctest label tsan).
 */
#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"
#include "store_test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NCHAINS 48
#define DEPTH   4
#define WRITERS 3
#define READERS 3
#define OPS     1500

static kvs_key g_keys[NCHAINS][DEPTH];
static uint32_t g_tok[NCHAINS][DEPTH * BT];
static kvs_store *g_s;
static atomic_uint g_bad, g_reads, g_commits, g_corrupt;
static atomic_int g_writers_left; /* readers go on until every writer is done */

static uint64_t size_of(int c, int i)
{
    return 1000 + (uint64_t)((c * 7 + i * 13) % 9) * 700;
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void *writer(void *arg)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uintptr_t)arg;
    for (int op = 0; op < OPS; op++) {
        int c = (int)(rnd(&x) % NCHAINS), n = 1 + (int)(rnd(&x) % DEPTH);
        for (int i = 0; i < n; i++) {
            uint64_t size = size_of(c, i);
            kvs_store_put p = {.key = &g_keys[c][i],
                               .parent = i ? &g_keys[c][i - 1] : NULL,
                               .tenant = (kvs_tenant_id)(c % 3),
                               .tokens = g_tok[c] + i * BT,
                               .n_tokens = BT,
                               .size = size,
                               .priority = (int8_t)(c % 5 == 0)};
            kvs_store_wr *w;
            void *buf;
            int rc = kvs_store_write_begin(g_s, &p, &w, &buf);
            if (rc == KVS_EEXIST)
                continue;
            if (rc) {
                if (rc != KVS_EPRECOND && rc != KVS_ENOSPC)
                    atomic_fetch_add(&g_bad, 1);
                break;
            }
            uint8_t *b = buf;
            for (uint64_t j = 0; j < size; j++)
                b[j] = pat(&g_keys[c][i], j);
            if (rnd(&x) % 16 == 0) {
                kvs_store_write_abort(g_s, w);
                break;
            }
            rc = kvs_store_write_commit(g_s, w);
            if (rc == 0)
                atomic_fetch_add(&g_commits, 1);
            else if (rc != KVS_EEXIST && rc != KVS_EPRECOND && rc != KVS_ENOSPC)
                atomic_fetch_add(&g_bad, 1);
            if (rc && rc != KVS_EEXIST)
                break;
        }
    }
    atomic_fetch_sub(&g_writers_left, 1);
    return NULL;
}

static void *reader(void *arg)
{
    uint64_t x = 0x2545f4914f6cdd1dull ^ (uintptr_t)arg;
    /* At least OPS lookups, and on until the writers are done: on a loaded
     * machine the readers could otherwise finish before a block is stored. */
    for (int op = 0; op < OPS || atomic_load(&g_writers_left) > 0; op++) {
        int c = (int)(rnd(&x) % NCHAINS);
        size_t m = 0;
        uint64_t lease = 0;
        if (rnd(&x) % 4 == 0) { /* the plain lookup (no lease, any tenant) races too */
            if (kvs_store_lookup(g_s, g_keys[c], g_tok[c], BT, DEPTH, &m) != 0 || m > DEPTH)
                atomic_fetch_add(&g_bad, 1);
            continue;
        }
        int rc = kvs_store_lookup_leased(g_s, (kvs_tenant_id)(c % 3), g_keys[c], g_tok[c], BT,
                                         DEPTH, 1 + (uint32_t)(rnd(&x) % 20), &m, &lease);
        if (rc) {
            atomic_fetch_add(&g_bad, 1);
            continue;
        }
        for (size_t i = 0; i < m; i++) {
            kvs_store_ref r;
            rc = kvs_store_read(g_s, &g_keys[c][i], &r);
            if (rc == KVS_EFORMAT)
                atomic_fetch_add(&g_corrupt, 1); /* never expected: files are not touched */
            if (rc) {
                /* An expired lease lets a block go between lookup and read. */
                if (rc != KVS_ENOTFOUND && rc != KVS_ENOMEM)
                    atomic_fetch_add(&g_bad, 1);
                continue;
            }
            const uint8_t *b = r.data;
            int ok = r.size == size_of(c, (int)i);
            for (uint64_t j = 0; ok && j < r.size; j++)
                ok = b[j] == pat(&g_keys[c][i], j);
            if (!ok)
                atomic_fetch_add(&g_bad, 1);
            atomic_fetch_add(&g_reads, 1);
            if (rnd(&x) % 4 == 0)
                usleep(50); /* hold the reference while others evict */
            kvs_store_read_release(g_s, &r);
        }
        if (lease && rnd(&x) % 2)
            kvs_store_lease_release(g_s, lease); /* the others expire */
    }
    return NULL;
}

static void *admin(void *arg)
{
    uint64_t x = 0x853c49e6748fea9bull ^ (uintptr_t)arg;
    static const char *pols[] = {"lru", "s3fifo", "lfu", "leaf-lru", "prefix"};
    for (int op = 0; op < OPS; op++) {
        int c = (int)(rnd(&x) % NCHAINS), i = (int)(rnd(&x) % DEPTH);
        switch (rnd(&x) % 8) {
        case 0:
            kvs_store_delete(g_s, &g_keys[c][i], (int)(rnd(&x) % 2));
            break;
        case 1:
            if (kvs_store_pin_ex(g_s, &g_keys[c][i], (int8_t)(rnd(&x) % 3), 5) == 0)
                break;
            break;
        case 2:
            if (kvs_store_pin(g_s, &g_keys[c][i]) == 0)
                kvs_store_unpin(g_s, &g_keys[c][i]);
            break;
        case 3:
            kvs_store_set_watermarks(g_s, 0.9, 0.5 + 0.1 * (double)(rnd(&x) % 4));
            break;
        case 4:
            kvs_store_set_capacity_bytes(g_s, (96 + rnd(&x) % 64) * 1024);
            break;
        case 5:
            kvs_store_set_quota(g_s, (kvs_tenant_id)(rnd(&x) % 3),
                                rnd(&x) % 2 ? 0 : (64 + rnd(&x) % 64) * 1024);
            break;
        case 6:
            if (op % 50 == 0)
                kvs_store_set_policy(g_s, pols[rnd(&x) % 5]);
            break;
        default: {
            kvs_store_payload_stats ps;
            kvs_store_get_payload_stats(g_s, &ps);
            kvs_store_info info;
            kvs_store_info_get(g_s, &g_keys[c][i], &info);
            char err[KVS_ERR_LEN];
            if (op % 100 == 0 && kvs_store_check(g_s, err, sizeof err) != 0) {
                fprintf(stderr, "check: %s\n", err);
                atomic_fetch_add(&g_bad, 1);
            }
        }
        }
    }
    return NULL;
}

static void run(const char *ssd_dir)
{
    for (int c = 0; c < NCHAINS; c++) {
        for (int i = 0; i < DEPTH * BT; i++)
            g_tok[c][i] = (uint32_t)(c * 1009 + i);
        CU_ASSERT_EQUAL_FATAL(
            kvs_key_chain(&g_ns, (const uint8_t *)"x", 1, g_tok[c], DEPTH, g_keys[c]), 0);
    }
    kvs_store_opts o = {.capacity_blocks = 120, .policy = "lru", .verify_chain = 1};
    kvs_store_payload_opts po = {.capacity_bytes = 160 * 1024,
                                 .high_watermark = 0.9,
                                 .low_watermark = 0.7,
                                 .ssd_dir = ssd_dir,
                                 .ssd_capacity_bytes = 256 * 1024};
    CU_ASSERT_EQUAL_FATAL(kvs_store_open_ex(&o, &po, &g_s), 0);
    atomic_store(&g_bad, 0);
    atomic_store(&g_reads, 0);
    atomic_store(&g_commits, 0);
    atomic_store(&g_corrupt, 0);
    atomic_store(&g_writers_left, WRITERS);
    pthread_t th[WRITERS + READERS + 1];
    int n = 0;
    for (int i = 0; i < WRITERS; i++)
        pthread_create(&th[n++], NULL, writer, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < READERS; i++)
        pthread_create(&th[n++], NULL, reader, (void *)(uintptr_t)(i + 11));
    pthread_create(&th[n++], NULL, admin, (void *)(uintptr_t)99);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    CU_ASSERT_EQUAL(atomic_load(&g_bad), 0);
    CU_ASSERT_EQUAL(atomic_load(&g_corrupt), 0);
    CU_ASSERT(atomic_load(&g_reads) > 100);
    CU_ASSERT(atomic_load(&g_commits) > 100);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_store_check(g_s, err, sizeof err);
    if (rc)
        fprintf(stderr, "check: %s\n", err);
    CU_ASSERT_EQUAL(rc, 0);
    kvs_store_stats st;
    kvs_store_payload_stats ps;
    kvs_store_get_stats(g_s, &st);
    kvs_store_get_payload_stats(g_s, &ps);
    fprintf(stderr,
            "stress(%s): commits=%u reads=%u evictions cap=%llu wm=%llu quota=%llu "
            "demote=%llu ssd_full=%llu promotions=%llu\n",
            ssd_dir ? "ssd" : "dram", atomic_load(&g_commits), atomic_load(&g_reads),
            (unsigned long long)st.evictions[KVS_EVICT_CAPACITY],
            (unsigned long long)st.evictions[KVS_EVICT_WATERMARK],
            (unsigned long long)st.evictions[KVS_EVICT_QUOTA],
            (unsigned long long)st.evictions[KVS_EVICT_DEMOTE],
            (unsigned long long)st.evictions[KVS_EVICT_SSD_FULL],
            (unsigned long long)ps.promotions);
    if (ssd_dir)
        CU_ASSERT(ps.demotions > 0);
    /* Let every lease and TTL pin end, drop all pins, delete everything. */
    usleep(30 * 1000);
    for (int c = 0; c < NCHAINS; c++)
        for (int i = 0; i < DEPTH; i++)
            while (kvs_store_unpin(g_s, &g_keys[c][i]) == 0) {
            }
    for (int c = 0; c < NCHAINS; c++) {
        rc = kvs_store_delete(g_s, &g_keys[c][0], 1);
        CU_ASSERT(rc == 0 || rc == KVS_ENOTFOUND);
    }
    kvs_store_get_stats(g_s, &st);
    kvs_store_get_payload_stats(g_s, &ps);
    CU_ASSERT_EQUAL(st.blocks, 0);
    CU_ASSERT_EQUAL(ps.used_bytes, 0);
    CU_ASSERT_EQUAL(ps.bytes[KVS_TIER_SSD], 0);
    kvs_store_close(g_s);
    g_s = NULL;
}

static void test_dram(void)
{
    run(NULL);
}

static void test_ssd(void)
{
    char dir[] = "/tmp/kvs-stress-XXXXXX";
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    run(dir);
    CU_ASSERT_EQUAL(rmdir(dir), 0); /* empty: every file removed */
}

/* ---- many readers, one writer (lookups on the read side) -----------------
 *
 * Metadata-only blocks, a small capacity so the writer evicts all the time,
 * and the policy switched under the readers. Chains 0..STABLE-1 are inserted
 * first with their leaf pinned, so they can never leave: a lookup of one must
 * match every block, and with one token changed in block k exactly k blocks.
 * Lookups of a chain with another chain's tokens match nothing. At the end the
 * store's lookup counters (kept in the read buffers until a writer drains
 * them) must equal what the readers did, to the block. */
#define RW_CHAINS  64
#define RW_DEPTH   6
#define RW_STABLE  4
#define RW_READERS 4
#define RW_OPS     4000
#define RW_MIN_WRITES 400

static kvs_key g_rk[RW_CHAINS][RW_DEPTH];
static uint32_t g_rt[RW_CHAINS][RW_DEPTH * BT];
static atomic_ullong g_rw_lookups, g_rw_asked, g_rw_hits;
static atomic_uint g_rw_done;

static void *rw_reader(void *arg)
{
    uint64_t x = 0x51a3c0ffee123457ull ^ (uintptr_t)arg;
    uint32_t tok[RW_DEPTH * BT];
    unsigned long long lookups = 0, asked = 0, hits = 0;
    for (int op = 0; op < RW_OPS; op++) {
        int c = (int)(rnd(&x) % RW_CHAINS), kind = (int)(rnd(&x) % 4);
        size_t m = 99, want_max = RW_DEPTH, want_min = 0;
        const uint32_t *t = g_rt[c];
        if (kind == 0) { /* a stable chain, whole */
            c %= RW_STABLE;
            t = g_rt[c];
            want_min = RW_DEPTH;
        } else if (kind == 1) { /* a stable chain, one token wrong in block k */
            c %= RW_STABLE;
            size_t k = rnd(&x) % RW_DEPTH;
            memcpy(tok, g_rt[c], sizeof tok);
            tok[k * BT + rnd(&x) % BT] ^= 0x40000000u;
            t = tok;
            want_min = want_max = k;
        } else if (kind == 2) { /* another chain's tokens */
            t = g_rt[(c + 1) % RW_CHAINS];
            want_max = 0;
        }
        if (kvs_store_lookup(g_s, g_rk[c], t, BT, RW_DEPTH, &m) != 0 || m < want_min ||
            m > want_max) {
            fprintf(stderr, "reader: chain %d kind %d matched %zu, want %zu..%zu\n", c, kind, m,
                    want_min, want_max);
            atomic_fetch_add(&g_bad, 1);
        }
        lookups++;
        asked += RW_DEPTH;
        hits += m;
        if (kind == 0 && kvs_store_contains(g_s, &g_rk[c][RW_DEPTH - 1]) != 1)
            atomic_fetch_add(&g_bad, 1);
    }
    atomic_fetch_add(&g_rw_lookups, lookups);
    atomic_fetch_add(&g_rw_asked, asked);
    atomic_fetch_add(&g_rw_hits, hits);
    atomic_fetch_add(&g_rw_done, 1);
    return NULL;
}

static void *rw_writer(void *arg)
{
    uint64_t x = 0xdeadbeefcafe1234ull ^ (uintptr_t)arg;
    static const char *pols[] = {"lru", "s3fifo", "lfu", "leaf-lru", "prefix"};
    /* At least RW_MIN_WRITES writes even when the readers finish first (a loaded
     * machine may not schedule this thread until then): the test needs evictions. */
    for (int op = 0; op < RW_MIN_WRITES || atomic_load(&g_rw_done) < RW_READERS; op++) {
        int c = RW_STABLE + (int)(rnd(&x) % (RW_CHAINS - RW_STABLE));
        size_t n = 1 + rnd(&x) % RW_DEPTH, ins = 0;
        int rc = kvs_store_insert_chain(g_s, g_rk[c], NULL, 0, g_rt[c], BT, n, 0, &ins);
        if (rc != 0 && rc != KVS_ENOSPC)
            atomic_fetch_add(&g_bad, 1);
        if (op % 7 == 0)
            kvs_store_delete(g_s, &g_rk[c][0], 1);
        if (op % 300 == 0)
            kvs_store_set_policy(g_s, pols[(op / 300) % 5]);
        char err[KVS_ERR_LEN];
        if (op % 500 == 0 && kvs_store_check(g_s, err, sizeof err) != 0) {
            fprintf(stderr, "check: %s\n", err);
            atomic_fetch_add(&g_bad, 1);
        }
    }
    return NULL;
}

static void test_readers_writer(void)
{
    for (int c = 0; c < RW_CHAINS; c++) {
        for (int i = 0; i < RW_DEPTH * BT; i++)
            g_rt[c][i] = (uint32_t)(c * 7919 + i * 3 + 1);
        CU_ASSERT_EQUAL_FATAL(
            kvs_key_chain(&g_ns, (const uint8_t *)"rw", 2, g_rt[c], RW_DEPTH, g_rk[c]), 0);
    }
    kvs_store_opts o = {.capacity_blocks = 48, .policy = "lru", .verify_chain = 1};
    CU_ASSERT_EQUAL_FATAL(kvs_store_open(&o, &g_s), 0);
    size_t ins;
    for (int c = 0; c < RW_STABLE; c++) {
        CU_ASSERT_EQUAL_FATAL(
            kvs_store_insert_chain(g_s, g_rk[c], NULL, 0, g_rt[c], BT, RW_DEPTH, 0, &ins), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_store_pin(g_s, &g_rk[c][RW_DEPTH - 1]), 0);
    }
    atomic_store(&g_bad, 0);
    atomic_store(&g_rw_lookups, 0);
    atomic_store(&g_rw_asked, 0);
    atomic_store(&g_rw_hits, 0);
    atomic_store(&g_rw_done, 0);
    pthread_t th[RW_READERS + 1];
    for (int i = 0; i < RW_READERS; i++)
        pthread_create(&th[i], NULL, rw_reader, (void *)(uintptr_t)(i + 1));
    pthread_create(&th[RW_READERS], NULL, rw_writer, (void *)(uintptr_t)77);
    for (int i = 0; i <= RW_READERS; i++)
        pthread_join(th[i], NULL);
    CU_ASSERT_EQUAL(atomic_load(&g_bad), 0);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_store_check(g_s, err, sizeof err);
    if (rc)
        fprintf(stderr, "check: %s\n", err);
    CU_ASSERT_EQUAL(rc, 0);
    kvs_store_stats st;
    kvs_store_get_stats(g_s, &st);
    CU_ASSERT_EQUAL(st.lookups, (uint64_t)RW_READERS * RW_OPS);
    CU_ASSERT_EQUAL(st.lookups, atomic_load(&g_rw_lookups));
    CU_ASSERT_EQUAL(st.lookup_blocks, atomic_load(&g_rw_asked));
    CU_ASSERT_EQUAL(st.hit_blocks, atomic_load(&g_rw_hits));
    CU_ASSERT(st.evictions[KVS_EVICT_CAPACITY] > 0);
    fprintf(stderr, "readers+writer: lookups=%llu hit_blocks=%llu inserts=%llu evictions=%llu\n",
            (unsigned long long)st.lookups, (unsigned long long)st.hit_blocks,
            (unsigned long long)st.inserts,
            (unsigned long long)st.evictions[KVS_EVICT_CAPACITY]);
    kvs_store_close(g_s);
    g_s = NULL;
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"threads_dram", test_dram},
        {"threads_dram_ssd", test_ssd},
        {"readers_one_writer", test_readers_writer},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_stress", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
