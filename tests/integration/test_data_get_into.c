/*
 * test_data_get_into.c — kvs_client_get_into against a real kvstashd, for
 * every fixed-size egress format, with layers large enough (>= 4 KiB) that
 * the client unpacks K and V straight into the caller's buffers (data.c's
 * dst_alloc), and the server sends each layer as one pre-encoded slice
 * (data_get.c).
 *
 * The reference is kvs_client_get with a callback that copies each layer out
 * of the unpacked message (the path that touches no caller buffer during
 * unpacking): get_into must give the same bytes and scales for every layer of
 * every block, fp16 must be bit-exact against what was put, and a caller that
 * passes one buffer as both K and V of a layer gets V there (the copy order
 * get_into always had).
 */
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <grpc/grpc.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 3, H = 4, D = 64, T = 16, NB = 2 };

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static kvs_client *g_client;
/* What test_get_into_matches_get stored, for test_get_async (run after it). */
static kvs_ns g_ns;
static unsigned char g_keys[NB][32];
static int g_stored;

static int suite_init(void)
{
    static const char *const args[] = {"--threads", "4", "--log-level", "warn", NULL};
    if (kvs_itest_start(g_kvstashd, args, &g_srv, "get_into") != 0)
        return 1;
    if (kvs_itest_open_client(g_srv.addr, NULL, 0, 30000, &g_client) != 0) {
        kvs_server_proc_kill(&g_srv);
        return 1;
    }
    return 0;
}

static int suite_cleanup(void)
{
    kvs_client_close(g_client);
    g_client = NULL;
    return kvs_itest_stop(&g_srv, 10000);
}

/* fp16 bit patterns of small values, never NaN/Inf: sign, exponent 10..17. */
static uint16_t fp16_bits(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint16_t)(((*s >> 20) & 0x8000u) | ((10u + (unsigned)((*s >> 30) % 8u)) << 10) |
                      ((*s >> 40) & 0x3ffu));
}

typedef struct ref_ctx {
    size_t bytes;
    uint8_t *k, *v; /* [NB * L][bytes] */
    float ks[NB * L], vs[NB * L];
    int bad;
} ref_ctx;

static int ref_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                  size_t vl, float ks, float vs, int last)
{
    ref_ctx *r = arg;
    (void)last;
    size_t i = (size_t)b * L + l;
    if (b >= NB || l >= L || kl != r->bytes || vl != r->bytes) {
        r->bad = 1;
        return 1;
    }
    memcpy(r->k + i * r->bytes, k, kl);
    memcpy(r->v + i * r->bytes, v, vl);
    r->ks[i] = ks;
    r->vs[i] = vs;
    return 0;
}

static void test_get_into_matches_get(void)
{
    kvs_ns ns = kvs_itest_ns("test/get-into", L, H, D, T, 1 /* fp16 */);
    size_t n = (size_t)T * H * D;
    uint16_t *src_k[NB][L], *src_v[NB][L];
    uint64_t seed = 0x243f6a8885a308d3ull;
    for (int b = 0; b < NB; b++)
        for (int l = 0; l < L; l++) {
            src_k[b][l] = malloc(n * 2);
            src_v[b][l] = malloc(n * 2);
            for (size_t i = 0; i < n; i++) {
                src_k[b][l][i] = fp16_bits(&seed);
                src_v[b][l][i] = fp16_bits(&seed);
            }
        }
    unsigned tokens[NB * T];
    for (unsigned i = 0; i < NB * T; i++)
        tokens[i] = 5000 + i * 3;
    /* block 0 stored at fp16 (scheme 1), block 1 at int8 (scheme 4), chained */
    unsigned char keys[NB][32];
    char err[KVS_ERR_LEN] = "";
    for (int b = 0; b < NB; b++) {
        kvs_put_args a;
        memset(&a, 0, sizeof a);
        a.ns = &ns;
        a.parent_key = b ? keys[b - 1] : NULL;
        a.index = (unsigned)b;
        a.tokens = tokens + b * T;
        a.scheme = b == 0 ? 1 : 4;
        a.k = (const void *const *)src_k[b];
        a.v = (const void *const *)src_v[b];
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        int rc = kvs_client_put(g_client, &a, -1, &res, err);
        if (rc)
            fprintf(stderr, "put %d: %s\n", b, err);
        CU_ASSERT_EQUAL_FATAL(rc, 0);
        memcpy(keys[b], res.key, 32);
    }
    g_ns = ns;
    memcpy(g_keys, keys, sizeof g_keys);
    g_stored = 1;

    static const kvs_egress fmts[] = {KVS_EGRESS_FP16, KVS_EGRESS_BF16, KVS_EGRESS_FP32,
                                      KVS_EGRESS_FP8_PER_TENSOR};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        size_t lb = kvs_egress_layer_bytes(&ns, fmts[f]);
        CU_ASSERT_FATAL(lb >= 4096); /* large enough for the in-place unpack */
        ref_ctx r;
        memset(&r, 0, sizeof r);
        r.bytes = lb;
        r.k = malloc(NB * L * lb);
        r.v = malloc(NB * L * lb);
        int rc = kvs_client_get(g_client, &ns, (const unsigned char(*)[32])keys, NB, fmts[f], 0,
                                -1, ref_cb, &r, err);
        if (rc)
            fprintf(stderr, "get fmt %d: %s\n", (int)fmts[f], err);
        CU_ASSERT_EQUAL(rc, 0);
        CU_ASSERT_FALSE(r.bad);

        void *kd[NB * L], *vd[NB * L];
        float ks[NB * L], vs[NB * L];
        for (int i = 0; i < NB * L; i++) {
            kd[i] = malloc(lb);
            vd[i] = malloc(lb);
            memset(kd[i], 0xA5, lb);
            memset(vd[i], 0x5A, lb);
            ks[i] = vs[i] = -1;
        }
        rc = kvs_client_get_into(g_client, &ns, (const unsigned char(*)[32])keys, NB, fmts[f], 0,
                                 -1, kd, vd, ks, vs, err);
        if (rc)
            fprintf(stderr, "get_into fmt %d: %s\n", (int)fmts[f], err);
        CU_ASSERT_EQUAL(rc, 0);
        for (int i = 0; i < NB * L; i++) {
            CU_ASSERT_EQUAL(memcmp(kd[i], r.k + (size_t)i * lb, lb), 0);
            CU_ASSERT_EQUAL(memcmp(vd[i], r.v + (size_t)i * lb, lb), 0);
            CU_ASSERT_EQUAL(ks[i], r.ks[i]);
            CU_ASSERT_EQUAL(vs[i], r.vs[i]);
        }
        if (fmts[f] == KVS_EGRESS_FP16) {
            for (int l = 0; l < L; l++) {
                CU_ASSERT_EQUAL(memcmp(kd[l], src_k[0][l], lb), 0);
                CU_ASSERT_EQUAL(memcmp(vd[l], src_v[0][l], lb), 0);
            }
            /* one buffer as both K and V of every layer: V ends up there */
            void *both[NB * L];
            for (int i = 0; i < NB * L; i++) {
                memset(kd[i], 0, lb);
                both[i] = kd[i];
            }
            rc = kvs_client_get_into(g_client, &ns, (const unsigned char(*)[32])keys, NB,
                                     fmts[f], 0, -1, both, both, NULL, NULL, err);
            CU_ASSERT_EQUAL(rc, 0);
            for (int i = 0; i < NB * L; i++)
                CU_ASSERT_EQUAL(memcmp(both[i], r.v + (size_t)i * lb, lb), 0);
        }
        for (int i = 0; i < NB * L; i++) {
            free(kd[i]);
            free(vd[i]);
        }
        free(r.k);
        free(r.v);
    }
    for (int b = 0; b < NB; b++)
        for (int l = 0; l < L; l++) {
            free(src_k[b][l]);
            free(src_v[b][l]);
        }
}

/* kvs_client_get_async: a done callback per call, exactly once, after the
 * call's last layer; the layers are those of kvs_client_get; errors reach
 * the done callback (not found, stopped by the layer callback); a refused
 * call calls back never. */
typedef struct async_get {
    ref_ctx r;
    int layers, done_calls, status, layers_at_done;
    char err[KVS_ERR_LEN];
    int stop_after; /* > 0: the layer callback stops the call after that many */
} async_get;

static int async_layer(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                       size_t vl, float ks, float vs, int last)
{
    async_get *a = arg;
    a->layers++;
    if (a->stop_after && a->layers >= a->stop_after)
        return 1;
    return ref_cb(&a->r, b, l, k, kl, v, vl, ks, vs, last);
}

static void async_done(void *arg, int status, const char *err)
{
    async_get *a = arg;
    a->done_calls++;
    a->status = status;
    a->layers_at_done = a->layers;
    snprintf(a->err, sizeof a->err, "%s", err ? err : "");
}

static void test_get_async(void)
{
    CU_ASSERT_FATAL(g_stored);
    char err[KVS_ERR_LEN] = "";
    size_t lb = kvs_egress_layer_bytes(&g_ns, KVS_EGRESS_FP16);
    ref_ctx want;
    memset(&want, 0, sizeof want);
    want.bytes = lb;
    want.k = malloc(NB * L * lb);
    want.v = malloc(NB * L * lb);
    CU_ASSERT_EQUAL_FATAL(kvs_client_get(g_client, &g_ns, (const unsigned char(*)[32])g_keys, NB,
                                         KVS_EGRESS_FP16, 0, -1, ref_cb, &want, err),
                          0);
    enum { N = 6 };
    async_get a[N];
    memset(a, 0, sizeof a);
    for (int i = 0; i < N; i++) {
        a[i].r.bytes = lb;
        a[i].r.k = malloc(NB * L * lb);
        a[i].r.v = malloc(NB * L * lb);
    }
    a[4].stop_after = 2;
    unsigned char unknown[NB][32];
    memset(unknown, 0x7e, sizeof unknown);
    for (int i = 0; i < N; i++) {
        const unsigned char(*keys)[32] = (const unsigned char(*)[32])(i == 5 ? unknown : g_keys);
        CU_ASSERT_EQUAL(kvs_client_get_async(g_client, &g_ns, keys, NB, KVS_EGRESS_FP16, 0, -1,
                                             async_layer, async_done, &a[i]),
                        0);
    }
    /* refused at the call: no callback ever */
    async_get refused;
    memset(&refused, 0, sizeof refused);
    CU_ASSERT_EQUAL(kvs_client_get_async(g_client, &g_ns, (const unsigned char(*)[32])g_keys, 0,
                                         KVS_EGRESS_FP16, 0, -1, async_layer, async_done, &refused),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_client_get_async(g_client, &g_ns, (const unsigned char(*)[32])g_keys, NB,
                                         (kvs_egress)9, 0, -1, async_layer, async_done, &refused),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_client_get_async(g_client, &g_ns, (const unsigned char(*)[32])g_keys, NB,
                                         KVS_EGRESS_FP16, 0, -1, async_layer, NULL, &refused),
                    KVS_EINVAL);
    kvs_client_drain(g_client);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(a[i].done_calls, 1);
        CU_ASSERT_EQUAL(a[i].status, 0);
        CU_ASSERT_STRING_EQUAL(a[i].err, "");
        CU_ASSERT_EQUAL(a[i].layers, NB * L);
        CU_ASSERT_EQUAL(a[i].layers_at_done, NB * L);
        CU_ASSERT_FALSE(a[i].r.bad);
        CU_ASSERT_EQUAL(memcmp(a[i].r.k, want.k, NB * L * lb), 0);
        CU_ASSERT_EQUAL(memcmp(a[i].r.v, want.v, NB * L * lb), 0);
    }
    CU_ASSERT_EQUAL(a[4].done_calls, 1);
    CU_ASSERT_EQUAL(a[4].status, KVS_ECANCELED);
    CU_ASSERT_EQUAL(a[4].layers_at_done, 2);
    CU_ASSERT_EQUAL(a[5].done_calls, 1);
    CU_ASSERT_EQUAL(a[5].status, KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(a[5].layers, 0);
    CU_ASSERT_NOT_EQUAL(a[5].err[0], '\0');
    CU_ASSERT_EQUAL(refused.done_calls, 0);
    CU_ASSERT_EQUAL(refused.layers, 0);
    for (int i = 0; i < N; i++) {
        free(a[i].r.k);
        free(a[i].r.v);
    }
    free(want.k);
    free(want.v);
}

int main(int argc, char **argv)
{
    static const kvs_test_case cases[] = {
        {"get_into_matches_get", test_get_into_matches_get},
        {"get_async", test_get_async},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"get_into", suite_init, suite_cleanup, cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
