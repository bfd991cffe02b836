/*
 * test_data_lookup_async.c — kvs_client_lookup_async against a real kvstashd.
 *
 * Usage: test_data_lookup_async /path/to/kvstashd [threads]
 *
 * One kvstashd (no tenants, max_blocks_per_request 6) holds a 4-block chain.
 * Each test compares what the asynchronous call delivers with what the
 * synchronous kvs_client_lookup returns for the same prompt (keys, counts,
 * lease), and checks the contract of kvstash.h: every started call calls back
 * exactly once, drain and close wait for them, a call that returns an error
 * never calls back, and server-side errors arrive as the callback's status
 * with the server's reason.
 */
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <grpc/grpc.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BT       16u /* tokens per block */
#define NBLOCKS  4u  /* blocks stored */
#define LAYERS   2u
#define HEADS    2u
#define HEAD_DIM 32u

static const char *g_kvstashd;
static const char *g_threads = "2"; /* kvstashd --threads: argv[2] */
static kvs_server_proc g_srv;
static kvs_client *g_client;
static unsigned g_tokens[(NBLOCKS + 2) * BT]; /* stored chain, then 2 blocks never stored */
static unsigned char g_keys[NBLOCKS][KVS_CLIENT_KEY_LEN];

static kvs_ns make_ns(void)
{
    kvs_ns ns;
    memset(&ns, 0, sizeof ns);
    ns.model = "lookup-async-test";
    ns.salt = "";
    ns.num_layers = LAYERS;
    ns.num_kv_heads = HEADS;
    ns.head_dim = HEAD_DIM;
    ns.block_tokens = BT;
    ns.dtype = 1; /* fp16 */
    return ns;
}

static int suite_init(void)
{
    const char *const args[] = {
        "--threads", g_threads, "--log-level", "warn", "--max-blocks-per-request", "6", NULL};
    if (kvs_itest_start(g_kvstashd, args, &g_srv, "lookup_async") != 0)
        return 1;
    if (kvs_itest_open_client(g_srv.addr, NULL, 0, 30000, &g_client) != 0) {
        kvs_server_proc_kill(&g_srv);
        return 1;
    }
    for (unsigned i = 0; i < (NBLOCKS + 2) * BT; i++)
        g_tokens[i] = 1000u + i * 7u;
    /* The chain: NBLOCKS fp16 blocks of a fixed pattern. */
    kvs_ns ns = make_ns();
    size_t elems = (size_t)BT * HEADS * HEAD_DIM;
    uint16_t *buf = malloc(elems * 2 * sizeof *buf);
    if (buf == NULL)
        return 1;
    for (size_t i = 0; i < elems * 2; i++)
        buf[i] = (uint16_t)(0x3C00u | (i & 0x3FFu)); /* 1.0 .. 2.0 */
    const void *k[LAYERS], *v[LAYERS];
    for (unsigned l = 0; l < LAYERS; l++) {
        k[l] = buf;
        v[l] = buf + elems;
    }
    for (unsigned b = 0; b < NBLOCKS; b++) {
        kvs_put_args a;
        memset(&a, 0, sizeof a);
        a.ns = &ns;
        a.parent_key = b ? g_keys[b - 1] : NULL;
        a.index = b;
        a.tokens = g_tokens + (size_t)b * BT;
        a.scheme = 1;
        a.k = k;
        a.v = v;
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        char err[KVS_ERR_LEN] = "";
        if (kvs_client_put(g_client, &a, -1, &res, err) != 0) {
            fprintf(stderr, "put of block %u failed: %s\n", b, err);
            free(buf);
            return 1;
        }
        memcpy(g_keys[b], res.key, KVS_CLIENT_KEY_LEN);
    }
    free(buf);
    return 0;
}

static int suite_cleanup(void)
{
    kvs_client_close(g_client);
    g_client = NULL;
    return kvs_itest_stop(&g_srv, 10000);
}

/* What one callback saw. */
typedef struct outcome {
    atomic_int calls;
    int status;
    unsigned matched;
    size_t n_blocks;
    unsigned char keys[NBLOCKS][KVS_CLIENT_KEY_LEN];
    unsigned long long lease_id;
    char err[KVS_ERR_LEN];
    int err_null;
} outcome;

static void record(void *arg, int status, const kvs_lookup_result *res, const char *err)
{
    outcome *o = arg;
    o->status = status;
    o->err_null = err == NULL;
    if (err)
        snprintf(o->err, sizeof o->err, "%s", err);
    if (res) {
        o->matched = res->matched_blocks;
        o->n_blocks = res->n_blocks;
        o->lease_id = res->lease_id;
        for (size_t i = 0; i < res->n_blocks && i < NBLOCKS; i++)
            memcpy(o->keys[i], res->blocks[i].key, KVS_CLIENT_KEY_LEN);
    } else {
        o->matched = 9999;
    }
    atomic_fetch_add(&o->calls, 1);
}

/* The async result equals the sync one, prompt by prompt (0..NBLOCKS+2 blocks:
 * full hits, a partial hit and prompts longer than what is stored). */
static void test_same_as_sync(void)
{
    kvs_ns ns = make_ns();
    for (unsigned nb = 0; nb <= NBLOCKS + 2; nb++) {
        kvs_lookup_result *sr = NULL;
        char err[KVS_ERR_LEN] = "";
        CU_ASSERT_EQUAL_FATAL(
            kvs_client_lookup(g_client, &ns, g_tokens, (size_t)nb * BT, 0, -1, &sr, err), 0);
        outcome o;
        memset(&o, 0, sizeof o);
        CU_ASSERT_EQUAL_FATAL(
            kvs_client_lookup_async(g_client, &ns, g_tokens, (size_t)nb * BT, 0, -1, record, &o),
            0);
        kvs_client_drain(g_client);
        CU_ASSERT_EQUAL(atomic_load(&o.calls), 1);
        CU_ASSERT_EQUAL(o.status, 0);
        CU_ASSERT(o.err_null);
        unsigned want = nb < NBLOCKS ? nb : NBLOCKS;
        CU_ASSERT_EQUAL(sr->matched_blocks, want);
        CU_ASSERT_EQUAL(o.matched, want);
        CU_ASSERT_EQUAL(o.n_blocks, want);
        CU_ASSERT_EQUAL(o.lease_id != 0, want != 0);
        CU_ASSERT(o.lease_id != sr->lease_id || want == 0); /* each Lookup its own lease */
        for (unsigned i = 0; i < want; i++) {
            CU_ASSERT_EQUAL(memcmp(o.keys[i], g_keys[i], KVS_CLIENT_KEY_LEN), 0);
            CU_ASSERT_EQUAL(memcmp(sr->blocks[i].key, g_keys[i], KVS_CLIENT_KEY_LEN), 0);
        }
        kvs_lookup_result_free(sr);
    }
}

/* 64 calls outstanding at once, of varying prompt lengths: each calls back
 * once with its own answer; drain returns only after all of them. */
static void test_many_outstanding(void)
{
    kvs_ns ns = make_ns();
    enum { N = 64 };
    outcome *o = calloc(N, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (unsigned i = 0; i < N; i++)
        CU_ASSERT_EQUAL_FATAL(kvs_client_lookup_async(g_client, &ns, g_tokens,
                                                      (size_t)(i % (NBLOCKS + 1)) * BT + i % BT, 0,
                                                      -1, record, &o[i]),
                              0);
    kvs_client_drain(g_client);
    for (unsigned i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(atomic_load(&o[i].calls), 1);
        CU_ASSERT_EQUAL(o[i].status, 0);
        CU_ASSERT_EQUAL(o[i].matched, i % (NBLOCKS + 1));
        if (o[i].matched > 0)
            CU_ASSERT_EQUAL(
                memcmp(o[i].keys[o[i].matched - 1], g_keys[o[i].matched - 1], KVS_CLIENT_KEY_LEN),
                0);
    }
    free(o);
}

/* Closed loop: each callback starts the next Lookup of its client until it
 * made `rounds`, from the completion thread; 8 such clients at once. */
typedef struct looper {
    kvs_client *c;
    int rounds, done, errors;
} looper;

static void loop_cb(void *arg, int status, const kvs_lookup_result *res, const char *err)
{
    (void)err;
    looper *l = arg;
    if (status != 0 || res == NULL || res->matched_blocks != NBLOCKS)
        l->errors++;
    if (++l->done < l->rounds) {
        kvs_ns ns = make_ns();
        if (kvs_client_lookup_async(l->c, &ns, g_tokens, NBLOCKS * BT, 0, -1, loop_cb, l) != 0)
            l->errors++;
    }
}

static void test_closed_loop(void)
{
    kvs_ns ns = make_ns();
    looper l[8];
    for (int i = 0; i < 8; i++) {
        l[i] = (looper){.c = g_client, .rounds = 50};
        CU_ASSERT_EQUAL_FATAL(
            kvs_client_lookup_async(g_client, &ns, g_tokens, NBLOCKS * BT, 0, -1, loop_cb, &l[i]),
            0);
    }
    kvs_client_drain(g_client);
    for (int i = 0; i < 8; i++) {
        CU_ASSERT_EQUAL(l[i].done, 50);
        CU_ASSERT_EQUAL(l[i].errors, 0);
    }
}

/* Argument errors return at once and never call back; server errors and an
 * expired deadline call back with the status and the reason. */
static void test_errors(void)
{
    kvs_ns ns = make_ns();
    outcome o;
    memset(&o, 0, sizeof o);
    kvs_ns bad = ns;
    bad.model = NULL;
    CU_ASSERT_EQUAL(kvs_client_lookup_async(g_client, &bad, g_tokens, BT, 0, -1, record, &o),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_client_lookup_async(g_client, &ns, NULL, BT, 0, -1, record, &o),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_client_lookup_async(g_client, &ns, g_tokens, BT, 0, -1, NULL, &o),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_client_lookup_async(NULL, &ns, g_tokens, BT, 0, -1, record, &o),
                    KVS_EINVAL);
    kvs_client_drain(g_client);
    CU_ASSERT_EQUAL(atomic_load(&o.calls), 0);

    /* 7 whole blocks: above the server's max_blocks_per_request of 6. */
    static unsigned many[7 * BT];
    memset(&o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup_async(g_client, &ns, many, 7 * BT, 0, -1, record, &o),
                          0);
    kvs_client_drain(g_client);
    CU_ASSERT_EQUAL(atomic_load(&o.calls), 1);
    CU_ASSERT_EQUAL(o.status, KVS_EINVAL);
    CU_ASSERT_EQUAL(o.matched, 9999); /* res is NULL on error */
    CU_ASSERT(!o.err_null && strstr(o.err, "max_blocks_per_request") != NULL);

    /* A lease above 24 h: the server refuses it. */
    memset(&o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(
        kvs_client_lookup_async(g_client, &ns, g_tokens, BT, 90000000u, -1, record, &o), 0);
    kvs_client_drain(g_client);
    CU_ASSERT_EQUAL(o.status, KVS_EINVAL);
    CU_ASSERT(strstr(o.err, "lease_ms") != NULL);

    /* timeout 0: an already expired deadline. */
    memset(&o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup_async(g_client, &ns, g_tokens, BT, 0, 0, record, &o),
                          0);
    kvs_client_drain(g_client);
    CU_ASSERT_EQUAL(atomic_load(&o.calls), 1);
    CU_ASSERT_EQUAL(o.status, KVS_ETIMEDOUT);
    CU_ASSERT(strstr(o.err, "DEADLINE_EXCEEDED") != NULL);
}

/* kvs_client_close with lookups outstanding waits for every callback, and a
 * client whose first async call is its last closes cleanly. */
static void test_close_waits(void)
{
    kvs_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client(g_srv.addr, NULL, 0, 30000, &c), 0);
    kvs_ns ns = make_ns();
    enum { N = 32 };
    outcome *o = calloc(N, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (unsigned i = 0; i < N; i++)
        CU_ASSERT_EQUAL(
            kvs_client_lookup_async(c, &ns, g_tokens, NBLOCKS * BT, 0, -1, record, &o[i]), 0);
    kvs_client_close(c);
    for (unsigned i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(atomic_load(&o[i].calls), 1);
        CU_ASSERT_EQUAL(o[i].status, 0);
        CU_ASSERT_EQUAL(o[i].matched, NBLOCKS);
    }
    free(o);
}

/* A Lookup's callback that starts a put_async (a miss, then a store: the
 * callback does not block). kvs_client_drain and kvs_client_close must wait
 * for that put too: "every asynchronous call has called back". */
typedef struct cross {
    kvs_client *c;
    atomic_int lookups, puts, put_started;
    int put_status;
} cross;

static uint16_t g_layer[(size_t)BT * HEADS * HEAD_DIM];

static void cross_put_cb(void *arg, int status, const kvs_put_result *res, const char *err)
{
    (void)res;
    (void)err;
    cross *x = arg;
    x->put_status = status;
    atomic_fetch_add(&x->puts, 1);
}

static void cross_lookup_cb(void *arg, int status, const kvs_lookup_result *res, const char *err)
{
    (void)status;
    (void)res;
    (void)err;
    cross *x = arg;
    kvs_ns ns = make_ns();
    const void *k[LAYERS], *v[LAYERS];
    for (unsigned l = 0; l < LAYERS; l++)
        k[l] = v[l] = g_layer;
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = &ns;
    a.index = 0;
    a.tokens = g_tokens + (size_t)NBLOCKS * BT; /* a block never stored before */
    a.scheme = 1;
    a.k = k;
    a.v = v;
    if (kvs_client_put_async(x->c, &a, -1, cross_put_cb, x) == 0)
        atomic_fetch_add(&x->put_started, 1);
    atomic_fetch_add(&x->lookups, 1);
}

static void test_drain_close_cross(void)
{
    for (size_t i = 0; i < sizeof g_layer / sizeof *g_layer; i++)
        g_layer[i] = (uint16_t)(0x3C00u | (i & 0x3FFu));
    kvs_ns ns = make_ns();
    /* drain: the put the callback started has called back when drain returns. */
    cross x;
    memset(&x, 0, sizeof x);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client(g_srv.addr, NULL, 0, 30000, &x.c), 0);
    CU_ASSERT_EQUAL_FATAL(
        kvs_client_lookup_async(x.c, &ns, g_tokens, NBLOCKS * BT, 0, -1, cross_lookup_cb, &x), 0);
    kvs_client_drain(x.c);
    CU_ASSERT_EQUAL(atomic_load(&x.lookups), 1);
    CU_ASSERT_EQUAL(atomic_load(&x.put_started), 1);
    CU_ASSERT_EQUAL(atomic_load(&x.puts), 1);
    kvs_client_close(x.c);
    CU_ASSERT_EQUAL(atomic_load(&x.puts), 1);
    CU_ASSERT_EQUAL(x.put_status, 0);

    /* close: the client's first async call is such a Lookup; close must not
     * free the client under the put its callback queued. */
    memset(&x, 0, sizeof x);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client(g_srv.addr, NULL, 0, 30000, &x.c), 0);
    CU_ASSERT_EQUAL_FATAL(
        kvs_client_lookup_async(x.c, &ns, g_tokens, NBLOCKS * BT, 0, -1, cross_lookup_cb, &x), 0);
    kvs_client_close(x.c);
    CU_ASSERT_EQUAL(atomic_load(&x.lookups), 1);
    CU_ASSERT_EQUAL(atomic_load(&x.put_started), atomic_load(&x.puts));
    CU_ASSERT_EQUAL(atomic_load(&x.puts), 1);
    CU_ASSERT_EQUAL(x.put_status, 0);
}

/* A server killed (SIGKILL) with lookups in flight: every started call calls
 * back exactly once, those started after the kill with an error and a
 * reason, and drain and close return. */
static void test_server_killed(void)
{
    kvs_server_proc p;
    const char *const args[] = {"--threads", g_threads, "--log-level", "warn", NULL};
    CU_ASSERT_EQUAL_FATAL(kvs_itest_start(g_kvstashd, args, &p, "lookup_async_killed"), 0);
    kvs_client *c = NULL;
    if (kvs_itest_open_client(p.addr, NULL, 0, 5000, &c) != 0) {
        kvs_server_proc_kill(&p);
        CU_FAIL_FATAL("cannot open a client");
    }
    kvs_ns ns = make_ns();
    enum { N = 16 };
    outcome *o = calloc(2 * N, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (unsigned i = 0; i < N; i++)
        CU_ASSERT_EQUAL(kvs_client_lookup_async(c, &ns, g_tokens, BT, 0, -1, record, &o[i]), 0);
    kvs_server_proc_kill(&p);
    for (unsigned i = N; i < 2 * N; i++)
        CU_ASSERT_EQUAL(kvs_client_lookup_async(c, &ns, g_tokens, BT, 0, -1, record, &o[i]), 0);
    kvs_client_drain(c);
    for (unsigned i = 0; i < 2 * N; i++) {
        CU_ASSERT_EQUAL(atomic_load(&o[i].calls), 1);
        if (i >= N) {
            CU_ASSERT_NOT_EQUAL(o[i].status, 0);
            CU_ASSERT(!o[i].err_null && o[i].err[0] != '\0');
        }
    }
    kvs_client_close(c);
    free(o);
}

/* Synchronous lookups from many threads at once on one client share its pool
 * of completion queues: every answer is right. */
typedef struct syncer {
    int errors;
} syncer;

static void *sync_thread(void *arg)
{
    syncer *s = arg;
    kvs_ns ns = make_ns();
    for (int i = 0; i < 100; i++) {
        kvs_lookup_result *r = NULL;
        if (kvs_client_lookup(g_client, &ns, g_tokens, NBLOCKS * BT, 0, -1, &r, NULL) != 0 ||
            r->matched_blocks != NBLOCKS ||
            memcmp(r->blocks[NBLOCKS - 1].key, g_keys[NBLOCKS - 1], KVS_CLIENT_KEY_LEN) != 0)
            s->errors++;
        kvs_lookup_result_free(r);
    }
    return NULL;
}

static void test_sync_threads(void)
{
    pthread_t th[8];
    syncer s[8];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 8; i++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, sync_thread, &s[i]), 0);
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT_EQUAL(s[i].errors, 0);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s /path/to/kvstashd\n", argv[0]);
        return 2;
    }
    g_kvstashd = argv[1];
    if (argc > 2)
        g_threads = argv[2];
    grpc_init();
    static const kvs_test_case cases[] = {
        {"same_as_sync", test_same_as_sync},
        {"many_outstanding", test_many_outstanding},
        {"closed_loop", test_closed_loop},
        {"errors", test_errors},
        {"close_waits", test_close_waits},
        {"drain_close_cross", test_drain_close_cross},
        {"server_killed", test_server_killed},
        {"sync_threads", test_sync_threads},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"lookup_async", suite_init, suite_cleanup, cases},
        {NULL, NULL, NULL, NULL},
    };
    int rc = kvs_test_run(suites);
    grpc_shutdown();
    return rc;
}
