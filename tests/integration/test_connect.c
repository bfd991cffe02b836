/*
 * test_connect.c — the UCX data plane wired into a real kvstashd: the Connect
 * RPC (service/data_connect.c) and libkvstash's kvs_client_fetch over UCX with
 * its gRPC fallback (clients/c/xfer.c), and kvs_client_put_ucx (puts over
 * UCX checked and ingested like gRPC Put, with the same fallback).
 *
 * Usage: test_connect /path/to/kvstashd (ctest passes it; UCX_TLS comes from
 * the ctest ENVIRONMENT, tests/integration/connect.cmake).
 *
 * Suite "ucx" runs kvstashd with two tenants (UCX on, the default). Suite
 * "off" runs one with --ucx off. Every comparison is against what the same
 * server returns over gRPC Get in the same run: the UCX path must hand the
 * callback exactly the same layers, bytes and scales, in the same order.
 */
#include "kvs_dying_worker.h"
#include "kvs_itest.h"
#include "kvs_putmac.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"
#include "kvstash/v1/kvstash.pb-c.h"
#include "xfer.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TOKEN_A "token-alpha-0123"
#define TOKEN_B "token-bravo-4567"
#define TOKEN_C "token-charlie-89" /* a tenant with ucx = false */

static const char *g_kvstashd;
static kvs_server_proc g_srv, g_off;
static char g_dir[] = "/tmp/kvs_test_connect_XXXXXX";
static char g_conf[128];

/* ---- helpers ------------------------------------------------------------- */

static int open_client(const char *addr, const char *token, int ucx, kvs_client **out)
{
    return kvs_itest_open_client(addr, token, ucx, 30000 /* sanitizer builds, loaded machine */,
                                 out);
}

/* Connect with this request; the unpacked reply (or NULL) in *out. */
static grpc_status_code connect_req(const char *addr, const char *token,
                                    Kvstash__V1__ConnectRequest *req,
                                    Kvstash__V1__ConnectResponse **out, char *details)
{
    req->client_name = (char *)"test_connect";
    size_t n = kvstash__v1__connect_request__get_packed_size(req);
    uint8_t *buf = malloc(n + 1);
    kvstash__v1__connect_request__pack(req, buf);
    uint8_t *rep = NULL;
    size_t rlen = 0;
    grpc_status_code st = kvs_itest_raw_call(addr, token, "/kvstash.v1.KvStash/Connect", buf,
                                             n, 10000, &rep, &rlen, details, KVS_ERR_LEN);
    free(buf);
    if (out != NULL)
        *out = st == GRPC_STATUS_OK && rep ? kvstash__v1__connect_response__unpack(NULL, rlen, rep)
                                           : NULL;
    free(rep);
    return st;
}

/* Connect with the given address bytes; the unpacked reply (or NULL) in *out. */
static grpc_status_code connect_raw(const char *addr, const char *token, const void *wa,
                                    size_t wlen, Kvstash__V1__ConnectResponse **out, char *details)
{
    Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
    req.worker_address.data = (uint8_t *)wa;
    req.worker_address.len = wlen;
    return connect_req(addr, token, &req, out, details);
}

/* Connect that voids put seq of session id; *voided = the answer's voided
 * (-1 without an answer). wa: a worker address to send too (NULL: none). */
static grpc_status_code connect_void(const char *addr, const char *token, uint64_t id,
                                     const uint8_t *tok, uint64_t seq, const void *wa, size_t wl,
                                     int *voided)
{
    Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
    req.close_session_id = id;
    req.close_session_token.data = (uint8_t *)tok;
    req.close_session_token.len = tok ? KVS_XFER_TOKEN_LEN : 0;
    req.void_put_seq = seq;
    req.worker_address.data = (uint8_t *)wa;
    req.worker_address.len = wa ? wl : 0;
    Kvstash__V1__ConnectResponse *r = NULL;
    char det[KVS_ERR_LEN] = "";
    grpc_status_code st = connect_req(addr, token, &req, &r, det);
    *voided = r ? r->voided : -1;
    if (r)
        kvstash__v1__connect_response__free_unpacked(r, NULL);
    return st;
}

/* Connect that only closes session id (tlen bytes of tok); *closed = the
 * answer's closed (-1 without an answer). */
static grpc_status_code connect_close(const char *addr, const char *token, uint64_t id,
                                      const uint8_t *tok, size_t tlen, int *closed)
{
    Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
    req.close_session_id = id;
    req.close_session_token.data = (uint8_t *)tok;
    req.close_session_token.len = tlen;
    Kvstash__V1__ConnectResponse *r = NULL;
    char det[KVS_ERR_LEN] = "";
    grpc_status_code st = connect_req(addr, token, &req, &r, det);
    *closed = r ? r->closed : -1;
    if (st != GRPC_STATUS_OK)
        fprintf(stderr, "close of session %llu: %s\n", (unsigned long long)id, det);
    if (r)
        kvstash__v1__connect_response__free_unpacked(r, NULL);
    return st;
}

static kvs_ns make_ns(void)
{
    return kvs_itest_ns("exact/model", 3, 2, 64, 16, 1 /* fp16 */);
}

/* Block b of a test prompt: its layers (fp16, seeded by base), its tokens. */
typedef struct tblock {
    void *k[8], *v[8];
    unsigned tokens[16];
} tblock;

static void tblock_make(const kvs_ns *ns, unsigned base, size_t b, tblock *t)
{
    size_t elems = (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim;
    for (unsigned l = 0; l < ns->num_layers; l++) {
        t->k[l] = malloc(elems * 2);
        t->v[l] = malloc(elems * 2);
        kvs_itest_fill_fp16(t->k[l], elems, base + b * 100 + l);
        kvs_itest_fill_fp16(t->v[l], elems, base + b * 100 + l + 50);
    }
    for (unsigned i = 0; i < 16; i++)
        t->tokens[i] = base + (unsigned)(b * 16 + i) * 7u;
}

static void tblock_free(const kvs_ns *ns, tblock *t)
{
    for (unsigned l = 0; l < ns->num_layers; l++) {
        free(t->k[l]);
        free(t->v[l]);
    }
}

/* Puts block b (parent: NULL for b = 0) over UCX (ucx) or gRPC; its status,
 * the reason in err (KVS_ERR_LEN bytes). */
static int put_one_err(kvs_client *c, const kvs_ns *ns, unsigned base, size_t b,
                       const unsigned char *parent, unsigned scheme, int ucx, kvs_put_result *r,
                       char *err)
{
    tblock t;
    tblock_make(ns, base, b, &t);
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = ns;
    a.parent_key = parent;
    a.index = (unsigned)b;
    a.tokens = t.tokens;
    a.scheme = scheme;
    a.k = (const void *const *)t.k;
    a.v = (const void *const *)t.v;
    memset(r, 0, sizeof *r);
    int rc = ucx ? kvs_client_put_ucx(c, &a, -1, r, err) : kvs_client_put(c, &a, -1, r, err);
    tblock_free(ns, &t);
    return rc;
}

static int put_one(kvs_client *c, const kvs_ns *ns, unsigned base, size_t b,
                   const unsigned char *parent, unsigned scheme, int ucx, kvs_put_result *r)
{
    char err[KVS_ERR_LEN] = "";
    return put_one_err(c, ns, base, b, parent, scheme, ucx, r, err);
}

/* Puts a chain of n blocks over gRPC (schemes alternate int8, fp16); keys into keys[]. */
static int put_chain(kvs_client *c, const kvs_ns *ns, size_t n, unsigned base,
                     unsigned char (*keys)[32])
{
    int rc = 0;
    for (size_t b = 0; b < n && rc == 0; b++) {
        kvs_put_result r;
        char err[KVS_ERR_LEN] = "";
        /* int8 (the root: with sinks), fp16 */
        rc = put_one_err(c, ns, base, b, b ? keys[b - 1] : NULL, b % 2 ? 1 : 4, 0, &r, err);
        if (rc != 0)
            fprintf(stderr, "put %zu: %s: %s\n", b, kvs_strerror(rc), err);
        memcpy(keys[b], r.key, 32);
    }
    return rc;
}

/* Everything a layer callback saw, serialized, to compare two fetches. */
typedef struct rec {
    uint8_t *p;
    size_t len, cap;
    unsigned calls;
    unsigned stop_after; /* 0: never stop */
} rec;

static void rec_add(rec *r, const void *d, size_t n)
{
    if (r->len + n > r->cap) {
        r->cap = (r->len + n) * 2;
        r->p = realloc(r->p, r->cap);
    }
    memcpy(r->p + r->len, d, n);
    r->len += n;
}

static int rec_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                  size_t vl, float ks, float vs, int last)
{
    rec *r = arg;
    struct {
        unsigned b, l;
        uint64_t kl, vl;
        float ks, vs;
        int last;
    } h;
    memset(&h, 0, sizeof h); /* padding too: records are compared with memcmp */
    h.b = b;
    h.l = l;
    h.kl = kl;
    h.vl = vl;
    h.ks = ks;
    h.vs = vs;
    h.last = last;
    rec_add(r, &h, sizeof h);
    rec_add(r, k, kl);
    rec_add(r, v, vl);
    r->calls++;
    return r->stop_after && r->calls >= r->stop_after;
}

static int same(const rec *a, const rec *b)
{
    return a->len == b->len && a->calls == b->calls && a->len > 0 &&
           memcmp(a->p, b->p, a->len) == 0;
}

static void check_same(int fmt, const rec *rg, const rec *ru)
{
    CU_ASSERT_TRUE(same(rg, ru));
    if (!same(rg, ru)) {
        size_t i = 0;
        while (i < rg->len && i < ru->len && rg->p[i] == ru->p[i])
            i++;
        fprintf(stderr, "format %d: gRPC %u calls %zu bytes, UCX %u calls %zu bytes; first "
                        "difference at byte %zu\n",
                fmt, rg->calls, rg->len, ru->calls, ru->len, i);
    }
}

/* What Get returns for keys[0..n) in fmt. */
static int get_rec(kvs_client *c, const kvs_ns *ns, unsigned char (*keys)[32], size_t n, int fmt,
                   rec *r)
{
    char err[KVS_ERR_LEN] = "";
    return kvs_client_get(c, ns, (const unsigned char(*)[32])keys, n, (kvs_egress)fmt, 0, -1,
                          rec_cb, r, err);
}

/* keys[0..n) in fmt through gc's Get and fc's fetch: both succeed, and the
 * fetch hands the callback exactly what Get does (asserted). The number of
 * layer callbacks of the fetch. */
static unsigned check_fetch_equals_get(kvs_client *gc, kvs_client *fc, const kvs_ns *ns,
                                       unsigned char (*keys)[32], size_t n, int fmt)
{
    rec rg = {0}, ru = {0};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(get_rec(gc, ns, keys, n, fmt, &rg), 0);
    int rc = kvs_client_fetch(fc, ns, (const unsigned char(*)[32])keys, n, (kvs_egress)fmt, 0, -1,
                              rec_cb, &ru, err);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc != 0)
        fprintf(stderr, "fetch format %d: %s: %s\n", fmt, kvs_strerror(rc), err);
    check_same(fmt, &rg, &ru);
    free(rg.p);
    free(ru.p);
    return ru.calls;
}

/* A client whose UCX path failed fetches keys (the same bytes as Get's each
 * time) until it is back on UCX (ucx_retry_ms) or 100 tries have passed;
 * its stats in *st. The tries over gRPC. */
static int fetch_until_ucx(kvs_client *g, kvs_client *u, const kvs_ns *ns,
                           unsigned char (*keys)[32], size_t n, kvs_client_xfer_stats *st)
{
    int tries = 0;
    for (; tries < 100; tries++) {
        CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, ns, keys, n, KVS_EGRESS_STORED),
                        (unsigned)n * ns->num_layers);
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, st), 0);
        if (st->connected)
            break;
        usleep(100 * 1000);
    }
    return tries;
}

/* u's next fetch of keys goes over UCX: no fallback, one fetch more. */
static void check_next_fetch_ucx(kvs_client *g, kvs_client *u, const kvs_ns *ns,
                                 unsigned char (*keys)[32], size_t n)
{
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    unsigned long long fb = st.fallbacks, fetches = st.fetches;
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, ns, keys, n, KVS_EGRESS_FP16),
                    (unsigned)n * ns->num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, fb); /* over UCX */
    CU_ASSERT_EQUAL(st.fetches, fetches + 1);
}

/* A raw transfer client (peer error mode) not connected yet, and its worker
 * address in *wa, *wl (valid until it is destroyed); a failure fails the test
 * (fatal). */
static kvs_xfer_client *raw_client(const void **wa, size_t *wl)
{
    kvs_xfer_client_opts o = {.err_mode = KVS_XFER_ERR_PEER, .timeout_ms = 10000};
    kvs_xfer_client *xc = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_create(&o, &xc), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_address(xc, wa, wl), 0);
    return xc;
}

/* The start of most cases: a gRPC client *g (token tg) and a UCX client *u
 * (token tu) to addr, and a chain of n blocks from base stored through *g,
 * its keys in keys. A failure fails the test (fatal). */
static void open_pair(const char *addr, const char *tg, const char *tu, size_t n, unsigned base,
                      kvs_ns *ns, unsigned char (*keys)[32], kvs_client **g, kvs_client **u)
{
    CU_ASSERT_EQUAL_FATAL(open_client(addr, tg, 0, g), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(addr, tu, 1, u), 0);
    *ns = make_ns();
    CU_ASSERT_EQUAL_FATAL(put_chain(*g, ns, n, base, keys), 0);
}

/* ---- suite "ucx" ----------------------------------------------------------- */

static int suite_ucx_init(void)
{
    if (kvs_itest_write_config(g_dir, g_conf, sizeof g_conf,
                               "[kvstashd]\nlog_level = warn\n\n"
                               "[tenant.alpha]\ntoken = " TOKEN_A "\nsecret = alpha-secret\n\n"
                               "[tenant.bravo]\ntoken = " TOKEN_B "\nsecret = bravo-secret\n\n"
                               "[tenant.charlie]\ntoken = " TOKEN_C "\nucx = false\n") != 0)
        return 1;
    /* the most outliers and sinks: the largest stored blocks a layout can have */
    /* KVS_TEST_UCX_ISOLATE=off (test_connect_inprocess): UCX inside kvstashd. */
    const char *iso = getenv("KVS_TEST_UCX_ISOLATE") ? getenv("KVS_TEST_UCX_ISOLATE") : "on";
    const char *args[] = {"--config",
                          g_conf,
                          "--k-outliers",
                          "16",
                          "--v-outliers",
                          "16",
                          "--sinks",
                          "64",
                          "--ucx-isolate",
                          iso,
                          NULL};
    return kvs_itest_start(g_kvstashd, args, &g_srv, "ucx");
}

static int suite_ucx_cleanup(void)
{
    int rc = kvs_itest_stop(&g_srv, 10000);
    unlink(g_conf);
    rmdir(g_dir);
    return rc;
}

/* Connect over gRPC gives a usable server address, a 16-byte token and a
 * session id; a raw transfer client connects with them. */
static void test_connect_session(void)
{
    const void *wa;
    size_t wl;
    kvs_xfer_client *xc = raw_client(&wa, &wl);
    Kvstash__V1__ConnectResponse *r1 = NULL, *r2 = NULL;
    char det[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(connect_raw(g_srv.addr, TOKEN_A, wa, wl, &r1, det), GRPC_STATUS_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r1);
    CU_ASSERT_TRUE(r1->worker_address.len >= 8);
    CU_ASSERT_EQUAL(r1->session_token.len, (size_t)KVS_XFER_TOKEN_LEN);
    /* a second session gets another id and another token */
    CU_ASSERT_EQUAL_FATAL(connect_raw(g_srv.addr, TOKEN_A, wa, wl, &r2, det), GRPC_STATUS_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r2);
    CU_ASSERT_NOT_EQUAL(r1->session_id, r2->session_id);
    CU_ASSERT_NOT_EQUAL(memcmp(r1->session_token.data, r2->session_token.data, 16), 0);
    /* and a put key of its own (kvs_putmac.h) */
    CU_ASSERT_EQUAL(r1->put_key.len, (size_t)KVS_PUTMAC_KEY_LEN);
    CU_ASSERT_EQUAL_FATAL(r2->put_key.len, (size_t)KVS_PUTMAC_KEY_LEN);
    CU_ASSERT_NOT_EQUAL(memcmp(r1->put_key.data, r2->put_key.data, KVS_PUTMAC_KEY_LEN), 0);
    kvs_xfer_session_info info = {.id = r1->session_id};
    memcpy(info.token, r1->session_token.data, 16);
    CU_ASSERT_EQUAL(kvs_xfer_client_connect(xc, r1->worker_address.data, r1->worker_address.len,
                                            &info),
                    0);
    CU_ASSERT_EQUAL(kvs_xfer_client_status(xc), 0);
    kvstash__v1__connect_response__free_unpacked(r1, NULL);
    kvstash__v1__connect_response__free_unpacked(r2, NULL);
    kvs_client *a = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &a), 0);
    CU_ASSERT_TRUE(kvs_itest_stat(a, "kvstash_xfer_enabled", NULL, NULL) == 1);
    CU_ASSERT_TRUE(kvs_itest_stat(a, "kvstash_xfer_sessions", NULL, NULL) >= 2);
    kvs_xfer_client_destroy(xc);
    /* Connect needs the tenant's token like every other RPC */
    CU_ASSERT_EQUAL(connect_raw(g_srv.addr, NULL, "12345678", 8, NULL, det),
                    GRPC_STATUS_UNAUTHENTICATED);
    kvs_client_close(a);
}

/* Bad Connect payloads: clear INVALID_ARGUMENT, and the server keeps serving. */
static void test_bad_connect(void)
{
    char det[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(connect_raw(g_srv.addr, TOKEN_A, NULL, 0, NULL, det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "worker_address"));
    size_t big = 70000;
    uint8_t *junk = malloc(big);
    for (size_t i = 0; i < big; i++)
        junk[i] = (uint8_t)(i * 131u + 7u);
    CU_ASSERT_EQUAL(connect_raw(g_srv.addr, TOKEN_A, junk, big, NULL, det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(connect_raw(g_srv.addr, TOKEN_A, junk, 3, NULL, det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    free(junk);
    /* The 8 bytes that abort UCX 1.13 in ucp_address_unpack (msg_fuzz_grpcio
     * found them): the address check's helper dies on them instead of
     * kvstashd (ucx_addr_check = on, the default), twice in a row, and the
     * server goes on serving UCX (fetch_equals_get below connects again). */
    static const uint8_t killer[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 2; i++) {
        det[0] = 0;
        CU_ASSERT_EQUAL(connect_raw(g_srv.addr, TOKEN_A, killer, sizeof killer, NULL, det),
                        GRPC_STATUS_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(det, "not a usable UCX worker address"));
    }
    /* a request that is not a ConnectRequest at all */
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    CU_ASSERT_EQUAL(kvs_itest_raw_call(g_srv.addr, TOKEN_A, "/kvstash.v1.KvStash/Connect",
                                       garbage, sizeof garbage, 10000, NULL, NULL, det,
                                       sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    kvs_client *a = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &a), 0);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(a, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    CU_ASSERT(kvs_itest_stat(a, "kvstash_xfer_addr_check_crashes_total", NULL, NULL) >= 2.0);
    CU_ASSERT(kvs_itest_stat(a, "kvstash_xfer_addr_rejected_total", NULL, NULL) >= 2.0);
    kvs_client_close(a);
}

/* A tenant with ucx = false: Connect is PERMISSION_DENIED before UCX sees a
 * byte of the address (the 8-byte address that aborts UCX 1.13 included),
 * and libkvstash's fetch goes over gRPC by itself, with the same bytes. */
static void test_tenant_without_ucx(void)
{
    static const uint8_t hostile[8] = {0x02};
    char det[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(connect_raw(g_srv.addr, TOKEN_C, hostile, sizeof hostile, NULL, det),
                    GRPC_STATUS_PERMISSION_DENIED);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "tenant charlie may not use the UCX data plane"));
    /* but a close alone is answered: it has nothing to close */
    static const uint8_t tok[KVS_XFER_TOKEN_LEN] = {1};
    int closed = -1;
    CU_ASSERT_EQUAL(connect_close(g_srv.addr, TOKEN_C, 77, tok, sizeof tok, &closed),
                    GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(closed, 1);
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_srv.addr, TOKEN_C, TOKEN_C, 2, 21000, &ns, keys, &g, &u);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_FP16),
                    2u * ns.num_layers);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.fetches, 0u);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EPERM);
    kvs_client_close(g);
    kvs_client_close(u);
}

/* Every egress format: kvs_client_fetch over UCX hands the callback exactly
 * what kvs_client_get over gRPC does (fp16 and int8 blocks in one request). */
static void test_fetch_equals_get(void)
{
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[4][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 4, 1000, &ns, keys, &g, &u);
    double sent0 = kvs_itest_stat(g, "kvstash_xfer_blocks_sent_total", NULL, NULL);
    char err[KVS_ERR_LEN] = "";
    for (int fmt = 0; fmt <= 4; fmt++)
        CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 4, fmt), 4u * ns.num_layers);
    /* fp16/bf16/fp32: the fetch moved the stored tiles and the client decoded
     * them (kvs_decode_at); the bytes equal the server's own rendering. */
    kvs_client *gs = NULL;
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = g_srv.addr;
    o.token = TOKEN_A;
    o.call_timeout_ms = 30000;
    o.decode = KVS_DECODE_SERVER;
    CU_ASSERT_EQUAL_FATAL(kvs_client_open(&o, &gs, err), 0);
    for (int fmt = KVS_EGRESS_FP16; fmt <= KVS_EGRESS_FP32; fmt++)
        check_fetch_equals_get(gs, u, &ns, keys, 4, fmt);
    /* ... and a UCX client that leaves decoding to the server gets those
     * bytes rendered by kvstashd (on its render pool in the _render_pool run) */
    kvs_client *us = NULL;
    o.ucx = 1;
    CU_ASSERT_EQUAL_FATAL(kvs_client_open(&o, &us, err), 0);
    double copies0 = kvs_itest_stat(g, "kvstash_xfer_bounce_copies_total", NULL, NULL);
    for (int fmt = KVS_EGRESS_FP16; fmt <= KVS_EGRESS_FP32; fmt++)
        check_fetch_equals_get(gs, us, &ns, keys, 4, fmt);
    /* isolated (the default): rendered into the data plane's memory, sent in
     * place, never copied through its bounce memory */
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_bounce_copies_total", NULL, NULL), copies0);
    kvs_client_xfer_stats sst;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(us, &sst), 0);
    CU_ASSERT_EQUAL(sst.fetches, 3u);
    CU_ASSERT_EQUAL(sst.fallbacks, 0u);
    kvs_client_close(us);
    kvs_client_close(gs);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.ucx_status, 0);
    CU_ASSERT_EQUAL(st.fetches, 8u);
    CU_ASSERT_EQUAL(st.blocks, 32u);
    CU_ASSERT_TRUE(st.bytes > 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_blocks_sent_total", NULL, NULL) - sent0, 44.0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_refs_held", NULL, NULL), 0.0);

    /* the callback stops the fetch: KVS_ECANCELED, the client stays usable */
    rec rs = {0};
    rs.stop_after = 2;
    CU_ASSERT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 4,
                                     KVS_EGRESS_STORED, 0, -1, rec_cb, &rs, err),
                    KVS_ECANCELED);
    CU_ASSERT_EQUAL(rs.calls, 2u);
    free(rs.p);
    /* an unknown key: NOT_FOUND as over gRPC, answered over UCX (no fallback) */
    unsigned char two[2][32];
    memcpy(two[0], keys[0], 32);
    memset(two[1], 0x5a, 32);
    rec rn = {0};
    CU_ASSERT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])two, 2, KVS_EGRESS_FP16,
                                     0, -1, rec_cb, &rn, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(rn.calls, ns.num_layers); /* block 0 was handed on first */
    free(rn.p);
    /* a namespace whose layout is not the stored blocks': NOT_FOUND, as over gRPC */
    kvs_ns wrong = ns;
    wrong.num_layers = 2;
    rec rw = {0};
    CU_ASSERT_EQUAL(kvs_client_get(u, &wrong, (const unsigned char(*)[32])keys, 1,
                                   KVS_EGRESS_STORED, 0, -1, rec_cb, &rw, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_client_fetch(u, &wrong, (const unsigned char(*)[32])keys, 1,
                                     KVS_EGRESS_STORED, 0, -1, rec_cb, &rw, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(rw.calls, 0u);
    free(rw.p);
    /* (the 3-layer block does not fit the buffer sized for 2 layers: KVS_ENOSPC over
     * UCX, so that fetch went on over gRPC, which answered NOT_FOUND; one fallback,
     * and a too-small buffer does not take the client off UCX) */
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.ucx_status, 0);
    /* a namespace claiming more layers: the block fits, and its header (stored or
     * rendered) says otherwise before any layer is handed on: NOT_FOUND over UCX */
    wrong.num_layers = 4;
    for (int fmt = 0; fmt <= 4; fmt += 2) {
        rec rx = {0};
        CU_ASSERT_EQUAL(kvs_client_fetch(u, &wrong, (const unsigned char(*)[32])keys, 2,
                                         (kvs_egress)fmt, 0, -1, rec_cb, &rx, err),
                        KVS_ENOTFOUND);
        CU_ASSERT_EQUAL(rx.calls, 0u);
        free(rx.p);
    }
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    rec ra = {0};
    CU_ASSERT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 4,
                                     KVS_EGRESS_STORED, 0, -1, rec_cb, &ra, err),
                    0);
    free(ra.p);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fetches, 9u); /* still over UCX */
    CU_ASSERT_EQUAL(st.fallbacks, 1u);

    /* a Lookup lease handed to fetch ends with it, as Get's does */
    unsigned tokens[16];
    for (unsigned i = 0; i < 16; i++)
        tokens[i] = 1000 + i * 7u;
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(u, &ns, tokens, 16, 600000, -1, &lr, err), 0);
    CU_ASSERT_EQUAL_FATAL(lr->matched_blocks, 1u);
    double leases = kvs_itest_stat(g, "kvstash_store_leases", NULL, NULL);
    rec rl = {0};
    CU_ASSERT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 1,
                                     KVS_EGRESS_STORED, lr->lease_id, -1, rec_cb, &rl, err),
                    0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_store_leases", NULL, NULL), leases - 1);
    free(rl.p);
    kvs_lookup_result_free(lr);
    /* Neither this process's UCX worker (the server is on 127.0.0.1) nor
     * kvstashd's listens outside loopback (common/kvs_netdev.h). */
    char where[64] = "";
    CU_ASSERT_EQUAL(kvs_itest_listening_outside_loopback((int)getpid(), where, sizeof where), 0);
    CU_ASSERT_EQUAL(kvs_itest_listening_outside_loopback((int)g_srv.pid, where, sizeof where), 0);
    if (where[0])
        fprintf(stderr, "\n  a socket listens on %s (hex, /proc/net/tcp)\n", where);
    kvs_client_close(g);
    kvs_client_close(u);
}

/* A client to addr with UCX and ucx_seal_fetches = seal (fatal on failure). */
static kvs_client *open_sealing(const char *addr, const char *token, int seal, kvs_decode_at dec)
{
    char err[KVS_ERR_LEN] = "";
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = addr;
    o.token = token;
    o.call_timeout_ms = 30000;
    o.ucx = 1;
    o.ucx_seal_fetches = seal;
    o.decode = dec;
    kvs_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_open(&o, &c, err), 0);
    return c;
}

/* Sealed fetches (kvs_client_opts.ucx_seal_fetches = 1): with the
 * data plane in kvstash-xferd kvstashd tags every block it lends to the
 * session (kvstash_xfer_fetch_sealed_total) and the client checks each layer
 * before its callback; with UCX inside kvstashd there is nothing to seal
 * against (fetch_seal 2). Stored, client-decoded and server-rendered formats
 * give Get's bytes; a client that asks for no seals gets none. Connect
 * answers seal_fetches with fetch_seal. */
static void test_sealed_fetch(void)
{
    const char *iso_env = getenv("KVS_TEST_UCX_ISOLATE");
    int iso = !(iso_env && strcmp(iso_env, "off") == 0);
    kvs_client *g = NULL, *u = NULL, *us = NULL, *un = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 2, 1100, &ns, keys, &g, &u);
    kvs_client_close(u); /* this one seals */
    u = open_sealing(g_srv.addr, TOKEN_A, 1, KVS_DECODE_AUTO);
    double s0 = kvs_itest_stat(g, "kvstash_xfer_fetch_sealed_total", NULL, NULL);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_FP16),
                    2u * ns.num_layers);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fetch_seal, iso ? 1 : 2);
    CU_ASSERT_EQUAL(st.forged_blocks, 0u);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(st.fetches, 2u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_fetch_sealed_total", NULL, NULL) - s0,
                    iso ? 4.0 : 0.0);
    /* rendered by kvstashd: sealed after the render, checked once landed */
    us = open_sealing(g_srv.addr, TOKEN_A, 1, KVS_DECODE_SERVER);
    for (int fmt = KVS_EGRESS_FP16; fmt <= KVS_EGRESS_FP8_PER_TENSOR; fmt++)
        CU_ASSERT_EQUAL(check_fetch_equals_get(g, us, &ns, keys, 2, fmt), 2u * ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(us, &st), 0);
    CU_ASSERT_EQUAL(st.fetch_seal, iso ? 1 : 2);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(st.fetches, 4u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_fetch_sealed_total", NULL, NULL) - s0,
                    iso ? 12.0 : 0.0);
    /* no seals asked for (the default, and < 0): none made */
    un = open_sealing(g_srv.addr, TOKEN_A, -1, KVS_DECODE_AUTO);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, un, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(un, &st), 0);
    CU_ASSERT_EQUAL(st.fetch_seal, 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_fetch_sealed_total", NULL, NULL) - s0,
                    iso ? 12.0 : 0.0);
    /* Connect's answer to seal_fetches */
    const void *wa;
    size_t wl;
    for (int ask = 0; ask <= 1; ask++) {
        kvs_xfer_client *xc = raw_client(&wa, &wl);
        Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
        req.worker_address.data = (uint8_t *)wa;
        req.worker_address.len = wl;
        req.seal_fetches = ask;
        Kvstash__V1__ConnectResponse *r = NULL;
        char details[KVS_ERR_LEN] = "";
        CU_ASSERT_EQUAL(connect_req(g_srv.addr, TOKEN_A, &req, &r, details), GRPC_STATUS_OK);
        CU_ASSERT_PTR_NOT_NULL(r);
        if (r)
            CU_ASSERT_EQUAL(r->fetch_seal, ask ? (iso ? 1u : 2u) : 0u);
        if (r)
            kvstash__v1__connect_response__free_unpacked(r, NULL);
        kvs_xfer_client_destroy(xc);
    }
    kvs_client_close(un);
    kvs_client_close(us);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* A namespace of more layers than a seal holds (KVS_FETCHSEAL_MAX_LAYERS):
 * kvstashd does not lend its blocks to a sealing session, so a sealing
 * client fetches them over gRPC (Get's bytes); that is the namespace's
 * limit, not a failure of the UCX path: the client stays on UCX, and its
 * next fetch of another namespace goes over UCX. */
static void test_sealed_many_layers(void)
{
    const char *iso_env = getenv("KVS_TEST_UCX_ISOLATE");
    int iso = !(iso_env && strcmp(iso_env, "off") == 0);
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[1][32], big_key[1][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 1, 1400, &ns, keys, &g, &u);
    kvs_client_close(u);
    u = open_sealing(g_srv.addr, TOKEN_A, 1, KVS_DECODE_AUTO);
    enum { L = KVS_FETCHSEAL_MAX_LAYERS + 1 };
    kvs_ns big = kvs_itest_ns("exact/many-layers", L, 1, 64, 16, 1 /* fp16 */);
    size_t elems = (size_t)big.block_tokens * big.num_kv_heads * big.head_dim;
    void **kv = calloc(2 * L, sizeof *kv);
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    for (unsigned l = 0; l < 2 * L; l++) {
        kv[l] = malloc(elems * 2);
        CU_ASSERT_PTR_NOT_NULL_FATAL(kv[l]);
        kvs_itest_fill_fp16(kv[l], elems, 1400 + l);
    }
    unsigned tokens[16];
    for (unsigned i = 0; i < 16; i++)
        tokens[i] = 1400 + i * 7u;
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = &big;
    a.tokens = tokens;
    a.scheme = 1;
    a.k = (const void *const *)kv;
    a.v = (const void *const *)(kv + L);
    kvs_put_result r;
    memset(&r, 0, sizeof r);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_client_put(g, &a, -1, &r, err), 0);
    memcpy(big_key[0], r.key, 32);
    for (unsigned l = 0; l < 2 * L; l++)
        free(kv[l]);
    free(kv);
    /* over UCX first (the session is open), then the namespace of many layers */
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 1, KVS_EGRESS_STORED), ns.num_layers);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &big, big_key, 1, KVS_EGRESS_STORED), L);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &big, big_key, 1, KVS_EGRESS_FP16), L);
    /* and such a block asked for in a namespace of fewer layers: not there */
    rec rx = {0};
    CU_ASSERT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])big_key, 1,
                                     KVS_EGRESS_STORED, 0, -1, rec_cb, &rx, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(rx.calls, 0u);
    free(rx.p);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.ucx_status, 0);
    CU_ASSERT_EQUAL(st.forged_blocks, 0u);
    CU_ASSERT_EQUAL(st.fetch_seal, iso ? 1 : 2);
    check_next_fetch_ucx(g, u, &ns, keys, 1);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* A block asked for in a namespace whose layers are larger than its own
 * (twice the heads), in formats kvstashd renders: the rendered block fits the
 * buffer sized for that namespace but is not laid out as its blocks are
 * (kvs_xfer_fetch_req.layer_bytes). NOT_FOUND, as Get answers it, and the
 * client stays on UCX: the transfer used to fail such a block as a protocol
 * error, which took the client off UCX (its next fetches went over gRPC). A
 * sealing client takes the NOT_FOUND from Get, and stays on UCX too. */
static void test_wrong_ns_rendered(void)
{
    const char *iso_env = getenv("KVS_TEST_UCX_ISOLATE");
    int iso = !(iso_env && strcmp(iso_env, "off") == 0); /* else nothing to seal against */
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 2, 67200, &ns, keys, &g, &u);
    kvs_client *us = open_sealing(g_srv.addr, TOKEN_A, 0, KVS_DECODE_SERVER);
    kvs_client *sealing = open_sealing(g_srv.addr, TOKEN_A, 1, KVS_DECODE_SERVER);
    kvs_ns wide = ns;
    wide.num_kv_heads = 2 * ns.num_kv_heads;
    struct {
        kvs_client *c;
        kvs_egress fmt;
    } cases[] = {{u, KVS_EGRESS_FP8_PER_TENSOR},
                 {us, KVS_EGRESS_FP16},
                 {us, KVS_EGRESS_FP32},
                 {sealing, KVS_EGRESS_BF16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_client *c = cases[i].c;
        check_next_fetch_ucx(g, c, &ns, keys, 2); /* connected */
        kvs_client_xfer_stats st;
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(c, &st), 0);
        unsigned long long fb = st.fallbacks;
        char err[KVS_ERR_LEN] = "";
        rec rx = {0};
        CU_ASSERT_EQUAL(kvs_client_fetch(c, &wide, (const unsigned char(*)[32])keys, 2,
                                         cases[i].fmt, 0, -1, rec_cb, &rx, err),
                        KVS_ENOTFOUND);
        CU_ASSERT_EQUAL(rx.calls, 0u);
        free(rx.p);
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(c, &st), 0);
        CU_ASSERT_EQUAL(st.connected, 1);
        CU_ASSERT_EQUAL(st.ucx_status, 0);
        /* answered over UCX; a sealing client asks Get */
        CU_ASSERT_EQUAL(st.fallbacks, fb + (c == sealing && iso));
        if (st.ucx_status != 0)
            printf("  wrong_ns_rendered: case %zu left UCX (%d)\n", i, st.ucx_status);
        check_next_fetch_ucx(g, c, &ns, keys, 2); /* still over UCX */
    }
    kvs_client_close(sealing);
    kvs_client_close(us);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* Another tenant's UCX session cannot fetch my blocks (NOT_FOUND, as if absent). */
static void test_cross_tenant(void)
{
    kvs_client *a = NULL, *b = NULL;
    kvs_ns ns;
    unsigned char keys[1][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_B, 1, 5000, &ns, keys, &a, &b);
    double failed0 = kvs_itest_stat(a, "kvstash_xfer_blocks_failed_total", NULL, NULL);
    char err[KVS_ERR_LEN] = "";
    for (int fmt = 0; fmt <= 4; fmt += 4) {
        rec r = {0};
        CU_ASSERT_EQUAL(kvs_client_fetch(b, &ns, (const unsigned char(*)[32])keys, 1,
                                         (kvs_egress)fmt, 0, -1, rec_cb, &r, err),
                        KVS_ENOTFOUND);
        CU_ASSERT_EQUAL(r.calls, 0u);
        free(r.p);
    }
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(b, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1); /* refused over UCX, not by a fallback */
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_blocks_failed_total", NULL, NULL) - failed0,
                    2.0);
    kvs_client_close(a);
    kvs_client_close(b);
}

/* ---- suite "nohelper": kvstashd without its address check helper ---------- */

static char g_nohelper_dir[] = "/tmp/kvs_test_nohelper_XXXXXX";
static char g_nohelper_bin[160];
static kvs_server_proc g_nohelper;

/* A copy of kvstashd alone in a folder: kvs-ucx-addrcheck is not next to it. */
/* Copies the executable from to to (mode 0755): 0 or -1. */
static int copy_exe(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    int ok = in && out;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        ok = 0;
    return ok && chmod(to, 0755) == 0 ? 0 : -1;
}

static char g_nohelper_xferd[sizeof g_nohelper_dir + 32];

/* Copies name, from the directory of the kvstashd under test, to to. */
static int copy_sibling(const char *name, const char *to)
{
    char src[4096];
    snprintf(src, sizeof src, "%s", g_kvstashd);
    char *slash = strrchr(src, '/');
    if (!slash)
        return -1;
    snprintf(slash + 1, sizeof src - (size_t)(slash + 1 - src), "%s", name);
    return copy_exe(src, to);
}

/* kvstashd and its data plane process, kvstash-xferd, in a directory
 * without kvstash-ucx-addrcheck. */
static int suite_nohelper_init(void)
{
    if (!mkdtemp(g_nohelper_dir))
        return 1;
    snprintf(g_nohelper_bin, sizeof g_nohelper_bin, "%s/kvstashd", g_nohelper_dir);
    snprintf(g_nohelper_xferd, sizeof g_nohelper_xferd, "%s/kvstash-xferd", g_nohelper_dir);
    if (copy_exe(g_kvstashd, g_nohelper_bin) != 0 ||
        copy_sibling("kvstash-xferd", g_nohelper_xferd) != 0)
        return 1;
    const char *args[] = {"--log-level", "warn", NULL};
    return kvs_itest_start(g_nohelper_bin, args, &g_nohelper, "kvstashd without its helper");
}

static int suite_nohelper_cleanup(void)
{
    int rc = kvs_itest_stop(&g_nohelper, 10000);
    unlink(g_nohelper_bin);
    unlink(g_nohelper_xferd);
    rmdir(g_nohelper_dir);
    return rc;
}

/* The data plane process dies (as UCX 1.13 makes it on bytes any peer can
 * send): kvstashd keeps serving and keeps every block, a UCX client's next
 * fetch falls back to gRPC with the same bytes, the process is restarted
 * (counted), and a new client fetches over UCX again. */
static void test_dataplane_dies(void)
{
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[4][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 4, 60000, &ns, keys, &g, &u);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 4, KVS_EGRESS_STORED),
                    4u * ns.num_layers);
    rec before = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, keys, 4, KVS_EGRESS_STORED, &before), 0);
    double restarts0 = kvs_itest_stat(g, "kvstash_xfer_proc_restarts_total", NULL, NULL);
    pid_t x = kvs_server_proc_xferd((pid_t)g_srv.pid);
    const char *iso = getenv("KVS_TEST_UCX_ISOLATE");
    if (iso && strcmp(iso, "off") == 0) { /* UCX in kvstashd: no such process */
        CU_ASSERT_EQUAL(x, 0);
        free(before.p);
        kvs_client_close(u);
        kvs_client_close(g);
        return;
    }
    CU_ASSERT_FATAL(x > 0);
    /* a second UCX client that asked never to retry (ucx_retry_ms < 0) */
    kvs_client *un = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 30000, -1, &un), 0);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, un, &ns, keys, 4, KVS_EGRESS_STORED),
                    4u * ns.num_layers);
    CU_ASSERT_EQUAL(kill(x, SIGKILL), 0);
    /* Where the transport reports the endpoint's error without traffic
     * (tcp does; shared memory does not), the stats see it first: that very
     * snapshot has the session's close pending (it had the close pending
     * missing when kvs_client_xfer_stats_get itself took the client off UCX). */
    kvs_client_xfer_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 200 && st.ucx_status == 0; i++) {
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
        if (st.ucx_status == 0)
            usleep(10 * 1000);
    }
    printf("  dataplane_dies: endpoint error seen by the stats before any fetch: %s\n",
           st.ucx_status ? "yes" : "no");
    if (st.ucx_status != 0) {
        CU_ASSERT_EQUAL(st.connected, 0);
        CU_ASSERT_EQUAL(st.close_pending, 1);
    }
    /* the UCX client's next fetch: its session is gone; gRPC, same bytes */
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 4, KVS_EGRESS_STORED),
                    4u * ns.num_layers);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, un, &ns, keys, 4, KVS_EGRESS_STORED),
                    4u * ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    /* over gRPC, unless the client's wait (1 s) ran out before this fetch and
     * it reached the restarted data plane process already */
    CU_ASSERT(st.fallbacks >= 1u || st.reconnects == 1u);
    double restarts = restarts0;
    for (int i = 0; i < 500 && restarts < restarts0 + 1; i++) {
        usleep(20000);
        restarts = kvs_itest_stat(g, "kvstash_xfer_proc_restarts_total", NULL, NULL);
    }
    CU_ASSERT_EQUAL(restarts, restarts0 + 1);
    /* counted when the old one is gone; serving once the new one said hello */
    double serving = 0;
    for (int i = 0; i < 500 && (serving == 0 || serving == (double)x); i++) {
        serving = kvs_itest_stat(g, "kvstash_xfer_proc_pid", NULL, NULL);
        if (serving == 0 || serving == (double)x)
            usleep(20000);
    }
    pid_t x2 = kvs_server_proc_xferd((pid_t)g_srv.pid);
    CU_ASSERT(x2 > 0 && x2 != x);
    CU_ASSERT_EQUAL(serving, (double)x2);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_refs_held", NULL, NULL), 0.0);
    /* the old client goes back to UCX by itself once its wait (ucx_retry_ms,
     * 1 s by default) is over: Connect again, closing its old session in the
     * same call; each try is a fetch with the same bytes */
    (void)fetch_until_ucx(g, u, &ns, keys, 4, &st);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.reconnects, 1u);
    CU_ASSERT_EQUAL(st.close_pending, 0);
    CU_ASSERT_EQUAL(st.sessions_closed, 1u);
    check_next_fetch_ucx(g, u, &ns, keys, 4);
    /* the one that asked never to: still gRPC */
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, un, &ns, keys, 4, KVS_EGRESS_STORED),
                    4u * ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(un, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.reconnects, 0u);
    kvs_client_close(un);
    rec after = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, keys, 4, KVS_EGRESS_STORED, &after), 0);
    CU_ASSERT(same(&before, &after));
    free(before.p);
    free(after.p);
    /* a new UCX client gets the new process's address */
    kvs_client *u2 = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 1, &u2), 0);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u2, &ns, keys, 4, KVS_EGRESS_FP16),
                    4u * ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u2, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    kvs_client_close(u2);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* With ucx_addr_check = on (the default) and the helper missing, kvstashd
 * does not take Connect addresses unchecked: its UCX data plane stays off
 * (Connect UNIMPLEMENTED, so libkvstash uses gRPC) and it serves gRPC. */
static void test_nohelper_no_ucx(void)
{
    char det[KVS_ERR_LEN] = "";
    static const uint8_t killer[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    CU_ASSERT_EQUAL(connect_raw(g_nohelper.addr, NULL, killer, sizeof killer, NULL, det),
                    GRPC_STATUS_UNIMPLEMENTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "data plane disabled"));
    kvs_client *a = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_nohelper.addr, NULL, 0, &a), 0);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(a, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_enabled", NULL, NULL), 0.0);
    kvs_client_close(a);
}

/* The same for the data plane process (ucx_isolate = on, the default):
 * without kvstash-xferd next to kvstashd, no UCX in kvstashd by accident. */
static void test_noxferd_no_ucx(void)
{
    CU_ASSERT_EQUAL_FATAL(unlink(g_nohelper_xferd), 0);
    kvs_server_proc p;
    const char *args[] = {"--log-level", "warn", "--ucx-addr-check", "off", NULL};
    CU_ASSERT_EQUAL_FATAL(kvs_itest_start(g_nohelper_bin, args, &p, "kvstashd without xferd"), 0);
    char det[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(connect_raw(p.addr, NULL, "12345678", 8, NULL, det), GRPC_STATUS_UNIMPLEMENTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "data plane disabled"));
    CU_ASSERT_EQUAL(kvs_server_proc_xferd((pid_t)p.pid), 0);
    CU_ASSERT_EQUAL(kvs_itest_stop(&p, 10000), 0);
}

/* ---- suite "off": kvstashd --ucx off --------------------------------------- */

static int suite_off_init(void)
{
    const char *args[] = {"--ucx", "off", "--log-level", "warn", NULL};
    return kvs_itest_start(g_kvstashd, args, &g_off, "--ucx off");
}

static int suite_off_cleanup(void) { return kvs_itest_stop(&g_off, 10000); }

/* Connect is UNIMPLEMENTED with a message; kvs_client_fetch goes over gRPC by
 * itself, returns the same layers, and counts the fallback. */
static void test_off_fallback(void)
{
    char det[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(connect_raw(g_off.addr, NULL, "12345678", 8, NULL, det),
                    GRPC_STATUS_UNIMPLEMENTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "data plane disabled"));
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_off.addr, NULL, NULL, 2, 7000, &ns, keys, &g, &u);
    for (int i = 0; i < 2; i++)
        check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_FP32);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNIMPL);
    CU_ASSERT_EQUAL(st.fallbacks, 2u);
    CU_ASSERT_EQUAL(st.fetches, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_enabled", NULL, NULL), 0.0);
    /* ucx = 0: plain gRPC, nothing counted */
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(g, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    kvs_client_close(g);
    kvs_client_close(u);
}

/* Several threads fetch through one client (one UCX session) at once; each
 * gets exactly what gRPC Get returns. */
typedef struct par_arg {
    kvs_client *c;
    const kvs_ns *ns;
    unsigned char (*keys)[32];
    const rec *want;
    int ok;
} par_arg;

static void *par_main(void *p)
{
    par_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 5; i++) {
        rec r = {0};
        char err[KVS_ERR_LEN] = "";
        int rc = kvs_client_fetch(a->c, a->ns, (const unsigned char(*)[32])a->keys, 4,
                                  KVS_EGRESS_FP32, 0, -1, rec_cb, &r, err);
        if (rc != 0 || !same(&r, a->want)) {
            fprintf(stderr, "parallel fetch %d: %s: %s\n", i, kvs_strerror(rc), err);
            a->ok = 0;
        }
        free(r.p);
    }
    return NULL;
}

static void test_parallel_fetch(void)
{
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[4][32];
    open_pair(g_srv.addr, TOKEN_B, TOKEN_B, 4, 11000, &ns, keys, &g, &u);
    rec want = {0};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_client_get(g, &ns, (const unsigned char(*)[32])keys, 4,
                                         KVS_EGRESS_FP32, 0, -1, rec_cb, &want, err),
                          0);
    enum { NT = 4 };
    pthread_t th[NT];
    par_arg pa[NT];
    for (int i = 0; i < NT; i++) {
        pa[i] = (par_arg){u, &ns, keys, &want, 0};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, par_main, &pa[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT_TRUE(pa[i].ok);
    }
    free(want.p);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fetches, (unsigned long long)NT * 5);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_refs_held", NULL, NULL), 0.0);
    kvs_client_close(g);
    kvs_client_close(u);
}

/* UCX cannot start on the worker's side (no usable transport: UCX_TLS names
 * none that exists, read when libkvstash creates its UCX context): the fetch
 * still returns the same layers, over gRPC, and the fallback is counted. */
static void test_ucx_start_failure(void)
{
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 2, 9000, &ns, keys, &g, &u);
    const char *old = getenv("UCX_TLS");
    char *saved = old ? strdup(old) : NULL;
    setenv("UCX_TLS", "no_such_transport", 1);
    check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_STORED);
    if (saved) {
        setenv("UCX_TLS", saved, 1);
        free(saved);
    } else {
        unsetenv("UCX_TLS");
    }
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_NOT_EQUAL(st.ucx_status, 0);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.fetches, 0u);
    kvs_client_close(g);
    kvs_client_close(u);
}

/* ---- suite "limits": kvstashd --ucx-max-sessions 2 ---------------------------- */

static kvs_server_proc g_lim;

static int suite_lim_init(void)
{
    const char *args[] = {"--ucx-max-sessions", "2", "--log-level", "warn", NULL};
    return kvs_itest_start(g_kvstashd, args, &g_lim, "--ucx-max-sessions 2");
}

static int suite_lim_cleanup(void) { return kvs_itest_stop(&g_lim, 10000); }

/* Connect beyond ucx_max_sessions: RESOURCE_EXHAUSTED naming the setting;
 * raising it at run time (SetConfig) lets the next one in. */
static void test_max_sessions(void)
{
    const void *wa;
    size_t wl;
    kvs_xfer_client *xc = raw_client(&wa, &wl);
    char det[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(connect_raw(g_lim.addr, NULL, wa, wl, NULL, det), GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(connect_raw(g_lim.addr, NULL, wa, wl, NULL, det), GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(connect_raw(g_lim.addr, NULL, wa, wl, NULL, det),
                    GRPC_STATUS_RESOURCE_EXHAUSTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "ucx_max_sessions"));
    kvs_client *g = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_lim.addr, NULL, 0, &g), 0);
    const char *cn[] = {"ucx_max_sessions"}, *cv[] = {"3"};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_set_config(g, cn, cv, 1, 0, -1, NULL, err), 0);
    CU_ASSERT_EQUAL(connect_raw(g_lim.addr, NULL, wa, wl, NULL, det), GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_sessions", NULL, NULL), 3.0);
    kvs_client_close(g);
    kvs_xfer_client_destroy(xc);
}

/* ---- suite "churn": kvstashd --ucx-max-sessions 2, clients come and go ------ */

static kvs_server_proc g_churn;

static int suite_churn_init(void)
{
    const char *args[] = {"--ucx-max-sessions", "2", "--log-level", "warn", NULL};
    return kvs_itest_start(g_kvstashd, args, &g_churn, "churn");
}

static int suite_churn_cleanup(void)
{
    return kvs_itest_stop(&g_churn, 10000);
}

/* A worker that closes its client ends its UCX session on kvstashd: over
 * shared memory UCX tells the server nothing when a live process closes its
 * endpoint, so without that every closed client's session stayed open and,
 * ucx_max_sessions later, kvstashd refused every new worker's Connect. Here
 * six clients in turn open, fetch over UCX and close, against a limit of two;
 * each fetch must go over UCX, and no session may be left once each closes. */
static void test_closed_clients_release_sessions(void)
{
    kvs_client *g = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_churn.addr, NULL, 0, &g), 0);
    kvs_ns ns = make_ns();
    unsigned char key[1][32];
    CU_ASSERT_EQUAL_FATAL(put_chain(g, &ns, 1, 12000, key), 0);
    double closed0 = kvs_itest_stat(g, "kvstash_xfer_sessions_closed_total", NULL, NULL);
    for (int i = 0; i < 6; i++) {
        kvs_client *u = NULL;
        CU_ASSERT_EQUAL_FATAL(open_client(g_churn.addr, NULL, 1, &u), 0);
        rec got = {0};
        char err[KVS_ERR_LEN] = "";
        CU_ASSERT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])key, 1,
                                         KVS_EGRESS_STORED, 0, -1, rec_cb, &got, err),
                        0);
        CU_ASSERT_EQUAL(got.calls, ns.num_layers);
        free(got.p);
        kvs_client_xfer_stats st;
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
        CU_ASSERT_EQUAL(st.fetches, 1u);
        CU_ASSERT_EQUAL(st.fallbacks, 0u);
        if (st.fallbacks != 0)
            printf("\n    client %d fell back to gRPC (UCX status %s)", i,
                   kvs_strerror(st.ucx_status));
        kvs_client_close(u);
        CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_sessions", NULL, NULL), 0.0);
    }
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_sessions_closed_total", NULL, NULL) - closed0,
                    6.0);
    kvs_client_close(g);
}

/* ---- suites "probe" and "wedge": the receive queue's watchdog --------------------
 *
 * kvstash-xferd probes its own shared-memory receive queue (ucx_server.c,
 * "the receive queue's watchdog"): a worker killed while writing into it
 * wedges it for every client, and the watchdog ends the process so kvstashd
 * starts a fresh one. The real wedge cannot be made on purpose (it needs a
 * SIGKILL inside a few instructions of UCX; soak_bench's churn phase makes it
 * by numbers), so suite "wedge" runs kvstashd with KVS_UCX_PROBE_DEAF=1
 * (probes are never taken as read, as on a wedged queue). Both suites probe
 * every 50 ms and give up after 500 ms. */

static kvs_server_proc g_probe;

static int start_probing(const char *deaf, const char *name)
{
    setenv("KVS_UCX_PROBE_MS", "50", 1);
    setenv("KVS_UCX_WEDGE_MS", "500", 1);
    if (deaf)
        setenv("KVS_UCX_PROBE_DEAF", deaf, 1);
    const char *args[] = {"--log-level", "error", NULL};
    int rc = kvs_itest_start(g_kvstashd, args, &g_probe, name);
    unsetenv("KVS_UCX_PROBE_MS");
    unsetenv("KVS_UCX_WEDGE_MS");
    unsetenv("KVS_UCX_PROBE_DEAF");
    return rc;
}

static int suite_probe_init(void)
{
    return start_probing(NULL, "probe");
}

static int suite_wedge_init(void)
{
    return start_probing("1", "wedge");
}

static int suite_probe_cleanup(void)
{
    return kvs_itest_stop(&g_probe, 10000);
}

static int isolated(void)
{
    const char *iso = getenv("KVS_TEST_UCX_ISOLATE");
    return !(iso && strcmp(iso, "off") == 0);
}

/* A working queue is never taken for a wedged one: 3 s of UCX fetches and
 * puts (probes read between them, 60 probes at least) and the data plane
 * process is the one it started with. */
static void test_probe_quiet(void)
{
    if (!isolated())
        return; /* UCX in kvstashd: no watchdog there */
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[4][32];
    open_pair(g_probe.addr, NULL, NULL, 4, 13000, &ns, keys, &g, &u);
    pid_t x = kvs_server_proc_xferd((pid_t)g_probe.pid);
    CU_ASSERT_FATAL(x > 0);
    unsigned rounds = 0;
    for (double t0 = kvs_test_now_ms(); kvs_test_now_ms() - t0 < 3000; rounds++)
        CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 4, KVS_EGRESS_STORED),
                        4u * ns.num_layers);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(st.fetches, (unsigned long long)rounds);
    CU_ASSERT_EQUAL(kvs_server_proc_xferd((pid_t)g_probe.pid), x);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_proc_restarts_total", NULL, NULL), 0.0);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* Probes that are never read end the data plane process within the wedge
 * time, and kvstashd starts another (and says why in its log, at WARN). */
static void test_wedge_restarts(void)
{
    if (!isolated())
        return;
    kvs_client *g = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_probe.addr, NULL, 0, &g), 0);
    double restarts = 0;
    for (int i = 0; i < 100 && restarts < 1; i++) {
        restarts = kvs_itest_stat(g, "kvstash_xfer_proc_restarts_total", NULL, NULL);
        if (restarts < 1)
            usleep(50 * 1000);
    }
    CU_ASSERT(restarts >= 1);
    kvs_client_close(g);
}

/* ---- suite "stuck": sends to dead shared-memory peers ---------------------------
 *
 * A worker killed mid-fetch over shared memory leaves kvstash-xferd's sends
 * to it pending in UCX for good (ucx_server.c, stuck_tick), each keeping the
 * dead worker's segments mapped. kvstash-xferd counts them
 * (kvstash_xfer_orphans_stuck) and restarts once none of its sessions is open
 * (or at KVS_UCX_STUCK_MAX). Over tcp the sends complete and nothing is
 * stuck. The dying worker is this binary again (--die-mid-fetch), so its UCX
 * and gRPC start fresh after exec. */

static kvs_server_proc g_stuck;

static kvs_ns stuck_ns(void)
{
    return kvs_itest_ns("exact/model", 8, 8, 128, 16, 1 /* fp16 */); /* 512 KiB blocks */
}

static int start_stuck(const char *max, const char *name)
{
    setenv("KVS_UCX_STUCK_MAX", max, 1);
    setenv("KVS_UCX_STUCK_MS", "300", 1);
    const char *args[] = {"--log-level", "error", "--ucx-op-timeout-ms", "1000", NULL};
    int rc = kvs_itest_start(g_kvstashd, args, &g_stuck, name);
    unsetenv("KVS_UCX_STUCK_MAX");
    unsetenv("KVS_UCX_STUCK_MS");
    return rc;
}

static int suite_stuck_init(void)
{
    return start_stuck("100", "stuck");
}

/* Restarts at the first stuck send, with sessions open. */
static int suite_goodbye_init(void)
{
    return start_stuck("1", "goodbye");
}

static int suite_stuck_cleanup(void)
{
    return kvs_itest_stop(&g_stuck, 10000);
}

/* Runs the dying worker (kvs_dying_worker.h) for keys; 1 when it was killed
 * mid-fetch. It dies at block 0's layer 1 on its UCX progress thread, the
 * only thread that drains its receive queue, so the kill always lands while
 * the server still streams the later blocks into that queue. (A callback of
 * kvs_client_fetch runs on the calling thread: on a loaded machine that
 * thread could run after the whole fetch had landed, and the kill then left
 * nothing pending, and a session that only UCX's keepalive ends, 20 s on.) */
static int spawn_die(unsigned char (*keys)[32], unsigned nb)
{
    return kvs_dw_spawn("test_connect", g_stuck.addr, (const unsigned char(*)[32])keys, nb);
}

/* The dying worker's main (test_connect --die-mid-fetch ...). */
static int die_main(int argc, char **argv)
{
    kvs_dw_opts o = {.thread = KVS_DW_ON_PROGRESS, .block = 0, .layer = 1};
    return kvs_dw_main(argc, argv, &o);
}

/* A gRPC client g, a UCX client u with its session open (one fetch done),
 * and 16 blocks of stuck_ns from base stored (their keys in keys). */
static void stuck_open(unsigned base, kvs_client **g, kvs_client **u, unsigned char (*keys)[32])
{
    kvs_ns ns = stuck_ns();
    CU_ASSERT_EQUAL_FATAL(open_client(g_stuck.addr, NULL, 0, g), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_stuck.addr, NULL, 1, u), 0);
    CU_ASSERT_EQUAL_FATAL(put_chain(*g, &ns, 16, base, keys), 0);
    CU_ASSERT_EQUAL_FATAL(check_fetch_equals_get(*g, *u, &ns, keys, 1, KVS_EGRESS_STORED),
                          ns.num_layers);
}

/* Over shared memory: workers killed mid-fetch leave stuck sends (counted)
 * while another worker's session is open, and no restart; once that session
 * closes kvstash-xferd restarts, and a new worker fetches over UCX again.
 * Over tcp: nothing is stuck, nothing restarts. */
static void test_stuck_restarts_when_idle(void)
{
    if (!isolated())
        return; /* UCX in kvstashd: no process to restart */
    const char *tls = getenv("UCX_TLS");
    int shm = !(tls && strcmp(tls, "tcp") == 0);
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns = stuck_ns();
    unsigned char keys[16][32];
    stuck_open(71000, &g, &u, keys); /* u's session stays open through the kills */
    double stuck = 0;
    int kills = 0;
    for (; kills < (shm ? 4 : 1) && stuck < 1; kills++) {
        CU_ASSERT_FATAL(spawn_die(keys, 16));
        /* its session times out (1 s), its sends are stuck 0.3 s later */
        for (int i = 0; i < 40 && stuck < 1; i++) {
            usleep(100 * 1000);
            stuck = kvs_itest_stat(g, "kvstash_xfer_orphans_stuck", NULL, NULL);
        }
    }
    printf("  stuck: %d worker(s) killed mid-fetch, %.0f send(s) stuck\n", kills, stuck);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_proc_restarts_total", NULL, NULL), 0.0);
    CU_ASSERT(shm ? stuck >= 1 : stuck == 0);
    kvs_client_close(u); /* the last open session */
    double restarts = 0;
    for (int i = 0; i < 100 && restarts < 1; i++) {
        usleep(50 * 1000);
        restarts = kvs_itest_stat(g, "kvstash_xfer_proc_restarts_total", NULL, NULL);
    }
    CU_ASSERT_EQUAL(restarts, shm ? 1.0 : 0.0);
    double serving = 0;
    for (int i = 0; i < 200 && serving == 0; i++) {
        serving = kvs_itest_stat(g, "kvstash_xfer_proc_pid", NULL, NULL);
        if (serving == 0)
            usleep(50 * 1000);
    }
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_orphans_stuck", NULL, NULL), 0.0);
    kvs_client *u2 = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_stuck.addr, NULL, 1, &u2), 0);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u2, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u2, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    kvs_client_close(u2);
    kvs_client_close(g);
}

/* A data plane process that ends itself says goodbye to every open session
 * first (ucx_server.c, say_goodbye): over shared memory nothing else tells a
 * worker before UCX's keepalive (20 s) or its own op timeout. Here the first
 * stuck send restarts it while u's session is open: u leaves UCX within 2 s
 * of the restart without a call of its own, and its next fetch brings the
 * same bytes (gRPC, or UCX again once it reconnected). Shared memory only:
 * over tcp nothing gets stuck. */
static void test_goodbye_on_restart(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!isolated() || (tls && strcmp(tls, "tcp") == 0))
        return;
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns = stuck_ns();
    unsigned char keys[16][32];
    stuck_open(72000, &g, &u, keys);
    double restarts = 0;
    for (int kills = 0; kills < 4 && restarts < 1; kills++) {
        CU_ASSERT_FATAL(spawn_die(keys, 16));
        for (int i = 0; i < 40 && restarts < 1; i++) {
            usleep(100 * 1000);
            restarts = kvs_itest_stat(g, "kvstash_xfer_proc_restarts_total", NULL, NULL);
        }
    }
    CU_ASSERT_FATAL(restarts >= 1);
    double t0 = kvs_test_now_ms();
    kvs_client_xfer_stats st;
    memset(&st, 0, sizeof st);
    while (st.ucx_status == 0 && kvs_test_now_ms() - t0 < 5000) {
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
        if (st.ucx_status == 0)
            usleep(10 * 1000);
    }
    double ms = kvs_test_now_ms() - t0;
    printf("  goodbye: the worker left UCX %.0f ms after the restart was seen (status %d)\n", ms,
           st.ucx_status);
    CU_ASSERT(st.ucx_status != 0 && ms < 2000);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* ---- puts over UCX (kvs_client_put_ucx, service/data_connect.c put_begin) ---- */

/* The chain keys of the first n blocks of the prompt from base (Lookup). */
static unsigned lookup_keys(kvs_client *c, const kvs_ns *ns, unsigned base, size_t n,
                            unsigned char (*keys)[32])
{
    unsigned tokens[64];
    for (unsigned i = 0; i < n * 16; i++)
        tokens[i] = base + i * 7u;
    kvs_lookup_result *lr = NULL;
    char err[KVS_ERR_LEN] = "";
    if (kvs_client_lookup(c, ns, tokens, n * 16, 0, -1, &lr, err) != 0)
        return 0;
    unsigned m = lr->matched_blocks;
    for (unsigned i = 0; i < m; i++)
        memcpy(keys[i], lr->blocks[i].key, 32);
    kvs_client_unpin(c, ns, NULL, 0, lr->lease_id, -1, NULL, NULL);
    kvs_lookup_result_free(lr);
    return m;
}

/* A put over UCX is a put: the same chain put over gRPC (int8 root, fp16
 * child), deleted, then put over UCX with the same data, gives the same keys
 * (Lookup, and in the UCX put's own answer, so block 1 chains on block 0's
 * reply), the same stored blocks byte for byte, and fp16 back bit-exact. */
static void test_put_ucx_equals_grpc(void)
{
    kvs_client *g = NULL, *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 1, &u), 0);
    kvs_ns ns = make_ns();
    const unsigned base = 20000;
    kvs_put_result r;
    unsigned char kg[2][32], ku[2][32];
    unsigned long long sg[2];
    CU_ASSERT_EQUAL_FATAL(put_one(g, &ns, base, 0, NULL, 4, 0, &r), 0);
    memcpy(kg[0], r.key, 32);
    sg[0] = r.stored_bytes;
    CU_ASSERT_EQUAL_FATAL(put_one(g, &ns, base, 1, kg[0], 1, 0, &r), 0);
    memcpy(kg[1], r.key, 32);
    sg[1] = r.stored_bytes;
    rec g_st = {0}, g_16 = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, kg, 2, KVS_EGRESS_STORED, &g_st), 0);
    CU_ASSERT_EQUAL(get_rec(g, &ns, kg, 2, KVS_EGRESS_FP16, &g_16), 0);
    unsigned deleted = 0;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_delete(g, &ns, (const unsigned char(*)[32])kg, 1, 1, -1, &deleted,
                                      err),
                    0);
    CU_ASSERT_EQUAL(deleted, 2u);
    CU_ASSERT_EQUAL(lookup_keys(g, &ns, base, 2, ku), 0u);

    double puts0 = kvs_itest_stat(g, "kvstash_xfer_puts_total", NULL, NULL);
    CU_ASSERT_EQUAL(put_one(u, &ns, base, 0, NULL, 4, 1, &r), 0);
    CU_ASSERT_EQUAL(r.already_present, 0);
    /* the UCX answer carries the chain key and size, as gRPC Put's does */
    CU_ASSERT_EQUAL(memcmp(r.key, kg[0], 32), 0);
    CU_ASSERT_EQUAL(r.stored_bytes, sg[0]);
    CU_ASSERT_EQUAL_FATAL(lookup_keys(g, &ns, base, 1, ku), 1u);
    CU_ASSERT_EQUAL(memcmp(ku[0], kg[0], 32), 0);
    unsigned char parent[32];
    memcpy(parent, r.key, 32); /* chained on the reply's key */
    CU_ASSERT_EQUAL(put_one(u, &ns, base, 1, parent, 1, 1, &r), 0);
    CU_ASSERT_EQUAL(memcmp(r.key, kg[1], 32), 0);
    CU_ASSERT_EQUAL(r.stored_bytes, sg[1]);
    CU_ASSERT_EQUAL_FATAL(lookup_keys(g, &ns, base, 2, ku), 2u);
    CU_ASSERT_EQUAL(memcmp(ku[1], kg[1], 32), 0);
    rec u_st = {0}, u_16 = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, ku, 2, KVS_EGRESS_STORED, &u_st), 0);
    CU_ASSERT_EQUAL(get_rec(g, &ns, ku, 2, KVS_EGRESS_FP16, &u_16), 0);
    check_same(KVS_EGRESS_STORED, &g_st, &u_st);
    check_same(KVS_EGRESS_FP16, &g_16, &u_16);
    /* the fp16 block (block 1) comes back as it was sent, bit for bit */
    tblock t;
    tblock_make(&ns, base, 1, &t);
    rec in = {0};
    size_t lb = (size_t)16 * ns.num_kv_heads * ns.head_dim * 2;
    for (unsigned l = 0; l < ns.num_layers; l++)
        rec_cb(&in, 0, l, t.k[l], lb, t.v[l], lb, 0, 0, l + 1 == ns.num_layers);
    tblock_free(&ns, &t);
    rec one = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, ku + 1, 1, KVS_EGRESS_FP16, &one), 0);
    check_same(KVS_EGRESS_FP16, &in, &one);
    /* a second put of a cached block: already present, nothing moves */
    CU_ASSERT_EQUAL(put_one(u, &ns, base, 1, ku[0], 1, 1, &r), 0);
    CU_ASSERT_EQUAL(r.already_present, 1);
    CU_ASSERT_EQUAL(memcmp(r.key, kg[1], 32), 0);
    CU_ASSERT_EQUAL(r.stored_bytes, sg[1]);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_puts_total", NULL, NULL) - puts0, 2.0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_store_reserved_bytes", NULL, NULL), 0.0);
    free(g_st.p);
    free(g_16.p);
    free(u_st.p);
    free(u_16.p);
    free(in.p);
    free(one.p);
    kvs_client_close(g);
    kvs_client_close(u);
}

/* A UCX put beside gRPC Puts: put_end waits for its layers on the ingest
 * pool, whose queue it shares with gRPC Put's layers (it takes back its
 * layers no pool thread has started). Threads keep the pool's queue long with
 * gRPC Puts of a big block while small UCX puts run: every put of both kinds
 * must succeed and both must make progress (a put_end that waited on a job
 * nobody runs would hang here: ctest's timeout). The medians are printed, not
 * asserted (speed belongs to the benchmarks): a small UCX put took 0.4-0.48x
 * a big gRPC Put's median when its layers waited in the queue, <= 0.08x once
 * put_end took them back (docs/BENCHMARKS.md). */
#define LOAD_THREADS 4
#define LOAD_MAX     4096

typedef struct grpc_load {
    kvs_client *c;
    unsigned seed, n;
    int failed; /* a gRPC Put answered an error */
    atomic_int *stop;
    double ms[LOAD_MAX];
} grpc_load;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *grpc_load_main(void *arg)
{
    grpc_load *g = arg;
    kvs_ns ns = kvs_itest_ns("exact/big", 8, 8, 128, 128, 1 /* fp16 */);
    while (!atomic_load(g->stop) && g->n < LOAD_MAX) {
        kvs_put_result r;
        double t0 = kvs_test_now_ms();
        if (put_one(g->c, &ns, g->seed + 1000 * g->n, 0, NULL, 4, 0, &r) != 0) {
            g->failed = 1;
            break;
        }
        g->ms[g->n++] = kvs_test_now_ms() - t0;
    }
    return NULL;
}

static void test_put_ucx_beside_grpc(void)
{
    kvs_client *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 1, &u), 0);
    kvs_ns ns = make_ns();
    kvs_put_result r;
    CU_ASSERT_EQUAL_FATAL(put_one(u, &ns, 50000, 0, NULL, 4, 1, &r), 0); /* connects */
    atomic_int stop = 0;
    static grpc_load g[LOAD_THREADS];
    pthread_t th[LOAD_THREADS];
    for (int i = 0; i < LOAD_THREADS; i++) {
        memset(&g[i], 0, sizeof g[i]);
        CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g[i].c), 0);
        g[i].seed = 60000000u * (unsigned)(i + 1);
        g[i].stop = &stop;
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, grpc_load_main, &g[i]), 0);
    }
    usleep(300000);
    static double ums[LOAD_MAX];
    unsigned n = 0;
    for (double until = kvs_test_now_ms() + 2000; kvs_test_now_ms() < until && n < LOAD_MAX; n++) {
        double t0 = kvs_test_now_ms();
        CU_ASSERT_EQUAL(put_one(u, &ns, 50001 + n, 0, NULL, 4, 1, &r), 0);
        ums[n] = kvs_test_now_ms() - t0;
    }
    atomic_store(&stop, 1);
    static double gms[LOAD_THREADS * LOAD_MAX];
    unsigned gn = 0;
    for (int i = 0; i < LOAD_THREADS; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT_EQUAL(g[i].failed, 0);
        kvs_client_close(g[i].c);
        memcpy(gms + gn, g[i].ms, g[i].n * sizeof g[i].ms[0]);
        gn += g[i].n;
    }
    CU_ASSERT_FATAL(n > 0 && gn > 0);
    /* Every put answered: none still holds staged bytes for a put-end thread
     * (the count drops before the answer goes out). */
    CU_ASSERT_EQUAL(kvs_itest_stat(u, "kvstash_xfer_put_end_bytes", NULL, NULL), 0);
    qsort(ums, n, sizeof ums[0], cmp_double);
    qsort(gms, gn, sizeof gms[0], cmp_double);
    double um = ums[n / 2], gm = gms[gn / 2];
    fprintf(
        stderr,
        "put_ucx_beside_grpc: %u UCX puts median %.2f ms (max %.2f); %u gRPC Puts median %.2f ms\n",
        n, um, ums[n - 1], gn, gm);
    kvs_client_close(u);
}

/* A raw transfer client with a session of token's tenant on addr. */
/* A UCX session opened by hand (Connect, then kvs_xfer_client_connect): what
 * the data plane process knows of it (id, token) and the put key it does not. */
typedef struct raw_sess {
    kvs_xfer_client *xc;
    uint64_t id; /* the session's id and token, as Connect gave them */
    uint8_t token[KVS_XFER_TOKEN_LEN];
    uint8_t put_key[KVS_PUTMAC_KEY_LEN];
    uint64_t seq;             /* the last sequence number sealed */
    int64_t clock_off_ms;     /* kvstashd's clock minus ours (Connect) */
    kvs_xfer_put_reply reply; /* of the last raw_put_seal */
} raw_sess;

static int raw_session(const char *addr, const char *token, raw_sess *rs)
{
    memset(rs, 0, sizeof *rs);
    kvs_xfer_client_opts o = {.err_mode = KVS_XFER_ERR_PEER, .timeout_ms = 10000};
    if (kvs_xfer_client_create(&o, &rs->xc) != 0)
        return -1;
    const void *wa;
    size_t wl;
    Kvstash__V1__ConnectResponse *r = NULL;
    char det[KVS_ERR_LEN] = "";
    int rc = -1;
    if (kvs_xfer_client_address(rs->xc, &wa, &wl) == 0 &&
        connect_raw(addr, token, wa, wl, &r, det) == GRPC_STATUS_OK && r != NULL &&
        r->put_key.len == KVS_PUTMAC_KEY_LEN) {
        kvs_xfer_session_info info = {.id = r->session_id};
        memcpy(info.token, r->session_token.data, 16);
        rs->id = info.id;
        memcpy(rs->token, info.token, sizeof rs->token);
        memcpy(rs->put_key, r->put_key.data, KVS_PUTMAC_KEY_LEN);
        rs->clock_off_ms = (int64_t)r->server_clock_ms - (int64_t)kvs_putmac_now_ms();
        rc = kvs_xfer_client_connect(rs->xc, r->worker_address.data, r->worker_address.len, &info);
    }
    if (r)
        kvstash__v1__connect_response__free_unpacked(r, NULL);
    if (rc != 0) {
        kvs_xfer_client_destroy(rs->xc);
        rs->xc = NULL;
    }
    return rc;
}

/* How raw_put_seal seals: as libkvstash does, not at all, with a key other
 * than the session's (all a process without the put key can do), correctly
 * and then a payload or header byte changed on the way (what the data plane
 * process could do to a put in its bounce memory), or correctly but expired
 * a second ago (a put the data plane process held back). */
enum {
    SEAL_GOOD,
    SEAL_NONE,
    SEAL_OTHER_KEY,
    SEAL_BYTES_CHANGED,
    SEAL_HEADER_CHANGED,
    SEAL_EXPIRED
};

/* One raw UCX put of payload (NULL: len zero bytes) under the UCX key ukey
 * (NULL: all zero), header hdr sealed with sequence number seq as `how`
 * says; the server's verdict, its answer in rs->reply. */
static int raw_put_seal(raw_sess *rs, const unsigned char *ukey, const void *hdr, size_t hl,
                        const void *payload, uint64_t len, int how, uint64_t seq)
{
    kvs_xfer_put_req req;
    memset(&req, 0, sizeof req);
    uint8_t *buf = calloc(1, len ? len : 1);
    uint8_t *meta = malloc(hl + KVS_PUTMAC_TRAILER_LEN);
    if (buf == NULL || meta == NULL) {
        free(buf);
        free(meta);
        return KVS_ENOMEM;
    }
    if (payload)
        memcpy(buf, payload, len);
    if (hl)
        memcpy(meta, hdr, hl);
    if (ukey)
        memcpy(req.key, ukey, 32);
    req.meta_len = (uint32_t)hl;
    if (how != SEAL_NONE) {
        uint8_t key[KVS_PUTMAC_KEY_LEN];
        memcpy(key, rs->put_key, sizeof key);
        if (how == SEAL_OTHER_KEY)
            CU_ASSERT_EQUAL(kvs_putmac_keygen(key), 0);
        int64_t server_now = (int64_t)kvs_putmac_now_ms() + rs->clock_off_ms;
        kvs_putmac_put pm = {.seq = seq,
                             .expires_ms =
                                 (uint64_t)(server_now + (how == SEAL_EXPIRED ? -1000 : 60000)),
                             .ukey = req.key,
                             .fmt = KVS_XFER_FMT_STORED};
        CU_ASSERT_EQUAL(kvs_putmac_seal(key, &pm, meta, hl, buf, len), 0);
        req.meta_len += KVS_PUTMAC_TRAILER_LEN;
        if (how == SEAL_BYTES_CHANGED)
            buf[len / 2] ^= 0x40;
        if (how == SEAL_HEADER_CHANGED)
            meta[hl - 1] ^= 0x01; /* a bit of the last token id (still a valid header) */
    }
    req.format = KVS_XFER_FMT_STORED;
    req.buf = buf;
    req.len = len;
    req.meta = meta;
    int rc = kvs_xfer_put_wait(rs->xc, &req);
    rs->reply = req.reply;
    free(buf);
    free(meta);
    return rc;
}

/* Whether the last raw put's answer (status st) carries kvstashd's tag. */
static int reply_genuine(const raw_sess *rs, uint64_t seq, int st)
{
    return kvs_putmac_reply_verify(rs->put_key, seq, st, rs->reply.key, rs->reply.stored_bytes,
                                   rs->reply.tag) == 0;
}

/* One raw UCX put of len zero bytes, sealed as libkvstash seals. */
static int raw_put_run(raw_sess *rs, const unsigned char *key, const void *meta, size_t meta_len,
                       uint64_t len)
{
    return raw_put_seal(rs, key, meta, meta_len, NULL, len, SEAL_GOOD, ++rs->seq);
}

/* A packed PutHeader of ns with n_tokens ids from tokens (NULL: 30000, 30001,
 * ...; n_tokens <= 32 then); *len its size. */
static uint8_t *pack_header(const kvs_ns *ns, const unsigned *tokens, size_t n_tokens,
                            unsigned index, const unsigned char *parent, size_t *len)
{
    Kvstash__V1__Layout lay = KVSTASH__V1__LAYOUT__INIT;
    lay.num_layers = ns->num_layers;
    lay.num_kv_heads = ns->num_kv_heads;
    lay.head_dim = ns->head_dim;
    lay.block_tokens = ns->block_tokens;
    lay.dtype = (Kvstash__V1__Dtype)ns->dtype;
    Kvstash__V1__Namespace pns = KVSTASH__V1__NAMESPACE__INIT;
    pns.model = (char *)ns->model;
    pns.salt = (char *)ns->salt;
    pns.layout = &lay;
    uint32_t ids[32];
    for (unsigned i = 0; i < 32; i++)
        ids[i] = 30000 + i;
    Kvstash__V1__PutHeader h = KVSTASH__V1__PUT_HEADER__INIT;
    h.ns = &pns;
    h.tokens = tokens ? (uint32_t *)tokens : ids;
    h.n_tokens = n_tokens;
    h.index = index;
    if (parent) {
        h.parent_key.data = (uint8_t *)parent;
        h.parent_key.len = 32;
    }
    *len = kvstash__v1__put_header__get_packed_size(&h);
    uint8_t *p = malloc(*len + 1);
    kvstash__v1__put_header__pack(&h, p);
    return p;
}

/* The gRPC status of a Put stream that sends only this header (packed). */
static grpc_status_code grpc_header_only(const char *addr, const char *token, const uint8_t *hdr,
                                         size_t hlen)
{
    Kvstash__V1__PutHeader *h = kvstash__v1__put_header__unpack(NULL, hlen, hdr);
    if (h == NULL)
        return GRPC_STATUS_UNKNOWN;
    Kvstash__V1__PutRequest req = KVSTASH__V1__PUT_REQUEST__INIT;
    req.msg_case = KVSTASH__V1__PUT_REQUEST__MSG_HEADER;
    req.header = h;
    size_t n = kvstash__v1__put_request__get_packed_size(&req);
    uint8_t *b = malloc(n + 1);
    kvstash__v1__put_request__pack(&req, b);
    grpc_byte_buffer *bb = kvs_itest_bb_from(b, n);
    char det[KVS_ERR_LEN] = "";
    grpc_status_code st = kvs_itest_raw_stream(addr, token, "/kvstash.v1.KvStash/Put", &bb, 1, -1,
                                               10000, det, sizeof det);
    grpc_byte_buffer_destroy(bb);
    free(b);
    kvstash__v1__put_header__free_unpacked(h, NULL);
    return st;
}

/* Bad puts over UCX get the status gRPC Put gives the same header (as
 * libkvstash maps it), and the server keeps serving; nothing is reserved. */
static void test_put_ucx_bad_header(void)
{
    kvs_ns ns = make_ns();
    raw_sess rs;
    CU_ASSERT_EQUAL_FATAL(raw_session(g_srv.addr, TOKEN_A, &rs), 0);
    uint64_t len = 2ull * 16 * ns.num_kv_heads * ns.head_dim * 2 * ns.num_layers;
    size_t hl;
    unsigned char nope[32];
    memset(nope, 0x3c, sizeof nope);
    const struct {
        const char *what;
        size_t n_tokens;
        unsigned index;
        const unsigned char *parent;
        grpc_status_code want;
    } bad[] = {
        {"15 token ids for a 16-token block", 15, 0, NULL, GRPC_STATUS_INVALID_ARGUMENT},
        {"index 1 without a parent", 16, 1, NULL, GRPC_STATUS_INVALID_ARGUMENT},
        {"a parent that is not cached", 16, 1, nope, GRPC_STATUS_FAILED_PRECONDITION},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *h = pack_header(&ns, NULL, bad[i].n_tokens, bad[i].index, bad[i].parent, &hl);
        grpc_status_code gs = grpc_header_only(g_srv.addr, TOKEN_A, h, hl);
        int rc = raw_put_run(&rs, NULL, h, hl, len);
        CU_ASSERT_EQUAL(gs, bad[i].want);
        CU_ASSERT_EQUAL(rc, kvs_status_from_grpc((int)gs));
        if (gs != bad[i].want || rc != kvs_status_from_grpc((int)gs))
            fprintf(stderr, "bad header (%s): gRPC status %d, over UCX %s\n", bad[i].what, (int)gs,
                    kvs_strerror(rc));
        free(h);
    }
    /* a good header, but a claimed key that is not its chain key; then too few bytes */
    uint8_t *h = pack_header(&ns, NULL, 16, 0, NULL, &hl);
    CU_ASSERT_EQUAL(raw_put_run(&rs, nope, h, hl, len), KVS_EINVAL);
    CU_ASSERT_EQUAL(raw_put_run(&rs, NULL, h, hl, len - 2), KVS_EINVAL);
    free(h);
    /* metadata that is no PutHeader, and an empty header (sealed); no metadata at all */
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    CU_ASSERT_EQUAL(raw_put_run(&rs, NULL, garbage, sizeof garbage, len), KVS_EINVAL);
    CU_ASSERT_TRUE(reply_genuine(&rs, rs.seq, KVS_EINVAL)); /* sealed: its answer is tagged */
    CU_ASSERT_EQUAL(raw_put_run(&rs, NULL, NULL, 0, len), KVS_EINVAL);
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, NULL, 0, NULL, len, SEAL_NONE, 0), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_xfer_client_status(rs.xc), 0); /* refusals, not failures */
    kvs_xfer_client_destroy(rs.xc);
    /* the same through libkvstash: returned as is, no fallback */
    kvs_client *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 1, &u), 0);
    kvs_put_result r;
    CU_ASSERT_EQUAL(put_one(u, &ns, 31000, 1, NULL, 0, 1, &r), KVS_EINVAL);
    CU_ASSERT_EQUAL(put_one(u, &ns, 31000, 1, nope, 0, 1, &r), KVS_EPRECOND);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(u, "kvstash_store_reserved_bytes", NULL, NULL), 0.0);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(u, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    kvs_client_close(u);
}

/* Another tenant's UCX session cannot put into my chain: my parent is not
 * its block (FAILED_PRECONDITION), my key cannot be claimed, and its own
 * root lands under its own key; nothing of mine changes. */
static void test_put_ucx_cross_tenant(void)
{
    kvs_client *a = NULL, *b = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &a), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_B, 1, &b), 0);
    kvs_ns ns = make_ns();
    const unsigned base = 40000;
    kvs_put_result r;
    unsigned char ka[2][32], kb[2][32];
    CU_ASSERT_EQUAL_FATAL(put_one(a, &ns, base, 0, NULL, 4, 0, &r), 0);
    memcpy(ka[0], r.key, 32);
    rec before = {0};
    CU_ASSERT_EQUAL(get_rec(a, &ns, ka, 1, KVS_EGRESS_STORED, &before), 0);
    /* b puts a child of my block: not its parent */
    CU_ASSERT_EQUAL(put_one(b, &ns, base, 1, ka[0], 1, 1, &r), KVS_EPRECOND);
    /* b claims my root's key for the same tokens */
    raw_sess rs;
    CU_ASSERT_EQUAL_FATAL(raw_session(g_srv.addr, TOKEN_B, &rs), 0);
    tblock t;
    tblock_make(&ns, base, 0, &t);
    size_t hl;
    uint8_t *h = pack_header(&ns, t.tokens, 16, 0, NULL, &hl);
    uint64_t len = 2ull * 16 * ns.num_kv_heads * ns.head_dim * 2 * ns.num_layers;
    CU_ASSERT_EQUAL(raw_put_run(&rs, ka[0], h, hl, len), KVS_EINVAL);
    free(h);
    tblock_free(&ns, &t);
    kvs_xfer_client_destroy(rs.xc);
    /* b's own root with the same tokens: stored under b's key */
    CU_ASSERT_EQUAL(put_one(b, &ns, base, 0, NULL, 1, 1, &r), 0);
    CU_ASSERT_EQUAL(r.already_present, 0);
    CU_ASSERT_EQUAL_FATAL(lookup_keys(b, &ns, base, 1, kb), 1u);
    CU_ASSERT_NOT_EQUAL(memcmp(kb[0], ka[0], 32), 0);
    CU_ASSERT_EQUAL_FATAL(lookup_keys(a, &ns, base, 2, ka + 1), 1u); /* still mine */
    CU_ASSERT_EQUAL(memcmp(ka[1], ka[0], 32), 0);
    rec after = {0};
    CU_ASSERT_EQUAL(get_rec(a, &ns, ka, 1, KVS_EGRESS_STORED, &after), 0);
    check_same(KVS_EGRESS_STORED, &before, &after);
    free(before.p);
    free(after.p);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(b, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    kvs_client_close(a);
    kvs_client_close(b);
}

/* The raw layers of block b of base as libkvstash puts them (per layer [K][V]). */
static uint8_t *raw_layers(const kvs_ns *ns, unsigned base, size_t b, uint64_t *len)
{
    tblock t;
    tblock_make(ns, base, b, &t);
    size_t lb = (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim * 2;
    *len = 2ull * lb * ns->num_layers;
    uint8_t *raw = malloc(*len);
    for (unsigned l = 0; raw && l < ns->num_layers; l++) {
        memcpy(raw + 2 * (size_t)l * lb, t.k[l], lb);
        memcpy(raw + (2 * (size_t)l + 1) * lb, t.v[l], lb);
    }
    tblock_free(ns, &t);
    return raw;
}

/* Sealed puts (docs/TRANSFER.md): what the data plane process knows of a
 * session (its id and token) is not enough to put. A put without the seal,
 * sealed with another key, sealed and then changed in its bytes or header,
 * or expired (held back) is refused, with nothing stored or reserved; so is
 * a header seal checked before the header (a forged put of the wrong length
 * gets KVS_EUNAUTH, not the length's KVS_EINVAL), and a forged put with a
 * far sequence number uses up nothing. A good put is stored and its answer
 * (stored, cached already, refused) carries kvstashd's tag; played again
 * (same sequence number) it is refused, cached or deleted, and one session's
 * seal does not open another's. Each refusal is counted; libkvstash's own
 * puts are sealed, their answers check, and they never fall back. */
static void test_put_ucx_sealed(void)
{
    kvs_ns ns = make_ns();
    const unsigned base = 45000;
    tblock t;
    tblock_make(&ns, base, 0, &t);
    size_t hl;
    uint8_t *h = pack_header(&ns, t.tokens, 16, 0, NULL, &hl);
    tblock_free(&ns, &t);
    uint64_t len;
    uint8_t *raw = raw_layers(&ns, base, 0, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(raw);
    raw_sess rs, other;
    CU_ASSERT_EQUAL_FATAL(raw_session(g_srv.addr, TOKEN_A, &rs), 0);
    CU_ASSERT_EQUAL_FATAL(raw_session(g_srv.addr, TOKEN_A, &other), 0);
    kvs_client *a = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &a), 0);
    unsigned char got[1][32];
    double refused0 = kvs_itest_stat(a, "kvstash_xfer_put_seal_refused_total", NULL, NULL);
    const struct {
        const char *what;
        int how;
    } bad[] = {
        {"no seal", SEAL_NONE},
        {"sealed with another key", SEAL_OTHER_KEY},
        {"a payload byte changed after sealing", SEAL_BYTES_CHANGED},
        {"a header byte changed after sealing", SEAL_HEADER_CHANGED},
        {"expired", SEAL_EXPIRED},
    };
    const double nbad = sizeof bad / sizeof bad[0];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = raw_put_seal(&rs, NULL, h, hl, raw, len, bad[i].how, ++rs.seq);
        CU_ASSERT_EQUAL(rc, KVS_EUNAUTH);
        if (rc != KVS_EUNAUTH)
            fprintf(stderr, "sealed put, %s: %s\n", bad[i].what, kvs_strerror(rc));
        CU_ASSERT_EQUAL(lookup_keys(a, &ns, base, 1, got), 0u); /* nothing stored */
        CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_store_reserved_bytes", NULL, NULL), 0.0);
    }
    /* the header seal comes first: a forged put with a length the layout
     * does not have is refused for its seal, not for its length */
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h, hl, raw, len - 2, SEAL_OTHER_KEY, ++rs.seq),
                    KVS_EUNAUTH);
    /* a forged put far ahead uses up no number: the next genuine one passes */
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h, hl, raw, len, SEAL_OTHER_KEY, rs.seq + 5000),
                    KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_put_seal_refused_total", NULL, NULL),
                    refused0 + nbad + 2);
    /* the session still works: the same put sealed as it should be is
     * stored, and its answer is kvstashd's */
    const uint64_t good = ++rs.seq;
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h, hl, raw, len, SEAL_GOOD, good), 0);
    CU_ASSERT_TRUE(reply_genuine(&rs, good, 0));
    CU_ASSERT_FALSE(reply_genuine(&rs, good, KVS_EEXIST)); /* the tag binds the status */
    CU_ASSERT_FALSE(reply_genuine(&rs, good + 1, 0));      /* and the put */
    CU_ASSERT_EQUAL_FATAL(lookup_keys(a, &ns, base, 1, got), 1u);
    CU_ASSERT_EQUAL(memcmp(rs.reply.key, got[0], 32), 0);
    /* the same block under a new number: cached already, the answer says so
     * with the block's key, tagged */
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h, hl, raw, len, SEAL_GOOD, ++rs.seq), KVS_EEXIST);
    CU_ASSERT_TRUE(reply_genuine(&rs, rs.seq, KVS_EEXIST));
    CU_ASSERT_EQUAL(memcmp(rs.reply.key, got[0], 32), 0);
    /* a genuine put kvstashd refuses (15 token ids): the refusal is tagged too */
    size_t hl15;
    uint8_t *h15 = pack_header(&ns, NULL, 15, 0, NULL, &hl15);
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h15, hl15, raw, len, SEAL_GOOD, ++rs.seq), KVS_EINVAL);
    CU_ASSERT_TRUE(reply_genuine(&rs, rs.seq, KVS_EINVAL));
    free(h15);
    /* played again: refused while cached and after a Delete */
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h, hl, raw, len, SEAL_GOOD, good), KVS_EUNAUTH);
    unsigned deleted = 0;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(
        kvs_client_delete(a, &ns, (const unsigned char(*)[32])got, 1, 0, -1, &deleted, err), 0);
    CU_ASSERT_EQUAL(deleted, 1u);
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h, hl, raw, len, SEAL_GOOD, good), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(lookup_keys(a, &ns, base, 1, got), 0u);
    /* a seal made with this session's key does not open another session's */
    memcpy(other.put_key, rs.put_key, sizeof rs.put_key);
    CU_ASSERT_EQUAL(raw_put_seal(&other, NULL, h, hl, raw, len, SEAL_GOOD, ++rs.seq), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(lookup_keys(a, &ns, base, 1, got), 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_put_seal_refused_total", NULL, NULL),
                    refused0 + nbad + 5);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_store_reserved_bytes", NULL, NULL), 0.0);
    CU_ASSERT_EQUAL(kvs_xfer_client_status(rs.xc), 0); /* refusals, not failures */
    kvs_xfer_client_destroy(rs.xc);
    kvs_xfer_client_destroy(other.xc);
    /* libkvstash seals its puts: stored over UCX, no fallback */
    kvs_client *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 1, &u), 0);
    kvs_put_result r;
    double puts0 = kvs_itest_stat(a, "kvstash_xfer_puts_total", NULL, NULL);
    CU_ASSERT_EQUAL(put_one(u, &ns, base, 0, NULL, 4, 1, &r), 0);
    unsigned char parent[32];
    memcpy(parent, r.key, sizeof parent);
    CU_ASSERT_EQUAL(put_one(u, &ns, base, 1, parent, 4, 1, &r), 0);
    CU_ASSERT_EQUAL(put_one(u, &ns, base, 1, parent, 4, 1, &r), 0); /* cached: EEXIST's answer */
    CU_ASSERT_EQUAL(r.already_present, 1);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_puts_total", NULL, NULL), puts0 + 2);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.ucx_status, 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_put_seal_refused_total", NULL, NULL),
                    refused0 + nbad + 5);
    kvs_client_close(u);
    kvs_client_close(a);
    free(raw);
    free(h);
}

/* Connect's close: a session closed by its own tenant with its id and token
 * stores no put any more (and is gone); a wrong token, another tenant, or a
 * session closed already change nothing and get the same answer; a token of
 * the wrong size is refused; a close with an address opens a new session. */
static void test_close_session(void)
{
    kvs_ns ns = make_ns();
    uint64_t len;
    size_t hl[4];
    uint8_t *h[4], *raw[4];
    for (unsigned i = 0; i < 4; i++) {
        tblock t;
        tblock_make(&ns, 46000 + 1000 * i, 0, &t);
        h[i] = pack_header(&ns, t.tokens, 16, 0, NULL, &hl[i]);
        tblock_free(&ns, &t);
        raw[i] = raw_layers(&ns, 46000 + 1000 * i, 0, &len);
        CU_ASSERT_PTR_NOT_NULL_FATAL(raw[i]);
    }
    raw_sess rs;
    CU_ASSERT_EQUAL_FATAL(raw_session(g_srv.addr, TOKEN_A, &rs), 0);
    kvs_client *a = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &a), 0);
    double closed0 = kvs_itest_stat(a, "kvstash_xfer_sessions_closed_total", NULL, NULL);
    double unknown0 = kvs_itest_stat(a, "kvstash_xfer_close_unknown_total", NULL, NULL);
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h[0], hl[0], raw[0], len, SEAL_GOOD, ++rs.seq), 0);
    int closed = -1;
    /* a token of the wrong size */
    CU_ASSERT_EQUAL(connect_close(g_srv.addr, TOKEN_A, rs.id, rs.token, 15, &closed),
                    GRPC_STATUS_INVALID_ARGUMENT);
    /* a wrong token; the right ones from another tenant: nothing closes */
    uint8_t bad[KVS_XFER_TOKEN_LEN];
    memcpy(bad, rs.token, sizeof bad);
    bad[3] ^= 1;
    CU_ASSERT_EQUAL(connect_close(g_srv.addr, TOKEN_A, rs.id, bad, sizeof bad, &closed),
                    GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(closed, 1); /* nothing of such a session can be stored: the same answer */
    CU_ASSERT_EQUAL(connect_close(g_srv.addr, TOKEN_B, rs.id, rs.token, sizeof rs.token, &closed),
                    GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_close_unknown_total", NULL, NULL),
                    unknown0 + 2);
    /* a void: a number not used yet is used up (a put sealed with it is
     * refused as played again), the session stays; without the session's id
     * and token, or with a worker address, it is refused */
    int voided = -1;
    double voided0 = kvs_itest_stat(a, "kvstash_xfer_put_voided_total", NULL, NULL);
    CU_ASSERT_EQUAL(
        connect_void(g_srv.addr, TOKEN_A, rs.id, rs.token, rs.seq + 1, NULL, 0, &voided),
        GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(voided, 1);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_put_voided_total", NULL, NULL), voided0 + 1);
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h[1], hl[1], raw[1], len, SEAL_GOOD, ++rs.seq),
                    KVS_EUNAUTH);
    CU_ASSERT_EQUAL(connect_void(g_srv.addr, TOKEN_A, 0, NULL, rs.seq + 1, NULL, 0, &voided),
                    GRPC_STATUS_INVALID_ARGUMENT);
    {
        const void *wa0;
        size_t wl0;
        kvs_xfer_client *xc0 = raw_client(&wa0, &wl0);
        CU_ASSERT_EQUAL(
            connect_void(g_srv.addr, TOKEN_A, rs.id, rs.token, rs.seq + 1, wa0, wl0, &voided),
            GRPC_STATUS_INVALID_ARGUMENT);
        kvs_xfer_client_destroy(xc0);
    }
    CU_ASSERT_EQUAL(raw_put_seal(&rs, NULL, h[1], hl[1], raw[1], len, SEAL_GOOD, ++rs.seq), 0);
    unsigned char got[1][32];
    CU_ASSERT_EQUAL(lookup_keys(a, &ns, 47000, 1, got), 1u);
    /* its own tenant with its token: closed */
    CU_ASSERT_EQUAL(connect_close(g_srv.addr, TOKEN_A, rs.id, rs.token, sizeof rs.token, &closed),
                    GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(closed, 1);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_sessions_closed_total", NULL, NULL),
                    closed0 + 1);
    int rc = raw_put_seal(&rs, NULL, h[2], hl[2], raw[2], len, SEAL_GOOD, ++rs.seq);
    CU_ASSERT_NOT_EQUAL(rc, 0);
    CU_ASSERT_NOT_EQUAL(rc, KVS_EEXIST);
    CU_ASSERT_EQUAL(lookup_keys(a, &ns, 48000, 1, got), 0u); /* not stored */
    /* closed already: the same answer, counted as naming no session */
    CU_ASSERT_EQUAL(connect_close(g_srv.addr, TOKEN_A, rs.id, rs.token, sizeof rs.token, &closed),
                    GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(closed, 1);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_close_unknown_total", NULL, NULL),
                    unknown0 + 3);
    kvs_xfer_client_destroy(rs.xc);
    /* close and open in one call */
    raw_sess r2;
    CU_ASSERT_EQUAL_FATAL(raw_session(g_srv.addr, TOKEN_A, &r2), 0);
    const void *wa;
    size_t wl;
    kvs_xfer_client *xc = raw_client(&wa, &wl);
    Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
    req.worker_address.data = (uint8_t *)wa;
    req.worker_address.len = wl;
    req.close_session_id = r2.id;
    req.close_session_token.data = r2.token;
    req.close_session_token.len = sizeof r2.token;
    Kvstash__V1__ConnectResponse *r = NULL;
    char det[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(connect_req(g_srv.addr, TOKEN_A, &req, &r, det), GRPC_STATUS_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL(r->closed, 1);
    CU_ASSERT_NOT_EQUAL(r->session_id, r2.id);
    CU_ASSERT_EQUAL(r->session_token.len, (size_t)KVS_XFER_TOKEN_LEN);
    CU_ASSERT_EQUAL(kvs_itest_stat(a, "kvstash_xfer_sessions_closed_total", NULL, NULL),
                    closed0 + 2);
    kvstash__v1__connect_response__free_unpacked(r, NULL);
    kvs_xfer_client_destroy(xc);
    kvs_xfer_client_destroy(r2.xc);
    for (unsigned i = 0; i < 4; i++) {
        free(h[i]);
        free(raw[i]);
    }
    kvs_client_close(a);
}

/* 1 once every thread of pid is stopped (SIGSTOP is delivered
 * asynchronously: kill returns before the threads stop), 0 after 10 s. */
static int wait_stopped(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    for (int tries = 0; tries < 1000; tries++) {
        DIR *d = opendir(dir);
        if (d == NULL)
            return 0;
        int running = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL && !running) {
            if (e->d_name[0] == '.')
                continue;
            char path[384], buf[512];
            snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
            FILE *f = fopen(path, "r");
            if (f == NULL)
                continue; /* the thread ended */
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            const char *rp = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
            running = rp == NULL || rp[1] != ' ' || (rp[2] != 'T' && rp[2] != 't');
        }
        closedir(d);
        if (!running)
            return 1;
        usleep(10 * 1000);
    }
    return 0;
}

/* One put (kvs_client_put, or kvs_client_put_ucx with ucx, timeout_ms) on a
 * thread of its own, or on the caller's. */
typedef struct timed_put {
    kvs_client *c;
    const kvs_ns *ns;
    unsigned base;
    size_t b;
    const unsigned char *parent;
    int timeout_ms;
    int ucx;
    int rc;
    char err[KVS_ERR_LEN];
    atomic_int done;
} timed_put;

static void *timed_put_run(void *arg)
{
    timed_put *p = arg;
    tblock t;
    tblock_make(p->ns, p->base, p->b, &t);
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = p->ns;
    a.parent_key = p->parent;
    a.index = (unsigned)p->b;
    a.tokens = t.tokens;
    a.scheme = 1;
    a.k = (const void *const *)t.k;
    a.v = (const void *const *)t.v;
    kvs_put_result r;
    memset(&r, 0, sizeof r); /* no per-layer arrays */
    p->rc = p->ucx ? kvs_client_put_ucx(p->c, &a, p->timeout_ms, &r, p->err)
                   : kvs_client_put(p->c, &a, p->timeout_ms, &r, p->err);
    tblock_free(p->ns, &t);
    atomic_store(&p->done, 1);
    return NULL;
}

/* kvstashd frozen (SIGSTOP) under a UCX client. Its fetch fails on UCX and
 * then over gRPC, within its own time: leaving UCX only marks the session's
 * close pending (no close call on the fetch's path). Its next put first
 * closes the session and, while kvstashd cannot answer, is not sent over
 * gRPC at all (a put of it held back could otherwise be stored after it):
 * it fails, counted as unsent; so does a put beside another put's close,
 * within its own time. Once kvstashd runs again, that close goes through
 * (counted on both sides) and its put lands over gRPC. */
static void test_frozen_close(void)
{
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g), 0);
    /* No Connect again within the test (ucx_retry_ms 10 min): each put
     * below makes the close itself, as it must when the wait is not over
     * (else the first put's reconnect, not its close, and the second put
     * would never meet another thread's close). frozen_connect has the
     * reconnect. */
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 1000, 600000, &u), 0);
    const unsigned F = 62000;
    kvs_put_result r;
    CU_ASSERT_EQUAL_FATAL(put_one(u, &ns, F, 0, NULL, 1, 1, &r), 0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL_FATAL(st.connected, 1); /* the put went over UCX */
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    double closed0 = kvs_itest_stat(g, "kvstash_xfer_sessions_closed_total", NULL, NULL);
    double unknown0 = kvs_itest_stat(g, "kvstash_xfer_close_unknown_total", NULL, NULL);
    unsigned char keys[1][32];
    memcpy(keys[0], r.key, 32);
    CU_ASSERT_EQUAL_FATAL(kill((pid_t)g_srv.pid, SIGSTOP), 0);
    CU_ASSERT_FATAL(wait_stopped((pid_t)g_srv.pid));
    rec got = {0};
    char err[KVS_ERR_LEN] = "";
    /* 3 s: past the transfer's own 1 s (the client's call timeout), which
     * fails the path (a fetch whose own time runs out first ends without
     * leaving UCX: stalled_deadline) */
    int rc = kvs_client_fetch(u, &ns, keys, 1, KVS_EGRESS_FP16, 0, 3000, rec_cb, &got, err);
    CU_ASSERT_NOT_EQUAL(rc, 0);
    free(got.p);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_NOT_EQUAL(st.ucx_status, 0);
    CU_ASSERT_EQUAL(st.close_pending, 1);
    CU_ASSERT_EQUAL(st.sessions_closed, 0u);
    CU_ASSERT_EQUAL(st.puts_unsent, 0u);
    /* a put while kvstashd cannot answer the close: not sent */
    err[0] = '\0';
    rc = put_one_err(u, &ns, F, 1, keys[0], 1, 1, &r, err);
    CU_ASSERT_NOT_EQUAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "could not be closed"));
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.puts_unsent, 1u);
    CU_ASSERT_EQUAL(st.close_pending, 1);
    CU_ASSERT_EQUAL(st.sessions_closed, 0u);
    /* Two puts at once: the first makes the close with no deadline to speak
     * of (it can only end once kvstashd runs again); the second, with 500
     * ms, must still give up within its own time, unsent, rather than wait
     * for the first's close (it used to wait for close_mu as long as that). */
    timed_put slow = {
        .c = u, .ns = &ns, .base = F, .b = 1, .parent = keys[0], .timeout_ms = INT_MAX};
    timed_put quick = {.c = u, .ns = &ns, .base = F + 7, .b = 0, .timeout_ms = 500};
    pthread_t ts, tq;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&ts, NULL, timed_put_run, &slow), 0);
    usleep(200 * 1000); /* mostly the first holds the close by now (either order passes) */
    CU_ASSERT_EQUAL_FATAL(pthread_create(&tq, NULL, timed_put_run, &quick), 0);
    struct timespec q0, q1;
    clock_gettime(CLOCK_MONOTONIC, &q0);
    for (int i = 0; i < 3000 && !atomic_load(&quick.done); i++) /* 30 s: a hang, not a time */
        usleep(10 * 1000);
    clock_gettime(CLOCK_MONOTONIC, &q1);
    printf("  frozen_close: the 500 ms put beside a pending close returned after %.0f ms\n",
           (double)(q1.tv_sec - q0.tv_sec) * 1e3 + (double)(q1.tv_nsec - q0.tv_nsec) / 1e6);
    CU_ASSERT_EQUAL(atomic_load(&quick.done), 1);
    CU_ASSERT_EQUAL(atomic_load(&slow.done), 0); /* kvstashd is stopped: it cannot end */
    CU_ASSERT_EQUAL_FATAL(kill((pid_t)g_srv.pid, SIGCONT), 0);
    pthread_join(tq, NULL);
    pthread_join(ts, NULL);
    CU_ASSERT_EQUAL(quick.rc, KVS_ETIMEDOUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(quick.err, "could not be closed"));
    /* the first's close went through once kvstashd ran, then its put */
    CU_ASSERT_EQUAL(slow.rc, 0);
    if (slow.rc != 0)
        fprintf(stderr, "slow put: %s: %s\n", kvs_strerror(slow.rc), slow.err);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.puts_unsent, 2u);
    CU_ASSERT_EQUAL(st.close_pending, 0);
    CU_ASSERT_EQUAL(st.sessions_closed, 1u);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    for (int i = 0; i < 100 && hs != KVS_HEALTH_SERVING; i++)
        if (kvs_client_health(g, "", -1, &hs, NULL) != 0)
            usleep(50 * 1000);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    /* nothing pending now: the put goes over gRPC (stored by the first already) */
    CU_ASSERT_EQUAL(put_one(u, &ns, F, 1, keys[0], 1, 1, &r), 0);
    CU_ASSERT_EQUAL(r.already_present, 1);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.close_pending, 0);
    CU_ASSERT_EQUAL(st.sessions_closed, 1u);
    CU_ASSERT_EQUAL(st.puts_unsent, 2u);
    CU_ASSERT_EQUAL(st.reconnects, 0u);
    /* One close reached kvstashd: it closed the session, or found it ended
     * already (the client dropped its endpoint when it left UCX, and the
     * data plane process's word of that may come first once kvstashd runs). */
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_sessions_closed_total", NULL, NULL) +
                        kvs_itest_stat(g, "kvstash_xfer_close_unknown_total", NULL, NULL),
                    closed0 + unknown0 + 1);
    unsigned char both[2][32];
    CU_ASSERT_EQUAL(lookup_keys(g, &ns, F, 2, both), 2u);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* Waits (up to 10 s) until u's first Connect, under way on the library's
 * thread while kvstashd is stopped, has failed (its call timeout); 1 then. */
static int wait_connect_failed(kvs_client *u, kvs_client_xfer_stats *st)
{
    for (int i = 0; i < 200; i++) {
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, st), 0);
        if (st->ucx_status != 0 && !st->connecting)
            return 1;
        usleep(50 * 1000);
    }
    return 0;
}

/* kvstashd frozen (SIGSTOP) through a UCX client's first Connect: the
 * Connect is never answered (no session, but the client's transfer client
 * was created), and the fetch fails within its time, the Connect still under
 * way on the library's thread (it has the client's 1 s), until it fails.
 * Once kvstashd runs again the client Connects again by itself after its
 * wait (ucx_retry_ms) and fetches over UCX, the same bytes as Get each
 * time. (It used to stay
 * on gRPC for good: the fork check took a client that had never had a
 * session answered for a copy of another process.) */
static void test_frozen_connect(void)
{
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    unsigned char keys[2][32];
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(put_chain(g, &ns, 2, 63000, keys), 0);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 1000, 100, &u), 0);
    CU_ASSERT_EQUAL_FATAL(kill((pid_t)g_srv.pid, SIGSTOP), 0);
    CU_ASSERT(wait_stopped((pid_t)g_srv.pid));
    rec got = {0};
    int rc = kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 2, KVS_EGRESS_FP16, 0, 500,
                              rec_cb, &got, err);
    free(got.p);
    CU_ASSERT_NOT_EQUAL(rc, 0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.connecting, 1); /* 500 ms < the Connect's 1 s */
    CU_ASSERT_EQUAL(st.ucx_status, 0);
    CU_ASSERT(wait_connect_failed(u, &st));
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.close_pending, 0); /* no session was answered */
    CU_ASSERT_EQUAL_FATAL(kill((pid_t)g_srv.pid, SIGCONT), 0);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    for (int i = 0; i < 100 && hs != KVS_HEALTH_SERVING; i++)
        if (kvs_client_health(g, "", -1, &hs, NULL) != 0)
            usleep(50 * 1000);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    int tries = fetch_until_ucx(g, u, &ns, keys, 2, &st);
    printf("  frozen_connect: over UCX again after %d fetches over gRPC\n", tries);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.reconnects, 1u);
    CU_ASSERT_EQUAL(st.close_pending, 0);
    CU_ASSERT_EQUAL(st.sessions_closed, 0u);
    check_next_fetch_ucx(g, u, &ns, keys, 2);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* The fetch that starts a reconnect does not wait for it. kvstashd stopped
 * (SIGSTOP) through a client's first Connect: the fetch fails, and the
 * Connect fails after the client's call timeout (1 s). Once the client's
 * wait (100 ms) is over, the next fetch starts the Connect again on the
 * library's thread and fails over gRPC alone, within its own 300 ms: the
 * Connect is still under way when it returns (it cannot end while kvstashd
 * is stopped, and has the client's 1 s). It used to run on the fetch's path,
 * which then returned with none under way (and had taken both timeouts).
 * Once kvstashd runs, the Connect ends and the client is back on UCX. */
static void test_frozen_reconnect(void)
{
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    unsigned char keys[2][32];
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(put_chain(g, &ns, 2, 64000, keys), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 1000, 100, &u), 0);
    CU_ASSERT_EQUAL_FATAL(kill((pid_t)g_srv.pid, SIGSTOP), 0);
    CU_ASSERT(wait_stopped((pid_t)g_srv.pid));
    kvs_client_xfer_stats st;
    for (int i = 0; i < 2; i++) {
        if (i == 1) {
            CU_ASSERT(wait_connect_failed(u, &st)); /* the first Connect */
            usleep(150 * 1000);                     /* the wait is over */
        }
        rec got = {0};
        char err[KVS_ERR_LEN] = "";
        CU_ASSERT_NOT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 2,
                                             KVS_EGRESS_FP16, 0, 300, rec_cb, &got, err),
                            0);
        free(got.p);
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
        CU_ASSERT_EQUAL(st.connected, 0);
        CU_ASSERT_EQUAL(st.fallbacks, (unsigned long long)i + 1);
        CU_ASSERT_EQUAL(st.connecting, 1 - i); /* the first Connect, under way */
        CU_ASSERT_EQUAL(st.reconnecting, i);
    }
    CU_ASSERT_EQUAL(st.reconnects, 0u);
    CU_ASSERT_EQUAL_FATAL(kill((pid_t)g_srv.pid, SIGCONT), 0);
    int tries = fetch_until_ucx(g, u, &ns, keys, 2, &st);
    printf("  frozen_reconnect: over UCX again after %d fetches over gRPC\n", tries);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.reconnecting, 0);
    CU_ASSERT_EQUAL(st.reconnects, 1u);
    check_next_fetch_ucx(g, u, &ns, keys, 2);
    kvs_client_close(u);
    kvs_client_close(g);
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* A fresh client's first fetch, with less time than UCX takes to start
 * (ucp_init and the worker: ~50 ms on the 2-core VM), is served over gRPC
 * within its time, and the client is on UCX a little later. The first
 * Connect used to run on the fetch's thread: UCX's start, which no deadline
 * bounds, took the whole 40 ms and more, and the fetch failed with
 * KVS_ETIMEDOUT without trying gRPC (83 ms for a 50 ms fetch). Now it runs on
 * the library's thread and the fetch waits for it only within the UCX half
 * of its time. Asserted only where a warm Get of the blocks takes under
 * 10 ms (else 20 ms of gRPC says nothing). */
static void test_short_first_fetch(void)
{
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    unsigned char keys[2][32];
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(put_chain(g, &ns, 2, 61000, keys), 0);
    rec want = {0};
    double get_ms = 0;
    for (int i = 0; i < 5; i++) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rec r = {0};
        CU_ASSERT_EQUAL_FATAL(get_rec(g, &ns, keys, 2, KVS_EGRESS_FP16, &r), 0);
        double ms = ms_since(&t0);
        get_ms = ms > get_ms ? ms : get_ms;
        free(want.p);
        want = r;
    }
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 40, 100, &u), 0);
    rec got = {0};
    char err[KVS_ERR_LEN] = "";
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 2, KVS_EGRESS_FP16, 0, 40,
                              rec_cb, &got, err);
    double ms = ms_since(&t0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    printf("  short_first_fetch: a 40 ms first fetch: %s in %.1f ms (a warm Get: %.1f ms at most); "
           "connecting %d, connected %d\n",
           kvs_strerror(rc), ms, get_ms, st.connecting, st.connected);
    if (get_ms < 10) {
        CU_ASSERT_EQUAL(rc, 0);
        if (rc != 0)
            fprintf(stderr, "first fetch: %s: %s\n", kvs_strerror(rc), err);
        else
            CU_ASSERT(same(&want, &got));
    }
    free(got.p);
    free(want.p);
    /* The client's 40 ms also bound the Connect: if it missed them, the
     * Connect is made again after ucx_retry_ms (100 ms). */
    kvs_client_close(u);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 1000, 100, &u), 0);
    int tries = fetch_until_ucx(g, u, &ns, keys, 2, &st);
    printf("  short_first_fetch: a 1 s client on UCX after %d fetches over gRPC\n", tries);
    CU_ASSERT_EQUAL(st.connected, 1);
    check_next_fetch_ucx(g, u, &ns, keys, 2);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* The data plane process stopped (SIGSTOP) under a UCX client whose default
 * call timeout is 30 s. A fetch that asks for 6 s gives UCX half of it, then
 * leaves UCX and gets Get's bytes in the time left; a put likewise leaves
 * UCX after 1 s and, as kvstashd cannot close the session while the process
 * is stopped, is not sent over gRPC either: KVS_ETIMEDOUT within its 2 s.
 * Both used to wait the client's 30 s (the transfer's op timeout), then
 * start gRPC with a full timeout of their own. Once the process runs again
 * the put goes through, the client is back on UCX, nothing stays lent. */
static void test_stalled_deadline(void)
{
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    unsigned char keys[2][32];
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(put_chain(g, &ns, 2, 65000, keys), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 30000, 100, &u), 0);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL_FATAL(st.connected, 1);
    pid_t x = kvs_server_proc_xferd((pid_t)g_srv.pid);
    if (x == 0) { /* ucx_isolate = off: UCX runs in kvstashd (frozen_* stop that) */
        kvs_client_close(u);
        kvs_client_close(g);
        return;
    }
    rec want = {0}, got = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, keys, 2, KVS_EGRESS_STORED, &want), 0);
    CU_ASSERT_EQUAL_FATAL(kill(x, SIGSTOP), 0);
    CU_ASSERT(wait_stopped(x));
    char err[KVS_ERR_LEN] = "";
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 2, KVS_EGRESS_STORED, 0,
                              6000, rec_cb, &got, err);
    double fetch_ms = ms_since(&t0);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(kill(x, SIGCONT), 0);
    printf("  stalled_deadline: 6 s fetch over a stopped data plane: %.0f ms, %s %s\n", fetch_ms,
           kvs_strerror(rc), err);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT(same(&want, &got));
    /* UCX's 3 s, then Get (3 s left: room on a loaded machine); far below
     * the client's 30 s: a hang check */
    CU_ASSERT(fetch_ms < 15000);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_ETIMEDOUT);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.abandoned, 1u); /* its batch, freed when the reconnect ends it */
    free(want.p);
    free(got.p);
    (void)fetch_until_ucx(g, u, &ns, keys, 2, &st);
    CU_ASSERT_EQUAL_FATAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.reconnects, 1u);
    unsigned long long fb = st.fallbacks;

    CU_ASSERT_EQUAL_FATAL(kill(x, SIGSTOP), 0);
    CU_ASSERT(wait_stopped(x));
    timed_put p = {
        .c = u, .ns = &ns, .base = 65000, .b = 2, .parent = keys[1], .timeout_ms = 2000, .ucx = 1};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    (void)timed_put_run(&p);
    double put_ms = ms_since(&t0);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(kill(x, SIGCONT), 0);
    printf("  stalled_deadline: 2 s put over a stopped data plane: %.0f ms, %s %s\n", put_ms,
           kvs_strerror(p.rc), p.err);
    CU_ASSERT_EQUAL(p.rc, KVS_ETIMEDOUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.err, "could not be closed"));
    CU_ASSERT(put_ms < 10000);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_ETIMEDOUT);
    CU_ASSERT_EQUAL(st.fallbacks, fb + 1);
    CU_ASSERT_EQUAL(st.abandoned, 2u); /* and the put */
    CU_ASSERT_EQUAL(st.puts_unsent, 1u);
    kvs_put_result r;
    CU_ASSERT_EQUAL(put_one(u, &ns, 65000, 2, keys[1], 1, 1, &r), 0);
    (void)fetch_until_ucx(g, u, &ns, keys, 2, &st);
    CU_ASSERT_EQUAL(st.connected, 1);
    check_next_fetch_ucx(g, u, &ns, keys, 2);
    double held = -1;
    for (int i = 0; i < 500 && held != 0; i++) { /* the stopped process's lends come back */
        held = kvs_itest_stat(g, "kvstash_xfer_refs_held", NULL, NULL);
        if (held != 0)
            usleep(20 * 1000);
    }
    CU_ASSERT_EQUAL(held, 0.0);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* One fetch (kvs_client_fetch, STORED, timeout_ms) on a thread of its own. */
typedef struct timed_fetch {
    kvs_client *c;
    const kvs_ns *ns;
    unsigned char (*keys)[32];
    size_t n;
    int timeout_ms;
    int rc;
    rec got;
    char err[KVS_ERR_LEN];
    atomic_int done;
} timed_fetch;

static void *timed_fetch_run(void *arg)
{
    timed_fetch *f = arg;
    f->rc = kvs_client_fetch(f->c, f->ns, (const unsigned char(*)[32])f->keys, f->n,
                             KVS_EGRESS_STORED, 0, f->timeout_ms, rec_cb, &f->got, f->err);
    atomic_store(&f->done, 1);
    return NULL;
}

/* kvstashd frozen (SIGSTOP) through a UCX client's first Connect, made by a
 * fetch that asked for 60 s (so the Connect may take 30 s). A second fetch
 * of the same client, with 1 s, waits for that Connect within its own time
 * only, then goes over gRPC (and, kvstashd being stopped, fails): it
 * returns while the first Connect is still under way (no UCX failure yet).
 * It used to wait for the first caller's Connect to end, holding on to the
 * lock that Connect held throughout. Once kvstashd runs, the first fetch
 * Connects and goes over UCX. */
static void test_shared_first_connect(void)
{
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    unsigned char keys[2][32];
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, TOKEN_A, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(put_chain(g, &ns, 2, 67000, keys), 0);
    rec want = {0};
    CU_ASSERT_EQUAL_FATAL(get_rec(g, &ns, keys, 2, KVS_EGRESS_STORED, &want), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_retry(g_srv.addr, TOKEN_A, 1, 30000, 100, &u), 0);
    CU_ASSERT_EQUAL_FATAL(kill((pid_t)g_srv.pid, SIGSTOP), 0);
    CU_ASSERT(wait_stopped((pid_t)g_srv.pid));
    timed_fetch first = {.c = u, .ns = &ns, .keys = keys, .n = 2, .timeout_ms = 60000};
    pthread_t t;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, timed_fetch_run, &first), 0);
    kvs_client_xfer_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 1000 && !st.connecting; i++) { /* the first fetch in its Connect */
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
        if (!st.connecting)
            usleep(10 * 1000);
    }
    CU_ASSERT_EQUAL_FATAL(st.connecting, 1);
    rec got = {0};
    char err[KVS_ERR_LEN] = "";
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 2, KVS_EGRESS_STORED, 0,
                              1000, rec_cb, &got, err);
    double ms = ms_since(&t0);
    free(got.p);
    int first_done = atomic_load(&first.done);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connecting, 1); /* still the first fetch's */
    CU_ASSERT_EQUAL(kill((pid_t)g_srv.pid, SIGCONT), 0);
    printf("  shared_first_connect: a 1 s fetch beside a frozen first Connect: %.0f ms, %s\n", ms,
           kvs_strerror(rc));
    CU_ASSERT_NOT_EQUAL(rc, 0); /* kvstashd is stopped: Get cannot answer either */
    CU_ASSERT_EQUAL(first_done, 0);
    CU_ASSERT_EQUAL(st.ucx_status, 0); /* the first Connect has not failed: still under way */
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    pthread_join(t, NULL);
    CU_ASSERT_EQUAL(first.rc, 0);
    if (first.rc != 0)
        fprintf(stderr, "first fetch: %s: %s\n", kvs_strerror(first.rc), first.err);
    CU_ASSERT(same(&want, &first.got));
    free(first.got.p);
    free(want.p);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.fetches, 1u); /* the first, over UCX */
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* Fetches that go through over UCX, and fetches of a block not cached, leave
 * no request running: each waits for its batch's end (on_done), which comes
 * right after its last block, rather than leave the batch to free itself.
 * (They used to abandon it whenever the caller saw the last block end before
 * the progress thread had ended the request: most fetches of a run, every
 * one a batch that missed the buffer pool and counted towards the bytes
 * past which the client leaves UCX.) */
static void test_healthy_not_abandoned(void)
{
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[4][32], missing[1][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 4, 66000, &ns, keys, &g, &u);
    memset(missing[0], 0x5a, sizeof missing[0]);
    rec want = {0};
    CU_ASSERT_EQUAL_FATAL(get_rec(g, &ns, keys, 4, KVS_EGRESS_FP16, &want), 0);
    enum { N = 100 };
    unsigned bad = 0, notfound = 0;
    for (int i = 0; i < N; i++) {
        rec got = {0};
        char err[KVS_ERR_LEN] = "";
        int rc = kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 4, KVS_EGRESS_FP16, 0,
                                  -1, rec_cb, &got, err);
        bad += rc != 0 || !same(&want, &got);
        free(got.p);
        got = (rec){0};
        notfound += kvs_client_fetch(u, &ns, (const unsigned char(*)[32])missing, 1,
                                     KVS_EGRESS_FP16, 0, -1, rec_cb, &got, err) == KVS_ENOTFOUND;
        free(got.p);
    }
    free(want.p);
    CU_ASSERT_EQUAL(bad, 0u);
    CU_ASSERT_EQUAL(notfound, (unsigned)N);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    printf("  healthy_not_abandoned: %llu of %d fetches left their request running\n", st.abandoned,
           2 * N);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(st.fetches, (unsigned long long)N);
    CU_ASSERT_EQUAL(st.abandoned, 0u);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* A process forked after its client connected over UCX may close that
 * client (kvs_client_close): a forked copy never touches its parent's UCX
 * state (docs/TRANSFER.md "Back to UCX"), whose progress thread does not
 * exist in the copy. The close used to destroy the parent's transfer client,
 * which posts to that thread and waits for it: the copy hung for good. The
 * parent goes on fetching over UCX after the copy has closed. */
static void test_forked_close(void)
{
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 2, 67000, &ns, keys, &g, &u);
    check_next_fetch_ucx(g, u, &ns, keys, 2); /* connected: a progress thread runs */
    fflush(NULL);
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hung close ends here, by SIGALRM */
        kvs_client_close(u);
        _exit(0);
    }
    int ws = 0;
    CU_ASSERT_EQUAL(waitpid(pid, &ws, 0), pid);
    CU_ASSERT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    if (WIFSIGNALED(ws))
        printf("  forked_close: the copy's close ended by signal %d\n", WTERMSIG(ws));
    check_next_fetch_ucx(g, u, &ns, keys, 2);
    kvs_client_close(u);
    kvs_client_close(g);
}

static void forked_put_done(void *arg, int status, const kvs_put_result *res, const char *err)
{
    (void)status, (void)res, (void)err;
    ++*(int *)arg;
}

static void forked_lookup_done(void *arg, int status, const kvs_lookup_result *res, const char *err)
{
    (void)status, (void)res, (void)err;
    ++*(int *)arg;
}

/* A process forked after its client opened (and connected over UCX) cannot
 * use that client (kvstash.h "Processes"): its gRPC connection, the UCX
 * session and the library's threads are the parent's, shared with the
 * parent or absent in the copy. Every call there fails at once with
 * KVS_EPRECOND, drain and close return at once, no callback ever runs. A
 * fetch used to wait half its time for the parent's UCX progress thread,
 * which does not exist in the copy, then go on over the parent's gRPC
 * connection; a put_async was queued to worker threads that do not exist
 * in the copy (its callback never ran, and drain then waited for good). The
 * parent goes on over UCX. The copy's exit status has a bit per failure. */
static void test_forked_calls(void)
{
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_srv.addr, TOKEN_A, TOKEN_A, 2, 67100, &ns, keys, &g, &u);
    check_next_fetch_ucx(g, u, &ns, keys, 2); /* connected: a progress thread runs */
    kvs_lookup_result *lr = NULL;
    tblock t;
    tblock_make(&ns, 67100, 2, &t);
    CU_ASSERT_EQUAL(kvs_client_lookup(u, &ns, t.tokens, 16, 0, -1, &lr, NULL), 0);
    kvs_lookup_result_free(lr); /* the lookup thread runs too */
    fflush(NULL);
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang ends here, by SIGALRM */
        int bad = 0, called = 0;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        char err[KVS_ERR_LEN] = "";
        rec got = {0};
        if (kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, 2, KVS_EGRESS_FP16, 0, 4000,
                             rec_cb, &got, err) != KVS_EPRECOND ||
            got.calls != 0)
            bad |= 1;
        if (strstr(err, "fork") == NULL)
            bad |= 2;
        lr = NULL;
        if (kvs_client_lookup(u, &ns, t.tokens, 16, 0, 4000, &lr, NULL) != KVS_EPRECOND ||
            lr != NULL)
            bad |= 4;
        kvs_put_args a = {.ns = &ns,
                          .parent_key = keys[1],
                          .index = 2,
                          .tokens = t.tokens,
                          .k = (const void *const *)t.k,
                          .v = (const void *const *)t.v};
        if (kvs_client_put_async(u, &a, 4000, forked_put_done, &called) != KVS_EPRECOND ||
            kvs_client_lookup_async(u, &ns, t.tokens, 16, 0, 4000, forked_lookup_done, &called) !=
                KVS_EPRECOND)
            bad |= 8;
        kvs_put_result pr;
        memset(&pr, 0, sizeof pr);
        if (kvs_client_put_ucx(u, &a, 4000, &pr, NULL) != KVS_EPRECOND ||
            kvs_client_put(u, &a, 4000, &pr, NULL) != KVS_EPRECOND)
            bad |= 16;
        kvs_health_status hs;
        kvs_client_xfer_stats st;
        kvs_stats *ss = (kvs_stats *)&st; /* not NULL: a failed call sets it so */
        kvs_config *cf = (kvs_config *)&st;
        if (kvs_client_health(u, NULL, 4000, &hs, NULL) != KVS_EPRECOND ||
            kvs_client_xfer_stats_get(u, &st) != KVS_EPRECOND ||
            kvs_client_stats(u, NULL, 4000, &ss, NULL) != KVS_EPRECOND || ss != NULL ||
            kvs_client_get_config(u, NULL, 0, 4000, &cf, NULL) != KVS_EPRECOND || cf != NULL)
            bad |= 32;
        kvs_client_drain(u);
        kvs_client_close(u);
        if (called != 0)
            bad |= 64;
        if (ms_since(&t0) > 1000)
            bad |= 128; /* no call waited */
        _exit(bad);
    }
    int ws = 0;
    CU_ASSERT_EQUAL(waitpid(pid, &ws, 0), pid);
    CU_ASSERT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0)
        printf("  forked_calls: the copy's failures: %#x\n", WEXITSTATUS(ws));
    if (WIFSIGNALED(ws))
        printf("  forked_calls: the copy ended by signal %d\n", WTERMSIG(ws));
    tblock_free(&ns, &t);
    check_next_fetch_ucx(g, u, &ns, keys, 2);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* ---- suites "hostile", "hold": kvstashd whose data plane process attacks puts */

/* kvstashd, kvstash-ucx-addrcheck and kvstash-xferd-hostile installed as its
 * kvstash-xferd in a directory of their own, KVS_XFERD_HOSTILE=<mode> in their
 * environment (transfer/xproc_main.c says what the process then does). */
typedef struct hostile_node {
    char dir[40];
    char bin[80], xferd[80], check[80];
    char hold_file[80]; /* mode "hold": the held put goes on once this exists */
    kvs_server_proc p;
    int skip; /* ucx_isolate = off: there is no data plane process */
} hostile_node;

static hostile_node g_hostile, g_hold, g_refuse, g_forge, g_render, g_corrupt, g_forge_hold,
    g_notfound, g_replay;

static int hostile_start(hostile_node *h, const char *mode)
{
    const char *iso = getenv("KVS_TEST_UCX_ISOLATE");
    if (iso && strcmp(iso, "off") == 0) {
        h->skip = 1;
        return 0;
    }
    snprintf(h->dir, sizeof h->dir, "/tmp/kvs_test_hostile_XXXXXX");
    if (!mkdtemp(h->dir))
        return 1;
    snprintf(h->bin, sizeof h->bin, "%s/kvstashd", h->dir);
    snprintf(h->xferd, sizeof h->xferd, "%s/kvstash-xferd", h->dir);
    snprintf(h->check, sizeof h->check, "%s/kvstash-ucx-addrcheck", h->dir);
    snprintf(h->hold_file, sizeof h->hold_file, "%s/go", h->dir);
    if (copy_exe(g_kvstashd, h->bin) != 0 || copy_sibling("kvstash-xferd-hostile", h->xferd) != 0 ||
        copy_sibling("kvstash-ucx-addrcheck", h->check) != 0)
        return 1;
    const char *args[] = {"--log-level", "error", NULL};
    setenv("KVS_XFERD_HOSTILE", mode, 1);
    setenv("KVS_XFERD_HOLD_FILE", h->hold_file, 1);
    int rc = kvs_itest_start(h->bin, args, &h->p, "kvstashd with a hostile xferd");
    unsetenv("KVS_XFERD_HOSTILE");
    unsetenv("KVS_XFERD_HOLD_FILE");
    return rc;
}

static int hostile_stop(hostile_node *h)
{
    if (h->skip)
        return 0;
    int rc = kvs_itest_stop(&h->p, 10000);
    unlink(h->bin);
    unlink(h->xferd);
    unlink(h->check);
    unlink(h->hold_file);
    rmdir(h->dir);
    return rc;
}

/* A CUnit suite's init and cleanup: kvstashd with a kvstash-xferd-hostile in
 * mode (KVS_XFERD_HOSTILE) as g_<name>. */
#define HOSTILE_SUITE(name, mode)                                                                  \
    static int suite_##name##_init(void)                                                           \
    {                                                                                              \
        return hostile_start(&g_##name, mode);                                                     \
    }                                                                                              \
    static int suite_##name##_cleanup(void)                                                        \
    {                                                                                              \
        return hostile_stop(&g_##name);                                                            \
    }

HOSTILE_SUITE(hostile, "1")

HOSTILE_SUITE(hold, "hold")

HOSTILE_SUITE(refuse, "refuse")

HOSTILE_SUITE(forge, "forge")

HOSTILE_SUITE(corrupt, "corrupt")

/* The data plane process withholds every stored block of a fetch behind a
 * status of its own, want: a block that fails the worker's own checks
 * before its seal is looked at (KVS_XFERD_HOSTILE=corrupt: its header's
 * first byte changed; KVS_EFORMAT) or a NOT_FOUND (notfound). A sealing
 * client takes neither on that process's word: it fetches the block over
 * gRPC Get (exactly Get's bytes), counts a failed check (corrupt), stays on
 * UCX and tries it again on its next fetch; a client without seals trusts
 * that process and returns want (DATA_LOSS, NOT_FOUND). It used to be so for
 * sealing clients too. *gp, *up: the gRPC and the sealing client, for the
 * caller's own checks. */
static void check_withheld(hostile_node *h, unsigned tok, int want, kvs_ns *ns,
                           unsigned char (*keys)[32], kvs_client **gp, kvs_client **up)
{
    kvs_client *g = NULL, *u = NULL, *un = NULL;
    unsigned long long bad = want == KVS_EFORMAT; /* blocks counted corrupt per fetch */
    open_pair(h->p.addr, NULL, NULL, 2, tok, ns, keys, &g, &u);
    kvs_client_close(u);
    u = open_sealing(h->p.addr, NULL, 1, KVS_DECODE_AUTO);
    kvs_client_xfer_stats st;
    for (unsigned i = 1; i <= 2; i++) { /* two blocks, then one: the rest goes over gRPC */
        CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, ns, keys, 3 - i, KVS_EGRESS_STORED),
                        (3 - i) * ns->num_layers);
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
        CU_ASSERT_EQUAL(st.corrupt, i * bad);
        CU_ASSERT_EQUAL(st.fallbacks, (unsigned long long)i);
        CU_ASSERT_EQUAL(st.forged_blocks, 0u);
        CU_ASSERT_EQUAL(st.connected, 1);
        CU_ASSERT_EQUAL(st.fetch_seal, 1);
        CU_ASSERT_EQUAL(st.ucx_status, 0);
    }
    un = open_sealing(h->p.addr, NULL, 0, KVS_DECODE_AUTO);
    rec ru = {0};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_fetch(un, ns, (const unsigned char(*)[32])keys, 1, KVS_EGRESS_STORED,
                                     0, -1, rec_cb, &ru, err),
                    want);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want == KVS_EFORMAT ? "DATA_LOSS" : "NOT_FOUND"));
    CU_ASSERT_EQUAL(ru.calls, 0u);
    free(ru.p);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(un, &st), 0);
    CU_ASSERT_EQUAL(st.corrupt, bad);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    kvs_client_close(un);
    *gp = g;
    *up = u;
}

static void test_corrupt_fetch(void)
{
    if (g_corrupt.skip)
        return;
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    check_withheld(&g_corrupt, 1400, KVS_EFORMAT, &ns, keys, &g, &u);
    kvs_client_close(u);
    kvs_client_close(g);
}

HOSTILE_SUITE(render, "render")

/* The data plane process writes over the start of bounce memory while
 * kvstashd renders a block there for a fetch (KVS_XFERD_HOSTILE=render):
 * kvstashd must seal the bytes it rendered, not what that process wrote
 * meanwhile. A sealing client gets Get's bytes on every try, over UCX or over
 * gRPC once it refused the changed ones; never the pattern. A new client each
 * try: one that refused a block leaves UCX for good. */
static void test_render_sealed(void)
{
    if (g_render.skip)
        return;
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[1][32];
    open_pair(g_render.p.addr, NULL, NULL, 1, 1300, &ns, keys, &g, &u);
    kvs_client_close(u);
    unsigned long long refused = 0;
    for (int i = 0; i < 8; i++) {
        u = open_sealing(g_render.p.addr, NULL, 1, KVS_DECODE_SERVER);
        CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 1, KVS_EGRESS_FP32), ns.num_layers);
        kvs_client_xfer_stats st;
        CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
        CU_ASSERT_EQUAL(st.fetch_seal == 1 || st.ucx_status == KVS_EUNAUTH, 1);
        refused += st.forged_blocks;
        kvs_client_close(u);
    }
    printf("  render_sealed: %llu of 8 rendered blocks refused by their seal\n", refused);
    kvs_client_close(g);
}

/* The data plane process lends each stored block as a copy with a byte of
 * layer 1 changed and that tile's checksum made to match (every tile check
 * passes). A sealing client (the default) refuses layer 1 (its seal), gets
 * the rest from Get (the fetch hands on exactly Get's bytes), counts the
 * forged block and leaves UCX for good; a client that asked for no seals
 * takes the changed layer, which is what the seal stops. */
static void test_forged_fetch(void)
{
    if (g_forge.skip)
        return;
    kvs_client *g = NULL, *u = NULL, *un = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_forge.p.addr, NULL, NULL, 2, 1200, &ns, keys, &g, &u);
    kvs_client_close(u);
    u = open_sealing(g_forge.p.addr, NULL, 1, KVS_DECODE_AUTO);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.forged_blocks, 1u);
    CU_ASSERT_EQUAL(st.fetch_seal, 0); /* not connected any more */
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNAUTH);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.fetches, 0u);
    /* never back to UCX: the next fetch goes over gRPC at once */
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_FP16),
                    2u * ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.forged_blocks, 1u);
    CU_ASSERT_EQUAL(st.fallbacks, 2u);
    CU_ASSERT_TRUE(kvs_itest_stat(g, "kvstash_xfer_fetch_sealed_total", NULL, NULL) >= 1.0);
    /* without seals (the default) the changed layer gets through */
    char err[KVS_ERR_LEN] = "";
    un = open_sealing(g_forge.p.addr, NULL, 0, KVS_DECODE_AUTO);
    rec rg = {0}, ru = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, keys, 2, KVS_EGRESS_STORED, &rg), 0);
    CU_ASSERT_EQUAL(kvs_client_fetch(un, &ns, (const unsigned char(*)[32])keys, 2,
                                     KVS_EGRESS_STORED, 0, -1, rec_cb, &ru, err),
                    0);
    CU_ASSERT_EQUAL(ru.calls, rg.calls);
    CU_ASSERT_FALSE(same(&rg, &ru));
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(un, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(st.forged_blocks, 0u);
    free(rg.p);
    free(ru.p);
    kvs_client_close(un);
    kvs_client_close(u);
    kvs_client_close(g);
}

HOSTILE_SUITE(forge_hold, "forge_hold")

/* The data plane process forges the first block of a fetch of two and
 * withholds the second (KVS_XFERD_HOSTILE=forge_hold), so the fetch's UCX
 * request times out after the client refused the first block by its seal:
 * the connection has failed as well by the time the fetch falls back. The
 * forgery still decides: the client leaves UCX for good (ucx_status
 * KVS_EUNAUTH, no reconnect however short ucx_retry_ms), as after any
 * forged block. It used to take the connection's status (KVS_ETIMEDOUT) and
 * come back to the same data plane process after ucx_retry_ms. */
static void test_forged_then_stalled(void)
{
    if (g_forge_hold.skip)
        return;
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    open_pair(g_forge_hold.p.addr, NULL, NULL, 2, 1500, &ns, keys, &g, &u);
    kvs_client_close(u);
    char err[KVS_ERR_LEN] = "";
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = g_forge_hold.p.addr;
    o.call_timeout_ms = 5000; /* the withheld block's wait */
    o.ucx = 1;
    o.ucx_retry_ms = 1;
    o.ucx_seal_fetches = 1;
    CU_ASSERT_EQUAL_FATAL(kvs_client_open(&o, &u, err), 0);
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    FILE *f = fopen(g_forge_hold.hold_file, "w"); /* the withheld block may go now */
    CU_ASSERT_PTR_NOT_NULL(f);
    if (f)
        fclose(f);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.forged_blocks, 1u);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNAUTH);
    /* never back to UCX: the next fetch goes over gRPC at once */
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 2, KVS_EGRESS_STORED),
                    2u * ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.reconnects, 0u);
    CU_ASSERT_EQUAL(st.fallbacks, 2u);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNAUTH);
    kvs_client_close(u);
    kvs_client_close(g);
}

HOSTILE_SUITE(notfound, "notfound")

/* KVS_XFERD_HOSTILE=notfound: every block answered NOT_FOUND (check_withheld);
 * a block truly absent gets Get's NOT_FOUND. */
static void test_notfound_fetch(void)
{
    if (g_notfound.skip)
        return;
    kvs_client *g = NULL, *u = NULL;
    kvs_ns ns;
    unsigned char keys[2][32];
    check_withheld(&g_notfound, 1600, KVS_ENOTFOUND, &ns, keys, &g, &u);
    unsigned char absent[1][32];
    memset(absent[0], 0x5a, 32);
    rec ra = {0};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_fetch(u, &ns, (const unsigned char(*)[32])absent, 1, KVS_EGRESS_FP16,
                                     0, -1, rec_cb, &ra, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(ra.calls, 0u);
    free(ra.p);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 3u);
    CU_ASSERT_EQUAL(st.connected, 1);
    kvs_client_close(u);
    kvs_client_close(g);
}

HOSTILE_SUITE(replay, "replay")

/* The data plane process remembers the first stored block it lends (bytes
 * and seal) and lends that copy again for every later fetch of its key
 * (KVS_XFERD_HOSTILE=replay). The block is deleted and put again under the
 * same key with other bytes (another scheme); the sealing client's next
 * fetch, on the same session, gets the first lend replayed. Its seal was
 * made for the first fetch's nonce: the client refuses it, counts a forged
 * block, leaves UCX and hands on Get's current bytes. Without the nonce the
 * old seal checked (same session, key and format: only the lend number
 * differed, which the client never knew) and the worker got the deleted
 * block's bytes. A client without seals gets them still. */
static void test_replayed_fetch(void)
{
    if (g_replay.skip)
        return;
    kvs_client *g = NULL, *u = NULL, *un = NULL;
    kvs_ns ns;
    unsigned char keys[1][32];
    char err[KVS_ERR_LEN] = "";
    open_pair(g_replay.p.addr, NULL, NULL, 1, 1700, &ns, keys, &g, &u);
    kvs_client_close(u);
    u = open_sealing(g_replay.p.addr, NULL, 1, KVS_DECODE_AUTO);
    rec old = {0}, now = {0}, ru = {0};
    CU_ASSERT_EQUAL(get_rec(g, &ns, keys, 1, KVS_EGRESS_STORED, &old), 0);
    /* the first lend: remembered by the data plane process, and genuine */
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 1, KVS_EGRESS_STORED), ns.num_layers);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fetch_seal, 1);
    CU_ASSERT_EQUAL(st.forged_blocks, 0u);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL(st.fetches, 1u);
    /* deleted, and put again with other bytes under the same key */
    unsigned deleted = 0;
    CU_ASSERT_EQUAL(
        kvs_client_delete(g, &ns, (const unsigned char(*)[32])keys, 1, 0, -1, &deleted, err), 0);
    CU_ASSERT_EQUAL(deleted, 1u);
    kvs_put_result r;
    CU_ASSERT_EQUAL_FATAL(put_one(g, &ns, 1700, 0, NULL, 1 /* fp16; was int8 */, 0, &r), 0);
    CU_ASSERT_EQUAL_FATAL(memcmp(r.key, keys[0], 32), 0);
    CU_ASSERT_EQUAL(get_rec(g, &ns, keys, 1, KVS_EGRESS_STORED, &now), 0);
    CU_ASSERT_FALSE(same(&old, &now));
    /* the replay: refused by its seal, Get's current bytes handed on */
    CU_ASSERT_EQUAL(check_fetch_equals_get(g, u, &ns, keys, 1, KVS_EGRESS_STORED), ns.num_layers);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.forged_blocks, 1u);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNAUTH);
    /* without seals the replayed bytes get through: the old block's */
    un = open_sealing(g_replay.p.addr, NULL, 0, KVS_DECODE_AUTO);
    CU_ASSERT_EQUAL(kvs_client_fetch(un, &ns, (const unsigned char(*)[32])keys, 1,
                                     KVS_EGRESS_STORED, 0, -1, rec_cb, &ru, err),
                    0);
    CU_ASSERT_TRUE(same(&old, &ru));
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(un, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    free(old.p);
    free(now.p);
    free(ru.p);
    kvs_client_close(un);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* The data plane process changes a put's bytes in its bounce memory, then
 * answers a later put with another block's key. kvstashd refuses the changed
 * put (its seal) and stores nothing of it; libkvstash puts it over gRPC,
 * where it lands with the worker's bytes. On a new client, the false answer
 * fails libkvstash's check of kvstashd's tag: the put goes over gRPC, whose
 * answer gives the block's own key, which the worker then chains on. */
static void test_hostile_puts(void)
{
    if (g_hostile.skip)
        return;
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u1 = NULL, *u2 = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_hostile.p.addr, NULL, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_hostile.p.addr, NULL, 1, &u1), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_hostile.p.addr, NULL, 1, &u2), 0);
    /* put 1: changed in bounce memory */
    const unsigned X = 71000;
    kvs_put_result r;
    CU_ASSERT_EQUAL_FATAL(put_one(u1, &ns, X, 0, NULL, 1, 1, &r), 0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_put_seal_refused_total", NULL, NULL), 1.0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_puts_total", NULL, NULL), 0.0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u1, &st), 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNAUTH);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    unsigned char kx[1][32];
    CU_ASSERT_EQUAL_FATAL(lookup_keys(g, &ns, X, 1, kx), 1u);
    CU_ASSERT_EQUAL(memcmp(kx[0], r.key, 32), 0);
    tblock t;
    tblock_make(&ns, X, 0, &t);
    rec in = {0}, back = {0};
    size_t lb = (size_t)16 * ns.num_kv_heads * ns.head_dim * 2;
    for (unsigned l = 0; l < ns.num_layers; l++)
        rec_cb(&in, 0, l, t.k[l], lb, t.v[l], lb, 0, 0, l + 1 == ns.num_layers);
    tblock_free(&ns, &t);
    CU_ASSERT_EQUAL(get_rec(g, &ns, kx, 1, KVS_EGRESS_FP16, &back), 0);
    check_same(KVS_EGRESS_FP16, &in, &back); /* the worker's bytes, not the changed ones */
    free(in.p);
    free(back.p);
    /* put 2 stored and answered truly; put 3 answered with put 2's key */
    const unsigned A = 72000, B = 73000;
    kvs_put_result a0, b0, b1;
    CU_ASSERT_EQUAL_FATAL(put_one(u2, &ns, A, 0, NULL, 1, 1, &a0), 0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_puts_total", NULL, NULL), 1.0);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u2, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    CU_ASSERT_EQUAL_FATAL(put_one(u2, &ns, B, 0, NULL, 1, 1, &b0), 0);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u2, &st), 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNAUTH); /* the false answer took it off UCX */
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_NOT_EQUAL(memcmp(b0.key, a0.key, 32), 0);
    unsigned char kb[2][32];
    CU_ASSERT_EQUAL_FATAL(lookup_keys(g, &ns, B, 1, kb), 1u);
    CU_ASSERT_EQUAL(memcmp(kb[0], b0.key, 32), 0); /* B0's own key came back */
    /* chained on that answer, B1 extends B's prompt, not A's */
    unsigned char parent[32];
    memcpy(parent, b0.key, sizeof parent);
    CU_ASSERT_EQUAL(put_one(u2, &ns, B, 1, parent, 1, 1, &b1), 0);
    CU_ASSERT_EQUAL(lookup_keys(g, &ns, B, 2, kb), 2u);
    CU_ASSERT_EQUAL(memcmp(kb[1], b1.key, 32), 0);
    kvs_client_close(u1);
    kvs_client_close(u2);
    kvs_client_close(g);
}

/* The worker's block H (key want) was put over gRPC while h's data plane
 * process holds its UCX put back: checks it is stored, deletes it, lets the
 * held put go and waits for kvstashd's verdict on it: refused
 * (kvstash_xfer_put_closed_total 1), and the block stays deleted; without
 * the close or void it was stored again. */
static void delete_then_release(kvs_client *g, const kvs_ns *ns, unsigned H,
                                const unsigned char *want, const hostile_node *h)
{
    unsigned char k[1][32];
    CU_ASSERT_EQUAL_FATAL(lookup_keys(g, ns, H, 1, k), 1u); /* stored over gRPC */
    CU_ASSERT_EQUAL(memcmp(k[0], want, 32), 0);
    unsigned deleted = 0;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_delete(g, ns, k, 1, 0, -1, &deleted, err), 0);
    CU_ASSERT_EQUAL(deleted, 1u);
    FILE *f = fopen(h->hold_file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    unsigned back = 0;
    double refused = 0;
    for (int i = 0; i < 600 && refused < 1 && back == 0; i++) {
        refused = kvs_itest_stat(g, "kvstash_xfer_put_closed_total", NULL, NULL);
        back = lookup_keys(g, ns, H, 1, k);
        if (refused < 1 && back == 0)
            usleep(50 * 1000);
    }
    CU_ASSERT_EQUAL(refused, 1.0);
    CU_ASSERT_EQUAL(lookup_keys(g, ns, H, 1, k), 0u); /* it stayed deleted */
}

/* The data plane process holds back a worker's UCX put (its PUT_END) until
 * told. The worker's put times out: libkvstash closes its session (Connect
 * with close_session_id) and puts over gRPC. The block is then deleted and
 * the held put let go: kvstashd refuses it (its client closed the session)
 * and the deleted block stays deleted. Without the close it came back. */
static void test_hold_put_after_close(void)
{
    if (g_hold.skip)
        return;
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_hold.p.addr, NULL, 0, &g), 0);
    /* the put gives up after 3 s (the call timeout) */
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client(g_hold.p.addr, NULL, 1, 3000, &u), 0);
    const unsigned H = 74000;
    kvs_put_result r;
    CU_ASSERT_EQUAL_FATAL(put_one(u, &ns, H, 0, NULL, 1, 1, &r), 0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_NOT_EQUAL(st.ucx_status, 0);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    CU_ASSERT_EQUAL(st.sessions_closed, 1u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_sessions_closed_total", NULL, NULL), 1.0);
    delete_then_release(g, &ns, H, r.key, &g_hold);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_puts_total", NULL, NULL), 0.0);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* As hold, but the data plane process answers the worker's put at once with
 * a refusal it invents (no kvstashd tag, and not one that says the path
 * failed), while it holds the put's end back. libkvstash has kvstashd void
 * that put (Connect void_put_seq) before it puts over gRPC, and stays on
 * UCX; the block is deleted and the held put let go: kvstashd refuses it and
 * the block stays deleted. Without the void (the put went over gRPC with
 * the session open and the put live) it came back. */
static void test_refused_put_voided(void)
{
    if (g_refuse.skip)
        return;
    kvs_ns ns = make_ns();
    kvs_client *g = NULL, *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_refuse.p.addr, NULL, 0, &g), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_refuse.p.addr, NULL, 1, &u), 0);
    const unsigned H = 75000;
    kvs_put_result r;
    CU_ASSERT_EQUAL_FATAL(put_one(u, &ns, H, 0, NULL, 1, 1, &r), 0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    /* a refusal without kvstashd's tag: that put voided, then over gRPC; the
     * client stays on UCX */
    CU_ASSERT_EQUAL(st.ucx_status, 0);
    CU_ASSERT_EQUAL(st.connected, 1);
    CU_ASSERT_EQUAL(st.puts_voided, 1u);
    CU_ASSERT_EQUAL(st.sessions_closed, 0u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_put_voided_total", NULL, NULL), 1.0);
    delete_then_release(g, &ns, H, r.key, &g_refuse);
    /* and the session still serves puts over UCX */
    double puts0 = kvs_itest_stat(g, "kvstash_xfer_puts_total", NULL, NULL);
    CU_ASSERT_EQUAL(put_one(u, &ns, H + 500, 0, NULL, 1, 1, &r), 0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g, "kvstash_xfer_puts_total", NULL, NULL), puts0 + 1);
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 1u);
    kvs_client_close(u);
    kvs_client_close(g);
}

/* --ucx off: kvs_client_put_ucx puts over gRPC by itself (the key comes back
 * as gRPC gives it) and counts the fallback. */
static void test_off_put_fallback(void)
{
    kvs_client *u = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_off.addr, NULL, 1, &u), 0);
    kvs_ns ns = make_ns();
    kvs_put_result r;
    unsigned char k[2][32];
    CU_ASSERT_EQUAL_FATAL(put_one(u, &ns, 50000, 0, NULL, 4, 1, &r), 0);
    memcpy(k[0], r.key, 32);
    CU_ASSERT_EQUAL(put_one(u, &ns, 50000, 1, k[0], 1, 1, &r), 0);
    memcpy(k[1], r.key, 32);
    unsigned char l[2][32];
    CU_ASSERT_EQUAL_FATAL(lookup_keys(u, &ns, 50000, 2, l), 2u);
    CU_ASSERT_EQUAL(memcmp(l, k, sizeof k), 0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.connected, 0);
    CU_ASSERT_EQUAL(st.ucx_status, KVS_EUNIMPL);
    CU_ASSERT_EQUAL(st.fallbacks, 2u);
    kvs_client_close(u);
}

int main(int argc, char **argv)
{
    if (kvs_dw_is_worker(argc, argv))
        return die_main(argc, argv);
    static const kvs_test_case ucx_cases[] = {
        {"connect_session", test_connect_session},
        {"bad_connect", test_bad_connect},
        {"tenant_without_ucx", test_tenant_without_ucx},
        {"fetch_equals_get", test_fetch_equals_get},
        {"sealed_fetch", test_sealed_fetch},
        {"sealed_many_layers", test_sealed_many_layers},
        {"wrong_ns_rendered", test_wrong_ns_rendered},
        {"cross_tenant", test_cross_tenant},
        {"parallel_fetch", test_parallel_fetch},
        {"ucx_start_failure", test_ucx_start_failure},
        {"put_ucx_equals_grpc", test_put_ucx_equals_grpc},
        {"put_ucx_bad_header", test_put_ucx_bad_header},
        {"put_ucx_cross_tenant", test_put_ucx_cross_tenant},
        {"put_ucx_sealed", test_put_ucx_sealed},
        {"close_session", test_close_session},
        {"put_ucx_beside_grpc", test_put_ucx_beside_grpc},
        {"frozen_close", test_frozen_close},
        {"frozen_connect", test_frozen_connect},
        {"frozen_reconnect", test_frozen_reconnect},
        {"short_first_fetch", test_short_first_fetch},
        {"stalled_deadline", test_stalled_deadline},
        {"healthy_not_abandoned", test_healthy_not_abandoned},
        {"shared_first_connect", test_shared_first_connect},
        {"forked_close", test_forked_close},
        {"forked_calls", test_forked_calls},
        {"dataplane_dies", test_dataplane_dies}, /* last: it restarts the data plane */
        {NULL, NULL},
    };
    static const kvs_test_case off_cases[] = {
        {"off_fallback", test_off_fallback},
        {"off_put_fallback", test_off_put_fallback},
        {NULL, NULL},
    };
    static const kvs_test_case hostile_cases[] = {
        {"hostile_puts", test_hostile_puts},
        {NULL, NULL},
    };
    static const kvs_test_case hold_cases[] = {
        {"hold_put_after_close", test_hold_put_after_close},
        {NULL, NULL},
    };
    static const kvs_test_case refuse_cases[] = {
        {"refused_put_voided", test_refused_put_voided},
        {NULL, NULL},
    };
    static const kvs_test_case forge_cases[] = {
        {"forged_fetch", test_forged_fetch},
        {NULL, NULL},
    };
    static const kvs_test_case forge_hold_cases[] = {
        {"forged_then_stalled", test_forged_then_stalled},
        {NULL, NULL},
    };
    static const kvs_test_case notfound_cases[] = {
        {"notfound_fetch", test_notfound_fetch},
        {NULL, NULL},
    };
    static const kvs_test_case replay_cases[] = {
        {"replayed_fetch", test_replayed_fetch},
        {NULL, NULL},
    };
    static const kvs_test_case render_cases[] = {
        {"render_sealed", test_render_sealed},
        {NULL, NULL},
    };
    static const kvs_test_case corrupt_cases[] = {
        {"corrupt_fetch", test_corrupt_fetch},
        {NULL, NULL},
    };
    static const kvs_test_case nohelper_cases[] = {
        {"nohelper_no_ucx", test_nohelper_no_ucx},
        {"noxferd_no_ucx", test_noxferd_no_ucx},
        {NULL, NULL},
    };
    static const kvs_test_case lim_cases[] = {
        {"max_sessions", test_max_sessions},
        {NULL, NULL},
    };
    static const kvs_test_case probe_cases[] = {
        {"probe_quiet", test_probe_quiet},
        {NULL, NULL},
    };
    static const kvs_test_case wedge_cases[] = {
        {"wedge_restarts", test_wedge_restarts},
        {NULL, NULL},
    };
    static const kvs_test_case stuck_cases[] = {
        {"stuck_restarts_when_idle", test_stuck_restarts_when_idle},
        {NULL, NULL},
    };
    static const kvs_test_case goodbye_cases[] = {
        {"goodbye_on_restart", test_goodbye_on_restart},
        {NULL, NULL},
    };
    static const kvs_test_case churn_cases[] = {
        {"closed_clients_release_sessions", test_closed_clients_release_sessions},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"ucx", suite_ucx_init, suite_ucx_cleanup, ucx_cases},
        {"limits", suite_lim_init, suite_lim_cleanup, lim_cases},
        {"churn", suite_churn_init, suite_churn_cleanup, churn_cases},
        {"probe", suite_probe_init, suite_probe_cleanup, probe_cases},
        {"wedge", suite_wedge_init, suite_probe_cleanup, wedge_cases},
        {"stuck", suite_stuck_init, suite_stuck_cleanup, stuck_cases},
        {"goodbye", suite_goodbye_init, suite_stuck_cleanup, goodbye_cases},
        {"off", suite_off_init, suite_off_cleanup, off_cases},
        {"nohelper", suite_nohelper_init, suite_nohelper_cleanup, nohelper_cases},
        {"hostile", suite_hostile_init, suite_hostile_cleanup, hostile_cases},
        {"hold", suite_hold_init, suite_hold_cleanup, hold_cases},
        {"refuse", suite_refuse_init, suite_refuse_cleanup, refuse_cases},
        {"forge", suite_forge_init, suite_forge_cleanup, forge_cases},
        {"forge_hold", suite_forge_hold_init, suite_forge_hold_cleanup, forge_hold_cases},
        {"notfound", suite_notfound_init, suite_notfound_cleanup, notfound_cases},
        {"replay", suite_replay_init, suite_replay_cleanup, replay_cases},
        {"render", suite_render_init, suite_render_cleanup, render_cases},
        {"corrupt", suite_corrupt_init, suite_corrupt_cleanup, corrupt_cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
