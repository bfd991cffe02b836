/*
 * test_xfer.c — the UCX data plane (transfer/xfer.h) end to end over
 * loopback: a real kvs_xfer_server backed by a small in-memory block store,
 * real kvs_xfer_clients, real encoded blocks (kv_block.h); the store, the
 * waiter and the blocks are tests/support/kvs_xfer_fixture.h, shared with
 * test_xproc_chaos.
 *
 * Server and clients run in this process on separate UCX workers (UCX picks
 * tcp or shared memory from UCX_TLS, set per ctest entry). The killed-client
 * case re-executes this binary as a child ("--child") so the child starts
 * with fresh UCX state (fork alone would copy the parent's UCX threads'
 * state without the threads), then SIGKILLs it mid-fetch and checks that the
 * server released every block reference.
 *
 * cma (process_vm_readv) needs ptrace permission; when UCX_TLS names cma and
 * a probe fails, the test drops cma from UCX_TLS with a message.
 */
#include "../support/kvs_fdio.h"
#include "kv_block.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "kvs_xfer_fixture.h"
#include "xfer.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *g_self; /* argv[0], for the child process */

/* ---- the store's puts (the rest of the store: kvs_xfer_fixture.h) ------------- */

static kvs_fx_store g_store = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* What this program's puts saw, under g_store.mu (last_meta_tokens: put_begin's
 * alone). keep_failed: the first put that ends with an error keeps its buffer
 * (kept) with a copy of it as put_end saw it (kept_then). */
static struct {
    int last_meta_tokens;
    int keep_failed;
    uint8_t *kept, *kept_then;
    uint64_t kept_len;
} g_put;

/* Seals of the test store (kvs_xfer_block_src.seal) when g_seal.on (read by
 * server_new): the block of key[i] is lent with a seal of len[i] bytes of
 * seal_byte's pattern, or with seal_len len[i] and a NULL seal when
 * null_seal[i]. Each lend gets a seal of its own, poisoned and freed by its
 * release, so a seal read after its release shows. Under g_store.mu. */
#define SEALED_MAX 8
static struct {
    int on;
    unsigned n;
    uint8_t key[SEALED_MAX][KVS_XFER_KEY_LEN];
    uint32_t len[SEALED_MAX];
    int null_seal[SEALED_MAX];
} g_seal;

static void store_reset(void)
{
    kvs_fx_store_clear(&g_store);
    pthread_mutex_lock(&g_store.mu);
    free(g_put.kept);
    free(g_put.kept_then);
    g_put.kept = g_put.kept_then = NULL;
    g_put.kept_len = 0;
    g_put.keep_failed = 0;
    g_seal.n = 0;
    pthread_mutex_unlock(&g_store.mu);
}

static int st_put_begin(void *ctx, void *sd, const uint8_t *key, uint32_t fmt, const void *meta,
                        size_t meta_len, uint64_t len, void **buf, void **refp,
                        kvs_xfer_put_reply *reply)
{
    (void)sd;
    (void)reply;
    if (fmt != KVS_XFER_FMT_STORED)
        return KVS_EINVAL;
    /* The test's metadata: "tokens=<n>" must match the block's header. */
    if (meta_len) {
        char m[64];
        if (meta_len >= sizeof m)
            return KVS_EINVAL;
        memcpy(m, meta, meta_len);
        m[meta_len] = 0;
        pthread_mutex_lock(&g_store.mu);
        g_put.last_meta_tokens = strncmp(m, "tokens=", 7) == 0 ? atoi(m + 7) : -1;
        pthread_mutex_unlock(&g_store.mu);
    }
    if (len > (64u << 20))
        return KVS_ENOSPC;
    return kvs_fx_put_begin(ctx, key, len, buf, refp);
}

/* The key the test store files a put under: the client's with byte 0
 * flipped (a store derives its own keys, as kvstashd does). */
static void st_filed_key(const uint8_t *key, uint8_t *out)
{
    memcpy(out, key, KVS_XFER_KEY_LEN);
    out[0] ^= 0x5A;
}

static int st_put_end(void *ctx, void *p, int status, kvs_xfer_put_reply *reply)
{
    kvs_fx_put *s = p;
    if (status == 0 && kvs_block_check(s->buf, s->len, NULL, NULL) != 0)
        status = KVS_EFORMAT;
    if (status == 0) {
        kvs_fx_store_add(&g_store, s->key, s->buf, s->len);
        s->buf = NULL; /* the store's now */
        st_filed_key(s->key, reply->key);
        reply->stored_bytes = s->len;
    } else {
        pthread_mutex_lock(&g_store.mu);
        if (g_put.keep_failed && !g_put.kept && (g_put.kept_then = malloc(s->len))) {
            memcpy(g_put.kept_then, s->buf, s->len);
            g_put.kept = s->buf;
            g_put.kept_len = s->len;
            s->buf = NULL;
        }
        pthread_mutex_unlock(&g_store.mu);
    }
    return kvs_fx_put_end(ctx, s, status);
}

/* put_end_async of the test store (g_end.on): every put whose bytes all
 * landed is held (its ref and handle kept here) until the test ends it with
 * end_held on a thread of its own; g_end.decline: declined (put_end runs on
 * the server's thread). Under g_store.mu. */
#define HELD_MAX 4
static struct {
    int on, decline;
    unsigned n;
    void *ref[HELD_MAX], *handle[HELD_MAX];
} g_end;

static int st_put_end_async(void *ctx, void *ref, void *handle)
{
    (void)ctx;
    pthread_mutex_lock(&g_store.mu);
    int rc = 1;
    if (!g_end.decline && g_end.n < HELD_MAX) {
        g_end.ref[g_end.n] = ref;
        g_end.handle[g_end.n++] = handle;
        rc = 0;
    }
    pthread_mutex_unlock(&g_store.mu);
    return rc;
}

/* Ends the oldest held put as put_end would; its status (KVS_ENOTFOUND:
 * none held). Also from a thread of its own: no assert in here. */
static int end_held(kvs_xfer_server *srv)
{
    pthread_mutex_lock(&g_store.mu);
    if (g_end.n == 0) {
        pthread_mutex_unlock(&g_store.mu);
        return KVS_ENOTFOUND;
    }
    void *ref = g_end.ref[0], *handle = g_end.handle[0];
    g_end.n--;
    memmove(g_end.ref, g_end.ref + 1, g_end.n * sizeof g_end.ref[0]);
    memmove(g_end.handle, g_end.handle + 1, g_end.n * sizeof g_end.handle[0]);
    pthread_mutex_unlock(&g_store.mu);
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    int rc = st_put_end(&g_store, ref, 0, &reply);
    kvs_xfer_server_put_done(srv, handle, rc, &reply);
    return rc;
}

/* The count of held puts *held (g_end.n or g_begin.n) once it is n or more
 * (up to 30 s), else 0. */
static unsigned held_wait(const unsigned *held, unsigned n)
{
    for (int i = 0; i < 15000; i++) {
        pthread_mutex_lock(&g_store.mu);
        unsigned v = *held;
        pthread_mutex_unlock(&g_store.mu);
        if (v >= n)
            return v;
        usleep(2000);
    }
    return 0;
}

/* put_begin_async of the test store (g_begin.on): every put is held (its
 * key, length and handle kept here) until the test begins it with
 * begin_held, as put_begin would, or refuses it; g_begin.decline: declined
 * (put_begin runs on the server's thread). Under g_store.mu. */
static struct {
    int on, decline;
    unsigned n;
    void *handle[HELD_MAX];
    uint8_t key[HELD_MAX][KVS_XFER_KEY_LEN];
    uint64_t len[HELD_MAX];
} g_begin;

static int st_put_begin_async(void *ctx, void *sd, const uint8_t *key, uint32_t fmt,
                              const void *meta, size_t meta_len, uint64_t len, void *handle)
{
    (void)ctx, (void)sd, (void)meta, (void)meta_len;
    if (fmt != KVS_XFER_FMT_STORED)
        return KVS_EINVAL;
    pthread_mutex_lock(&g_store.mu);
    int rc = 1;
    if (!g_begin.decline && g_begin.n < HELD_MAX) {
        memcpy(g_begin.key[g_begin.n], key, KVS_XFER_KEY_LEN);
        g_begin.len[g_begin.n] = len;
        g_begin.handle[g_begin.n++] = handle;
        rc = 0;
    }
    pthread_mutex_unlock(&g_store.mu);
    return rc;
}

/* Answers the oldest held begin: refuse 0 begins it (a buffer from
 * kvs_fx_put_begin), else it is refused with that status and a reply
 * naming the filed key with stored_bytes 7. KVS_ENOTFOUND when none is
 * held, else what was given. Also from a thread of its own: no assert. */
static int begin_held(kvs_xfer_server *srv, int refuse)
{
    pthread_mutex_lock(&g_store.mu);
    if (g_begin.n == 0) {
        pthread_mutex_unlock(&g_store.mu);
        return KVS_ENOTFOUND;
    }
    void *handle = g_begin.handle[0];
    uint8_t key[KVS_XFER_KEY_LEN];
    memcpy(key, g_begin.key[0], sizeof key);
    uint64_t len = g_begin.len[0];
    g_begin.n--;
    memmove(g_begin.handle, g_begin.handle + 1, g_begin.n * sizeof g_begin.handle[0]);
    memmove(g_begin.key, g_begin.key + 1, g_begin.n * sizeof g_begin.key[0]);
    memmove(g_begin.len, g_begin.len + 1, g_begin.n * sizeof g_begin.len[0]);
    pthread_mutex_unlock(&g_store.mu);
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    void *buf = NULL, *ref = NULL;
    int rc = refuse;
    if (rc == 0) {
        rc = kvs_fx_put_begin(&g_store, key, len, &buf, &ref);
    } else {
        st_filed_key(key, reply.key);
        reply.stored_bytes = 7;
    }
    kvs_xfer_server_put_begun(srv, handle, rc, buf, ref, &reply);
    return rc;
}

/* ---- seals the store lends (g_seal) ------------------------------------------------------ */

/* What a sealed lend holds: the fixture's reference and the seal. */
typedef struct sealed_ref {
    void *inner;
    uint8_t *seal;
    uint32_t len;
} sealed_ref;

static uint8_t seal_byte(const uint8_t *key, uint32_t len, uint32_t i)
{
    return (uint8_t)(i * 31u + len + key[0] + key[1]);
}

/* 1 when seal holds the len bytes of key's seal. */
static int seal_is(const uint8_t *key, const uint8_t *seal, uint32_t len)
{
    for (uint32_t i = 0; i < len; i++)
        if (seal[i] != seal_byte(key, len, i))
            return 0;
    return 1;
}

static void seal_add(const uint8_t *key, uint32_t len, int null_seal)
{
    pthread_mutex_lock(&g_store.mu);
    CU_ASSERT_FATAL(g_seal.n < SEALED_MAX);
    memcpy(g_seal.key[g_seal.n], key, KVS_XFER_KEY_LEN);
    g_seal.len[g_seal.n] = len;
    g_seal.null_seal[g_seal.n++] = null_seal;
    pthread_mutex_unlock(&g_store.mu);
}

static int st_provide_sealed(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                             const uint8_t nonce[KVS_XFER_NONCE_LEN], kvs_xfer_block_src *src)
{
    int rc = kvs_fx_provide(ctx, sd, key, fmt, nonce, src);
    if (rc != 0)
        return rc;
    sealed_ref *r = calloc(1, sizeof *r);
    if (!r) {
        kvs_fx_release(ctx, src->ref);
        return KVS_ENOMEM;
    }
    r->inner = src->ref;
    src->ref = r;
    pthread_mutex_lock(&g_store.mu);
    for (unsigned i = 0; i < g_seal.n; i++) {
        if (memcmp(g_seal.key[i], key, KVS_XFER_KEY_LEN) != 0)
            continue;
        src->seal_len = g_seal.len[i];
        if (!g_seal.null_seal[i] && (r->seal = malloc(g_seal.len[i]))) {
            r->len = g_seal.len[i];
            for (uint32_t j = 0; j < r->len; j++)
                r->seal[j] = seal_byte(key, r->len, j);
            src->seal = r->seal;
        }
    }
    pthread_mutex_unlock(&g_store.mu);
    return 0;
}

static void st_release_sealed(void *ctx, void *ref)
{
    sealed_ref *r = ref;
    if (r->seal)
        memset(r->seal, 0xEE, r->len);
    free(r->seal);
    kvs_fx_release(ctx, r->inner);
    free(r);
}

/* on_layer of a sealed fetch: what dst held when each block's layer 0 was
 * reported (checked by the test once the fetch is done), then the waiter's. */
static struct {
    int seen[KVS_FX_BLOCKS];
    uint32_t seal_len[KVS_FX_BLOCKS];
    int seal_ok[KVS_FX_BLOCKS]; /* dst->seal held the key's seal of seal_len bytes */
} g_l0;

static void seal_on_layer(kvs_xfer_fetch_req *r, uint32_t block, uint32_t layer)
{
    if (layer == 0 && block < KVS_FX_BLOCKS) {
        const kvs_xfer_dst *d = &r->dst[block];
        g_l0.seen[block] = 1;
        g_l0.seal_len[block] = d->seal_len;
        g_l0.seal_ok[block] = d->seal_len && d->seal &&
                              seal_is(r->keys + block * KVS_XFER_KEY_LEN, d->seal, d->seal_len);
    }
    kvs_fx_on_layer(r, block, layer);
}

/* ---- server / client fixture ------------------------------------------------------------- */

/* provide of test_fetch_many_small_sends: a rendered format is the stored
 * bytes in KVS_XFER_MAX_LAYERS layers of equal size. */
typedef struct many_ref {
    void *inner;
    uint64_t bounds[KVS_XFER_MAX_LAYERS + 1];
} many_ref;

static int st_provide_many(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                           const uint8_t nonce[KVS_XFER_NONCE_LEN], kvs_xfer_block_src *src)
{
    int rc = kvs_fx_provide(ctx, sd, key, KVS_XFER_FMT_STORED, nonce, src);
    if (rc != 0)
        return rc;
    many_ref *r = calloc(1, sizeof *r);
    if (!r) {
        kvs_fx_release(ctx, src->ref);
        return KVS_ENOMEM;
    }
    r->inner = src->ref;
    src->ref = r;
    if (fmt != KVS_XFER_FMT_STORED) {
        for (unsigned i = 0; i <= KVS_XFER_MAX_LAYERS; i++)
            r->bounds[i] = src->len * i / KVS_XFER_MAX_LAYERS;
        src->layers = KVS_XFER_MAX_LAYERS;
        src->bounds = r->bounds;
    }
    return 0;
}

static void st_release_many(void *ctx, void *ref)
{
    many_ref *r = ref;
    kvs_fx_release(ctx, r->inner);
    free(r);
}

static uint64_t g_min_msg; /* server opts.min_msg_bytes (0: its default) */
static int g_many_layers;  /* server_new: st_provide_many (test_fetch_many_small_sends) */

/* provide_async of the test store: formats other than the stored one are
 * provided g_async_ms later by a thread of their own (as a store that renders
 * on a worker pool would); the stored format is declined (provided inline). */
static atomic_int g_async_ms; /* set by the test, read on the server's thread */

static int st_provide_async(void *ctx, void *sd, const uint8_t *key, uint32_t fmt,
                            const uint8_t *nonce, void *handle)
{
    (void)sd;
    if (fmt == KVS_XFER_FMT_STORED)
        return 1;
    return kvs_fx_provide_later(ctx, g_seal.on ? st_provide_sealed : kvs_fx_provide, key, fmt,
                                nonce, handle, (unsigned)g_async_ms * 1000u);
}

static kvs_xfer_server *server_new(uint32_t op_timeout_ms)
{
    kvs_xfer_server_opts o = {0};
    o.ops = kvs_fx_store_ops(&g_store);
    o.ops.provide_async = g_async_ms > 0 ? st_provide_async : NULL;
    if (g_seal.on) {
        o.ops.provide = st_provide_sealed;
        o.ops.release = st_release_sealed;
    }
    if (g_many_layers) {
        o.ops.provide = st_provide_many;
        o.ops.release = st_release_many;
    }
    o.ops.put_begin = st_put_begin;
    o.ops.put_end = st_put_end;
    o.ops.put_end_async = g_end.on ? st_put_end_async : NULL;
    o.ops.put_begin_async = g_begin.on ? st_put_begin_async : NULL;
    o.op_timeout_ms = op_timeout_ms;
    o.min_msg_bytes = g_min_msg;
#ifdef KVS_TEST_XFERD
    /* KVS_TEST_ISOLATE=1 (ctest's test_xfer_isolated): every case again with
     * the server's UCX in kvstash-xferd (transfer/xproc.c). */
    if (getenv("KVS_TEST_ISOLATE") && strcmp(getenv("KVS_TEST_ISOLATE"), "1") == 0)
        o.isolate = KVS_TEST_XFERD;
#endif
    kvs_xfer_server *s = NULL;
    int rc = kvs_xfer_server_create(&o, &s);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    g_store.srv = s;
    return s;
}

/* A client with a session on srv (the server's session info in *out when out
 * is not NULL); bad_token, when not 0, flips one bit of token byte
 * bad_token - 1 of the info the client connects with. */
static kvs_xfer_client *client_session(kvs_xfer_server *srv, int bad_token, uint32_t timeout_ms,
                                       kvs_xfer_session_info *out)
{
    kvs_xfer_client_opts o = {.timeout_ms = timeout_ms};
    kvs_xfer_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_create(&o, &c), 0);
    const void *ca, *sa;
    size_t cl, sl;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_address(c, &ca, &cl), 0);
    kvs_xfer_session_info info;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_session_open(srv, ca, cl, NULL, &info), 0);
    if (out)
        *out = info;
    if (bad_token)
        info.token[(bad_token - 1) % KVS_XFER_TOKEN_LEN] ^= 1;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_address(srv, &sa, &sl), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_connect(c, sa, sl, &info), 0);
    return c;
}

/* The store's counter *n (read under its lock) once it is above 0, or 0
 * when it stayed 0 for ms. */
static long store_wait(const long *n, unsigned ms)
{
    for (unsigned waited = 0;; waited += 2) {
        pthread_mutex_lock(&g_store.mu);
        long v = *n;
        pthread_mutex_unlock(&g_store.mu);
        if (v > 0 || waited >= ms)
            return v;
        usleep(2000);
    }
}

static kvs_xfer_client *client_new(kvs_xfer_server *srv, int bad_token, uint32_t timeout_ms)
{
    return client_session(srv, bad_token, timeout_ms, NULL);
}

/* Fetches n keys into dst with on_layer as the layer callback and the
 * request nonce nonce (NULL: zero); fills w. */
static int fetch_with(kvs_xfer_client *c, uint32_t fmt, const uint8_t *keys, uint32_t n,
                      kvs_xfer_dst *dst, kvs_fx_waiter *w,
                      void (*on_layer)(kvs_xfer_fetch_req *, uint32_t, uint32_t),
                      const uint8_t *nonce)
{
    kvs_xfer_fetch_req req = {.format = fmt,
                              .nblocks = n,
                              .keys = keys,
                              .dst = dst,
                              .on_layer = on_layer,
                              .on_block = kvs_fx_on_block,
                              .on_done = kvs_fx_on_done,
                              .data = w};
    if (nonce)
        memcpy(req.nonce, nonce, KVS_XFER_NONCE_LEN);
    int rc = kvs_xfer_fetch(c, &req);
    if (rc != 0)
        return rc;
    CU_ASSERT_EQUAL_FATAL(kvs_fx_waiter_wait(w, 30000), 0);
    return 0;
}

/* Fetches n keys into fresh buffers of cap bytes each; fills w. */
static int fetch_sync(kvs_xfer_client *c, uint32_t fmt, const uint8_t *keys, uint32_t n,
                      kvs_xfer_dst *dst, kvs_fx_waiter *w)
{
    return fetch_with(c, fmt, keys, n, dst, w, kvs_fx_on_layer, NULL);
}

/* srv still serves a fresh client after what a test did to it: the stored
 * block key (blk, len bytes) comes back whole. */
static void check_still_serves(kvs_xfer_server *srv, const uint8_t *key, const uint8_t *blk,
                               uint64_t len)
{
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst = {.cap = len, .buf = malloc(len)};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, key, 1, &dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT_EQUAL(memcmp(dst.buf, blk, len), 0);
    kvs_xfer_client_destroy(c);
    free(dst.buf);
}

static long store_outstanding(void)
{
    pthread_mutex_lock(&g_store.mu);
    long n = g_store.provides - g_store.releases;
    pthread_mutex_unlock(&g_store.mu);
    return n;
}

/* A rendezvous send completes on the server when the client's acknowledgement
 * arrives, which may be just after the client's on_done: poll the server's
 * counters (up to 10 s) until every provided block is released. */
static void server_settled(kvs_xfer_server *srv, kvs_xfer_server_stats *st)
{
    for (int i = 0; i < 1000; i++) {
        CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, st), 0);
        if (st->refs_held == 0 && store_outstanding() == 0)
            return;
        usleep(10000);
    }
}

/* Stores a copy of blk (len bytes) under key; the caller keeps blk to
 * compare with. */
static void store_add_copy(const uint8_t *key, const uint8_t *blk, uint64_t len)
{
    uint8_t *copy = malloc(len);
    memcpy(copy, blk, len);
    kvs_fx_store_add(&g_store, key, copy, len);
}

/* Resets the store to hold one new block (kvs_fx_block_new(L, H, T,
 * fp16_only, seed), *len bytes) under key = kvs_fx_key(key_n).
 * store_reset_to_block gives the store the block (the caller may read it
 * until store_reset); store_reset_to_copy gives it a copy and returns the
 * caller's, to free. */
static uint8_t *store_reset_to_block(uint8_t *key, unsigned key_n, uint32_t L, uint32_t H,
                                     uint32_t T, int fp16_only, unsigned seed, uint64_t *len)
{
    store_reset();
    kvs_fx_key(key, key_n);
    uint8_t *blk = kvs_fx_block_new(L, H, T, fp16_only, seed, len);
    kvs_fx_store_add(&g_store, key, blk, *len);
    return blk;
}

static uint8_t *store_reset_to_copy(uint8_t *key, unsigned key_n, uint32_t L, uint32_t H,
                                    uint32_t T, int fp16_only, unsigned seed, uint64_t *len)
{
    store_reset();
    kvs_fx_key(key, key_n);
    uint8_t *blk = kvs_fx_block_new(L, H, T, fp16_only, seed, len);
    store_add_copy(key, blk, *len);
    return blk;
}

/* The end of a fetch case: c and srv destroyed, the n buffers of dst and
 * blk freed. */
static void fetch_case_end(kvs_xfer_client *c, kvs_xfer_server *srv, kvs_xfer_dst *dst, unsigned n,
                           uint8_t *blk)
{
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    for (unsigned i = 0; i < n; i++)
        free(dst[i].buf);
    free(blk);
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_fetch_layers_in_order(void)
{
    store_reset();
    uint8_t keys[3 * KVS_XFER_KEY_LEN];
    uint64_t len[3];
    uint8_t *blk[3];
    uint32_t layers[3] = {6, 1, 12};
    for (unsigned i = 0; i < 3; i++) {
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, i);
        blk[i] = kvs_fx_block_new(layers[i], 2 + i, 32, 0, i + 1, &len[i]);
        store_add_copy(keys + i * KVS_XFER_KEY_LEN, blk[i], len[i]);
    }
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst[3];
    memset(dst, 0, sizeof dst);
    for (unsigned i = 0; i < 3; i++) {
        dst[i].cap = len[i] + 100;
        dst[i].buf = malloc(dst[i].cap);
    }
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, keys, 3, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT(w.order_ok);
    CU_ASSERT_EQUAL(w.blocks_reported, 3);
    for (unsigned i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(dst[i].status, 0);
        CU_ASSERT_EQUAL(dst[i].len, len[i]);
        CU_ASSERT_EQUAL(dst[i].layers, layers[i]);
        CU_ASSERT_EQUAL(w.next_layer[i], layers[i]);
        CU_ASSERT_EQUAL(memcmp(dst[i].buf, blk[i], len[i]), 0);
        CU_ASSERT_EQUAL(kvs_block_check(dst[i].buf, len[i], NULL, NULL), 0);
    }
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.blocks_sent, 3);
    /* Again with every layer in its own message (min_msg_bytes = 1). */
    g_min_msg = 1;
    kvs_xfer_server *srv1 = server_new(0);
    g_min_msg = 0;
    kvs_xfer_client *c1 = client_new(srv1, 0, 0);
    kvs_fx_waiter w1;
    kvs_fx_waiter_init(&w1);
    for (unsigned i = 0; i < 3; i++)
        memset(dst[i].buf, 0, dst[i].cap);
    CU_ASSERT_EQUAL(fetch_sync(c1, KVS_XFER_FMT_STORED, keys, 3, dst, &w1), 0);
    CU_ASSERT_EQUAL(w1.status, 0);
    CU_ASSERT(w1.order_ok);
    for (unsigned i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(w1.next_layer[i], layers[i]);
        CU_ASSERT_EQUAL(memcmp(dst[i].buf, blk[i], len[i]), 0);
    }
    kvs_xfer_client_destroy(c1);
    kvs_xfer_server_destroy(srv1);
    CU_ASSERT_EQUAL(st.bytes_sent, len[0] + len[1] + len[2]);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    for (unsigned i = 0; i < 3; i++) {
        free(dst[i].buf);
        free(blk[i]);
    }
}

/* A non-stored format: the server's bounds, an XXH3 per layer. */
static void test_fetch_raw_format(void)
{
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    uint8_t *blk = store_reset_to_copy(key, 7, 3, 2, 64, 1, 9, &len);
    g_min_msg = 1; /* one message per layer; the other tests group layers */
    kvs_xfer_server *srv = server_new(0);
    g_min_msg = 0;
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst = {.cap = len, .buf = malloc(len)};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, 1, key, 1, &dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT_EQUAL(dst.layers, 4);
    CU_ASSERT_EQUAL(w.next_layer[0], 4);
    CU_ASSERT(w.order_ok);
    CU_ASSERT_EQUAL(memcmp(dst.buf, blk, len), 0);
    fetch_case_end(c, srv, &dst, 1, blk);
}

/* A format whose layers lie at fixed places (kvs_xfer_fetch_req.layer_bytes:
 * libkvstash's rendered formats, a 16-byte head, then each layer): the
 * server's ranges must be exactly those places. The store lends its "raw"
 * format as 4 layers at len * i / 4: the places of a request without a head,
 * which gets the block whole, but not those of one with a 16-byte head, whose
 * layer 1 starts 12 bytes after where the server's does. That block fails
 * (KVS_EPROTO) with no layer reported: it used to report every layer, the
 * bytes at a layer's place never all written by the message that carried it
 * (a caller got the buffer's old bytes there, or bytes still landing). Asked
 * for with layers of twice that size, the block is not laid out as the
 * caller's blocks are (one of another namespace): KVS_ENOTFOUND, which is
 * not a fault of the path either (it was KVS_EPROTO, and libkvstash left UCX
 * over a caller's wrong namespace: test_connect wrong_ns_rendered). */
static void test_fetch_fixed_places(void)
{
    store_reset();
    uint8_t key[KVS_XFER_KEY_LEN];
    kvs_fx_key(key, 11);
    const uint64_t lb = 1000, len = 16 + 4 * lb;
    uint8_t *blk = malloc(len);
    CU_ASSERT_FATAL(blk != NULL);
    for (uint64_t i = 0; i < len; i++)
        blk[i] = (uint8_t)(i * 7 + 3);
    store_add_copy(key, blk, len);
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    for (int head = 0; head < 3; head++) {
        kvs_xfer_dst dst = {.cap = len, .buf = calloc(1, len)};
        kvs_fx_waiter w;
        kvs_fx_waiter_init(&w);
        kvs_xfer_fetch_req req = {.format = 1,
                                  .nblocks = 1,
                                  .keys = key,
                                  .dst = &dst,
                                  .on_layer = kvs_fx_on_layer,
                                  .on_block = kvs_fx_on_block,
                                  .on_done = kvs_fx_on_done,
                                  .data = &w,
                                  .head_bytes = head ? 16 : 0,
                                  .layer_bytes = head ? head * lb : len / 4};
        CU_ASSERT_EQUAL_FATAL(kvs_xfer_fetch(c, &req), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_fx_waiter_wait(&w, 30000), 0);
        int want = head == 0 ? 0 : head == 1 ? KVS_EPROTO : KVS_ENOTFOUND;
        CU_ASSERT_EQUAL(w.status, want);
        CU_ASSERT_EQUAL(dst.status, want);
        CU_ASSERT_EQUAL(w.next_layer[0], head ? 0u : 4u);
        if (!head)
            CU_ASSERT_EQUAL(memcmp(dst.buf, blk, len), 0);
        free(dst.buf);
    }
    CU_ASSERT_EQUAL(kvs_xfer_client_status(c), 0); /* the block's failure, not the path's */
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    free(blk);
}

/* A block of KVS_XFER_MAX_LAYERS small layers, each its own message
 * (min_msg_bytes = 1): sends UCX completes at once, without a request. Each
 * such completion once issued the next send from inside itself
 * (session_pump -> send_am -> send_finish -> session_pump), one more set of
 * frames per message, so a run of them could overflow the progress thread's
 * stack (a peer could line up 65536: KVS__MAX_SENDS). The server's thread
 * gets a 256 KiB stack here, which 4096 nested sends overflowed (not under
 * ThreadSanitizer). */
static void test_fetch_many_small_sends(void)
{
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    uint8_t *blk = store_reset_to_copy(key, 8, 4, 2, 64, 1, 10, &len);
    CU_ASSERT_FATAL(len >= 8 * KVS_XFER_MAX_LAYERS);
    pthread_attr_t def, small;
    CU_ASSERT_EQUAL_FATAL(pthread_getattr_default_np(&def), 0);
    CU_ASSERT_EQUAL_FATAL(pthread_getattr_default_np(&small), 0);
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer's threads do not start on 256 KiB (UCX's async thread
     * failed to): the fetch runs there, the stack is not tested. */
    const size_t stack = 8u << 20;
#else
    const size_t stack = 256u << 10;
#endif
    CU_ASSERT_EQUAL_FATAL(pthread_attr_setstacksize(&small, stack), 0);
    CU_ASSERT_EQUAL_FATAL(pthread_setattr_default_np(&small), 0);
    g_min_msg = 1;
    g_many_layers = 1;
    kvs_xfer_server *srv = server_new(0);
    g_many_layers = 0;
    g_min_msg = 0;
    CU_ASSERT_EQUAL(pthread_setattr_default_np(&def), 0);
    pthread_attr_destroy(&small);
    pthread_attr_destroy(&def);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst = {.cap = len, .buf = malloc(len)};
    for (int round = 0; round < 3; round++) {
        kvs_fx_waiter w;
        kvs_fx_waiter_init(&w);
        memset(dst.buf, 0, len);
        CU_ASSERT_EQUAL(fetch_sync(c, 1, key, 1, &dst, &w), 0);
        CU_ASSERT_EQUAL(w.status, 0);
        CU_ASSERT_EQUAL(dst.layers, KVS_XFER_MAX_LAYERS);
        CU_ASSERT(w.order_ok);
        CU_ASSERT_EQUAL(memcmp(dst.buf, blk, len), 0);
    }
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.blocks_sent, 3);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    fetch_case_end(c, srv, &dst, 1, blk);
}

/* A fetch of n blocks with seal_on_layer (g_l0 cleared first) and the
 * request nonce nonce; fills w. */
static int fetch_sealed(kvs_xfer_client *c, uint32_t fmt, const uint8_t *keys, uint32_t n,
                        kvs_xfer_dst *dst, kvs_fx_waiter *w, const uint8_t *nonce)
{
    memset(&g_l0, 0, sizeof g_l0);
    return fetch_with(c, fmt, keys, n, dst, w, seal_on_layer, nonce);
}

/* 1 when the store's last provide of key was handed nonce. */
static int provided_with(const uint8_t *key, const uint8_t *nonce)
{
    pthread_mutex_lock(&g_store.mu);
    const kvs_fx_entry *e = kvs_fx_do_find(&g_store, key);
    int ok = e && memcmp(e->nonce, nonce, KVS_XFER_NONCE_LEN) == 0;
    pthread_mutex_unlock(&g_store.mu);
    return ok;
}

/* Sealed blocks (kvs_xfer_block_src.seal): a seal of 1000 bytes and one of
 * KVS_XFER_MAX_SEAL arrive in dst->seal, there when layer 0 is reported; a
 * block lent without one gets seal_len 0 (a stale value is cleared); a
 * seal_cap too small fails that block alone (KVS_ENOSPC); a client that
 * gives no room (seal NULL) gets the block and no seal. Each provide is
 * handed the request's nonce as the client sent it (kvstashd binds its
 * seals to it). In the stored format and in a rendered one (bounds from the
 * store), provided inline and later (provide_async:
 * kvs_xfer_server_provide_done). */
static void test_fetch_sealed(void)
{
    store_reset();
    enum { N = 4 };
    uint8_t keys[N * KVS_XFER_KEY_LEN];
    uint64_t len[N];
    uint8_t *blk[N];
    const uint32_t seal_len[N] = {1000, KVS_XFER_MAX_SEAL, 0, 1000};
    for (unsigned i = 0; i < N; i++) {
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, 110 + i);
        blk[i] = kvs_fx_block_new(3 + i, 2, 32, 0, 60 + i, &len[i]);
        store_add_copy(keys + i * KVS_XFER_KEY_LEN, blk[i], len[i]);
        if (seal_len[i])
            seal_add(keys + i * KVS_XFER_KEY_LEN, seal_len[i], 0);
    }
    g_seal.on = 1;
    kvs_xfer_dst dst[N];
    uint8_t *seal[N];
    for (unsigned i = 0; i < N; i++) {
        seal[i] = malloc(KVS_XFER_MAX_SEAL);
        dst[i] = (kvs_xfer_dst){.cap = len[i], .buf = malloc(len[i])};
    }
    /* stored inline, rendered inline, rendered by provide_async */
    const struct {
        uint32_t fmt;
        int async_ms;
    } runs[] = {{KVS_XFER_FMT_STORED, 0}, {1, 0}, {1, 20}};
    for (unsigned r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        g_async_ms = runs[r].async_ms;
        kvs_xfer_server *srv = server_new(0);
        kvs_xfer_client *c = client_new(srv, 0, 0);
        for (unsigned i = 0; i < N; i++) {
            memset(dst[i].buf, 0, len[i]);
            memset(seal[i], 0, KVS_XFER_MAX_SEAL);
            dst[i].seal = seal[i];
            dst[i].seal_cap = i == 3 ? seal_len[i] - 1 : KVS_XFER_MAX_SEAL;
            dst[i].seal_len = 77; /* cleared by the fetch */
        }
        kvs_fx_waiter w;
        kvs_fx_waiter_init(&w);
        uint8_t nonce[KVS_XFER_NONCE_LEN];
        for (unsigned i = 0; i < sizeof nonce; i++)
            nonce[i] = (uint8_t)(r * 16 + i + 1);
        CU_ASSERT_EQUAL(fetch_sealed(c, runs[r].fmt, keys, N, dst, &w, nonce), 0);
        CU_ASSERT_EQUAL(w.status, KVS_ENOSPC);
        CU_ASSERT(w.order_ok);
        for (unsigned i = 0; i < N; i++)
            CU_ASSERT(provided_with(keys + i * KVS_XFER_KEY_LEN, nonce));
        for (unsigned i = 0; i < 3; i++) {
            CU_ASSERT_EQUAL(dst[i].status, 0);
            CU_ASSERT_EQUAL(memcmp(dst[i].buf, blk[i], len[i]), 0);
            CU_ASSERT_EQUAL(dst[i].seal_len, seal_len[i]);
            CU_ASSERT(seal_is(keys + i * KVS_XFER_KEY_LEN, seal[i], seal_len[i]));
            CU_ASSERT(g_l0.seen[i]); /* and when layer 0 was reported: */
            CU_ASSERT_EQUAL(g_l0.seal_len[i], seal_len[i]);
            CU_ASSERT_EQUAL(g_l0.seal_ok[i], seal_len[i] > 0);
        }
        CU_ASSERT_EQUAL(dst[3].status, KVS_ENOSPC);
        CU_ASSERT_EQUAL(dst[3].seal_len, 0);
        CU_ASSERT(!g_l0.seen[3]);
        /* No room for a seal: the seal is ignored, the block arrives. */
        for (unsigned i = 0; i < 2; i++) {
            memset(dst[i].buf, 0, len[i]);
            dst[i].seal = NULL;
            dst[i].seal_cap = 0;
        }
        kvs_fx_waiter_init(&w);
        nonce[0] ^= 0xff; /* another request */
        CU_ASSERT_EQUAL(fetch_sealed(c, runs[r].fmt, keys, 2, dst, &w, nonce), 0);
        CU_ASSERT(provided_with(keys, nonce));
        CU_ASSERT_EQUAL(w.status, 0);
        for (unsigned i = 0; i < 2; i++) {
            CU_ASSERT_EQUAL(dst[i].status, 0);
            CU_ASSERT_EQUAL(memcmp(dst[i].buf, blk[i], len[i]), 0);
            CU_ASSERT_EQUAL(dst[i].seal_len, 0);
            CU_ASSERT(g_l0.seen[i]);
        }
        kvs_xfer_server_stats st;
        server_settled(srv, &st);
        CU_ASSERT_EQUAL(st.refs_held, 0);
        CU_ASSERT_EQUAL(store_outstanding(), 0);
        kvs_xfer_client_destroy(c);
        kvs_xfer_server_destroy(srv);
    }
    g_async_ms = 0;
    g_seal.on = 0;
    for (unsigned i = 0; i < N; i++) {
        free(dst[i].buf);
        free(seal[i]);
        free(blk[i]);
    }
    store_reset();
}

/* A store's seal the wire cannot carry (longer than KVS_XFER_MAX_SEAL, or a
 * length without bytes) fails its block with KVS_EINTERNAL, and the block is
 * released; the other blocks of the fetch arrive. */
static void test_fetch_seal_refused(void)
{
    store_reset();
    enum { N = 3 };
    uint8_t keys[N * KVS_XFER_KEY_LEN];
    uint64_t len;
    uint8_t *blk = kvs_fx_block_new(3, 2, 32, 0, 70, &len);
    for (unsigned i = 0; i < N; i++) {
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, 120 + i);
        store_add_copy(keys + i * KVS_XFER_KEY_LEN, blk, len);
    }
    seal_add(keys, 16, 0);
    seal_add(keys + KVS_XFER_KEY_LEN, KVS_XFER_MAX_SEAL + 1, 0);
    seal_add(keys + 2 * KVS_XFER_KEY_LEN, 10, 1);
    g_seal.on = 1;
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst[N];
    uint8_t *seal[N];
    for (unsigned i = 0; i < N; i++) {
        seal[i] = malloc(KVS_XFER_MAX_SEAL + 1);
        dst[i] = (kvs_xfer_dst){
            .cap = len, .buf = malloc(len), .seal = seal[i], .seal_cap = KVS_XFER_MAX_SEAL + 1};
    }
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sealed(c, KVS_XFER_FMT_STORED, keys, N, dst, &w, NULL), 0);
    CU_ASSERT_EQUAL(w.status, KVS_EINTERNAL);
    CU_ASSERT_EQUAL(dst[0].status, 0);
    CU_ASSERT_EQUAL(memcmp(dst[0].buf, blk, len), 0);
    CU_ASSERT_EQUAL(dst[0].seal_len, 16);
    CU_ASSERT(seal_is(keys, seal[0], 16));
    for (unsigned i = 1; i < N; i++) {
        CU_ASSERT_EQUAL(dst[i].status, KVS_EINTERNAL);
        CU_ASSERT_EQUAL(dst[i].seal_len, 0);
        CU_ASSERT(!g_l0.seen[i]);
    }
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    pthread_mutex_lock(&g_store.mu);
    CU_ASSERT_EQUAL(g_store.provides, N);
    CU_ASSERT_EQUAL(g_store.releases, N); /* the refused blocks too */
    pthread_mutex_unlock(&g_store.mu);
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    g_seal.on = 0;
    for (unsigned i = 0; i < N; i++) {
        free(dst[i].buf);
        free(seal[i]);
    }
    free(blk);
    store_reset();
}

/* provide_async: blocks lent later from another thread arrive like any other
 * (a raw format, two blocks and an unknown key, the stored format declined and
 * provided inline in the same server); a server destroyed while a provide is
 * still pending waits for it and releases the block. */
static void test_fetch_async_provide(void)
{
    store_reset();
    uint8_t keys[3 * KVS_XFER_KEY_LEN];
    uint64_t len[2];
    uint8_t *blk[2];
    for (int i = 0; i < 2; i++) {
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, 90 + i);
        blk[i] = kvs_fx_block_new(4, 2, 64, 1, 20 + i, &len[i]);
        store_add_copy(keys + i * KVS_XFER_KEY_LEN, blk[i], len[i]);
    }
    kvs_fx_key(keys + 2 * KVS_XFER_KEY_LEN, 99); /* not stored */
    g_async_ms = 20;
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst[3];
    for (int i = 0; i < 3; i++)
        dst[i] = (kvs_xfer_dst){.cap = len[0] + len[1], .buf = malloc(len[0] + len[1])};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, 1, keys, 3, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, KVS_ENOTFOUND);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(dst[i].status, 0);
        CU_ASSERT_EQUAL(dst[i].len, len[i]);
        CU_ASSERT_EQUAL(memcmp(dst[i].buf, blk[i], len[i]), 0);
    }
    CU_ASSERT_EQUAL(dst[2].status, KVS_ENOTFOUND);
    CU_ASSERT(w.order_ok);
    kvs_fx_waiter_init(&w); /* the stored format: declined, provided inline */
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, keys, 1, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT_EQUAL(memcmp(dst[0].buf, blk[0], len[0]), 0);
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    /* Destroyed with a provide pending: it is waited for and released. */
    g_async_ms = 300;
    kvs_fx_waiter_init(&w);
    kvs_xfer_fetch_req req = {
        .format = 1, .nblocks = 1, .keys = keys, .dst = dst, .on_done = kvs_fx_on_done, .data = &w};
    CU_ASSERT_EQUAL(kvs_xfer_fetch(c, &req), 0);
    usleep(50000);
    kvs_xfer_client_destroy(c);
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&w, 30000), 0);
    long provides0;
    pthread_mutex_lock(&g_store.mu);
    provides0 = g_store.provides;
    pthread_mutex_unlock(&g_store.mu);
    kvs_xfer_server_destroy(srv); /* waits for the pending provide */
    pthread_mutex_lock(&g_store.mu);
    CU_ASSERT_EQUAL(g_store.provides, provides0 + 1);
    pthread_mutex_unlock(&g_store.mu);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    g_async_ms = 0;
    for (int i = 0; i < 3; i++)
        free(dst[i].buf);
    free(blk[0]);
    free(blk[1]);
}

/* Unknown key, a corrupted tile, a buffer too small: each block gets its own
 * status, the good block still arrives, every reference is released. */
static void test_fetch_block_errors(void)
{
    store_reset();
    uint8_t keys[4 * KVS_XFER_KEY_LEN];
    for (unsigned i = 0; i < 4; i++)
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, 20 + i);
    uint64_t len;
    uint8_t *blk = kvs_fx_block_new(4, 2, 32, 0, 3, &len);
    for (unsigned i = 0; i < 3; i++) /* key 0 good, 1 corrupt, 2 small buffer, 3 missing */
        store_add_copy(keys + i * KVS_XFER_KEY_LEN, blk, len);
    pthread_mutex_lock(&g_store.mu);
    kvs_fx_do_find(&g_store, keys + KVS_XFER_KEY_LEN)->corrupt_on_provide = 1;
    pthread_mutex_unlock(&g_store.mu);
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst[4];
    memset(dst, 0, sizeof dst);
    for (unsigned i = 0; i < 4; i++) {
        dst[i].cap = i == 2 ? len - 1 : len;
        dst[i].buf = malloc(dst[i].cap);
    }
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, keys, 4, dst, &w), 0);
    CU_ASSERT(w.status < 0);
    CU_ASSERT_EQUAL(dst[0].status, 0);
    CU_ASSERT_EQUAL(memcmp(dst[0].buf, blk, len), 0);
    CU_ASSERT_EQUAL(dst[1].status, KVS_EFORMAT);
    CU_ASSERT_EQUAL(dst[2].status, KVS_ENOSPC);
    CU_ASSERT_EQUAL(dst[3].status, KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(w.blocks_reported, 4);
    CU_ASSERT(w.order_ok);
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    /* The client still works after per-block failures. */
    kvs_fx_waiter w2;
    kvs_fx_waiter_init(&w2);
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, keys, 1, dst, &w2), 0);
    CU_ASSERT_EQUAL(w2.status, 0);
    fetch_case_end(c, srv, dst, 4, blk);
}

/* KVS_XFER_FETCH_CALLER_CHECKS: a stored tile whose payload changed on the
 * way is reported (its checksum is the caller's to check: kvs_tile_check
 * refuses it, kvs_tile_check_verified does not); a tile whose header is wrong
 * still fails its block. Without the flag the changed payload fails the
 * block, as before. */
static void test_fetch_caller_checks(void)
{
    store_reset();
    uint8_t keys[2 * KVS_XFER_KEY_LEN];
    kvs_fx_key(keys, 40);
    kvs_fx_key(keys + KVS_XFER_KEY_LEN, 41);
    const uint32_t L = 4, H = 2;
    uint64_t len;
    uint8_t *blk = kvs_fx_block_new(L, H, 32, 0, 5, &len);
    uint8_t *c0 = malloc(len), *c1 = malloc(len);
    memcpy(c0, blk, len);
    memcpy(c1, blk, len);
    const void *t;
    size_t tl;
    CU_ASSERT_EQUAL_FATAL(kvs_block_tile(c0, len, L - 1, KVS_TILE_V, H - 1, &t, &tl, NULL), 0);
    ((uint8_t *)t)[sizeof(kvs_tile_hdr) + 5] ^= 0x01; /* a code of the last tile */
    CU_ASSERT_EQUAL_FATAL(kvs_block_tile(c1, len, L - 1, KVS_TILE_V, H - 1, &t, &tl, NULL), 0);
    *(uint8_t *)t ^= 0x01; /* the last tile's magic */
    kvs_fx_store_add(&g_store, keys, c0, len);
    kvs_fx_store_add(&g_store, keys + KVS_XFER_KEY_LEN, c1, len);
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst[2];
    memset(dst, 0, sizeof dst);
    for (unsigned i = 0; i < 2; i++) {
        dst[i].cap = len;
        dst[i].buf = malloc(len);
    }
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    kvs_xfer_fetch_req req = {.format = KVS_XFER_FMT_STORED,
                              .nblocks = 2,
                              .keys = keys,
                              .dst = dst,
                              .on_layer = kvs_fx_on_layer,
                              .on_block = kvs_fx_on_block,
                              .on_done = kvs_fx_on_done,
                              .data = &w,
                              .flags = KVS_XFER_FETCH_CALLER_CHECKS};
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_fetch(c, &req), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_fx_waiter_wait(&w, 30000), 0);
    CU_ASSERT_EQUAL(dst[0].status, 0); /* every layer reported */
    CU_ASSERT_EQUAL(dst[0].layers, L);
    CU_ASSERT_EQUAL(dst[1].status, KVS_EFORMAT);
    CU_ASSERT_EQUAL_FATAL(kvs_block_tile(dst[0].buf, len, L - 1, KVS_TILE_V, H - 1, &t, &tl, NULL),
                          0);
    CU_ASSERT_EQUAL(kvs_tile_check_verified(t, tl, NULL, NULL), 0);
    CU_ASSERT_EQUAL(kvs_tile_check(t, tl, NULL, NULL), KVS_EFORMAT); /* the caller's check */
    CU_ASSERT_NOT_EQUAL(memcmp(dst[0].buf, blk, len), 0);
    /* without the flag the transfer checks the checksums itself */
    kvs_fx_waiter w2;
    kvs_fx_waiter_init(&w2);
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, keys, 1, dst, &w2), 0);
    CU_ASSERT_EQUAL(dst[0].status, KVS_EFORMAT);
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    fetch_case_end(c, srv, dst, 2, blk);
}

static void test_bad_token(void)
{
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    uint8_t *blk = store_reset_to_block(key, 30, 2, 1, 32, 1, 4, &len);
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *bad = client_new(srv, 1 + 5, 0);
    kvs_xfer_client *good = client_new(srv, 0, 0);
    kvs_xfer_dst dst = {.cap = len, .buf = calloc(1, len)};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(bad, KVS_XFER_FMT_STORED, key, 1, &dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, KVS_EUNAUTH);
    CU_ASSERT_EQUAL(dst.status, KVS_EUNAUTH);
    CU_ASSERT_EQUAL(w.layers_seen, 0);
    /* A put with the bad token is refused too, and nothing is stored. */
    kvs_xfer_put_req pr = {
        .format = KVS_XFER_FMT_STORED, .buf = blk, .len = len, .on_done = kvs_fx_on_put_done};
    kvs_fx_key(pr.key, 31);
    kvs_fx_waiter wp;
    kvs_fx_waiter_init(&wp);
    pr.data = &wp;
    CU_ASSERT_EQUAL(kvs_xfer_put(bad, &pr), 0);
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&wp, 30000), 0);
    CU_ASSERT_EQUAL(wp.status, KVS_EUNAUTH);
    /* The server keeps serving the good session. */
    kvs_fx_waiter w2;
    kvs_fx_waiter_init(&w2);
    CU_ASSERT_EQUAL(fetch_sync(good, KVS_XFER_FMT_STORED, key, 1, &dst, &w2), 0);
    CU_ASSERT_EQUAL(w2.status, 0);
    CU_ASSERT_EQUAL(memcmp(dst.buf, blk, len), 0);
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.auth_failures, 2);
    CU_ASSERT_EQUAL(st.puts, 0);
    CU_ASSERT_EQUAL(g_store.put_begins, 0);
    /* Every token byte counts: a flip in the first or the last is refused too. */
    static const unsigned flip[] = {0, KVS_XFER_TOKEN_LEN - 1};
    for (unsigned i = 0; i < sizeof flip / sizeof flip[0]; i++) {
        kvs_xfer_client *b = client_new(srv, 1 + (int)flip[i], 0);
        kvs_fx_waiter wb;
        kvs_fx_waiter_init(&wb);
        CU_ASSERT_EQUAL(fetch_sync(b, KVS_XFER_FMT_STORED, key, 1, &dst, &wb), 0);
        CU_ASSERT_EQUAL(wb.status, KVS_EUNAUTH);
        CU_ASSERT_EQUAL(wb.layers_seen, 0);
        kvs_xfer_client_destroy(b);
    }
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.auth_failures, 4);
    kvs_xfer_client_destroy(bad);
    kvs_xfer_client_destroy(good);
    kvs_xfer_server_destroy(srv);
    free(dst.buf);
}

static void test_put_then_fetch(void)
{
    store_reset();
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    uint64_t len;
    uint8_t *blk = kvs_fx_block_new(8, 4, 64, 0, 5, &len);
    kvs_xfer_put_req pr = {
        .format = KVS_XFER_FMT_STORED, .buf = blk, .len = len, .on_done = kvs_fx_on_put_done};
    kvs_fx_key(pr.key, 40);
    pr.meta = "tokens=64";
    pr.meta_len = 9;
    kvs_fx_waiter wp;
    kvs_fx_waiter_init(&wp);
    pr.data = &wp;
    CU_ASSERT_EQUAL(kvs_xfer_put(c, &pr), 0);
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&wp, 30000), 0);
    CU_ASSERT_EQUAL(wp.status, 0);
    pthread_mutex_lock(&g_store.mu);
    int meta_tokens = g_put.last_meta_tokens;
    pthread_mutex_unlock(&g_store.mu);
    CU_ASSERT_EQUAL(meta_tokens, 64); /* the metadata reached put_begin */
    /* The store's reply came back with the verdict: its key and size. */
    uint8_t filed[KVS_XFER_KEY_LEN];
    st_filed_key(pr.key, filed);
    CU_ASSERT_EQUAL(memcmp(pr.reply.key, filed, sizeof filed), 0);
    CU_ASSERT_EQUAL(pr.reply.stored_bytes, len);
    /* The bytes landed in the store's buffer: fetch them back. */
    kvs_xfer_dst dst = {.cap = len, .buf = malloc(len)};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    w.put_in_cb = c;
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, pr.key, 1, &dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT_EQUAL(memcmp(dst.buf, blk, len), 0);
    CU_ASSERT_EQUAL(w.put_in_cb_rc, KVS_EPRECOND); /* kvs_xfer_put_wait from a callback */
    /* A corrupted block: the store's verdict comes back. */
    blk[len - 5] ^= 0x10;
    kvs_fx_key(pr.key, 41);
    kvs_fx_waiter_init(&wp);
    CU_ASSERT_EQUAL(kvs_xfer_put(c, &pr), 0);
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&wp, 30000), 0);
    CU_ASSERT_EQUAL(wp.status, KVS_EFORMAT);
    static const uint8_t zero[KVS_XFER_KEY_LEN];
    CU_ASSERT_EQUAL(memcmp(pr.reply.key, zero, sizeof zero), 0); /* none with a refusal */
    CU_ASSERT_EQUAL(pr.reply.stored_bytes, 0);
    /* A format the store refuses. */
    pr.format = 9;
    kvs_fx_waiter_init(&wp);
    CU_ASSERT_EQUAL(kvs_xfer_put(c, &pr), 0);
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&wp, 30000), 0);
    CU_ASSERT_EQUAL(wp.status, KVS_EINVAL);
    /* The blocking form gives the same verdicts and reply: the corrupted
     * block's refusal, then the repaired block stored under a new key. */
    kvs_xfer_put_req pw = {.format = KVS_XFER_FMT_STORED, .buf = blk, .len = len};
    kvs_fx_key(pw.key, 42);
    CU_ASSERT_EQUAL(kvs_xfer_put_wait(c, &pw), KVS_EFORMAT);
    CU_ASSERT_EQUAL(pw.reply.stored_bytes, 0);
    blk[len - 5] ^= 0x10;
    CU_ASSERT_EQUAL(kvs_xfer_put_wait(c, &pw), 0);
    st_filed_key(pw.key, filed);
    CU_ASSERT_EQUAL(memcmp(pw.reply.key, filed, sizeof filed), 0);
    CU_ASSERT_EQUAL(pw.reply.stored_bytes, len);
    CU_ASSERT_EQUAL(kvs_xfer_put_wait(c, NULL), KVS_EINVAL);
    pw.len = 0;
    CU_ASSERT_EQUAL(kvs_xfer_put_wait(c, &pw), KVS_EINVAL); /* kvs_xfer_put's own error */
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    CU_ASSERT_EQUAL(st.puts, 2);
    CU_ASSERT_EQUAL(st.bytes_received, 2 * len);
    CU_ASSERT_EQUAL(g_store.put_begins, 4);
    CU_ASSERT_EQUAL(g_store.put_ends, 4);
    fetch_case_end(c, srv, &dst, 1, blk);
}

static void test_bad_args(void)
{
    kvs_xfer_server_opts so = {0};
    kvs_xfer_server *s = NULL;
    CU_ASSERT_EQUAL(kvs_xfer_server_create(&so, &s), KVS_EINVAL); /* no provide */
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_session_info info;
    uint8_t junk[4] = {1, 2, 3, 4};
    CU_ASSERT_EQUAL(kvs_xfer_server_session_open(srv, junk, sizeof junk, NULL, &info), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, 12345), KVS_ENOTFOUND);
    kvs_xfer_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_create(NULL, &c), 0);
    uint8_t key[KVS_XFER_KEY_LEN] = {0};
    kvs_xfer_dst dst = {.cap = 16, .buf = junk};
    kvs_xfer_fetch_req req = {.nblocks = 1, .keys = key, .dst = &dst, .on_done = kvs_fx_on_done};
    CU_ASSERT_EQUAL(kvs_xfer_fetch(c, &req), KVS_EPRECOND); /* not connected */
    dst.mem = KVS_XFER_MEM_CUDA; /* a host pointer claimed as device memory */
    int cuda_rc = kvs_xfer_fetch(c, &req);
#ifdef KVS_XFER_CUDA
    CU_ASSERT(cuda_rc == KVS_EINVAL || cuda_rc == KVS_ENODEV); /* CUDA build: refused */
#else
    CU_ASSERT_EQUAL(cuda_rc, KVS_EUNIMPL); /* no CUDA in this build */
#endif
    req.nblocks = 0;
    CU_ASSERT_EQUAL(kvs_xfer_fetch(c, &req), KVS_EINVAL);
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
}

#ifdef KVS_TEST_ADDRCHECK
/* A child of this process whose comm is name (0 if none). */
static pid_t child_named(const char *name)
{
    DIR *d = opendir("/proc");
    pid_t found = 0;
    struct dirent *e;
    while (d && !found && (e = readdir(d)) != NULL) {
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%.20s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        /* pid (comm) state ppid ... */
        char *open = strchr(buf, '('), *close_ = strrchr(buf, ')');
        if (!open || !close_)
            continue;
        *close_ = 0;
        int ppid = 0;
        char state;
        if (sscanf(close_ + 2, "%c %d", &state, &ppid) == 2 && ppid == (int)getpid() &&
            strcmp(open + 1, name) == 0)
            found = (pid_t)atoi(buf);
    }
    if (d)
        closedir(d);
    return found;
}

/* 1 when process pid has the pipe whose end fd is open, 0 when not. */
static int pid_holds_pipe(pid_t pid, int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return -1;
    char want[64], dir[64];
    snprintf(want, sizeof want, "pipe:[%lu]", (unsigned long)sb.st_ino);
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    int held = 0;
    struct dirent *e;
    while (d && !held && (e = readdir(d)) != NULL) {
        char path[320], link[128];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            held = strcmp(link, want) == 0;
        }
    }
    if (d)
        closedir(d);
    return held;
}

static kvs_xfer_server *server_checked(const char *helper)
{
    kvs_xfer_server_opts o = {0};
    o.ops = kvs_fx_store_ops(&g_store);
    o.addr_check = helper;
    kvs_xfer_server *s = NULL;
    int rc = kvs_xfer_server_create(&o, &s);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return s;
}

typedef struct slow_open {
    kvs_xfer_server *srv;
    const void *addr;
    size_t len;
    int rc;
} slow_open;

static void *slow_open_main(void *arg)
{
    slow_open *o = arg;
    kvs_xfer_session_info info;
    o->rc = kvs_xfer_server_session_open(o->srv, o->addr, o->len, NULL, &info);
    return NULL;
}

/* A check that takes long (an address whose tcp peer never answers, with
 * addr_check_ms 1500) does not hold other callers: one that has waited 250 ms
 * gets KVS_ENOSPC (busy), counted. tcp only: the address is a real client's
 * with its tcp port (its last two bytes with the one device lo) replaced by
 * a listener's that accepts and never speaks. */
static void addr_check_busy(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || strcmp(tls, "tcp") != 0) {
        printf("(busy case: tcp only) ");
        return;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CU_ASSERT_FATAL(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
                    listen(lfd, 16) == 0 && getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    kvs_xfer_client_opts co = {.net_devices = "lo"};
    kvs_xfer_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_create(&co, &c), 0);
    const void *ca;
    size_t cl;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_address(c, &ca, &cl), 0);
    uint8_t *silent = malloc(cl);
    memcpy(silent, ca, cl);
    uint16_t port = ntohs(sa.sin_port);
    silent[cl - 2] = (uint8_t)(port >> 8);
    silent[cl - 1] = (uint8_t)port;
    kvs_xfer_server_opts o = {
        .ops = kvs_fx_store_ops(&g_store), .addr_check = KVS_TEST_ADDRCHECK, .addr_check_ms = 1500};
    kvs_xfer_server *srv = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_create(&o, &srv), 0);
    slow_open so = {srv, silent, cl, 1};
    pthread_t t;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, slow_open_main, &so), 0);
    usleep(300 * 1000); /* the slow check has the helper (its start included) */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvs_xfer_session_info info;
    int rc = kvs_xfer_server_session_open(srv, ca, cl, NULL, &info);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    pthread_join(t, NULL);
    kvs_xfer_server_stats st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    /* Never held behind the slow check (it takes about 1.5 s). Where the
     * slow check had not started within 300 ms (a very loaded machine), the
     * real address was checked first instead: then no busy. */
    CU_ASSERT(ms < 1000);
    CU_ASSERT(rc == KVS_ENOSPC ? st.addr_check_busy == 1 : st.addr_check_busy == 0);
    if (rc != KVS_ENOSPC)
        printf("(busy case: the slow check was not first, rc %d) ", rc);
    kvs_xfer_server_destroy(srv);
    kvs_xfer_client_destroy(c);
    free(silent);
    close(lfd);
}

/* The address check (docs/TRANSFER.md "Sessions"): client worker addresses
 * are tried in kvstash-ucx-addrcheck first. The 8 bytes that abort UCX 1.13
 * inside ucp_address_unpack kill the helper, not this process (without the
 * check this test dies of SIGABRT); a real client passes and fetches; the
 * helper is restarted after each death, at most 10 times a second. */
static void test_addr_check(void)
{
    kvs_xfer_server *s = NULL;
    kvs_xfer_server_opts bad = {.ops = kvs_fx_store_ops(&g_store),
                                .addr_check = "/nonexistent/kvstash-ucx-addrcheck"};
    CU_ASSERT_EQUAL(kvs_xfer_server_create(&bad, &s), KVS_ENOTFOUND);

    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    uint8_t *blk = store_reset_to_copy(key, 7, 4, 2, 32, 0, 7, &len);
    /* A descriptor of ours without close-on-exec must not reach the helper. */
    int leak[2];
    CU_ASSERT_EQUAL_FATAL(pipe(leak), 0);
    kvs_xfer_server *srv = server_checked(KVS_TEST_ADDRCHECK);
    kvs_xfer_server_stats st;
    check_still_serves(srv, key, blk, len);
    pid_t helper = child_named("kvstash-ucx-add"); /* comm: 15 characters */
    CU_ASSERT(helper > 0);
    CU_ASSERT_EQUAL(pid_holds_pipe(helper, leak[0]), 0);
    CU_ASSERT_EQUAL(pid_holds_pipe(getpid(), leak[0]), 1); /* the probe works */
    close(leak[0]);
    close(leak[1]);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
    CU_ASSERT_EQUAL(st.addr_checks, 1);
    CU_ASSERT_EQUAL(st.addr_rejected, 0);
    CU_ASSERT_EQUAL(st.addr_check_spawns, 1);
    uint64_t sessions = st.sessions;

    /* The address msg_fuzz_grpcio found: UCX asserts on its version. */
    static const uint8_t killer[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    kvs_xfer_session_info info;
    CU_ASSERT_EQUAL(kvs_xfer_server_session_open(srv, killer, sizeof killer, NULL, &info),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
    CU_ASSERT_EQUAL(st.addr_checks, 2);
    CU_ASSERT_EQUAL(st.addr_rejected, 1);
    CU_ASSERT_EQUAL(st.addr_check_crashes, 1);
    CU_ASSERT(st.sessions <= sessions); /* nothing opened (the first client may be gone) */
    /* Garbage of a plausible length: refused one way or another, never opened. */
    uint8_t junk[96];
    for (unsigned i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    CU_ASSERT_NOT_EQUAL(kvs_xfer_server_session_open(srv, junk, sizeof junk, NULL, &info), 0);
    check_still_serves(srv, key, blk, len); /* a new helper, the same answers */
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
    CU_ASSERT(st.addr_check_spawns >= 2);

    /* Crash after crash: the helper is not restarted more than 10 times in a
     * second (KVS_ENOSPC meanwhile), and serves again afterwards. */
    int enospc = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
    uint64_t spawns0 = st.addr_check_spawns;
    for (int i = 0; i < 40 && !enospc; i++) {
        int rc = kvs_xfer_server_session_open(srv, killer, sizeof killer, NULL, &info);
        CU_ASSERT(rc == KVS_EINVAL || rc == KVS_ENOSPC);
        enospc = rc == KVS_ENOSPC;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
    uint64_t spawned = st.addr_check_spawns - spawns0;
    /* Where a start and death take under 100 ms the limit must bite; on a
     * machine so slow that they do not, at least never more than 10 a
     * second were started. */
    CU_ASSERT(enospc || secs * 10.0 + 10.0 >= (double)spawned);
    if (!enospc)
        printf("(no KVS_ENOSPC: %llu helpers in %.2f s) ", (unsigned long long)spawned, secs);
    if (enospc) { /* and the refused check started none */
        CU_ASSERT_EQUAL(kvs_xfer_server_session_open(srv, killer, sizeof killer, NULL, &info),
                        KVS_ENOSPC);
        kvs_xfer_server_stats st2;
        CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st2), 0);
        CU_ASSERT_EQUAL(st2.addr_check_spawns, st.addr_check_spawns);
    }
    usleep(1100 * 1000);
    check_still_serves(srv, key, blk, len);
    kvs_xfer_server_destroy(srv);
    free(blk);
    addr_check_busy();
}
#endif

/* The server goes away: the client's pending and new operations fail with a
 * status the caller can act on (fall back to gRPC Get). */
static void test_server_gone(void)
{
    store_reset();
    uint8_t key[KVS_XFER_KEY_LEN];
    kvs_fx_key(key, 50);
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_client *c = client_new(srv, 0, 1500);
    kvs_xfer_server_destroy(srv);
    uint8_t buf[64];
    kvs_xfer_dst dst = {.cap = sizeof buf, .buf = buf};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    int rc = fetch_sync(c, KVS_XFER_FMT_STORED, key, 1, &dst, &w);
    if (rc == 0)
        rc = w.status;
    CU_ASSERT(rc == KVS_EUNAVAIL || rc == KVS_ETIMEDOUT);
    CU_ASSERT(kvs_xfer_client_status(c) == KVS_EUNAVAIL ||
              kvs_xfer_client_status(c) == KVS_ETIMEDOUT);
    printf("\n    server gone: fetch -> %s, client status %s\n", kvs_errname(rc),
           kvs_errname(kvs_xfer_client_status(c)));
    kvs_xfer_client_destroy(c);
}

/* ---- goodbye --------------------------------------------------------------------------- */

static atomic_int g_wedged; /* on_wedged ran (the server's progress thread) */

static void note_wedged(void *arg)
{
    (void)arg;
    atomic_store(&g_wedged, 1);
}

/* The client's status once it is not 0, or 0 after ms. */
static int status_wait(kvs_xfer_client *c, unsigned ms)
{
    int st = 0;
    for (unsigned waited = 0; (st = kvs_xfer_client_status(c)) == 0 && waited < ms; waited += 10)
        usleep(10000);
    return st;
}

/* A server that ends itself says goodbye to every open session
 * (ucx_server.c, say_goodbye; here its watchdog, deaf to its probes, calls
 * on_wedged). A client that heard its session's goodbye before it connected
 * (libkvstash connects once Connect has answered: the session is open on the
 * server from then on) fails its connection when it connects, as one that
 * hears it connected does: it dropped it, took 0 for its session's id, and
 * read that id while kvs_xfer_client_connect wrote it on another thread. */
static void test_goodbye_before_connect(void)
{
    store_reset();
    kvs_xfer_server_opts o = {0};
    o.ops = kvs_fx_store_ops(&g_store);
    o.probe_ms = 50;
    o.wedge_ms = 300;
    o.on_wedged = note_wedged;
    atomic_store(&g_wedged, 0);
    setenv("KVS_UCX_PROBE_DEAF", "1", 1);
    kvs_xfer_server *srv = NULL;
    int rc = kvs_xfer_server_create(&o, &srv);
    unsetenv("KVS_UCX_PROBE_DEAF");
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    kvs_xfer_client *a = client_new(srv, 0, 0); /* connected before the goodbye */
    kvs_xfer_client *b = NULL;                  /* connects after it */
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_create(NULL, &b), 0);
    const void *ba, *sa;
    size_t bl, sl;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_address(b, &ba, &bl), 0);
    kvs_xfer_session_info info;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_session_open(srv, ba, bl, NULL, &info), 0);
    for (int i = 0; i < 500 && !atomic_load(&g_wedged); i++)
        usleep(10000);
    CU_ASSERT_FATAL(atomic_load(&g_wedged));
    CU_ASSERT_EQUAL(status_wait(a, 2000), KVS_EUNAVAIL);
    usleep(300 * 1000); /* b's goodbye went out with a's: let it land */
    CU_ASSERT_EQUAL(kvs_xfer_client_status(b), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_address(srv, &sa, &sl), 0);
    CU_ASSERT_EQUAL(kvs_xfer_client_connect(b, sa, sl, &info), 0);
    CU_ASSERT_EQUAL(status_wait(b, 2000), KVS_EUNAVAIL);
    kvs_xfer_client_destroy(a);
    kvs_xfer_client_destroy(b);
    kvs_xfer_server_destroy(srv);
}

/* ---- forged requests --------------------------------------------------------------------- */

/* A raw UCX peer (not kvs_xfer_client) sends the server malformed requests:
 * wrong header sizes, bad magic, a wrong token, block counts that do not match
 * the payload, a put whose length lies. The server must count them, answer
 * what it can, and keep serving. Wire ids and header layouts are repeated
 * here on purpose (docs/TRANSFER.md "Wire format"): the test pins them. */
#include <ucp/api/ucp.h>

typedef struct raw_fetch {
    uint32_t magic, format;
    uint64_t session;
    uint8_t token[16];
    uint64_t req_id;
    uint32_t nblocks, reserved;
    uint8_t nonce[16];
} raw_fetch;

typedef struct raw_put {
    uint32_t magic, format;
    uint64_t session;
    uint8_t token[16];
    uint64_t req_id, len;
    uint8_t key[32];
    uint32_t meta_len, reserved;
} raw_put;

/* Sends one message and progresses until it completed, up to 10 s: UCX
 * reads the header until then, and the caller changes it for the next
 * message at once. A bound of 200,000 progress calls ran out under load and
 * the next forgery's header went out in its place (CI, sysv: an EPROTO
 * answer to the bad magic, which gets none; 4 of 12 runs four at a time). */
static void raw_send(ucp_worker_h w, ucp_ep_h ep, unsigned id, const void *h, size_t hl,
                     const void *d, size_t dl, uint32_t flags)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, h, hl, d, dl, &p);
    if (!UCS_PTR_IS_PTR(r))
        return;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        if (!ucp_worker_progress(w))
            usleep(100);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (ucp_request_check_status(r) == UCS_INPROGRESS && t.tv_sec - t0.tv_sec < 10);
    CU_ASSERT_NOT_EQUAL(ucp_request_check_status(r), UCS_INPROGRESS);
    ucp_request_free(r);
}

/* A raw UCX peer (context and single-thread worker, AM and TAG as
 * transfer/ asks for) in *ctx, *w; a failure fails the test (fatal). */
static void raw_peer_new(ucp_context_h *ctx, ucp_worker_h *w)
{
    ucp_config_t *cfg;
    CU_ASSERT_EQUAL_FATAL(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                       .features = UCP_FEATURE_AM | UCP_FEATURE_TAG};
    CU_ASSERT_EQUAL_FATAL(ucp_init(&pp, cfg, ctx), UCS_OK);
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    CU_ASSERT_EQUAL_FATAL(ucp_worker_create(*ctx, &wp, w), UCS_OK);
}

/* The raw peer's endpoint to the worker at addr, with peer error handling
 * as transfer/ makes them (fatal on failure). */
static ucp_ep_h raw_peer_ep(ucp_worker_h w, const void *addr)
{
    ucp_ep_params_t ep_p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                          UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                            .address = addr,
                            .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ucp_ep_h ep = NULL;
    CU_ASSERT_EQUAL_FATAL(ucp_ep_create(w, &ep_p, &ep), UCS_OK);
    return ep;
}

/* Force-closes the raw peer's ep, then its worker and context. */
static void raw_peer_destroy(ucp_context_h ctx, ucp_worker_h w, ucp_ep_h ep)
{
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &cp);
    if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS)
            ucp_worker_progress(w);
        ucp_request_free(r);
    }
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
}

static int g_raw_eproto; /* STATUS replies with KVS_EPROTO the raw peer received */
static char g_raw_seen[256]; /* "req/kind/block" of each, for a failure's message */

static ucs_status_t raw_on_status(void *arg, const void *header, size_t hlen, void *data,
                                  size_t len, const ucp_am_recv_param_t *p)
{
    (void)arg;
    (void)data;
    (void)len;
    (void)p;
    int32_t st;
    if (hlen == 24) { /* kvs__status_hdr: req_id, kind, block, status, reserved */
        memcpy(&st, (const uint8_t *)header + 16, sizeof st);
        if (st == KVS_EPROTO) {
            g_raw_eproto++;
            uint64_t rq;
            uint32_t kind, block;
            memcpy(&rq, header, sizeof rq);
            memcpy(&kind, (const uint8_t *)header + 8, sizeof kind);
            memcpy(&block, (const uint8_t *)header + 12, sizeof block);
            size_t n = strlen(g_raw_seen);
            snprintf(g_raw_seen + n, sizeof g_raw_seen - n, " %llu/%u/%u", (unsigned long long)rq,
                     kind, block);
        }
    }
    return UCS_OK;
}

/* Progresses the raw peer until `want` EPROTO statuses have arrived, up to
 * 10 s (once over 3 s on the 2-core VM at load 8); whether they did. */
static int wait_eproto(ucp_worker_h w, int want)
{
    for (int i = 0; i < 1000 && g_raw_eproto < want; i++) {
        ucp_worker_progress(w);
        if (g_raw_eproto < want)
            usleep(10000);
    }
    return g_raw_eproto >= want;
}

static void test_forged_requests(void)
{
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    uint8_t *blk = store_reset_to_block(key, 70, 2, 1, 32, 1, 8, &len);
    kvs_xfer_server *srv = server_new(0);
    ucp_context_h ctx;
    ucp_worker_h w;
    raw_peer_new(&ctx, &w);
    ucp_am_handler_param_t hp = {.field_mask =
                                     UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
                                 .id = 4,
                                 .cb = raw_on_status};
    CU_ASSERT_EQUAL_FATAL(ucp_worker_set_am_recv_handler(w, &hp), UCS_OK);
    g_raw_eproto = 0;
    g_raw_seen[0] = '\0';
    ucp_address_t *wa;
    size_t wl;
    CU_ASSERT_EQUAL_FATAL(ucp_worker_get_address(w, &wa, &wl), UCS_OK);
    kvs_xfer_session_info info; /* a real session for the raw peer */
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_session_open(srv, wa, wl, NULL, &info), 0);
    const void *sa;
    size_t sl;
    kvs_xfer_server_address(srv, &sa, &sl);
    ucp_ep_h ep = raw_peer_ep(w, sa);

    raw_fetch f = {.magic = 0x3158564Bu, .session = info.id, .req_id = 1, .nblocks = 1};
    memcpy(f.token, info.token, 16);
    uint8_t junk[64] = {0};
    raw_send(w, ep, 1, &f, sizeof f - 4, key, 32, 0); /* short header */
    raw_fetch bad = f;
    bad.magic = 0xdeadbeef;
    raw_send(w, ep, 1, &bad, sizeof bad, key, 32, 0); /* bad magic */
    /* Each request that earns an EPROTO answer waits for it before the next
     * goes (a burst once lost two answers in a loaded CI run; one at a time
     * also says which one is missing). */
    bad = f;
    bad.nblocks = 3;
    raw_send(w, ep, 1, &bad, sizeof bad, key, 32, 0); /* count != payload */
    CU_ASSERT(wait_eproto(w, 1));
    bad.nblocks = 0xFFFFFFFFu;
    raw_send(w, ep, 1, &bad, sizeof bad, key, 32, 0); /* absurd count */
    CU_ASSERT(wait_eproto(w, 2));
    bad = f;
    bad.token[0] ^= 0xFF;
    raw_send(w, ep, 1, &bad, sizeof bad, key, 32, 0); /* wrong token */
    bad = f;
    bad.session = info.id + 999;
    raw_send(w, ep, 1, &bad, sizeof bad, key, 32, 0); /* unknown session */
    raw_put pu = {.magic = 0x3158564Bu, .session = info.id, .req_id = 2, .len = 1u << 30};
    memcpy(pu.token, info.token, 16);
    raw_send(w, ep, 2, &pu, sizeof pu, junk, sizeof junk, 0); /* length lies */
    CU_ASSERT(wait_eproto(w, 3));
    pu.len = 0;
    raw_send(w, ep, 2, &pu, sizeof pu, NULL, 0, 0); /* empty put */
    CU_ASSERT(wait_eproto(w, 4));
    pu.len = sizeof junk;
    pu.meta_len = 100;
    raw_send(w, ep, 2, &pu, sizeof pu, junk, sizeof junk, 0);    /* metadata missing */
    raw_send(w, ep, 9, junk, sizeof junk, junk, sizeof junk, 0); /* unknown AM id */
    /* Give the server time to handle everything (the sends completed locally);
     * up to 10 s: once this took over 3 s on the 2-core VM at load 8. */
    kvs_xfer_server_stats st = {0};
    for (int i = 0; i < 1000; i++) {
        ucp_worker_progress(w);
        kvs_xfer_server_stats_get(srv, &st);
        if (st.proto_errors >= 7 && st.auth_failures >= 2 && g_raw_eproto >= 4)
            break;
        usleep(10000);
    }
    CU_ASSERT_EQUAL(st.proto_errors, 7);
    CU_ASSERT_EQUAL(st.auth_failures, 2);
    CU_ASSERT_EQUAL(g_raw_eproto, 4); /* the two bad counts and the two bad puts */
    if (g_raw_eproto != 4) /* seen once in a loaded ASan shm CI run: say what the server saw */
        printf("(forged: %d EPROTO statuses arrived (req/kind/block:%s); server: proto_errors "
               "%llu auth_failures %llu peer_failures %llu timeouts %llu sessions %llu) ",
               g_raw_eproto, g_raw_seen, (unsigned long long)st.proto_errors,
               (unsigned long long)st.auth_failures, (unsigned long long)st.peer_failures,
               (unsigned long long)st.timeouts, (unsigned long long)st.sessions);
    CU_ASSERT_EQUAL(st.fetch_requests, 0);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    CU_ASSERT_EQUAL(g_store.put_begins, 0);
    /* The server still serves a real client. */
    check_still_serves(srv, key, blk, len);
    kvs_xfer_server_destroy(srv);
    ucp_worker_release_address(w, wa);
    raw_peer_destroy(ctx, w, ep);
}

/* A goodbye must prove the session: ids are sequential (one tenant knows its
 * neighbours'), so a raw UCX peer that reaches a client's worker and names
 * its session id, without the token or with a wrong one, changes nothing;
 * with the session's token the client leaves UCX (the positive control).
 * Before the token rode along, the first forgery took the client off UCX. */
static void test_forged_goodbye(void)
{
    store_reset();
    kvs_xfer_server *srv = server_new(0);
    kvs_xfer_session_info info;
    kvs_xfer_client *c = client_session(srv, 0, 0, &info);
    const void *ca;
    size_t cl;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_address(c, &ca, &cl), 0);
    ucp_context_h ctx;
    ucp_worker_h w;
    raw_peer_new(&ctx, &w);
    ucp_ep_h ep = raw_peer_ep(w, ca);
    /* kvs__status_hdr: req_id, kind (4: goodbye), block, status, reserved */
    struct {
        uint64_t req_id;
        uint32_t kind, block;
        int32_t status;
        uint32_t reserved;
    } h = {info.id, 4, 0, KVS_EUNAVAIL, 0};
    uint8_t wrong[KVS_XFER_TOKEN_LEN];
    memcpy(wrong, info.token, sizeof wrong);
    wrong[KVS_XFER_TOKEN_LEN - 1] ^= 0x80;
    raw_send(w, ep, 4, &h, sizeof h, NULL, 0, UCP_AM_SEND_FLAG_EAGER);  /* no token */
    raw_send(w, ep, 4, &h, sizeof h, wrong, 8, UCP_AM_SEND_FLAG_EAGER); /* short */
    raw_send(w, ep, 4, &h, sizeof h, wrong, sizeof wrong, UCP_AM_SEND_FLAG_EAGER);
    for (int i = 0; i < 30; i++) { /* 300 ms for the client to have handled them */
        ucp_worker_progress(w);
        usleep(10000);
    }
    CU_ASSERT_EQUAL(kvs_xfer_client_status(c), 0);
    raw_send(w, ep, 4, &h, sizeof h, info.token, sizeof info.token, UCP_AM_SEND_FLAG_EAGER);
    int st = 0;
    for (int i = 0; i < 200 && (st = kvs_xfer_client_status(c)) == 0; i++) {
        ucp_worker_progress(w);
        usleep(10000);
    }
    CU_ASSERT_EQUAL(st, KVS_EUNAVAIL);
    kvs_xfer_client_destroy(c);
    raw_peer_destroy(ctx, w, ep);
    kvs_xfer_server_destroy(srv);
}

/* A live client that stops taking data: the server's op timeout closes the
 * session and releases the block; the client, hearing nothing more, fails
 * with its own timeout and reports it as its status (fall back to gRPC). */
static void test_server_timeout(void)
{
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    store_reset_to_block(key, 80, 32, 8, 256, 1, 10, &len); /* 16 MiB, 32 layers */
    kvs_xfer_server *srv = server_new(300);
    kvs_xfer_client *c = client_new(srv, 0, 2000);
    kvs_xfer_dst dst = {.cap = len, .buf = malloc(len)};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    w.stall_ms = 1200; /* > the server's 300 ms op timeout */
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, key, 1, &dst, &w), 0);
    kvs_xfer_server_stats st;
    server_settled(srv, &st);
    if (w.status == 0) {
        /* Every layer was already on its way before the stall: nothing to
         * time out on this machine; the path is still covered on shm by
         * client_killed_mid_fetch. */
        printf("\n    fetch finished before the stall; timeout not exercised\n");
    } else {
        CU_ASSERT(w.status == KVS_ETIMEDOUT || w.status == KVS_EUNAVAIL);
        CU_ASSERT_EQUAL(kvs_xfer_client_status(c), w.status);
        CU_ASSERT_EQUAL(st.timeouts, 1);
        CU_ASSERT_EQUAL(st.sessions, 0);
        printf("\n    server timeout: client got %s after %ld layers\n", kvs_errname(w.status),
               w.layers_seen);
    }
    CU_ASSERT_EQUAL(st.refs_held, 0);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    /* A broken client refuses new work with the same status at once. */
    if (w.status != 0) {
        kvs_fx_waiter w2;
        kvs_fx_waiter_init(&w2);
        CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, key, 1, &dst, &w2), w.status);
    }
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    free(dst.buf);
}

/* ---- the killed client ----------------------------------------------------------------- */

/* Child: client address out; session, server address, key, size in; fetch;
 * on the first layer write 'L' and stall until killed. */
static int child_main(int rfd, int wfd)
{
    kvs_xfer_client *c = NULL;
    if (kvs_xfer_client_create(NULL, &c) != 0)
        return 2;
    const void *ca;
    size_t cl;
    kvs_xfer_client_address(c, &ca, &cl);
    uint64_t n = cl;
    if (kvs_write_full(wfd, &n, sizeof n) || kvs_write_full(wfd, ca, cl))
        return 3;
    kvs_xfer_session_info info;
    uint64_t sl, cap;
    uint8_t key[KVS_XFER_KEY_LEN];
    if (kvs_read_full(rfd, &info, sizeof info) || kvs_read_full(rfd, &sl, sizeof sl) || sl > 65536)
        return 4;
    uint8_t *sa = malloc(sl);
    if (kvs_read_full(rfd, sa, sl) || kvs_read_full(rfd, key, sizeof key) ||
        kvs_read_full(rfd, &cap, sizeof cap))
        return 5;
    if (kvs_xfer_client_connect(c, sa, sl, &info) != 0)
        return 6;
    if (cap == 0) { /* put mode: offer a 16 MiB block, then wait to be killed */
        uint64_t len;
        uint8_t *blk = kvs_fx_block_new(32, 8, 256, 1, 11, &len);
        kvs_xfer_put_req pr = {
            .format = KVS_XFER_FMT_STORED, .buf = blk, .len = len, .on_done = kvs_fx_on_put_done};
        memcpy(pr.key, key, sizeof key);
        kvs_fx_waiter wp;
        kvs_fx_waiter_init(&wp);
        pr.data = &wp;
        if (kvs_xfer_put(c, &pr) != 0)
            return 9;
        sleep(60);
        return 10;
    }
    kvs_xfer_dst dst = {.cap = cap, .buf = malloc(cap)};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    w.notify_fd = wfd;
    kvs_xfer_fetch_req req = {.nblocks = 1,
                              .keys = key,
                              .dst = &dst,
                              .on_layer = kvs_fx_on_layer,
                              .on_done = kvs_fx_on_done,
                              .data = &w};
    if (kvs_xfer_fetch(c, &req) != 0)
        return 7;
    sleep(60);
    return 8;
}

/* Starts `test_xfer --child`, opens its session on srv and tells it the
 * server, the key and cap (0: put mode). Returns the pid; *to and *from are
 * the parent's ends of the pipes. */
static pid_t spawn_child(kvs_xfer_server *srv, const uint8_t *key, uint64_t cap, int *to, int *from)
{
    int to_child[2], from_child[2];
    if (pipe(to_child) || pipe(from_child))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char a[16], b[16];
        snprintf(a, sizeof a, "%d", to_child[0]);
        snprintf(b, sizeof b, "%d", from_child[1]);
        execl(g_self, g_self, "--child", a, b, (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    *to = to_child[1];
    *from = from_child[0];
    uint64_t cl = 0;
    if (pid < 0 || kvs_read_full(*from, &cl, sizeof cl) || cl == 0 || cl > 65536)
        return -1;
    uint8_t *ca = malloc(cl);
    kvs_xfer_session_info info;
    int bad = kvs_read_full(*from, ca, cl) || kvs_xfer_server_session_open(srv, ca, cl, NULL, &info);
    free(ca);
    const void *sa;
    size_t sl;
    kvs_xfer_server_address(srv, &sa, &sl);
    uint64_t sl64 = sl;
    if (bad || kvs_write_full(*to, &info, sizeof info) || kvs_write_full(*to, &sl64, sizeof sl64) ||
        kvs_write_full(*to, sa, sl) || kvs_write_full(*to, key, KVS_XFER_KEY_LEN) ||
        kvs_write_full(*to, &cap, sizeof cap)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

/* The client dies while the server is receiving its put: put_end gets the
 * failure (the store aborts its reservation), nothing is stored. */
static void test_client_killed_mid_put(void)
{
    store_reset();
    uint8_t key[KVS_XFER_KEY_LEN];
    kvs_fx_key(key, 90);
    kvs_xfer_server *srv = server_new(2000);
    pthread_mutex_lock(&g_store.mu);
    g_store.put_stall_ms = 1000; /* put_begin holds the server's thread this long */
    pthread_mutex_unlock(&g_store.mu);
    int to = -1, from = -1;
    pid_t pid = spawn_child(srv, key, 0, &to, &from);
    CU_ASSERT_FATAL(pid > 0);
    CU_ASSERT_FATAL(store_wait(&g_store.put_begins, 6000) > 0);
    kill(pid, SIGKILL); /* while put_begin stalls: the payload has not moved yet */
    waitpid(pid, NULL, 0);
    kvs_xfer_server_stats st = {0};
    long ends = store_wait(&g_store.put_ends, 6000);
    kvs_xfer_server_stats_get(srv, &st);
    CU_ASSERT_EQUAL(ends, 1);
    CU_ASSERT(g_store.last_put_status != 0);
    CU_ASSERT_EQUAL(st.puts, 0);
    pthread_mutex_lock(&g_store.mu);
    CU_ASSERT_PTR_NULL(kvs_fx_do_find(&g_store, key));
    g_store.put_stall_ms = 0;
    pthread_mutex_unlock(&g_store.mu);
    printf("\n    killed putter: put_end(%s)\n", kvs_errname(g_store.last_put_status));
    kvs_xfer_server_destroy(srv);
    close(to);
    close(from);
}

/* A session closed while its put's payload is still on its way: the payload
 * keeps landing in the put's buffer after the close (UCX's tcp endpoint goes
 * on receiving after its destroy), so put_end may give the buffer back only
 * once the receive is over; it ran at the close, and the store's buffer was
 * written after it got it back (in kvstash-xferd: bounce memory another block
 * had been copied into, sent with those bytes). Isolated, the store's buffer
 * is not the one UCX writes: the case passes either way there. */
static void test_put_closed_late_bytes(void)
{
    store_reset();
    kvs_xfer_server *srv = server_new(10000);
    kvs_xfer_session_info info;
    kvs_xfer_client *c = client_session(srv, 0, 1500, &info);
    uint64_t len = 8u << 20;
    uint8_t *buf = malloc(len);
    for (uint64_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 131u + (i >> 12));
    pthread_mutex_lock(&g_store.mu);
    g_store.put_stall_ms = 300; /* the close is queued behind put_begin */
    g_put.keep_failed = 1;
    pthread_mutex_unlock(&g_store.mu);
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    kvs_xfer_put_req pr = {.format = KVS_XFER_FMT_STORED, .buf = buf, .len = len, .data = &w};
    pr.on_done = kvs_fx_on_put_done;
    kvs_fx_key(pr.key, 77);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_put(c, &pr), 0);
    CU_ASSERT_FATAL(store_wait(&g_store.put_begins, 1000) > 0);
    /* runs once put_begin returned and the receive was started */
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, info.id), 0);
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&w, 10000), 0); /* the client's put fails (timeout) */
    long ends = store_wait(&g_store.put_ends, 3000);
    usleep(300000); /* anything still landing has landed */
    pthread_mutex_lock(&g_store.mu);
    int kept = g_put.kept != NULL;
    int same = kept && memcmp(g_put.kept, g_put.kept_then, g_put.kept_len) == 0;
    int last = g_store.last_put_status;
    g_store.put_stall_ms = 0;
    pthread_mutex_unlock(&g_store.mu);
    printf("\n    put ended %ld times before destroy (%s); its buffer %s after put_end\n", ends,
           kvs_errname(last),
           !kept  ? "not kept"
           : same ? "unchanged"
                  : "WRITTEN");
    CU_ASSERT(!kept || same);
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    CU_ASSERT_EQUAL(g_store.put_ends, 1);
    CU_ASSERT_EQUAL(g_store.put_begins, 1);
    free(buf);
    store_reset();
}

/* ---- the held puts' cases: put_end_async and put_begin_async ------------------------------ */

/* The store's async hook a held-put case drives: put_end_async (g_end,
 * answered by end_held) or put_begin_async (g_begin, by begin_held). */
typedef struct {
    void *state; /* g_end or g_begin: zeroed when a case opens and closes */
    size_t state_size;
    int *on, *decline;                   /* under g_store.mu */
    unsigned *held;                      /* how many puts it holds, under g_store.mu */
    int (*answer)(kvs_xfer_server *srv); /* gives the oldest held put's answer */
} held_hook;

static int begin_held_ok(kvs_xfer_server *srv)
{
    return begin_held(srv, 0);
}

static const held_hook end_hook = {&g_end,         sizeof g_end, &g_end.on,
                                   &g_end.decline, &g_end.n,     end_held};
static const held_hook begin_hook = {&g_begin,         sizeof g_begin, &g_begin.on,
                                     &g_begin.decline, &g_begin.n,     begin_held_ok};

/* A held-put case: a server whose store holds puts through h, a client
 * session on it (c, its id session), and a block (fblk, flen bytes; the
 * store has a copy under fkey) for the fetches served while a put is held. */
typedef struct {
    const held_hook *h;
    kvs_xfer_server *srv;
    kvs_xfer_client *c;
    uint64_t session;
    uint8_t fkey[KVS_XFER_KEY_LEN];
    uint8_t *fblk;
    uint64_t flen;
} held_case;

/* Opens hc (hc->h set): the store fresh, the hook on; fkey is
 * kvs_fx_key(fkey_n), fblk a 4-layer block of seed fseed. */
static void held_case_open(held_case *hc, unsigned fkey_n, unsigned fseed)
{
    hc->fblk = store_reset_to_copy(hc->fkey, fkey_n, 4, 2, 32, 0, fseed, &hc->flen);
    memset(hc->h->state, 0, hc->h->state_size);
    *hc->h->on = 1;
    hc->srv = server_new(0);
    kvs_xfer_session_info info;
    hc->c = client_session(hc->srv, 0, 0, &info);
    hc->session = info.id;
}

/* Once the case destroyed its server and client: the hook off, the store
 * empty. */
static void held_case_close(held_case *hc)
{
    memset(hc->h->state, 0, hc->h->state_size);
    free(hc->fblk);
    g_store.srv = NULL;
    store_reset();
}

/* A put of the stored format of blk (len bytes) that answers to wp. */
static kvs_xfer_put_req stored_put(uint8_t *blk, uint64_t len, kvs_fx_waiter *wp)
{
    return (kvs_xfer_put_req){.format = KVS_XFER_FMT_STORED,
                              .buf = blk,
                              .len = len,
                              .on_done = kvs_fx_on_put_done,
                              .data = wp};
}

/* Puts pr on hc->c under kvs_fx_key(key_n) (wp, its waiter, started
 * afresh) and waits until the store holds it, its only held put. */
static void put_held(held_case *hc, kvs_xfer_put_req *pr, kvs_fx_waiter *wp, unsigned key_n)
{
    kvs_fx_key(pr->key, key_n);
    kvs_fx_waiter_init(wp);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_put(hc->c, pr), 0);
    CU_ASSERT_FATAL(held_wait(hc->h->held, 1) == 1);
}

/* The stored block key fetched on c into dst is want, len bytes. */
static void check_fetched(kvs_xfer_client *c, const uint8_t *key, kvs_xfer_dst *dst,
                          const uint8_t *want, uint64_t len)
{
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    dst->len = 0;
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, key, 1, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT_EQUAL(dst->len, len);
    CU_ASSERT_EQUAL(memcmp(dst->buf, want, len), 0);
}

/* put_held, then: while the store holds the put, a fetch on the same
 * session is served (hc's block, into dst) and the put has no answer. */
static void put_held_fetch_served(held_case *hc, kvs_xfer_put_req *pr, kvs_fx_waiter *wp,
                                  unsigned key_n, kvs_xfer_dst *dst)
{
    put_held(hc, pr, wp, key_n);
    check_fetched(hc->c, hc->fkey, dst, hc->fblk, hc->flen);
    pthread_mutex_lock(&wp->mu);
    int answered = wp->done;
    pthread_mutex_unlock(&wp->mu);
    CU_ASSERT_EQUAL(answered, 0); /* no answer before the store's */
}

/* The store's answer to pr reached the client: status, and the reply with
 * it (stored bytes; when some were stored, the key the store filed under). */
static void check_put_answer(kvs_fx_waiter *wp, const kvs_xfer_put_req *pr, int status,
                             uint64_t stored)
{
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(wp, 30000), 0);
    CU_ASSERT_EQUAL(wp->status, status);
    if (stored) {
        uint8_t filed[KVS_XFER_KEY_LEN];
        st_filed_key(pr->key, filed);
        CU_ASSERT_EQUAL(memcmp(pr->reply.key, filed, sizeof filed), 0);
    }
    CU_ASSERT_EQUAL(pr->reply.stored_bytes, stored);
}

/* Declined by the hook, pr (under kvs_fx_key(key_n)) is stored whole, as
 * without it (the store's call runs on the server's thread); then pr
 * answers to wp again. */
static void check_put_declined(held_case *hc, kvs_xfer_put_req *pr, kvs_fx_waiter *wp,
                               unsigned key_n)
{
    pthread_mutex_lock(&g_store.mu);
    *hc->h->decline = 1;
    pthread_mutex_unlock(&g_store.mu);
    kvs_fx_key(pr->key, key_n);
    CU_ASSERT_EQUAL(kvs_xfer_put_wait(hc->c, pr), 0);
    CU_ASSERT_EQUAL(pr->reply.stored_bytes, pr->len);
    pthread_mutex_lock(&g_store.mu);
    *hc->h->decline = 0;
    pthread_mutex_unlock(&g_store.mu);
    pr->on_done = kvs_fx_on_put_done; /* kvs_xfer_put_wait set its own */
    pr->data = wp;
}

/* Destroying hc->c fails its put (wp), if nothing failed it yet. */
static void check_put_failed_by_destroy(held_case *hc, kvs_fx_waiter *wp)
{
    kvs_xfer_client_destroy(hc->c);
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(wp, 30000), 0);
    CU_ASSERT(wp->status != 0);
}

/* Gives the store's answer to hc's oldest held put 200 ms from now (a
 * thread of its own: no assert in here). */
static void *answer_later(void *arg)
{
    held_case *hc = arg;
    usleep(200000);
    hc->h->answer(hc->srv);
    return NULL;
}

/* On a new session (hc->c), pr (under kvs_fx_key(key_n)) is held; then
 * destroying hc->srv returns only after the store's answer, given 200 ms
 * later from a thread of its own. */
static void check_destroy_waits(held_case *hc, kvs_xfer_put_req *pr, kvs_fx_waiter *wp,
                                unsigned key_n)
{
    hc->c = client_new(hc->srv, 0, 0);
    put_held(hc, pr, wp, key_n);
    pthread_t t;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, answer_later, hc), 0);
    kvs_xfer_server_destroy(hc->srv);
    pthread_mutex_lock(&g_store.mu);
    unsigned left = *hc->h->held;
    pthread_mutex_unlock(&g_store.mu);
    CU_ASSERT_EQUAL(left, 0); /* destroy returned after the store's answer */
    pthread_join(t, NULL);
}

/* A put ended by the store on another thread (put_end_async): while its end
 * is pending the server goes on serving (a fetch on the same session
 * completes; before put_end_async the put's quantization held the thread),
 * the verdict and reply come back when the store gives them, whatever the
 * session did meanwhile, and destroy waits for a pending end. */
static void test_put_end_async(void)
{
    held_case hc = {.h = &end_hook};
    held_case_open(&hc, 90, 9);
    uint64_t len;
    uint8_t *blk = kvs_fx_block_new(8, 4, 64, 0, 7, &len);
    kvs_fx_waiter wp;
    kvs_xfer_put_req pr = stored_put(blk, len, &wp);
    /* Its end is pending: a fetch on the same session is served meanwhile. */
    kvs_xfer_dst dst = {.cap = hc.flen, .buf = malloc(hc.flen)};
    put_held_fetch_served(&hc, &pr, &wp, 91, &dst);
    CU_ASSERT_EQUAL(g_store.put_ends, 0);
    CU_ASSERT_EQUAL(end_held(hc.srv), 0);
    check_put_answer(&wp, &pr, 0, len);

    /* The store's refusal, given later, is the client's verdict. */
    blk[len - 5] ^= 0x10;
    put_held(&hc, &pr, &wp, 92);
    CU_ASSERT_EQUAL(end_held(hc.srv), KVS_EFORMAT);
    check_put_answer(&wp, &pr, KVS_EFORMAT, 0);
    blk[len - 5] ^= 0x10;

    /* Declined: put_end on the server's thread, as without put_end_async. */
    check_put_declined(&hc, &pr, &wp, 93);

    /* The session closes while the end is pending: the store's end still
     * files the block, and its answer goes nowhere. */
    put_held(&hc, &pr, &wp, 94);
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(hc.srv, hc.session), 0);
    CU_ASSERT_EQUAL(end_held(hc.srv), 0);
    check_put_failed_by_destroy(&hc, &wp);
    kvs_xfer_server_stats st;
    server_settled(hc.srv, &st);
    CU_ASSERT_EQUAL(st.puts, 3); /* 91, 93, 94: the last one's answer lost */

    /* Destroy with an end pending waits for the store to give it. */
    check_destroy_waits(&hc, &pr, &wp, 95);
    kvs_xfer_client_destroy(hc.c);
    CU_ASSERT_EQUAL(g_store.put_begins, 5);
    CU_ASSERT_EQUAL(g_store.put_ends, 5);
    free(dst.buf);
    free(blk);
    held_case_close(&hc);
}

/* The client's mirror of put_closed_late_bytes: a fetch that fails while
 * layers are still on their way into the caller's buffer. on_done must be
 * the last time that buffer changes: the caller may free or reuse it there
 * (a late write would corrupt the heap or a reused buffer). The client's
 * progress thread stalls on the first layer (2 MiB of 64 MiB) while the
 * server, whose op timeout is long, goes on sending the layers its window
 * holds; then the fetch fails in one of three ways: the client's own timeout
 * (how == 0), the server closing the session during the stall and the
 * client timing out after it (1), or kvs_xfer_client_destroy during the
 * stall (2; on_done runs inside destroy). on_done copies the buffer; it is
 * compared 300 ms later (after destroy returned, for 2).
 * On UCX 1.13 (tcp, posix, sysv; 2026-11-30) nothing lands after on_done:
 * the client reports a fetch only once every receive into its buffers has
 * completed (op->inflight; the forced close cancels them), and UCX drops the
 * rendezvous fragments that arrive for a cancelled receive. A client that
 * reported the failure before closing its endpoint had a 64 KiB fragment
 * land after on_done (tcp), which this case caught. */
static void fetch_failed_late(int how)
{
    static const char *const hows[] = {"client timeout", "session closed", "client destroyed"};
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    /* 64 MiB, 32 layers of 2 MiB */
    uint8_t *blk = store_reset_to_block(key, 81, 32, 8, 1024, 1, 11, &len);
    kvs_xfer_server *srv = server_new(10000);
    kvs_xfer_session_info info;
    /* how 1, 2: a timeout long enough that the first layer arrives within
     * it on a loaded machine (a 1.5 s one ran out first under ctest -j6 on
     * two cores, isolated data plane) */
    kvs_xfer_client *c = client_session(srv, 0, how == 0 ? 300 : 5000, &info);
    kvs_xfer_dst dst = {.cap = len, .buf = calloc(1, len)};
    uint8_t *then = malloc(len);
    CU_ASSERT_FATAL(dst.buf && then);
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    /* how 0: longer than the 300 ms timeout; 1, 2: the close or destroy
     * happens during the stall */
    w.stall_ms = how == 0 ? 1000 : 400;
    w.snap_src = dst.buf;
    w.snap = then;
    w.snap_len = len;
    kvs_xfer_fetch_req req = {.format = KVS_XFER_FMT_STORED,
                              .nblocks = 1,
                              .keys = key,
                              .dst = &dst,
                              .on_layer = kvs_fx_on_layer,
                              .on_block = kvs_fx_on_block,
                              .on_done = kvs_fx_on_done,
                              .data = &w};
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_fetch(c, &req), 0);
    if (how != 0) { /* wait for the stall (kvs_fx_on_layer counts the layer first) */
        long seen = 0;
        for (int i = 0; i < 10000 && seen == 0; i++) { /* a hang bound: ~10 s */
            pthread_mutex_lock(&w.mu);
            seen = w.layers_seen;
            pthread_mutex_unlock(&w.mu);
            if (!seen)
                usleep(1000);
        }
        CU_ASSERT_FATAL(seen > 0);
        if (how == 1) {
            CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, info.id), 0);
        } else {
            kvs_xfer_client_destroy(c);
        }
    }
    CU_ASSERT_EQUAL_FATAL(kvs_fx_waiter_wait(&w, 30000), 0);
    usleep(300000); /* anything still landing has landed */
    uint64_t first = len, last = 0, changed = 0, same = 0;
    for (uint64_t i = 0; i < len; i++) {
        same += then[i] == blk[i];
        if (((uint8_t *)dst.buf)[i] != then[i]) {
            changed++;
            first = i < first ? i : first;
            last = i;
        }
    }
    printf("\n    %s: fetch %s after %ld layers, %llu of %llu bytes right at on_done;"
           " %llu written after it [%llu, %llu]\n",
           hows[how], kvs_errname(w.status), w.layers_seen, (unsigned long long)same,
           (unsigned long long)len, (unsigned long long)changed,
           (unsigned long long)(changed ? first : 0), (unsigned long long)last);
    /* It failed mid-fetch: not every byte was in. */
    if (how == 1) {
        CU_ASSERT(w.status == KVS_ETIMEDOUT || w.status == KVS_EUNAVAIL);
    } else {
        CU_ASSERT_EQUAL(w.status, how == 0 ? KVS_ETIMEDOUT : KVS_ECANCELED);
    }
    CU_ASSERT(same < len);
    CU_ASSERT_EQUAL(changed, 0);
    if (how != 2)
        kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    free(then);
    free(dst.buf);
    store_reset();
}

/* A put begun by the store on another thread (put_begin_async): while its
 * begin is pending the server goes on serving (a fetch on the same session
 * completes; before put_begin_async an isolated data plane's progress
 * thread waited for kvstashd's answer), the bytes land once the store has
 * given a buffer (a large put and a small one), a refusal reaches the
 * client with its reply, a put begun after its session closed is ended
 * (KVS_ECANCELED: the store's buffer is not leaked), and destroy waits for
 * a pending begin. */
static void test_put_begin_async(void)
{
    held_case hc = {.h = &begin_hook};
    held_case_open(&hc, 100, 13);
    uint64_t len, slen;
    uint8_t *blk = kvs_fx_block_new(8, 4, 64, 0, 11, &len);
    uint8_t *small = kvs_fx_block_new(1, 1, 16, 1, 12, &slen);
    printf("\n    put_begin_async: %llu and %llu byte puts\n", (unsigned long long)len,
           (unsigned long long)slen);

    kvs_fx_waiter wp;
    kvs_xfer_put_req pr = stored_put(blk, len, &wp);
    /* Its begin is pending: a fetch on the same session is served meanwhile. */
    kvs_xfer_dst dst = {.cap = len, .buf = malloc(len)};
    put_held_fetch_served(&hc, &pr, &wp, 101, &dst);
    CU_ASSERT_EQUAL(g_store.put_begins, 0);
    CU_ASSERT_EQUAL(begin_held(hc.srv, 0), 0);
    check_put_answer(&wp, &pr, 0, len);
    /* The bytes landed in the buffer the store gave late. */
    check_fetched(hc.c, pr.key, &dst, blk, len);

    /* A small put waits the same way and lands the same (libkvstash sends
     * every put by rendezvous: the server's eager branch is not reached
     * from here). */
    kvs_xfer_put_req sp = stored_put(small, slen, &wp);
    put_held(&hc, &sp, &wp, 102);
    CU_ASSERT_EQUAL(begin_held(hc.srv, 0), 0);
    check_put_answer(&wp, &sp, 0, slen);
    check_fetched(hc.c, sp.key, &dst, small, slen);

    /* The store's refusal, given later, reaches the client with its reply. */
    put_held(&hc, &pr, &wp, 103);
    CU_ASSERT_EQUAL(begin_held(hc.srv, KVS_EEXIST), KVS_EEXIST);
    check_put_answer(&wp, &pr, KVS_EEXIST, 7);

    /* Declined: put_begin on the server's thread, as without put_begin_async. */
    check_put_declined(&hc, &pr, &wp, 104);
    kvs_xfer_server_stats st;
    server_settled(hc.srv, &st);
    CU_ASSERT_EQUAL(st.puts, 3); /* 101, 102, 104 */

    /* The session closes while the begin is pending: the store's late begin
     * is ended (KVS_ECANCELED), so its buffer does not leak. */
    put_held(&hc, &pr, &wp, 105);
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(hc.srv, hc.session), 0);
    long begins_before = g_store.put_begins;
    CU_ASSERT_EQUAL(begin_held(hc.srv, 0), 0);
    long lent = -1, open = -1;
    for (int i = 0; i < 1500; i++) {
        kvs_fx_store_books(&g_store, &lent, &open);
        if (open == 0)
            break;
        usleep(2000);
    }
    CU_ASSERT_EQUAL(open, 0);
    pthread_mutex_lock(&g_store.mu);
    CU_ASSERT_EQUAL(g_store.put_begins, begins_before + 1);
    CU_ASSERT_EQUAL(g_store.last_put_status, KVS_ECANCELED);
    pthread_mutex_unlock(&g_store.mu);
    check_put_failed_by_destroy(&hc, &wp);

    /* Destroy with a begin pending waits for the store to give it, and ends
     * the put it begins. */
    check_destroy_waits(&hc, &pr, &wp, 106);
    kvs_fx_store_books(&g_store, &lent, &open);
    CU_ASSERT_EQUAL(open, 0);
    CU_ASSERT_EQUAL(lent, 0);
    kvs_xfer_client_destroy(hc.c);
    pthread_mutex_lock(&g_store.mu);
    CU_ASSERT_EQUAL(g_store.put_begins, 5); /* 101, 102, 104, 105, 106 */
    CU_ASSERT_EQUAL(g_store.put_begins, g_store.put_ends);
    pthread_mutex_unlock(&g_store.mu);
    free(dst.buf);
    free(blk);
    free(small);
    held_case_close(&hc);
}

static void test_fetch_failed_late_bytes(void)
{
    for (int how = 0; how < 3; how++)
        fetch_failed_late(how);
}

static void test_client_killed_mid_fetch(void)
{
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t len;
    uint8_t *blk = store_reset_to_block(key, 60, 32, 8, 256, 1, 6, &len); /* 16 MiB, 32 layers */
    kvs_xfer_server *srv = server_new(2000);
    int to = -1, from = -1;
    pid_t pid = spawn_child(srv, key, len, &to, &from);
    CU_ASSERT_FATAL(pid > 0);
    char ch = 0;
    CU_ASSERT_EQUAL(kvs_read_full(from, &ch, 1), 0);
    CU_ASSERT_EQUAL(ch, 'L');
    /* Mid-fetch: layer 0 arrived, the rest cannot (the child stalls). */
    kvs_xfer_server_stats st;
    kvs_xfer_server_stats_get(srv, &st);
    CU_ASSERT_EQUAL(st.refs_held, 1);
    CU_ASSERT_EQUAL(st.blocks_sent, 0);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    CU_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* The server notices (peer failure or its 2 s op timeout) and releases. */
    int released = 0;
    for (int i = 0; i < 200 && !released; i++) {
        kvs_xfer_server_stats_get(srv, &st);
        released = st.refs_held == 0 && st.sessions == 0 && store_outstanding() == 0;
        if (!released)
            usleep(50000);
    }
    if (!released)
        printf("\n    not released: refs_held=%llu sessions=%llu store_outstanding=%ld\n",
               (unsigned long long)st.refs_held, (unsigned long long)st.sessions,
               store_outstanding());
    CU_ASSERT(released);
    CU_ASSERT_EQUAL(st.blocks_failed, 1);
    CU_ASSERT_EQUAL(st.sessions, 0);
    CU_ASSERT(st.peer_failures + st.timeouts >= 1);
    printf("\n    killed client: released after peer_failures=%llu timeouts=%llu orphans=%llu\n",
           (unsigned long long)st.peer_failures, (unsigned long long)st.timeouts,
           (unsigned long long)st.orphans);
    /* And the server still serves a new client. */
    check_still_serves(srv, key, blk, len);
    kvs_xfer_server_destroy(srv);
    close(to);
    close(from);
}

/* ---- isolation (opts.isolate) ----------------------------------------------------------- */

#ifdef KVS_TEST_XFERD
/* The tcp ports pid listens on: its socket inodes, looked up in /proc/net/tcp. */
static int listen_ports(pid_t pid, unsigned *ports, int max)
{
    char path[64], link[64];
    unsigned long inodes[64];
    int ni = 0, np = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d)) && ni < 64;) {
        char fp[384];
        snprintf(fp, sizeof fp, "%s/%s", path, e->d_name);
        ssize_t n = readlink(fp, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
                ni++;
        }
    }
    closedir(d);
    FILE *f = fopen("/proc/net/tcp", "r");
    char ln[512];
    while (f && fgets(ln, sizeof ln, f) && np < max) {
        unsigned port, st;
        unsigned long ino;
        if (sscanf(ln, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &port, &st,
                   &ino) != 3 ||
            st != 0x0A)
            continue;
        for (int i = 0; i < ni; i++)
            if (inodes[i] == ino)
                ports[np++] = port;
    }
    if (f)
        fclose(f);
    return np;
}

/* The server's UCX in kvstash-xferd: bytes that abort UCX (13 to its tcp port
 * under UCX_TLS=tcp; otherwise SIGKILL, as any death) end the child only. This
 * process and its store live on, every block lent to the dead child is given
 * back, the child is started again, and a new session fetches from it. */
static void test_isolated_restart(void)
{
    store_reset();
    uint8_t keys[4 * KVS_XFER_KEY_LEN];
    uint64_t len = 0;
    for (unsigned i = 0; i < 4; i++) {
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, 70 + i);
        uint8_t *b = kvs_fx_block_new(4, 8, 128, 1, 30 + i, &len);
        kvs_fx_store_add(&g_store, keys + i * KVS_XFER_KEY_LEN, b, len);
    }
    kvs_xfer_server_opts o = {0};
    o.ops = kvs_fx_store_ops(&g_store);
    o.ops.put_begin = st_put_begin;
    o.ops.put_end = st_put_end;
    o.isolate = KVS_TEST_XFERD;
    kvs_xfer_server *srv = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_create(&o, &srv), 0);
    /* The first session's id, as a caller that outlives the child would keep it: it
     * must not name a session of the next child (ids were 1, 2, ... in each: the
     * first session of the next child got this one's id) */
    kvs_xfer_client *extra = NULL;
    kvs_xfer_client_opts xo = {.timeout_ms = 2000};
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_create(&xo, &extra), 0);
    const void *ea;
    size_t el;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_address(extra, &ea, &el), 0);
    kvs_xfer_session_info old;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_session_open(srv, ea, el, NULL, &old), 0);
    kvs_xfer_client *c = client_new(srv, 0, 2000);
    kvs_xfer_dst dst[4];
    for (int i = 0; i < 4; i++)
        dst[i] = (kvs_xfer_dst){.cap = len, .buf = malloc(len)};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, keys, 4, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    kvs_xfer_server_stats st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    pid_t child = (pid_t)st.proc_pid;
    CU_ASSERT(child > 0 && child != getpid());
    CU_ASSERT_EQUAL(st.proc_restarts, 0);
    CU_ASSERT_EQUAL(st.sessions, 2);
    CU_ASSERT_EQUAL(st.blocks_sent, 4);

    /* A fetch in flight, then the attack. */
    kvs_fx_waiter w2;
    kvs_fx_waiter_init(&w2);
    kvs_xfer_fetch_req req = {.format = KVS_XFER_FMT_STORED,
                              .keys = keys,
                              .nblocks = 4,
                              .dst = dst,
                              .on_layer = kvs_fx_on_layer,
                              .on_block = kvs_fx_on_block,
                              .on_done = kvs_fx_on_done,
                              .data = &w2};
    int frc = kvs_xfer_fetch(c, &req);
    unsigned ports[16];
    int np = listen_ports(child, ports, 16);
    int socks[16];
    for (int i = 0; i < np; i++) {
        socks[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)ports[i]),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        uint8_t bytes[13] = {0x78, 0x56, 0x34, 0x12, 0xBE, 0xBA, 0xFE, 0xCA, /* magic, LE */
                             0x00, 0xff, 0xff, 0xff, 0xff};                  /* id 0, len ~0 */
        if (connect(socks[i], (struct sockaddr *)&sa, sizeof sa) == 0)
            (void)!write(socks[i], bytes, sizeof bytes);
    }
    if (np == 0)
        kill(child, SIGKILL);
    for (int tries = 0; tries < 750; tries++) { /* 15 s */
        usleep(20000);
        CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
        if (st.proc_pid != 0 && st.proc_pid != (uint64_t)child)
            break;
    }
    for (int i = 0; i < np; i++)
        close(socks[i]);
    printf("\n    data plane %d ended (%s); restarts=%llu, new pid %llu\n", (int)child,
           np ? "13 bytes to its UCX tcp port" : "SIGKILL", (unsigned long long)st.proc_restarts,
           (unsigned long long)st.proc_pid);
    CU_ASSERT_EQUAL(st.proc_restarts, 1);
    CU_ASSERT(st.proc_pid != 0 && st.proc_pid != (uint64_t)child);
    CU_ASSERT_EQUAL(st.sessions, 0);
    CU_ASSERT(st.blocks_sent >= 4); /* counters do not go back with the restart */
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    /* The old session's fetch ends (with an error, unless it was done first). */
    if (frc == 0)
        CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&w2, 10000), 0);
    CU_ASSERT_EQUAL(w2.status == 0 || w2.status == KVS_EUNAVAIL || w2.status == KVS_ETIMEDOUT ||
                        w2.status == KVS_ECANCELED,
                    1);
    kvs_xfer_client_destroy(c);

    /* A new session on the new child (a new address). */
    kvs_xfer_client *c2 = client_new(srv, 0, 2000);
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, old.id), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    CU_ASSERT_EQUAL(st.sessions, 1); /* c2's, untouched */
    kvs_xfer_client_destroy(extra);
    for (int i = 0; i < 4; i++)
        memset(dst[i].buf, 0, len);
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c2, KVS_XFER_FMT_STORED, keys, 4, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    for (unsigned i = 0; i < 4; i++) {
        uint8_t *want = NULL;
        pthread_mutex_lock(&g_store.mu);
        kvs_fx_entry *e = kvs_fx_do_find(&g_store, keys + i * KVS_XFER_KEY_LEN);
        want = e ? e->bytes : NULL;
        pthread_mutex_unlock(&g_store.mu);
        CU_ASSERT(want && memcmp(dst[i].buf, want, len) == 0);
    }
    kvs_xfer_client_destroy(c2);
    kvs_xfer_server_destroy(srv);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    CU_ASSERT(kill(child, 0) != 0); /* reaped */
    for (int i = 0; i < 4; i++)
        free(dst[i].buf);
}

/* opts.shared: blocks inside it are sent in place from the child's read-only
 * mapping, others are copied through bounce memory (counted); both arrive
 * byte for byte, in the stored format and with the store's own bounds. */
static void test_isolated_shared(void)
{
    store_reset();
    uint8_t keys[3 * KVS_XFER_KEY_LEN];
    uint8_t *blk[3];
    uint64_t len[3];
    for (unsigned i = 0; i < 3; i++) {
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, 80 + i);
        blk[i] = kvs_fx_block_new(3, 4, 64, 1, 40 + i, &len[i]);
    }
    uint64_t off1 = (len[0] + 4095) / 4096 * 4096;
    uint64_t region = off1 + (len[1] + 4095) / 4096 * 4096;
    int fd = memfd_create("test-xfer-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CU_ASSERT_FATAL(fd >= 0 && ftruncate(fd, (off_t)region) == 0);
    uint8_t *base = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CU_ASSERT_FATAL(base != MAP_FAILED);
    memcpy(base, blk[0], len[0]);
    memcpy(base + off1, blk[1], len[1]);
    uint8_t *heap = malloc(len[2]);
    memcpy(heap, blk[2], len[2]);
    kvs_fx_store_add(&g_store, keys, base, len[0]);
    kvs_fx_store_add(&g_store, keys + KVS_XFER_KEY_LEN, base + off1, len[1]);
    kvs_fx_store_add(&g_store, keys + 2 * KVS_XFER_KEY_LEN, heap, len[2]);
    kvs_xfer_server_opts o = {0};
    o.ops = kvs_fx_store_ops(&g_store);
    o.isolate = KVS_TEST_XFERD;
    o.shared = (kvs_xfer_shared){.fd = fd, .base = base, .len = region};
    kvs_xfer_server *srv = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_create(&o, &srv), 0);
    kvs_xfer_client *c = client_new(srv, 0, 0);
    kvs_xfer_dst dst[3];
    for (int i = 0; i < 3; i++)
        dst[i] = (kvs_xfer_dst){.cap = len[i], .buf = malloc(len[i])};
    kvs_fx_waiter w;
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, KVS_XFER_FMT_STORED, keys, 3, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(memcmp(dst[i].buf, blk[i], len[i]), 0);
    kvs_xfer_server_stats st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    CU_ASSERT_EQUAL(st.bounce_copies, 1); /* the heap block only */
    /* "raw" format: in place too, cut at the bounds the store gave */
    memset(dst[0].buf, 0, len[0]);
    kvs_fx_waiter_init(&w);
    CU_ASSERT_EQUAL(fetch_sync(c, 1, keys, 1, dst, &w), 0);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT_EQUAL(dst[0].layers, 4);
    CU_ASSERT_EQUAL(memcmp(dst[0].buf, blk[0], len[0]), 0);
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    CU_ASSERT_EQUAL(st.bounce_copies, 1);
    CU_ASSERT_EQUAL(st.refs_held, 0);
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    CU_ASSERT_EQUAL(store_outstanding(), 0);
    pthread_mutex_lock(&g_store.mu); /* the region is not the store's to free */
    for (int i = 0; i < KVS_FX_STORE_MAX; i++)
        if (g_store.e[i].bytes >= base && g_store.e[i].bytes < base + region)
            g_store.e[i].bytes = NULL;
    pthread_mutex_unlock(&g_store.mu);
    munmap(base, region);
    close(fd);
    for (int i = 0; i < 3; i++) {
        free(dst[i].buf);
        free(blk[i]);
    }
}

/* A data plane process that stops answering (SIGSTOP stands in for a UCX
 * deadlock) is killed after a call waited 15 s for it, and replaced. */
static void test_isolated_wedged(void)
{
    /* 15 s: in the test_xfer_isolated run only (it does not depend on UCX_TLS) */
    if (!getenv("KVS_TEST_ISOLATE") || strcmp(getenv("KVS_TEST_ISOLATE"), "1") != 0)
        return;
    store_reset();
    kvs_xfer_server_opts o = {0};
    o.ops = kvs_fx_store_ops(&g_store);
    o.isolate = KVS_TEST_XFERD;
    kvs_xfer_server *srv = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_create(&o, &srv), 0);
    kvs_xfer_server_stats st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    pid_t child = (pid_t)st.proc_pid;
    CU_ASSERT_FATAL(child > 0);
    CU_ASSERT_EQUAL(kill(child, SIGSTOP), 0);
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0); /* waits 15 s, then kills */
    for (int tries = 0; tries < 500; tries++) {
        CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
        if (st.proc_pid != 0 && st.proc_pid != (uint64_t)child)
            break;
        usleep(20000);
    }
    CU_ASSERT_EQUAL(st.proc_restarts, 1);
    CU_ASSERT(st.proc_pid != 0 && st.proc_pid != (uint64_t)child);
    CU_ASSERT(kill(child, 0) != 0); /* killed and reaped */
    kvs_xfer_server_destroy(srv);
}
#endif

int main(int argc, char **argv)
{
    g_self = argv[0];
    if (argc == 4 && strcmp(argv[1], "--child") == 0)
        return child_main(atoi(argv[2]), atoi(argv[3]));
    signal(SIGPIPE, SIG_IGN);
    kvs_fx_tls_setup();
    printf("UCX_TLS=%s\n", getenv("UCX_TLS") ? getenv("UCX_TLS") : "(default)");
    static const kvs_test_case cases[] = {
        {"fetch_layers_in_order", test_fetch_layers_in_order},
        {"fetch_raw_format_xxh3", test_fetch_raw_format},
        {"fetch_fixed_places", test_fetch_fixed_places},
        {"fetch_many_small_sends", test_fetch_many_small_sends},
        {"fetch_async_provide", test_fetch_async_provide},
        {"fetch_sealed", test_fetch_sealed},
        {"fetch_seal_refused", test_fetch_seal_refused},
        {"fetch_block_errors", test_fetch_block_errors},
        {"fetch_caller_checks", test_fetch_caller_checks},
        {"bad_session_token", test_bad_token},
        {"put_then_fetch", test_put_then_fetch},
        {"bad_arguments", test_bad_args},
        {"forged_requests", test_forged_requests},
        {"client_killed_mid_fetch", test_client_killed_mid_fetch},
        {"client_killed_mid_put", test_client_killed_mid_put},
        {"put_closed_late_bytes", test_put_closed_late_bytes},
        {"put_end_async", test_put_end_async},
        {"put_begin_async", test_put_begin_async},
        {"fetch_failed_late_bytes", test_fetch_failed_late_bytes},
        {"server_op_timeout", test_server_timeout},
        {"server_gone_fallback_status", test_server_gone},
        {"goodbye_before_connect", test_goodbye_before_connect},
        {"forged_goodbye", test_forged_goodbye},
#ifdef KVS_TEST_ADDRCHECK
        {"addr_check", test_addr_check},
#endif
#ifdef KVS_TEST_XFERD
        {"isolated_restart", test_isolated_restart},
        {"isolated_shared", test_isolated_shared},
        {"isolated_wedged", test_isolated_wedged},
#endif
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"xfer", NULL, NULL, cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
