/*
 * test_store_sim.c — trace loading and replay (store/trace.h), the engine of
 * kvstash-sim.
 *
 * A six-request trace whose prefix hits were worked out by hand for LRU at
 * capacity 3 and for an unbounded cache; malformed lines (each must be named
 * by number); generator determinism; and a replay of every generated mix under
 * every policy with the store's full invariant check every few requests; put
 * lines (store/testdata/puts.jsonl) inserted but not counted as demand.
 */
#include "kvs_error.h"
#include "kvs_test.h"
#include "trace.h"

#include <stdio.h>
#include <string.h>

/* Hand-worked, LRU, capacity 3 (touches are leaf-first on a hit):
 *  r1 [1,2]   hits 0  insert 1,2            cache {1,2}
 *  r2 [1,2,3] hits 2  insert 3              cache {1,2,3}
 *  r3 [1,4]   hits 1  insert 4: the only evictable leaf is 3 -> {1,2,4}
 *  r4 [1,2,3] hits 2  insert 3: leaves 4 (2 is the parent) -> {1,2,3}
 *  r5 [5]     hits 0  insert 5: leaf 3 -> {1,2,5}
 *  r6 [1,2,3] hits 2  insert 3: leaf 5 -> {1,2,3}
 * requested 14, hits 7. Unbounded: 0+2+1+3+0+3 = 9. */
static const char *TINY = "{\"hash_ids\": [1, 2]}\n"
                          "{\"timestamp\": 1, \"hash_ids\": [1, 2, 3]}\n"
                          "\n"
                          "{\"hash_ids\": [1, 4], \"input_length\": 1024}\n"
                          "{\"hash_ids\": [1, 2, 3]}\n"
                          "{\"hash_ids\": [5]}\n"
                          "  {\"hash_ids\": [1, 2, 3]}  \n";

static kvs_trace *load_str(const char *text, int *rc, char *err, size_t errlen)
{
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    kvs_trace *t = NULL;
    *rc = kvs_trace_load(f, "mem", &t, err, errlen);
    fclose(f);
    return t;
}

static void test_tiny_by_hand(void)
{
    int rc;
    char err[KVS_ERR_LEN] = "";
    kvs_trace *t = load_str(TINY, &rc, err, sizeof err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(t->nreq, 6);
    CU_ASSERT_EQUAL(t->nblocks, 14);
    kvs_replay_result r;
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "lru", 3, 1, &r, err, sizeof err), 0);
    CU_ASSERT_EQUAL(r.requested, 14);
    CU_ASSERT_EQUAL(r.hits, 7);
    CU_ASSERT_EQUAL(r.evictions, 4); /* r3, r4, r5, r6 */
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "leaflru", 3, 1, &r, err, sizeof err), 0);
    CU_ASSERT_EQUAL(r.hits, 7);
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "lru", 1000, 1, &r, err, sizeof err), 0);
    CU_ASSERT_EQUAL(r.hits, 9);
    CU_ASSERT_EQUAL(r.evictions, 0);
    /* Belady at capacity 3: r3 must evict 3 (the only leaf), r4 evicts 4, r5
     * evicts 3 (next use r6) — no choice anywhere, so also 7. */
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "belady", 3, 1, &r, err, sizeof err), 0);
    CU_ASSERT_EQUAL(r.hits, 7);
    CU_ASSERT_NOT_EQUAL(kvs_trace_replay(t, "nope", 3, 1, &r, err, sizeof err), 0);
    kvs_trace_free(t);
}

static void expect_bad(const char *text, const char *where, const char *why)
{
    int rc;
    char err[KVS_ERR_LEN] = "";
    kvs_trace *t = load_str(text, &rc, err, sizeof err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    CU_ASSERT_PTR_NULL(t);
    if (!strstr(err, where) || !strstr(err, why))
        fprintf(stderr, "unexpected message: %s\n", err);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, where));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, why));
}

static void test_malformed(void)
{
    expect_bad("{\"hash_ids\": [1]}\n{\"hash_ids\": [1, 2}\n", "mem:2:", "not valid JSON");
    expect_bad("{\"hash_ids\": [1]}\n\n{\"hash\": [1]}\n", "mem:3:", "no \"hash_ids\" array");
    expect_bad("{\"hash_ids\": [1, -2]}\n", "mem:1:", "integer");
    expect_bad("{\"hash_ids\": [1, 4294967296]}\n", "mem:1:", "integer");
    expect_bad("{\"hash_ids\": [1, 2.5]}\n", "mem:1:", "integer");
    expect_bad("{\"hash_ids\": [1]}\n[1, 2]\n", "mem:2:", "not a JSON object");
    expect_bad("{\"hash_ids\": [1]} {\"hash_ids\": [2]}\n", "mem:1:", "trailing");
    expect_bad("{\"hash_ids\": \"1,2\"}\n", "mem:1:", "hash_ids");
    /* Empty arrays and the largest id are fine. */
    int rc;
    char err[KVS_ERR_LEN];
    kvs_trace *t = load_str("{\"hash_ids\": []}\n{\"hash_ids\": [4294967295]}\n", &rc, err,
                            sizeof err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(t->nreq, 2);
    CU_ASSERT_EQUAL(t->ids[0], 4294967295u);
    kvs_trace_free(t);
}

static void test_generators(void)
{
    static const char *kinds[] = {"chat", "sysprompt", "docs", "mix"};
    for (int k = 0; k < 4; k++) {
        kvs_trace *a, *b, *c;
        CU_ASSERT_EQUAL_FATAL(kvs_trace_generate(kinds[k], 600, 5, &a), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_trace_generate(kinds[k], 600, 5, &b), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_trace_generate(kinds[k], 600, 6, &c), 0);
        CU_ASSERT_EQUAL(a->nreq, 600);
        CU_ASSERT_EQUAL(a->nblocks, b->nblocks);
        CU_ASSERT_EQUAL(memcmp(a->ids, b->ids, a->nblocks * sizeof *a->ids), 0);
        CU_ASSERT(c->nblocks != a->nblocks ||
                  memcmp(a->ids, c->ids, a->nblocks * sizeof *a->ids) != 0);
        /* Round trip through JSONL. */
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        CU_ASSERT_EQUAL(kvs_trace_write(a, f), 0);
        fclose(f);
        int rc;
        char err[KVS_ERR_LEN];
        kvs_trace *d = load_str(buf, &rc, err, sizeof err);
        CU_ASSERT_EQUAL_FATAL(rc, 0);
        CU_ASSERT_EQUAL(d->nblocks, a->nblocks);
        CU_ASSERT_EQUAL(memcmp(a->ids, d->ids, a->nblocks * sizeof *a->ids), 0);
        free(buf);
        /* Every policy replays it with all invariants intact; Belady is an
         * upper bound for the online policies (checked loosely: >=). */
        kvs_replay_result r, bel;
        CU_ASSERT_EQUAL(kvs_trace_replay(a, "belady", 150, 50, &bel, err, sizeof err), 0);
        static const char *pol[] = {"lru", "leaflru", "lfu", "s3fifo", "prefix"};
        for (int p = 0; p < 5; p++) {
            CU_ASSERT_EQUAL(kvs_trace_replay(a, pol[p], 150, 50, &r, err, sizeof err), 0);
            CU_ASSERT_EQUAL(r.requested, a->nblocks);
            CU_ASSERT(r.hits <= bel.hits);
        }
        kvs_trace_free(a);
        kvs_trace_free(b);
        kvs_trace_free(c);
        kvs_trace_free(d);
    }
    kvs_trace *t;
    CU_ASSERT_EQUAL(kvs_trace_generate("nope", 10, 1, &t), KVS_EINVAL);
}

/* store/testdata/puts.jsonl, as kvstashd --record-trace writes it: lookup [1,2];
 * put [9], put [9,10] (blocks put with no Lookup naming them); lookup
 * [9,10,11]; lookup [1,2,3] (no "op": a lookup). Put lines insert and are not
 * demand: requested = 2 + 3 + 3 = 8 blocks.
 *  Unbounded: hits 0 + 2 (9,10 put earlier) + 2 (1,2) = 4 -> 0.5000.
 *  LRU, capacity 3 (a new block's parent cannot be its victim):
 *   [1,2] miss, insert 1,2 {1,2}; put 9 {1,2,9}; put [9,10]: 9 accessed,
 *   10 evicts the only other leaf 2 {1,9,10}; lookup [9,10,11] hits 2, 11
 *   evicts leaf 1 {9,10,11}; lookup [1,2,3] hits 0, 1 evicts 11, 2 evicts
 *   10, 3 evicts 9 {1,2,3}: hits 2 -> 0.2500, 5 evictions. */
#ifndef KVS_STORE_TESTDATA
#error "KVS_STORE_TESTDATA (the store/testdata directory) must be defined"
#endif

static void test_put_lines(void)
{
    char err[KVS_ERR_LEN] = "";
    FILE *f = fopen(KVS_STORE_TESTDATA "/puts.jsonl", "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    kvs_trace *t = NULL;
    int rc = kvs_trace_load(f, "puts.jsonl", &t, err, sizeof err);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(t->nreq, 5);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t->put);
    static const uint8_t want_put[5] = {0, 1, 1, 0, 0};
    CU_ASSERT_EQUAL(memcmp(t->put, want_put, 5), 0);
    kvs_replay_result r;
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "lru", 1000, 1, &r, err, sizeof err), 0);
    CU_ASSERT_EQUAL(r.requested, 8);
    CU_ASSERT_EQUAL(r.hits, 4);
    CU_ASSERT_EQUAL(r.put_blocks, 3);
    CU_ASSERT_EQUAL(r.evictions, 0);
    CU_ASSERT_EQUAL(kvs_trace_replay(t, "lru", 3, 1, &r, err, sizeof err), 0);
    CU_ASSERT_EQUAL(r.requested, 8);
    CU_ASSERT_EQUAL(r.hits, 2);
    CU_ASSERT_EQUAL(r.evictions, 5);
    /* Every policy, Belady included (put lines are not uses), replays it with
     * every invariant checked after each line. */
    for (const char *p[] = {"leaflru", "lfu", "s3fifo", "prefix", "belady", NULL}, **q = p; *q;
         q++) {
        CU_ASSERT_EQUAL(kvs_trace_replay(t, *q, 3, 1, &r, err, sizeof err), 0);
        CU_ASSERT_EQUAL(r.requested, 8);
        CU_ASSERT(r.hits <= 4);
    }
    /* Written back out, the put lines stay put lines. */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    CU_ASSERT_EQUAL(kvs_trace_write(t, m), 0);
    fclose(m);
    CU_ASSERT_EQUAL(strstr(buf, "\"op\": \"put\"") != NULL, 1);
    kvs_trace *d = load_str(buf, &rc, err, sizeof err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d->put);
    CU_ASSERT_EQUAL(memcmp(d->put, want_put, 5), 0);
    CU_ASSERT_EQUAL(d->nblocks, t->nblocks);
    free(buf);
    kvs_trace_free(d);
    kvs_trace_free(t);
    /* A trace of lookups only has no put flags; a bad "op" names its line. */
    d = load_str("{\"hash_ids\": [1], \"op\": \"lookup\"}\n", &rc, err, sizeof err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_PTR_NULL(d->put);
    kvs_trace_free(d);
    expect_bad("{\"hash_ids\": [1]}\n{\"hash_ids\": [1], \"op\": \"delete\"}\n", "mem:2:",
               "\"op\" is neither");
    expect_bad("{\"hash_ids\": [1], \"op\": 1}\n", "mem:1:", "\"op\" is neither");
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"tiny_by_hand", test_tiny_by_hand},
        {"malformed", test_malformed},
        {"generators", test_generators},
        {"put_lines", test_put_lines},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_sim", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
