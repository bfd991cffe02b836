/*
 * kvs_xfer_fixture.c — the data plane tests' store, waiter, blocks and
 * transports (kvs_xfer_fixture.h).
 *
 * The store lends its own bytes (or a corrupted private copy) and a ref that
 * owns whatever the lend borrowed: the raw format's bounds live in the ref,
 * so they stay valid until release as the server requires. The waiter's
 * condition variable runs on CLOCK_MONOTONIC so a wait's deadline does not
 * move with the wall clock.
 */
#include "kvs_xfer_fixture.h"

#include "kv_block.h"
#include "kvs_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the store ----------------------------------------------------------------------- */

void kvs_fx_key(uint8_t key[KVS_XFER_KEY_LEN], unsigned n)
{
    for (unsigned i = 0; i < KVS_XFER_KEY_LEN; i++)
        key[i] = (uint8_t)(n * 37u + i * 11u + 1u);
}

void kvs_fx_store_zero(kvs_fx_store *s)
{
    pthread_mutex_lock(&s->mu);
    s->provides = s->releases = s->put_begins = s->put_ends = 0;
    s->put_stall_ms = 0;
    s->last_put_status = 0;
    pthread_mutex_unlock(&s->mu);
}

void kvs_fx_store_clear(kvs_fx_store *s)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < KVS_FX_STORE_MAX; i++)
        free(s->e[i].bytes);
    memset(s->e, 0, sizeof s->e);
    pthread_mutex_unlock(&s->mu);
    kvs_fx_store_zero(s);
}

void kvs_fx_store_add(kvs_fx_store *s, const uint8_t *key, uint8_t *bytes, uint64_t len)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < KVS_FX_STORE_MAX; i++) {
        if (!s->e[i].used) {
            memcpy(s->e[i].key, key, KVS_XFER_KEY_LEN);
            s->e[i].bytes = bytes;
            s->e[i].len = len;
            s->e[i].used = 1;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

kvs_fx_entry *kvs_fx_do_find(kvs_fx_store *s, const uint8_t *key)
{
    for (int i = 0; i < KVS_FX_STORE_MAX; i++)
        if (s->e[i].used && memcmp(s->e[i].key, key, KVS_XFER_KEY_LEN) == 0)
            return &s->e[i];
    return NULL;
}

void kvs_fx_store_books(kvs_fx_store *s, long *lent, long *puts_open)
{
    pthread_mutex_lock(&s->mu);
    *lent = s->provides - s->releases;
    *puts_open = s->put_begins - s->put_ends;
    pthread_mutex_unlock(&s->mu);
}

kvs_xfer_store_ops kvs_fx_store_ops(kvs_fx_store *s)
{
    return (kvs_xfer_store_ops){.ctx = s, .provide = kvs_fx_provide, .release = kvs_fx_release};
}

/* What a lend borrowed: a corrupted copy, the raw format's bounds. */
typedef struct fx_ref {
    uint8_t *copy;
    uint64_t bounds[5];
} fx_ref;

int kvs_fx_provide(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                   const uint8_t nonce[KVS_XFER_NONCE_LEN], kvs_xfer_block_src *src)
{
    kvs_fx_store *s = ctx;
    (void)sd;
    pthread_mutex_lock(&s->mu);
    kvs_fx_entry *e = kvs_fx_do_find(s, key);
    if (!e) {
        pthread_mutex_unlock(&s->mu);
        return KVS_ENOTFOUND;
    }
    fx_ref *r = calloc(1, sizeof *r);
    if (r && e->corrupt_on_provide && (r->copy = malloc(e->len)) == NULL) {
        free(r);
        r = NULL;
    }
    if (!r) {
        pthread_mutex_unlock(&s->mu);
        return KVS_ENOMEM;
    }
    *src = (kvs_xfer_block_src){.bytes = e->bytes, .len = e->len, .ref = r};
    if (r->copy) {
        memcpy(r->copy, e->bytes, e->len);
        r->copy[e->len - 3] ^= 0x40; /* a byte inside the last tile's payload */
        src->bytes = r->copy;
    }
    if (fmt != KVS_XFER_FMT_STORED) { /* "raw": the same bytes in 4 chunks */
        src->layers = 4;
        for (unsigned i = 0; i <= 4; i++)
            r->bounds[i] = e->len * i / 4;
        src->bounds = r->bounds;
    }
    memcpy(e->nonce, nonce, KVS_XFER_NONCE_LEN);
    s->provides++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void kvs_fx_release(void *ctx, void *ref)
{
    kvs_fx_store *s = ctx;
    fx_ref *r = ref;
    pthread_mutex_lock(&s->mu);
    s->releases++;
    pthread_mutex_unlock(&s->mu);
    free(r->copy);
    free(r);
}

typedef struct fx_job {
    kvs_fx_store *s;
    kvs_fx_provide_fn provide;
    uint8_t key[KVS_XFER_KEY_LEN];
    uint8_t nonce[KVS_XFER_NONCE_LEN];
    uint32_t fmt;
    void *handle;
    unsigned delay_us;
} fx_job;

static void *fx_job_main(void *arg)
{
    fx_job *j = arg;
    usleep(j->delay_us);
    kvs_xfer_block_src src = {0};
    int rc = j->provide(j->s, NULL, j->key, j->fmt, j->nonce, &src);
    kvs_xfer_server_provide_done(j->s->srv, j->handle, rc, rc == 0 ? &src : NULL);
    free(j);
    return NULL;
}

int kvs_fx_provide_later(kvs_fx_store *s, kvs_fx_provide_fn provide, const uint8_t *key,
                         uint32_t fmt, const uint8_t *nonce, void *handle, unsigned delay_us)
{
    fx_job *j = calloc(1, sizeof *j);
    if (!j)
        return KVS_ENOMEM;
    *j = (fx_job){.s = s, .provide = provide, .fmt = fmt, .handle = handle, .delay_us = delay_us};
    memcpy(j->key, key, KVS_XFER_KEY_LEN);
    memcpy(j->nonce, nonce, KVS_XFER_NONCE_LEN);
    pthread_t t;
    if (pthread_create(&t, NULL, fx_job_main, j) != 0) {
        free(j);
        return 1;
    }
    pthread_detach(t);
    return 0;
}

int kvs_fx_put_begin(kvs_fx_store *s, const uint8_t *key, uint64_t len, void **buf, void **ref)
{
    kvs_fx_put *p = calloc(1, sizeof *p);
    if (p)
        p->buf = malloc(len);
    if (!p || (!p->buf && len)) {
        free(p);
        return KVS_ENOMEM;
    }
    p->len = len;
    memcpy(p->key, key, KVS_XFER_KEY_LEN);
    *buf = p->buf;
    *ref = p;
    pthread_mutex_lock(&s->mu);
    s->put_begins++;
    int stall = s->put_stall_ms;
    pthread_mutex_unlock(&s->mu);
    if (stall > 0)
        usleep((useconds_t)stall * 1000u);
    return 0;
}

int kvs_fx_put_end(kvs_fx_store *s, kvs_fx_put *p, int status)
{
    pthread_mutex_lock(&s->mu);
    s->last_put_status = status;
    s->put_ends++;
    pthread_mutex_unlock(&s->mu);
    free(p->buf);
    free(p);
    return status;
}

/* ---- a fetch or put to wait for -------------------------------------------------------- */

void kvs_fx_waiter_init(kvs_fx_waiter *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->order_ok = 1;
    w->notify_fd = -1;
}

void kvs_fx_waiter_fini(kvs_fx_waiter *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

int kvs_fx_waiter_wait(kvs_fx_waiter *w, unsigned ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (!w->done && rc == 0)
        rc = pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    int done = w->done;
    pthread_mutex_unlock(&w->mu);
    return done ? 0 : -1;
}

void kvs_fx_on_layer(kvs_xfer_fetch_req *r, uint32_t block, uint32_t layer)
{
    kvs_fx_waiter *w = r->data;
    pthread_mutex_lock(&w->mu);
    if (block >= KVS_FX_BLOCKS || w->next_layer[block] != layer)
        w->order_ok = 0;
    else
        w->next_layer[block]++;
    w->layers_seen++;
    pthread_mutex_unlock(&w->mu);
    if (w->notify_fd >= 0) {
        (void)!write(w->notify_fd, "L", 1);
        w->notify_fd = -1;
        sleep(30); /* stall this client's progress thread until killed */
    }
    if (w->stall_ms > 0) {
        usleep((useconds_t)w->stall_ms * 1000u);
        w->stall_ms = 0;
    }
    if (w->put_in_cb) { /* would wait for this very thread: must be refused */
        static const uint8_t one = 1;
        kvs_xfer_put_req pr = {.format = KVS_XFER_FMT_STORED, .buf = &one, .len = 1};
        w->put_in_cb_rc = kvs_xfer_put_wait(w->put_in_cb, &pr);
        w->put_in_cb = NULL;
    }
}

void kvs_fx_on_block(kvs_xfer_fetch_req *r, uint32_t block, int status)
{
    kvs_fx_waiter *w = r->data;
    pthread_mutex_lock(&w->mu);
    if (block < KVS_FX_BLOCKS) {
        w->block_status[block] = status;
        w->block_done[block] = 1;
    }
    w->blocks_reported++;
    pthread_mutex_unlock(&w->mu);
}

/* The end of a fetch or a put: status into w, and kvs_fx_waiter_wait returns. */
static void fx_finish(kvs_fx_waiter *w, int status)
{
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->status = status;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void kvs_fx_on_done(kvs_xfer_fetch_req *r, int status)
{
    kvs_fx_waiter *w = r->data;
    if (w->snap)
        memcpy(w->snap, w->snap_src, w->snap_len);
    fx_finish(w, status);
}

void kvs_fx_on_put_done(kvs_xfer_put_req *r, int status)
{
    fx_finish(r->data, status);
}

/* ---- blocks and transports ------------------------------------------------------------- */

uint8_t *kvs_fx_block_new(uint32_t L, uint32_t H, uint32_t T, int fp16_only, unsigned seed,
                          uint64_t *len)
{
    const uint32_t D = 64;
    kvs_scheme schemes[64];
    const void *ks[64], *vs[64];
    size_t n = (size_t)T * H * D;
    float *src = L <= 64 ? malloc(n * sizeof(float)) : NULL;
    if (!src) {
        fprintf(stderr, "kvs_fx_block_new: %u layers (64 at most) or no memory\n", L);
        abort();
    }
    for (uint32_t l = 0; l < L; l++)
        schemes[l] = (fp16_only || l % 2 == 0) ? KVS_SCHEME_FP16 : KVS_SCHEME_FP8_E4M3;
    kvs_block_params p = {.layers = L,
                          .heads = H,
                          .head_dim = D,
                          .block_tokens = T,
                          .src_dtype = KVS_DTYPE_FP32,
                          .k_outliers = 2,
                          .v_outliers = 2,
                          .schemes = schemes};
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        src[i] = (float)((int)(x >> 16) % 2000 - 1000) / 500.0f;
    }
    for (uint32_t l = 0; l < L; l++)
        ks[l] = vs[l] = src;
    size_t size = kvs_block_size(&p);
    uint8_t *out = aligned_alloc(64, (size + 63) / 64 * 64);
    char err[KVS_ERR_LEN];
    if (!out || kvs_block_encode(&p, ks, vs, NULL, out, size, err) != 0) {
        fprintf(stderr, "kvs_fx_block_new: %s\n", out ? err : "no memory");
        abort();
    }
    free(src);
    *len = size;
    return out;
}

/* 1 when this process may read a child's memory with process_vm_readv. */
static int cma_works(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    static volatile uint64_t probe = 0x1234;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[1]);
        char c;
        (void)!read(fds[0], &c, 1);
        _exit(0);
    }
    close(fds[0]);
    uint64_t v = 0;
    struct iovec l = {&v, sizeof v}, r = {(void *)&probe, sizeof probe};
    ssize_t n = pid > 0 ? process_vm_readv(pid, &l, 1, &r, 1, 0) : -1;
    int err = errno;
    close(fds[1]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    if (n != (ssize_t)sizeof v || v != 0x1234) {
        printf("cma skipped: %s: %s\n", pid > 0 ? "process_vm_readv" : "fork", strerror(err));
        return 0;
    }
    return 1;
}

void kvs_fx_tls_setup(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || !strstr(tls, "cma") || cma_works())
        return;
    char out[256] = "", buf[256];
    snprintf(buf, sizeof buf, "%s", tls);
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "cma") == 0)
            continue;
        if (out[0])
            strncat(out, ",", sizeof out - strlen(out) - 1);
        strncat(out, t, sizeof out - strlen(out) - 1);
    }
    setenv("UCX_TLS", out, 1);
    printf("UCX_TLS=%s (cma dropped)\n", out);
}
