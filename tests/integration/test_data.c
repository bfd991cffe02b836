/*
 * test_data.c — black-box tests of the data path of a real kvstashd: Lookup,
 * Put, Get, Delete, Pin, Unpin through libkvstash, plus raw gRPC calls for what
 * the library never sends (malformed messages, wrong sizes, cancelled streams).
 *
 * Usage: test_data /path/to/kvstashd (ctest passes $<TARGET_FILE:kvstashd>).
 *
 * Suite "open" runs one kvstashd with no tenants (everyone is "default").
 * Suite "tenants" writes a config file with three tenants and runs its own
 * kvstashd with a small max_message_bytes. Every value a test checks comes
 * back from the server; payloads are pseudo-random with a fixed seed, so
 * a failure reproduces.
 */
#include "keys.h"
#include "kvq_math.h"
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"
#include "kvstash/v1/kvstash.pb-c.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static kvs_client *g_client;

/* ---- helpers ---------------------------------------------------------- */

static int open_client(const char *addr, const char *token, kvs_client **out)
{
    /* generous: CI machines run sanitizer builds under load */
    return kvs_itest_open_client(addr, token, 0, 30000, out);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
/* Roughly normal, in [-4, 4]. */
static float gauss(uint64_t *s)
{
    float acc = 0;
    for (int i = 0; i < 4; i++) {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        acc += (float)(*s >> 40) / (float)(1u << 24) - 0.5f;
    }
    return acc * 1.7f;
}

static kvs_ns make_ns(const char *model, unsigned layers, unsigned dtype)
{
    return kvs_itest_ns(model, layers, 2, 64, 16, dtype);
}

static size_t elems(const kvs_ns *ns)
{
    return (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim;
}
static size_t ebytes(unsigned dtype) { return dtype == 3 ? 4 : 2; }

/* A block's payload: k[l], v[l] of ns->dtype, seeded. Free with block_free. */
typedef struct block {
    unsigned layers;
    void **k, **v;
} block;

static block block_make(const kvs_ns *ns, uint64_t seed)
{
    block b = {ns->num_layers, calloc(ns->num_layers, sizeof(void *)),
               calloc(ns->num_layers, sizeof(void *))};
    size_t n = elems(ns);
    uint64_t s = seed * 2654435761u + 1;
    for (unsigned l = 0; l < ns->num_layers; l++) {
        b.k[l] = malloc(n * ebytes(ns->dtype));
        b.v[l] = malloc(n * ebytes(ns->dtype));
        for (size_t i = 0; i < n; i++) {
            /* keys with an outlier channel, as real keys have */
            float kx = gauss(&s) * ((i % ns->head_dim) == 3 ? 8.0f : 1.0f);
            float vx = gauss(&s);
            if (ns->dtype == 3) {
                ((float *)b.k[l])[i] = kx;
                ((float *)b.v[l])[i] = vx;
            } else if (ns->dtype == 1) {
                ((uint16_t *)b.k[l])[i] = kvq_f32_to_fp16(kx);
                ((uint16_t *)b.v[l])[i] = kvq_f32_to_fp16(vx);
            } else {
                ((uint16_t *)b.k[l])[i] = kvq_f32_to_bf16(kx);
                ((uint16_t *)b.v[l])[i] = kvq_f32_to_bf16(vx);
            }
        }
    }
    return b;
}

static void block_free(block *b)
{
    for (unsigned l = 0; l < b->layers; l++) {
        free(b->k[l]);
        free(b->v[l]);
    }
    free(b->k);
    free(b->v);
}

static float elem_f32(const void *p, size_t i, unsigned dtype)
{
    if (dtype == 3)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dtype == 1 ? kvq_fp16_to_f32(h) : kvq_bf16_to_f32(h);
}

static void tokens_make(unsigned *t, size_t n, unsigned base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (unsigned)i * 7u;
}

static int put_block(kvs_client *c, const kvs_ns *ns, const unsigned char *parent, unsigned index,
                     const unsigned *tokens, unsigned scheme, const block *b, kvs_put_result *res,
                     char *err)
{
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = ns;
    a.parent_key = parent;
    a.index = index;
    a.tokens = tokens;
    a.scheme = scheme;
    a.k = (const void *const *)b->k;
    a.v = (const void *const *)b->v;
    return kvs_client_put(c, &a, -1, res, err);
}

/* Polls a gauge until it equals want (up to ms). Returns the last value. */
static double wait_stat(kvs_client *c, const char *name, double want, int ms)
{
    double v = -1;
    for (int t = 0; t <= ms; t += 20) {
        v = kvs_itest_stat(c, name, NULL, NULL);
        if (v == want)
            break;
        usleep(20000);
    }
    return v;
}

/* ---- raw gRPC: unary and a Put stream the library would never send ------ */

static grpc_byte_buffer *bb_pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    protobuf_c_message_pack(m, buf);
    grpc_byte_buffer *bb = kvs_itest_bb_from(buf, n);
    free(buf);
    return bb;
}

/* A client-streaming (or unary) call: kvs_itest_raw_stream with a 10 s deadline. */
static grpc_status_code raw_stream(const char *addr, const char *token, const char *method,
                                   grpc_byte_buffer **msgs, size_t n, int cancel_after,
                                   char *details, size_t dn)
{
    return kvs_itest_raw_stream(addr, token, method, msgs, n, cancel_after, 10000, details, dn);
}

/* Protobuf messages of a Put: the header and the layers (sizes as given). */
typedef struct raw_put {
    Kvstash__V1__Layout layout;
    Kvstash__V1__Namespace ns;
    grpc_byte_buffer *msgs[64];
    size_t n;
} raw_put;

static void raw_ns(raw_put *p, const kvs_ns *ns)
{
    p->n = 0;
    kvstash__v1__layout__init(&p->layout);
    kvstash__v1__namespace__init(&p->ns);
    p->layout.num_layers = ns->num_layers;
    p->layout.num_kv_heads = ns->num_kv_heads;
    p->layout.head_dim = ns->head_dim;
    p->layout.block_tokens = ns->block_tokens;
    p->layout.dtype = (Kvstash__V1__Dtype)ns->dtype;
    p->ns.model = (char *)ns->model;
    p->ns.salt = (char *)"";
    p->ns.layout = &p->layout;
}

static void raw_header(raw_put *p, const unsigned char *parent, unsigned index,
                       const unsigned *tokens, size_t n_tokens, const unsigned char *claimed)
{
    Kvstash__V1__PutHeader h = KVSTASH__V1__PUT_HEADER__INIT;
    h.ns = &p->ns;
    if (parent) {
        h.parent_key.data = (uint8_t *)parent;
        h.parent_key.len = 32;
    }
    if (claimed) {
        h.key.data = (uint8_t *)claimed;
        h.key.len = 32;
    }
    h.tokens = (uint32_t *)tokens;
    h.n_tokens = n_tokens;
    h.index = index;
    Kvstash__V1__PutRequest r = KVSTASH__V1__PUT_REQUEST__INIT;
    r.msg_case = KVSTASH__V1__PUT_REQUEST__MSG_HEADER;
    r.header = &h;
    p->msgs[p->n++] = bb_pack(&r.base);
}

static void raw_layer(raw_put *p, unsigned layer, const void *k, size_t kn, const void *v,
                      size_t vn)
{
    Kvstash__V1__LayerPayload lp = KVSTASH__V1__LAYER_PAYLOAD__INIT;
    lp.layer = layer;
    lp.k.data = (uint8_t *)k;
    lp.k.len = kn;
    lp.v.data = (uint8_t *)v;
    lp.v.len = vn;
    Kvstash__V1__PutRequest r = KVSTASH__V1__PUT_REQUEST__INIT;
    r.msg_case = KVSTASH__V1__PUT_REQUEST__MSG_LAYER;
    r.layer = &lp;
    p->msgs[p->n++] = bb_pack(&r.base);
}

static grpc_status_code raw_put_send(raw_put *p, const char *addr, const char *token,
                                     int cancel_after, char *details, size_t dn)
{
    grpc_status_code st = raw_stream(addr, token, "/kvstash.v1.KvStash/Put", p->msgs, p->n,
                                     cancel_after, details, dn);
    for (size_t i = 0; i < p->n; i++)
        grpc_byte_buffer_destroy(p->msgs[i]);
    p->n = 0;
    return st;
}

/* ---- suite "open" ----------------------------------------------------- */

static int suite_open_init(void)
{
    static const char *const args[] = {"--threads", "4", "--log-level", "warn", NULL};
    if (kvs_itest_start(g_kvstashd, args, &g_srv, "open") != 0)
        return 1;
    if (open_client(g_srv.addr, NULL, &g_client) != 0) {
        kvs_server_proc_kill(&g_srv);
        return 1;
    }
    return 0;
}

static int suite_open_cleanup(void)
{
    kvs_client_close(g_client);
    g_client = NULL;
    return kvs_itest_stop(&g_srv, 10000);
}

/* fp16 scheme: what comes back is bit-for-bit what went in, at every step. */
static void test_roundtrip_fp16_exact(void)
{
    kvs_ns ns = make_ns("test/fp16-exact", 3, 1);
    unsigned tokens[16 * 2 + 5];
    tokens_make(tokens, 37, 1000);
    block b0 = block_make(&ns, 1), b1 = block_make(&ns, 2);
    kvs_put_result r0, r1;
    memset(&r0, 0, sizeof r0);
    memset(&r1, 0, sizeof r1);
    float kerr[3] = {-1, -1, -1}, verr[3] = {-1, -1, -1};
    unsigned sch[3] = {0, 0, 0};
    r0.k_rel_error = kerr;
    r0.v_rel_error = verr;
    r0.layer_scheme = sch;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b0, &r0, err), 0);
    CU_ASSERT_FALSE(r0.already_present);
    CU_ASSERT_TRUE(r0.stored_bytes > 2 * 3 * elems(&ns) * 2);
    for (int l = 0; l < 3; l++) {
        CU_ASSERT_EQUAL(kerr[l], 0.0f);
        CU_ASSERT_EQUAL(verr[l], 0.0f);
        CU_ASSERT_EQUAL(sch[l], 1u);
    }
    int rc = put_block(g_client, &ns, r0.key, 1, tokens + 16, 1, &b1, &r1, err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    if (rc)
        fprintf(stderr, "put: %s\n", err);

    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 37, 0, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 2u);
    CU_ASSERT_EQUAL(lr->matched_tokens, 32u);
    CU_ASSERT_NOT_EQUAL(lr->lease_id, 0ull);
    CU_ASSERT_TRUE(lr->lease_ms > 0);
    CU_ASSERT_FATAL(lr->n_blocks == 2);
    CU_ASSERT_EQUAL(memcmp(lr->blocks[0].key, r0.key, 32), 0);
    CU_ASSERT_EQUAL(memcmp(lr->blocks[1].key, r1.key, 32), 0);
    CU_ASSERT_EQUAL(lr->blocks[1].index, 1u);
    CU_ASSERT_EQUAL(lr->blocks[0].scheme, 1u);
    CU_ASSERT_EQUAL(lr->blocks[0].tier, 1u);
    CU_ASSERT_EQUAL(lr->blocks[0].stored_bytes, r0.stored_bytes);

    unsigned char keys[2][32];
    memcpy(keys[0], r0.key, 32);
    memcpy(keys[1], r1.key, 32);
    size_t lb = kvs_egress_layer_bytes(&ns, KVS_EGRESS_FP16);
    CU_ASSERT_EQUAL(lb, elems(&ns) * 2);
    void *kd[6], *vd[6];
    for (int i = 0; i < 6; i++) {
        kd[i] = malloc(lb);
        vd[i] = malloc(lb);
    }
    rc = kvs_client_get_into(g_client, &ns, (const unsigned char(*)[32])keys, 2, KVS_EGRESS_FP16,
                             lr->lease_id, -1, kd, vd, NULL, NULL, err);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc)
        fprintf(stderr, "get_into: %s\n", err);
    for (int l = 0; l < 3; l++) {
        CU_ASSERT_EQUAL(memcmp(kd[l], b0.k[l], lb), 0);
        CU_ASSERT_EQUAL(memcmp(vd[l], b0.v[l], lb), 0);
        CU_ASSERT_EQUAL(memcmp(kd[3 + l], b1.k[l], lb), 0);
        CU_ASSERT_EQUAL(memcmp(vd[3 + l], b1.v[l], lb), 0);
    }
    for (int i = 0; i < 6; i++) {
        free(kd[i]);
        free(vd[i]);
    }
    kvs_lookup_result_free(lr);

    /* the same block again is accepted and says so */
    kvs_put_result r2;
    memset(&r2, 0, sizeof r2);
    CU_ASSERT_EQUAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b0, &r2, err), 0);
    CU_ASSERT_TRUE(r2.already_present);
    CU_ASSERT_EQUAL(memcmp(r2.key, r0.key, 32), 0);
    CU_ASSERT_EQUAL(r2.stored_bytes, r0.stored_bytes);
    block_free(&b0);
    block_free(&b1);
}

typedef struct collect {
    const kvs_ns *ns;
    unsigned layers_seen;
    float *k, *v; /* fp32 [layers][elems] */
    float ks[8], vs[8];
    int fmt;
    int bad;
    size_t stored_k_len;
} collect;

static int collect_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                      size_t vl, float ks, float vs, int last)
{
    collect *x = arg;
    size_t n = elems(x->ns);
    if (b != 0 || l != x->layers_seen || last != (l + 1 == x->ns->num_layers))
        x->bad = 1;
    x->layers_seen++;
    if (x->fmt == KVS_EGRESS_STORED) {
        uint32_t magic;
        memcpy(&magic, k, 4);
        if (magic != 0x3154564Bu || kl == 0 || vl == 0)
            x->bad = 1;
        x->stored_k_len += kl;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        float kx, vx;
        switch (x->fmt) {
        case KVS_EGRESS_FP32:
            kx = ((const float *)k)[i];
            vx = ((const float *)v)[i];
            break;
        case KVS_EGRESS_BF16:
            kx = kvq_bf16_to_f32(((const uint16_t *)k)[i]);
            vx = kvq_bf16_to_f32(((const uint16_t *)v)[i]);
            break;
        case KVS_EGRESS_FP8_PER_TENSOR:
            kx = kvq_e4m3_to_f32(((const uint8_t *)k)[i]) * ks;
            vx = kvq_e4m3_to_f32(((const uint8_t *)v)[i]) * vs;
            break;
        default:
            kx = kvq_fp16_to_f32(((const uint16_t *)k)[i]);
            vx = kvq_fp16_to_f32(((const uint16_t *)v)[i]);
        }
        x->k[l * n + i] = kx;
        x->v[l * n + i] = vx;
    }
    x->ks[l] = ks;
    x->vs[l] = vs;
    return 0;
}

static double rel_err(const void *src, unsigned dtype, const float *dec, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = elem_f32(src, i, dtype), d = x - dec[i];
        num += d * d;
        den += x * x;
    }
    return sqrt(num / den);
}

/* 8-bit schemes: the error Put reports is the error Get delivers, and small. */
static void quantized_roundtrip(unsigned scheme, unsigned dtype, double bound)
{
    char model[64];
    snprintf(model, sizeof model, "test/q%u-d%u", scheme, dtype);
    kvs_ns ns = make_ns(model, 2, dtype);
    unsigned tokens[16];
    tokens_make(tokens, 16, 5000 + scheme * 100 + dtype);
    block b = block_make(&ns, 10 + scheme * 3 + dtype);
    kvs_put_result r;
    memset(&r, 0, sizeof r);
    float kerr[2], verr[2];
    unsigned sch[2];
    r.k_rel_error = kerr;
    r.v_rel_error = verr;
    r.layer_scheme = sch;
    char err[KVS_ERR_LEN] = "";
    int rc = put_block(g_client, &ns, NULL, 0, tokens, scheme, &b, &r, err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    size_t n = elems(&ns);
    CU_ASSERT_TRUE(r.stored_bytes < 2 * 2 * n * ebytes(dtype)); /* it did shrink */
    unsigned char key[1][32];
    memcpy(key[0], r.key, 32);
    collect x = {&ns, 0, calloc(2 * n, sizeof(float)), calloc(2 * n, sizeof(float)), {0}, {0},
                 KVS_EGRESS_FP32, 0, 0};
    CU_ASSERT_EQUAL(kvs_client_get(g_client, &ns, (const unsigned char(*)[32])key, 1,
                                   KVS_EGRESS_FP32, 0, -1, collect_cb, &x, err),
                    0);
    CU_ASSERT_EQUAL(x.layers_seen, 2u);
    CU_ASSERT_FALSE(x.bad);
    for (unsigned l = 0; l < 2; l++) {
        double ke = rel_err(b.k[l], dtype, x.k + l * n, n);
        double ve = rel_err(b.v[l], dtype, x.v + l * n, n);
        CU_ASSERT_EQUAL(sch[l], scheme);
        CU_ASSERT_TRUE(ke > 0 && ke < bound);
        CU_ASSERT_TRUE(ve > 0 && ve < bound);
        /* reported on ingest == measured here (float vs double rounding only) */
        CU_ASSERT_TRUE(fabs(ke - kerr[l]) <= 1e-5 + 1e-3 * ke);
        CU_ASSERT_TRUE(fabs(ve - verr[l]) <= 1e-5 + 1e-3 * ve);
        if (fabs(ke - kerr[l]) > 1e-5 + 1e-3 * ke)
            fprintf(stderr, "scheme %u layer %u: K error %g measured, %g reported\n", scheme, l,
                    ke, kerr[l]);
    }
    /* the other egress formats decode to the same values (within their precision) */
    int fmts[] = {KVS_EGRESS_FP16, KVS_EGRESS_BF16, KVS_EGRESS_FP8_PER_TENSOR};
    double tol[] = {2e-3, 1e-2, 0.08};
    float *ref_k = x.k;
    x.k = calloc(2 * n, sizeof(float));
    float *ref_v = x.v;
    x.v = calloc(2 * n, sizeof(float));
    for (int f = 0; f < 3; f++) {
        x.fmt = fmts[f];
        x.layers_seen = 0;
        CU_ASSERT_EQUAL(kvs_client_get(g_client, &ns, (const unsigned char(*)[32])key, 1,
                                       (kvs_egress)fmts[f], 0, -1, collect_cb, &x, err),
                        0);
        CU_ASSERT_EQUAL(x.layers_seen, 2u);
        double num = 0, den = 0, vnum = 0, vden = 0;
        for (size_t i = 0; i < 2 * n; i++) {
            num += (double)(x.k[i] - ref_k[i]) * (x.k[i] - ref_k[i]);
            den += (double)ref_k[i] * ref_k[i];
            vnum += (double)(x.v[i] - ref_v[i]) * (x.v[i] - ref_v[i]);
            vden += (double)ref_v[i] * ref_v[i];
        }
        CU_ASSERT_TRUE(sqrt(num / den) < tol[f]);
        CU_ASSERT_TRUE(sqrt(vnum / vden) < tol[f]);
        if (fmts[f] == KVS_EGRESS_FP8_PER_TENSOR)
            CU_ASSERT_TRUE(x.ks[0] > 0 && x.vs[0] > 0);
    }
    x.fmt = KVS_EGRESS_STORED;
    x.layers_seen = 0;
    CU_ASSERT_EQUAL(kvs_client_get(g_client, &ns, (const unsigned char(*)[32])key, 1,
                                   KVS_EGRESS_STORED, 0, -1, collect_cb, &x, err),
                    0);
    CU_ASSERT_EQUAL(x.layers_seen, 2u);
    CU_ASSERT_FALSE(x.bad);
    CU_ASSERT_TRUE(x.stored_k_len > 0 && x.stored_k_len < r.stored_bytes);
    free(ref_k);
    free(ref_v);
    free(x.k);
    free(x.v);
    block_free(&b);
}

static void test_roundtrip_int8(void) { quantized_roundtrip(4, 3, 0.02); }
static void test_roundtrip_fp8_e4m3(void) { quantized_roundtrip(2, 1, 0.05); }
static void test_roundtrip_fp8_e5m2_bf16(void) { quantized_roundtrip(3, 2, 0.1); }

/* Raw messages the library never sends. */
static void test_malformed_protobuf(void)
{
    static const unsigned char junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    const char *methods[] = {"Lookup", "Get", "Delete", "Pin", "Unpin", "Put"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        char path[64], det[256] = "";
        snprintf(path, sizeof path, "/kvstash.v1.KvStash/%s", methods[i]);
        grpc_byte_buffer *bb = kvs_itest_bb_from(junk, sizeof junk);
        grpc_status_code st = raw_stream(g_srv.addr, NULL, path, &bb, 1, -1, det, sizeof det);
        grpc_byte_buffer_destroy(bb);
        CU_ASSERT_EQUAL(st, GRPC_STATUS_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NOT_NULL(strstr(det, "malformed"));
        if (st != GRPC_STATUS_INVALID_ARGUMENT)
            fprintf(stderr, "%s: %d %s\n", path, (int)st, det);
    }
    /* an empty Put stream, and an empty Lookup (no namespace) */
    char det[256] = "";
    CU_ASSERT_EQUAL(raw_stream(g_srv.addr, NULL, "/kvstash.v1.KvStash/Put", NULL, 0, -1, det,
                               sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "header"));
    grpc_byte_buffer *bb = kvs_itest_bb_from("", 0);
    CU_ASSERT_EQUAL(raw_stream(g_srv.addr, NULL, "/kvstash.v1.KvStash/Lookup", &bb, 1, -1, det,
                               sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    grpc_byte_buffer_destroy(bb);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "ns"));
}

static void test_put_layout_mismatch(void)
{
    kvs_ns ns = make_ns("test/mismatch", 2, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 777);
    size_t lb = elems(&ns) * 2;
    uint8_t *buf = calloc(1, lb + 64);
    raw_put p;
    raw_ns(&p, &ns);
    char det[256] = "";
    /* payload one element short */
    raw_header(&p, NULL, 0, tokens, 16, NULL);
    raw_layer(&p, 0, buf, lb - 2, buf, lb - 2);
    raw_layer(&p, 1, buf, lb - 2, buf, lb - 2);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "bytes"));
    /* layers out of order */
    raw_header(&p, NULL, 0, tokens, 16, NULL);
    raw_layer(&p, 1, buf, lb, buf, lb);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    /* too few layers, then the end of the stream */
    raw_header(&p, NULL, 0, tokens, 16, NULL);
    raw_layer(&p, 0, buf, lb, buf, lb);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "1 of 2"));
    /* a layer before the header; two headers */
    raw_layer(&p, 0, buf, lb, buf, lb);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    raw_header(&p, NULL, 0, tokens, 16, NULL);
    raw_header(&p, NULL, 0, tokens, 16, NULL);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    /* wrong token count; bad layout */
    raw_header(&p, NULL, 0, tokens, 15, NULL);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "tokens"));
    p.layout.block_tokens = 8;
    raw_header(&p, NULL, 0, tokens, 8, NULL);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    p.layout.block_tokens = 16;
    p.layout.dtype = (Kvstash__V1__Dtype)9;
    raw_header(&p, NULL, 0, tokens, 16, NULL);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "dtype"));
    /* nothing of it was stored */
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 16, 0, -1, &lr, NULL), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 0u);
    CU_ASSERT_EQUAL(lr->lease_id, 0ull);
    kvs_lookup_result_free(lr);
    free(buf);
}

static void test_put_parent_errors(void)
{
    kvs_ns ns = make_ns("test/parents", 1, 1);
    unsigned tokens[32];
    tokens_make(tokens, 32, 4242);
    block b = block_make(&ns, 77);
    char err[KVS_ERR_LEN] = "";
    unsigned char bogus[32];
    memset(bogus, 0xab, sizeof bogus);
    /* missing parent */
    CU_ASSERT_EQUAL(put_block(g_client, &ns, bogus, 1, tokens + 16, 1, &b, NULL, err),
                    KVS_EPRECOND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "parent_key"));
    /* index and parent disagree */
    CU_ASSERT_EQUAL(put_block(g_client, &ns, NULL, 1, tokens, 1, &b, NULL, err), KVS_EINVAL);
    kvs_put_result r0 = {0};
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b, &r0, err), 0);
    CU_ASSERT_EQUAL(put_block(g_client, &ns, r0.key, 0, tokens + 16, 1, &b, NULL, err), KVS_EINVAL);
    CU_ASSERT_EQUAL(put_block(g_client, &ns, r0.key, 2, tokens + 16, 1, &b, NULL, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "header.index"));
    /* a claimed key that does not match parent + tokens */
    size_t lb = elems(&ns) * 2;
    raw_put p;
    raw_ns(&p, &ns);
    char det[256] = "";
    raw_header(&p, r0.key, 1, tokens + 16, 16, bogus);
    raw_layer(&p, 0, b.k[0], lb, b.v[0], lb);
    CU_ASSERT_EQUAL(raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "header.key"));
    /* Lookup with client keys that are not the chain of its tokens */
    kvs_lookup_result *lr = NULL;
    Kvstash__V1__LookupRequest lq = KVSTASH__V1__LOOKUP_REQUEST__INIT;
    lq.ns = &p.ns;
    lq.tokens = tokens;
    lq.n_tokens = 32;
    ProtobufCBinaryData kb[2] = {{32, r0.key}, {32, bogus}};
    lq.keys = kb;
    lq.n_keys = 2;
    grpc_byte_buffer *bb = bb_pack(&lq.base);
    CU_ASSERT_EQUAL(raw_stream(g_srv.addr, NULL, "/kvstash.v1.KvStash/Lookup", &bb, 1, -1, det,
                               sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(det, "keys[1]"));
    lq.n_keys = 1; /* the right key alone is fine */
    grpc_byte_buffer_destroy(bb);
    bb = bb_pack(&lq.base);
    CU_ASSERT_EQUAL(raw_stream(g_srv.addr, NULL, "/kvstash.v1.KvStash/Lookup", &bb, 1, -1, det,
                               sizeof det),
                    GRPC_STATUS_OK);
    grpc_byte_buffer_destroy(bb);
    CU_ASSERT_EQUAL(kvs_client_lookup(g_client, &ns, tokens, 32, 0, -1, &lr, NULL), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 1u);
    kvs_lookup_result_free(lr);
    block_free(&b);
}

static void test_unknown_namespace_and_keys(void)
{
    kvs_ns ns = make_ns("test/ns-a", 1, 1);
    kvs_ns other = make_ns("test/ns-b", 1, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 31337);
    block b = block_make(&ns, 5);
    kvs_put_result r = {0};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b, &r, err), 0);
    unsigned char key[1][32];
    memcpy(key[0], r.key, 32);
    collect x = {&other, 0, NULL, NULL, {0}, {0}, KVS_EGRESS_STORED, 0, 0};
    /* same key, another namespace: not found, on every key-addressed RPC */
    CU_ASSERT_EQUAL(kvs_client_get(g_client, &other, (const unsigned char(*)[32])key, 1,
                                   KVS_EGRESS_STORED, 0, -1, collect_cb, &x, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(x.layers_seen, 0u);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &other, (const unsigned char(*)[32])key, 1, 0, -1,
                                      NULL, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_client_pin(g_client, &other, (const unsigned char(*)[32])key, 1, 0, 0, -1,
                                   NULL, err),
                    KVS_ENOTFOUND);
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL(kvs_client_lookup(g_client, &other, tokens, 16, 0, -1, &lr, NULL), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 0u);
    kvs_lookup_result_free(lr);
    /* a key nobody stored, and one of the wrong length */
    unsigned char none[1][32];
    memset(none, 0x11, sizeof none);
    CU_ASSERT_EQUAL(kvs_client_get(g_client, &ns, (const unsigned char(*)[32])none, 1,
                                   KVS_EGRESS_FP16, 0, -1, collect_cb, &x, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "keys[0]"));
    raw_put p;
    raw_ns(&p, &ns);
    Kvstash__V1__DeleteRequest dq = KVSTASH__V1__DELETE_REQUEST__INIT;
    dq.ns = &p.ns;
    ProtobufCBinaryData kb = {5, (uint8_t *)"short"};
    dq.keys = &kb;
    dq.n_keys = 1;
    grpc_byte_buffer *bb = bb_pack(&dq.base);
    char det[256] = "";
    CU_ASSERT_EQUAL(raw_stream(g_srv.addr, NULL, "/kvstash.v1.KvStash/Delete", &bb, 1, -1, det,
                               sizeof det),
                    GRPC_STATUS_INVALID_ARGUMENT);
    grpc_byte_buffer_destroy(bb);
    /* egress format out of range */
    CU_ASSERT_EQUAL(kvs_client_get(g_client, &ns, (const unsigned char(*)[32])key, 1,
                                   (kvs_egress)7, 0, -1, collect_cb, &x, err),
                    KVS_EINVAL);
    block_free(&b);
}

static void test_delete_pin_unpin(void)
{
    kvs_ns ns = make_ns("test/delete", 1, 1);
    unsigned tokens[48];
    tokens_make(tokens, 48, 9000);
    block b = block_make(&ns, 9);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result r[3];
    memset(r, 0, sizeof r);
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b, &r[0], err), 0);
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, r[0].key, 1, tokens + 16, 1, &b, &r[1], err), 0);
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, r[1].key, 2, tokens + 32, 1, &b, &r[2], err), 0);
    unsigned char k[3][32];
    for (int i = 0; i < 3; i++)
        memcpy(k[i], r[i].key, 32);
    const unsigned char(*kp)[32] = (const unsigned char(*)[32])k;
    unsigned n = 99;
    /* an inner block needs subtree */
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, kp + 1, 1, 0, -1, &n, err), KVS_EPRECOND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "subtree"));
    /* a pinned leaf cannot go */
    CU_ASSERT_EQUAL(kvs_client_pin(g_client, &ns, kp + 2, 1, 0, 5, -1, &n, err), 0);
    CU_ASSERT_EQUAL(n, 1u);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, kp + 2, 1, 0, -1, &n, err), KVS_EPRECOND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "pinned"));
    CU_ASSERT_EQUAL(kvs_client_unpin(g_client, &ns, kp + 2, 1, 0, -1, &n, err), 0);
    CU_ASSERT_EQUAL(n, 1u);
    CU_ASSERT_EQUAL(kvs_client_unpin(g_client, &ns, kp + 2, 1, 0, -1, &n, err), KVS_EPRECOND);
    CU_ASSERT_EQUAL(kvs_client_pin(g_client, &ns, kp, 1, 0, 1000, -1, &n, err), KVS_EINVAL);
    /* a leased block cannot go until the lease is released */
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 48, 60000, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 3u);
    CU_ASSERT_EQUAL(lr->lease_ms, 60000u);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, kp + 1, 1, 1, -1, &n, err), KVS_EPRECOND);
    CU_ASSERT_EQUAL(kvs_client_unpin(g_client, &ns, NULL, 0, lr->lease_id, -1, &n, err), 0);
    CU_ASSERT_EQUAL(kvs_client_unpin(g_client, &ns, NULL, 0, lr->lease_id, -1, &n, err),
                    KVS_ENOTFOUND);
    kvs_lookup_result_free(lr);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, kp + 1, 1, 1, -1, &n, err), 0);
    CU_ASSERT_EQUAL(n, 2u);
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 48, 0, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 1u);
    /* that Lookup leased the root too (default lease_ms): end it first */
    CU_ASSERT_EQUAL(kvs_client_unpin(g_client, &ns, NULL, 0, lr->lease_id, -1, &n, err), 0);
    kvs_lookup_result_free(lr);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, kp, 1, 0, -1, &n, err), 0);
    CU_ASSERT_EQUAL(n, 1u);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, kp, 1, 0, -1, &n, err), KVS_ENOTFOUND);
    block_free(&b);
}

/* Leases and pin TTLs end by themselves. */
static void test_ttl_expiry(void)
{
    kvs_ns ns = make_ns("test/ttl", 1, 1);
    unsigned tokens[32];
    tokens_make(tokens, 32, 12121);
    block b = block_make(&ns, 12);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result r0 = {0}, r1 = {0};
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b, &r0, err), 0);
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, r0.key, 1, tokens + 16, 1, &b, &r1, err), 0);
    unsigned char k[1][32];
    memcpy(k[0], r1.key, 32);
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 32, 300, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr->lease_ms, 300u);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, (const unsigned char(*)[32])k, 1, 0, -1, NULL,
                                      err),
                    KVS_EPRECOND);
    usleep(500000);
    /* the lease is over: a late Unpin finds nothing, Delete works */
    CU_ASSERT_EQUAL(kvs_client_unpin(g_client, &ns, NULL, 0, lr->lease_id, -1, NULL, err),
                    KVS_ENOTFOUND);
    kvs_lookup_result_free(lr);
    CU_ASSERT_EQUAL(kvs_client_pin(g_client, &ns, (const unsigned char(*)[32])k, 1, 300, 0, -1,
                                   NULL, err),
                    0); /* still cached: the pin (300 ms) succeeds */
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, (const unsigned char(*)[32])k, 1, 0, -1, NULL,
                                      err),
                    KVS_EPRECOND); /* pinned for 300 ms */
    usleep(500000);
    unsigned n = 0;
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, (const unsigned char(*)[32])k, 1, 0, -1, &n,
                                      err),
                    0);
    CU_ASSERT_EQUAL(n, 1u);
    block_free(&b);
}

static void test_limits_and_deadline(void)
{
    kvs_ns ns = make_ns("test/limits", 1, 1);
    unsigned tokens[16 * 5];
    tokens_make(tokens, 80, 1);
    const char *n[] = {"max_blocks_per_request"}, *v4[] = {"4"}, *vd[] = {"4096"};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_client_set_config(g_client, n, v4, 1, 0, -1, NULL, err), 0);
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL(kvs_client_lookup(g_client, &ns, tokens, 80, 0, -1, &lr, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "max_blocks_per_request"));
    CU_ASSERT_EQUAL(kvs_client_lookup(g_client, &ns, tokens, 64, 0, -1, &lr, err), 0);
    kvs_lookup_result_free(lr);
    unsigned char k[5][32];
    memset(k, 1, sizeof k);
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, (const unsigned char(*)[32])k, 5, 0, -1, NULL,
                                      err),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, n, vd, 1, 0, -1, NULL, err), 0);
    /* an expired deadline is reported by gRPC, quickly */
    double t0 = kvs_test_now_ms();
    CU_ASSERT_EQUAL(kvs_client_lookup(g_client, &ns, tokens, 16, 0, 0, &lr, err), KVS_ETIMEDOUT);
    block b = block_make(&ns, 3);
    CU_ASSERT_EQUAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b, NULL, err), 0);
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = &ns;
    a.tokens = tokens + 16;
    a.k = (const void *const *)b.k;
    a.v = (const void *const *)b.v;
    CU_ASSERT_EQUAL(kvs_client_put(g_client, &a, 0, NULL, err), KVS_ETIMEDOUT);
    CU_ASSERT_TRUE(kvs_test_now_ms() - t0 < 2000);
    block_free(&b);
    /* watermarks must stay ordered; the policy can change live */
    const char *wn[] = {"low_watermark_pct", "high_watermark_pct"}, *wv[] = {"90", "80"};
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, wn, wv, 2, 0, -1, NULL, err), KVS_EINVAL);
    const char *pn[] = {"policy", "default_scheme", "skip_layers"},
               *pv[] = {"s3fifo", "fp8_e4m3", "0,2-3"};
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, pn, pv, 3, 0, -1, NULL, err), 0);
    const char *bad[] = {"lru", "int8", "1-x"};
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, pn, bad, 3, 0, -1, NULL, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "skip_layers"));
    /* server defaults now decide: layer 0 fp16 (skip), layer 1 fp8_e4m3 */
    kvs_ns ns2 = make_ns("test/defaults", 2, 1);
    block b2 = block_make(&ns2, 4);
    kvs_put_result r;
    memset(&r, 0, sizeof r);
    unsigned sch[2] = {0, 0};
    float ke[2];
    r.layer_scheme = sch;
    r.k_rel_error = ke;
    CU_ASSERT_EQUAL(put_block(g_client, &ns2, NULL, 0, tokens, 0, &b2, &r, err), 0);
    CU_ASSERT_EQUAL(sch[0], 1u);
    CU_ASSERT_EQUAL(sch[1], 2u);
    CU_ASSERT_EQUAL(ke[0], 0.0f);
    CU_ASSERT_TRUE(ke[1] > 0);
    /* capacity: lowered and raised back at run time, never past the size at start */
    const char *cn[] = {"capacity"}, *c64[] = {"64MiB"}, *c1g[] = {"1GiB"}, *c2g[] = {"2GiB"};
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, cn, c64, 1, 0, -1, NULL, err), 0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g_client, "kvstash_store_memory_capacity_bytes", NULL, NULL),
                    64.0 * 1024 * 1024);
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, cn, c2g, 1, 0, -1, NULL, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "capacity"));
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, cn, c1g, 1, 0, -1, NULL, err), 0);
    const char *back[] = {"lru", "int8", ""};
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, pn, back, 3, 0, -1, NULL, err), 0);
    block_free(&b2);
}

/* A client cancels a Put after the header and one of two layers: nothing is
 * stored, and the reservation goes back (reserved bytes return to 0). */
static void test_cancel_mid_put(void)
{
    kvs_ns ns = make_ns("test/cancel-put", 2, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 6060);
    block b = block_make(&ns, 60);
    size_t lb = elems(&ns) * 2;
    double used0 = kvs_itest_stat(g_client, "kvstash_store_used_bytes", NULL, NULL);
    double aborted0 = kvs_itest_stat(g_client, "kvstash_put_blocks_total", "result", "aborted");
    raw_put p;
    raw_ns(&p, &ns);
    raw_header(&p, NULL, 0, tokens, 16, NULL);
    raw_layer(&p, 0, b.k[0], lb, b.v[0], lb);
    raw_layer(&p, 1, b.k[1], lb, b.v[1], lb);
    grpc_status_code st = raw_put_send(&p, g_srv.addr, NULL, 2, NULL, 0);
    CU_ASSERT_EQUAL(st, GRPC_STATUS_CANCELLED);
    CU_ASSERT_EQUAL(wait_stat(g_client, "kvstash_put_staged_bytes", 0, 3000), 0);
    CU_ASSERT_EQUAL(wait_stat(g_client, "kvstash_store_reserved_bytes", 0, 3000), 0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g_client, "kvstash_store_used_bytes", NULL, NULL), used0);
    double aborted = 0;
    for (int i = 0; i < 100; i++) {
        aborted = kvs_itest_stat(g_client, "kvstash_put_blocks_total", "result", "aborted");
        if (aborted == aborted0 + 1)
            break;
        usleep(20000);
    }
    CU_ASSERT_EQUAL(aborted, aborted0 + 1);
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 16, 0, -1, &lr, NULL), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 0u);
    kvs_lookup_result_free(lr);
    /* and the same block can be put whole afterwards */
    CU_ASSERT_EQUAL(put_block(g_client, &ns, NULL, 0, tokens, 4, &b, NULL, NULL), 0);
    block_free(&b);
}

static int stop_after_first(void *arg, unsigned b, unsigned l, const void *k, size_t kl,
                            const void *v, size_t vl, float ks, float vs, int last)
{
    (void)b, (void)l, (void)k, (void)kl, (void)v, (void)vl, (void)ks, (void)vs, (void)last;
    (*(int *)arg)++;
    return 1;
}

/* A client stops a Get after one layer: the call ends CANCELLED and the
 * Lookup lease it named is released at once (the block can be deleted). */
static void test_cancel_mid_get(void)
{
    kvs_ns ns = make_ns("test/cancel-get", 8, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 7070);
    block b = block_make(&ns, 70);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result r = {0};
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &ns, NULL, 0, tokens, 1, &b, &r, err), 0);
    double leases0 = kvs_itest_stat(g_client, "kvstash_store_leases", NULL, NULL);
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 16, 600000, -1, &lr, err), 0);
    CU_ASSERT_EQUAL_FATAL(lr->matched_blocks, 1u);
    CU_ASSERT_EQUAL(kvs_itest_stat(g_client, "kvstash_store_leases", NULL, NULL), leases0 + 1);
    unsigned char k[1][32];
    memcpy(k[0], r.key, 32);
    unsigned n = 0;
    CU_ASSERT_EQUAL(kvs_client_delete(g_client, &ns, (const unsigned char(*)[32])k, 1, 0, -1, &n,
                                      err),
                    KVS_EPRECOND); /* leased */
    int calls = 0;
    CU_ASSERT_EQUAL(kvs_client_get(g_client, &ns, (const unsigned char(*)[32])k, 1,
                                   KVS_EGRESS_FP32, lr->lease_id, -1, stop_after_first, &calls, err),
                    KVS_ECANCELED);
    CU_ASSERT_EQUAL(calls, 1);
    CU_ASSERT_EQUAL(wait_stat(g_client, "kvstash_store_leases", leases0, 3000), leases0);
    int rc = KVS_EPRECOND;
    for (int i = 0; i < 100 && rc == KVS_EPRECOND; i++) {
        rc = kvs_client_delete(g_client, &ns, (const unsigned char(*)[32])k, 1, 0, -1, &n, err);
        if (rc == KVS_EPRECOND)
            usleep(20000);
    }
    CU_ASSERT_EQUAL(rc, 0);
    kvs_lookup_result_free(lr);
    block_free(&b);
}

#define N_CLIENTS 16
#define N_ROUNDS 6
static atomic_int g_errors;

static void *mixed_client(void *arg)
{
    int id = (int)(intptr_t)arg;
    kvs_client *c = NULL;
    if (open_client(g_srv.addr, NULL, &c) != 0) {
        atomic_fetch_add(&g_errors, 1);
        return NULL;
    }
    kvs_ns ns = make_ns("test/mixed", 2, 1);
    size_t lb = elems(&ns) * 2;
    char err[KVS_ERR_LEN] = "";
    /* a prefix every client shares, then blocks of its own */
    unsigned tokens[48];
    block shared = block_make(&ns, 4242), own = block_make(&ns, 100 + (uint64_t)id);
    void *kd[6], *vd[6];
    for (int i = 0; i < 6; i++) {
        kd[i] = malloc(lb);
        vd[i] = malloc(lb);
    }
    for (int round = 0; round < N_ROUNDS; round++) {
        tokens_make(tokens, 16, 1);
        tokens_make(tokens + 16, 32, 100000u + (unsigned)(id * 1000 + round * 50));
        kvs_put_result r0 = {0}, r1 = {0}, r2 = {0};
        int rc = put_block(c, &ns, NULL, 0, tokens, 1, &shared, &r0, err);
        if (rc == 0)
            rc = put_block(c, &ns, r0.key, 1, tokens + 16, round % 2 ? 4 : 1, &own, &r1, err);
        if (rc == 0)
            rc = put_block(c, &ns, r1.key, 2, tokens + 32, 1, &own, &r2, err);
        kvs_lookup_result *lr = NULL;
        if (rc == 0)
            rc = kvs_client_lookup(c, &ns, tokens, 48, 0, -1, &lr, err);
        if (rc == 0 && lr->matched_blocks != 3) {
            snprintf(err, sizeof err, "matched %u of 3", lr->matched_blocks);
            rc = -1000;
        }
        if (rc == 0) {
            unsigned char k[3][32];
            for (int i = 0; i < 3; i++)
                memcpy(k[i], lr->blocks[i].key, 32);
            rc = kvs_client_get_into(c, &ns, (const unsigned char(*)[32])k, 3, KVS_EGRESS_FP16,
                                     lr->lease_id, -1, kd, vd, NULL, NULL, err);
            if (rc == 0 && (memcmp(kd[0], shared.k[0], lb) != 0 ||
                            memcmp(vd[1], shared.v[1], lb) != 0 ||
                            memcmp(kd[5], own.k[1], lb) != 0)) {
                snprintf(err, sizeof err, "fp16 round trip differs");
                rc = -1001;
            }
            if (rc == 0)
                rc = kvs_client_pin(c, &ns, (const unsigned char(*)[32])k + 2, 1, 0, 0, -1, NULL,
                                    err);
            if (rc == 0)
                rc = kvs_client_unpin(c, &ns, (const unsigned char(*)[32])k + 2, 1, 0, -1, NULL,
                                      err);
            if (rc == 0 && round % 3 == 2)
                rc = kvs_client_delete(c, &ns, (const unsigned char(*)[32])k + 2, 1, 0, -1, NULL,
                                       err);
        }
        kvs_lookup_result_free(lr);
        kvs_stats *st = NULL;
        if (rc == 0)
            rc = kvs_client_stats(c, "kvstash_lookup", -1, &st, err);
        kvs_stats_free(st);
        if (rc != 0) {
            fprintf(stderr, "client %d round %d: %s (%s)\n", id, round, kvs_strerror(rc), err);
            atomic_fetch_add(&g_errors, 1);
            break;
        }
    }
    for (int i = 0; i < 6; i++) {
        free(kd[i]);
        free(vd[i]);
    }
    block_free(&shared);
    block_free(&own);
    kvs_client_close(c);
    return NULL;
}

static void test_concurrent_mixed(void)
{
    atomic_store(&g_errors, 0);
    double hits0 = kvs_itest_stat(g_client, "kvstash_lookup_blocks_total", "result", "hit");
    pthread_t t[N_CLIENTS];
    int started = 0;
    for (int i = 0; i < N_CLIENTS; i++)
        if (pthread_create(&t[i], NULL, mixed_client, (void *)(intptr_t)i) == 0)
            started++;
    CU_ASSERT_EQUAL(started, N_CLIENTS);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    CU_ASSERT_EQUAL(atomic_load(&g_errors), 0);
    double hits = kvs_itest_stat(g_client, "kvstash_lookup_blocks_total", "result", "hit");
    CU_ASSERT_EQUAL(hits, hits0 + N_CLIENTS * N_ROUNDS * 3);
}

typedef struct async_state {
    atomic_int done, failed;
    unsigned char keys[8][32];
} async_state;

typedef struct async_arg {
    async_state *st;
    int i;
} async_arg;

static void on_put_done(void *arg, int status, const kvs_put_result *res, const char *err)
{
    async_arg *a = arg;
    if (status != 0 || res == NULL) {
        fprintf(stderr, "async put %d: %s (%s)\n", a->i, kvs_strerror(status), err ? err : "");
        atomic_fetch_add(&a->st->failed, 1);
    } else {
        memcpy(a->st->keys[a->i], res->key, 32);
    }
    atomic_fetch_add(&a->st->done, 1);
}

static void test_put_async(void)
{
    kvs_ns ns = make_ns("test/async", 2, 3);
    static async_state st;
    async_arg args[8];
    unsigned tokens[16];
    for (int i = 0; i < 8; i++) {
        tokens_make(tokens, 16, 20000u + (unsigned)i * 100);
        block b = block_make(&ns, 200 + (uint64_t)i);
        kvs_put_args a;
        memset(&a, 0, sizeof a);
        a.ns = &ns;
        a.tokens = tokens; /* copied by the call: reused at once */
        a.scheme = 4;
        a.k = (const void *const *)b.k;
        a.v = (const void *const *)b.v;
        args[i].st = &st;
        args[i].i = i;
        CU_ASSERT_EQUAL(kvs_client_put_async(g_client, &a, -1, on_put_done, &args[i]), 0);
        block_free(&b); /* the payload was copied too */
    }
    kvs_client_drain(g_client);
    CU_ASSERT_EQUAL(atomic_load(&st.done), 8);
    CU_ASSERT_EQUAL(atomic_load(&st.failed), 0);
    for (int i = 0; i < 8; i++) {
        tokens_make(tokens, 16, 20000u + (unsigned)i * 100);
        kvs_lookup_result *lr = NULL;
        CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(g_client, &ns, tokens, 16, 0, -1, &lr, NULL), 0);
        CU_ASSERT_EQUAL(lr->matched_blocks, 1u);
        if (lr->n_blocks == 1)
            CU_ASSERT_EQUAL(memcmp(lr->blocks[0].key, st.keys[i], 32), 0);
        kvs_lookup_result_free(lr);
    }
    /* a bad argument is refused at once and never calls back */
    CU_ASSERT_EQUAL(kvs_client_put_async(g_client, NULL, -1, on_put_done, &args[0]), KVS_EINVAL);
}

/* Random, mostly wrong Put streams: every one gets a precise
 * status (never INTERNAL, UNKNOWN or a dropped connection) and the server
 * keeps serving. The seed is fixed, so a failure reproduces. */
static void test_hostile_streams(void)
{
    static const unsigned char junk[65536];
    kvs_ns good = make_ns("test/hostile", 2, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 8080);
    block b = block_make(&good, 80);
    kvs_put_result root = {0};
    CU_ASSERT_EQUAL_FATAL(put_block(g_client, &good, NULL, 0, tokens, 1, &b, &root, NULL), 0);
    block_free(&b);
    int bad_status = 0, ok = 0;
    for (int i = 0; i < 150; i++) {
        kvs_ns ns = good;
        uint64_t r = rnd();
        switch (r % 6) {
        case 0: ns.num_layers = (unsigned)(rnd() % 3000); break;
        case 1: ns.num_kv_heads = (unsigned)(rnd() % 300); break;
        case 2: ns.head_dim = (unsigned)(rnd() % 1100); break;
        case 3: ns.block_tokens = (unsigned)(rnd() % 1100); break;
        case 4: ns.dtype = (unsigned)(rnd() % 5); break;
        default: break; /* a good layout, bad messages */
        }
        raw_put p;
        raw_ns(&p, &ns);
        unsigned tok[64];
        for (int t = 0; t < 64; t++)
            tok[t] = (unsigned)rnd();
        int with_parent = (int)(rnd() % 3);
        raw_header(&p, with_parent == 1 ? root.key : with_parent == 2 ? junk : NULL,
                   (unsigned)(rnd() % 3), tok, (size_t)(rnd() % 2 ? 16 : rnd() % 64),
                   rnd() % 4 ? NULL : junk);
        int nl = (int)(rnd() % 4);
        for (int l = 0; l < nl && p.n < 60; l++) {
            size_t kb = rnd() % 3 ? elems(&good) * 2 : (size_t)(rnd() % sizeof junk);
            raw_layer(&p, (unsigned)(rnd() % 3), junk, kb, junk, rnd() % 2 ? kb : kb / 2);
        }
        if (rnd() % 5 == 0) /* a second header, or junk after the stream */
            raw_header(&p, NULL, 0, tok, 16, NULL);
        char det[256] = "";
        grpc_status_code st = raw_put_send(&p, g_srv.addr, NULL, -1, det, sizeof det);
        if (st == GRPC_STATUS_OK)
            ok++;
        else if (st != GRPC_STATUS_INVALID_ARGUMENT && st != GRPC_STATUS_FAILED_PRECONDITION &&
                 st != GRPC_STATUS_RESOURCE_EXHAUSTED && st != GRPC_STATUS_PERMISSION_DENIED) {
            bad_status++;
            fprintf(stderr, "hostile put %d: status %d (%s)\n", i, (int)st, det);
        } else if (det[0] == '\0') {
            bad_status++;
            fprintf(stderr, "hostile put %d: status %d without a message\n", i, (int)st);
        }
    }
    CU_ASSERT_EQUAL(bad_status, 0);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    /* nothing half-written: every staged block and reservation went back */
    CU_ASSERT_EQUAL(wait_stat(g_client, "kvstash_put_staged_bytes", 0, 3000), 0);
    CU_ASSERT_EQUAL(wait_stat(g_client, "kvstash_store_reserved_bytes", 0, 3000), 0);
    fprintf(stderr, "hostile puts: %d of 150 accepted\n", ok);
}

static void test_stats_figures(void)
{
    kvs_stats *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_stats(g_client, NULL, -1, &s, NULL), 0);
    const kvs_metric *m = kvs_stats_find(s, "kvstash_quant_rel_error", "layer", "0");
    CU_ASSERT_PTR_NOT_NULL(m);
    if (m) {
        CU_ASSERT_EQUAL(m->kind, KVS_METRIC_HISTOGRAM);
        CU_ASSERT_TRUE(m->count > 0);
    }
    const char *counters[] = {"kvstash_ingest_bytes_total", "kvstash_egress_bytes_total",
                              "kvstash_ingest_stored_bytes_total", "kvstash_store_blocks",
                              "kvstash_store_used_bytes"};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        m = kvs_stats_find(s, counters[i], NULL, NULL);
        CU_ASSERT_PTR_NOT_NULL(m);
        if (m)
            CU_ASSERT_TRUE(m->value > 0);
    }
    m = kvs_stats_find(s, "kvstash_lookup_blocks_total", "result", "miss");
    CU_ASSERT_TRUE(m && m->value > 0);
    m = kvs_stats_find(s, "kvstash_store_tier_bytes", "tier", "host");
    CU_ASSERT_TRUE(m && m->value > 0);
    CU_ASSERT_PTR_NOT_NULL(kvs_stats_find(s, "kvstash_store_evictions_total", "reason", "delete"));
    CU_ASSERT_PTR_NOT_NULL(kvs_stats_find(s, "kvstash_tenant_bytes", "tenant", "default"));
    kvs_stats_free(s);
}

/* ---- suite "tenants" ----------------------------------------------------- */

static kvs_server_proc g_tsrv;
static char g_tdir[] = "/tmp/kvs_test_data_XXXXXX";
static char g_tconf[128];

#define TOKEN_A "token-alpha-0123"
#define TOKEN_B "token-bravo-4567"
/* bravo's file line is its token's SHA-256 (printf %s TOKEN_B | sha256sum), in
 * upper case; alpha and small keep `token =` (still accepted, with a WARN) */
#define TOKEN_B_SHA256 "E02E942F45792840DA069E77CC8C8A893362A7D4D385746131BD64A4166F9F3B"
#define TOKEN_S "token-small-89ab"

static int suite_tenants_init(void)
{
    if (kvs_itest_write_config(g_tdir, g_tconf, sizeof g_tconf,
                               "[kvstashd]\nlog_level = warn\n\n"
                               "[tenant.alpha]\ntoken = " TOKEN_A "\nsecret = alpha-secret\n"
                               "models = allowed/*, exact/model\nadmin = true\n"
                               "scheme = fp8_e5m2\nskip_layers = 1\n\n"
                               "[tenant.bravo]\ntoken_sha256 = " TOKEN_B_SHA256 "\n"
                               "secret = bravo-secret\n"
                               "fp16 = true\n\n"
                               "[tenant.small]\ntoken = " TOKEN_S "\nquota = 4KiB\n") != 0)
        return 1;
    const char *args[] = {"--config", g_tconf, "--max-message-bytes", "256KiB", NULL};
    return kvs_itest_start(g_kvstashd, args, &g_tsrv, "tenants");
}

static int suite_tenants_cleanup(void)
{
    int rc = kvs_itest_stop(&g_tsrv, 10000);
    unlink(g_tconf);
    rmdir(g_tdir);
    return rc;
}

/* A tenant that is not an admin sees its own figures and rule, no other
 * tenant's: Stats leaves out samples labelled with another tenant, GetConfig's
 * tenant_rules holds its own rule only. An admin sees every tenant. */
static void test_tenant_visibility(void)
{
    kvs_client *a = NULL, *bravo = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_A, &a), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_B, &bravo), 0);
    static const char *const tenants[] = {"alpha", "bravo", "small"};
    char err[KVS_ERR_LEN] = "";
    kvs_stats *sa = NULL, *sb = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_stats(a, "kvstash_tenant", 5000, &sa, err), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_client_stats(bravo, "kvstash_tenant", 5000, &sb, err), 0);
    for (size_t i = 0; i < 3; i++) {
        CU_ASSERT_PTR_NOT_NULL(kvs_stats_find(sa, "kvstash_tenant_bytes", "tenant", tenants[i]));
        int own = strcmp(tenants[i], "bravo") == 0;
        CU_ASSERT_EQUAL(kvs_stats_find(sb, "kvstash_tenant_bytes", "tenant", tenants[i]) != NULL,
                        own);
    }
    CU_ASSERT_PTR_NOT_NULL(kvs_stats_find(sa, "kvstash_tenant_quota_bytes", "tenant", "small"));
    CU_ASSERT_PTR_NULL(kvs_stats_find(sb, "kvstash_tenant_quota_bytes", "tenant", "small"));
    kvs_stats_free(sa);
    kvs_stats_free(sb);

    const char *name = "tenant_rules";
    kvs_config *ca = NULL, *cb = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_get_config(a, &name, 1, 5000, &ca, err), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_client_get_config(bravo, &name, 1, 5000, &cb, err), 0);
    CU_ASSERT_EQUAL_FATAL(ca->n, 1);
    CU_ASSERT_EQUAL_FATAL(cb->n, 1);
    for (size_t i = 0; i < 3; i++)
        CU_ASSERT_PTR_NOT_NULL(strstr(ca->entries[0].value, tenants[i]));
    CU_ASSERT_EQUAL(strncmp(cb->entries[0].value, "bravo ", 6), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(cb->entries[0].value, "fp16"));
    CU_ASSERT_PTR_NULL(strstr(cb->entries[0].value, "alpha"));
    CU_ASSERT_PTR_NULL(strstr(cb->entries[0].value, "small"));
    CU_ASSERT_PTR_NULL(strchr(cb->entries[0].value, ';'));
    kvs_config_free(ca);
    kvs_config_free(cb);
    kvs_client_close(a);
    kvs_client_close(bravo);
}

/* One tenant's Lookup leases cannot take the store's holds (2^20 for every
 * tenant) from the others: past lease_blocks_per_tenant its Lookups that
 * match answer RESOURCE_EXHAUSTED, another tenant's go on, a Lookup that
 * matches nothing needs no lease, and ending a lease makes room again. */
static void test_lease_bound(void)
{
    kvs_client *a = NULL, *bravo = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_A, &a), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_B, &bravo), 0);
    kvs_ns ns = make_ns("allowed/lease-bound", 1, 1);
    unsigned tokens[16], other[16];
    tokens_make(tokens, 16, 4100);
    tokens_make(other, 16, 4200);
    block b = block_make(&ns, 41);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(put_block(a, &ns, NULL, 0, tokens, 1, &b, NULL, err), 0);
    CU_ASSERT_EQUAL(put_block(bravo, &ns, NULL, 0, tokens, 1, &b, NULL, err), 0);
    block_free(&b);
    const char *n[] = {"lease_blocks_per_tenant"}, *two[] = {"2"}, *dflt[] = {"262144"};
    CU_ASSERT_EQUAL_FATAL(kvs_client_set_config(a, n, two, 1, 0, -1, NULL, err), 0);
    unsigned long long lease[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        kvs_lookup_result *lr = NULL;
        int rc = kvs_client_lookup(a, &ns, tokens, 16, 60000, -1, &lr, err);
        if (i < 2) {
            CU_ASSERT_EQUAL(rc, 0);
            CU_ASSERT_EQUAL(rc == 0 ? lr->matched_blocks : 0, 1u);
            lease[i] = rc == 0 ? lr->lease_id : 0;
            CU_ASSERT(lease[i] != 0);
        } else {
            CU_ASSERT_EQUAL(rc, KVS_ENOSPC);
            CU_ASSERT_PTR_NOT_NULL(strstr(err, "lease_blocks_per_tenant"));
        }
        kvs_lookup_result_free(lr);
    }
    /* another tenant: its own bound */
    for (int i = 0; i < 2; i++) {
        kvs_lookup_result *lr = NULL;
        CU_ASSERT_EQUAL(kvs_client_lookup(bravo, &ns, tokens, 16, 60000, -1, &lr, err), 0);
        if (lr) {
            CU_ASSERT_EQUAL(lr->matched_blocks, 1u);
            kvs_client_unpin(bravo, &ns, NULL, 0, lr->lease_id, -1, NULL, err);
        }
        kvs_lookup_result_free(lr);
    }
    /* a miss holds nothing */
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL(kvs_client_lookup(a, &ns, other, 16, 60000, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr ? lr->matched_blocks : 1, 0u);
    kvs_lookup_result_free(lr);
    /* ending a lease makes room */
    CU_ASSERT_EQUAL(kvs_client_unpin(a, &ns, NULL, 0, lease[0], -1, NULL, err), 0);
    lr = NULL;
    CU_ASSERT_EQUAL(kvs_client_lookup(a, &ns, tokens, 16, 60000, -1, &lr, err), 0);
    lease[2] = lr ? lr->lease_id : 0;
    kvs_lookup_result_free(lr);
    CU_ASSERT_EQUAL(kvs_client_set_config(a, n, dflt, 1, 0, -1, NULL, err), 0);
    for (int i = 1; i < 3; i++)
        CU_ASSERT_EQUAL(kvs_client_unpin(a, &ns, NULL, 0, lease[i], -1, NULL, err), 0);
    kvs_client_close(a);
    kvs_client_close(bravo);
}

static void test_auth(void)
{
    kvs_client *none = NULL, *bad = NULL, *a = NULL, *bravo = NULL, *hash = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, NULL, &none), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, "not-a-real-token", &bad), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_A, &a), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_B, &bravo), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_B_SHA256, &hash), 0);
    kvs_ns ns = make_ns("allowed/m1", 1, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 1);
    kvs_lookup_result *lr = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_lookup(none, &ns, tokens, 16, 0, -1, &lr, err), KVS_EUNAUTH);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "UNAUTHENTICATED"));
    CU_ASSERT_EQUAL(kvs_client_lookup(bad, &ns, tokens, 16, 0, -1, &lr, err), KVS_EUNAUTH);
    CU_ASSERT_PTR_NULL(strstr(err, "not-a-real-token")); /* never echoed */
    /* token_sha256: the token whose hash it is gets in; the hash itself does not */
    CU_ASSERT_EQUAL(kvs_client_lookup(bravo, &ns, tokens, 16, 0, -1, &lr, err), 0);
    kvs_lookup_result_free(lr);
    CU_ASSERT_EQUAL(kvs_client_lookup(hash, &ns, tokens, 16, 0, -1, &lr, err), KVS_EUNAUTH);
    kvs_stats *s = NULL;
    CU_ASSERT_EQUAL(kvs_client_stats(none, NULL, -1, &s, err), KVS_EUNAUTH);
    char det[256] = "";
    CU_ASSERT_EQUAL(raw_stream(g_tsrv.addr, NULL, "/kvstash.v1.KvStash/Put", NULL, 0, -1, det,
                               sizeof det),
                    GRPC_STATUS_UNAUTHENTICATED);
    /* Health needs no token */
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(none, "", -1, &hs, err), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    /* a good token works; a model outside the tenant's list does not */
    CU_ASSERT_EQUAL(kvs_client_lookup(a, &ns, tokens, 16, 0, -1, &lr, err), 0);
    kvs_lookup_result_free(lr);
    kvs_ns other = make_ns("forbidden/m", 1, 1);
    CU_ASSERT_EQUAL(kvs_client_lookup(a, &other, tokens, 16, 0, -1, &lr, err), KVS_EPERM);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "ns.model"));
    block b = block_make(&other, 1);
    CU_ASSERT_EQUAL(put_block(a, &other, NULL, 0, tokens, 1, &b, NULL, err), KVS_EPERM);
    block_free(&b);
    /* the tenant's own default scheme and skip layers decide when the request does not */
    kvs_ns two = make_ns("allowed/two", 2, 1);
    b = block_make(&two, 2);
    kvs_put_result r;
    memset(&r, 0, sizeof r);
    unsigned sch[2] = {0, 0};
    r.layer_scheme = sch;
    CU_ASSERT_EQUAL(put_block(a, &two, NULL, 0, tokens, 0, &b, &r, err), 0);
    CU_ASSERT_EQUAL(sch[0], 3u); /* fp8_e5m2 */
    CU_ASSERT_EQUAL(sch[1], 1u); /* skip layer: fp16 */
    block_free(&b);
    kvs_client_close(none);
    kvs_client_close(bad);
    kvs_client_close(a);
    kvs_client_close(bravo);
    kvs_client_close(hash);
}

static void test_cross_tenant(void)
{
    kvs_client *a = NULL, *b = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_A, &a), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_B, &b), 0);
    kvs_ns ns = make_ns("exact/model", 1, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 555);
    block blk = block_make(&ns, 55);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result ra = {0}, rb = {0};
    CU_ASSERT_EQUAL_FATAL(put_block(a, &ns, NULL, 0, tokens, 4, &blk, &ra, err), 0);
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(b, &ns, tokens, 16, 0, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 0u); /* B cannot find A's prefix */
    kvs_lookup_result_free(lr);
    unsigned char k[1][32];
    memcpy(k[0], ra.key, 32);
    collect x = {&ns, 0, NULL, NULL, {0}, {0}, KVS_EGRESS_STORED, 0, 0};
    CU_ASSERT_EQUAL(kvs_client_get(b, &ns, (const unsigned char(*)[32])k, 1, KVS_EGRESS_STORED, 0,
                                   -1, collect_cb, &x, err),
                    KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(x.layers_seen, 0u);
    CU_ASSERT_EQUAL(kvs_client_delete(b, &ns, (const unsigned char(*)[32])k, 1, 1, -1, NULL, err),
                    KVS_ENOTFOUND);
    /* B cannot end A's lease, even knowing its id */
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(a, &ns, tokens, 16, 600000, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 1u);
    unsigned n = 0;
    CU_ASSERT_EQUAL(kvs_client_unpin(b, &ns, NULL, 0, lr->lease_id, -1, &n, err), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_client_delete(a, &ns, (const unsigned char(*)[32])k, 1, 0, -1, &n, err),
                    KVS_EPRECOND); /* still leased */
    CU_ASSERT_EQUAL(kvs_client_unpin(a, &ns, NULL, 0, lr->lease_id, -1, &n, err), 0);
    kvs_lookup_result_free(lr);
    /* B stores the same tokens under its own key; its fp16 fallback applies */
    unsigned sch[1] = {0};
    float ke[1] = {-1};
    memset(&rb, 0, sizeof rb);
    rb.layer_scheme = sch;
    rb.k_rel_error = ke;
    CU_ASSERT_EQUAL_FATAL(put_block(b, &ns, NULL, 0, tokens, 4, &blk, &rb, err), 0);
    CU_ASSERT_FALSE(rb.already_present);
    CU_ASSERT_NOT_EQUAL(memcmp(ra.key, rb.key, 32), 0);
    CU_ASSERT_EQUAL(sch[0], 1u);
    CU_ASSERT_EQUAL(ke[0], 0.0f);
    /* B may not change settings; A (admin) may */
    const char *cn[] = {"log_level"}, *cv[] = {"warn"};
    CU_ASSERT_EQUAL(kvs_client_set_config(b, cn, cv, 1, 0, -1, NULL, err), KVS_EPERM);
    CU_ASSERT_EQUAL(kvs_client_set_config(a, cn, cv, 1, 0, -1, NULL, err), 0);
    block_free(&blk);
    kvs_client_close(a);
    kvs_client_close(b);
}

/* ---- a namespace id shared by two tenants ---------------------------------- */

#define FNV_P    16777619u
#define FNV_PINV 0x359C449Bu /* FNV_P * FNV_PINV == 1 mod 2^32 */

static uint32_t fnv_step(uint32_t h, uint8_t b)
{
    return (h ^ b) * FNV_P;
}

/* The ns_id kvstashd gives tenant's namespace ns (salt replaced): FNV-1a
 * over kvs_ns_encode's descriptor (service/data_common.c). enc/len: the
 * descriptor, when wanted. */
static uint32_t ns_id_of(const char *tenant, const kvs_ns *ns, const char *salt, uint8_t *enc,
                         size_t *len)
{
    kvs_ns_desc d = {.tenant = tenant,
                     .tenant_len = strlen(tenant),
                     .model = ns->model,
                     .model_len = strlen(ns->model),
                     .num_layers = ns->num_layers,
                     .num_kv_heads = ns->num_kv_heads,
                     .head_dim = ns->head_dim,
                     .block_tokens = ns->block_tokens,
                     .dtype = (kvs_dtype)ns->dtype,
                     .salt = salt,
                     .salt_len = strlen(salt)};
    uint8_t buf[1024];
    size_t n = 0;
    CU_ASSERT_EQUAL_FATAL(kvs_ns_encode(&d, enc ? enc : buf, sizeof buf, &n, NULL, 0), 0);
    if (len)
        *len = n;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = fnv_step(h, (enc ? enc : buf)[i]);
    return h;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A 6-character printable salt (into salt[7]) that gives tenant's namespace
 * ns the ns_id want: meet in the middle over the last 6 bytes of the
 * descriptor (94^3 states each way, about 160 matches expected). 0 or -1. */
static int colliding_salt(const char *tenant, const kvs_ns *ns, uint32_t want, char salt[7])
{
    enum { NC = 94, N3 = NC * NC * NC };
    uint8_t enc[1024];
    size_t len;
    (void)ns_id_of(tenant, ns, "!!!!!!", enc, &len);
    uint32_t h0 = 2166136261u;
    for (size_t i = 0; i + 6 < len; i++)
        h0 = fnv_step(h0, enc[i]);
    uint64_t *fw = malloc(N3 * sizeof *fw);
    if (fw == NULL)
        return -1;
    for (uint32_t i = 0; i < N3; i++) {
        uint32_t h = fnv_step(h0, (uint8_t)(33 + i / (NC * NC)));
        h = fnv_step(h, (uint8_t)(33 + i / NC % NC));
        h = fnv_step(h, (uint8_t)(33 + i % NC));
        fw[i] = (uint64_t)h << 32 | i;
    }
    qsort(fw, N3, sizeof *fw, cmp_u64);
    int found = -1;
    for (uint32_t j = 0; j < N3 && found != 0; j++) {
        uint8_t t[3] = {(uint8_t)(33 + j / (NC * NC)), (uint8_t)(33 + j / NC % NC),
                        (uint8_t)(33 + j % NC)};
        uint32_t g = want;
        for (int k = 2; k >= 0; k--)
            g = (g * FNV_PINV) ^ t[k];
        size_t lo = 0, hi = N3;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if ((uint32_t)(fw[mid] >> 32) < g)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < N3 && (uint32_t)(fw[lo] >> 32) == g) {
            uint32_t i = (uint32_t)fw[lo];
            salt[0] = (char)(33 + i / (NC * NC));
            salt[1] = (char)(33 + i / NC % NC);
            salt[2] = (char)(33 + i % NC);
            memcpy(salt + 3, t, 3);
            salt[6] = '\0';
            found = 0;
        }
    }
    free(fw);
    return found;
}

/* ns_id is a 32-bit FNV-1a of the namespace descriptor (which names the
 * tenant), so another tenant can pick a salt whose namespace has the same
 * ns_id as one of ours. Only the tenant comparison in kvs__block_owned
 * then keeps it from our blocks: with our key and its colliding namespace,
 * bravo's Get and Delete are NOT_FOUND, and the block stays ours. */
static void test_cross_tenant_ns_collision(void)
{
    CU_ASSERT_EQUAL_FATAL(FNV_P * FNV_PINV, 1u);
    kvs_client *a = NULL, *b = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_A, &a), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_B, &b), 0);
    kvs_ns ns = make_ns("exact/model", 1, 1);
    ns.salt = "collide";
    char salt[7];
    uint32_t want = ns_id_of("alpha", &ns, ns.salt, NULL, NULL);
    CU_ASSERT_EQUAL_FATAL(colliding_salt("bravo", &ns, want, salt), 0);
    kvs_ns nb = ns;
    nb.salt = salt;
    CU_ASSERT_EQUAL_FATAL(ns_id_of("bravo", &nb, nb.salt, NULL, NULL), want);
    unsigned tokens[16];
    tokens_make(tokens, 16, 556);
    block blk = block_make(&ns, 56);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result ra = {0};
    CU_ASSERT_EQUAL_FATAL(put_block(a, &ns, NULL, 0, tokens, 4, &blk, &ra, err), 0);
    unsigned char k[1][32];
    memcpy(k[0], ra.key, 32);
    for (int fmt = 0; fmt <= 4; fmt += 3) {
        collect x = {.ns = &nb, .fmt = fmt};
        x.k = calloc(2 * elems(&nb), sizeof(float));
        x.v = calloc(2 * elems(&nb), sizeof(float));
        CU_ASSERT_EQUAL(kvs_client_get(b, &nb, (const unsigned char(*)[32])k, 1, (kvs_egress)fmt, 0,
                                       -1, collect_cb, &x, err),
                        KVS_ENOTFOUND);
        CU_ASSERT_EQUAL(x.layers_seen, 0u);
        free(x.k);
        free(x.v);
    }
    unsigned n = 0;
    CU_ASSERT_EQUAL(kvs_client_delete(b, &nb, (const unsigned char(*)[32])k, 1, 1, -1, &n, err),
                    KVS_ENOTFOUND);
    collect y = {&ns, 0, NULL, NULL, {0}, {0}, KVS_EGRESS_STORED, 0, 0};
    CU_ASSERT_EQUAL(kvs_client_get(a, &ns, (const unsigned char(*)[32])k, 1, KVS_EGRESS_STORED, 0,
                                   -1, collect_cb, &y, err),
                    0);
    CU_ASSERT_EQUAL(y.layers_seen, 1u);
    CU_ASSERT_EQUAL(kvs_client_delete(a, &ns, (const unsigned char(*)[32])k, 1, 0, -1, &n, err), 0);
    block_free(&blk);
    kvs_client_close(a);
    kvs_client_close(b);
}

static void test_quota_and_message_size(void)
{
    kvs_client *s = NULL, *a = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_S, &s), 0);
    CU_ASSERT_EQUAL_FATAL(open_client(g_tsrv.addr, TOKEN_A, &a), 0);
    kvs_ns ns = make_ns("any/model", 1, 1);
    unsigned tokens[16];
    tokens_make(tokens, 16, 99);
    block blk = block_make(&ns, 99);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(put_block(s, &ns, NULL, 0, tokens, 1, &blk, NULL, err), KVS_ENOSPC);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "quota"));
    block_free(&blk);
    /* a layer larger than max_message_bytes (256 KiB) is refused at the header */
    kvs_ns big = make_ns("allowed/big", 1, 3);
    big.block_tokens = 256;
    big.num_kv_heads = 2;
    big.head_dim = 128; /* 256 KiB of K per layer in fp32 */
    unsigned tok[256];
    tokens_make(tok, 256, 3);
    block bb = block_make(&big, 3);
    CU_ASSERT_EQUAL(put_block(a, &big, NULL, 0, tok, 1, &bb, NULL, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "max_message_bytes"));
    /* and gRPC itself refuses an oversized message (a 400 KB header) */
    raw_put p;
    raw_ns(&p, &big);
    unsigned *many = malloc(80000 * sizeof *many);
    memset(many, 0xff, 80000 * sizeof *many); /* 5-byte varints: 400 KB */
    raw_header(&p, NULL, 0, many, 80000, NULL);
    free(many);
    char det[256] = "";
    grpc_status_code st = raw_put_send(&p, g_tsrv.addr, TOKEN_A, -1, det, sizeof det);
    CU_ASSERT_EQUAL(st, GRPC_STATUS_RESOURCE_EXHAUSTED);
    if (st != GRPC_STATUS_RESOURCE_EXHAUSTED)
        fprintf(stderr, "oversized message: status %d (%s)\n", (int)st, det);
    /* the server is fine afterwards */
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(a, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    block_free(&bb);
    kvs_client_close(s);
    kvs_client_close(a);
}

/* ---- suite "ssd": memory too small, blocks demoted to files --------------- */

static kvs_server_proc g_ssrv;
static char g_sdir[] = "/tmp/kvs_test_ssd_XXXXXX";

static int suite_ssd_init(void)
{
    if (mkdtemp(g_sdir) == NULL)
        return 1;
    const char *args[] = {"--capacity", "1MiB", "--ssd-dir", g_sdir, "--log-level", "warn", NULL};
    return kvs_itest_start(g_kvstashd, args, &g_ssrv, "SSD tier");
}

static int suite_ssd_cleanup(void)
{
    int rc = kvs_itest_stop(&g_ssrv, 10000);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_sdir);
    if (system(cmd) != 0)
        return 1;
    return rc;
}

/* Twice the memory tier's worth of fp16 blocks: the early ones go to the SSD
 * tier, and every one still comes back bit for bit. */
static void test_ssd_demote_and_get(void)
{
    kvs_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_ssrv.addr, NULL, &c), 0);
    kvs_ns ns = make_ns("test/ssd", 2, 1);
    enum { NB = 120 };
    static unsigned char keys[NB][32];
    char err[KVS_ERR_LEN] = "";
    unsigned tokens[16];
    size_t lb = elems(&ns) * 2;
    int put_ok = 0;
    for (int i = 0; i < NB; i++) {
        tokens_make(tokens, 16, 50000u + (unsigned)i * 16);
        block b = block_make(&ns, 1000 + (uint64_t)i);
        kvs_put_result r = {0};
        int rc = put_block(c, &ns, NULL, 0, tokens, 1, &b, &r, err);
        if (rc == 0) {
            put_ok++;
            memcpy(keys[i], r.key, 32);
        } else {
            fprintf(stderr, "ssd put %d: %s\n", i, err);
        }
        block_free(&b);
    }
    CU_ASSERT_EQUAL_FATAL(put_ok, NB);
    CU_ASSERT_TRUE(kvs_itest_stat(c, "kvstash_store_demotions_total", NULL, NULL) > 0);
    CU_ASSERT_TRUE(kvs_itest_stat(c, "kvstash_store_tier_bytes", "tier", "ssd") > 0);
    /* the first block has surely left memory; Lookup says where it is */
    tokens_make(tokens, 16, 50000u);
    kvs_lookup_result *lr = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_lookup(c, &ns, tokens, 16, 0, -1, &lr, err), 0);
    CU_ASSERT_EQUAL(lr->matched_blocks, 1u);
    if (lr->n_blocks == 1)
        CU_ASSERT_EQUAL(lr->blocks[0].tier, 3u);
    CU_ASSERT_EQUAL(kvs_client_unpin(c, &ns, NULL, 0, lr->lease_id, -1, NULL, err), 0);
    kvs_lookup_result_free(lr);
    void *kd[2], *vd[2];
    for (int l = 0; l < 2; l++) {
        kd[l] = malloc(lb);
        vd[l] = malloc(lb);
    }
    int same = 0;
    for (int i = 0; i < NB; i++) {
        block b = block_make(&ns, 1000 + (uint64_t)i);
        int rc = kvs_client_get_into(c, &ns, (const unsigned char(*)[32])keys + i, 1,
                                     KVS_EGRESS_FP16, 0, -1, kd, vd, NULL, NULL, err);
        if (rc == 0 && !memcmp(kd[0], b.k[0], lb) && !memcmp(vd[1], b.v[1], lb))
            same++;
        else if (rc != 0)
            fprintf(stderr, "ssd get %d: %s\n", i, err);
        block_free(&b);
    }
    CU_ASSERT_EQUAL(same, NB);
    CU_ASSERT_TRUE(kvs_itest_stat(c, "kvstash_store_promotions_total", NULL, NULL) > 0);
    for (int l = 0; l < 2; l++) {
        free(kd[l]);
        free(vd[l]);
    }
    kvs_client_close(c);
}

/* ---- suite "small": a 2 MiB store, for what fills it ------------------- */

static kvs_server_proc g_msrv;

static int suite_small_init(void)
{
    const char *args[] = {"--capacity", "2MiB", "--log-level", "warn", NULL};
    return kvs_itest_start(g_kvstashd, args, &g_msrv, "small store");
}

static int suite_small_cleanup(void)
{
    return kvs_itest_stop(&g_msrv, 10000);
}

/* A SetConfig the store cannot carry out (capacity below what pinned blocks
 * hold) is refused and changes nothing: not the store's bound, not the
 * policy named beside it, and setting the old value again is no no-op that
 * leaves the store at the refused one. */
static void test_capacity_refused_changes_nothing(void)
{
    kvs_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_msrv.addr, NULL, &c), 0);
    kvs_ns ns = make_ns("test/capacity-refused", 8, 1);
    enum { NB = 20 };
    unsigned char keys[NB][32];
    char err[KVS_ERR_LEN] = "";
    unsigned tokens[16];
    int pinned = 0;
    for (int i = 0; i < NB; i++) {
        tokens_make(tokens, 16, 70000u + (unsigned)i * 16);
        block b = block_make(&ns, 2000 + (uint64_t)i);
        kvs_put_result r = {0};
        if (put_block(c, &ns, NULL, 0, tokens, 1, &b, &r, err) == 0) {
            memcpy(keys[i], r.key, 32);
            pinned += kvs_client_pin(c, &ns, (const unsigned char(*)[32])keys + i, 1, 0, 0, -1,
                                     NULL, err) == 0;
        }
        block_free(&b);
    }
    CU_ASSERT_EQUAL_FATAL(pinned, NB);
    double used = kvs_itest_stat(c, "kvstash_store_memory_used_bytes", NULL, NULL);
    CU_ASSERT_TRUE_FATAL(used > 1024.0 * 1024);
    const char *names[] = {"policy", "capacity"}, *values[] = {"lfu", "1MiB"};
    CU_ASSERT_NOT_EQUAL(kvs_client_set_config(c, names, values, 2, 0, -1, NULL, err), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "capacity"));
    char *cap = kvs_itest_setting(c, "capacity"), *pol = kvs_itest_setting(c, "policy");
    CU_ASSERT_STRING_EQUAL(cap ? cap : "", "2097152");
    CU_ASSERT_STRING_EQUAL(pol ? pol : "", "lru");
    free(cap);
    free(pol);
    /* the store kept its bound: what GetConfig and Stats say is what it enforces */
    CU_ASSERT_EQUAL(kvs_itest_stat(c, "kvstash_store_memory_capacity_bytes", NULL, NULL),
                    2.0 * 1024 * 1024);
    CU_ASSERT_EQUAL(kvs_itest_stat(c, "kvstash_store_capacity_bytes", NULL, NULL),
                    2.0 * 1024 * 1024);
    CU_ASSERT_EQUAL(
        kvs_client_unpin(c, &ns, (const unsigned char(*)[32])keys, NB, 0, -1, NULL, err), 0);
    kvs_client_close(c);
}

int main(int argc, char **argv)
{
    (void)rnd;
    static const kvs_test_case open_cases[] = {
        {"roundtrip_fp16_exact", test_roundtrip_fp16_exact},
        {"roundtrip_int8", test_roundtrip_int8},
        {"roundtrip_fp8_e4m3", test_roundtrip_fp8_e4m3},
        {"roundtrip_fp8_e5m2_bf16", test_roundtrip_fp8_e5m2_bf16},
        {"malformed_protobuf", test_malformed_protobuf},
        {"put_layout_mismatch", test_put_layout_mismatch},
        {"put_parent_errors", test_put_parent_errors},
        {"unknown_namespace_and_keys", test_unknown_namespace_and_keys},
        {"delete_pin_unpin", test_delete_pin_unpin},
        {"ttl_expiry", test_ttl_expiry},
        {"limits_and_deadline", test_limits_and_deadline},
        {"cancel_mid_put", test_cancel_mid_put},
        {"cancel_mid_get", test_cancel_mid_get},
        {"concurrent_16_clients_mixed", test_concurrent_mixed},
        {"put_async", test_put_async},
        {"hostile_streams", test_hostile_streams},
        {"stats_figures", test_stats_figures},
        {NULL, NULL},
    };
    static const kvs_test_case tenant_cases[] = {
        {"auth", test_auth},
        {"lease_bound", test_lease_bound},
        {"visibility", test_tenant_visibility},
        {"cross_tenant", test_cross_tenant},
        {"cross_tenant_ns_collision", test_cross_tenant_ns_collision},
        {"quota_and_message_size", test_quota_and_message_size},
        {NULL, NULL},
    };
    static const kvs_test_case ssd_cases[] = {
        {"ssd_demote_and_get", test_ssd_demote_and_get},
        {NULL, NULL},
    };
    static const kvs_test_case small_cases[] = {
        {"capacity_refused_changes_nothing", test_capacity_refused_changes_nothing},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"open", suite_open_init, suite_open_cleanup, open_cases},
        {"tenants", suite_tenants_init, suite_tenants_cleanup, tenant_cases},
        {"ssd", suite_ssd_init, suite_ssd_cleanup, ssd_cases},
        {"small", suite_small_init, suite_small_cleanup, small_cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
