/*
 * test_data_decode.c — client-side decode (kvstash.h, kvs_decode_at): a Get
 * in fp16, bf16 or fp32 that libkvstash answers by fetching the stored tiles
 * and dequantizing them itself must give exactly the bytes kvstashd renders.
 *
 * Suite "decode" runs a real kvstashd and stores blocks at fp16, int8,
 * fp8_e4m3 and fp8_e5m2, two root blocks (their first token kept at fp16: the
 * sinks) and a block with skip layers (fp16 layers inside an int8 block). Three
 * clients read them: decode = server (the reference), client, and auto (the
 * default). get_into and the callback Get of each must equal the reference
 * byte for byte, for every layer of every block, and the server's egress
 * counter must show what went over the wire: the stored bytes for a
 * client-side decode, the rendered ones for the reference (so the test fails
 * if either client silently asks for the other). FP8_PER_TENSOR stays the
 * server's.
 *
 * Suite "corrupt" cannot corrupt a block inside kvstashd (every tier checks
 * what it reads), so it records a real kvstashd's stored-format replies and
 * replays them from a fake Get server on loopback (gRPC C core), changed: a
 * flipped payload bit, K tiles sent as V tiles. The replay unchanged must
 * decode to kvstashd's own rendering (the fake is faithful); each change must
 * end the Get with KVS_EFORMAT. The fake also records the format each client
 * asked for.
 */
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"
#include "kvstash/v1/kvstash.pb-c.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVS_TEST_ASAN 1
#endif
#endif
#ifdef KVS_TEST_ASAN
/* Frames on ASan's fake stack, poisoned on return: a pointer into a returned
 * frame (test_reply_parsing's tiny reply, an inlined slice) is reported. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "detect_stack_use_after_return=1";
}
#endif

enum { L = 4, H = 4, D = 64, T = 16, NB = 7 };
#define LAYER_ELEMS ((size_t)T * H * D)

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static kvs_client *g_server_dec, *g_client_dec, *g_auto;
static unsigned char g_keys[NB][32];
static uint16_t *g_src[NB][2][L]; /* what was put, fp16 */

static kvs_ns make_ns(void)
{
    return kvs_itest_ns("test/decode", L, H, D, T, 1 /* fp16 */);
}

/* fp16 bits of values in about [-4, 4], a few large ones (outliers), no NaN/Inf. */
static uint16_t fp16_bits(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    unsigned e = 11u + (unsigned)((*s >> 30) % 6u);
    if (*s % 97 == 0)
        e = 20; /* 32..64 */
    return (uint16_t)(((*s >> 20) & 0x8000u) | (e << 10) | ((*s >> 40) & 0x3ffu));
}

/* Blocks: 0 root int8, 1 fp16, 2 fp8_e4m3, 3 fp8_e5m2, 4 int8 (a chain under
 * block 0); 5 root fp8_e4m3 (another prompt); 6 the namespace default (int8)
 * with skip_layers 1,3 at fp16, under block 5. */
static int put_all(kvs_client *c)
{
    static const unsigned scheme[NB] = {4, 1, 2, 3, 4, 2, 0};
    static const int parent[NB] = {-1, 0, 1, 2, 3, -1, 5};
    static const unsigned index[NB] = {0, 1, 2, 3, 4, 0, 1};
    kvs_ns ns = make_ns();
    char err[KVS_ERR_LEN] = "";
    uint64_t seed = 0x243f6a8885a308d3ull;
    for (int b = 0; b < NB; b++) {
        for (int kv = 0; kv < 2; kv++)
            for (int l = 0; l < L; l++) {
                g_src[b][kv][l] = malloc(LAYER_ELEMS * 2);
                for (size_t i = 0; i < LAYER_ELEMS; i++)
                    g_src[b][kv][l][i] = fp16_bits(&seed);
            }
        unsigned tokens[T];
        for (unsigned i = 0; i < T; i++)
            tokens[i] = 100u * (unsigned)b + i + (b >= 5 ? 7000u : 0u);
        const char *sn[] = {"skip_layers"}, *sv[] = {"1,3"}; /* they apply to any scheme */
        if (b == 6 && kvs_client_set_config(c, sn, sv, 1, 0, -1, NULL, err) != 0) {
            fprintf(stderr, "set skip_layers: %s\n", err);
            return 1;
        }
        kvs_put_args a;
        memset(&a, 0, sizeof a);
        a.ns = &ns;
        a.parent_key = parent[b] >= 0 ? g_keys[parent[b]] : NULL;
        a.index = index[b];
        a.tokens = tokens;
        a.scheme = scheme[b];
        a.k = (const void *const *)g_src[b][0];
        a.v = (const void *const *)g_src[b][1];
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        unsigned ls[L];
        res.layer_scheme = ls;
        int rc = kvs_client_put(c, &a, -1, &res, err);
        if (rc != 0) {
            fprintf(stderr, "put %d: %s\n", b, err);
            return 1;
        }
        unsigned want = scheme[b] ? scheme[b] : 4;
        for (unsigned l = 0; l < L; l++) {
            unsigned w = b == 6 && (l == 1 || l == 3) ? 1 : want;
            if (ls[l] != w) {
                fprintf(stderr, "put %d layer %u: scheme %u, expected %u\n", b, l, ls[l], w);
                return 1;
            }
        }
        memcpy(g_keys[b], res.key, 32);
    }
    return 0;
}

static int suite_init(void)
{
    static const char *const args[] = {"--threads", "4", "--log-level", "warn", NULL};
    if (kvs_itest_start(g_kvstashd, args, &g_srv, "decode") != 0)
        return 1;
    if (kvs_itest_open_client_decode(g_srv.addr, KVS_DECODE_SERVER, &g_server_dec) != 0 ||
        kvs_itest_open_client_decode(g_srv.addr, KVS_DECODE_CLIENT, &g_client_dec) != 0 ||
        kvs_itest_open_client_decode(g_srv.addr, KVS_DECODE_AUTO, &g_auto) != 0 || put_all(g_server_dec) != 0) {
        kvs_server_proc_kill(&g_srv);
        return 1;
    }
    return 0;
}

static int suite_cleanup(void)
{
    kvs_client_close(g_server_dec);
    kvs_client_close(g_client_dec);
    kvs_client_close(g_auto);
    for (int b = 0; b < NB; b++)
        for (int kv = 0; kv < 2; kv++)
            for (int l = 0; l < L; l++)
                free(g_src[b][kv][l]);
    return kvs_itest_stop(&g_srv, 10000);
}

static double egress_total(void)
{
    kvs_stats *s = NULL;
    if (kvs_client_stats(g_server_dec, "kvstash_egress_bytes_total", -1, &s, NULL) != 0)
        return -1;
    const kvs_metric *m = kvs_stats_find(s, "kvstash_egress_bytes_total", NULL, NULL);
    double v = m ? m->value : -1;
    kvs_stats_free(s);
    return v;
}

/* NB * L layers of K and V in one format, as get_into or a callback leaves them. */
typedef struct layers {
    size_t bytes;
    uint8_t *k, *v; /* [NB * L][bytes] */
    float ks[NB * L], vs[NB * L];
    size_t stored; /* callback, stored format: K + V bytes seen */
    int bad;
} layers;

static void layers_init(layers *x, size_t bytes)
{
    memset(x, 0, sizeof *x);
    x->bytes = bytes;
    x->k = malloc(NB * L * bytes);
    x->v = malloc(NB * L * bytes);
    memset(x->k, 0xA5, NB * L * bytes);
    memset(x->v, 0x5A, NB * L * bytes);
    for (int i = 0; i < NB * L; i++)
        x->ks[i] = x->vs[i] = -1;
}

static void layers_free(layers *x)
{
    free(x->k);
    free(x->v);
}

static int into(kvs_client *c, kvs_egress fmt, layers *x, char *err)
{
    void *kd[NB * L], *vd[NB * L];
    for (int i = 0; i < NB * L; i++) {
        kd[i] = x->k + (size_t)i * x->bytes;
        vd[i] = x->v + (size_t)i * x->bytes;
    }
    kvs_ns ns = make_ns();
    return kvs_client_get_into(c, &ns, (const unsigned char(*)[32])g_keys, NB, fmt, 0, -1, kd, vd,
                               x->ks, x->vs, err);
}

static int collect_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                      size_t vl, float ks, float vs, int last)
{
    layers *x = arg;
    size_t i = (size_t)b * L + l;
    if (b >= NB || l >= L || last != (l + 1 == L) ||
        (x->bytes && (kl != x->bytes || vl != x->bytes))) {
        x->bad = 1;
        return 1;
    }
    x->stored += kl + vl;
    if (x->bytes) {
        memcpy(x->k + i * x->bytes, k, kl);
        memcpy(x->v + i * x->bytes, v, vl);
    }
    x->ks[i] = ks;
    x->vs[i] = vs;
    return 0;
}

static int by_cb(kvs_client *c, kvs_egress fmt, layers *x, char *err)
{
    kvs_ns ns = make_ns();
    return kvs_client_get(c, &ns, (const unsigned char(*)[32])g_keys, NB, fmt, 0, -1, collect_cb, x,
                          err);
}

static int same(const layers *a, const layers *b)
{
    int ok =
        memcmp(a->k, b->k, NB * L * a->bytes) == 0 && memcmp(a->v, b->v, NB * L * a->bytes) == 0;
    for (int i = 0; i < NB * L; i++)
        ok = ok && a->ks[i] == b->ks[i] && a->vs[i] == b->vs[i];
    return ok;
}

/* Bytes a stored-format Get of all NB blocks sends (K + V of every layer). */
static size_t stored_bytes(void)
{
    layers st;
    memset(&st, 0, sizeof st);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(by_cb(g_server_dec, KVS_EGRESS_STORED, &st, err), 0);
    CU_ASSERT_FALSE(st.bad);
    return st.stored;
}

static void test_client_decode_equals_server(void)
{
    kvs_ns ns = make_ns();
    size_t stored = stored_bytes();
    CU_ASSERT(stored > 0);
    static const kvs_egress fmts[] = {KVS_EGRESS_FP16, KVS_EGRESS_BF16, KVS_EGRESS_FP32};
    for (size_t f = 0; f < 3; f++) {
        size_t lb = kvs_egress_layer_bytes(&ns, fmts[f]);
        char err[KVS_ERR_LEN] = "";
        layers ref, loc, aut, cb;
        layers_init(&ref, lb);
        layers_init(&loc, lb);
        layers_init(&aut, lb);
        layers_init(&cb, lb);
        double e0 = egress_total();
        int rc = into(g_server_dec, fmts[f], &ref, err);
        if (rc)
            fprintf(stderr, "server decode fmt %d: %s\n", (int)fmts[f], err);
        CU_ASSERT_EQUAL_FATAL(rc, 0);
        double e1 = egress_total();
        rc = into(g_client_dec, fmts[f], &loc, err);
        if (rc)
            fprintf(stderr, "client decode fmt %d: %s\n", (int)fmts[f], err);
        CU_ASSERT_EQUAL(rc, 0);
        double e2 = egress_total();
        CU_ASSERT_EQUAL(into(g_auto, fmts[f], &aut, err), 0);
        double e3 = egress_total();
        CU_ASSERT_EQUAL(by_cb(g_client_dec, fmts[f], &cb, err), 0);
        double e4 = egress_total();
        CU_ASSERT_FALSE(cb.bad);
        /* the wire: rendered bytes for the reference, stored ones otherwise */
        CU_ASSERT_EQUAL(e1 - e0, (double)(2 * NB * L * lb));
        CU_ASSERT_EQUAL(e2 - e1, (double)stored);
        CU_ASSERT_EQUAL(e3 - e2, (double)stored);
        CU_ASSERT_EQUAL(e4 - e3, (double)stored);
        /* the bytes: the server's, layer by layer, block by block */
        for (int i = 0; i < NB * L; i++) {
            int ok = memcmp(loc.k + i * lb, ref.k + i * lb, lb) == 0 &&
                     memcmp(loc.v + i * lb, ref.v + i * lb, lb) == 0;
            if (!ok)
                fprintf(stderr, "fmt %d block %d layer %d: client decode differs\n", (int)fmts[f],
                        i / L, i % L);
            CU_ASSERT(ok);
        }
        CU_ASSERT(same(&loc, &ref));
        CU_ASSERT(same(&aut, &ref));
        CU_ASSERT(same(&cb, &ref));
        CU_ASSERT_EQUAL(ref.ks[0], 0.0f); /* scales: 0 for these formats, both ways */
        CU_ASSERT_EQUAL(loc.ks[0], 0.0f);
        if (fmts[f] == KVS_EGRESS_FP16) {
            /* fp16-stored block 1 and the skip layers of block 6 are the put's bytes */
            for (int l = 0; l < L; l++) {
                CU_ASSERT_EQUAL(memcmp(loc.k + (size_t)(1 * L + l) * lb, g_src[1][0][l], lb), 0);
                CU_ASSERT_EQUAL(memcmp(loc.v + (size_t)(1 * L + l) * lb, g_src[1][1][l], lb), 0);
            }
            for (int l = 1; l < L; l += 2)
                CU_ASSERT_EQUAL(memcmp(loc.k + (size_t)(6 * L + l) * lb, g_src[6][0][l], lb), 0);
            /* the sink row of root block 0 (int8) too, and not a later row */
            CU_ASSERT_EQUAL(memcmp(loc.k, g_src[0][0][0], H * D * 2), 0);
            CU_ASSERT_NOT_EQUAL(memcmp(loc.k + H * D * 2, g_src[0][0][0] + H * D, H * D * 2), 0);
        }
        layers_free(&ref);
        layers_free(&loc);
        layers_free(&aut);
        layers_free(&cb);
    }
    /* per-tensor FP8 is always the server's */
    size_t lb8 = kvs_egress_layer_bytes(&ns, KVS_EGRESS_FP8_PER_TENSOR);
    layers ref, loc;
    layers_init(&ref, lb8);
    layers_init(&loc, lb8);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(into(g_server_dec, KVS_EGRESS_FP8_PER_TENSOR, &ref, err), 0);
    double e0 = egress_total();
    CU_ASSERT_EQUAL(into(g_client_dec, KVS_EGRESS_FP8_PER_TENSOR, &loc, err), 0);
    CU_ASSERT_EQUAL(egress_total() - e0, (double)(2 * NB * L * lb8));
    CU_ASSERT(same(&loc, &ref));
    CU_ASSERT(ref.ks[0] > 0);
    layers_free(&ref);
    layers_free(&loc);
}

static void test_bad_decode_option(void)
{
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = g_srv.addr;
    o.decode = (kvs_decode_at)3;
    kvs_client *c = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_open(&o, &c, err), KVS_EINVAL);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "decode"));
}

/* ---- suite "corrupt": a fake Get server replaying recorded replies ------------ */

typedef struct fake {
    grpc_server *srv;
    grpc_completion_queue *cq;
    pthread_t th;
    char addr[64];
    pthread_mutex_t mu;
    pthread_cond_t idle;     /* busy went to 0 */
    grpc_byte_buffer **msgs; /* replies for the next call (kept by the test) */
    size_t n;
    int req_format; /* the format the last request asked for, -1 none */
    int busy;       /* a call is being served: msgs may be read */
} fake;

static fake g_fake;
static grpc_byte_buffer *g_rec[NB * L];            /* recorded, as kvstashd sent them */
static Kvstash__V1__GetResponse g_rec_msg[NB * L]; /* the same, unpacked fields */
static uint8_t *g_rec_k[NB * L], *g_rec_v[NB * L];

/* Waits for tag on the fake's queue; 0 when it failed or the server shuts down. */
static int fake_wait(fake *f, void *tag)
{
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(f->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            return 0;
        if (ev.tag == tag)
            return ev.success;
        /* (void *)9 is the shutdown notice: keep waiting for tag, which fails */
    }
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    for (;;) {
        grpc_call *call = NULL;
        grpc_call_details det;
        grpc_metadata_array md;
        grpc_call_details_init(&det);
        grpc_metadata_array_init(&md);
        int ok = grpc_server_request_call(f->srv, &call, &det, &md, f->cq, f->cq, (void *)1) ==
                     GRPC_CALL_OK &&
                 fake_wait(f, (void *)1);
        grpc_call_details_destroy(&det);
        grpc_metadata_array_destroy(&md);
        if (!ok)
            break;
        pthread_mutex_lock(&f->mu);
        f->busy = 1;
        pthread_mutex_unlock(&f->mu);
        grpc_byte_buffer *req = NULL;
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_RECV_MESSAGE;
        ops[1].data.recv_message.recv_message = &req;
        ok = grpc_call_start_batch(call, ops, 2, (void *)2, NULL) == GRPC_CALL_OK &&
             fake_wait(f, (void *)2);
        int fmt = -1;
        if (ok && req) {
            grpc_byte_buffer_reader r;
            if (grpc_byte_buffer_reader_init(&r, req)) {
                grpc_slice s = grpc_byte_buffer_reader_readall(&r);
                Kvstash__V1__GetRequest *gr = kvstash__v1__get_request__unpack(
                    NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
                if (gr) {
                    fmt = (int)gr->format;
                    kvstash__v1__get_request__free_unpacked(gr, NULL);
                }
                grpc_slice_unref(s);
                grpc_byte_buffer_reader_destroy(&r);
            }
        }
        if (req)
            grpc_byte_buffer_destroy(req);
        pthread_mutex_lock(&f->mu);
        f->req_format = fmt;
        grpc_byte_buffer **msgs = f->msgs;
        size_t n = f->n;
        pthread_mutex_unlock(&f->mu);
        for (size_t i = 0; ok && i < n; i++) {
            grpc_byte_buffer *bb = grpc_byte_buffer_copy(msgs[i]);
            grpc_op op;
            memset(&op, 0, sizeof op);
            op.op = GRPC_OP_SEND_MESSAGE;
            op.data.send_message.send_message = bb;
            ok = grpc_call_start_batch(call, &op, 1, (void *)3, NULL) == GRPC_CALL_OK &&
                 fake_wait(f, (void *)3);
            grpc_byte_buffer_destroy(bb);
        }
        int cancelled = 0;
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[0].data.send_status_from_server.status = GRPC_STATUS_OK;
        ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[1].data.recv_close_on_server.cancelled = &cancelled;
        if (grpc_call_start_batch(call, ops, 2, (void *)4, NULL) == GRPC_CALL_OK)
            (void)fake_wait(f, (void *)4);
        grpc_call_unref(call);
        pthread_mutex_lock(&f->mu);
        f->busy = 0;
        pthread_cond_broadcast(&f->idle);
        pthread_mutex_unlock(&f->mu);
    }
    return NULL;
}

static int fake_start(fake *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->idle, NULL);
    f->req_format = -1;
    f->srv = grpc_server_create(NULL, NULL);
    f->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(f->srv, f->cq, NULL);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(f->srv, "127.0.0.1:0", cr);
    grpc_server_credentials_release(cr);
    if (port <= 0) {
        fprintf(stderr, "fake server: cannot listen on 127.0.0.1\n");
        return 1;
    }
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", port);
    grpc_server_start(f->srv);
    return pthread_create(&f->th, NULL, fake_main, f) != 0;
}

static void fake_stop(fake *f)
{
    grpc_server_shutdown_and_notify(f->srv, f->cq, (void *)9);
    grpc_server_cancel_all_calls(f->srv);
    pthread_join(f->th, NULL);
    grpc_completion_queue_shutdown(f->cq);
    while (grpc_completion_queue_next(f->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_server_destroy(f->srv);
    grpc_completion_queue_destroy(f->cq);
    pthread_cond_destroy(&f->idle);
    pthread_mutex_destroy(&f->mu);
}

/* Waits until the fake serves no call (a client that gave up early, e.g. on a
 * bad reply, returns while the fake is still sending the rest), then forgets
 * msgs: the test may free them. Found by a clean-clone CI run: the fake read
 * msgs from a returned test frame and aborted in grpc_byte_buffer_copy. */
static void fake_done(fake *f)
{
    pthread_mutex_lock(&f->mu);
    while (f->busy)
        pthread_cond_wait(&f->idle, &f->mu);
    f->msgs = NULL;
    f->n = 0;
    pthread_mutex_unlock(&f->mu);
}

static void fake_serve(fake *f, grpc_byte_buffer **msgs, size_t n)
{
    fake_done(f);
    pthread_mutex_lock(&f->mu);
    f->msgs = msgs;
    f->n = n;
    f->req_format = -1;
    pthread_mutex_unlock(&f->mu);
}

static int fake_format(fake *f)
{
    pthread_mutex_lock(&f->mu);
    int v = f->req_format;
    pthread_mutex_unlock(&f->mu);
    return v;
}

static int record_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                     size_t vl, float ks, float vs, int last)
{
    (void)arg, (void)ks, (void)vs;
    size_t i = (size_t)b * L + l;
    if (i >= NB * L)
        return 1;
    Kvstash__V1__GetResponse *m = &g_rec_msg[i];
    kvstash__v1__get_response__init(m);
    g_rec_k[i] = malloc(kl);
    g_rec_v[i] = malloc(vl);
    memcpy(g_rec_k[i], k, kl);
    memcpy(g_rec_v[i], v, vl);
    m->key.data = g_keys[b];
    m->key.len = 32;
    m->block_index = b;
    m->layer = l;
    m->format = KVSTASH__V1__EGRESS_FORMAT__EGRESS_STORED;
    m->k.data = g_rec_k[i];
    m->k.len = kl;
    m->v.data = g_rec_v[i];
    m->v.len = vl;
    m->last_layer = last != 0;
    return 0;
}

static grpc_byte_buffer *pack(const Kvstash__V1__GetResponse *m)
{
    size_t n = kvstash__v1__get_response__get_packed_size(m);
    uint8_t *p = malloc(n);
    kvstash__v1__get_response__pack(m, p);
    grpc_byte_buffer *bb = kvs_itest_bb_from(p, n);
    free(p);
    return bb;
}

static int suite_corrupt_init(void)
{
    if (suite_init() != 0)
        return 1;
    kvs_ns ns = make_ns();
    char err[KVS_ERR_LEN] = "";
    if (kvs_client_get(g_server_dec, &ns, (const unsigned char(*)[32])g_keys, NB, KVS_EGRESS_STORED,
                       0, -1, record_cb, NULL, err) != 0) {
        fprintf(stderr, "recording the stored replies: %s\n", err);
        return 1;
    }
    for (int i = 0; i < NB * L; i++)
        g_rec[i] = pack(&g_rec_msg[i]);
    return fake_start(&g_fake);
}

static int suite_corrupt_cleanup(void)
{
    fake_done(&g_fake);
    fake_stop(&g_fake);
    for (int i = 0; i < NB * L; i++) {
        grpc_byte_buffer_destroy(g_rec[i]);
        free(g_rec_k[i]);
        free(g_rec_v[i]);
    }
    return suite_cleanup();
}

/* A client of the fake server with the given decode. */
static kvs_client *fake_client(kvs_decode_at dec)
{
    kvs_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_decode(g_fake.addr, dec, &c), 0);
    return c;
}

static void test_replay_faithful(void)
{
    kvs_ns ns = make_ns();
    size_t lb = kvs_egress_layer_bytes(&ns, KVS_EGRESS_FP16);
    layers ref, got;
    layers_init(&ref, lb);
    layers_init(&got, lb);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(into(g_server_dec, KVS_EGRESS_FP16, &ref, err), 0);
    kvs_client *c = fake_client(KVS_DECODE_AUTO);
    fake_serve(&g_fake, g_rec, NB * L);
    int rc = into(c, KVS_EGRESS_FP16, &got, err);
    if (rc)
        fprintf(stderr, "replay: %s\n", err);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_EQUAL(fake_format(&g_fake), KVS_EGRESS_STORED);
    CU_ASSERT(same(&got, &ref));
    /* a client that leaves decoding to the server asks for fp16, and refuses
     * stored tiles in reply */
    kvs_client *s = fake_client(KVS_DECODE_SERVER);
    CU_ASSERT_EQUAL(into(s, KVS_EGRESS_FP16, &got, err), KVS_EPROTO);
    CU_ASSERT_EQUAL(fake_format(&g_fake), KVS_EGRESS_FP16);
    kvs_client_close(s);
    kvs_client_close(c);
    layers_free(&ref);
    layers_free(&got);
}

/* The recorded replies with message i changed by fn; get_into and the
 * callback Get must both end with KVS_EFORMAT, err naming want. */
static void expect_eformat(size_t i, void (*fn)(Kvstash__V1__GetResponse *m), const char *want)
{
    grpc_byte_buffer *msgs[NB * L];
    memcpy(msgs, g_rec, sizeof msgs);
    Kvstash__V1__GetResponse m = g_rec_msg[i];
    uint8_t *k = malloc(m.k.len), *v = malloc(m.v.len);
    memcpy(k, m.k.data, m.k.len);
    memcpy(v, m.v.data, m.v.len);
    m.k.data = k;
    m.v.data = v;
    fn(&m);
    msgs[i] = pack(&m);
    kvs_client *c = fake_client(KVS_DECODE_CLIENT);
    kvs_ns ns = make_ns();
    layers got, cb;
    layers_init(&got, kvs_egress_layer_bytes(&ns, KVS_EGRESS_FP16));
    layers_init(&cb, got.bytes);
    char err[KVS_ERR_LEN] = "";
    fake_serve(&g_fake, msgs, NB * L);
    CU_ASSERT_EQUAL(into(c, KVS_EGRESS_FP16, &got, err), KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    if (strstr(err, want) == NULL)
        fprintf(stderr, "\"%s\" lacks \"%s\"\n", err, want);
    CU_ASSERT_EQUAL(fake_format(&g_fake), KVS_EGRESS_STORED);
    fake_serve(&g_fake, msgs, NB * L);
    CU_ASSERT_EQUAL(by_cb(c, KVS_EGRESS_BF16, &cb, err), KVS_EFORMAT);
    /* the callback saw every layer before the bad one, none after */
    CU_ASSERT_EQUAL(cb.ks[i], -1.0f);
    if (i > 0)
        CU_ASSERT_EQUAL(cb.ks[i - 1], 0.0f);
    /* and the stored format itself refuses it too (the tiles are checked) */
    fake_serve(&g_fake, msgs, NB * L);
    layers st;
    memset(&st, 0, sizeof st);
    CU_ASSERT_EQUAL(by_cb(c, KVS_EGRESS_STORED, &st, err), KVS_EFORMAT);
    kvs_client_close(c);
    fake_done(&g_fake);
    grpc_byte_buffer_destroy(msgs[i]);
    free(k);
    free(v);
    layers_free(&got);
    layers_free(&cb);
}

static void flip_v_payload(Kvstash__V1__GetResponse *m)
{
    m->v.data[m->v.len - 1] ^= 0x04; /* last head's last payload byte */
}

static void k_as_v(Kvstash__V1__GetResponse *m)
{
    m->v = m->k; /* K tiles where V tiles belong: valid tiles of the wrong kind */
}

static void one_head_short(Kvstash__V1__GetResponse *m)
{
    m->k.len -= m->k.len / H; /* H - 1 whole tiles */
}

/* Message i of the recorded replies as bytes, then changed by the caller. */
static uint8_t *packed(size_t i, size_t *n)
{
    *n = kvstash__v1__get_response__get_packed_size(&g_rec_msg[i]);
    uint8_t *p = malloc(*n + 16);
    kvstash__v1__get_response__pack(&g_rec_msg[i], p);
    return p;
}

/* The recorded replies with message i replaced by raw bytes: the client that
 * decodes gets want (and so does one asking for the stored format). */
static void expect_raw(size_t i, const uint8_t *p, size_t n, int want)
{
    grpc_byte_buffer *msgs[NB * L];
    memcpy(msgs, g_rec, sizeof msgs);
    msgs[i] = kvs_itest_bb_from(p, n);
    kvs_client *c = fake_client(KVS_DECODE_CLIENT);
    kvs_ns ns = make_ns();
    layers got;
    layers_init(&got, kvs_egress_layer_bytes(&ns, KVS_EGRESS_FP16));
    char err[KVS_ERR_LEN] = "";
    fake_serve(&g_fake, msgs, NB * L);
    int rc = into(c, KVS_EGRESS_FP16, &got, err);
    if (rc != want)
        fprintf(stderr, "message %zu: %d (%s), want %d\n", i, rc, err, want);
    CU_ASSERT_EQUAL(rc, want);
    fake_serve(&g_fake, msgs, NB * L);
    layers st;
    memset(&st, 0, sizeof st);
    CU_ASSERT_EQUAL(by_cb(c, KVS_EGRESS_STORED, &st, err), want);
    kvs_client_close(c);
    fake_done(&g_fake);
    grpc_byte_buffer_destroy(msgs[i]);
    layers_free(&got);
}

/* The client parses stored-format replies itself (no protobuf-c copy): what
 * protobuf-c accepts it accepts, what breaks the wire format it refuses. */
static void test_reply_parsing(void)
{
    size_t n;
    uint8_t *p = packed(5, &n);
    expect_raw(5, p, n, 0);                               /* as packed */
    expect_raw(5, p, n - 1, KVS_EPROTO);                  /* V's last byte missing */
    p[n] = 15 << 3 | 0, p[n + 1] = 0x81, p[n + 2] = 0x01; /* unknown varint field 15 */
    p[n + 3] = 14 << 3 | 5;                               /* unknown fixed32 field 14 */
    memset(p + n + 4, 0, 4);
    expect_raw(5, p, n + 8, 0);
    p[n] = 3 << 3 | 2, p[n + 1] = 0; /* layer as a length-delimited field */
    expect_raw(5, p, n + 2, KVS_EPROTO);
    p[n] = 3 << 3 | 0, p[n + 1] = 2; /* layer 2 again, last one wins: out of order */
    expect_raw(5, p, n + 2, KVS_EPROTO);
    p[n] = 3 << 3 | 0, p[n + 1] = 1; /* layer 1 again: the same, fine */
    expect_raw(5, p, n + 2, 0);
    free(p);
    /* A reply of a few bytes arrives as an inlined grpc_slice, its bytes inside
     * the slice struct: the parser must read them where the caller holds it
     * (not from a copy in a returned frame). Block 0 layer 0, stored format,
     * no K or V: the tiles are missing. */
    static const uint8_t tiny[] = {2 << 3 | 0, 0, 3 << 3 | 0, 0, 9 << 3 | 0, 0, 5 << 3 | 2, 0};
    expect_raw(0, tiny, sizeof tiny, KVS_EFORMAT);
}

static void test_corrupt_tiles(void)
{
    expect_eformat(2 * L + 1, flip_v_payload, "checksum"); /* block 2 (fp8_e4m3) layer 1 */
    expect_eformat(0, flip_v_payload, "checksum");         /* root int8 block, layer 0 */
    expect_eformat(6 * L + 1, flip_v_payload, "checksum"); /* a skip layer (fp16 tiles) */
    expect_eformat(4 * L + 3, k_as_v, "kind");
    expect_eformat(3 * L + 2, one_head_short, "Get: block 3 layer 2");
}

int main(int argc, char **argv)
{
    static const kvs_test_case cases[] = {
        {"client decode equals the server's rendering", test_client_decode_equals_server},
        {"bad decode option", test_bad_decode_option},
        {NULL, NULL},
    };
    static const kvs_test_case corrupt[] = {
        {"the replay is faithful; each client asks its format", test_replay_faithful},
        {"a corrupt stored tile is KVS_EFORMAT", test_corrupt_tiles},
        {"stored replies parsed in place", test_reply_parsing},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"decode", suite_init, suite_cleanup, cases},
        {"corrupt", suite_corrupt_init, suite_corrupt_cleanup, corrupt},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
