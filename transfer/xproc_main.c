/*
 * xproc_main.c — kvstash-xferd, the isolated data plane (xproc.h): a
 * kvs_xfer_server whose store is its parent, kvstashd.
 *
 * Why a process: UCX 1.13 aborts the process it runs in on some bytes any
 * peer can send (docs/TRANSFER.md "Isolation"). Here an abort ends this
 * process only; the parent keeps the store and starts another.
 *
 * Descriptors: 3 the parent's SOCK_SEQPACKET socket, 4 the bounce memory
 * (read-write), 5 the parent's shared memory (a read-only descriptor, so
 * its mapping cannot be made writable; only when its length is not 0).
 * EOF on 3 (the parent ended or stops us): exit at once.
 * Threads: the main thread reads the parent's messages (replies, provided
 * blocks, begun and ended puts); session open, close and stats run on
 * CALL_THREADS long-lived threads, as they wait for the progress thread,
 * which may itself wait for a reply from the parent (a failed put's end; a
 * put's buffer when c_put_begin_async could not offer it). Long-lived,
 * because the address check's helper is started by the thread that opens a
 * session, with PR_SET_PDEATHSIG, which fires when that thread ends.
 *
 * Usage (from xproc.c only): kvstash-xferd peer|none OP_TIMEOUT_MS WINDOW
 *   MIN_MSG SPIN ADDR_CHECK_MS BOUNCE_LEN SHARED_LEN NET_DEVICES TLS
 *   ADDR_CHECK put|noput
 */
#include "kvs_error.h"
#include "kvs_tsan.h"
#include "xproc.h"
#ifdef KVS_XFERD_HOSTILE
#include "kv_block.h"
#include "kvq.h"
#endif

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

/* A provide_async handle goes from the progress thread to the parent and
 * comes back to the main thread: ordered, but through another process, which
 * ThreadSanitizer cannot see (it reports the main thread's provide_done as
 * racing the progress thread's calloc of the handle). Tell it (kvs_tsan.h). */

static kvs__xp_conn g_c;
static kvs_xfer_server *g_srv;
static uint8_t *g_bounce;
static const uint8_t *g_shared;
static uint64_t g_blen, g_slen;
static uint32_t g_call_ms; /* a put_begin waits this long for the parent */

/* A block the parent lent: its id, and the bounds we lend on followed by its
 * seal (seal_len bytes), both valid until c_release. */
typedef struct lent {
    uint64_t id;
    uint32_t seal_len;
    void *forged; /* kvstash-xferd-hostile's copy (hostile_forge), or NULL */
    uint64_t bounds[];
} lent;

#ifdef KVS_XFERD_HOSTILE
static void hostile_render(void *h, uint32_t fmt, int begin);
static void hostile_replay_note(void *h, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt);
#endif

static int c_provide(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                     const uint8_t nonce[KVS_XFER_NONCE_LEN], kvs_xfer_block_src *src)
{
    (void)ctx, (void)sd, (void)key, (void)fmt, (void)nonce, (void)src;
    return KVS_EINTERNAL; /* never called: c_provide_async never declines */
}

/* The request's nonce goes to the parent as it came: kvstashd seals with
 * it (docs/TRANSFER.md "Sealed fetches"). */
static int c_provide_async(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                           const uint8_t nonce[KVS_XFER_NONCE_LEN], void *handle)
{
    (void)ctx;
    kvs__xp_msg m = {
        .type = KVS__XP_PROVIDE, .seq = (uintptr_t)handle, .a = (uintptr_t)sd, .fmt = fmt};
    memcpy(m.key, key, KVS_XFER_KEY_LEN);
    TSAN_RELEASE(handle);
#ifdef KVS_XFERD_HOSTILE
    hostile_render(handle, fmt, 1);
    hostile_replay_note(handle, key, fmt);
#endif
    return kvs__xp_send(&g_c, &m, nonce, KVS_XFER_NONCE_LEN) == 0 ? 0 : KVS_EUNAVAIL;
}

static void c_release(void *ctx, void *ref)
{
    (void)ctx;
    lent *l = ref;
    kvs__xp_msg m = {.type = KVS__XP_RELEASE, .a = l->id};
    (void)kvs__xp_send(&g_c, &m, NULL, 0);
    free(l->forged);
    free(l);
}

/* Ends a put the parent began that nobody here will use (its PUT_BEGIN call
 * gave up waiting): else the parent would hold its slot, the store's buffer
 * and the bounce memory until this process ends. Its reply finds no waiter
 * (seq 0) and is dropped. */
static void put_end_late(uint64_t id)
{
    kvs__xp_msg m = {.type = KVS__XP_PUT_END, .a = id, .rc = KVS_ECANCELED};
    (void)kvs__xp_send(&g_c, &m, NULL, 0);
}

#ifdef KVS_XFERD_HOSTILE
/* Only in kvstash-xferd-hostile, a test build (test_connect's "hostile"
 * suite): this process taken over, doing to puts what kvstashd's and
 * libkvstash's seals must catch (docs/TRANSFER.md "Sealed puts"). With
 * KVS_XFERD_HOSTILE=1 in its environment, by the puts it relays, counted
 * from 1: put 1 has one byte of its payload flipped in bounce memory before
 * its PUT_END; puts 2, 3, ... pass, but the answer to each put after the
 * first stored one names the first stored one's key (a worker would chain
 * its next block on it). */
static unsigned g_hostile_puts;
static uint8_t *g_hostile_buf;
static uint64_t g_hostile_len;
static uint8_t g_hostile_key[KVS_XFER_KEY_LEN];
static int g_hostile_have_key;

/* 1 when KVS_XFERD_HOSTILE is mode. */
static int hostile_mode(const char *mode)
{
    const char *e = getenv("KVS_XFERD_HOSTILE");
    return e && strcmp(e, mode) == 0;
}

/* KVS_XFERD_HOSTILE=hold instead: the first put whose bytes all landed is
 * held back, its PUT_END_ASYNC sent from a thread of its own once the file
 * KVS_XFERD_HOLD_FILE exists (the test says when), or after 60 s; everything
 * else passes. Its worker meanwhile gives up on UCX (the put's timeout),
 * closes the session and puts over gRPC; the held put must then not be
 * stored (docs/TRANSFER.md "Closing a session"). */
typedef struct held_put {
    kvs__xp_msg m;
    const char *file;
} held_put;

static void *hold_main(void *arg)
{
    held_put *h = arg;
    for (int i = 0; i < 1200 && (h->file == NULL || access(h->file, F_OK) != 0); i++)
        usleep(50 * 1000);
    (void)kvs__xp_send(&g_c, &h->m, NULL, 0);
    free(h);
    return NULL;
}

/* KVS_XFERD_HOSTILE=refuse: as hold, but the worker is answered at once with
 * a refusal this process invents (KVS_ENOSPC, as for bounce memory full; no
 * kvstashd tag), and kvstashd's answer to the held put, when it comes, is
 * dropped: the held put's PUT_END_ASYNC names g_refused instead of the
 * server's handle, which the answer has already freed. The worker puts over
 * gRPC; the held put must then not be stored either. */
static char g_refused;

/* 1 when it has taken m to send later. */
static int hostile_hold(const kvs__xp_msg *m)
{
    static unsigned held;
    int refuse = hostile_mode("refuse");
    if ((!hostile_mode("hold") && !refuse) || held++ > 0)
        return 0;
    held_put *h = malloc(sizeof *h);
    pthread_t t;
    if (h == NULL)
        return 0;
    *h = (held_put){.m = *m, .file = getenv("KVS_XFERD_HOLD_FILE")};
    if (refuse)
        h->m.seq = (uintptr_t)&g_refused;
    if (pthread_create(&t, NULL, hold_main, h) != 0) {
        free(h);
        return 0;
    }
    pthread_detach(t);
    if (refuse)
        kvs_xfer_server_put_done(g_srv, (void *)(uintptr_t)m->seq, KVS_ENOSPC, NULL);
    return 1;
}

/* KVS_XFERD_HOSTILE=forge: every stored block this process lends is a copy
 * of kvstashd's with the first payload byte of layer 1's first K tile
 * changed and that tile's checksum computed again, so every tile check a
 * worker makes passes; kvstashd's seal goes on unchanged. What sealed
 * fetches must catch (docs/TRANSFER.md "Sealed fetches").
 * KVS_XFERD_HOSTILE=corrupt: the copy has its block header's first byte
 * changed and nothing recomputed, so the worker's own checks fail the block
 * (KVS_EFORMAT) before its seal is looked at. The copy, or NULL (the block is
 * lent as it is). */
static void *hostile_forge(const uint8_t *bytes, uint64_t len, uint32_t layers)
{
    static atomic_uint forged_once;
    int corrupt = hostile_mode("corrupt");
    int once = hostile_mode("forge_hold");
    if ((!hostile_mode("forge") && !corrupt && !once) || layers != 0 || len == 0)
        return NULL; /* stored format only */
    if (once && atomic_fetch_add(&forged_once, 1) != 0)
        return NULL;
    uint8_t *c = malloc(len);
    const void *t;
    size_t tl;
    kvs_tile_hdr h;
    if (!c)
        return NULL;
    memcpy(c, bytes, len);
    if (corrupt) {
        c[0] ^= 0xff;
        return c;
    }
    if (kvs_block_tile(c, len, 1, KVS_TILE_K, 0, &t, &tl, NULL) != 0 || tl <= sizeof h) {
        free(c);
        return NULL;
    }
    uint8_t *tile = (uint8_t *)t;
    memcpy(&h, tile, sizeof h);
    tile[sizeof h] ^= 0x01; /* a low mantissa bit or an int8 code: still decodes */
    h.checksum = 0;
    h.checksum = kvs_tile_hdr_checksum(&h, tile + sizeof h, tl - sizeof h);
    memcpy(tile, &h, sizeof h);
    return c;
}

/* KVS_XFERD_HOSTILE=forge_hold: the first stored block this process lends
 * is forged as with forge; the second is withheld (its PROVIDED kept) until
 * the file KVS_XFERD_HOLD_FILE exists (the test says when), or 60 s, and is
 * then lent as it is; later ones pass. A worker that fetches both in one
 * request refuses the first by its seal, and its request, stalled on the
 * second, times out: the connection fails too, after the forgery. */
static void on_provided(const kvs__xp_msg *m, const uint8_t *tail);

typedef struct held_provided {
    const char *file;
    kvs__xp_msg m;
    uint8_t tail[]; /* m.n bytes */
} held_provided;

static void *provided_hold_main(void *arg)
{
    held_provided *h = arg;
    for (int i = 0; i < 1200 && (h->file == NULL || access(h->file, F_OK) != 0); i++)
        usleep(50 * 1000);
    on_provided(&h->m, h->tail);
    free(h);
    return NULL;
}

/* 1 when it has taken the PROVIDED m (tail) to answer later. */
static int hostile_withhold(const kvs__xp_msg *m, const uint8_t *tail)
{
    static atomic_uint seen;
    if (!hostile_mode("forge_hold") || m->rc != 0 || m->fmt != 0 ||
        atomic_fetch_add(&seen, 1) != 1)
        return 0;
    held_provided *h = malloc(sizeof *h + m->n);
    pthread_t t;
    if (h == NULL)
        return 0;
    h->file = getenv("KVS_XFERD_HOLD_FILE");
    h->m = *m;
    if (m->n)
        memcpy(h->tail, tail, m->n);
    if (pthread_create(&t, NULL, provided_hold_main, h) != 0) {
        free(h);
        return 0;
    }
    pthread_detach(t);
    return 1;
}

/* KVS_XFERD_HOSTILE=notfound: every block the parent lends is given back
 * at once and the worker told it is not cached (KVS_ENOTFOUND): a block
 * withheld under the store's answer. 1 when it answered m so. */
static int hostile_notfound(const kvs__xp_msg *m)
{
    if (!hostile_mode("notfound") || m->rc != 0)
        return 0;
    kvs__xp_msg r = {.type = KVS__XP_RELEASE, .a = m->a};
    (void)kvs__xp_send(&g_c, &r, NULL, 0);
    kvs_xfer_server_provide_done(g_srv, (void *)(uintptr_t)m->seq, KVS_ENOTFOUND, NULL);
    return 1;
}

/* KVS_XFERD_HOSTILE=render: while kvstashd renders a block for a fetch (from
 * this process's PROVIDE of a format other than the stored one until its
 * PROVIDED), a thread keeps writing a pattern over bytes 16..23 of bounce
 * memory: the first 8 bytes after the rendered header of a block kvstashd
 * renders at the start of bounce memory (its first fit, with nothing else
 * there), where kvstashd renders the blocks it lends in place. Whatever
 * kvstashd reads there when it seals the block is what the worker gets. */
#define RENDER_MAX 64
static void *g_render_h[RENDER_MAX]; /* provides of rendered formats not answered yet */
static atomic_int g_render_wait;     /* how many */
static pthread_mutex_t g_render_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_render_cv = PTHREAD_COND_INITIALIZER;

static void *hostile_render_main(void *arg)
{
    (void)arg;
    /* Racing the transfer's reads of bounce memory is this thread's job: a
     * ThreadSanitizer build would otherwise end the process at the first. */
    TSAN_IGNORE_THREAD();
    volatile uint64_t *p = (volatile uint64_t *)(void *)(g_bounce + 16);
    for (;;) {
        pthread_mutex_lock(&g_render_mu);
        while (atomic_load(&g_render_wait) == 0)
            pthread_cond_wait(&g_render_cv, &g_render_mu);
        pthread_mutex_unlock(&g_render_mu);
        while (atomic_load(&g_render_wait) > 0)
            *p = 0x5a5a5a5a5a5a5a5aull;
    }
    return NULL;
}

/* Provide handle h of format fmt sent to the parent (begin) or answered. */
static void hostile_render(void *h, uint32_t fmt, int begin)
{
    if (!hostile_mode("render") || (begin && fmt == KVS_XFER_FMT_STORED))
        return;
    pthread_mutex_lock(&g_render_mu);
    for (int i = 0; i < RENDER_MAX; i++) {
        if (begin ? g_render_h[i] == NULL : g_render_h[i] == h) {
            g_render_h[i] = begin ? h : NULL;
            atomic_fetch_add(&g_render_wait, begin ? 1 : -1);
            break;
        }
    }
    pthread_cond_broadcast(&g_render_cv);
    pthread_mutex_unlock(&g_render_mu);
}

/* KVS_XFERD_HOSTILE=replay: the first stored block this process lends is
 * remembered (its key, bytes and seal); every later lend of the same key in
 * the stored format goes out as a copy of the remembered one, with its
 * seal, instead of what kvstashd lent now (which is given back as usual on
 * release). Within one session that is a replay of an earlier lend: after
 * the block was deleted and put again with other bytes, the worker would
 * get the old ones. What the per-request nonce in sealed fetches must catch
 * (docs/TRANSFER.md "Sealed fetches"). */
#define REPLAY_MAX 64
static struct {
    void *h;
    uint8_t key[KVS_XFER_KEY_LEN];
} g_replay_h[REPLAY_MAX]; /* stored-format provides not answered yet */
static pthread_mutex_t g_replay_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t g_replay_key[KVS_XFER_KEY_LEN];
static uint8_t *g_replay_bytes; /* len bytes, then seal_len bytes of seal */
static uint64_t g_replay_len;
static uint32_t g_replay_seal_len;

/* On the progress thread: provide handle h asks for key in format fmt. */
static void hostile_replay_note(void *h, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt)
{
    if (!hostile_mode("replay") || fmt != KVS_XFER_FMT_STORED)
        return;
    pthread_mutex_lock(&g_replay_mu);
    for (int i = 0; i < REPLAY_MAX; i++) {
        if (g_replay_h[i].h == NULL) {
            g_replay_h[i].h = h;
            memcpy(g_replay_h[i].key, key, KVS_XFER_KEY_LEN);
            break;
        }
    }
    pthread_mutex_unlock(&g_replay_mu);
}

/* On the main thread: kvstashd lent handle h's block (bytes, *len, its seal
 * *seal, *seal_len). The first one is remembered; a later one of the same
 * key is swapped for a copy of it: the copy (the caller frees it; *len,
 * *seal and *seal_len then describe it), else NULL. bytes NULL: h failed,
 * forget it. */
static void *hostile_replay(void *h, const uint8_t *bytes, uint64_t *len, const uint8_t **seal,
                            uint32_t *seal_len)
{
    if (!hostile_mode("replay"))
        return NULL;
    uint8_t key[KVS_XFER_KEY_LEN];
    int found = 0;
    void *c = NULL;
    pthread_mutex_lock(&g_replay_mu);
    for (int i = 0; i < REPLAY_MAX && !found; i++) {
        if (g_replay_h[i].h == h) {
            memcpy(key, g_replay_h[i].key, sizeof key);
            g_replay_h[i].h = NULL;
            found = 1;
        }
    }
    if (!found || bytes == NULL) {
        /* not ours, or a failed lend: forgotten */
    } else if (g_replay_bytes == NULL && *seal_len > 0) {
        if ((g_replay_bytes = malloc(*len + *seal_len)) != NULL) {
            memcpy(g_replay_bytes, bytes, *len);
            memcpy(g_replay_bytes + *len, *seal, *seal_len);
            memcpy(g_replay_key, key, sizeof key);
            g_replay_len = *len;
            g_replay_seal_len = *seal_len;
        }
    } else if (g_replay_bytes && memcmp(key, g_replay_key, sizeof key) == 0 &&
               (c = malloc(g_replay_len + g_replay_seal_len)) != NULL) {
        memcpy(c, g_replay_bytes, g_replay_len + g_replay_seal_len);
        *len = g_replay_len;
        *seal = (const uint8_t *)c + g_replay_len;
        *seal_len = g_replay_seal_len;
    }
    pthread_mutex_unlock(&g_replay_mu);
    return c;
}

/* Before a put's PUT_END. */
static void hostile_put_end(int status)
{
    if (hostile_mode("1") && status == 0 && g_hostile_puts == 1 && g_hostile_len)
        g_hostile_buf[g_hostile_len / 2] ^= 0x10;
}

/* On a put's answer. */
static void hostile_answer(int rc, kvs_xfer_put_reply *reply)
{
    if (!hostile_mode("1") || rc != 0)
        return;
    if (!g_hostile_have_key) {
        memcpy(g_hostile_key, reply->key, sizeof g_hostile_key);
        g_hostile_have_key = 1;
    } else {
        memcpy(reply->key, g_hostile_key, sizeof g_hostile_key);
    }
}
#endif

/* The bounce memory the parent's answer r to a put begin of len bytes
 * names (its offset r->c, slot r->a): *buf, or KVS_EINTERNAL for a place
 * outside bounce memory (the put is then ended: put_end_late). */
static int bounce_of(const kvs__xp_msg *r, uint64_t len, void **buf)
{
    if (r->c > g_blen || len > g_blen - r->c) {
        put_end_late(r->a);
        return KVS_EINTERNAL;
    }
    *buf = g_bounce + r->c;
#ifdef KVS_XFERD_HOSTILE
    g_hostile_puts++;
    g_hostile_buf = *buf;
    g_hostile_len = len;
#endif
    return 0;
}

static int c_put_begin(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                       const void *meta, size_t meta_len, uint64_t len, void **buf, void **ref,
                       kvs_xfer_put_reply *reply)
{
    (void)ctx;
    if (meta_len > KVS__XP_TAIL_MAX)
        return KVS_EINVAL;
    kvs__xp_msg m = {.type = KVS__XP_PUT_BEGIN, .a = (uintptr_t)sd, .b = len, .fmt = fmt}, r;
    memcpy(m.key, key, KVS_XFER_KEY_LEN);
    /* It holds the progress thread: no longer than the put may take anyway.
     * A reply that comes later is ended by the main thread (put_end_late). */
    int rc = kvs__xp_call(&g_c, &m, meta, (uint32_t)meta_len, &r, NULL, 0, g_call_ms);
    if (rc != 0)
        return rc;
    *reply = r.reply;
    if (r.rc != 0)
        return r.rc > 0 ? KVS_EINTERNAL : r.rc;
    if (bounce_of(&r, len, buf) != 0)
        return KVS_EINTERNAL;
    *ref = (void *)(uintptr_t)r.a;
    return 0;
}

/* A put's begin without holding the progress thread: the parent begins it
 * (its reader, or its store's own thread) and answers with PUT_BEGUN
 * (on_put_begun), while this thread serves every other session. The
 * message's seq names a record of the server's handle and the put's length,
 * which the answer's bounce offset is checked against. */
typedef struct begin_rec {
    void *handle;
    uint64_t len;
} begin_rec;

static int c_put_begin_async(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                             const void *meta, size_t meta_len, uint64_t len, void *handle)
{
    (void)ctx;
    if (meta_len > KVS__XP_TAIL_MAX)
        return KVS_EINVAL;
    begin_rec *b = malloc(sizeof *b);
    if (!b)
        return 1; /* c_put_begin */
    b->handle = handle;
    b->len = len;
    kvs__xp_msg m = {.type = KVS__XP_PUT_BEGIN_ASYNC,
                     .seq = (uintptr_t)b,
                     .a = (uintptr_t)sd,
                     .b = len,
                     .fmt = fmt};
    memcpy(m.key, key, KVS_XFER_KEY_LEN);
    TSAN_RELEASE(b);
    TSAN_RELEASE(handle);
    if (kvs__xp_send(&g_c, &m, meta, (uint32_t)meta_len) != 0) {
        free(b); /* not sent: nothing answers it */
        return KVS_EUNAVAIL;
    }
    return 0;
}

static void on_put_begun(const kvs__xp_msg *m)
{
    begin_rec *b = (begin_rec *)(uintptr_t)m->seq;
    TSAN_ACQUIRE(b);
    void *h = b->handle;
    uint64_t len = b->len;
    free(b);
    TSAN_ACQUIRE(h);
    kvs_xfer_put_reply reply = m->reply;
    if (m->rc != 0) {
        kvs_xfer_server_put_begun(g_srv, h, m->rc > 0 ? KVS_EINTERNAL : m->rc, NULL, NULL, &reply);
        return;
    }
    void *buf;
    if (bounce_of(m, len, &buf) != 0) {
        kvs_xfer_server_put_begun(g_srv, h, KVS_EINTERNAL, NULL, NULL, NULL);
        return;
    }
    kvs_xfer_server_put_begun(g_srv, h, 0, buf, (void *)(uintptr_t)m->a, &reply);
}

static int c_put_end(void *ctx, void *ref, int status, kvs_xfer_put_reply *reply)
{
    (void)ctx;
#ifdef KVS_XFERD_HOSTILE
    hostile_put_end(status);
#endif
    kvs__xp_msg m = {.type = KVS__XP_PUT_END, .a = (uintptr_t)ref, .rc = status}, r;
    int rc = kvs__xp_call(&g_c, &m, NULL, 0, &r, NULL, 0, 30000);
    if (rc != 0)
        return rc;
    *reply = r.reply;
#ifdef KVS_XFERD_HOSTILE
    hostile_answer(r.rc, reply);
#endif
    return r.rc;
}

/* Every byte landed: the parent quantizes on its pool and answers with
 * PUT_ENDED (on_put_ended), so this progress thread goes on meanwhile. */
static int c_put_end_async(void *ctx, void *ref, void *handle)
{
    (void)ctx;
#ifdef KVS_XFERD_HOSTILE
    hostile_put_end(0);
#endif
    kvs__xp_msg m = {.type = KVS__XP_PUT_END_ASYNC, .seq = (uintptr_t)handle, .a = (uintptr_t)ref};
    TSAN_RELEASE(handle);
#ifdef KVS_XFERD_HOSTILE
    if (hostile_hold(&m))
        return 0;
#endif
    return kvs__xp_send(&g_c, &m, NULL, 0) == 0 ? 0 : 1; /* 1: c_put_end fails it */
}

static void on_put_ended(const kvs__xp_msg *m)
{
    void *h = (void *)(uintptr_t)m->seq;
    TSAN_ACQUIRE(h);
#ifdef KVS_XFERD_HOSTILE
    hostile_render(h, 0, 0);
#endif
    kvs_xfer_put_reply reply = m->reply;
#ifdef KVS_XFERD_HOSTILE
    if (m->seq == (uintptr_t)&g_refused)
        return; /* answered already: hostile_hold */
    hostile_answer(m->rc, &reply);
#endif
    kvs_xfer_server_put_done(g_srv, h, m->rc > 0 ? KVS_EINTERNAL : m->rc, &reply);
}

static void c_session_end(void *ctx, void *sd)
{
    (void)ctx;
    kvs__xp_msg m = {.type = KVS__XP_SESSION_END, .a = (uintptr_t)sd};
    (void)kvs__xp_send(&g_c, &m, NULL, 0);
}

static void on_provided(const kvs__xp_msg *m, const uint8_t *tail)
{
    void *h = (void *)(uintptr_t)m->seq;
    TSAN_ACQUIRE(h);
#ifdef KVS_XFERD_HOSTILE
    if (hostile_withhold(m, tail) || hostile_notfound(m))
        return;
    if (m->rc != 0)
        (void)hostile_replay(h, NULL, NULL, NULL, NULL);
#endif
    if (m->rc != 0) {
        kvs_xfer_server_provide_done(g_srv, h, m->rc > 0 ? KVS_EINTERNAL : m->rc, NULL);
        return;
    }
    const uint8_t *base = m->b == KVS__XP_REGION_SHARED ? g_shared : g_bounce;
    uint64_t cap = m->b == KVS__XP_REGION_SHARED ? g_slen : g_blen;
    uint32_t layers = m->fmt;
    /* The tail: layers + 1 bounds (none for the stored format's 0), then
     * the seal. */
    uint32_t nb = layers && layers < KVS__XP_TAIL_MAX / 8 ? (layers + 1) * 8 : 0;
    lent *l = NULL;
    if (base && m->c <= cap && m->d <= cap - m->c && layers < KVS__XP_TAIL_MAX / 8 && m->n >= nb &&
        m->n - nb <= KVS_XFER_MAX_SEAL)
        l = malloc(sizeof *l + m->n);
    if (!l) {
#ifdef KVS_XFERD_HOSTILE
        (void)hostile_replay(h, NULL, NULL, NULL, NULL);
#endif
        kvs__xp_msg r = {.type = KVS__XP_RELEASE, .a = m->a};
        (void)kvs__xp_send(&g_c, &r, NULL, 0);
        kvs_xfer_server_provide_done(g_srv, h, KVS_EINTERNAL, NULL);
        return;
    }
    l->id = m->a;
    l->seal_len = m->n - nb;
    l->forged = NULL;
    memcpy(l->bounds, tail, m->n);
    uint64_t len = m->d;
    const uint8_t *seal = l->seal_len ? (const uint8_t *)l->bounds + nb : NULL;
#ifdef KVS_XFERD_HOSTILE
    l->forged = hostile_forge(base + m->c, m->d, layers);
    if (!l->forged && layers == 0)
        l->forged = hostile_replay(h, base + m->c, &len, &seal, &l->seal_len);
#endif
    kvs_xfer_block_src src = {.bytes = l->forged ? l->forged : base + m->c,
                              .len = len,
                              .layers = layers,
                              .bounds = layers ? l->bounds : NULL,
                              .ref = l,
                              .seal = seal,
                              .seal_len = l->seal_len};
    kvs_xfer_server_provide_done(g_srv, h, 0, &src);
}

/* OPEN, CLOSE and STATS wait here for a call thread (see the top). */
#define CALL_THREADS 4
typedef struct call_job {
    struct call_job *next;
    kvs__xp_msg m; /* then m.n tail bytes */
} call_job;
static pthread_mutex_t g_qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_qcv = PTHREAD_COND_INITIALIZER;
static call_job *g_qhead, **g_qtail = &g_qhead;

static void call_run(kvs__xp_msg *m)
{
    const uint8_t *tail = (const uint8_t *)(m + 1);
    kvs__xp_msg r = {.type = KVS__XP_REPLY, .seq = m->seq};
    kvs_xfer_session_info info;
    kvs_xfer_server_stats st;
    const void *rt = NULL;
    uint32_t rn = 0;
    if (m->type == KVS__XP_OPEN) {
        r.rc = kvs_xfer_server_session_open(g_srv, tail, m->n, (void *)(uintptr_t)m->a, &info);
        if (r.rc == 0) {
            r.a = info.id;
            rt = info.token;
            rn = sizeof info.token;
        }
    } else if (m->type == KVS__XP_CLOSE) {
        r.rc = kvs_xfer_server_session_close(g_srv, m->a);
    } else {
        r.rc = kvs_xfer_server_stats_get(g_srv, &st);
        rt = &st;
        rn = sizeof st;
    }
    (void)kvs__xp_send(&g_c, &r, rt, rn);
}

static void *call_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_qmu);
        while (!g_qhead)
            pthread_cond_wait(&g_qcv, &g_qmu);
        call_job *j = g_qhead;
        if (!(g_qhead = j->next))
            g_qtail = &g_qhead;
        pthread_mutex_unlock(&g_qmu);
        call_run(&j->m);
        free(j);
    }
    return NULL;
}

static uint64_t num(const char *s)
{
    return strtoull(s, NULL, 10);
}

/* Our shared-memory receive queue is wedged (kvs_xfer_server_opts.on_wedged):
 * no worker reaches us over shared memory any more, and nothing in this
 * process can unwedge it. Exit: kvstashd starts a fresh data plane process
 * (sessions fail, workers Connect again) and says why (KVS__XP_EXIT_WEDGED). */
static void on_wedged(void *arg)
{
    (void)arg;
    _exit(KVS__XP_EXIT_WEDGED);
}

/* Sends to dead shared-memory peers that UCX never completes piled up
 * (kvs_xfer_server_opts.on_stuck): each keeps a dead worker's segments mapped
 * and the progress thread from sleeping, and only a fresh worker lets them
 * go. Exit: kvstashd starts a fresh data plane process and says why. */
static void on_stuck(void *arg, uint64_t stuck)
{
    (void)arg;
    (void)stuck;
    _exit(KVS__XP_EXIT_STUCK);
}

int main(int argc, char **argv)
{
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    (void)signal(SIGPIPE, SIG_IGN);
    if (argc != 13 || getppid() == 1) {
        fprintf(stderr, "kvstash-xferd: started by kvstashd only (docs/TRANSFER.md)\n");
        return 2;
    }
    /* Before UCX and any thread: capabilities are per thread, and nothing
     * below needs what the sandbox takes away. */
    char why[160];
    if (kvs__xp_sandbox(why, sizeof why) != 0) {
        fprintf(stderr, "kvstash-xferd: no sandbox (%s): not serving\n", why);
        return 7;
    }
    g_call_ms = (uint32_t)num(argv[2]);
    if (g_call_ms == 0)
        g_call_ms = 30000;
    g_blen = num(argv[7]);
    g_slen = num(argv[8]);
    g_bounce = mmap(NULL, g_blen, PROT_READ | PROT_WRITE, MAP_SHARED, KVS__XP_FD_BOUNCE, 0);
    if (g_bounce == MAP_FAILED)
        return 3;
    if (g_slen) {
        void *p = mmap(NULL, g_slen, PROT_READ, MAP_SHARED, KVS__XP_FD_SHARED, 0);
        if (p == MAP_FAILED)
            return 3;
        g_shared = p;
    }
    close(KVS__XP_FD_SHARED);
    close(KVS__XP_FD_BOUNCE);
    kvs__xp_conn_init(&g_c, KVS__XP_FD_SOCK);
    int put = strcmp(argv[12], "put") == 0;
    /* The receive queue's watchdog: a probe a second, wedged after 10 s;
     * KVS_UCX_PROBE_MS and KVS_UCX_WEDGE_MS change them (tests), a probe
     * interval of 0 turns it off. */
    const char *pe = getenv("KVS_UCX_PROBE_MS"), *we = getenv("KVS_UCX_WEDGE_MS");
    /* Stuck sends to dead peers: a restart at 64 (about 35 MiB of dead
     * workers' segments), or at the first while no session is open;
     * KVS_UCX_STUCK_MAX (0: never) and KVS_UCX_STUCK_MS change them. */
    const char *sm = getenv("KVS_UCX_STUCK_MAX"), *sg = getenv("KVS_UCX_STUCK_MS");
    kvs_xfer_server_opts o = {
        .ops = {.provide = c_provide,
                .provide_async = c_provide_async,
                .release = c_release,
                .put_begin = put ? c_put_begin : NULL,
                .put_begin_async = put ? c_put_begin_async : NULL,
                .put_end = put ? c_put_end : NULL,
                .put_end_async = put ? c_put_end_async : NULL,
                .session_end = c_session_end},
        .err_mode = strcmp(argv[1], "peer") == 0 ? KVS_XFER_ERR_PEER : KVS_XFER_ERR_NONE,
        .op_timeout_ms = (uint32_t)num(argv[2]),
        .window = (uint32_t)num(argv[3]),
        .min_msg_bytes = num(argv[4]),
        .spin = (uint32_t)num(argv[5]),
        .addr_check_ms = (uint32_t)num(argv[6]),
        .net_devices = argv[9],
        .tls = argv[10],
        .addr_check = argv[11],
        .probe_ms = pe ? (uint32_t)num(pe) : 1000,
        .wedge_ms = we ? (uint32_t)num(we) : 10000,
        .on_wedged = on_wedged,
        .stuck_max = sm ? (uint32_t)num(sm) : 64,
        .stuck_ms = sg ? (uint32_t)num(sg) : 10000,
        .on_stuck = on_stuck,
    };
    if (kvs_xfer_server_create(&o, &g_srv) != 0)
        return 4;
    const void *addr;
    size_t alen;
    kvs__xp_msg hello = {.type = KVS__XP_HELLO};
    if (kvs_xfer_server_address(g_srv, &addr, &alen) != 0 ||
        kvs__xp_send(&g_c, &hello, addr, (uint32_t)alen) != 0)
        return 5;
    void *buf = malloc(sizeof(kvs__xp_msg) + KVS__XP_TAIL_MAX);
    if (!buf)
        return 6;
    for (int i = 0; i < CALL_THREADS; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, call_main, NULL) != 0)
            return 6;
    }
#ifdef KVS_XFERD_HOSTILE
    pthread_t rt;
    if (hostile_mode("render") && pthread_create(&rt, NULL, hostile_render_main, NULL) != 0)
        return 6;
#endif
    for (;;) {
        kvs__xp_msg *m;
        uint8_t *tail;
        int r = kvs__xp_recv(KVS__XP_FD_SOCK, buf, &m, &tail);
        if (r == 0)
            _exit(0); /* the parent is gone or stops us: UCX dies with us */
        if (r < 0)
            continue;
        if (m->type == KVS__XP_REPLY) {
            if (!kvs__xp_deliver(&g_c, m, tail) && m->fmt == KVS__XP_PUT_BEGIN && m->rc == 0)
                put_end_late(m->a);
        } else if (m->type == KVS__XP_PROVIDED) {
            on_provided(m, tail);
        } else if (m->type == KVS__XP_PUT_ENDED) {
            on_put_ended(m);
        } else if (m->type == KVS__XP_PUT_BEGUN) {
            on_put_begun(m);
        } else if (m->type == KVS__XP_OPEN || m->type == KVS__XP_CLOSE ||
                   m->type == KVS__XP_STATS) {
            call_job *j = malloc(sizeof *j + m->n);
            if (!j) {
                kvs__xp_msg e = {.type = KVS__XP_REPLY, .seq = m->seq, .rc = KVS_ENOMEM};
                (void)kvs__xp_send(&g_c, &e, NULL, 0);
                continue;
            }
            memcpy(&j->m, m, sizeof *m + m->n);
            j->next = NULL;
            pthread_mutex_lock(&g_qmu);
            *g_qtail = j;
            g_qtail = &j->next;
            pthread_cond_signal(&g_qcv);
            pthread_mutex_unlock(&g_qmu);
        }
    }
}
